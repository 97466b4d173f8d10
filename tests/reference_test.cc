// The f64 reference kernel: the worked example, the fully-hidden-row rule in every dtype, LSE,
// GQA, strided layouts, thread-count determinism, and the docs/design.md §5 properties. An
// independent naive implementation (materialised mask, plain loops) cross-checks random problems.
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>

#include "test_util.h"

namespace maskattn {
namespace {

using Tensors = test::RandomProblem;

std::vector<float> run(const Tensors& t, const Mask& mask = {}, const ScoreMods& mods = {},
                       Options options = {}, std::vector<float>* lse = nullptr) {
  std::vector<float> out(t.B * t.Hq * t.Lq * t.Dv);
  if (lse) lse->assign(t.B * t.Hq * t.Lq, 0.0f);
  attention(t.qv(), t.kv(), t.vv(), MutableTensorView(out.data(), {t.B, t.Hq, t.Lq, t.Dv}), mask,
            mods, options,
            lse ? MutableTensorView(lse->data(), {t.B, t.Hq, t.Lq}) : MutableTensorView());
  return out;
}

// Independent oracle, written straight from docs/design.md without maskattn's mask code: `allowed`
// and `adjust` (what the modifiers add to the scaled score) are per-case lambdas below.
using PairFn = std::function<bool(int64_t b, int64_t h, int64_t i, int64_t j)>;
using AdjustFn = std::function<double(int64_t b, int64_t h, int64_t i, int64_t j, double s)>;

std::vector<double> naive(const Tensors& t, const PairFn& allowed, const AdjustFn& adjust = {},
                          double sink = -INFINITY) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(t.D));
  std::vector<double> out(t.B * t.Hq * t.Lq * t.Dv, 0.0);
  for (int64_t b = 0; b < t.B; ++b) {
    for (int64_t h = 0; h < t.Hq; ++h) {
      const int64_t g = h / (t.Hq / t.Hkv);
      for (int64_t i = 0; i < t.Lq; ++i) {
        std::vector<double> s(t.Lk, -INFINITY);
        double max = sink;
        for (int64_t j = 0; j < t.Lk; ++j) {
          if (!allowed(b, h, i, j)) continue;
          double dot = 0;
          for (int64_t d = 0; d < t.D; ++d) {
            dot += double{t.q[((b * t.Hq + h) * t.Lq + i) * t.D + d]} *
                   t.k[((b * t.Hkv + g) * t.Lk + j) * t.D + d];
          }
          s[j] = adjust ? adjust(b, h, i, j, scale * dot) : scale * dot;
          max = std::max(max, s[j]);
        }
        if (max == -INFINITY) continue;
        double total = std::exp(sink - max);
        for (double& x : s) total += (x = std::exp(x - max));
        for (int64_t j = 0; j < t.Lk; ++j) {
          for (int64_t d = 0; d < t.Dv; ++d) {
            out[((b * t.Hq + h) * t.Lq + i) * t.Dv + d] +=
                s[j] / total * t.v[((b * t.Hkv + g) * t.Lk + j) * t.Dv + d];
          }
        }
      }
    }
  }
  return out;
}

int64_t floor_div(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

TEST(WorkedExample, PublishedWeightsAndOutput) {
  const std::vector<float> x = {1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 0, 0};
  const TensorView q(x.data(), {1, 1, 3, 4});
  std::vector<float> weights(9), out(12);
  attention_weights(q, q, MutableTensorView(weights.data(), {1, 1, 3, 3}), Mask().causal());
  attention(q, q, q, MutableTensorView(out.data(), {1, 1, 3, 4}), Mask().causal());
  const std::vector<double> published_weights = {1, 0, 0, 0.269, 0.731, 0, 0.274, 0.274, 0.452};
  const std::vector<double> published_output = {1,     0,     1,     0,     0.269, 0.731,
                                                0.269, 0.731, 0.726, 0.726, 0.274, 0.274};
  for (int n = 0; n < 9; ++n) EXPECT_NEAR(weights[n], published_weights[n], 5e-4) << n;
  for (int n = 0; n < 12; ++n) EXPECT_NEAR(out[n], published_output[n], 5e-4) << n;
  // Exactly: row 1 is softmax([0, 1]); row 2 is softmax([0.5, 0.5, 1]).
  const double e = std::exp(1.0), h = std::exp(0.5);
  EXPECT_FLOAT_EQ(weights[3], 1 / (1 + e));
  EXPECT_FLOAT_EQ(weights[4], e / (1 + e));
  EXPECT_FLOAT_EQ(weights[6], h / (2 * h + e));
  EXPECT_FLOAT_EQ(weights[8], e / (2 * h + e));
  EXPECT_EQ(weights[1], 0.0f);
  EXPECT_EQ(weights[2], 0.0f);
  EXPECT_EQ(weights[5], 0.0f);
}

TEST(Reference, MatchesIndependentOracleForEveryComponent) {
  for (const auto& [lq, lk] : {std::pair<int64_t, int64_t>{9, 9}, {5, 9}, {9, 7}}) {
    const Tensors t(2, 4, 2, lq, lk, 8, 5, lq * 31 + lk);
    const int64_t shift = lk - lq;  // bottom-right: qpos = i + shift
    // Per-batch id arrays and a dense pattern shared by several cases.
    std::vector<int64_t> seg_q, seg_k, span_q, span_k;
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t i = 0; i < lq; ++i) seg_q.push_back((i + shift + b) / 3);
      for (int64_t i = 0; i < lq; ++i) span_q.push_back(i + shift >= 2 && i + shift < 5);
      for (int64_t j = 0; j < lk; ++j) seg_k.push_back((j + b) / 3);
      for (int64_t j = 0; j < lk; ++j) span_k.push_back(j >= 2 && j < 5);
    }
    const auto pattern = [](int64_t a, int64_t b) { return (a * 5 + b * 3) % 7 < 4; };
    std::vector<uint8_t> keep(2 * lq * lk), blocked(lq * lk);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t i = 0; i < lq; ++i)
        for (int64_t j = 0; j < lk; ++j) keep[(b * lq + i) * lk + j] = pattern(b * 11 + i, j);
    for (int64_t n = 0; n < lq * lk; ++n) blocked[n] = pattern(n, 1);
    std::vector<int64_t> global_q, global_k;  // batch b: positions p with (p + b) % 4 == 1
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t i = 0; i < lq; ++i) global_q.push_back((i + shift + b) % 4 == 1 ? 3 : 0);
      for (int64_t j = 0; j < lk; ++j) global_k.push_back((j + b) % 4 == 1);
    }
    std::vector<uint8_t> layout;  // [Hq=4, ⌈Lq/2⌉, ⌈Lk/3⌉]
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t r = 0; r < (lq + 1) / 2; ++r)
        for (int64_t c = 0; c < (lk + 2) / 3; ++c) layout.push_back((h * 7 + r * 3 + c) % 3 != 0);
    std::vector<uint8_t> column;  // every other block of 4 queries, any key
    for (int64_t r = 0; r < (lq + 3) / 4; ++r) column.push_back(r % 2 == 0);
    std::vector<float> additive(4 * lk);
    for (int64_t n = 0; n < 4 * lk; ++n) additive[n] = n % 5 == 0 ? -INFINITY : 0.25f * (n % 3);

    struct Case {
      const char* name;
      Mask mask;
      PairFn allowed;
      ScoreMods mods = {};
      AdjustFn adjust = {};
    };
    const std::vector<Case> cases = {
        {"none", Mask(), [](int64_t, int64_t, int64_t, int64_t) { return true; }},
        {"causal", Mask().causal(),
         [&](int64_t, int64_t, int64_t i, int64_t j) { return j <= i + shift; }},
        {"causal top-left", Mask().causal(Alignment::top_left),
         [&](int64_t, int64_t, int64_t i, int64_t j) { return j <= i; }},
        {"window(3,1)", Mask().window(3, 1),
         [&](int64_t, int64_t, int64_t i, int64_t j) {
           return i + shift - j <= 3 && j - (i + shift) <= 1;
         }},
        {"sliding_window(4) & chunk(5)", Mask().sliding_window(4).chunk(5),
         [&](int64_t, int64_t, int64_t i, int64_t j) {
           const int64_t d = i + shift - j;
           return d >= 0 && d <= 3 && floor_div(i + shift, 5) == floor_div(j, 5);
         }},
        {"ragged padding", Mask().causal().key_lengths({7, 3}).query_lengths({5, 2}),
         [&](int64_t b, int64_t, int64_t i, int64_t j) {
           const int64_t klen = b == 0 ? 7 : 3, qlen = b == 0 ? 5 : 2;
           return i < qlen && j < klen && j <= i + klen - qlen;
         }},
        {"left padding", Mask().causal().key_starts({2, 0}).chunk(3),
         [&](int64_t b, int64_t, int64_t i, int64_t j) {
           const int64_t start = b == 0 ? 2 : 0;
           const int64_t qpos = i + shift - start, kpos = j - start;
           return j >= start && kpos <= qpos && floor_div(qpos, 3) == floor_div(kpos, 3);
         }},
        {"prefix", Mask().causal().prefix_lm(4),
         [&](int64_t, int64_t, int64_t i, int64_t j) {
           const int64_t qpos = i + shift;
           return j <= qpos || (qpos >= 0 && qpos < 4 && j < 4);
         }},
        {"per head", Mask().causal(HeadSet{0}).window(2, 0, HeadSet{1, 3}),
         [&](int64_t, int64_t h, int64_t i, int64_t j) {
           const int64_t d = i + shift - j;
           if (h == 0) return d >= 0;
           if (h == 1 || h == 3) return d >= 0 && d <= 2;
           return true;
         }},
        {"predicate", Mask().predicate([](int64_t, int64_t h, int64_t i, int64_t j) {
           return (i * 3 + j + h) % 4 != 0;
         }),
         [&](int64_t, int64_t h, int64_t i, int64_t j) { return (i * 3 + j + h) % 4 != 0; }},
        {"segments & causal",
         Mask().causal().segments(Array<int64_t>({2, lq}, seg_q), Array<int64_t>({2, lk}, seg_k)),
         [&](int64_t b, int64_t, int64_t i, int64_t j) {
           return j <= i + shift && (i + shift + b) / 3 == (j + b) / 3;
         }},
        {"spans & causal",
         Mask().causal().spans(Array<int64_t>({2, lq}, span_q), Array<int64_t>({2, lk}, span_k)),
         [&](int64_t, int64_t, int64_t i, int64_t j) {
           const bool same_span = i + shift >= 2 && i + shift < 5 && j >= 2 && j < 5;
           return j <= i + shift || same_span;
         }},
        {"global tokens & causal",
         Mask().causal().global_tokens(Array<int64_t>({2, lq}, global_q),
                                       Array<int64_t>({2, lk}, global_k)),
         [&](int64_t b, int64_t, int64_t i, int64_t j) {
           // Longformer: a global query sees every key, a global key is seen by every query.
           const bool global = (i + shift + b) % 4 == 1 || (j + b) % 4 == 1;
           return j <= i + shift || global;
         }},
        {"global tokens [L] & window(1,0) & chunk(6), heads 1-2",
         Mask().window(1, 0).chunk(6).global_tokens(
             Array<int64_t>({lq}, {global_q.begin(), global_q.begin() + lq}),
             Array<int64_t>({lk}, {global_k.begin(), global_k.begin() + lk}), HeadSet::range(1, 3)),
         [&](int64_t, int64_t h, int64_t i, int64_t j) {
           const int64_t d = i + shift - j;
           const bool global = (h == 1 || h == 2) && ((i + shift) % 4 == 1 || j % 4 == 1);
           return ((d >= 0 && d <= 1) || global) && floor_div(i + shift, 6) == floor_div(j, 6);
         }},
        {"block-sparse [Hq,nQ,nK] 2x3 & key padding",
         Mask()
             .block_sparse(Array<uint8_t>({4, (lq + 1) / 2, (lk + 2) / 3}, layout), 2, 3)
             .key_lengths({lk, lk - 2}),
         [&](int64_t b, int64_t h, int64_t i, int64_t j) {
           return (h * 7 + (i / 2) * 3 + j / 3) % 3 != 0 && j < (b == 0 ? lk : lk - 2);
         }},
        {"block-sparse [nQ,1] & global & causal",
         Mask()
             .causal()
             .global_tokens(Array<int64_t>({2, lq}, global_q), Array<int64_t>({2, lk}, global_k))
             .block_sparse(Array<uint8_t>({(lq + 3) / 4, 1}, column), 4, 5),
         [&](int64_t b, int64_t, int64_t i, int64_t j) {
           const bool global = (i + shift + b) % 4 == 1 || (j + b) % 4 == 1;
           return (j <= i + shift || global) && (i / 4) % 2 == 0;
         }},
        {"keep [B,1,Lq,Lk] & blocked [Lq,Lk]",
         Mask()
             .keep(Array<uint8_t>({2, 1, lq, lk}, keep))
             .blocked(Array<uint8_t>({lq, lk}, blocked)),
         [&](int64_t b, int64_t, int64_t i, int64_t j) {
           return pattern(b * 11 + i, j) && !pattern(i * lk + j, 1);
         }},
        {"additive [1,Hq,1,Lk]", Mask().additive(Array<float>({1, 4, 1, lk}, additive)),
         [&](int64_t, int64_t h, int64_t, int64_t j) { return (h * lk + j) % 5 != 0; }, ScoreMods{},
         [&](int64_t, int64_t h, int64_t, int64_t j, double s) {
           return s + double{additive[h * lk + j]};
         }},
    };
    for (const Case& c : cases) {
      const std::vector<float> ours = run(t, c.mask, c.mods);
      const std::vector<double> expected = naive(t, c.allowed, c.adjust);
      for (size_t n = 0; n < ours.size(); ++n) {
        ASSERT_NEAR(ours[n], expected[n], 1e-6) << c.name << " Lq=" << lq << " Lk=" << lk;
      }
    }
  }
}

TEST(Reference, MatchesIndependentOracleWithModifiers) {
  const Tensors t(1, 2, 1, 6, 8, 4, 3, 99);
  ScoreMods mods;
  mods.softcap = 0.7;
  mods.alibi_slopes = {0.25f, 0.5f};
  mods.bias = Array<float>({6, 8}, test::random_values(48, 5));
  mods.sinks = {0.3f, 0.3f};
  const std::vector<float> ours = run(t, Mask().causal(), mods);
  const std::vector<double> expected = naive(
      t, [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i + 2; },
      [&](int64_t, int64_t h, int64_t i, int64_t j, double s) {
        const double capped = 0.7 * std::tanh(s / 0.7);
        const double alibi = -double{mods.alibi_slopes[h]} * std::fabs(double(i + 2 - j));
        return capped + alibi + double{mods.bias->values()[i * 8 + j]};
      },
      0.3);
  for (size_t n = 0; n < ours.size(); ++n) ASSERT_NEAR(ours[n], expected[n], 1e-6) << n;
}

TEST(FullyHiddenRows, AreZeroWithMinusInfLseInEveryDtype) {
  // Row 0 hidden by -inf additive values, row 1 by query padding; row 2 sees key 0 only.
  const float inf = INFINITY;
  const Mask mask = Mask()
                        .additive(Array<float>({3, 3}, {-inf, -inf, -inf, 0, 0, 0, 0, -inf, -inf}))
                        .query_keep(Array<int64_t>({1, 3}, {1, 0, 1}));
  const std::vector<float> x = test::random_values(12, 3);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    std::vector<uint16_t> half_in(12), half_out(12, 0xFFFF);
    std::vector<float> full_out(12, NAN), lse(3);
    const void* in = x.data();
    void* out = full_out.data();
    if (dtype != DType::f32) {
      for (int n = 0; n < 12; ++n) {
        half_in[n] =
            dtype == DType::f16 ? float16_from_float(x[n]).bits : bfloat16_from_float(x[n]).bits;
      }
      in = half_in.data();
      out = half_out.data();
    }
    const TensorView t(in, dtype, {1, 1, 3, 4});
    attention(t, t, t, MutableTensorView(out, dtype, {1, 1, 3, 4}), mask, {}, {},
              MutableTensorView(lse.data(), {1, 1, 3}));
    for (int n = 0; n < 8; ++n) {
      if (dtype == DType::f32)
        EXPECT_EQ(full_out[n], 0.0f) << n;
      else
        EXPECT_EQ(half_out[n], 0) << dtype_name(dtype) << " " << n;  // +0, not NaN
    }
    EXPECT_EQ(lse[0], -inf);
    EXPECT_EQ(lse[1], -inf);
    EXPECT_TRUE(std::isfinite(lse[2]));
  }
}

TEST(FullyHiddenRows, FromStructuredMasks) {
  // Bottom-right causal with Lq > Lk: the first Lq − Lk rows have no key.
  const Tensors t(1, 2, 1, 5, 2, 4, 3, 11);
  std::vector<float> lse;
  const std::vector<float> out = run(t, Mask().causal(), {}, {}, &lse);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_EQ(lse[h * 5 + i], -INFINITY);
      for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(out[(h * 5 + i) * 3 + d], 0.0f);
    }
    EXPECT_TRUE(std::isfinite(lse[h * 5 + 3]));
  }
  std::vector<float> weights(2 * 5 * 2, NAN);
  attention_weights(t.qv(), t.kv(), MutableTensorView(weights.data(), {1, 2, 5, 2}),
                    Mask().causal());
  for (int n = 0; n < 6; ++n) EXPECT_EQ(weights[n], 0.0f);
}

TEST(FullyHiddenRows, WithNoKeysAtAll) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    std::vector<uint32_t> q(2 * 3, 0x3F803F80u), out(2 * 3, 0xFFFFFFFFu);
    float lse[2] = {0, 0};
    const TensorView qv(q.data(), dtype, {1, 1, 2, 3});
    const TensorView empty(q.data(), dtype, {1, 1, 0, 3});
    attention(qv, empty, empty, MutableTensorView(out.data(), dtype, {1, 1, 2, 3}), Mask(), {}, {},
              MutableTensorView(lse, {1, 1, 2}));
    const size_t bytes = 2 * 3 * dtype_size(dtype);
    const std::vector<uint8_t> zeros(bytes, 0);
    EXPECT_EQ(std::memcmp(out.data(), zeros.data(), bytes), 0) << dtype_name(dtype);
    EXPECT_EQ(lse[0], -INFINITY);
  }
}

TEST(FullyHiddenRows, NanInHiddenValuesDoesNotLeak) {
  Tensors t(1, 1, 1, 3, 4, 2, 2, 5);
  t.v[3 * 2] = NAN;  // key 3 is padding
  t.k[3 * 2] = INFINITY;
  const std::vector<float> out = run(t, Mask().key_lengths({3}));
  for (float value : out) EXPECT_TRUE(std::isfinite(value));
}

TEST(Lse, IsTheLogOfTheDenominator) {
  const Tensors t(1, 1, 1, 2, 3, 2, 1, 8);
  std::vector<float> lse;
  run(t, Mask().causal(), {}, {}, &lse);
  std::vector<float> scores(6);
  attention_scores(t.qv(), t.kv(), MutableTensorView(scores.data(), {1, 1, 2, 3}),
                   ScoreStage::scaled);
  // Row 0 (position 1) sees keys 0, 1.
  EXPECT_FLOAT_EQ(lse[0], std::log(std::exp(double{scores[0]}) + std::exp(double{scores[1]})));
  EXPECT_FLOAT_EQ(lse[1], std::log(std::exp(double{scores[3]}) + std::exp(double{scores[4]}) +
                                   std::exp(double{scores[5]})));
}

TEST(Gqa, EqualsRepeatedKvHeadsBitwise) {
  const Tensors grouped(2, 6, 2, 5, 7, 4, 3, 21);
  Tensors repeated(2, 6, 6, 5, 7, 4, 3, 21);
  repeated.q = grouped.q;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t h = 0; h < 6; ++h) {
      const int64_t g = h / 3;
      std::copy_n(grouped.k.begin() + (b * 2 + g) * 7 * 4, 7 * 4,
                  repeated.k.begin() + (b * 6 + h) * 7 * 4);
      std::copy_n(grouped.v.begin() + (b * 2 + g) * 7 * 3, 7 * 3,
                  repeated.v.begin() + (b * 6 + h) * 7 * 3);
    }
  }
  EXPECT_EQ(run(grouped, Mask().causal()), run(repeated, Mask().causal()));
}

TEST(Layouts, BlhdStridedViewsEqualContiguousBitwise) {
  const Tensors t(2, 3, 3, 4, 5, 6, 2, 33);
  const std::vector<float> expected = run(t, Mask().causal());
  // Re-lay every tensor as [B, L, H, D] and view it through strides; write O the same way.
  const auto to_blhd = [](const std::vector<float>& x, int64_t B, int64_t H, int64_t L, int64_t D) {
    std::vector<float> y(x.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t l = 0; l < L; ++l)
          for (int64_t d = 0; d < D; ++d)
            y[((b * L + l) * H + h) * D + d] = x[((b * H + h) * L + l) * D + d];
    return y;
  };
  const auto q = to_blhd(t.q, 2, 3, 4, 6), k = to_blhd(t.k, 2, 3, 5, 6),
             v = to_blhd(t.v, 2, 3, 5, 2);
  std::vector<float> out(expected.size());
  attention(TensorView::from_blhd(q.data(), 2, 4, 3, 6),
            TensorView::from_blhd(k.data(), 2, 5, 3, 6),
            TensorView::from_blhd(v.data(), 2, 5, 3, 2),
            MutableTensorView::from_blhd(out.data(), 2, 4, 3, 2), Mask().causal());
  EXPECT_EQ(to_blhd(expected, 2, 3, 4, 2), out);
}

TEST(Layouts, PaddedRowsAndNegativeStrides) {
  const Tensors t(1, 1, 1, 3, 4, 2, 2, 41);
  const std::vector<float> expected = run(t);
  // K with a row stride of 5 (3 floats of padding per row) and V stored in reverse key order.
  std::vector<float> k_padded(4 * 5, NAN), v_reversed(t.v.size());
  for (int j = 0; j < 4; ++j) {
    k_padded[j * 5] = t.k[j * 2];
    k_padded[j * 5 + 1] = t.k[j * 2 + 1];
    v_reversed[(3 - j) * 2] = t.v[j * 2];
    v_reversed[(3 - j) * 2 + 1] = t.v[j * 2 + 1];
  }
  std::vector<float> out(expected.size());
  attention(t.qv(), TensorView(k_padded.data(), {1, 1, 4, 2}, {20, 20, 5, 1}),
            TensorView(v_reversed.data() + 6, {1, 1, 4, 2}, {8, 8, -2, 1}),
            MutableTensorView(out.data(), {1, 1, 3, 2}));
  EXPECT_EQ(out, expected);
}

TEST(Dtypes, HalfPrecisionOutputsAreTheOnceRoundedF64Result) {
  const Tensors t(1, 2, 1, 6, 6, 8, 8, 55);
  for (DType dtype : {DType::f16, DType::bf16}) {
    const auto narrow = [&](float x) {
      return dtype == DType::f16 ? float16_from_float(x).bits : bfloat16_from_float(x).bits;
    };
    const auto widen = [&](uint16_t bits) {
      return dtype == DType::f16 ? to_float(float16{bits}) : to_float(bfloat16{bits});
    };
    std::vector<uint16_t> q(t.q.size()), k(t.k.size()), v(t.v.size()), out(t.q.size());
    Tensors rounded = t;  // the same inputs, rounded, held in f32 for the oracle
    for (size_t n = 0; n < q.size(); ++n) rounded.q[n] = widen(q[n] = narrow(t.q[n]));
    for (size_t n = 0; n < k.size(); ++n) rounded.k[n] = widen(k[n] = narrow(t.k[n]));
    for (size_t n = 0; n < v.size(); ++n) rounded.v[n] = widen(v[n] = narrow(t.v[n]));
    attention(TensorView(q.data(), dtype, {1, 2, 6, 8}), TensorView(k.data(), dtype, {1, 1, 6, 8}),
              TensorView(v.data(), dtype, {1, 1, 6, 8}),
              MutableTensorView(out.data(), dtype, {1, 2, 6, 8}), Mask().causal());
    const std::vector<double> expected =
        naive(rounded, [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i; });
    for (size_t n = 0; n < out.size(); ++n) {
      const uint16_t once = dtype == DType::f16 ? float16_from_double(expected[n]).bits
                                                : bfloat16_from_double(expected[n]).bits;
      // Same value up to the oracle's own f64 summation order: at most one unit in the last place.
      EXPECT_LE(std::abs(int{out[n]} - int{once}), 1) << dtype_name(dtype) << " " << n;
    }
  }
}

TEST(Threads, OneAndTwoThreadsAreBitwiseEqual) {
  const Tensors t(2, 4, 2, 33, 29, 16, 8, 77);
  Options one, two;
  one.threads = 1;
  two.threads = 2;
  const Mask mask = Mask().causal().key_lengths({29, 17});
  std::vector<float> lse1, lse2;
  EXPECT_EQ(run(t, mask, {}, one, &lse1), run(t, mask, {}, two, &lse2));
  EXPECT_EQ(lse1, lse2);
}

TEST(Properties, CausalOutputsIgnoreFutureKeysAndValues) {
  const Tensors t(1, 2, 2, 8, 8, 4, 4, 91);
  const std::vector<float> before = run(t, Mask().causal());
  Tensors changed = t;
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t d = 0; d < 4; ++d) {
      changed.k[(h * 8 + 6) * 4 + d] += 3.0f;  // key 6 changes
      changed.v[(h * 8 + 6) * 4 + d] -= 5.0f;
    }
  }
  const std::vector<float> after = run(changed, Mask().causal());
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 8; ++i) {
      for (int64_t d = 0; d < 4; ++d) {
        const size_t n = (h * 8 + i) * 4 + d;
        if (i < 6)
          EXPECT_EQ(before[n], after[n]) << "row " << i;
        else
          EXPECT_NE(before[n], after[n]) << "row " << i;
      }
    }
  }
}

TEST(Properties, PaddingFurtherNeverChangesRealTokens) {
  // The same sequence padded further, with garbage in the pad slots, for both kernels. The fused
  // kernel runs its row path up to 8 queries and its tile path above, so each comparison stays on
  // one side of that threshold (crossing it may change the last bits).
  for (const Kernel kernel : {Kernel::reference, Kernel::fused}) {
    for (const auto& [real, paddings] :
         {std::pair<int64_t, std::vector<int64_t>>{5, {7, 8}}, {13, {20, 64, 70, 130}}}) {
      const Tensors base(1, 2, 1, real, real, 4, 3, 17);
      Options options;
      options.kernel = kernel;
      const std::vector<float> expected = run(base, Mask().causal(), {}, options);
      for (int64_t length : paddings) {
        Tensors padded(1, 2, 1, length, length, 4, 3, 1000 + length);
        for (int64_t h = 0; h < 2; ++h) {
          std::copy_n(base.q.begin() + h * real * 4, real * 4, padded.q.begin() + h * length * 4);
        }
        std::copy_n(base.k.begin(), real * 4, padded.k.begin());
        std::copy_n(base.v.begin(), real * 3, padded.v.begin());
        const std::vector<float> out =
            run(padded, Mask().causal().key_lengths({real}), {}, options);
        for (int64_t h = 0; h < 2; ++h) {
          for (int64_t n = 0; n < real * 3; ++n) {
            ASSERT_EQ(out[h * length * 3 + n], expected[h * real * 3 + n])
                << "kernel " << static_cast<int>(kernel) << " padded to " << length;
          }
        }
      }
    }
  }
}

TEST(Properties, IncrementalDecodingEqualsTheFullForward) {
  const Tensors t(1, 2, 1, 7, 7, 4, 4, 63);
  const std::vector<float> full = run(t, Mask().causal());
  for (int64_t step = 0; step < 7; ++step) {
    // Query `step` alone against the keys cached so far (bottom-right causal needs no offset).
    Tensors one(1, 2, 1, 1, step + 1, 4, 4, 0);
    for (int64_t h = 0; h < 2; ++h) {
      std::copy_n(t.q.begin() + (h * 7 + step) * 4, 4, one.q.begin() + h * 4);
    }
    std::copy_n(t.k.begin(), (step + 1) * 4, one.k.begin());
    std::copy_n(t.v.begin(), (step + 1) * 4, one.v.begin());
    const std::vector<float> out = run(one, Mask().causal());
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t d = 0; d < 4; ++d) {
        EXPECT_EQ(out[h * 4 + d], full[(h * 7 + step) * 4 + d]) << "step " << step;
      }
    }
  }
}

TEST(NonFinite, NanPropagatesToItsRowOnly) {
  Tensors t(1, 1, 1, 3, 3, 2, 2, 13);
  t.q[2] = NAN;  // query row 1
  const std::vector<float> out = run(t);
  EXPECT_TRUE(std::isfinite(out[0]));
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_TRUE(std::isfinite(out[4]));
}

TEST(NonFinite, HiddenPairsKeepWeightZeroInANanRow) {
  Tensors t(1, 1, 1, 2, 2, 2, 2, 13);
  t.q[0] = NAN;  // query row 0, which sees key 0 only
  std::vector<float> weights(4);
  attention_weights(t.qv(), t.kv(), MutableTensorView(weights.data(), {1, 1, 2, 2}),
                    Mask().causal());
  EXPECT_TRUE(std::isnan(weights[0]));
  EXPECT_EQ(weights[1], 0.0f);
  EXPECT_TRUE(std::isfinite(weights[2]));
}

TEST(NonFinite, CheckFiniteNamesTheFirstBadElement) {
  Tensors t(1, 2, 1, 3, 3, 2, 2, 13);
  t.k[2 * 2 + 1] = INFINITY;  // k[0,0,2,1]
  Options options;
  options.check_finite = true;
  EXPECT_MASKATTN_ERROR(run(t, {}, {}, options), "check_finite: k[0,0,2,1] is inf");
  t.k[2 * 2 + 1] = 0;
  t.v[5] = NAN;
  EXPECT_MASKATTN_ERROR(run(t, {}, {}, options), "check_finite: v[0,0,2,1] is nan");
}

TEST(Callables, ExceptionsFromAPredicateReachTheCaller) {
  const Tensors t(1, 1, 1, 4, 4, 2, 2, 5);
  const Mask mask = Mask().predicate([](int64_t, int64_t, int64_t i, int64_t) -> bool {
    if (i == 2) throw std::runtime_error("predicate failed on row 2");
    return true;
  });
  EXPECT_THROW(run(t, mask), std::runtime_error);
}

TEST(EmptyProblems, ZeroBatchHeadsOrQueriesDoNothing) {
  for (const auto& dims : {std::array<int64_t, 3>{0, 1, 3}, {1, 0, 3}, {1, 1, 0}}) {
    const Tensors t(dims[0], dims[1], dims[1], dims[2], 3, 2, 2, 1);
    EXPECT_TRUE(run(t, Mask().causal()).empty());
  }
}

TEST(Scores, ScaledAndFinalStages) {
  const std::vector<float> x = {1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 0, 0};
  const TensorView q(x.data(), {1, 1, 3, 4});
  std::vector<float> scaled(9), final_scores(9);
  attention_scores(q, q, MutableTensorView(scaled.data(), {1, 1, 3, 3}), ScoreStage::scaled,
                   Mask().causal());
  attention_scores(q, q, MutableTensorView(final_scores.data(), {1, 1, 3, 3}), ScoreStage::final,
                   Mask().causal());
  EXPECT_EQ(scaled, (std::vector<float>{1, 0, 0.5, 0, 1, 0.5, 0.5, 0.5, 1}));
  const float inf = INFINITY;
  EXPECT_EQ(final_scores, (std::vector<float>{1, -inf, -inf, 0, 1, -inf, 0.5, 0.5, 1}));
}

}  // namespace
}  // namespace maskattn
