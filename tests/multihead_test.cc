// MultiHeadAttention and KVCache (docs/semantics.md §13): the layer against an f64 oracle written
// here from its definition, and its backward against central differences of that oracle; decoding
// through the cache (token by token, chunked, bf16, left-padded batches) against the full forward;
// padding, GQA, cross-attention and image-text properties through the layer; the cache's contract;
// save() and load().
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "maskattn/kv_cache.h"
#include "maskattn/multihead.h"
#include "test_util.h"

namespace maskattn {
namespace {

using test::max_error;
using test::random_values;

constexpr Kernel kKernels[] = {Kernel::reference, Kernel::fused};

LayerOptions options_for(Kernel kernel) {
  LayerOptions options;
  options.attention.kernel = kernel;
  return options;
}

// The sizes of one layer call, chosen by the test (never read back from the layer).
struct Sizes {
  int64_t B, Lq, Lk, Hq, Hkv, D, Dv, Eq, Ek, Ev, E;
};

// Self-attention sizes of a MultiHeadAttention::random(E, Hq, Hkv) layer.
Sizes self_sizes(int64_t B, int64_t L, int64_t E, int64_t Hq, int64_t Hkv) {
  return {B, L, L, Hq, Hkv, E / Hq, E / Hq, E, E, E, E};
}

// A layer built by hand for any sizes (Ek, Ev ≠ E, Dv ≠ D), nn.Linear's ±1/√in initialisation.
LayerWeights hand_weights(const Sizes& s, uint64_t seed, bool bias) {
  const auto matrix = [&](int64_t rows, int64_t in, uint64_t n) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(in));
    return Array<float>({rows, in}, random_values(rows * in, seed + n, -bound, bound));
  };
  const auto vector = [&](int64_t rows, int64_t in, uint64_t n) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(in));
    return Array<float>({rows}, random_values(rows, seed + n, -bound, bound));
  };
  LayerWeights w;
  w.q_weight = matrix(s.Hq * s.D, s.Eq, 1);
  w.k_weight = matrix(s.Hkv * s.D, s.Ek, 2);
  w.v_weight = matrix(s.Hkv * s.Dv, s.Ev, 3);
  w.out_weight = matrix(s.E, s.Hq * s.Dv, 4);
  if (bias) {
    w.q_bias = vector(s.Hq * s.D, s.Eq, 5);
    w.k_bias = vector(s.Hkv * s.D, s.Ek, 6);
    w.v_bias = vector(s.Hkv * s.Dv, s.Ev, 7);
    w.out_bias = vector(s.E, s.Hq * s.Dv, 8);
  }
  return w;
}

// query [B, Lq, Eq], key [B, Lk, Ek], value [B, Lk, Ev]. For self-attention key and value are
// empty and the views pass the query tensor three times, as a model would.
struct Inputs {
  Sizes s;
  std::vector<float> query, key, value;

  const std::vector<float>& key_values() const { return key.empty() ? query : key; }
  const std::vector<float>& value_values() const { return value.empty() ? query : value; }
  TensorView query_view() const { return TensorView(query.data(), {s.B, s.Lq, s.Eq}); }
  TensorView key_view() const { return TensorView(key_values().data(), {s.B, s.Lk, s.Ek}); }
  TensorView value_view() const { return TensorView(value_values().data(), {s.B, s.Lk, s.Ev}); }
};

Inputs random_inputs(const Sizes& s, uint64_t seed, bool self) {
  Inputs in{s, random_values(s.B * s.Lq * s.Eq, seed), {}, {}};
  if (!self) {
    in.key = random_values(s.B * s.Lk * s.Ek, seed + 1);
    in.value = random_values(s.B * s.Lk * s.Ev, seed + 2);
  }
  return in;
}

std::vector<float> run_forward(const MultiHeadAttention& layer, const Inputs& in, const Mask& mask,
                               const LayerOptions& options = {},
                               LayerActivations* saved = nullptr) {
  std::vector<float> out(in.s.B * in.s.Lq * in.s.E, -7.0f);  // shows any row left unwritten
  layer.forward(in.query_view(), in.key_view(), in.value_view(),
                MutableTensorView(out.data(), {in.s.B, in.s.Lq, in.s.E}), mask, {}, options, saved);
  return out;
}

// Self-attention over x [B, L, E].
std::vector<float> self_forward(const MultiHeadAttention& layer, const std::vector<float>& x,
                                int64_t B, int64_t L, const Mask& mask,
                                const LayerOptions& options = {}) {
  const int64_t E = layer.embed_dim();
  const Sizes s = self_sizes(B, L, E, layer.heads(), layer.kv_heads());
  return run_forward(layer, Inputs{s, x, {}, {}}, mask, options);
}

bool bitwise_equal(const float* a, const float* b, int64_t count) {
  // (memcmp may not be given null pointers, which empty arrays have, even for no bytes)
  return count == 0 || std::memcmp(a, b, count * sizeof(float)) == 0;
}

// ---- the f64 oracle -----------------------------------------------------------------------------

// Everything a layer's output depends on, in f64: the inputs and the weights (empty: no bias).
struct Params {
  std::vector<double> query, key, value;
  std::vector<double> q_weight, k_weight, v_weight, out_weight;
  std::vector<double> q_bias, k_bias, v_bias, out_bias;
};

std::vector<double> to_double(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

Params params_of(const Inputs& in, const LayerWeights& w) {
  return {to_double(in.query),
          to_double(in.key_values()),
          to_double(in.value_values()),
          to_double(w.q_weight.values()),
          to_double(w.k_weight.values()),
          to_double(w.v_weight.values()),
          to_double(w.out_weight.values()),
          to_double(w.q_bias.values()),
          to_double(w.k_bias.values()),
          to_double(w.v_bias.values()),
          to_double(w.out_bias.values())};
}

// nn.Linear: y [rows, out] = x [rows, in]·wᵀ + b.
std::vector<double> linear(const std::vector<double>& x, int64_t rows, int64_t in,
                           const std::vector<double>& w, const std::vector<double>& b) {
  const int64_t out = static_cast<int64_t>(w.size()) / in;
  std::vector<double> y(rows * out);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double sum = b.empty() ? 0.0 : b[o];
      for (int64_t i = 0; i < in; ++i) sum += x[r * in + i] * w[o * in + i];
      y[r * out + o] = sum;
    }
  }
  return y;
}

// The layer from its definition, naively: the three projections, per query head h a softmax of
// scale·q·k over the pairs `allowed` keeps (a row with none gives 0) against kv head h/(Hq/Hkv),
// then the output projection of the concatenated heads.
std::vector<double> oracle(const Params& p, const Sizes& s, const Array<uint8_t>& allowed) {
  const std::vector<double> q = linear(p.query, s.B * s.Lq, s.Eq, p.q_weight, p.q_bias);
  const std::vector<double> k = linear(p.key, s.B * s.Lk, s.Ek, p.k_weight, p.k_bias);
  const std::vector<double> v = linear(p.value, s.B * s.Lk, s.Ev, p.v_weight, p.v_bias);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  std::vector<double> heads(s.B * s.Lq * s.Hq * s.Dv, 0.0), weights(s.Lk);
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.Hq; ++h) {
      const int64_t g = h / (s.Hq / s.Hkv);
      for (int64_t i = 0; i < s.Lq; ++i) {
        const uint8_t* row = allowed.data() + ((b * s.Hq + h) * s.Lq + i) * s.Lk;
        const double* qi = &q[((b * s.Lq + i) * s.Hq + h) * s.D];
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < s.Lk; ++j) {
          if (!row[j]) continue;
          const double* kj = &k[((b * s.Lk + j) * s.Hkv + g) * s.D];
          double dot = 0.0;
          for (int64_t d = 0; d < s.D; ++d) dot += qi[d] * kj[d];
          weights[j] = scale * dot;
          max = std::max(max, weights[j]);
        }
        if (max == -std::numeric_limits<double>::infinity()) continue;  // fully hidden: zeros
        double total = 0.0;
        for (int64_t j = 0; j < s.Lk; ++j) {
          weights[j] = row[j] ? std::exp(weights[j] - max) : 0.0;
          total += weights[j];
        }
        double* o = &heads[((b * s.Lq + i) * s.Hq + h) * s.Dv];
        for (int64_t j = 0; j < s.Lk; ++j) {
          const double* vj = &v[((b * s.Lk + j) * s.Hkv + g) * s.Dv];
          for (int64_t e = 0; e < s.Dv; ++e) o[e] += weights[j] / total * vj[e];
        }
      }
    }
  }
  return linear(heads, s.B * s.Lq, s.Hq * s.Dv, p.out_weight, p.out_bias);
}

Array<uint8_t> allowed_for(const Mask& mask, const Sizes& s) {
  return allowed_pairs(mask, MaskShape{s.B, s.Hq, s.Lq, s.Lk});
}

double max_difference(const std::vector<float>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double worst = 0.0;
  for (size_t n = 0; n < a.size(); ++n) {
    const double error = std::abs(a[n] - b[n]);
    if (std::isnan(error)) return std::numeric_limits<double>::infinity();  // NaN must not hide
    worst = std::max(worst, error);
  }
  return worst;
}

// Both kernels against the oracle on the same f32 inputs and weights: f32 rounding only.
void expect_matches_oracle(const MultiHeadAttention& layer, const Sizes& s, const Mask& mask,
                           bool self, uint64_t seed, const std::string& what) {
  const Inputs in = random_inputs(s, seed, self);
  const std::vector<double> expected =
      oracle(params_of(in, layer.weights()), s, allowed_for(mask, s));
  for (Kernel kernel : kKernels) {
    EXPECT_LE(max_difference(run_forward(layer, in, mask, options_for(kernel)), expected), 1e-5)
        << what << ", " << kernel_name(kernel) << " kernel";
  }
}

TEST(MultiHeadAttention, SelfAttentionMatchesTheFloat64Oracle) {
  const Sizes s = self_sizes(2, 6, 16, 4, 4);
  const auto layer = MultiHeadAttention::random(16, 4, 4, 11);
  // Left padding: the first two rows of sequence 1 see nothing, so their heads give 0.
  expect_matches_oracle(layer, s, Mask().causal().key_starts({0, 2}), true, 12, "left padded");
  expect_matches_oracle(layer, s, Mask().causal().key_lengths({6, 4}).query_lengths({6, 4}), true,
                        13, "right padded");
}

TEST(MultiHeadAttention, CrossAttentionWithOtherKeyAndValueWidthsMatchesTheOracle) {
  // Lq ≠ Lk both ways, Ek ≠ Ev ≠ E, Dv ≠ D, and GQA.
  const Sizes s = {.B = 2,
                   .Lq = 4,
                   .Lk = 7,
                   .Hq = 4,
                   .Hkv = 2,
                   .D = 3,
                   .Dv = 5,
                   .Eq = 12,
                   .Ek = 10,
                   .Ev = 6,
                   .E = 12};
  const MultiHeadAttention layer(hand_weights(s, 21, true), 4, 2);
  EXPECT_EQ(layer.embed_dim(), 12);
  EXPECT_EQ(layer.query_dim(), 12);
  EXPECT_EQ(layer.key_dim(), 10);
  EXPECT_EQ(layer.value_dim(), 6);
  EXPECT_EQ(layer.head_dim(), 3);
  EXPECT_EQ(layer.head_value_dim(), 5);
  expect_matches_oracle(layer, s, Mask().key_lengths({7, 5}), false, 22, "encoder padding");
  // More queries than keys, bottom-right causal: the first two rows see nothing.
  const Sizes wide = {.B = 2,
                      .Lq = 5,
                      .Lk = 3,
                      .Hq = 4,
                      .Hkv = 2,
                      .D = 3,
                      .Dv = 5,
                      .Eq = 12,
                      .Ek = 10,
                      .Ev = 6,
                      .E = 12};
  expect_matches_oracle(layer, wide, Mask().causal(), false, 23, "Lq > Lk causal");
}

TEST(MultiHeadAttention, GroupedQueryAttentionMatchesTheOracle) {
  const auto layer = MultiHeadAttention::random(16, 4, 2, 31);
  EXPECT_EQ(layer.kv_heads(), 2);
  expect_matches_oracle(layer, self_sizes(2, 6, 16, 4, 2), Mask().causal().key_lengths({6, 3}),
                        true, 32, "GQA");
}

TEST(MultiHeadAttention, LayerWithoutBiasesMatchesTheOracle) {
  const auto layer = MultiHeadAttention::random(16, 2, 2, 41, false);
  EXPECT_FALSE(layer.has_bias());
  EXPECT_TRUE(layer.weights().out_bias.empty());
  expect_matches_oracle(layer, self_sizes(2, 6, 16, 2, 2), Mask().causal(), true, 42, "no bias");
}

TEST(MultiHeadAttention, ConstructorRejectsInconsistentShapes) {
  const Sizes s = self_sizes(1, 1, 8, 4, 2);
  EXPECT_MASKATTN_ERROR(MultiHeadAttention(hand_weights(s, 1, true), 4, 3));  // 4 % 3 ≠ 0
  EXPECT_MASKATTN_ERROR(MultiHeadAttention(hand_weights(s, 1, true), 3, 1));  // 8 rows / 3 heads
  LayerWeights wrong_out = hand_weights(s, 1, true);
  wrong_out.out_weight = Array<float>({8, 6}, std::vector<float>(48));
  EXPECT_MASKATTN_ERROR(MultiHeadAttention(wrong_out, 4, 2));
  LayerWeights some_biases = hand_weights(s, 1, true);
  some_biases.k_bias = {};
  EXPECT_MASKATTN_ERROR(MultiHeadAttention(some_biases, 4, 2));
}

TEST(MultiHeadAttention, RandomIsSeededAndWithinTheLinearBound) {
  const auto a = MultiHeadAttention::random(16, 4, 2, 5),
             b = MultiHeadAttention::random(16, 4, 2, 5);
  EXPECT_EQ(a.weights().k_weight.values(), b.weights().k_weight.values());
  EXPECT_NE(a.weights().k_weight.values(),
            MultiHeadAttention::random(16, 4, 2, 6).weights().k_weight.values());
  EXPECT_EQ(a.weights().k_weight.shape(), (Dims{8, 16}));
  for (float w : a.weights().q_weight.values()) ASSERT_LE(std::abs(w), 0.25f);  // 1/√16
  for (float w : a.weights().out_bias.values()) ASSERT_LE(std::abs(w), 0.25f);
}

// LayerOptions::dtype rounds Q, K, V and the heads' outputs: the result moves from the f32 one by
// about the dtype's rounding (f16 2^-11, bf16 2^-8 relative, on outputs of size ~0.5), and the
// gradients likewise. Both stay far from what a dtype that is ignored (error ~1e-7) or applied to
// the wrong tensor would give.
TEST(MultiHeadAttention, HalfPrecisionComputeStaysWithinTheDtypesRounding) {
  const Sizes s = self_sizes(2, 6, 16, 4, 2);
  const auto layer = MultiHeadAttention::random(16, 4, 2, 21);
  const Inputs in = random_inputs(s, 22, true);
  const Mask mask = Mask().causal().key_lengths({6, 4});
  const std::vector<double> expected =
      oracle(params_of(in, layer.weights()), s, allowed_for(mask, s));
  const std::vector<float> dout = random_values(s.B * s.Lq * s.E, 23);
  LayerActivations saved32;
  run_forward(layer, in, mask, {}, &saved32);
  const LayerGradients f32 =
      layer.backward(saved32, TensorView(dout.data(), {s.B, s.Lq, s.E}), mask);
  for (const auto& [dtype, tolerance] : {std::pair{DType::f16, 4e-3}, {DType::bf16, 3e-2}}) {
    for (Kernel kernel : kKernels) {
      LayerOptions options = options_for(kernel);
      options.dtype = dtype;
      LayerActivations saved;
      const double error = max_difference(run_forward(layer, in, mask, options, &saved), expected);
      EXPECT_LE(error, tolerance) << dtype_name(dtype) << " " << kernel_name(kernel);
      EXPECT_GT(error, 1e-6) << dtype_name(dtype) << ": the dtype was not applied";
      const LayerGradients grads =
          layer.backward(saved, TensorView(dout.data(), {s.B, s.Lq, s.E}), mask, {}, options);
      EXPECT_LE(max_error(grads.dquery.values(), f32.dquery.values()), 4 * tolerance);
      EXPECT_LE(max_error(grads.dweights.k_weight.values(), f32.dweights.k_weight.values()),
                4 * tolerance);
    }
  }
}

// An empty batch is nothing to do, forward and backward.
TEST(MultiHeadAttention, EmptyBatchGivesEmptyResults) {
  const auto layer = MultiHeadAttention::random(8, 2, 1, 24);
  const float* none = nullptr;
  LayerActivations saved;
  layer.forward(
      TensorView(none, {0, 3, 8}), TensorView(none, {0, 3, 8}), TensorView(none, {0, 3, 8}),
      MutableTensorView(static_cast<float*>(nullptr), {0, 3, 8}), Mask().causal(), {}, {}, &saved);
  const LayerGradients grads = layer.backward(saved, TensorView(none, {0, 3, 8}), Mask().causal());
  EXPECT_EQ(grads.dquery.shape(), (Dims{0, 3, 8}));
  EXPECT_EQ(grads.dweights.q_weight.shape(), (Dims{8, 8}));
  for (float g : grads.dweights.q_weight.values()) EXPECT_EQ(g, 0.0f);
}

// ---- backward -----------------------------------------------------------------------------------

struct Field {
  const char* name;
  std::vector<double> Params::*param;
  const Array<float>& (*gradient)(const LayerGradients&);
};

const Field kFields[] = {
    {"query", &Params::query,
     [](const LayerGradients& g) -> const Array<float>& { return g.dquery; }},
    {"key", &Params::key, [](const LayerGradients& g) -> const Array<float>& { return g.dkey; }},
    {"value", &Params::value,
     [](const LayerGradients& g) -> const Array<float>& { return g.dvalue; }},
    {"q_weight", &Params::q_weight,
     [](const LayerGradients& g) -> const Array<float>& { return g.dweights.q_weight; }},
    {"k_weight", &Params::k_weight,
     [](const LayerGradients& g) -> const Array<float>& { return g.dweights.k_weight; }},
    {"v_weight", &Params::v_weight,
     [](const LayerGradients& g) -> const Array<float>& { return g.dweights.v_weight; }},
    {"out_weight", &Params::out_weight,
     [](const LayerGradients& g) -> const Array<float>& { return g.dweights.out_weight; }},
    {"q_bias", &Params::q_bias,
     [](const LayerGradients& g) -> const Array<float>& { return g.dweights.q_bias; }},
    {"k_bias", &Params::k_bias,
     [](const LayerGradients& g) -> const Array<float>& { return g.dweights.k_bias; }},
    {"v_bias", &Params::v_bias,
     [](const LayerGradients& g) -> const Array<float>& { return g.dweights.v_bias; }},
    {"out_bias", &Params::out_bias,
     [](const LayerGradients& g) -> const Array<float>& { return g.dweights.out_bias; }},
};

// backward() of both kernels against central differences (step 1e-6) of L = Σ dout∘Y on the f64
// oracle, for every element of every input, weight and bias: each gradient tensor to 1e-4 of its
// largest entry, and at least to 1e-6, because ∂L/∂k_bias is exactly 0 (k_bias adds q·k_bias to a
// whole row of scores, which the softmax ignores) and f32 leaves ~1e-8 there. The mask is fixed,
// so L is smooth in every parameter.
void expect_gradients_match(const MultiHeadAttention& layer, const Inputs& in, const Mask& mask,
                            uint64_t seed, const std::string& what) {
  const Sizes& s = in.s;
  const std::vector<float> dout = random_values(s.B * s.Lq * s.E, seed);
  const Array<uint8_t> allowed = allowed_for(mask, s);
  Params p = params_of(in, layer.weights());
  const auto loss = [&] {
    const std::vector<double> y = oracle(p, s, allowed);
    double sum = 0.0;
    for (size_t n = 0; n < y.size(); ++n) sum += dout[n] * y[n];
    return sum;
  };
  constexpr double kStep = 1e-6;
  std::vector<std::vector<double>> numeric;
  for (const Field& field : kFields) {
    std::vector<double>& values = p.*field.param;
    std::vector<double> gradient(values.size());
    for (size_t n = 0; n < values.size(); ++n) {
      const double original = values[n];
      values[n] = original + kStep;
      const double up = loss();
      values[n] = original - kStep;
      const double down = loss();
      values[n] = original;
      gradient[n] = (up - down) / (2 * kStep);
    }
    numeric.push_back(gradient);
  }
  for (Kernel kernel : kKernels) {
    LayerActivations saved;
    run_forward(layer, in, mask, options_for(kernel), &saved);
    const LayerGradients grads = layer.backward(saved, TensorView(dout.data(), {s.B, s.Lq, s.E}),
                                                mask, {}, options_for(kernel));
    for (size_t f = 0; f < std::size(kFields); ++f) {
      const std::vector<float>& analytic = kFields[f].gradient(grads).values();
      const std::string where = what + ", " + kernel_name(kernel) + " kernel, d" + kFields[f].name;
      if (numeric[f].empty()) {  // a layer without biases has no bias gradients
        EXPECT_TRUE(analytic.empty()) << where;
        continue;
      }
      ASSERT_EQ(analytic.size(), numeric[f].size()) << where;
      double largest = 0.0;
      for (double g : numeric[f]) largest = std::max(largest, std::abs(g));
      EXPECT_LE(max_difference(analytic, numeric[f]), 1e-4 * std::max(largest, 1e-2)) << where;
    }
    EXPECT_EQ(grads.dquery.shape(), (Dims{s.B, s.Lq, s.Eq}));
    EXPECT_EQ(grads.dkey.shape(), (Dims{s.B, s.Lk, s.Ek}));
    EXPECT_EQ(grads.dweights.v_weight.shape(), layer.weights().v_weight.shape());
  }
}

TEST(MultiHeadAttentionBackward, MatchesFiniteDifferencesWithCausalAndKeyPadding) {
  const auto layer = MultiHeadAttention::random(8, 2, 2, 51);
  // Separate query, key and value tensors of one length, so each gets its own gradient.
  expect_gradients_match(layer, random_inputs(self_sizes(2, 5, 8, 2, 2), 52, false),
                         Mask().causal().key_lengths({5, 3}), 53, "Hq=2");
}

TEST(MultiHeadAttentionBackward, GroupedQueryWithoutBiasesAndHiddenRowsMatchesFiniteDifferences) {
  const auto layer = MultiHeadAttention::random(8, 4, 2, 61, false);
  // Left padding by 2 in sequence 1: its first two rows see nothing, so their dquery rows are 0.
  expect_gradients_match(layer, random_inputs(self_sizes(2, 5, 8, 4, 2), 62, false),
                         Mask().causal().key_starts({0, 2}), 63, "Hq=4 Hkv=2");
}

TEST(MultiHeadAttentionBackward, CrossAttentionMatchesFiniteDifferences) {
  const Sizes s = {.B = 2,
                   .Lq = 3,
                   .Lk = 5,
                   .Hq = 2,
                   .Hkv = 1,
                   .D = 4,
                   .Dv = 3,
                   .Eq = 8,
                   .Ek = 6,
                   .Ev = 7,
                   .E = 8};
  const MultiHeadAttention layer(hand_weights(s, 71, true), 2, 1);
  expect_gradients_match(layer, random_inputs(s, 72, false), Mask().key_lengths({5, 4}), 73,
                         "cross");
}

// forward() hands its Q, K, V and heads' outputs to the activations by exchanging buffers with
// the calling thread's scratch, and backward() reuses the thread's gradient buffers unzeroed: the
// activations of one call must survive later calls (with other activations, or none), and a
// backward must not depend on what an earlier one left behind, bit for bit. In f32 (projected in
// place, also right after a bf16 call left bf16 bytes in those buffers) and bf16; with and
// without biases; GQA, with rows that see no key and key tiles that no query sees.
TEST(MultiHeadAttentionBackward, ActivationsAndScratchSurviveOtherCallsBitwise) {
  const Sizes s = self_sizes(2, 70, 8, 4, 2);
  const Inputs first = random_inputs(s, 82, true), second = random_inputs(s, 83, true);
  const std::vector<float> dout = random_values(s.B * s.Lq * s.E, 84);
  const std::vector<float> other_dout = random_values(s.B * s.Lq * s.E, 85);
  const TensorView dy(dout.data(), {s.B, s.Lq, s.E}), other_dy(other_dout.data(), dy.sizes());
  // Sequence 1 left-padded by 66 and right-padded by 2: rows that see no key, key tiles that no
  // query sees.
  const Mask mask = Mask().causal().key_starts({0, 66}).key_lengths({70, 68});
  for (bool bias : {true, false}) {
    const auto layer = MultiHeadAttention::random(8, 4, 2, 81, bias);
    for (DType dtype : {DType::bf16, DType::f32}) {
      const std::string where = std::string(dtype_name(dtype)) + (bias ? "" : " no bias");
      LayerOptions options;
      options.dtype = dtype;
      LayerActivations alone;
      run_forward(layer, first, mask, options, &alone);
      const LayerGradients expected = layer.backward(alone, dy, mask, {}, options);
      LayerActivations kept, other;
      run_forward(layer, first, mask, options, &kept);
      run_forward(layer, second, mask, options, &other);
      run_forward(layer, second, mask, options);
      run_forward(layer, first, mask, options, &other);  // `other` again: its buffers exchanged
      layer.backward(other, other_dy, Mask().causal(), {}, options);  // other bytes in scratch
      const LayerGradients grads = layer.backward(kept, dy, mask, {}, options);
      EXPECT_EQ(kept.q, alone.q) << where;
      EXPECT_EQ(kept.heads, alone.heads) << where;
      for (const Field& field : kFields) {
        const std::vector<float>& a = field.gradient(grads).values();
        const std::vector<float>& b = field.gradient(expected).values();
        ASSERT_EQ(a.size(), b.size()) << where << " d" << field.name;
        EXPECT_TRUE(bitwise_equal(a.data(), b.data(), static_cast<int64_t>(a.size())))
            << where << " d" << field.name;
      }
    }
  }
}

// ---- the KV cache through the layer -------------------------------------------------------------

// Feeds x [B, T, E] to forward_cached in chunks of the given sizes (strided views into x) and
// returns the outputs [B, T, E].
std::vector<float> run_cached(const MultiHeadAttention& layer, const std::vector<float>& x,
                              int64_t B, int64_t T, const std::vector<int64_t>& chunks,
                              DType dtype = DType::f32) {
  const int64_t E = layer.embed_dim();
  KVCache cache = layer.make_cache(B, T, dtype);
  std::vector<float> out(B * T * E);
  int64_t position = 0;
  for (int64_t chunk : chunks) {
    std::vector<float> step(B * chunk * E);
    layer.forward_cached(TensorView(x.data() + position * E, {B, chunk, E}, {T * E, E, 1}), cache,
                         MutableTensorView(step.data(), {B, chunk, E}));
    for (int64_t b = 0; b < B; ++b) {
      std::copy_n(step.data() + b * chunk * E, chunk * E, out.data() + (b * T + position) * E);
    }
    position += chunk;
    EXPECT_EQ(cache.length(), position);
  }
  return out;
}

TEST(MultiHeadAttentionCache, TokenByTokenDecodingEqualsTheFullForward) {
  const int64_t B = 2, T = 12, E = 32;
  const auto layer = MultiHeadAttention::random(E, 4, 2, 81);
  const std::vector<float> x = random_values(B * T * E, 82);
  const std::vector<float> full = self_forward(layer, x, B, T, Mask().causal());
  EXPECT_LE(max_error(run_cached(layer, x, B, T, std::vector<int64_t>(T, 1)), full), 1e-5f);
}

TEST(MultiHeadAttentionCache, ChunkedPrefillEqualsTheFullForward) {
  const int64_t B = 2, T = 12, E = 32;
  const auto layer = MultiHeadAttention::random(E, 4, 2, 83);
  const std::vector<float> x = random_values(B * T * E, 84);
  const std::vector<float> full = self_forward(layer, x, B, T, Mask().causal());
  EXPECT_LE(max_error(run_cached(layer, x, B, T, {5, 4, 1, 1, 1}), full), 1e-5f);
}

TEST(MultiHeadAttentionCache, Bf16CacheStaysCloseToTheF32Forward) {
  // Keys and values rounded to bf16 (relative error ≤ 2^-9) move outputs of size ~0.3 by about
  // 1e-3; 1e-2 leaves room without hiding a misplaced or unrounded entry.
  const int64_t B = 2, T = 12, E = 32;
  const auto layer = MultiHeadAttention::random(E, 4, 2, 85);
  const std::vector<float> x = random_values(B * T * E, 86);
  const std::vector<float> full = self_forward(layer, x, B, T, Mask().causal());
  const std::vector<float> cached = run_cached(layer, x, B, T, {5, 4, 1, 1, 1}, DType::bf16);
  EXPECT_LE(max_error(cached, full), 1e-2f);
  EXPECT_GT(max_error(cached, full), 0.0f);  // the cache did round
  EXPECT_EQ(layer.make_cache(B, T, DType::bf16).keys().dtype(), DType::bf16);
}

TEST(MultiHeadAttentionCache, F16CacheEqualsTheF16Forward) {
  // An f16 cache holds what the f16 forward computes with: K and V rounded once, the same sums.
  const int64_t B = 2, T = 12, E = 32;
  const auto layer = MultiHeadAttention::random(E, 4, 2, 87);
  const std::vector<float> x = random_values(B * T * E, 88);
  LayerOptions f16;
  f16.dtype = DType::f16;
  const std::vector<float> full = self_forward(layer, x, B, T, Mask().causal(), f16);
  const std::vector<float> cached =
      run_cached(layer, x, B, T, std::vector<int64_t>(T, 1), DType::f16);
  EXPECT_LE(max_error(cached, full), 1e-3f);
  EXPECT_EQ(layer.make_cache(B, T, DType::f16).values().dtype(), DType::f16);
}

// The filled part of a cache's keys, in [B, Hkv, length, D] order.
std::vector<float> cached_keys(const KVCache& cache) {
  const TensorView keys = cache.keys();
  std::vector<float> values;
  for (int64_t b = 0; b < keys.size(0); ++b) {
    for (int64_t g = 0; g < keys.size(1); ++g) {
      for (int64_t t = 0; t < keys.size(2); ++t) {
        const float* row = static_cast<const float*>(keys.data()) + keys.offset({b, g, t, 0});
        values.insert(values.end(), row, row + keys.size(3));
      }
    }
  }
  return values;
}

TEST(MultiHeadAttentionCache, ARefusedStepLeavesTheCacheAsItWas) {
  const int64_t B = 2, T = 3, E = 16;
  const auto layer = MultiHeadAttention::random(E, 4, 2, 89);
  const std::vector<float> x = random_values(B * T * E, 90);
  const auto positions = [&](int64_t first, int64_t count) {
    return TensorView(x.data() + first * E, {B, count, E}, {T * E, E, 1});
  };
  std::vector<float> out(B * T * E);
  KVCache cache = layer.make_cache(B, 8);
  layer.forward_cached(positions(0, 2), cache, MutableTensorView(out.data(), {B, 2, E}));
  const std::vector<float> keys_before = cached_keys(cache);
  // The attention call refuses a second alignment after the position was appended.
  EXPECT_MASKATTN_ERROR(layer.forward_cached(positions(2, 1), cache,
                                             MutableTensorView(out.data(), {B, 1, E}),
                                             Mask().causal(Alignment::top_left)));
  EXPECT_EQ(cache.length(), 2);
  EXPECT_EQ(cached_keys(cache), keys_before);
  // The next step goes where the refused one would have gone, and matches the full forward.
  std::vector<float> step(B * E);
  layer.forward_cached(positions(2, 1), cache, MutableTensorView(step.data(), {B, 1, E}));
  const std::vector<float> full = self_forward(layer, x, B, T, Mask().causal());
  for (int64_t b = 0; b < B; ++b) {
    EXPECT_LE(max_error(std::vector<float>(step.begin() + b * E, step.begin() + (b + 1) * E),
                        std::vector<float>(full.begin() + (b * T + 2) * E,
                                           full.begin() + (b * T + 3) * E)),
              1e-6f);
  }
}

TEST(MultiHeadAttentionCache, LeftPaddedBatchEqualsEachSequenceAlone) {
  const int64_t E = 16, P = 7, steps = 3, B = 3;
  const std::vector<int64_t> lengths = {3, 7, 5}, starts = {4, 0, 2};
  const auto layer = MultiHeadAttention::random(E, 4, 2, 91);
  std::vector<std::vector<float>> prompts, decoded, alone;
  for (int64_t b = 0; b < B; ++b) {
    prompts.push_back(random_values(lengths[b] * E, 92 + b));
    decoded.push_back(random_values(steps * E, 95 + b));
    // Alone: prefill, then one token per step; outputs [lengths[b] + steps, E].
    KVCache cache = layer.make_cache(1, lengths[b] + steps);
    std::vector<float> out((lengths[b] + steps) * E);
    layer.forward_cached(TensorView(prompts[b].data(), {1, lengths[b], E}), cache,
                         MutableTensorView(out.data(), {1, lengths[b], E}));
    for (int64_t t = 0; t < steps; ++t) {
      layer.forward_cached(TensorView(decoded[b].data() + t * E, {1, 1, E}), cache,
                           MutableTensorView(out.data() + (lengths[b] + t) * E, {1, 1, E}));
    }
    alone.push_back(out);
  }
  // The batch: pad columns hold large garbage, which the cache's starts must hide. Real tokens
  // must match bit for bit: every call has at most 8 queries, so one attention kernel (row kernel,
  // docs/semantics.md §9) runs them all, and hidden columns add nothing to its sums.
  std::vector<float> prompt = random_values(B * P * E, 98, -100.0f, 100.0f);
  for (int64_t b = 0; b < B; ++b) {
    std::copy(prompts[b].begin(), prompts[b].end(), prompt.begin() + (b * P + starts[b]) * E);
  }
  KVCache cache = layer.make_cache(B, P + steps);
  cache.set_starts(starts);
  std::vector<float> out(B * P * E);
  layer.forward_cached(TensorView(prompt.data(), {B, P, E}), cache,
                       MutableTensorView(out.data(), {B, P, E}));
  const float* out_bias = layer.weights().out_bias.data();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < P; ++t) {
      const float* row = out.data() + (b * P + t) * E;
      if (t < starts[b]) {  // a pad query sees nothing: its heads give 0, the layer out_bias
        EXPECT_TRUE(bitwise_equal(row, out_bias, E)) << "pad b=" << b << " t=" << t;
      } else {
        EXPECT_TRUE(bitwise_equal(row, alone[b].data() + (t - starts[b]) * E, E))
            << "prefill b=" << b << " t=" << t;
      }
    }
  }
  for (int64_t t = 0; t < steps; ++t) {
    std::vector<float> token(B * E), step(B * E);
    for (int64_t b = 0; b < B; ++b) {
      std::copy_n(decoded[b].data() + t * E, E, token.data() + b * E);
    }
    layer.forward_cached(TensorView(token.data(), {B, 1, E}), cache,
                         MutableTensorView(step.data(), {B, 1, E}));
    for (int64_t b = 0; b < B; ++b) {
      EXPECT_TRUE(bitwise_equal(step.data() + b * E, alone[b].data() + (lengths[b] + t) * E, E))
          << "decode step " << t << " b=" << b;
    }
  }
  EXPECT_EQ(cache.length(), P + steps);
}

// A left-padded prompt fed one column at a time: at first the cache holds fewer columns than a
// sequence's padding spans, and every cached key of that sequence is padding.
TEST(MultiHeadAttentionCache, LeftPaddedPromptsFedTokenByTokenEqualTheChunkedPrefill) {
  const int64_t E = 16, P = 6, B = 2;
  const std::vector<int64_t> starts = {4, 1};
  const auto layer = MultiHeadAttention::random(E, 4, 2, 111);
  const std::vector<float> prompt = random_values(B * P * E, 112);
  KVCache chunked = layer.make_cache(B, P);
  chunked.set_starts(starts);
  std::vector<float> expected(B * P * E);
  layer.forward_cached(TensorView(prompt.data(), {B, P, E}), chunked,
                       MutableTensorView(expected.data(), {B, P, E}));
  KVCache cache = layer.make_cache(B, P);
  cache.set_starts(starts);
  std::vector<float> out(B * P * E, -7.0f);
  for (int64_t t = 0; t < P; ++t) {
    layer.forward_cached(TensorView(prompt.data() + t * E, {B, 1, E}, {P * E, E, 1}), cache,
                         MutableTensorView(out.data() + t * E, {B, 1, E}, {P * E, E, 1}));
  }
  EXPECT_LE(max_error(out, expected), 1e-6f);
  const float* out_bias = layer.weights().out_bias.data();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < starts[b]; ++t) {
      EXPECT_TRUE(bitwise_equal(out.data() + (b * P + t) * E, out_bias, E)) << b << " " << t;
    }
  }
}

// ---- padding, GQA, cross-attention and image-text through the layer -----------------------------

TEST(MultiHeadAttention, PaddingSideAndAmountNeverChangeRealTokens) {
  const int64_t E = 16, vocabulary = 30;
  const auto layer = MultiHeadAttention::random(E, 4, 2, 101);
  const std::vector<float> table = random_values(vocabulary * E, 102);
  const auto embed = [&](const std::vector<int64_t>& ids) {
    std::vector<float> x;
    for (int64_t id : ids) x.insert(x.end(), table.begin() + id * E, table.begin() + (id + 1) * E);
    return x;
  };
  std::vector<std::vector<int64_t>> sequences;
  for (int64_t n = 0; n < 4; ++n) {
    std::vector<int64_t> sequence = {kBosId};
    for (int64_t t = 0; t < 1 + n; ++t) sequence.push_back(7 + (5 * t + 3 * n) % 23);
    sequence.push_back(kEosId);
    sequences.push_back(sequence);
  }
  std::vector<std::vector<float>> alone;
  for (const auto& sequence : sequences) {
    alone.push_back(self_forward(layer, embed(sequence), 1, sequence.size(), Mask().causal()));
  }
  const float* out_bias = layer.weights().out_bias.data();
  for (PadSide side : {PadSide::left, PadSide::right}) {
    // 12 columns also moves the fused kernel from its row kernel (Lq ≤ 8) to its tile kernel.
    for (int64_t min_length : {0, 8, 12}) {
      const TokenBatch batch = collate(sequences, side, min_length);
      const int64_t B = batch.ids.dim(0), L = batch.ids.dim(1);
      const std::vector<float> out =
          self_forward(layer, embed(batch.ids.values()), B, L, batch.decoder_self_attention());
      for (int64_t b = 0; b < B; ++b) {
        const int64_t first = batch.starts[b], end = first + batch.lengths[b];
        const std::vector<float> real(out.begin() + (b * L + first) * E,
                                      out.begin() + (b * L + end) * E);
        EXPECT_LE(max_error(real, alone[b]), 1e-6f)
            << (side == PadSide::left ? "left" : "right") << " L=" << L << " b=" << b;
        for (int64_t t = 0; t < L; ++t) {
          if (t >= first && t < end) continue;
          EXPECT_TRUE(bitwise_equal(out.data() + (b * L + t) * E, out_bias, E))
              << "pad row b=" << b << " t=" << t;
        }
      }
    }
  }
}

TEST(MultiHeadAttention, GroupedQueryAttentionEqualsRepeatedKeyValueHeads) {
  const int64_t B = 2, L = 7, E = 16, Hq = 4, Hkv = 2, D = E / Hq;
  const auto gqa = MultiHeadAttention::random(E, Hq, Hkv, 111);
  // Query head h reads kv head h / 2: repeating each kv head's rows for both of its query heads
  // gives the same layer with Hkv = Hq.
  const auto repeat_heads = [&](const Array<float>& a) {
    const int64_t columns = a.rank() == 2 ? a.dim(1) : 1;
    std::vector<float> values;
    for (int64_t h = 0; h < Hq; ++h) {
      const auto first = a.values().begin() + h / (Hq / Hkv) * D * columns;
      values.insert(values.end(), first, first + D * columns);
    }
    Dims shape = a.shape();
    shape[0] = Hq * D;
    return Array<float>(shape, values);
  };
  LayerWeights repeated = gqa.weights();
  repeated.k_weight = repeat_heads(gqa.weights().k_weight);
  repeated.v_weight = repeat_heads(gqa.weights().v_weight);
  repeated.k_bias = repeat_heads(gqa.weights().k_bias);
  repeated.v_bias = repeat_heads(gqa.weights().v_bias);
  const MultiHeadAttention mha(repeated, Hq, Hq);
  const std::vector<float> x = random_values(B * L * E, 112);
  const Mask mask = Mask().causal().key_starts({0, 3});
  for (Kernel kernel : kKernels) {
    EXPECT_LE(max_error(self_forward(gqa, x, B, L, mask, options_for(kernel)),
                        self_forward(mha, x, B, L, mask, options_for(kernel))),
              1e-6f)
        << kernel_name(kernel);
  }
}

TEST(MultiHeadAttention, CrossAttentionIgnoresWhatEncoderPadsHold) {
  const TokenBatch decoder = collate({{2, 11}, {2, 12, 13, 14}}, PadSide::right);
  const Sizes s = {.B = 2,
                   .Lq = 4,
                   .Lk = 5,
                   .Hq = 2,
                   .Hkv = 2,
                   .D = 4,
                   .Dv = 4,
                   .Eq = 8,
                   .Ek = 10,
                   .Ev = 10,
                   .E = 8};
  const MultiHeadAttention layer(hand_weights(s, 121, true), 2, 2);
  for (PadSide side : {PadSide::right, PadSide::left}) {
    const TokenBatch encoder = collate({{2, 7, 8, 9, 3}, {2, 10, 3}}, side);
    const Mask mask = cross_attention(decoder, encoder);
    Inputs in = random_inputs(s, 122, false);
    in.value = in.key;  // key and value are both the encoder's output
    const std::vector<float> clean[] = {
        run_forward(layer, in, mask, options_for(Kernel::reference)),
        run_forward(layer, in, mask, options_for(Kernel::fused))};
    // Encoder pad rows become NaN or 1e30 (whose projections overflow to ±inf).
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t t = 0; t < s.Lk; ++t) {
        if (encoder.ids.at(b, t) != kPadId) continue;
        const float garbage = t % 2 ? std::numeric_limits<float>::quiet_NaN() : 1e30f;
        std::fill_n(in.key.begin() + (b * s.Lk + t) * s.Ek, s.Ek, garbage);
      }
    }
    in.value = in.key;
    for (size_t n = 0; n < std::size(kKernels); ++n) {
      const std::vector<float> dirty = run_forward(layer, in, mask, options_for(kKernels[n]));
      EXPECT_TRUE(bitwise_equal(dirty.data(), clean[n].data(), dirty.size()))
          << kernel_name(kKernels[n]) << " kernel, encoder padded "
          << (side == PadSide::left ? "left" : "right");
    }
  }
}

TEST(MultiHeadAttention, ImageTokensSeeLaterImageTokensButTextNeverSeesLaterText) {
  const int64_t B = 2, L = 8, E = 16;
  const std::vector<int64_t> first = {1, 3}, count = {3, 2};
  const auto layer = MultiHeadAttention::random(E, 2, 2, 131);
  const Mask mask = image_text(first, count, L);
  const std::vector<float> x = random_values(B * L * E, 132);
  const std::vector<float> base = self_forward(layer, x, B, L, mask);
  const auto row = [&](const std::vector<float>& out, int64_t b, int64_t t) {
    return out.data() + (b * L + t) * E;
  };
  for (int64_t b = 0; b < B; ++b) {
    const auto is_image = [&](int64_t t) { return t >= first[b] && t < first[b] + count[b]; };
    for (int64_t t = 0; t < L; ++t) {
      std::vector<float> perturbed = x;
      for (int64_t e = 0; e < E; ++e) perturbed[(b * L + t) * E + e] += 0.5f;
      const std::vector<float> out = self_forward(layer, perturbed, B, L, mask);
      EXPECT_FALSE(bitwise_equal(row(out, b, t), row(base, b, t), E)) << "b=" << b << " t=" << t;
      for (int64_t u = 0; u < t; ++u) {
        const bool changed = !bitwise_equal(row(out, b, u), row(base, b, u), E);
        // Only an earlier image token of the same image sees a later token.
        EXPECT_EQ(changed, is_image(t) && is_image(u)) << "b=" << b << " t=" << t << " u=" << u;
      }
      const int64_t other = 1 - b;
      EXPECT_TRUE(bitwise_equal(row(out, other, 0), row(base, other, 0), L * E));
    }
  }
}

// ---- KVCache ------------------------------------------------------------------------------------

TEST(KVCache, AppendsViewsTruncatesAndRefusesWhatDoesNotFit) {
  const int64_t B = 2, Hkv = 2, capacity = 4, D = 3, Dv = 5;
  KVCache cache(B, Hkv, capacity, D, DType::f32, Dv);
  EXPECT_EQ(cache.value_dim(), Dv);
  EXPECT_EQ(cache.length(), 0);
  const std::vector<float> k = random_values(B * Hkv * 3 * D, 141);
  const std::vector<float> v = random_values(B * Hkv * 3 * Dv, 142);
  cache.append(TensorView(k.data(), {B, Hkv, 3, D}), TensorView(v.data(), {B, Hkv, 3, Dv}));
  ASSERT_EQ(cache.length(), 3);
  const auto read = [](const TensorView& view) {  // any strides, f32 only
    std::vector<float> values;
    const float* data = static_cast<const float*>(view.data());
    for (int64_t a = 0; a < view.size(0); ++a)
      for (int64_t h = 0; h < view.size(1); ++h)
        for (int64_t t = 0; t < view.size(2); ++t)
          for (int64_t d = 0; d < view.size(3); ++d)
            values.push_back(data[view.offset({a, h, t, d})]);
    return values;
  };
  EXPECT_EQ(cache.keys().sizes(), (Dims{B, Hkv, 3, D}));
  EXPECT_EQ(cache.values().sizes(), (Dims{B, Hkv, 3, Dv}));
  EXPECT_EQ(read(cache.keys()), k);
  EXPECT_EQ(read(cache.values()), v);

  // Two more positions do not fit in 4: an error, and the cache unchanged.
  const std::vector<float> k2(B * Hkv * 2 * D, 9.0f), v2(B * Hkv * 2 * Dv, 9.0f);
  EXPECT_MASKATTN_ERROR(
      cache.append(TensorView(k2.data(), {B, Hkv, 2, D}), TensorView(v2.data(), {B, Hkv, 2, Dv})),
      "capacity");
  EXPECT_EQ(cache.length(), 3);
  EXPECT_EQ(read(cache.keys()), k);
  // Shapes that disagree: head dim, kv heads, batch, value dim, and T differing between k and v.
  const std::vector<float> big(64, 1.0f);
  EXPECT_MASKATTN_ERROR(cache.append(TensorView(big.data(), {B, Hkv, 1, D + 1}),
                                     TensorView(big.data(), {B, Hkv, 1, Dv})));
  EXPECT_MASKATTN_ERROR(cache.append(TensorView(big.data(), {B, Hkv + 1, 1, D}),
                                     TensorView(big.data(), {B, Hkv + 1, 1, Dv})));
  EXPECT_MASKATTN_ERROR(cache.append(TensorView(big.data(), {B + 1, Hkv, 1, D}),
                                     TensorView(big.data(), {B + 1, Hkv, 1, Dv})));
  EXPECT_MASKATTN_ERROR(
      cache.append(TensorView(big.data(), {B, Hkv, 1, D}), TensorView(big.data(), {B, Hkv, 1, D})));
  EXPECT_MASKATTN_ERROR(cache.append(TensorView(big.data(), {B, Hkv, 1, D}),
                                     TensorView(big.data(), {B, Hkv, 0, Dv})));
  EXPECT_EQ(cache.length(), 3);

  cache.truncate(1);
  EXPECT_EQ(cache.keys().sizes(), (Dims{B, Hkv, 1, D}));
  const std::vector<float> kept = read(cache.keys());
  for (int64_t n = 0; n < B * Hkv; ++n) {  // the first position of each (batch, head) stays
    EXPECT_TRUE(bitwise_equal(kept.data() + n * D, k.data() + n * 3 * D, D)) << n;
  }
  cache.clear();
  EXPECT_EQ(cache.length(), 0);
  cache.append(TensorView(k2.data(), {B, Hkv, 2, D}), TensorView(v2.data(), {B, Hkv, 2, Dv}));
  EXPECT_EQ(cache.length(), 2);

  EXPECT_MASKATTN_ERROR(KVCache(0, Hkv, capacity, D));
  EXPECT_MASKATTN_ERROR(KVCache(B, Hkv, 0, D));
}

TEST(KVCache, StartsHideLeftPaddingAndMustBeInRange) {
  KVCache cache(2, 1, 4, 2);
  EXPECT_MASKATTN_ERROR(cache.set_starts({4, 0}));  // outside [0, capacity)
  EXPECT_MASKATTN_ERROR(cache.set_starts({-1, 0}));
  EXPECT_MASKATTN_ERROR(cache.set_starts({1}));  // one per sequence
  cache.set_starts({1, 0});
  EXPECT_EQ(cache.starts(), (std::vector<int64_t>{1, 0}));
  const std::vector<float> k(2 * 3 * 2, 0.5f);
  cache.append(TensorView(k.data(), {2, 1, 3, 2}), TensorView(k.data(), {2, 1, 3, 2}));
  // A prefill step: the queries are the three positions appended, sequence 0's first a pad.
  EXPECT_EQ(test::grid(cache.step_mask(), {2, 1, 3, 3}, 0),
            (std::vector<std::string>{"...", ".1.", ".11"}));
  EXPECT_EQ(test::grid(cache.step_mask(), {2, 1, 3, 3}, 1),
            (std::vector<std::string>{"1..", "11.", "111"}));
  // One decoding query after them sits at the last column.
  EXPECT_EQ(test::grid(cache.step_mask(), {2, 1, 1, 3}, 0), (std::vector<std::string>{".11"}));
}

TEST(KVCache, LayerRefusesAMismatchedOrFullCache) {
  const int64_t E = 16;
  const auto layer = MultiHeadAttention::random(E, 4, 2, 151);
  const KVCache made = layer.make_cache(3, 5);
  EXPECT_EQ(made.batch(), 3);
  EXPECT_EQ(made.kv_heads(), 2);
  EXPECT_EQ(made.capacity(), 5);
  EXPECT_EQ(made.head_dim(), 4);
  EXPECT_EQ(made.value_dim(), 4);
  const std::vector<float> x = random_values(2 * 4 * E, 152);
  std::vector<float> out(2 * 4 * E);
  KVCache other_heads(2, 4, 8, 4);
  EXPECT_MASKATTN_ERROR(layer.forward_cached(TensorView(x.data(), {2, 1, E}), other_heads,
                                             MutableTensorView(out.data(), {2, 1, E})));
  KVCache small = layer.make_cache(2, 3);
  EXPECT_MASKATTN_ERROR(layer.forward_cached(TensorView(x.data(), {2, 4, E}), small,
                                             MutableTensorView(out.data(), {2, 4, E})),
                        "capacity");
  EXPECT_EQ(small.length(), 0);
}

// ---- save() and load() --------------------------------------------------------------------------

bool same_weights(const LayerWeights& a, const LayerWeights& b) {
  const auto same = [](const Array<float>& x, const Array<float>& y) {
    return x.shape() == y.shape() && x.values() == y.values();
  };
  return same(a.q_weight, b.q_weight) && same(a.k_weight, b.k_weight) &&
         same(a.v_weight, b.v_weight) && same(a.out_weight, b.out_weight) &&
         same(a.q_bias, b.q_bias) && same(a.k_bias, b.k_bias) && same(a.v_bias, b.v_bias) &&
         same(a.out_bias, b.out_bias);
}

TEST(MultiHeadAttentionFiles, SaveThenLoadReproducesTheLayerBitwise) {
  const int64_t B = 2, L = 6, E = 16;
  const auto layer = MultiHeadAttention::random(E, 4, 2, 161);
  const test::TempDir dir;
  layer.save(dir.root());
  EXPECT_TRUE(std::filesystem::exists(dir.path("in_proj_weight.npy")));  // Ek = Ev = E: packed
  EXPECT_TRUE(std::filesystem::exists(dir.path("out_proj.bias.npy")));
  const auto loaded = MultiHeadAttention::load(dir.root(), 4, 2);
  EXPECT_TRUE(same_weights(loaded.weights(), layer.weights()));
  const std::vector<float> x = random_values(B * L * E, 162);
  const std::vector<float> a = self_forward(layer, x, B, L, Mask().causal());
  const std::vector<float> b = self_forward(loaded, x, B, L, Mask().causal());
  EXPECT_TRUE(bitwise_equal(a.data(), b.data(), a.size()));

  // Other key and value widths are saved in the separate form.
  const Sizes s = {.B = 1,
                   .Lq = 1,
                   .Lk = 1,
                   .Hq = 2,
                   .Hkv = 1,
                   .D = 4,
                   .Dv = 3,
                   .Eq = 8,
                   .Ek = 6,
                   .Ev = 5,
                   .E = 8};
  const MultiHeadAttention cross(hand_weights(s, 163, true), 2, 1);
  const test::TempDir cross_dir;
  cross.save(cross_dir.root());
  EXPECT_TRUE(std::filesystem::exists(cross_dir.path("k_proj_weight.npy")));
  EXPECT_TRUE(
      same_weights(MultiHeadAttention::load(cross_dir.root(), 2, 1).weights(), cross.weights()));
  // So are layers whose value head dim differs from the query head dim, whatever the widths:
  // the packed form has one head dim.
  Sizes wide_values = s;
  wide_values.Ek = wide_values.Ev = wide_values.Eq;
  const MultiHeadAttention values_layer(hand_weights(wide_values, 164, true), 2, 1);
  const test::TempDir values_dir;
  values_layer.save(values_dir.root());
  EXPECT_FALSE(std::filesystem::exists(values_dir.path("in_proj_weight.npy")));
  EXPECT_TRUE(same_weights(MultiHeadAttention::load(values_dir.root(), 2, 1).weights(),
                           values_layer.weights()));
}

TEST(MultiHeadAttentionFiles, LoadsPyTorchsPackedInProjection) {
  const int64_t E = 8, H = 2;
  const Sizes s = self_sizes(1, 1, E, H, H);
  const LayerWeights w = hand_weights(s, 171, true);
  const auto concatenate = [](std::initializer_list<const Array<float>*> parts) {
    std::vector<float> values;
    for (const Array<float>* part : parts) {
      values.insert(values.end(), part->values().begin(), part->values().end());
    }
    return values;
  };
  const test::TempDir dir;
  write_npy(
      dir.path("in_proj_weight.npy"),
      NpyArray::from_floats(concatenate({&w.q_weight, &w.k_weight, &w.v_weight}), {3 * E, E}));
  write_npy(dir.path("in_proj_bias.npy"),
            NpyArray::from_floats(concatenate({&w.q_bias, &w.k_bias, &w.v_bias}), {3 * E}));
  write_npy(dir.path("out_proj.bias.npy"), NpyArray::from_floats(w.out_bias.values(), {E}));
  // A missing file is named in the error.
  EXPECT_MASKATTN_ERROR(MultiHeadAttention::load(dir.root(), H), "out_proj.weight.npy");
  // The output projection as float16 loads widened.
  std::vector<float16> half;
  LayerWeights expected = w;
  std::vector<float> widened;
  for (float value : w.out_weight.values()) {
    half.push_back(float16_from_float(value));
    widened.push_back(to_float(half.back()));
  }
  expected.out_weight = Array<float>({E, E}, widened);
  write_npy(dir.path("out_proj.weight.npy"), NpyArray::from_float16(half, {E, E}));
  const auto loaded = MultiHeadAttention::load(dir.root(), H);
  EXPECT_EQ(loaded.heads(), H);
  EXPECT_EQ(loaded.kv_heads(), H);
  EXPECT_TRUE(same_weights(loaded.weights(), expected));
  const std::vector<float> x = random_values(2 * 5 * E, 172);
  const std::vector<float> a = self_forward(loaded, x, 2, 5, Mask().causal());
  const std::vector<float> b =
      self_forward(MultiHeadAttention(expected, H), x, 2, 5, Mask().causal());
  EXPECT_TRUE(bitwise_equal(a.data(), b.data(), a.size()));
}

TEST(MultiHeadAttentionFiles, SeparateFormNamesTheMissingProjection) {
  const Sizes s = {.B = 1,
                   .Lq = 1,
                   .Lk = 1,
                   .Hq = 2,
                   .Hkv = 2,
                   .D = 4,
                   .Dv = 4,
                   .Eq = 8,
                   .Ek = 6,
                   .Ev = 6,
                   .E = 8};
  const LayerWeights w = hand_weights(s, 181, false);
  const test::TempDir dir;
  write_npy(dir.path("q_proj_weight.npy"), NpyArray::from_floats(w.q_weight.values(), {8, 8}));
  write_npy(dir.path("v_proj_weight.npy"), NpyArray::from_floats(w.v_weight.values(), {8, 6}));
  write_npy(dir.path("out_proj.weight.npy"), NpyArray::from_floats(w.out_weight.values(), {8, 8}));
  EXPECT_MASKATTN_ERROR(MultiHeadAttention::load(dir.root(), 2), "k_proj_weight.npy");
  write_npy(dir.path("k_proj_weight.npy"), NpyArray::from_floats(w.k_weight.values(), {8, 6}));
  const auto loaded = MultiHeadAttention::load(dir.root(), 2);
  EXPECT_FALSE(loaded.has_bias());
  EXPECT_TRUE(same_weights(loaded.weights(), w));
}

}  // namespace
}  // namespace maskattn
