// Draft-tree masks (Mask::tree, docs/semantics.md §3 "Draft trees"): the mask against the ancestor
// closure built by hand for random trees, with and without a cached prefix, Lq below, at and above
// T, one tree or one per sequence; the block map against the exact kinds of those pairs; attention
// forward and backward, both kernels, f32/f16/bf16, against the same pairs given as a dense keep
// mask (bitwise: a tree only chooses tiles and bits) and the fused kernel against the reference
// by the accuracy rule; combinations with other components, head sets, and frames.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/block_skipping.h"
#include "forward_rule.h"
#include "maskattn/gradcheck.h"
#include "test_util.h"

namespace maskattn {
namespace {

using test::DTypeBuffer;
using test::RandomProblem;

// `rows` random trees of `size` tokens in topological order. Three shapes by seed: a random
// recursive tree (parent uniform among the earlier tokens or a new root), a deep one (the parent
// usually among the last few tokens: long chains with side branches) and a bushy one (few
// parents, many siblings).
std::vector<int64_t> random_parents(int64_t rows, int64_t size, uint64_t seed) {
  const std::vector<float> u = test::random_values(rows * size, seed, 0.0f, 1.0f);
  std::vector<int64_t> parents(rows * size);
  for (int64_t n = 0; n < rows * size; ++n) {
    const int64_t t = n % size;
    const double x = u[n];
    int64_t parent = 0;
    switch (seed % 3) {
      case 0:
        parent = static_cast<int64_t>(x * (t + 1)) - 1;
        break;
      case 1:
        parent = t - 1 - static_cast<int64_t>(x * x * x * t);
        break;
      default:
        parent = static_cast<int64_t>(x * std::min<int64_t>(t + 1, 4)) - 1;
        break;
    }
    parents[n] = std::clamp<int64_t>(parent, -1, t - 1);
  }
  return parents;
}

Array<int64_t> parents_array(const std::vector<int64_t>& parents, int64_t rows, int64_t size,
                             bool batched) {
  return batched ? Array<int64_t>({rows, size}, parents)
                 : Array<int64_t>({size},
                                  std::vector<int64_t>(parents.begin(), parents.begin() + size));
}

// The tree's pairs built by hand, [B, 1, Lq, Lk]: a key before the draft is seen causally (row
// indices, bottom-right), a draft key only by the draft queries that descend from it, found by
// walking each query's parent chain.
Array<uint8_t> closure_keep(const std::vector<int64_t>& parents, bool batched, int64_t size,
                            int64_t batch, int64_t q_len, int64_t k_len) {
  std::vector<uint8_t> keep(batch * q_len * k_len, 0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t* tree = parents.data() + (batched ? b : 0) * size;
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t s = i - (q_len - size);
      for (int64_t j = 0; j < k_len; ++j) {
        const int64_t t = j - (k_len - size);
        bool allowed = t < 0 ? j <= i + (k_len - q_len) : false;
        for (int64_t a = t < 0 ? -1 : s; a >= 0; a = tree[a]) allowed |= a == t;
        keep[(b * q_len + i) * k_len + j] = allowed;
      }
    }
  }
  return Array<uint8_t>({batch, 1, q_len, k_len}, keep);
}

// Lq, the queries of a call: the whole sequence (prefill of prompt and draft), the draft alone
// (the usual verification step), part of the draft, and more than the keys.
std::vector<int64_t> query_lengths(int64_t size, int64_t prefix) {
  return {size + prefix, size, std::max<int64_t>(1, size - 3), 1, size + prefix + 2};
}

TEST(TreeMask, AllowedPairsEqualTheAncestorClosureOfRandomTrees) {
  uint64_t seed = 100;
  for (const int64_t size : {1, 2, 7, 63, 64, 65, 130}) {
    for (const int64_t prefix : {0, 5, 64}) {
      for (const bool batched : {false, true}) {
        const int64_t batch = 3, k_len = size + prefix;
        const std::vector<int64_t> parents = random_parents(batch, size, ++seed);
        const Mask tree = Mask().tree(parents_array(parents, batch, size, batched));
        for (const int64_t q_len : query_lengths(size, prefix)) {
          const MaskShape shape{batch, 2, q_len, k_len};
          const Array<uint8_t> keep = closure_keep(parents, batched, size, batch, q_len, k_len);
          const std::string what = "T=" + std::to_string(size) +
                                   " prefix=" + std::to_string(prefix) +
                                   " Lq=" + std::to_string(q_len) + (batched ? " [B,T]" : " [T]") +
                                   " seed " + std::to_string(seed);
          ASSERT_EQ(allowed_pairs(tree, shape).values(),
                    allowed_pairs(Mask().keep(keep), shape).values())
              << what;
        }
      }
    }
  }
}

TEST(TreeMask, SmallTreeDrawnByHand) {
  // Prefix of 2, draft -1 0 0 1 2 -1: tokens 1 and 2 are siblings under 0, 3 under 1, 4 under 2,
  // and 5 a second root.
  const Mask tree = Mask().tree({-1, 0, 0, 1, 2, -1});
  EXPECT_EQ(test::grid(tree, {1, 1, 8, 8}), (std::vector<std::string>{
                                                "1.......",
                                                "11......",
                                                "111.....",
                                                "1111....",
                                                "111.1...",
                                                "1111.1..",
                                                "111.1.1.",
                                                "11.....1",
                                            }));
  // The verification call: the draft's queries alone.
  EXPECT_EQ(test::grid(tree, {1, 1, 6, 8}),
            (std::vector<std::string>{"111.....", "1111....", "111.1...", "1111.1..", "111.1.1.",
                                      "11.....1"}));
  EXPECT_EQ(tree.describe(), "tree[6]");
}

// The kinds of the blocks of `allowed` [B, H, Lq, Lk] over tiles of tq × tk: empty, full, partial.
std::vector<uint8_t> exact_kinds(const Array<uint8_t>& allowed, int64_t tq, int64_t tk) {
  const Dims& d = allowed.shape();
  const int64_t nq = (d[2] + tq - 1) / tq, nk = (d[3] + tk - 1) / tk;
  std::vector<uint8_t> kinds;
  for (int64_t bh = 0; bh < d[0] * d[1]; ++bh) {
    for (int64_t qt = 0; qt < nq; ++qt) {
      for (int64_t kt = 0; kt < nk; ++kt) {
        int64_t on = 0, pairs = 0;
        for (int64_t i = qt * tq; i < std::min(d[2], (qt + 1) * tq); ++i) {
          for (int64_t j = kt * tk; j < std::min(d[3], (kt + 1) * tk); ++j) {
            on += allowed.values()[(bh * d[2] + i) * d[3] + j];
            ++pairs;
          }
        }
        kinds.push_back(on == 0 ? 0 : on == pairs ? 1 : 2);
      }
    }
  }
  return kinds;
}

TEST(TreeMask, BlockMapIsExact) {
  uint64_t seed = 200;
  for (const auto& [tq, tk] : {std::pair<int64_t, int64_t>{64, 64}, {5, 7}, {16, 48}, {1, 1}}) {
    for (const int64_t size : {3, 64, 100}) {
      for (const int64_t prefix : {0, 37, 130}) {
        const std::vector<int64_t> parents = random_parents(2, size, ++seed);
        // A per-sequence tree on heads 1 and 2 only: exact kinds on every head.
        const Mask mask = Mask().tree(parents_array(parents, 2, size, true), HeadSet{1, 2});
        // A second tree (the first sequence's, on every head) ANDed in: the block map folds the
        // two trees' kinds, so two partial verdicts may hide an empty block (as for any two
        // components), but empty and full stay exact claims.
        const Mask both = Mask(mask).tree(parents_array(parents, 2, size, false));
        for (const int64_t q_len : query_lengths(size, prefix)) {
          const MaskShape shape{2, 3, q_len, size + prefix};
          const std::string what = "tiles " + std::to_string(tq) + "x" + std::to_string(tk) +
                                   " T=" + std::to_string(size) +
                                   " prefix=" + std::to_string(prefix) +
                                   " Lq=" + std::to_string(q_len);
          EXPECT_EQ(block_map(mask, shape, tq, tk).values(),
                    exact_kinds(allowed_pairs(mask, shape), tq, tk))
              << what;
          const std::vector<uint8_t> folded = block_map(both, shape, tq, tk).values();
          const std::vector<uint8_t> exact = exact_kinds(allowed_pairs(both, shape), tq, tk);
          for (size_t n = 0; n < exact.size(); ++n) {
            ASSERT_TRUE(folded[n] == exact[n] || folded[n] == 2) << what << " block " << n;
          }
        }
      }
    }
  }
}

TEST(TreeMask, CombinesWithOtherComponentsAndHeads) {
  // The tree intersects every other component; heads outside its set are not restricted by it.
  const int64_t size = 9, prefix = 11, batch = 2, q_len = size, k_len = size + prefix;
  const std::vector<int64_t> parents = random_parents(batch, size, 7);
  const Array<int64_t> tree = parents_array(parents, batch, size, true);
  const Array<uint8_t> keep = closure_keep(parents, true, size, batch, q_len, k_len);
  const MaskShape shape{batch, 2, q_len, k_len};
  const Mask others = Mask().key_starts({3, 0}).sliding_window(12).causal();
  const Mask combined = Mask().tree(tree) & others;
  EXPECT_EQ(allowed_pairs(combined, shape).values(),
            allowed_pairs(Mask().keep(keep) & others, shape).values());
  // Causal adds nothing to a tree: it is never wider than causal.
  EXPECT_EQ(allowed_pairs(Mask().tree(tree).causal(), shape).values(),
            allowed_pairs(Mask().tree(tree), shape).values());
  // Head 1 only: head 0 sees what the other components allow.
  const Mask head_one = Mask().tree(tree, HeadSet{1}) & others;
  for (int64_t b = 0; b < batch; ++b) {
    EXPECT_EQ(test::grid(head_one, shape, b, 0), test::grid(others, shape, b, 0));
    EXPECT_EQ(test::grid(head_one, shape, b, 1), test::grid(combined, shape, b, 1));
  }
}

// ---- attention through the kernels ----

struct Case {
  int64_t batch, q_heads, kv_heads, size, prefix, q_len, d;
};

// Verification steps through the row kernel (Lq ≤ 8) and the tile kernel, a whole sequence with
// its draft (prefill), a draft with no prefix, a draft longer than a tile, GQA.
const Case kCases[] = {
    {2, 4, 2, 5, 300, 5, 32},  {1, 2, 1, 8, 70, 8, 16}, {2, 4, 2, 70, 100, 70, 40},
    {2, 2, 2, 30, 40, 70, 64}, {3, 2, 1, 90, 0, 90, 8}, {1, 8, 2, 130, 65, 130, 64},
    {2, 2, 1, 64, 64, 20, 24},
};

RandomProblem problem_of(const Case& c, uint64_t seed) {
  return RandomProblem(c.batch, c.q_heads, c.kv_heads, c.q_len, c.size + c.prefix, c.d, c.d, seed);
}

TEST(TreeAttention, ForwardEqualsTheDenseKeepOfTheSamePairsBitwise) {
  uint64_t seed = 300;
  for (const Case& c : kCases) {
    const RandomProblem p = problem_of(c, ++seed);
    const std::vector<int64_t> parents = random_parents(c.batch, c.size, seed);
    for (const bool batched : {false, true}) {
      const Mask tree = Mask().tree(parents_array(parents, c.batch, c.size, batched));
      const Mask dense = Mask().keep(allowed_pairs(tree, p.shape()));
      for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
        if (!batched && dtype != DType::f32) continue;  // the [T] form: one dtype is enough
        const std::string what = std::string(dtype_name(dtype)) + " T=" + std::to_string(c.size) +
                                 " prefix=" + std::to_string(c.prefix) +
                                 " Lq=" + std::to_string(c.q_len) + (batched ? " [B,T]" : " [T]");
        for (const Kernel kernel : {Kernel::fused, Kernel::reference}) {
          const test::Result a = test::run_kernel(p, dtype, tree, {}, kernel);
          const test::Result b = test::run_kernel(p, dtype, dense, {}, kernel);
          EXPECT_EQ(a.out, b.out) << what;
          EXPECT_EQ(a.lse, b.lse) << what;
        }
        test::expect_within_rule(p, dtype, tree, what);
      }
    }
  }
}

TEST(TreeAttention, BitwiseForAnyThreadCountAndWithoutSkipping) {
  const Case c{2, 4, 2, 70, 100, 70, 32};
  const RandomProblem p = problem_of(c, 41);
  const Mask tree = Mask().tree(parents_array(random_parents(2, c.size, 42), 2, c.size, true));
  const test::Result one = test::run_kernel(p, DType::f32, tree, {}, Kernel::fused, 1);
  for (const auto& [threads, skipping] : {std::pair{2, true}, {2, false}}) {
    const test::Result other =
        test::run_kernel(p, DType::f32, tree, {}, Kernel::fused, threads, skipping);
    EXPECT_EQ(one.out, other.out) << threads << " threads, skipping " << skipping;
    EXPECT_EQ(one.lse, other.lse) << threads << " threads, skipping " << skipping;
  }
}

struct Grads {
  std::vector<float> dq, dk, dv;
};

// Forward then backward in `dtype`, as backward_test.cc runs them.
Grads run_backward(const RandomProblem& p, DType dtype, const Mask& mask, Kernel kernel,
                   const std::vector<float>& dout_values) {
  const DTypeBuffer q(p.q, dtype), k(p.k, dtype), v(p.v, dtype), dout(dout_values, dtype);
  const Dims q_shape = {p.B, p.Hq, p.Lq, p.D}, k_shape = {p.B, p.Hkv, p.Lk, p.D};
  const Dims v_shape = {p.B, p.Hkv, p.Lk, p.Dv}, o_shape = {p.B, p.Hq, p.Lq, p.Dv};
  Options options;
  options.kernel = kernel;
  DTypeBuffer out(std::vector<float>(p.B * p.Hq * p.Lq * p.Dv), dtype);
  std::vector<float> lse(p.B * p.Hq * p.Lq);
  const MutableTensorView lse_view(lse.data(), {p.B, p.Hq, p.Lq});
  attention(q.view(q_shape), k.view(k_shape), v.view(v_shape), out.mutable_view(o_shape), mask, {},
            options, lse_view);
  DTypeBuffer dq(std::vector<float>(p.q.size(), -7.0f), dtype);
  DTypeBuffer dk(std::vector<float>(p.k.size(), -7.0f), dtype);
  DTypeBuffer dv(std::vector<float>(p.v.size(), -7.0f), dtype);
  attention_backward(
      q.view(q_shape), k.view(k_shape), v.view(v_shape), out.view(o_shape), lse_view,
      dout.view(o_shape),
      Gradients{dq.mutable_view(q_shape), dk.mutable_view(k_shape), dv.mutable_view(v_shape)}, mask,
      {}, options);
  return {dq.floats(p.q.size()), dk.floats(p.k.size()), dv.floats(p.v.size())};
}

TEST(TreeAttention, BackwardEqualsTheDenseKeepOfTheSamePairsBitwise) {
  uint64_t seed = 400;
  for (const Case& c : kCases) {
    const RandomProblem p = problem_of(c, ++seed);
    const std::vector<float> dout = test::random_values(p.B * p.Hq * p.Lq * p.Dv, seed + 50);
    const Mask tree =
        Mask().tree(parents_array(random_parents(c.batch, c.size, seed), c.batch, c.size, true));
    const Mask dense = Mask().keep(allowed_pairs(tree, p.shape()));
    for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      for (const Kernel kernel : {Kernel::fused, Kernel::reference}) {
        if (kernel == Kernel::reference && dtype != DType::f32) continue;  // f64 inside anyway
        const std::string what = std::string(dtype_name(dtype)) +
                                 (kernel == Kernel::fused ? " fused" : " reference") +
                                 " T=" + std::to_string(c.size) + " Lq=" + std::to_string(c.q_len);
        const Grads a = run_backward(p, dtype, tree, kernel, dout);
        const Grads b = run_backward(p, dtype, dense, kernel, dout);
        EXPECT_EQ(a.dq, b.dq) << what;
        EXPECT_EQ(a.dk, b.dk) << what;
        EXPECT_EQ(a.dv, b.dv) << what;
      }
    }
  }
}

TEST(TreeAttention, GradientsMatchFiniteDifferences) {
  // A prefix of 4 and a draft of 6 (two roots), 6 and 10 queries, both kernels.
  for (const int64_t q_len : {6, 10}) {
    const RandomProblem p(2, 2, 1, q_len, 10, 3, 2, 43, 1.5f);
    const std::vector<float> dout = test::random_values(p.B * p.Hq * p.Lq * p.Dv, 44);
    const Mask tree = Mask().tree(Array<int64_t>({2, 6}, {-1, 0, 1, 0, -1, 4, -1, -1, 1, 2, 3, 3}));
    for (const Kernel kernel : {Kernel::reference, Kernel::fused}) {
      Options options;
      options.kernel = kernel;
      const GradcheckReport report =
          gradcheck(p.qv(), p.kv(), p.vv(), TensorView(dout.data(), {p.B, p.Hq, p.Lq, p.Dv}), tree,
                    {}, options);
      EXPECT_TRUE(report.passed) << "Lq=" << q_len;
      for (const GradcheckEntry& entry : report.entries) {
        EXPECT_LE(entry.max_relative_error, report.tolerance) << "Lq=" << q_len << entry.tensor;
        EXPECT_GT(entry.max_magnitude, 0.0) << entry.tensor;
      }
    }
  }
}

TEST(TreeAttention, FramedSlicesEqualTheWholeCall) {
  // Query slices cut at 64 with every key: the same bits as the rows of the whole call. Key
  // slices merged by merge_partials: the whole call to f32 rounding.
  const Case c{2, 2, 1, 100, 60, 160, 16};
  const RandomProblem p = problem_of(c, 45);
  const Mask tree = Mask().tree(parents_array(random_parents(2, c.size, 46), 2, c.size, true));
  const test::Result whole = test::run_kernel(p, DType::f32, tree, {}, Kernel::fused);
  const int64_t width = p.Dv;
  for (const int64_t q0 : {0, 64, 128}) {
    const int64_t rows = std::min<int64_t>(64, p.Lq - q0);
    RandomProblem slice(p.B, p.Hq, p.Hkv, rows, p.Lk, p.D, p.Dv, 1);
    slice.k = p.k;
    slice.v = p.v;
    for (int64_t bh = 0; bh < p.B * p.Hq; ++bh) {
      std::copy_n(p.q.begin() + (bh * p.Lq + q0) * p.D, rows * p.D,
                  slice.q.begin() + bh * rows * p.D);
    }
    std::vector<float> out(p.B * p.Hq * rows * width);
    Options options;
    options.frame = Frame{q0, 0, p.Lq, p.Lk};
    attention(slice.qv(), slice.kv(), slice.vv(),
              MutableTensorView(out.data(), {p.B, p.Hq, rows, width}), tree, {}, options);
    for (int64_t bh = 0; bh < p.B * p.Hq; ++bh) {
      for (int64_t n = 0; n < rows * width; ++n) {
        ASSERT_EQ(out[bh * rows * width + n], whole.out[(bh * p.Lq + q0) * width + n])
            << "q_offset " << q0;
      }
    }
  }
  // Two key slices: the prefix and most of the draft, then the draft's last 30 keys.
  const int64_t cut = p.Lk - 30;
  std::vector<std::vector<float>> outs, lses;
  std::vector<PartialResult> parts;
  for (const auto& [k0, count] : {std::pair<int64_t, int64_t>{0, cut}, {cut, p.Lk - cut}}) {
    const TensorView k(p.k.data() + k0 * p.D, {p.B, p.Hkv, count, p.D},
                       {p.Hkv * p.Lk * p.D, p.Lk * p.D, p.D, 1});
    const TensorView v(p.v.data() + k0 * p.Dv, {p.B, p.Hkv, count, p.Dv},
                       {p.Hkv * p.Lk * p.Dv, p.Lk * p.Dv, p.Dv, 1});
    outs.emplace_back(p.B * p.Hq * p.Lq * width);
    lses.emplace_back(p.B * p.Hq * p.Lq);
    Options options;
    options.frame = Frame{0, k0, p.Lq, p.Lk};
    attention(p.qv(), k, v, MutableTensorView(outs.back().data(), {p.B, p.Hq, p.Lq, width}), tree,
              {}, options, MutableTensorView(lses.back().data(), {p.B, p.Hq, p.Lq}));
  }
  for (size_t n = 0; n < outs.size(); ++n) {
    parts.push_back({TensorView(outs[n].data(), {p.B, p.Hq, p.Lq, width}),
                     TensorView(lses[n].data(), {p.B, p.Hq, p.Lq})});
  }
  std::vector<float> merged(whole.out.size());
  merge_partials(parts, MutableTensorView(merged.data(), {p.B, p.Hq, p.Lq, width}));
  EXPECT_LE(test::max_error(merged, whole.out), 2e-6);
}

TEST(TreeAttention, TheKvCacheFrameOfProgramsChangesNothing) {
  // A step that also carries a mask program passes the frame {Lk − Lq, 0, Lk, Lk} (semantics.md
  // §16): the tree then finds its draft queries at the same rows, so the bits are the same.
  for (const int64_t q_len : {40, 25, 60}) {
    const Case c{2, 2, 1, 40, 50, q_len, 16};
    const RandomProblem p = problem_of(c, 47);
    const Mask tree = Mask().tree(parents_array(random_parents(2, c.size, 48), 2, c.size, true));
    const test::Result plain = test::run_kernel(p, DType::f32, tree, {}, Kernel::fused);
    std::vector<float> out(plain.out.size());
    Options options;
    options.frame = Frame{p.Lk - p.Lq, 0, p.Lk, p.Lk};
    attention(p.qv(), p.kv(), p.vv(), MutableTensorView(out.data(), {p.B, p.Hq, p.Lq, p.Dv}), tree,
              {}, options);
    EXPECT_EQ(out, plain.out) << "Lq=" << q_len;
  }
}

}  // namespace
}  // namespace maskattn
