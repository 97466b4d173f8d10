// Mask programs (Mask::program) against what they mean: the same pairs as the structured Mask or
// the lambda they spell, the same bits out of the kernels as a dense keep mask of those pairs,
// exact block classifications with no Lq × Lk buffer, and errors before any evaluation. (The
// kernel sweeps of test_util.cc's sweep_masks carry two program masks through every kernel,
// frame, ring and backward test against the f64 reference.)
#include <algorithm>
#include <cmath>

#include "forward_rule.h"
#include "mask/block_map.h"
#include "test_util.h"

namespace maskattn {
namespace {

using Problem = test::RandomProblem;
using detail::TileKind;
using test::run_kernel;

std::vector<int64_t> documents(int64_t batch, int64_t length, int64_t size) {
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < length; ++t) ids.push_back((t + 5 * b) / size);
  }
  return ids;
}

TEST(MaskProgram, SpellsTheSamePairsAsTheStructuredMask) {
  const int64_t B = 2, H = 3, L = 150;
  const std::vector<int64_t> doc = documents(B, L, 40);
  const std::vector<std::tuple<std::string, Mask, Mask>> cases = {
      {"causal", Mask().program("q >= kv"), Mask().causal()},
      {"sliding window", Mask().program("(q >= kv) & (q - kv < 32)"), Mask().sliding_window(32)},
      {"prefix-LM", Mask().program("(kv <= q) | (kv < 20)"), Mask().causal().prefix_lm(20)},
      {"documents",
       Mask().program("(doc[b, q] == doc[b, kv]) & (q >= kv)",
                      {ProgramTable::borrow("doc", doc.data(), {B, L})}),
       Mask().causal().segments(Array<int64_t>({B, L}, doc))},
      {"chunks", Mask().program("q // 48 == kv // 48"), Mask().chunk(48)},
      {"per head", Mask().program("where(h == 0, q >= kv, (q - kv <= 7) & (kv - q <= 7))"),
       Mask().causal(HeadSet{0}).window(7, 7, HeadSet::range(1, H))},
  };
  for (const auto& [name, program, structured] : cases) {
    EXPECT_EQ(allowed_pairs(program, {B, H, L, L}).values(),
              allowed_pairs(structured, {B, H, L, L}).values())
        << name;
    EXPECT_EQ(count_allowed(program, {B, H, L, L}), count_allowed(structured, {B, H, L, L}))
        << name;
  }
}

TEST(MaskProgram, KernelsGiveTheBitsOfADenseKeepMaskOfTheSamePairs) {
  for (const Problem& p : {Problem(2, 4, 2, 200, 200, 32, 32, 51),
                           Problem(1, 2, 1, 1, 170, 16, 8, 52),  // decode: the row kernel
                           Problem(1, 2, 2, 130, 97, 64, 16, 53)}) {
    const std::vector<int64_t> doc = documents(p.B, std::max(p.Lq, p.Lk), 33);
    const Mask program = Mask().program(
        "(doc[b, q] == doc[b, kv]) & (abs(q - kv) % 5 != 1) & ((h != 1) | (kv < 90))",
        {ProgramTable::borrow("doc", doc.data(), {p.B, std::max(p.Lq, p.Lk)})});
    const Mask dense = Mask().keep(allowed_pairs(program, p.shape()));
    for (const DType dtype : {DType::f32, DType::bf16}) {
      for (const Kernel kernel : {Kernel::fused, Kernel::reference}) {
        const test::Result a = run_kernel(p, dtype, program, {}, kernel);
        const test::Result b = run_kernel(p, dtype, dense, {}, kernel);
        EXPECT_EQ(a.out, b.out) << "Lq=" << p.Lq;
        EXPECT_EQ(a.lse, b.lse) << "Lq=" << p.Lq;
      }
    }
  }
}

// A program's block classification is exact: empty iff no pair, full iff every pair.
TEST(MaskProgram, BlockMapIsExact) {
  const int64_t L = 300;
  const std::vector<int64_t> doc = documents(1, L, 70);
  const Mask mask = Mask().program("(doc[0, q] == doc[0, kv]) & (q >= kv)",
                                   {ProgramTable::borrow("doc", doc.data(), {1, L})});
  const MaskShape shape = {1, 2, L, L};
  const Array<uint8_t> allowed = allowed_pairs(mask, shape);
  const Array<uint8_t> map = block_map(mask, shape, 64, 64);
  const int64_t tiles = map.dim(3);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t qt = 0; qt < tiles; ++qt) {
      for (int64_t kt = 0; kt < tiles; ++kt) {
        int64_t on = 0, size = 0;
        for (int64_t i = qt * 64; i < std::min(L, qt * 64 + 64); ++i) {
          for (int64_t j = kt * 64; j < std::min(L, kt * 64 + 64); ++j) {
            on += allowed.values()[(h * L + i) * L + j];
            ++size;
          }
        }
        const auto kind = static_cast<TileKind>(map.values()[(h * tiles + qt) * tiles + kt]);
        const TileKind expected = on == 0      ? TileKind::empty
                                  : on == size ? TileKind::full
                                               : TileKind::partial;
        EXPECT_EQ(kind, expected) << "h" << h << " tile " << qt << "," << kt;
      }
    }
  }
}

TEST(MaskProgram, AProgramThatCouldReadOutsideItsTableIsRefusedBeforeAnyEvaluation) {
  const std::vector<int64_t> doc = documents(1, 64, 10);
  const Mask mask =
      Mask().program("doc[q] == doc[kv]", {ProgramTable::borrow("doc", doc.data(), {64})});
  Problem p(1, 1, 1, 65, 65, 8, 8, 54);  // one row more than the table
  std::vector<float> out(p.Lq * p.Dv);
  for (const Kernel kernel : {Kernel::fused, Kernel::reference}) {
    Options options;
    options.kernel = kernel;
    EXPECT_MASKATTN_ERROR(
        attention(p.qv(), p.kv(), p.vv(), MutableTensorView(out.data(), {1, 1, 65, 8}), mask, {},
                  options),
        "doc", "[64]");
  }
  EXPECT_MASKATTN_ERROR(block_map(mask, p.shape()), "doc");
  EXPECT_NO_THROW(block_map(mask, {1, 1, 64, 64}));
}

// A KV-cache step: the new queries are the last rows of the whole sequence (Options::frame), so
// `q >= kv` is causal there as in the prefill.
TEST(MaskProgram, AFramedDecodeStepEqualsTheLastRowsOfThePrefill) {
  const Problem whole(1, 2, 1, 100, 100, 16, 16, 55);
  Problem step(1, 2, 1, 3, 100, 16, 16, 55);
  for (int64_t h = 0; h < 2; ++h) {  // the step's queries are the prefill's last three
    for (int64_t i = 0; i < 3; ++i) {
      for (int64_t d = 0; d < 16; ++d) {
        step.q[(h * 3 + i) * 16 + d] = whole.q[(h * 100 + 97 + i) * 16 + d];
      }
    }
  }
  const Mask mask = Mask().program("q >= kv");
  std::vector<float> full(2 * 100 * 16), last(2 * 3 * 16);
  attention(whole.qv(), whole.kv(), whole.vv(), MutableTensorView(full.data(), {1, 2, 100, 16}),
            mask);
  Options options;
  options.frame = {97, 0, 100, 100};
  attention(step.qv(), step.kv(), step.vv(), MutableTensorView(last.data(), {1, 2, 3, 16}), mask,
            {}, options);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t n = 0; n < 3 * 16; ++n) {
      EXPECT_NEAR(last[h * 48 + n], full[(h * 100 + 97) * 16 + n], 1e-6f);
    }
  }
}

TEST(MaskProgram, AScoreProgramIsNotAMask) {
  EXPECT_MASKATTN_ERROR(Mask().program(Program::score("s * 2.0")), "Mask::program", "score program",
                        "ScoreMods::program");
  EXPECT_EQ(Mask().program("q >= kv").describe(), "program `q >= kv`");
}

}  // namespace
}  // namespace maskattn
