// The tile kernel on every product unit this CPU has (attention.h: Products), forced one at a
// time with bf16 inputs: the forward sweeps (sizes around the tile edges, every mask, GQA), the
// modifiers, strided layouts, bitwise determinism across thread counts and block skipping, and
// garbage at hidden positions. A unit the CPU lacks is reported SKIPPED, with the reason: it was
// not tested here, which is not a pass. The backward's units are in backward_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "forward_rule.h"
#include "kernels/amx.h"
#include "maskattn/cpu.h"
#include "maskattn/error.h"
#include "test_util.h"

namespace maskattn {
namespace {

using test::RandomProblem;
using test::Result;
using test::run_kernel;

class ProductUnit : public testing::TestWithParam<Products> {
 protected:
  void SetUp() override {
    const CpuReport cpu = cpu_report();
    if (GetParam() == Products::amx && !cpu.amx_permitted) {
      GTEST_SKIP() << "NOT TESTED: this CPU has no usable AMX-BF16 (" << cpu.model
                   << "), so the AMX kernels could not run";
    }
    if (GetParam() == Products::bf16_dot && !cpu.avx512_bf16) {
      GTEST_SKIP() << "NOT TESTED: this CPU has no AVX512-BF16 (" << cpu.model << ")";
    }
  }
  Products unit() const { return GetParam(); }
};

// The unit really runs for the shapes these tests use (AMX needs D % 32 == 0, Dv % 16 == 0).
TEST_P(ProductUnit, IsTakenWhereTheShapeFits) {
  EXPECT_EQ(tile_products(DType::bf16, 64, 64, true, unit()), unit());
  EXPECT_EQ(tile_products(DType::bf16, 128, 16, true, unit()), unit());
  EXPECT_EQ(tile_products(DType::f32, 64, 64, true, unit()), Products::f32);
  EXPECT_EQ(tile_products(DType::f16, 64, 64, true, unit()), Products::f32);
  // Rows that are not contiguous go to f32 products on every unit.
  EXPECT_EQ(tile_products(DType::bf16, 64, 64, false, unit()), Products::f32);
}

TEST_P(ProductUnit, EveryMaskAcrossTileEdges) {
  // D = 64, 96, 128 and 256 run on the unit; D = 8, 40, 80 and 1 on its fallback.
  test::for_each_edge_case(300,
                           [&](const RandomProblem& p, const Mask& mask, const std::string& what) {
                             test::expect_within_rule(p, DType::bf16, mask, what, unit());
                           });
}

TEST_P(ProductUnit, LongerSequencesAndValueDims) {
  for (const auto& [lq, lk, d, dv] : std::vector<std::array<int64_t, 4>>{
           {300, 1000, 64, 64}, {200, 333, 32, 16}, {129, 200, 128, 48}}) {
    const RandomProblem p(1, 4, 2, lq, lk, d, dv, lq + d);
    for (const Mask& mask : {Mask(), Mask().causal(), Mask().sliding_window(100),
                             Mask().key_lengths({lk - 70}).causal()}) {
      test::expect_within_rule(p, DType::bf16, mask,
                               mask.describe() + " Lq=" + std::to_string(lq) +
                                   " D=" + std::to_string(d) + " Dv=" + std::to_string(dv),
                               unit());
    }
  }
}

TEST_P(ProductUnit, ModifiersMatchTheReference) {
  const RandomProblem p(1, 4, 2, 130, 150, 64, 64, 77, 3.0f);
  ScoreMods mods;
  mods.softcap = 5.0;
  mods.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  mods.bias = Array<float>({150}, test::random_values(150, 9));
  mods.sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  const Mask mask =
      Mask().causal().additive(Array<float>({150}, test::random_values(150, 4, -2, 0)));
  const RandomProblem rounded = test::rounded_to(p, DType::bf16);
  const Result fused = run_kernel(p, DType::bf16, mask, mods, Kernel::fused, 0, true, unit());
  const Result oracle = run_kernel(rounded, DType::f32, mask, mods, Kernel::reference);
  // bf16 output rounding (2^-9 relative) of values up to ~3, and P rounded to bf16.
  EXPECT_LE(test::max_error(fused.out, oracle.out), 2e-2f);
  EXPECT_LE(test::max_error(fused.lse, oracle.lse), 1e-4f);
}

// K laid out [B, L, H, D] (contiguous rows, row stride H·D) and V with padded rows: the units
// read rows in place, wherever they are.
TEST_P(ProductUnit, StridedRows) {
  const RandomProblem p(1, 2, 2, 100, 130, 64, 32, 31);
  const test::DTypeBuffer q(p.q, DType::bf16), k(p.k, DType::bf16), v(p.v, DType::bf16);
  const auto* k_bits = reinterpret_cast<const uint16_t*>(k.words.data());
  const auto* v_bits = reinterpret_cast<const uint16_t*>(v.words.data());
  std::vector<uint16_t> k_blhd(p.k.size()), v_padded(2 * 130 * 40);
  for (int64_t g = 0; g < 2; ++g) {
    for (int64_t j = 0; j < 130; ++j) {
      std::memcpy(&k_blhd[(j * 2 + g) * 64], k_bits + (g * 130 + j) * 64, 64 * 2);
      std::memcpy(&v_padded[(g * 130 + j) * 40], v_bits + (g * 130 + j) * 32, 32 * 2);
    }
  }
  const Result plain =
      run_kernel(p, DType::bf16, Mask().causal(), {}, Kernel::fused, 0, true, unit());
  test::DTypeBuffer out(std::vector<float>(2 * 100 * 32), DType::bf16);
  Options options;
  options.products = unit();
  attention(
      TensorView(q.words.data(), DType::bf16, {1, 2, 100, 64}),
      TensorView(k_blhd.data(), DType::bf16, {1, 2, 130, 64}, {130 * 128, 64, 128, 1}),
      TensorView(v_padded.data(), DType::bf16, {1, 2, 130, 32}, {2 * 130 * 40, 130 * 40, 40, 1}),
      MutableTensorView(out.words.data(), DType::bf16, {1, 2, 100, 32}), Mask().causal(), {},
      options);
  EXPECT_EQ(out.floats(2 * 100 * 32), plain.out);  // same unit, same arithmetic: same bits
}

TEST_P(ProductUnit, OneAndTwoThreadsAndSkippingAgreeBitwise) {
  const RandomProblem p(2, 4, 2, 200, 300, 64, 64, 1);
  for (const Mask& mask :
       {Mask().causal(), Mask().sliding_window(150).key_lengths({290, 170}), Mask()}) {
    const Result one = run_kernel(p, DType::bf16, mask, {}, Kernel::fused, 1, true, unit());
    const Result two = run_kernel(p, DType::bf16, mask, {}, Kernel::fused, 2, true, unit());
    const Result plain = run_kernel(p, DType::bf16, mask, {}, Kernel::fused, 2, false, unit());
    EXPECT_EQ(one.out, two.out) << mask.describe();
    EXPECT_EQ(one.lse, two.lse) << mask.describe();
    EXPECT_EQ(one.out, plain.out) << mask.describe() << ": block skipping changed the bits";
  }
}

TEST_P(ProductUnit, GarbageAtHiddenKeysStaysOut) {
  // Keys 100… are padding holding NaN values and infinite keys; query rows 120… are padding.
  RandomProblem p(1, 2, 1, 130, 140, 64, 64, 8);
  for (int64_t j = 100; j < 140; ++j) {
    for (int64_t e = 0; e < 64; ++e) p.v[j * 64 + e] = NAN;
    for (int64_t d = 0; d < 64; ++d) p.k[j * 64 + d] = INFINITY;
  }
  const Mask mask = Mask().key_lengths({100}) & Mask().sliding_window(120);
  for (const Mask& m : {mask, Mask(mask).query_lengths({120})}) {
    const Result fused = run_kernel(p, DType::bf16, m, {}, Kernel::fused, 0, true, unit());
    const Result oracle =
        run_kernel(test::rounded_to(p, DType::bf16), DType::f32, m, {}, Kernel::reference);
    EXPECT_LE(test::max_error(fused.out, oracle.out), 2e-2f) << m.describe();
    for (size_t n = 0; n < fused.lse.size(); ++n) {
      if (std::isinf(oracle.lse[n])) {
        EXPECT_EQ(fused.lse[n], -INFINITY) << "row " << n;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Units, ProductUnit,
                         testing::Values(Products::f32, Products::bf16_dot, Products::amx),
                         [](const testing::TestParamInfo<Products>& info) {
                           return std::string(info.param == Products::bf16_dot
                                                  ? "bf16_dot"
                                                  : products_name(info.param));
                         });

TEST(Products, NamesRoundTripAndUnknownNamesAreErrors) {
  for (Products p : {Products::automatic, Products::f32, Products::bf16_dot, Products::amx}) {
    EXPECT_EQ(parse_products(products_name(p), "--products"), p);
  }
  EXPECT_MASKATTN_ERROR(parse_products("avx", "--products"), "--products = 'avx'",
                        "auto, f32, bf16-dot or amx");
}

TEST(Products, RefusedTileStateFallsBackCleanly) {
  // As when Linux refuses the tile state (or on a CPU without AMX): automatic takes the next
  // unit, and the results still keep the rule.
  const detail::fused::ScopedAmxRefusal refused;
  const CpuReport cpu = cpu_report();
  EXPECT_FALSE(cpu.amx_permitted);
  EXPECT_NE(cpu.bf16, Products::amx);
  EXPECT_NE(tile_products(DType::bf16, 64, 64, true), Products::amx);
  const RandomProblem p(1, 2, 1, 130, 140, 64, 64, 12);
  for (const Mask& mask : {Mask(), Mask().causal()}) {
    test::expect_within_rule(p, DType::bf16, mask, "refused " + mask.describe());
  }
}

TEST(Products, TheReportNamesTheAutomaticChoice) {
  const CpuReport cpu = cpu_report();
  EXPECT_FALSE(cpu.model.empty());
  EXPECT_FALSE(cpu.simd_target.empty());
  EXPECT_EQ(cpu.f32, Products::f32);
  EXPECT_EQ(cpu.f16, Products::f32);
  if (cpu.amx_permitted) {
    EXPECT_EQ(cpu.bf16, Products::amx);
  }
  if (!cpu.avx512_bf16) {
    EXPECT_EQ(cpu.bf16, Products::f32);
  }
  EXPECT_EQ(tile_products(DType::bf16, 64, 64, true), cpu.bf16);
}

}  // namespace
}  // namespace maskattn
