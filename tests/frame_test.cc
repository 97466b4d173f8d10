// Calls on slices of a problem (Options::frame): split-query × split-key calls, merged with
// merge_partials (forward) or accumulated (backward), equal one call over the whole problem, for
// every mask kind of the sweep and the score modifiers; any_allowed and count_allowed agree with
// the pairs.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "maskattn/attention.h"
#include "test_util.h"

namespace maskattn {
namespace {

using test::max_error;
using test::RandomProblem;

// Slice boundaries: [cuts[n], cuts[n + 1]) for each n.
struct Cuts {
  std::vector<int64_t> q, k;
};

// Rows [first, first + count) of a contiguous [B, H, L, E] buffer, as a strided view.
template <typename T>
MutableTensorView rows_of(T* data, const Dims& shape, int64_t first, int64_t count) {
  const int64_t heads = shape[1], length = shape[2], width = shape[3];
  return MutableTensorView(data + first * width, {shape[0], heads, count, width},
                           {heads * length * width, length * width, width, 1});
}
TensorView rows_of(const float* data, const Dims& shape, int64_t first, int64_t count) {
  return rows_of(const_cast<float*>(data), shape, first, count);
}
// Rows [first, first + count) of a contiguous [B, H, L] LSE buffer.
MutableTensorView lse_rows(const std::vector<float>& lse, int64_t batch, int64_t heads,
                           int64_t length, int64_t first, int64_t count) {
  return MutableTensorView(const_cast<float*>(lse.data()) + first, {batch, heads, count},
                           {heads * length, length, 1});
}

struct Whole {
  std::vector<float> out, lse;
};

Whole whole_forward(const RandomProblem& p, const Mask& mask, const ScoreMods& mods,
                    const Options& options) {
  Whole w{std::vector<float>(p.B * p.Hq * p.Lq * p.Dv), std::vector<float>(p.B * p.Hq * p.Lq)};
  attention(p.qv(), p.kv(), p.vv(), MutableTensorView(w.out.data(), {p.B, p.Hq, p.Lq, p.Dv}), mask,
            mods, options, MutableTensorView(w.lse.data(), {p.B, p.Hq, p.Lq}));
  return w;
}

Options framed(Options options, int64_t q0, int64_t k0, const RandomProblem& p, bool sinks) {
  options.frame = Frame{q0, k0, p.Lq, p.Lk};
  options.count_sinks = sinks;
  return options;
}

// Every query slice against every key slice; each query slice's key parts merged in order.
Whole split_forward(const RandomProblem& p, const Mask& mask, const ScoreMods& mods,
                    const Cuts& cuts, const Options& options) {
  Whole w{std::vector<float>(p.B * p.Hq * p.Lq * p.Dv), std::vector<float>(p.B * p.Hq * p.Lq)};
  const Dims q_shape = {p.B, p.Hq, p.Lq, p.D}, out_shape = {p.B, p.Hq, p.Lq, p.Dv};
  const Dims k_shape = {p.B, p.Hkv, p.Lk, p.D}, v_shape = {p.B, p.Hkv, p.Lk, p.Dv};
  for (size_t a = 0; a + 1 < cuts.q.size(); ++a) {
    const int64_t q0 = cuts.q[a], lq = cuts.q[a + 1] - q0;
    const size_t parts = cuts.k.size() - 1;
    std::vector<std::vector<float>> outs(parts), lses(parts);
    std::vector<PartialResult> results;
    for (size_t c = 0; c < parts; ++c) {
      const int64_t k0 = cuts.k[c], lk = cuts.k[c + 1] - k0;
      outs[c].assign(p.B * p.Hq * lq * p.Dv, NAN);
      lses[c].assign(p.B * p.Hq * lq, NAN);
      const MutableTensorView part_out(outs[c].data(), {p.B, p.Hq, lq, p.Dv});
      const MutableTensorView part_lse(lses[c].data(), {p.B, p.Hq, lq});
      attention(rows_of(p.q.data(), q_shape, q0, lq), rows_of(p.k.data(), k_shape, k0, lk),
                rows_of(p.v.data(), v_shape, k0, lk), part_out, mask, mods,
                framed(options, q0, k0, p, c == 0), part_lse);
      results.push_back({part_out, part_lse});
    }
    merge_partials(results, rows_of(w.out.data(), out_shape, q0, lq),
                   lse_rows(w.lse, p.B, p.Hq, p.Lq, q0, lq));
  }
  return w;
}

const std::vector<Cuts> kCuts = {
    {{0, 37, 101, -1}, {0, 50, 114, -1}},  // neither side on a tile boundary
    {{0, 64, -1}, {0, -1}},                // one key part: the tiles of the whole call
    {{0, -1}, {0, 1, 2, 70, -1}},          // single-key slices
};

Cuts resolve(const Cuts& cuts, const RandomProblem& p) {
  Cuts c = cuts;
  c.q.back() = p.Lq;
  c.k.back() = p.Lk;
  return c;
}

std::vector<RandomProblem> problems() {
  std::vector<RandomProblem> list;
  list.emplace_back(2, 4, 2, 150, 150, 32, 24, 71);  // GQA, self-attention
  list.emplace_back(1, 2, 1, 120, 170, 16, 16, 72);  // Lq < Lk (bottom-right aligned decoding)
  return list;
}

TEST(Frame, SplitCallsMergedEqualOneCallForEveryMask) {
  for (const RandomProblem& p : problems()) {
    for (const auto& [name, mask] : test::sweep_masks(p)) {
      for (const Kernel kernel : {Kernel::fused, Kernel::reference}) {
        Options options;
        options.kernel = kernel;
        const Whole whole = whole_forward(p, mask, {}, options);
        for (const Cuts& cut : kCuts) {
          // The f64 reference is slow: one cut (the one off every tile boundary) is enough.
          if (kernel == Kernel::reference && &cut != &kCuts[0]) continue;
          const Cuts c = resolve(cut, p);
          const Whole split = split_forward(p, mask, {}, c, options);
          const std::string label = name + (kernel == Kernel::fused ? " fused" : " reference") +
                                    " Lq=" + std::to_string(p.Lq) + " cuts " +
                                    std::to_string(c.q.size()) + "x" + std::to_string(c.k.size());
          if (c.k.size() == 2 && kernel == Kernel::fused) {
            // One key part over 64-row query slices: the same tiles, so the same bits.
            EXPECT_EQ(max_error(split.out, whole.out), 0.0f) << label;
            EXPECT_EQ(max_error(split.lse, whole.lse), 0.0f) << label;
          } else {
            EXPECT_LE(max_error(split.out, whole.out), 2e-6f) << label;
            EXPECT_LE(max_error(split.lse, whole.lse), 2e-6f) << label;
          }
        }
      }
    }
  }
}

ScoreMods all_mods(const RandomProblem& p) {
  ScoreMods mods;
  mods.softcap = 3.0;
  mods.alibi_slopes = test::random_values(p.Hq, 5, 0.01f, 0.2f);
  mods.bias = Array<float>({p.Lq, p.Lk}, test::random_values(p.Lq * p.Lk, 6));
  mods.sinks = test::random_values(p.Hq, 7);
  return mods;
}

TEST(Frame, ScoreModifiersReadGlobalRows) {
  for (const RandomProblem& p : problems()) {
    const ScoreMods mods = all_mods(p);
    ScoreMods with_fn = mods;
    with_fn.score_fn = [](double s, int64_t, int64_t h, int64_t i, int64_t j) {
      return s + 0.01 * static_cast<double>((i * 3 + j + h) % 5);
    };
    for (const Mask& mask : {Mask().causal(), Mask().sliding_window(40), Mask()}) {
      for (const ScoreMods* m : {&mods, static_cast<const ScoreMods*>(&with_fn)}) {
        const Whole whole = whole_forward(p, mask, *m, {});
        const Whole split = split_forward(p, mask, *m, resolve(kCuts[0], p), {});
        EXPECT_LE(max_error(split.out, whole.out), 2e-6f);
        EXPECT_LE(max_error(split.lse, whole.lse), 2e-6f);
      }
    }
  }
}

TEST(Frame, HalfPrecisionPartsStayF32UntilTheMerge) {
  const RandomProblem f(1, 2, 2, 130, 130, 64, 64, 73);
  for (const DType dtype : {DType::bf16, DType::f16}) {
    const RandomProblem p = test::rounded_to(f, dtype);
    const test::DTypeBuffer q(p.q, dtype), k(p.k, dtype), v(p.v, dtype);
    const Mask mask = Mask().causal();
    test::DTypeBuffer whole(std::vector<float>(p.B * p.Hq * p.Lq * p.Dv), dtype);
    const Dims out_shape = {p.B, p.Hq, p.Lq, p.Dv};
    attention(q.view({p.B, p.Hq, p.Lq, p.D}), k.view({p.B, p.Hkv, p.Lk, p.D}),
              v.view({p.B, p.Hkv, p.Lk, p.Dv}), whole.mutable_view(out_shape), mask);
    // Two key halves in f32, merged once into the dtype.
    std::vector<std::vector<float>> outs(2), lses(2);
    std::vector<PartialResult> parts;
    const int64_t cut = 77;
    for (int c = 0; c < 2; ++c) {
      const int64_t k0 = c == 0 ? 0 : cut, lk = c == 0 ? cut : p.Lk - cut;
      outs[c].resize(p.B * p.Hq * p.Lq * p.Dv);
      lses[c].resize(p.B * p.Hq * p.Lq);
      const size_t k_row = static_cast<size_t>(k0 * p.D);
      const TensorView k_part(reinterpret_cast<const uint16_t*>(k.words.data()) + k_row, dtype,
                              {p.B, p.Hkv, lk, p.D}, {p.Hkv * p.Lk * p.D, p.Lk * p.D, p.D, 1});
      const TensorView v_part(reinterpret_cast<const uint16_t*>(v.words.data()) + k_row, dtype,
                              {p.B, p.Hkv, lk, p.Dv}, {p.Hkv * p.Lk * p.Dv, p.Lk * p.Dv, p.Dv, 1});
      Options options;
      options.frame = {0, k0, p.Lq, p.Lk};
      const MutableTensorView part(outs[c].data(), out_shape);
      const MutableTensorView part_lse(lses[c].data(), {p.B, p.Hq, p.Lq});
      attention(q.view({p.B, p.Hq, p.Lq, p.D}), k_part, v_part, part, mask, {}, options, part_lse);
      parts.push_back({part, part_lse});
    }
    test::DTypeBuffer merged(std::vector<float>(p.B * p.Hq * p.Lq * p.Dv), dtype);
    merge_partials(parts, merged.mutable_view(out_shape));
    const size_t count = static_cast<size_t>(p.B * p.Hq * p.Lq * p.Dv);
    // One rounding of nearly equal f32 values: at most one unit in the last place apart.
    const float ulp = dtype == DType::bf16 ? 1.0f / 128 : 1.0f / 1024;
    EXPECT_LE(max_error(merged.floats(count), whole.floats(count)), ulp) << dtype_name(dtype);
  }
}

// dQ, dK, dV of the whole problem from slice calls that add into f32 accumulators, with the
// whole forward's out and LSE (as a ring's backward has them).
struct Grads {
  std::vector<float> dq, dk, dv, dbias, dsinks;
};

// dbias and dsinks views when the modifiers have a bias and sinks (else null views).
Gradients optional_views(const ScoreMods& mods, Grads& g) {
  Gradients grads;
  if (mods.bias) grads.dbias = MutableTensorView(g.dbias.data(), mods.bias->shape());
  if (!mods.sinks.empty()) {
    grads.dsinks = MutableTensorView(g.dsinks.data(), {static_cast<int64_t>(g.dsinks.size())});
  }
  return grads;
}

Grads whole_backward(const RandomProblem& p, const Mask& mask, const ScoreMods& mods,
                     const Whole& w, const std::vector<float>& dout) {
  Grads g{std::vector<float>(p.q.size()), std::vector<float>(p.k.size()),
          std::vector<float>(p.v.size()), std::vector<float>(p.Lq * p.Lk),
          std::vector<float>(p.Hq)};
  Gradients grads = optional_views(mods, g);
  grads.dq = MutableTensorView(g.dq.data(), {p.B, p.Hq, p.Lq, p.D});
  grads.dk = MutableTensorView(g.dk.data(), {p.B, p.Hkv, p.Lk, p.D});
  grads.dv = MutableTensorView(g.dv.data(), {p.B, p.Hkv, p.Lk, p.Dv});
  attention_backward(p.qv(), p.kv(), p.vv(), TensorView(w.out.data(), {p.B, p.Hq, p.Lq, p.Dv}),
                     TensorView(w.lse.data(), {p.B, p.Hq, p.Lq}),
                     TensorView(dout.data(), {p.B, p.Hq, p.Lq, p.Dv}), grads, mask, mods);
  return g;
}

Grads split_backward(const RandomProblem& p, const Mask& mask, const ScoreMods& mods,
                     const Cuts& cuts, const Whole& w, const std::vector<float>& dout) {
  Grads g{std::vector<float>(p.q.size(), 0.0f), std::vector<float>(p.k.size(), 0.0f),
          std::vector<float>(p.v.size(), 0.0f), std::vector<float>(p.Lq * p.Lk, 0.0f),
          std::vector<float>(p.Hq, 0.0f)};
  const Dims q_shape = {p.B, p.Hq, p.Lq, p.D}, out_shape = {p.B, p.Hq, p.Lq, p.Dv};
  const Dims k_shape = {p.B, p.Hkv, p.Lk, p.D}, v_shape = {p.B, p.Hkv, p.Lk, p.Dv};
  for (size_t a = 0; a + 1 < cuts.q.size(); ++a) {
    const int64_t q0 = cuts.q[a], lq = cuts.q[a + 1] - q0;
    for (size_t c = 0; c + 1 < cuts.k.size(); ++c) {
      const int64_t k0 = cuts.k[c], lk = cuts.k[c + 1] - k0;
      Gradients grads = optional_views(mods, g);
      grads.dq = rows_of(g.dq.data(), q_shape, q0, lq);
      grads.dk = rows_of(g.dk.data(), k_shape, k0, lk);
      grads.dv = rows_of(g.dv.data(), v_shape, k0, lk);
      grads.accumulate = true;
      attention_backward(
          rows_of(p.q.data(), q_shape, q0, lq), rows_of(p.k.data(), k_shape, k0, lk),
          rows_of(p.v.data(), v_shape, k0, lk), rows_of(w.out.data(), out_shape, q0, lq),
          lse_rows(w.lse, p.B, p.Hq, p.Lq, q0, lq), rows_of(dout.data(), out_shape, q0, lq), grads,
          mask, mods, framed({}, q0, k0, p, c == 0));
    }
  }
  return g;
}

TEST(Frame, SplitBackwardAccumulatesToTheWholeGradients) {
  for (const RandomProblem& p : problems()) {
    const std::vector<float> dout = test::random_values(p.B * p.Hq * p.Lq * p.Dv, 9);
    std::vector<std::pair<std::string, ScoreMods>> variants = {{"", {}}};
    variants.emplace_back(" + softcap, alibi, bias, sinks", all_mods(p));
    for (const auto& [name, mask] : test::sweep_masks(p)) {
      for (const auto& [mods_name, mods] : variants) {
        const Whole w = whole_forward(p, mask, mods, {});
        const Grads whole = whole_backward(p, mask, mods, w, dout);
        const Grads split = split_backward(p, mask, mods, resolve(kCuts[0], p), w, dout);
        const std::string label = name + mods_name + " Lq=" + std::to_string(p.Lq);
        EXPECT_LE(max_error(split.dq, whole.dq), 2e-5f) << label;
        EXPECT_LE(max_error(split.dk, whole.dk), 2e-5f) << label;
        EXPECT_LE(max_error(split.dv, whole.dv), 2e-5f) << label;
        if (mods.bias) {
          EXPECT_LE(max_error(split.dbias, whole.dbias), 2e-5f) << label;
        }
        if (!mods.sinks.empty()) {
          EXPECT_LE(max_error(split.dsinks, whole.dsinks), 2e-5f) << label;
        }
      }
    }
  }
}

TEST(Frame, AccumulateAddsToWhatTheGradientsHold) {
  const RandomProblem p(1, 2, 1, 40, 40, 8, 8, 74);
  const std::vector<float> dout = test::random_values(p.B * p.Hq * p.Lq * p.Dv, 10);
  const Mask mask = Mask().causal();
  const Whole w = whole_forward(p, mask, {}, {});
  const Grads once = whole_backward(p, mask, {}, w, dout);
  // Starting from 1.5 everywhere, accumulate adds the same gradients (bitwise: f32 + f32).
  Grads g{std::vector<float>(p.q.size(), 1.5f),
          std::vector<float>(p.k.size(), 1.5f),
          std::vector<float>(p.v.size(), 1.5f),
          {},
          {}};
  Gradients grads;
  grads.dq = MutableTensorView(g.dq.data(), {p.B, p.Hq, p.Lq, p.D});
  grads.dk = MutableTensorView(g.dk.data(), {p.B, p.Hkv, p.Lk, p.D});
  grads.dv = MutableTensorView(g.dv.data(), {p.B, p.Hkv, p.Lk, p.Dv});
  grads.accumulate = true;
  attention_backward(p.qv(), p.kv(), p.vv(), TensorView(w.out.data(), {p.B, p.Hq, p.Lq, p.Dv}),
                     TensorView(w.lse.data(), {p.B, p.Hq, p.Lq}),
                     TensorView(dout.data(), {p.B, p.Hq, p.Lq, p.Dv}), grads, mask);
  for (size_t n = 0; n < g.dq.size(); ++n) ASSERT_EQ(g.dq[n], 1.5f + once.dq[n]) << n;
  for (size_t n = 0; n < g.dk.size(); ++n) ASSERT_EQ(g.dk[n], 1.5f + once.dk[n]) << n;
  for (size_t n = 0; n < g.dv.size(); ++n) ASSERT_EQ(g.dv[n], 1.5f + once.dv[n]) << n;
}

TEST(Frame, AnyAllowedAndCountAllowedAreExactForEverySlice) {
  for (const RandomProblem& p : problems()) {
    for (const auto& [name, mask] : test::sweep_masks(p)) {
      const Array<uint8_t> pairs = allowed_pairs(mask, p.shape());
      for (const auto& [q0, q1, k0, k1] : std::vector<std::array<int64_t, 4>>{{0, p.Lq, 0, p.Lk},
                                                                              {0, 30, 100, p.Lk},
                                                                              {100, p.Lq, 0, 20},
                                                                              {64, 118, 64, 128},
                                                                              {5, 6, 7, 8}}) {
        int64_t expected = 0;
        for (int64_t b = 0; b < p.B; ++b) {
          for (int64_t h = 0; h < p.Hq; ++h) {
            for (int64_t i = q0; i < q1; ++i) {
              for (int64_t j = k0; j < k1; ++j)
                expected += pairs.data()[((b * p.Hq + h) * p.Lq + i) * p.Lk + j] != 0;
            }
          }
        }
        const MaskShape slice{p.B, p.Hq, q1 - q0, k1 - k0};
        const Frame frame{q0, k0, p.Lq, p.Lk};
        EXPECT_EQ(any_allowed(mask, slice, frame), expected > 0)
            << name << " rows [" << q0 << "," << q1 << ") x [" << k0 << "," << k1 << ")";
        EXPECT_EQ(count_allowed(mask, slice, frame), expected)
            << name << " rows [" << q0 << "," << q1 << ") x [" << k0 << "," << k1 << ")";
      }
    }
  }
}

TEST(Frame, AFrameOutsideItsTotalsIsAnError) {
  const RandomProblem p(1, 1, 1, 8, 8, 4, 4, 75);
  std::vector<float> out(p.B * p.Hq * p.Lq * p.Dv);
  const MutableTensorView o(out.data(), {p.B, p.Hq, p.Lq, p.Dv});
  Options options;
  options.frame = {4, 0, 10, 8};
  EXPECT_THROW(attention(p.qv(), p.kv(), p.vv(), o, {}, {}, options), Error);
  options.frame = {0, 3, -1, -1};
  EXPECT_THROW(attention(p.qv(), p.kv(), p.vv(), o, {}, {}, options), Error);
  options.frame = {2, 0, 10, 8};  // rows [2, 10) of 10: fine
  EXPECT_NO_THROW(attention(p.qv(), p.kv(), p.vv(), o, {}, {}, options));
}

}  // namespace
}  // namespace maskattn
