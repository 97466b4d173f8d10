// Attention dropout in the kernels (docs/semantics.md §17): the fused forward and backward against
// the f64 reference applying the same dropped pairs, by the per-dtype rule of docs/design.md §5
// (the naive implementation here applies them too); the dropped pairs identical in every kernel,
// tiling, frame and split of the keys; bitwise results for any thread count and with or without
// block skipping; gradients against finite differences; the undropped LSE; E[O] = O.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/block_skipping.h"
#include "core/dropout.h"
#include "test_util.h"

namespace maskattn {
namespace {

using test::DTypeBuffer;
using test::max_error;
using test::RandomProblem;

const Dropout kDropout{0.3, 0xC0FFEE, 5};

Options with(Dropout dropout, Kernel kernel = Kernel::automatic, int threads = 0) {
  Options options;
  options.dropout = dropout;
  options.kernel = kernel;
  options.threads = threads;
  return options;
}

// The dropout factor of every pair as core/dropout.h defines it: 0 or 1/(1 − p').
struct Factors {
  detail::DropoutRule rule;
  explicit Factors(const RandomProblem& p, const Dropout& dropout)
      : rule(detail::resolve_dropout(dropout, p.shape())) {}
  float at(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return detail::dropout_keeps(rule, b, h, i, j) ? static_cast<float>(rule.keep_scale) : 0.0f;
  }
};

struct Outputs {
  std::vector<float> out, lse, dq, dk, dv;
};

// Forward (and backward with `dout`) on p's inputs rounded to `dtype`, results read back as f32.
Outputs run(const RandomProblem& p, DType dtype, const Mask& mask, const Options& options,
            const std::vector<float>* dout_values = nullptr) {
  const DTypeBuffer q(p.q, dtype), k(p.k, dtype), v(p.v, dtype);
  const Dims q_shape = {p.B, p.Hq, p.Lq, p.D}, k_shape = {p.B, p.Hkv, p.Lk, p.D};
  const Dims v_shape = {p.B, p.Hkv, p.Lk, p.Dv}, o_shape = {p.B, p.Hq, p.Lq, p.Dv};
  DTypeBuffer out(std::vector<float>(p.B * p.Hq * p.Lq * p.Dv, -7.0f), dtype);
  Outputs r;
  r.lse.assign(p.B * p.Hq * p.Lq, -7.0f);
  const MutableTensorView lse(r.lse.data(), {p.B, p.Hq, p.Lq});
  attention(q.view(q_shape), k.view(k_shape), v.view(v_shape), out.mutable_view(o_shape), mask, {},
            options, lse);
  r.out = out.floats(p.B * p.Hq * p.Lq * p.Dv);
  if (dout_values == nullptr) return r;
  const DTypeBuffer dout(*dout_values, dtype);
  DTypeBuffer dq(std::vector<float>(p.q.size(), -7.0f), dtype);
  DTypeBuffer dk(std::vector<float>(p.k.size(), -7.0f), dtype);
  DTypeBuffer dv(std::vector<float>(p.v.size(), -7.0f), dtype);
  attention_backward(
      q.view(q_shape), k.view(k_shape), v.view(v_shape), out.view(o_shape), lse, dout.view(o_shape),
      Gradients{dq.mutable_view(q_shape), dk.mutable_view(k_shape), dv.mutable_view(v_shape)}, mask,
      {}, options);
  r.dq = dq.floats(p.q.size());
  r.dk = dk.floats(p.k.size());
  r.dv = dv.floats(p.v.size());
  return r;
}

// The naive implementation in the dtype under test, with the same dropped pairs: inputs rounded
// to the dtype, plain f32 arithmetic over the allowed pairs (S, softmax, O = (P∘F)·V, and for the
// backward D = dO·O, dV = (P∘F)ᵀ·dO, dP = F∘(dO·Vᵀ), dS = P∘(dP − D)), each result rounded once.
Outputs naive(const RandomProblem& p, DType dtype, const Mask& mask, const Dropout& dropout,
              const std::vector<float>& dout_in) {
  const std::vector<float> q = DTypeBuffer(p.q, dtype).floats(p.q.size());
  const std::vector<float> k = DTypeBuffer(p.k, dtype).floats(p.k.size());
  const std::vector<float> v = DTypeBuffer(p.v, dtype).floats(p.v.size());
  const std::vector<float> dout = DTypeBuffer(dout_in, dtype).floats(dout_in.size());
  const Array<uint8_t> allowed = allowed_pairs(mask, p.shape());
  const Factors factors(p, dropout);
  const float scale = 1.0f / std::sqrt(static_cast<float>(p.D));
  Outputs g;
  g.out.assign(p.B * p.Hq * p.Lq * p.Dv, 0.0f);
  g.dq.assign(q.size(), 0.0f);
  g.dk.assign(k.size(), 0.0f);
  g.dv.assign(v.size(), 0.0f);
  std::vector<float> s(p.Lk), f(p.Lk);
  for (int64_t row = 0; row < p.B * p.Hq * p.Lq; ++row) {
    const int64_t b = row / (p.Hq * p.Lq), h = row / p.Lq % p.Hq, i = row % p.Lq;
    const int64_t kv = b * p.Hkv + h / (p.Hq / p.Hkv);
    float max = -INFINITY;
    for (int64_t j = 0; j < p.Lk; ++j) {
      s[j] = -INFINITY;
      f[j] = factors.at(b, h, i, j);
      if (!allowed.values()[row * p.Lk + j]) continue;
      float dot = 0.0f;
      for (int64_t d = 0; d < p.D; ++d) dot += q[row * p.D + d] * k[(kv * p.Lk + j) * p.D + d];
      max = std::max(max, s[j] = scale * dot);
    }
    if (max == -INFINITY) continue;
    float total = 0.0f;
    for (float& x : s) total += (x = std::exp(x - max));
    for (float& x : s) x /= total;
    float* o = g.out.data() + row * p.Dv;
    for (int64_t j = 0; j < p.Lk; ++j) {
      for (int64_t e = 0; e < p.Dv; ++e) o[e] += s[j] * f[j] * v[(kv * p.Lk + j) * p.Dv + e];
    }
    float D = 0.0f;
    for (int64_t e = 0; e < p.Dv; ++e) D += dout[row * p.Dv + e] * o[e];
    for (int64_t j = 0; j < p.Lk; ++j) {
      if (s[j] == 0.0f) continue;
      float dp = 0.0f;
      for (int64_t e = 0; e < p.Dv; ++e) {
        dp += dout[row * p.Dv + e] * v[(kv * p.Lk + j) * p.Dv + e];
        g.dv[(kv * p.Lk + j) * p.Dv + e] += s[j] * f[j] * dout[row * p.Dv + e];
      }
      const float ds = s[j] * (f[j] * dp - D) * scale;
      for (int64_t d = 0; d < p.D; ++d) {
        g.dq[row * p.D + d] += ds * k[(kv * p.Lk + j) * p.D + d];
        g.dk[(kv * p.Lk + j) * p.D + d] += ds * q[row * p.D + d];
      }
    }
  }
  for (std::vector<float>* x : {&g.out, &g.dq, &g.dk, &g.dv}) {
    *x = DTypeBuffer(*x, dtype).floats(x->size());
  }
  return g;
}

// The rule, per output: max |fused − reference| ≤ 2·max |naive − reference| + 1e-6, the reference
// being the f64 kernel with the same dropout on the same rounded inputs. The LSE is the undropped
// one: the reference's without dropout.
// `slack`: an allowance relative to the largest exact value (the half-precision backward's; see
// BackwardHalfPrecision).
void expect_within_rule(const RandomProblem& p, DType dtype, const Mask& mask,
                        const std::string& what, bool backward, float slack = 0.0f) {
  const std::vector<float> dout = test::random_values(p.B * p.Hq * p.Lq * p.Dv, p.q.size() + 3);
  const Outputs fused =
      run(p, dtype, mask, with(kDropout, Kernel::fused), backward ? &dout : nullptr);
  const RandomProblem rounded = test::rounded_to(p, dtype);
  const std::vector<float> dout_rounded = DTypeBuffer(dout, dtype).floats(dout.size());
  const Outputs exact = run(rounded, DType::f32, mask, with(kDropout, Kernel::reference),
                            backward ? &dout_rounded : nullptr);
  const Outputs undropped = run(rounded, DType::f32, mask, with({}, Kernel::reference));
  const Outputs plain = naive(p, dtype, mask, kDropout, dout);
  using Field = std::vector<float> Outputs::*;
  std::vector<std::pair<const char*, Field>> fields = {{"out", &Outputs::out}};
  if (backward)
    fields.insert(fields.end(), {{"dq", &Outputs::dq}, {"dk", &Outputs::dk}, {"dv", &Outputs::dv}});
  for (const auto& [name, field] : fields) {
    const float naive_error = max_error(plain.*field, exact.*field);
    const float fused_error = max_error(fused.*field, exact.*field);
    float largest = 0.0f;
    for (const float x : exact.*field) largest = std::max(largest, std::fabs(x));
    EXPECT_LE(fused_error, 2 * naive_error + 1e-6f + slack * largest)
        << what << " " << name << " " << dtype_name(dtype) << ": fused " << fused_error
        << ", naive " << naive_error;
  }
  for (size_t n = 0; n < fused.lse.size(); ++n) {
    ASSERT_EQ(exact.lse[n], undropped.lse[n]) << what << " row " << n;
    if (std::isinf(undropped.lse[n])) {
      ASSERT_EQ(fused.lse[n], undropped.lse[n]) << what << " row " << n;
    } else {
      ASSERT_NEAR(fused.lse[n], undropped.lse[n], 1e-5 * (1 + std::fabs(undropped.lse[n]))) << what;
    }
  }
}

TEST(DropoutSweep, ForwardEveryMaskAcrossTileEdges) {
  test::for_each_edge_case(300,
                           [](const RandomProblem& p, const Mask& mask, const std::string& what) {
                             expect_within_rule(p, DType::f32, mask, what, false);
                           });
}

TEST(DropoutSweep, ForwardHalfPrecision) {
  test::for_each_half_precision_case(
      [](const RandomProblem& p, DType dtype, const Mask& mask, const std::string& what) {
        expect_within_rule(p, dtype, mask, what, false);
      });
}

// The rule plus 2^-8 of the largest gradient, as backward_test.cc's unit sweep allows: the fused
// backward computes D_i = Σ dO·O from the forward's output rounded to the dtype (as FlashAttention
// does), where the naive backward keeps its own f32 O; with dropout's 1/(1 − p') larger weights
// that alone can exceed twice the naive error on these small shapes (measured up to 4.4×). Masks
// with global tokens are left to the f32 sweep: a key every query sees sums every row's rounded-
// output error into its dK (measured 4.4× the naive error for bf16, above this slack), which
// backward_test.cc bounds with a per-key allowance of its own (rounded_output_slack).
TEST(DropoutSweep, BackwardHalfPrecision) {
  test::for_each_half_precision_case(
      [](const RandomProblem& p, DType dtype, const Mask& mask, const std::string& what) {
        if (what.find("global") != std::string::npos) return;
        expect_within_rule(p, dtype, mask, what, true, 1.0f / 256);
      });
}

TEST(DropoutSweep, BackwardEveryMaskAcrossTileEdges) {
  test::for_each_edge_case(400,
                           [](const RandomProblem& p, const Mask& mask, const std::string& what) {
                             expect_within_rule(p, DType::f32, mask, what, true);
                           });
}

// With V the identity (Dv = Lk), O_ie = P'_ie: the output shows exactly which pairs a kernel kept.
// Every kernel, tiling and slicing must keep the pairs attention_weights (the reference) keeps.
struct IdentityValues {
  static constexpr int64_t kLen = 100;
  RandomProblem p{1, 2, 1, kLen, kLen, 16, kLen, 21, 2.0f};
  IdentityValues() {
    std::fill(p.v.begin(), p.v.end(), 0.0f);
    for (int64_t j = 0; j < kLen; ++j) p.v[j * kLen + j] = 1.0f;
  }
  // O of query rows [q0, q0 + nq) against key rows [k0, k0 + nk), as a frame of the problem: f32
  // [Hq][nq][nk] (column e − k0 of the output is key e's weight).
  std::vector<float> slice(const Mask& mask, Options options, int64_t q0, int64_t nq, int64_t k0,
                           int64_t nk) const {
    options.frame = Frame{q0, k0, kLen, kLen};
    std::vector<float> q(2 * nq * 16), k(nk * 16), v(nk * nk, 0.0f), out(2 * nq * nk);
    for (int64_t h = 0; h < 2; ++h) {
      std::copy_n(p.q.begin() + (h * kLen + q0) * 16, nq * 16, q.begin() + h * nq * 16);
    }
    std::copy_n(p.k.begin() + k0 * 16, nk * 16, k.begin());
    for (int64_t j = 0; j < nk; ++j) v[j * nk + j] = 1.0f;
    attention(TensorView(q.data(), {1, 2, nq, 16}), TensorView(k.data(), {1, 1, nk, 16}),
              TensorView(v.data(), {1, 1, nk, nk}), MutableTensorView(out.data(), {1, 2, nq, nk}),
              mask, {}, options);
    return out;
  }
};

TEST(DropoutPairs, TheSameInEveryKernelTilingAndSlice) {
  const IdentityValues id;
  const int64_t L = IdentityValues::kLen;
  for (const Mask& mask : {Mask(), Mask().causal(), Mask().sliding_window(30).key_lengths({90})}) {
    std::vector<float> weights(2 * L * L);
    attention_weights(id.p.qv(), id.p.kv(), MutableTensorView(weights.data(), {1, 2, L, L}), mask,
                      {}, with(kDropout, Kernel::reference));
    // (name, query rows, key rows) of calls that together cover the problem.
    struct Cut {
      const char* name;
      Kernel kernel;
      std::vector<std::pair<int64_t, int64_t>> rows, keys;
    };
    const std::vector<Cut> cuts = {
        {"tile kernel, whole", Kernel::fused, {{0, L}}, {{0, L}}},
        {"reference, whole", Kernel::reference, {{0, L}}, {{0, L}}},
        {"row kernel (5-row frames)", Kernel::fused, {{0, 5}, {5, 8}, {13, 87}}, {{0, L}}},
        {"keys split at 37 (unaligned frames)", Kernel::fused, {{0, L}}, {{0, 37}, {37, 63}}},
        {"row kernel, keys split at 70", Kernel::fused, {{40, 3}}, {{0, 70}, {70, 30}}},
    };
    for (const Cut& cut : cuts) {
      for (const auto& [q0, nq] : cut.rows) {
        for (const auto& [k0, nk] : cut.keys) {
          const std::vector<float> out = id.slice(mask, with(kDropout, cut.kernel), q0, nq, k0, nk);
          for (int64_t h = 0; h < 2; ++h) {
            for (int64_t i = 0; i < nq; ++i) {
              for (int64_t j = 0; j < nk; ++j) {
                const float w = weights[(h * L + q0 + i) * L + k0 + j];
                const float o = out[(h * nq + i) * nk + j];
                ASSERT_EQ(w != 0.0f, o != 0.0f)
                    << cut.name << " " << mask.describe() << " h=" << h << " q=" << q0 + i
                    << " kv=" << k0 + j << ": weight " << w << ", output " << o;
              }
            }
          }
        }
      }
    }
  }
}

TEST(DropoutBitwise, AnyThreadCountAndWithoutBlockSkipping) {
  const RandomProblem p(2, 4, 2, 150, 200, 32, 32, 5);
  const std::vector<float> dout = test::random_values(2 * 4 * 150 * 32, 6);
  for (const Mask& mask : {Mask().causal(), Mask().sliding_window(40)}) {
    for (const DType dtype : {DType::f32, DType::bf16}) {
      const Outputs one = run(p, dtype, mask, with(kDropout, Kernel::fused, 1), &dout);
      const Outputs two = run(p, dtype, mask, with(kDropout, Kernel::fused, 2), &dout);
      Outputs plain;
      {
        const detail::ScopedBlockSkipping no_skipping(false);
        plain = run(p, dtype, mask, with(kDropout, Kernel::fused, 2), &dout);
      }
      for (const Outputs* other : {&two, static_cast<const Outputs*>(&plain)}) {
        EXPECT_EQ(one.out, other->out) << mask.describe() << " " << dtype_name(dtype);
        EXPECT_EQ(one.dq, other->dq) << mask.describe() << " " << dtype_name(dtype);
        EXPECT_EQ(one.dk, other->dk) << mask.describe() << " " << dtype_name(dtype);
        EXPECT_EQ(one.dv, other->dv) << mask.describe() << " " << dtype_name(dtype);
      }
      // Decoding (the row kernel) likewise.
      const RandomProblem decode(1, 8, 2, 1, 3000, 64, 64, 8);
      EXPECT_EQ(run(decode, dtype, mask, with(kDropout, Kernel::fused, 1)).out,
                run(decode, dtype, mask, with(kDropout, Kernel::fused, 2)).out);
    }
  }
}

TEST(DropoutGradients, FiniteDifferencesAgreeInBothKernels) {
  const RandomProblem p(1, 2, 1, 9, 70, 8, 8, 31);
  const std::vector<float> dout = test::random_values(2 * 9 * 8, 32);
  for (const Kernel kernel : {Kernel::reference, Kernel::fused}) {
    for (const Mask& mask : {Mask().causal(Alignment::bottom_right), Mask().key_lengths({50})}) {
      const GradcheckReport report =
          gradcheck(p.qv(), p.kv(), p.vv(), TensorView(dout.data(), {1, 2, 9, 8}), mask, {},
                    with(Dropout{0.4, 9, 1}, kernel));
      EXPECT_TRUE(report.passed) << kernel_name(kernel) << " " << mask.describe();
      for (const GradcheckEntry& entry : report.entries) {
        EXPECT_GT(entry.max_magnitude, 0.0) << entry.tensor;  // something flowed
      }
    }
  }
}

TEST(DropoutEdges, EveryPairDroppedGivesZerosAndTheUndroppedLse) {
  const RandomProblem p(1, 2, 2, 70, 80, 16, 16, 41);
  const std::vector<float> dout = test::random_values(2 * 70 * 16, 42);
  for (const Kernel kernel : {Kernel::reference, Kernel::fused}) {
    const Outputs all =
        run(p, DType::f32, Mask().causal(), with(Dropout{1.0, 3, 0}, kernel), &dout);
    const Outputs none = run(p, DType::f32, Mask().causal(), with({}, kernel));
    for (const float x : all.out) ASSERT_EQ(x, 0.0f) << kernel_name(kernel);
    for (const auto* grad : {&all.dq, &all.dk, &all.dv}) {
      for (const float x : *grad) ASSERT_EQ(x, 0.0f) << kernel_name(kernel);
    }
    EXPECT_EQ(all.lse, none.lse) << kernel_name(kernel);
    // p = 0 with a seed is no dropout at all: the same bits as without.
    EXPECT_EQ(run(p, DType::f32, Mask().causal(), with(Dropout{0.0, 3, 0}, kernel)).out, none.out);
  }
}

// Dropout is unbiased: over n seeds the mean output converges to the undropped output. Each
// element's mean must lie within 5 standard errors (its sample deviation / √n) + 1e-6.
TEST(DropoutStatistics, MeanOverSeedsIsTheUndroppedOutput) {
  const RandomProblem p(1, 2, 1, 40, 90, 16, 16, 51);
  const Mask mask = Mask().causal(Alignment::bottom_right);
  const std::vector<float> exact = run(p, DType::f32, mask, with({})).out;
  const int seeds = 400;
  std::vector<double> sum(exact.size(), 0.0), sum_sq(exact.size(), 0.0);
  for (int seed = 0; seed < seeds; ++seed) {
    const std::vector<float> out =
        run(p, DType::f32, mask, with(Dropout{0.5, uint64_t(seed), 0})).out;
    for (size_t n = 0; n < out.size(); ++n) {
      sum[n] += out[n];
      sum_sq[n] += double{out[n]} * out[n];
    }
  }
  for (size_t n = 0; n < exact.size(); ++n) {
    const double mean = sum[n] / seeds;
    const double deviation = std::sqrt(std::max(0.0, sum_sq[n] / seeds - mean * mean));
    ASSERT_LE(std::fabs(mean - exact[n]), 5 * deviation / std::sqrt(seeds) + 1e-6)
        << "element " << n << ": mean " << mean << ", undropped " << exact[n];
  }
}

}  // namespace
}  // namespace maskattn
