// The fused kernel against the f64 reference (docs/design.md §5): a sweep over sizes around the
// tile edges, head dims, GQA, every mask component, dtypes and layouts, with the rule "max error at
// most 2× the error of a naive implementation in the same dtype, plus 1e-6"; and the bit-exact
// properties: thread counts, block skipping on/off, split-key merging.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "core/block_skipping.h"
#include "forward_rule.h"
#include "kernels/fused_block.h"
#include "test_util.h"

namespace maskattn {
namespace {

using Problem = test::RandomProblem;
using test::expect_within_rule;
using test::Result;
using test::run_kernel;

TEST(FusedSweep, EveryMaskAcrossTileEdges) {
  test::for_each_edge_case(100, [](const Problem& p, const Mask& mask, const std::string& what) {
    expect_within_rule(p, DType::f32, mask, what);
  });
}

TEST(FusedSweep, HalfPrecisionInputs) {
  test::for_each_half_precision_case(
      [](const Problem& p, DType dtype, const Mask& mask, const std::string& what) {
        expect_within_rule(p, dtype, mask, what);
      });
}

TEST(FusedSweep, LongSequence) {
  const Problem p(1, 2, 1, 1000, 1000, 64, 64, 7);
  for (const Mask& mask : {Mask(), Mask().causal(), Mask().sliding_window(100)}) {
    expect_within_rule(p, DType::f32, mask, "L=1000 " + mask.describe());
  }
}

// A window unbounded on the right (FlashAttention's window_size = (left, -1)): the tile mask's
// query intervals saturate instead of overflowing, in the row (decode) and the tile kernels.
TEST(FusedSweep, WindowUnboundedOnTheRight) {
  for (const int64_t lq : {5, 130}) {
    const Problem p(1, 2, 1, lq, 150, 32, 32, 11);
    for (const Mask& mask : {Mask().window(3, kUnbounded), Mask().window(70, kUnbounded),
                             Mask().window(kUnbounded, kUnbounded).key_lengths({100})}) {
      expect_within_rule(p, DType::f32, mask, "Lq=" + std::to_string(lq) + " " + mask.describe());
    }
  }
}

TEST(FusedModifiers, MatchTheReference) {
  const Problem p(1, 4, 2, 70, 150, 32, 16, 77, 3.0f);
  ScoreMods mods;
  mods.softcap = 5.0;
  mods.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  mods.bias = Array<float>({70, 150}, test::random_values(70 * 150, 9));
  mods.sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  const Mask mask =
      Mask().causal().additive(Array<float>({150}, test::random_values(150, 4, -2, 0)));
  for (int64_t lq : {70, 3}) {  // tile kernel and row kernel
    Problem q = p;
    q.Lq = lq;
    q.q.resize(q.B * q.Hq * lq * q.D);
    ScoreMods m = mods;
    m.bias = Array<float>({150}, test::random_values(150, 9));
    for (ScoreMods variant : {m, [&] {
                                ScoreMods t = m;
                                t.threshold = -1.0;
                                t.score_fn = [](double s, int64_t, int64_t h, int64_t i,
                                                int64_t j) { return s + 0.01 * ((i + j + h) % 5); };
                                return t;
                              }()}) {
      const Result fused = run_kernel(q, DType::f32, mask, variant, Kernel::fused);
      const Result oracle = run_kernel(q, DType::f32, mask, variant, Kernel::reference);
      EXPECT_LE(test::max_error(fused.out, oracle.out), 2e-5) << "Lq=" << lq;
      EXPECT_LE(test::max_error(fused.lse, oracle.lse), 2e-5) << "Lq=" << lq;
    }
  }
}

TEST(FusedLayouts, StridedAndConvertedInputs) {
  // K as [B, L, H, D] (inner stride 1, row stride H·D), V with padded rows, Q reversed along L.
  const Problem p(2, 2, 2, 70, 90, 16, 8, 31);
  const Result expected = run_kernel(p, DType::f32, Mask().causal(), {}, Kernel::reference);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const test::DTypeBuffer q(p.q, dtype), k(p.k, dtype), v(p.v, dtype);
    // Re-lay K as BLHD and V with 3 elements of padding per row, in the same dtype.
    const size_t width = dtype_size(dtype);
    std::vector<uint8_t> k_blhd(p.k.size() * width), v_padded(2 * 2 * 90 * 11 * width);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t g = 0; g < 2; ++g)
        for (int64_t j = 0; j < 90; ++j) {
          std::memcpy(k_blhd.data() + (((b * 90 + j) * 2 + g) * 16) * width,
                      reinterpret_cast<const uint8_t*>(k.words.data()) +
                          (((b * 2 + g) * 90 + j) * 16) * width,
                      16 * width);
          std::memcpy(v_padded.data() + (((b * 2 + g) * 90 + j) * 11) * width,
                      reinterpret_cast<const uint8_t*>(v.words.data()) +
                          (((b * 2 + g) * 90 + j) * 8) * width,
                      8 * width);
        }
    test::DTypeBuffer out(std::vector<float>(2 * 2 * 70 * 8), dtype);
    attention(TensorView(q.words.data(), dtype, {2, 2, 70, 16}),
              TensorView(k_blhd.data(), dtype, {2, 2, 90, 16}, {90 * 2 * 16, 16, 2 * 16, 1}),
              TensorView(v_padded.data(), dtype, {2, 2, 90, 8}, {2 * 90 * 11, 90 * 11, 11, 1}),
              MutableTensorView(out.words.data(), dtype, {2, 2, 70, 8}), Mask().causal());
    const float tolerance = dtype == DType::f32 ? 1e-5f : dtype == DType::f16 ? 4e-3f : 3e-2f;
    EXPECT_LE(test::max_error(out.floats(2 * 2 * 70 * 8), expected.out), tolerance)
        << dtype_name(dtype);
  }
  // Non-unit inner strides: D read with stride 2.
  std::vector<float> q2(p.q.size() * 2);
  for (size_t n = 0; n < p.q.size(); ++n) q2[2 * n] = p.q[n];
  std::vector<float> out(2 * 2 * 70 * 8);
  attention(TensorView(q2.data(), {2, 2, 70, 16}, {2 * 70 * 32, 70 * 32, 32, 2}),
            TensorView(p.k.data(), {2, 2, 90, 16}), TensorView(p.v.data(), {2, 2, 90, 8}),
            MutableTensorView(out.data(), {2, 2, 70, 8}), Mask().causal());
  EXPECT_LE(test::max_error(out, expected.out), 1e-5f);
}

TEST(FusedBitwise, OneAndTwoThreadsAgreeInEveryMode) {
  const std::vector<Problem> problems = {
      Problem(2, 4, 2, 200, 300, 64, 64, 1),  // tile kernel
      Problem(2, 8, 2, 3, 700, 32, 32, 2),    // row kernel
      Problem(1, 2, 1, 1, 20000, 16, 16, 3),  // row kernel with split keys
  };
  ScoreMods sinks;
  for (const Problem& p : problems) {
    sinks.sinks.assign(p.Hq, 0.25f);
    for (const Mask& mask : {Mask().causal(), Mask().sliding_window(150).key_lengths(
                                                  std::vector<int64_t>(p.B, p.Lk - 3))}) {
      for (const ScoreMods& mods : {ScoreMods{}, sinks}) {
        const Result one = run_kernel(p, DType::f32, mask, mods, Kernel::fused, 1);
        const Result two = run_kernel(p, DType::f32, mask, mods, Kernel::fused, 2);
        EXPECT_EQ(one.out, two.out) << "Lq=" << p.Lq << " Lk=" << p.Lk;
        EXPECT_EQ(one.lse, two.lse);
        const Result reference = run_kernel(p, DType::f32, mask, mods, Kernel::reference);
        EXPECT_LE(test::max_error(one.out, reference.out), 1e-5f)
            << "Lq=" << p.Lq << " Lk=" << p.Lk;
        EXPECT_LE(test::max_error(one.lse, reference.lse), 1e-4f)
            << "Lq=" << p.Lq << " Lk=" << p.Lk;
      }
    }
  }
}

TEST(FusedBitwise, SkippedTilesAreExact) {
  // Same bits with block skipping forced off (every tile visited with the element mask, and
  // partial tiles never reduced to their active rows), including leading empty rows inside a tile
  // (bottom-right causal with Lq > Lk, left padding).
  const std::vector<Problem> problems = {Problem(1, 2, 1, 200, 150, 32, 32, 5),
                                         Problem(1, 2, 2, 130, 260, 64, 16, 6)};
  // Modifiers too: the chain runs on tiles reduced to their active rows (softcap, ALiBi, bias).
  ScoreMods mods;
  mods.softcap = 4.0;
  const std::vector<float> slopes = {0.25f, 0.0625f};
  mods.alibi_slopes = slopes;
  std::vector<float> bias(200 * 150);
  for (size_t n = 0; n < bias.size(); ++n) bias[n] = static_cast<float>(n % 7) * 0.1f;
  for (const Problem& p : problems) {
    for (const auto& [name, mask] : test::sweep_masks(p)) {
      const Result on = run_kernel(p, DType::f32, mask, {}, Kernel::fused, 0, true);
      const Result off = run_kernel(p, DType::f32, mask, {}, Kernel::fused, 0, false);
      EXPECT_EQ(on.out, off.out) << name;
      EXPECT_EQ(on.lse, off.lse) << name;
      if (p.Lq != 200 || p.Lk != 150) continue;
      mods.bias = Array<float>({200, 150}, bias);
      const Result mods_on = run_kernel(p, DType::f32, mask, mods, Kernel::fused, 0, true);
      const Result mods_off = run_kernel(p, DType::f32, mask, mods, Kernel::fused, 0, false);
      EXPECT_EQ(mods_on.out, mods_off.out) << name << " with modifiers";
      EXPECT_EQ(mods_on.lse, mods_off.lse) << name << " with modifiers";
    }
  }
}

// Global tokens and block-sparse layouts change which tiles are skipped, never the arithmetic: a
// dense keep mask of the same pairs gives the same bits, in the tile and the row kernel.
TEST(FusedSparse, DenseKeepOfTheSamePairsIsBitwiseEqual) {
  for (const Problem& p :
       {Problem(2, 4, 2, 200, 200, 32, 32, 31), Problem(1, 2, 1, 3, 170, 16, 8, 32),
        Problem(1, 2, 2, 130, 97, 64, 16, 33)}) {
    ASSERT_EQ(test::sparse_sweep_masks(p).size(), 4u);  // the four sparse sweep masks
    for (const auto& [name, mask] : test::sparse_sweep_masks(p)) {
      const Mask dense = Mask().keep(allowed_pairs(mask, p.shape()));
      for (const DType dtype : {DType::f32, DType::bf16}) {
        const Result sparse_result = run_kernel(p, dtype, mask, {}, Kernel::fused);
        const Result dense_result = run_kernel(p, dtype, dense, {}, Kernel::fused);
        EXPECT_EQ(sparse_result.out, dense_result.out) << name << " Lq=" << p.Lq;
        EXPECT_EQ(sparse_result.lse, dense_result.lse) << name << " Lq=" << p.Lq;
      }
    }
  }
}

TEST(FusedSparse, GatheredGlobalQueriesAreBitwiseEqual) {
  // Global tokens spread over the sequence (one every 100 rows, so every other block holds one)
  // are computed apart, gathered into blocks of their own (fused.cc): the same bits as a dense
  // keep mask of the same pairs and as the kernel without block skipping, for every dtype, one and
  // two threads, with attention sinks, per-head and per-sequence global tokens, and GQA.
  const Problem p(2, 4, 2, 700, 640, 32, 24, 41);
  std::vector<int64_t> ids_q, ids_k;
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t i = 0; i < p.Lq; ++i) ids_q.push_back((i + 7 * b) % 100 == 5);
    for (int64_t j = 0; j < p.Lk; ++j) ids_k.push_back((j + 7 * b) % 100 == 5);
  }
  const Array<int64_t> global_q({p.B, p.Lq}, ids_q), global_k({p.B, p.Lk}, ids_k);
  const std::vector<std::pair<std::string, Mask>> masks = {
      {"window 64 & global", Mask().sliding_window(64).global_tokens(global_q, global_k)},
      {"causal & global on heads 1, 2",
       Mask().causal().global_tokens(global_q, global_k, HeadSet{1, 2})},
      {"window(30, 30) & global [L]",
       Mask().window(30, 30).global_tokens(
           Array<int64_t>({p.Lq}, {ids_q.begin(), ids_q.begin() + p.Lq}),
           Array<int64_t>({p.Lk}, {ids_k.begin(), ids_k.begin() + p.Lk}))}};
  ScoreMods sinks;
  sinks.sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  for (const auto& [name, mask] : masks) {
    const Mask dense = Mask().keep(allowed_pairs(mask, p.shape()));
    for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      for (const ScoreMods& mods : {ScoreMods{}, sinks}) {
        const Result gathered = run_kernel(p, dtype, mask, mods, Kernel::fused, 2);
        const Result one_thread = run_kernel(p, dtype, mask, mods, Kernel::fused, 1);
        const Result plain = run_kernel(p, dtype, mask, mods, Kernel::fused, 2, false);
        const Result keep = run_kernel(p, dtype, dense, mods, Kernel::fused, 2);
        for (const Result* other : {&one_thread, &plain, &keep}) {
          EXPECT_EQ(gathered.out, other->out) << name;
          EXPECT_EQ(gathered.lse, other->lse) << name;
        }
      }
    }
    expect_within_rule(p, DType::f32, mask, name);
  }
}

TEST(FusedRows, FullyHiddenRowsAndNonFiniteHiddenValues) {
  Problem p(1, 2, 1, 100, 80, 16, 16, 8);
  for (int64_t e = 0; e < 16; ++e) p.v[70 * 16 + e] = NAN;  // key 70 is padding below
  for (int64_t d = 0; d < 16; ++d) p.k[75 * 16 + d] = INFINITY;
  for (const int64_t lq : {int64_t{100}, int64_t{4}}) {  // tile and row kernels
    Problem q = p;
    q.Lq = lq;
    q.q.resize(2 * lq * 16);
    const Result result =
        run_kernel(q, DType::f32, Mask().causal().key_lengths({60}), {}, Kernel::fused);
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < lq; ++i) {
        const int64_t qpos = i + 80 - lq;
        const size_t row = h * lq + i;
        if (qpos < 0) {
          EXPECT_EQ(result.lse[row], -INFINITY);
          for (int64_t e = 0; e < 16; ++e) EXPECT_EQ(result.out[row * 16 + e], 0.0f);
        } else {
          EXPECT_TRUE(std::isfinite(result.lse[row])) << "row " << i;
          for (int64_t e = 0; e < 16; ++e) EXPECT_TRUE(std::isfinite(result.out[row * 16 + e]));
        }
      }
    }
  }
}

TEST(FusedRows, NanQueryPoisonsOnlyItsRow) {
  Problem p(1, 1, 1, 100, 100, 8, 8, 9);
  p.q[5 * 8] = NAN;
  const Result result = run_kernel(p, DType::f32, Mask(), {}, Kernel::fused);
  EXPECT_TRUE(std::isnan(result.out[5 * 8]));
  EXPECT_TRUE(std::isnan(result.lse[5]));
  EXPECT_TRUE(std::isfinite(result.out[4 * 8]));
  EXPECT_TRUE(std::isfinite(result.out[6 * 8]));
}

TEST(FusedRows, EmptyKeysAndSinks) {
  const Problem p(1, 2, 1, 70, 0, 8, 8, 10);
  ScoreMods mods;
  mods.sinks = {0.5f, -0.5f};
  const Result result = run_kernel(p, DType::f32, Mask(), mods, Kernel::fused);
  for (size_t n = 0; n < result.out.size(); ++n) EXPECT_EQ(result.out[n], 0.0f);
  EXPECT_EQ(result.lse[0], 0.5f);
  EXPECT_EQ(result.lse[70], -0.5f);
}

TEST(FusedGqa, EqualsRepeatedKvHeadsBitwise) {
  for (const int64_t lq : {int64_t{100}, int64_t{2}}) {
    const Problem grouped(1, 6, 2, lq, 90, 16, 16, 11);
    Problem repeated(1, 6, 6, lq, 90, 16, 16, 11);
    repeated.q = grouped.q;
    for (int64_t h = 0; h < 6; ++h) {
      std::copy_n(grouped.k.begin() + (h / 3) * 90 * 16, 90 * 16, repeated.k.begin() + h * 90 * 16);
      std::copy_n(grouped.v.begin() + (h / 3) * 90 * 16, 90 * 16, repeated.v.begin() + h * 90 * 16);
    }
    EXPECT_EQ(run_kernel(grouped, DType::f32, Mask().causal(), {}, Kernel::fused).out,
              run_kernel(repeated, DType::f32, Mask().causal(), {}, Kernel::fused).out);
  }
}

TEST(FusedBitwise, RunsOfShortBandBlocksEqualEachHeadAlone) {
  // With many query blocks whose key band is short (a sliding window), one work item takes a run
  // of consecutive blocks of one head; a single head alone (too few blocks to group) must give
  // the same bits, row for row.
  const Problem all(2, 4, 4, 2048, 2048, 16, 16, 21);
  const Mask mask = Mask().sliding_window(100);
  const Result whole = run_kernel(all, DType::f32, mask, {}, Kernel::fused);
  const int64_t head = 2048 * 16;
  for (int64_t bh : {int64_t{0}, int64_t{5}}) {
    Problem one(1, 1, 1, 2048, 2048, 16, 16, 21);
    one.q.assign(all.q.begin() + bh * head, all.q.begin() + (bh + 1) * head);
    one.k.assign(all.k.begin() + bh * head, all.k.begin() + (bh + 1) * head);
    one.v.assign(all.v.begin() + bh * head, all.v.begin() + (bh + 1) * head);
    const Result alone = run_kernel(one, DType::f32, mask, {}, Kernel::fused);
    EXPECT_TRUE(std::equal(alone.out.begin(), alone.out.end(), whole.out.begin() + bh * head))
        << "(b, h) " << bh;
    EXPECT_TRUE(std::equal(alone.lse.begin(), alone.lse.end(), whole.lse.begin() + bh * 2048))
        << "(b, h) " << bh;
  }
  // And the grouped run against the f64 reference.
  const Result exact = run_kernel(all, DType::f32, mask, {}, Kernel::reference);
  double worst = 0.0;
  for (size_t n = 0; n < exact.out.size(); ++n) {
    worst = std::max(worst, static_cast<double>(std::fabs(whole.out[n] - exact.out[n])));
  }
  EXPECT_LT(worst, 1e-5);
}

TEST(FusedBitwise, PairedBlocksEqualEachHeadAlone) {
  // With enough query blocks whose key band is long, two adjacent blocks of one head run
  // together, each K and V tile read once for both; a single head alone (too few blocks to pair)
  // must give the same bits, row for row, for each dtype, with and without a mask and sinks.
  const Problem all(2, 4, 2, 1024, 1000, 16, 24, 23);
  ScoreMods sinks;
  sinks.sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  for (const Mask& mask : {Mask(), Mask().causal(), Mask().window(300, 200)}) {
    for (const DType dtype : {DType::f32, DType::bf16}) {
      for (const ScoreMods& mods : {ScoreMods{}, sinks}) {
        const Result whole = run_kernel(all, dtype, mask, mods, Kernel::fused);
        for (const int64_t b : {int64_t{0}, int64_t{1}}) {
          const int64_t h = 3, g = 1;  // query head 3 reads kv head 1
          Problem one(1, 1, 1, all.Lq, all.Lk, all.D, all.Dv, 23);
          const auto rows = [](const std::vector<float>& values, int64_t head, int64_t size) {
            return std::vector<float>(values.begin() + head * size,
                                      values.begin() + (head + 1) * size);
          };
          one.q = rows(all.q, b * all.Hq + h, all.Lq * all.D);
          one.k = rows(all.k, b * all.Hkv + g, all.Lk * all.D);
          one.v = rows(all.v, b * all.Hkv + g, all.Lk * all.Dv);
          ScoreMods one_mods = mods;
          if (!mods.sinks.empty()) one_mods.sinks = {mods.sinks[h]};
          const Result alone = run_kernel(one, dtype, mask, one_mods, Kernel::fused);
          const int64_t head = b * all.Hq + h;
          EXPECT_TRUE(std::equal(alone.out.begin(), alone.out.end(),
                                 whole.out.begin() + head * all.Lq * all.Dv))
              << "b " << b;
          EXPECT_TRUE(
              std::equal(alone.lse.begin(), alone.lse.end(), whole.lse.begin() + head * all.Lq))
              << "b " << b;
        }
      }
    }
  }
}

TEST(FusedBitwise, StridedF32OutputGetsTheContiguousBits) {
  // An f32 output laid out [B, L, H, Dv] with padding after each row must hold the same bits as a
  // contiguous [B, H, L, Dv] output, and its padding untouched, in tile mode, paired blocks (long
  // bands) and the last, partial block of a sequence.
  for (const int64_t lq : {int64_t{200}, int64_t{1024}}) {
    const Problem p(2, 3, 3, lq, 1000, 16, 24, 41);
    for (const Mask& mask : {Mask(), Mask().causal(), Mask().sliding_window(70)}) {
      const int64_t rows = p.B * p.Hq * p.Lq;
      std::vector<float> out(rows * p.Dv), lse(rows);
      attention(p.qv(), p.kv(), p.vv(), MutableTensorView(out.data(), {p.B, p.Hq, p.Lq, p.Dv}),
                mask, {}, {}, MutableTensorView(lse.data(), {p.B, p.Hq, p.Lq}));
      // [B, L, H, Dv + 5]: each row 5 floats of padding, rows of one head H·(Dv + 5) apart.
      const int64_t width = p.Dv + 5;
      std::vector<float> strided(rows * width, 7.0f), strided_lse(rows);
      attention(p.qv(), p.kv(), p.vv(),
                MutableTensorView(strided.data(), DType::f32, {p.B, p.Hq, p.Lq, p.Dv},
                                  {p.Lq * p.Hq * width, width, p.Hq * width, 1}),
                mask, {}, {}, MutableTensorView(strided_lse.data(), {p.B, p.Hq, p.Lq}));
      for (int64_t b = 0; b < p.B; ++b) {
        for (int64_t h = 0; h < p.Hq; ++h) {
          for (int64_t i = 0; i < p.Lq; ++i) {
            const float* want = out.data() + ((b * p.Hq + h) * p.Lq + i) * p.Dv;
            const float* got = strided.data() + ((b * p.Lq + i) * p.Hq + h) * width;
            ASSERT_EQ(std::memcmp(want, got, p.Dv * sizeof(float)), 0)
                << "Lq " << lq << " b " << b << " h " << h << " i " << i;
            for (int64_t e = p.Dv; e < width; ++e) ASSERT_EQ(got[e], 7.0f);
          }
        }
      }
      EXPECT_EQ(std::memcmp(lse.data(), strided_lse.data(), rows * sizeof(float)), 0);
    }
  }
}

// The next block's queries are prefetched a line per step (prefetch_stream.h): every line of the
// range once, from the line holding its first byte, then nothing.
TEST(FusedPrefetch, StreamCoversEveryLineOfItsRangeOnceThenStops) {
  alignas(64) static char buffer[64 * 40];
  for (const int64_t offset : {0, 1, 63}) {
    for (const int64_t bytes : {1, 64, 65, 16 * 64 + 3}) {
      detail::fused::PrefetchStream stream;
      stream.start(buffer + offset, bytes);
      std::vector<const char*> lines;
      while (!stream.done()) {
        lines.push_back(stream.next());
        stream.step();
      }
      const int64_t expected = (offset + bytes + 63) / 64;  // lines meeting [offset, offset+bytes)
      ASSERT_EQ(static_cast<int64_t>(lines.size()), expected) << offset << " " << bytes;
      for (size_t n = 0; n < lines.size(); ++n) EXPECT_EQ(lines[n], buffer + 64 * n);
      detail::fused::PrefetchStep(&stream, 3);  // past the end: no further line
      EXPECT_EQ(stream.next(), nullptr);
    }
  }
  detail::fused::PrefetchStream stopped;
  stopped.start(buffer, 640);
  stopped.stop();
  EXPECT_TRUE(stopped.done());
  detail::fused::PrefetchStep(nullptr, 2);  // no stream: nothing to do
}

// A stream of several ranges (the next block's queries, then a key tile's K and V) walks them in
// the order they were added, each from the line holding its first byte; an empty range and ranges
// past kMaxRanges are left out; start() forgets the ranges before it.
TEST(FusedPrefetch, StreamWalksItsRangesInTheOrderAdded) {
  alignas(64) static char buffer[64 * 40];
  detail::fused::PrefetchStream stream;
  stream.start(buffer + 64 * 30, 64 * 2, 4);
  stream.add(buffer + 5, 64);  // lines 0 and 1
  stream.add(buffer, 0);       // empty: ignored
  stream.add(buffer + 64 * 10, 1);
  stream.add(buffer + 64 * 20, 64);  // a fourth range: beyond kMaxRanges
  EXPECT_EQ(stream.lines_per_unit, 4);
  std::vector<const char*> lines;
  while (!stream.done()) {
    lines.push_back(stream.next());
    stream.step();
  }
  const std::vector<const char*> expected = {buffer + 64 * 30, buffer + 64 * 31, buffer,
                                             buffer + 64, buffer + 64 * 10};
  EXPECT_EQ(lines, expected);
  stream.start(buffer + 64 * 2, 64);
  EXPECT_EQ(stream.next(), buffer + 64 * 2);
  stream.step();
  EXPECT_TRUE(stream.done());
}

TEST(FusedExp, WithinThreeTenthsOfAMillionthOverTheSoftmaxRange) {
  // Every argument the online softmax can produce: (−∞, 0], densely near 0 and across the range
  // where results are normal floats; −inf must give exactly 0.
  std::vector<float> in;
  for (int n = 0; n < 64 * 4096; ++n) in.push_back(-static_cast<float>(n) * (88.0f / (64 * 4096)));
  in.back() = -INFINITY;
  std::vector<float> out(in.size());
  detail::fused::exp_non_positive(in.data(), static_cast<int64_t>(in.size()), out.data());
  double worst = 0;
  for (size_t n = 0; n + 1 < in.size(); ++n) {
    const double exact = std::exp(static_cast<double>(in[n]));
    if (exact < 1e-37) continue;  // below the normal range: flushed, by design
    worst = std::max(worst, std::fabs(out[n] - exact) / exact);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(out.back(), 0.0f);
  EXPECT_EQ(out[0], 1.0f);
}

TEST(FusedStore, VectorRoundingEqualsTheScalarConversions) {
  // Ties, overflow, subnormals, signed zeros, infinities and NaN, then a sweep of random floats.
  std::vector<float> values = {1.0f + 0x1p-8f,
                               1.0f + 3 * 0x1p-8f,
                               1.0f + 0x1p-11f,
                               65519.0f,
                               65520.0f,
                               3.4e38f,
                               0x1p-130f,
                               0x1p-25f,
                               -0.0f,
                               INFINITY,
                               -INFINITY,
                               NAN,
                               1.0068359375f,
                               -1e9f,
                               0.1f,
                               -2.5f};
  for (float x : test::random_values(1000, 3, -1e5f, 1e5f)) values.push_back(x);
  for (DType dtype : {DType::f16, DType::bf16}) {
    std::vector<uint16_t> out(values.size());
    detail::fused::store_row(
        MutableTensorView(out.data(), dtype, {static_cast<int64_t>(out.size())}), 0, 1,
        values.data(), static_cast<int64_t>(values.size()));
    for (size_t n = 0; n < values.size(); ++n) {
      const uint16_t expected = dtype == DType::f16 ? float16_from_float(values[n]).bits
                                                    : bfloat16_from_float(values[n]).bits;
      if (std::isnan(values[n])) {
        EXPECT_TRUE(std::isnan(dtype == DType::f16 ? to_float(float16{out[n]})
                                                   : to_float(bfloat16{out[n]})));
      } else {
        EXPECT_EQ(out[n], expected) << dtype_name(dtype) << " " << values[n];
      }
    }
  }
}

TEST(MergePartials, SplittingKeysAndMergingEqualsTheWhole) {
  const Problem p(1, 2, 1, 5, 100, 8, 8, 12);
  const Result whole = run_kernel(p, DType::f32, Mask(), {}, Kernel::reference);
  // Keys [0, 40) and [40, 100) as two separate calls.
  Problem left = p, right = p;
  left.Lk = 40;
  right.Lk = 60;
  left.k.assign(p.k.begin(), p.k.begin() + 40 * 8);
  left.v.assign(p.v.begin(), p.v.begin() + 40 * 8);
  right.k.assign(p.k.begin() + 40 * 8, p.k.end());
  right.v.assign(p.v.begin() + 40 * 8, p.v.end());
  const Result a = run_kernel(left, DType::f32, Mask(), {}, Kernel::reference);
  const Result b = run_kernel(right, DType::f32, Mask(), {}, Kernel::reference);
  std::vector<float> out(whole.out.size()), lse(whole.lse.size());
  merge_partials({{TensorView(a.out.data(), {1, 2, 5, 8}), TensorView(a.lse.data(), {1, 2, 5})},
                  {TensorView(b.out.data(), {1, 2, 5, 8}), TensorView(b.lse.data(), {1, 2, 5})}},
                 MutableTensorView(out.data(), {1, 2, 5, 8}),
                 MutableTensorView(lse.data(), {1, 2, 5}));
  EXPECT_LE(test::max_error(out, whole.out), 1e-6f);
  EXPECT_LE(test::max_error(lse, whole.lse), 1e-6f);
}

TEST(MergePartials, AnEmptyPartChangesNothing) {
  const Problem p(1, 1, 1, 3, 10, 4, 4, 13);
  const Result whole = run_kernel(p, DType::f32, Mask(), {}, Kernel::reference);
  const std::vector<float> empty_out(3 * 4, 0.0f), empty_lse(3, -INFINITY);
  std::vector<float> out(12), lse(3);
  merge_partials(
      {{TensorView(empty_out.data(), {1, 1, 3, 4}), TensorView(empty_lse.data(), {1, 1, 3})},
       {TensorView(whole.out.data(), {1, 1, 3, 4}), TensorView(whole.lse.data(), {1, 1, 3})}},
      MutableTensorView(out.data(), {1, 1, 3, 4}), MutableTensorView(lse.data(), {1, 1, 3}));
  EXPECT_EQ(out, whole.out);
  EXPECT_EQ(lse, whole.lse);
  // Two empty parts: the row stays empty.
  merge_partials(
      {{TensorView(empty_out.data(), {1, 1, 3, 4}), TensorView(empty_lse.data(), {1, 1, 3})},
       {TensorView(empty_out.data(), {1, 1, 3, 4}), TensorView(empty_lse.data(), {1, 1, 3})}},
      MutableTensorView(out.data(), {1, 1, 3, 4}), MutableTensorView(lse.data(), {1, 1, 3}));
  for (float x : out) EXPECT_EQ(x, 0.0f);
  for (float x : lse) EXPECT_EQ(x, -INFINITY);
}

TEST(MergePartials, RejectsMismatchedParts) {
  std::vector<float> a(12), l(3), out(12);
  EXPECT_MASKATTN_ERROR(merge_partials({}, MutableTensorView(out.data(), {1, 1, 3, 4})),
                        "merge_partials: no parts to merge");
  EXPECT_MASKATTN_ERROR(
      merge_partials({{TensorView(a.data(), {1, 1, 4, 3}), TensorView(l.data(), {1, 1, 3})}},
                     MutableTensorView(out.data(), {1, 1, 3, 4})),
      "part 0 out has shape [1,1,4,3] but out is [1,1,3,4]");
}

}  // namespace
}  // namespace maskattn
