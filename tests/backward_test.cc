// attention_backward(): the f64 reference against central finite differences (gradcheck), the
// fused kernel against the reference over the docs/design.md §5 sweep with the "2× naive error +
// 1e-6" rule, and the exact properties: hidden rows and keys get zero gradients, garbage at hidden
// positions changes nothing, results are bitwise the same for any thread count and with block
// skipping off.
#include <cmath>
#include <cstring>

#include "core/block_skipping.h"
#include "kernels/fused_backward_block.h"
#include "maskattn/cpu.h"
#include "maskattn/gradcheck.h"
#include "test_util.h"

namespace maskattn {
namespace {

using Problem = test::RandomProblem;
using test::DTypeBuffer;
using test::max_error;

struct Grads {
  std::vector<float> dq, dk, dv, dbias, dsinks;
};

// Forward then backward with `options`, inputs and dout rounded to `dtype`.
Grads run_backward(const Problem& p, DType dtype, const Mask& mask, const ScoreMods& mods,
                   const Options& options, const std::vector<float>& dout_values) {
  const DTypeBuffer q(p.q, dtype), k(p.k, dtype), v(p.v, dtype), dout(dout_values, dtype);
  const Dims q_shape = {p.B, p.Hq, p.Lq, p.D}, k_shape = {p.B, p.Hkv, p.Lk, p.D};
  const Dims v_shape = {p.B, p.Hkv, p.Lk, p.Dv}, o_shape = {p.B, p.Hq, p.Lq, p.Dv};
  DTypeBuffer out(std::vector<float>(p.B * p.Hq * p.Lq * p.Dv), dtype);
  std::vector<float> lse(p.B * p.Hq * p.Lq);
  const MutableTensorView lse_view(lse.data(), {p.B, p.Hq, p.Lq});
  attention(q.view(q_shape), k.view(k_shape), v.view(v_shape), out.mutable_view(o_shape), mask,
            mods, options, lse_view);
  DTypeBuffer dq(std::vector<float>(p.q.size(), -7.0f), dtype);
  DTypeBuffer dk(std::vector<float>(p.k.size(), -7.0f), dtype);
  DTypeBuffer dv(std::vector<float>(p.v.size(), -7.0f), dtype);
  Grads result;
  Gradients grads{
      dq.mutable_view(q_shape), dk.mutable_view(k_shape), dv.mutable_view(v_shape), {}, {}};
  if (mods.bias) {
    result.dbias.assign(mods.bias->numel(), -7.0f);
    grads.dbias = MutableTensorView(result.dbias.data(), mods.bias->shape());
  }
  if (!mods.sinks.empty()) {
    result.dsinks.assign(mods.sinks.size(), -7.0f);
    grads.dsinks = MutableTensorView(result.dsinks.data(), {p.Hq});
  }
  attention_backward(q.view(q_shape), k.view(k_shape), v.view(v_shape), out.view(o_shape), lse_view,
                     dout.view(o_shape), grads, mask, mods, options);
  result.dq = dq.floats(p.q.size());
  result.dk = dk.floats(p.k.size());
  result.dv = dv.floats(p.v.size());
  return result;
}

Grads run_kernel(const Problem& p, DType dtype, const Mask& mask, const ScoreMods& mods,
                 Kernel kernel, const std::vector<float>& dout, int threads = 0,
                 bool skipping = true, Products products = Products::automatic) {
  Options options;
  options.kernel = kernel;
  options.threads = threads;
  options.products = products;
  const detail::ScopedBlockSkipping scoped_skipping(skipping);
  return run_backward(p, dtype, mask, mods, options, dout);
}

std::vector<float> random_dout(const Problem& p, uint64_t seed) {
  return test::random_values(p.B * p.Hq * p.Lq * p.Dv, seed);
}

// The naive backward in the dtype under test: inputs rounded to the dtype, then plain f32
// arithmetic over the allowed pairs (S, softmax, O, D, dP, dS and the three products), each
// gradient rounded once.
Grads naive(const Problem& p, DType dtype, const Mask& mask, const std::vector<float>& dout_in) {
  const std::vector<float> q = DTypeBuffer(p.q, dtype).floats(p.q.size());
  const std::vector<float> k = DTypeBuffer(p.k, dtype).floats(p.k.size());
  const std::vector<float> v = DTypeBuffer(p.v, dtype).floats(p.v.size());
  const std::vector<float> dout = DTypeBuffer(dout_in, dtype).floats(dout_in.size());
  const Array<uint8_t> allowed = allowed_pairs(mask, p.shape());
  const float scale = 1.0f / std::sqrt(static_cast<float>(p.D));
  Grads g;
  g.dq.assign(q.size(), 0.0f);
  g.dk.assign(k.size(), 0.0f);
  g.dv.assign(v.size(), 0.0f);
  std::vector<float> s(p.Lk), o(p.Dv);
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.Hq; ++h) {
      const int64_t kv = b * p.Hkv + h / (p.Hq / p.Hkv);
      for (int64_t i = 0; i < p.Lq; ++i) {
        const int64_t row = (b * p.Hq + h) * p.Lq + i;
        float max = -INFINITY;
        for (int64_t j = 0; j < p.Lk; ++j) {
          s[j] = -INFINITY;
          if (!allowed.values()[row * p.Lk + j]) continue;
          float dot = 0.0f;
          for (int64_t d = 0; d < p.D; ++d) dot += q[row * p.D + d] * k[(kv * p.Lk + j) * p.D + d];
          s[j] = scale * dot;
          max = std::max(max, s[j]);
        }
        if (max == -INFINITY) continue;
        float total = 0.0f;
        for (float& x : s) total += (x = std::exp(x - max));
        for (float& x : s) x /= total;
        std::fill(o.begin(), o.end(), 0.0f);
        for (int64_t j = 0; j < p.Lk; ++j) {
          for (int64_t e = 0; e < p.Dv; ++e) o[e] += s[j] * v[(kv * p.Lk + j) * p.Dv + e];
        }
        float D = 0.0f;
        for (int64_t e = 0; e < p.Dv; ++e) D += dout[row * p.Dv + e] * o[e];
        for (int64_t j = 0; j < p.Lk; ++j) {
          if (s[j] == 0.0f) continue;
          float dp = 0.0f;
          for (int64_t e = 0; e < p.Dv; ++e) {
            dp += dout[row * p.Dv + e] * v[(kv * p.Lk + j) * p.Dv + e];
            g.dv[(kv * p.Lk + j) * p.Dv + e] += s[j] * dout[row * p.Dv + e];
          }
          const float ds = s[j] * (dp - D) * scale;
          for (int64_t d = 0; d < p.D; ++d) {
            g.dq[row * p.D + d] += ds * k[(kv * p.Lk + j) * p.D + d];
            g.dk[(kv * p.Lk + j) * p.D + d] += ds * q[row * p.D + d];
          }
        }
      }
    }
  }
  g.dq = DTypeBuffer(g.dq, dtype).floats(g.dq.size());
  g.dk = DTypeBuffer(g.dk, dtype).floats(g.dk.size());
  g.dv = DTypeBuffer(g.dv, dtype).floats(g.dv.size());
  return g;
}

// What D_i = Σ dO·O computed from the forward's output rounded to `dtype` (as every unit does) may
// cost beyond the rule, per tensor: dS_ij = P_ij (dP_ij − D_i) carries δD_i = Σ dO·(O_rounded −
// O_exact) into dQ_i (scale·|δD_i|·Σ_j P_ij|K_j|) and dK_j (scale·Σ_i P_ij|δD_i||Q_i|). A key
// seen by many queries (a global token) sums many such errors, which a slack relative to the
// largest gradient alone does not bound.
struct RoundedOutputSlack {
  float dq = 0, dk = 0;
};

double row_max_abs(const std::vector<float>& x, int64_t row, int64_t width) {
  double largest = 0;
  for (int64_t d = 0; d < width; ++d) {
    largest = std::max(largest, std::fabs(double{x[row * width + d]}));
  }
  return largest;
}

RoundedOutputSlack rounded_output_slack(const Problem& p, DType dtype, const Mask& mask,
                                        const std::vector<float>& dout, Products products) {
  const Problem r = test::rounded_to(p, dtype);
  const std::vector<float> dout_r = DTypeBuffer(dout, dtype).floats(dout.size());
  const Dims o_shape = {p.B, p.Hq, p.Lq, p.Dv};
  // The forward exactly as run_backward runs it (same bits), and the exact output and weights.
  DTypeBuffer out(std::vector<float>(p.B * p.Hq * p.Lq * p.Dv), dtype);
  const DTypeBuffer q(p.q, dtype), k(p.k, dtype), v(p.v, dtype);
  Options options;
  options.products = products;
  attention(q.view({p.B, p.Hq, p.Lq, p.D}), k.view({p.B, p.Hkv, p.Lk, p.D}),
            v.view({p.B, p.Hkv, p.Lk, p.Dv}), out.mutable_view(o_shape), mask, {}, options);
  const std::vector<float> rounded_out = out.floats(p.B * p.Hq * p.Lq * p.Dv);
  std::vector<float> exact_out(rounded_out.size()), weights(p.B * p.Hq * p.Lq * p.Lk);
  Options reference;
  reference.kernel = Kernel::reference;
  attention(r.qv(), r.kv(), r.vv(), MutableTensorView(exact_out.data(), o_shape), mask, {},
            reference);
  attention_weights(r.qv(), r.kv(), MutableTensorView(weights.data(), {p.B, p.Hq, p.Lq, p.Lk}),
                    mask, {}, reference);
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.D));
  std::vector<double> dk_sum(p.B * p.Hkv * p.Lk, 0.0);
  RoundedOutputSlack slack;
  for (int64_t row = 0; row < p.B * p.Hq * p.Lq; ++row) {
    double delta_d = 0;
    for (int64_t e = 0; e < p.Dv; ++e) {
      const int64_t n = row * p.Dv + e;
      delta_d += double{dout_r[n]} * (double{rounded_out[n]} - exact_out[n]);
    }
    const int64_t b = row / (p.Hq * p.Lq), h = row / p.Lq % p.Hq;
    const int64_t kv_first = (b * p.Hkv + h / (p.Hq / p.Hkv)) * p.Lk;
    double dq_sum = 0;
    for (int64_t j = 0; j < p.Lk; ++j) {
      const double weight = weights[row * p.Lk + j];
      dq_sum += weight * row_max_abs(r.k, kv_first + j, p.D);
      dk_sum[kv_first + j] += weight * std::fabs(delta_d) * row_max_abs(r.q, row, p.D);
    }
    slack.dq = std::max(slack.dq, static_cast<float>(scale * std::fabs(delta_d) * dq_sum));
  }
  for (const double sum : dk_sum) slack.dk = std::max(slack.dk, static_cast<float>(scale * sum));
  return slack;
}

// docs/design.md §5: the fused gradients' max error against the f64 reference (on the same rounded
// inputs) is at most 2× the naive implementation's in the same dtype, plus 1e-6, per tensor.
// `slack`: an extra allowance relative to the largest exact gradient, plus what the rounded output
// costs in D (the unit sweep's; see there).
void expect_within_rule(const Problem& p, DType dtype, const Mask& mask, const std::string& what,
                        Products products = Products::automatic, float slack = 0.0f) {
  const std::vector<float> dout = random_dout(p, p.q.size() + 3);
  const Grads fused = run_kernel(p, dtype, mask, {}, Kernel::fused, dout, 0, true, products);
  const Problem rounded = test::rounded_to(p, dtype);
  const std::vector<float> dout_rounded = DTypeBuffer(dout, dtype).floats(dout.size());
  const Grads exact = run_kernel(rounded, DType::f32, mask, {}, Kernel::reference, dout_rounded);
  const Grads plain = naive(p, dtype, mask, dout);
  const RoundedOutputSlack d_slack =
      slack > 0 ? rounded_output_slack(p, dtype, mask, dout, products) : RoundedOutputSlack{};
  for (const auto& [name, f, e, n, extra] :
       {std::tuple{"dq", &fused.dq, &exact.dq, &plain.dq, d_slack.dq},
        std::tuple{"dk", &fused.dk, &exact.dk, &plain.dk, d_slack.dk},
        std::tuple{"dv", &fused.dv, &exact.dv, &plain.dv, 0.0f}}) {
    const float naive_error = max_error(*n, *e), fused_error = max_error(*f, *e);
    float largest = 0.0f;
    for (const float x : *e) largest = std::max(largest, std::fabs(x));
    EXPECT_LE(fused_error, 2 * naive_error + 1e-6f + slack * largest + extra)
        << what << " " << name << " dtype " << dtype_name(dtype) << ": fused " << fused_error
        << ", naive " << naive_error;
  }
}

// ---- the reference and the fused kernel against finite differences ----

std::vector<std::pair<std::string, Mask>> small_masks(int64_t B, int64_t Lq, int64_t Lk) {
  return {
      {"none", Mask()},
      {"causal", Mask().causal()},
      {"causal top-left", Mask().causal(Alignment::top_left)},
      {"sliding window 2", Mask().sliding_window(2)},
      {"window(1,1) & chunk(3)", Mask().window(1, 1).chunk(3)},
      {"padding", Mask()
                      .causal()
                      .key_lengths(std::vector<int64_t>(B, Lk - 2))
                      .query_lengths(std::vector<int64_t>(B, Lq - 1))},
      {"left padding", Mask().causal().key_starts(std::vector<int64_t>(B, 2))},
      {"dense keep", Mask().keep(Array<uint8_t>({Lq, Lk},
                                                [&] {
                                                  std::vector<uint8_t> keep(Lq * Lk);
                                                  for (int64_t n = 0; n < Lq * Lk; ++n)
                                                    keep[n] = n % 3 != 1;
                                                  return keep;
                                                }()))},
      {"additive", Mask().additive(Array<float>({Lk},
                                                [&] {
                                                  std::vector<float> values(Lk);
                                                  for (int64_t j = 0; j < Lk; ++j)
                                                    values[j] = j % 3 == 0 ? -INFINITY : -0.5f * j;
                                                  return values;
                                                }()))},
      {"predicate", Mask().predicate([](int64_t, int64_t h, int64_t i, int64_t j) {
         return (i + 2 * j + h) % 4 != 3;
       })},
      {"token ids", Mask().causal().key_pad_id(Array<int64_t>({B, Lk},
                                                              [&] {
                                                                std::vector<int64_t> ids(B * Lk, 7);
                                                                for (int64_t b = 0; b < B; ++b)
                                                                  ids[b * Lk + Lk - 1 - b] =
                                                                      0;  // <pad> = 0
                                                                return ids;
                                                              }()),
                                               0)},
      {"segments", Mask().segments(Array<int64_t>({B, Lq}, std::vector<int64_t>(B * Lq, 1)),
                                   Array<int64_t>({B, Lk},
                                                  [&] {
                                                    std::vector<int64_t> ids(B * Lk);
                                                    for (int64_t n = 0; n < B * Lk; ++n)
                                                      ids[n] = n % Lk < 3;
                                                    return ids;
                                                  }()))},
      {"spans & prefix", Mask()
                             .causal()
                             .spans(Array<int64_t>({B, Lq}, std::vector<int64_t>(B * Lq, 1)),
                                    Array<int64_t>({B, Lk},
                                                   [&] {
                                                     std::vector<int64_t> ids(B * Lk);
                                                     for (int64_t n = 0; n < B * Lk; ++n)
                                                       ids[n] = n % Lk < 4;
                                                     return ids;
                                                   }()))
                             .prefix_lm(2)},
      {"blocked", Mask().blocked(Array<uint8_t>({Lq, Lk},
                                                [&] {
                                                  std::vector<uint8_t> blocked(Lq * Lk);
                                                  for (int64_t n = 0; n < Lq * Lk; ++n)
                                                    blocked[n] = n % 4 == 2;
                                                  return blocked;
                                                }()))},
      {"per head", Mask().causal(HeadSet{0}).sliding_window(2, HeadSet{1})},
      {"causal & global tokens",
       Mask().causal().global_tokens(Array<int64_t>({Lq},
                                                    [&] {
                                                      std::vector<int64_t> ids(Lq, 0);
                                                      ids[0] = 1;  // the first query: global
                                                      return ids;
                                                    }()),
                                     Array<int64_t>({Lk},
                                                    [&] {
                                                      std::vector<int64_t> ids(Lk, 0);
                                                      ids[Lk - 1] = 1;  // the last key: global
                                                      return ids;
                                                    }()))},
      {"block-sparse 2x3 & window(1,1)",
       Mask().window(1, 1).block_sparse(Array<uint8_t>({(Lq + 1) / 2, (Lk + 2) / 3},
                                                       [&] {
                                                         std::vector<uint8_t> layout(
                                                             ((Lq + 1) / 2) * ((Lk + 2) / 3));
                                                         for (size_t n = 0; n < layout.size(); ++n)
                                                           layout[n] = n % 3 != 2;
                                                         return layout;
                                                       }()),
                                        2, 3)},
  };
}

void expect_gradcheck(const Problem& p, const Mask& mask, const ScoreMods& mods, Kernel kernel,
                      const std::string& what) {
  const std::vector<float> dout = random_dout(p, 5);
  Options options;
  options.kernel = kernel;
  const GradcheckReport report =
      gradcheck(p.qv(), p.kv(), p.vv(), TensorView(dout.data(), {p.B, p.Hq, p.Lq, p.Dv}), mask,
                mods, options);
  EXPECT_TRUE(report.passed) << what;
  for (const GradcheckEntry& entry : report.entries) {
    EXPECT_LE(entry.max_relative_error, report.tolerance)
        << what << " " << entry.tensor << " (max |fd| " << entry.max_magnitude << ")";
    EXPECT_GT(entry.max_magnitude, 0.0) << what << " " << entry.tensor << ": nothing was checked";
  }
}

TEST(BackwardGradcheck, EveryMaskBothKernels) {
  const Problem p(2, 2, 1, 5, 7, 3, 2, 11, 1.5f);
  for (const auto& [name, mask] : small_masks(p.B, p.Lq, p.Lk)) {
    expect_gradcheck(p, mask, {}, Kernel::reference, "reference " + name);
    expect_gradcheck(p, mask, {}, Kernel::fused, "fused " + name);
  }
}

TEST(BackwardGradcheck, ModifiersBothKernels) {
  const Problem p(1, 2, 2, 6, 5, 4, 3, 12, 2.0f);
  ScoreMods softcap;
  softcap.softcap = 1.5;
  ScoreMods alibi;
  alibi.alibi_slopes = {0.5f, 0.25f};
  ScoreMods bias;
  bias.bias = Array<float>({2, 1, 5}, test::random_values(10, 3));  // broadcast over queries
  ScoreMods sinks;
  sinks.sinks = {0.3f, -0.7f};
  ScoreMods all = softcap;
  all.alibi_slopes = alibi.alibi_slopes;
  all.bias = Array<float>({6, 5}, test::random_values(30, 4));
  all.sinks = sinks.sinks;
  ScoreMods threshold;
  threshold.threshold = -100.0;  // hides nothing here: the gradient is the plain one
  const Mask additive = Mask().causal().additive(
      Array<float>({5}, std::vector<float>{0.0f, -1.0f, -INFINITY, 0.5f, -2.0f}));
  for (const auto& [name, mods] : {std::pair{"softcap", softcap},
                                   {"alibi", alibi},
                                   {"bias", bias},
                                   {"sinks", sinks},
                                   {"all", all},
                                   {"threshold", threshold}}) {
    for (const Mask& mask : {Mask(), additive}) {
      expect_gradcheck(p, mask, mods, Kernel::reference, std::string("reference ") + name);
      expect_gradcheck(p, mask, mods, Kernel::fused, std::string("fused ") + name);
    }
  }
}

TEST(BackwardGradcheck, HalfPrecisionWithinTheDtypeTolerance) {
  // The analytic gradient in f16/bf16 (O and the gradients rounded to the dtype) against finite
  // differences on the same rounded inputs: gradcheck's default tolerances, 1e-2 and 5e-2.
  const Problem p(1, 2, 1, 9, 11, 4, 3, 14, 1.5f);
  const std::vector<float> dout = random_dout(p, 15);
  for (DType dtype : {DType::f16, DType::bf16}) {
    const DTypeBuffer q(p.q, dtype), k(p.k, dtype), v(p.v, dtype), d(dout, dtype);
    for (const auto& [name, mask] : small_masks(p.B, p.Lq, p.Lk)) {
      const GradcheckReport report =
          gradcheck(q.view({p.B, p.Hq, p.Lq, p.D}), k.view({p.B, p.Hkv, p.Lk, p.D}),
                    v.view({p.B, p.Hkv, p.Lk, p.Dv}), d.view({p.B, p.Hq, p.Lq, p.Dv}), mask);
      EXPECT_TRUE(report.passed) << dtype_name(dtype) << " " << name;
      for (const GradcheckEntry& entry : report.entries) {
        EXPECT_LE(entry.max_relative_error, report.tolerance)
            << dtype_name(dtype) << " " << name << " " << entry.tensor;
      }
    }
  }
}

TEST(BackwardGradcheck, AcrossTileEdgesFused) {
  // 65 queries and 70 keys: two tiles each way, partial tiles on the diagonal.
  const Problem p(1, 1, 1, 65, 70, 2, 2, 13);
  for (const Mask& mask : {Mask().causal(), Mask().sliding_window(9)}) {
    expect_gradcheck(p, mask, {}, Kernel::fused, mask.describe());
  }
}

// ---- the fused kernel against the reference ----

TEST(BackwardSweep, EveryMaskAcrossTileEdges) {
  test::for_each_edge_case(300, [](const Problem& p, const Mask& mask, const std::string& what) {
    expect_within_rule(p, DType::f32, mask, what);
  });
}

TEST(BackwardSweep, HalfPrecisionInputs) {
  test::for_each_half_precision_case(
      [](const Problem& p, DType dtype, const Mask& mask, const std::string& what) {
        expect_within_rule(p, dtype, mask, what);
      });
}

TEST(BackwardSweep, LongSequence) {
  const Problem p(1, 2, 1, 1000, 1000, 64, 64, 7);
  for (const Mask& mask : {Mask(), Mask().causal(), Mask().sliding_window(100)}) {
    expect_within_rule(p, DType::f32, mask, "L=1000 " + mask.describe());
  }
}

TEST(BackwardModifiers, FusedMatchesTheReference) {
  const Problem p(2, 4, 2, 70, 150, 32, 16, 77, 3.0f);
  ScoreMods mods;
  mods.softcap = 5.0;
  mods.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  mods.bias = Array<float>({4, 70, 150}, test::random_values(4 * 70 * 150, 9));
  mods.sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  mods.threshold = -6.0;
  const Mask mask =
      Mask().causal().additive(Array<float>({150}, test::random_values(150, 4, -2, 0)));
  const std::vector<float> dout = random_dout(p, 8);
  const Grads fused = run_kernel(p, DType::f32, mask, mods, Kernel::fused, dout);
  const Grads oracle = run_kernel(p, DType::f32, mask, mods, Kernel::reference, dout);
  EXPECT_LE(max_error(fused.dq, oracle.dq), 2e-5);
  EXPECT_LE(max_error(fused.dk, oracle.dk), 2e-5);
  EXPECT_LE(max_error(fused.dv, oracle.dv), 2e-5);
  EXPECT_LE(max_error(fused.dbias, oracle.dbias), 2e-5);  // summed over the batch
  EXPECT_LE(max_error(fused.dsinks, oracle.dsinks), 2e-5);
}

// ---- exact properties ----

TEST(BackwardProperties, HiddenRowsAndKeysGetExactZeros) {
  // Query padding hides rows 60..69; key padding hides keys 100..149 from every query.
  const Problem p(2, 2, 1, 70, 150, 16, 8, 21);
  const Mask mask = Mask().causal().query_lengths({60, 60}).key_lengths({100, 100});
  std::vector<float> dout = random_dout(p, 22);
  for (int64_t n = 0; n < p.B * p.Hq; ++n) {  // dO of hidden rows is anything, even NaN
    for (int64_t i = 60; i < 70; ++i) dout[(n * 70 + i) * p.Dv] = NAN;
  }
  for (Kernel kernel : {Kernel::fused, Kernel::reference}) {
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      const Grads g = run_kernel(p, dtype, mask, {}, kernel, dout);
      for (int64_t n = 0; n < p.B * p.Hq; ++n) {
        for (int64_t i = 0; i < 70; ++i) {
          for (int64_t d = 0; d < p.D; ++d) {
            const float x = g.dq[(n * 70 + i) * p.D + d];
            if (i >= 60) {
              ASSERT_EQ(x, 0.0f) << "row " << i;
            } else {
              ASSERT_TRUE(std::isfinite(x));
            }
          }
        }
      }
      for (int64_t n = 0; n < p.B * p.Hkv; ++n) {
        for (int64_t j = 100; j < 150; ++j) {
          for (int64_t d = 0; d < p.D; ++d) ASSERT_EQ(g.dk[(n * 150 + j) * p.D + d], 0.0f);
          for (int64_t e = 0; e < p.Dv; ++e) ASSERT_EQ(g.dv[(n * 150 + j) * p.Dv + e], 0.0f);
        }
      }
    }
  }
}

TEST(BackwardProperties, HiddenRowsWithASinkGiveTheSinkNoGradient) {
  // With a sink, a fully hidden row has all its weight on the sink and O = 0 whatever the sink's
  // logit: it adds nothing to dsinks, even when its dO is NaN.
  const Problem p(1, 2, 1, 70, 80, 8, 8, 31);
  ScoreMods mods;
  mods.sinks = {0.5f, -1.0f};
  const Mask mask = Mask().causal().query_lengths({66});
  std::vector<float> dout = random_dout(p, 32);
  for (int64_t h = 0; h < 2; ++h) dout[(h * 70 + 68) * 8 + 3] = NAN;
  const Grads fused = run_kernel(p, DType::f32, mask, mods, Kernel::fused, dout);
  const Grads oracle = run_kernel(p, DType::f32, mask, mods, Kernel::reference, dout);
  ASSERT_EQ(fused.dsinks.size(), 2u);
  EXPECT_TRUE(std::isfinite(fused.dsinks[0]) && std::isfinite(fused.dsinks[1]));
  EXPECT_LE(max_error(fused.dsinks, oracle.dsinks), 1e-5);
  EXPECT_LE(max_error(fused.dq, oracle.dq), 1e-5);
}

TEST(BackwardProperties, GarbageAtHiddenPositionsChangesNothing) {
  const Problem clean(1, 2, 2, 70, 130, 16, 8, 23);
  const Mask mask = Mask().causal().query_lengths({64}).key_lengths({100});
  Problem dirty = clean;
  for (int64_t n = 0; n < 2; ++n) {
    for (int64_t j = 100; j < 130; ++j) {
      dirty.k[(n * 130 + j) * 16] = INFINITY;
      dirty.v[(n * 130 + j) * 8 + 1] = NAN;
    }
    for (int64_t i = 64; i < 70; ++i) dirty.q[(n * 70 + i) * 16 + 2] = -INFINITY;
  }
  const std::vector<float> dout = random_dout(clean, 24);
  const Grads a = run_kernel(clean, DType::f32, mask, {}, Kernel::fused, dout);
  const Grads b = run_kernel(dirty, DType::f32, mask, {}, Kernel::fused, dout);
  const Grads r = run_kernel(dirty, DType::f32, mask, {}, Kernel::reference, dout);
  EXPECT_LE(max_error(a.dq, b.dq), 1e-6);
  EXPECT_LE(max_error(a.dk, b.dk), 1e-6);
  EXPECT_LE(max_error(a.dv, b.dv), 1e-6);
  EXPECT_LE(max_error(r.dq, b.dq), 1e-5);
  EXPECT_LE(max_error(r.dk, b.dk), 1e-5);
}

TEST(BackwardProperties, SparseComponentsEqualTheirDenseKeepBitwise) {
  // Global tokens and block-sparse layouts only choose tiles; the gradients are the same bits as
  // with a dense keep mask of the same pairs.
  const Problem p(2, 4, 2, 127, 65, 16, 16, 27);
  const std::vector<float> dout = random_dout(p, 28);
  for (const auto& [name, mask] : test::sparse_sweep_masks(p)) {
    const Mask dense = Mask().keep(allowed_pairs(mask, p.shape()));
    for (const DType dtype : {DType::f32, DType::bf16}) {
      const Grads sparse = run_kernel(p, dtype, mask, {}, Kernel::fused, dout);
      const Grads dense_grads = run_kernel(p, dtype, dense, {}, Kernel::fused, dout);
      EXPECT_EQ(sparse.dq, dense_grads.dq) << name;
      EXPECT_EQ(sparse.dk, dense_grads.dk) << name;
      EXPECT_EQ(sparse.dv, dense_grads.dv) << name;
    }
  }
}

TEST(BackwardProperties, BitwiseForAnyThreadCountAndWithoutSkipping) {
  const Problem p(2, 4, 2, 150, 200, 32, 24, 25);
  const std::vector<float> dout = random_dout(p, 26);
  ScoreMods mods;
  mods.bias = Array<float>({150, 200}, test::random_values(150 * 200, 27));  // shared by b and h
  for (const Mask& mask : {Mask().causal(), Mask().sliding_window(50).key_lengths({180, 120})}) {
    for (const ScoreMods& m : {ScoreMods{}, mods}) {
      const Grads one = run_kernel(p, DType::f32, mask, m, Kernel::fused, dout, 1);
      for (const auto& [threads, skipping] : {std::pair{2, true}, {3, true}, {2, false}}) {
        const Grads other =
            run_kernel(p, DType::f32, mask, m, Kernel::fused, dout, threads, skipping);
        EXPECT_EQ(one.dq, other.dq) << threads << " threads, skipping " << skipping;
        EXPECT_EQ(one.dk, other.dk) << threads << " threads, skipping " << skipping;
        EXPECT_EQ(one.dv, other.dv) << threads << " threads, skipping " << skipping;
        EXPECT_EQ(one.dbias, other.dbias) << threads << " threads, skipping " << skipping;
      }
      const Grads ref1 = run_kernel(p, DType::f32, mask, m, Kernel::reference, dout, 1);
      const Grads ref2 = run_kernel(p, DType::f32, mask, m, Kernel::reference, dout, 2);
      EXPECT_EQ(ref1.dq, ref2.dq);
      EXPECT_EQ(ref1.dk, ref2.dk);
    }
  }
}

TEST(BackwardProperties, GqaEqualsRepeatedKvHeads) {
  // Hq = 4 sharing Hkv = 1 against the same K, V repeated 4 times: dK, dV of the shared head are
  // the sums of the repeated heads' gradients.
  const Problem shared(1, 4, 1, 70, 90, 16, 8, 28);
  Problem repeated = shared;
  repeated.Hkv = 4;
  repeated.k.clear();
  repeated.v.clear();
  for (int n = 0; n < 4; ++n) {
    repeated.k.insert(repeated.k.end(), shared.k.begin(), shared.k.end());
    repeated.v.insert(repeated.v.end(), shared.v.begin(), shared.v.end());
  }
  const std::vector<float> dout = random_dout(shared, 29);
  const Mask mask = Mask().causal();
  const Grads a = run_kernel(shared, DType::f32, mask, {}, Kernel::fused, dout);
  const Grads b = run_kernel(repeated, DType::f32, mask, {}, Kernel::fused, dout);
  EXPECT_EQ(a.dq, b.dq);  // the same arithmetic per query row
  for (size_t n = 0; n < a.dk.size(); ++n) {
    float sum = 0.0f;
    for (int r = 0; r < 4; ++r) sum += b.dk[r * a.dk.size() + n];
    ASSERT_NEAR(a.dk[n], sum, 1e-5f);
  }
  for (size_t n = 0; n < a.dv.size(); ++n) {
    float sum = 0.0f;
    for (int r = 0; r < 4; ++r) sum += b.dv[r * a.dv.size() + n];
    ASSERT_NEAR(a.dv[n], sum, 1e-5f);
  }
}

TEST(BackwardBits, TransposeMatchesTheDefinition) {
  uint64_t bits[64], expected[64] = {};
  for (int r = 0; r < 64; ++r) bits[r] = 0x9E3779B97F4A7C15ull * (r + 1) ^ (uint64_t{1} << r);
  for (int r = 0; r < 64; ++r) {
    for (int c = 0; c < 64; ++c) expected[c] |= ((bits[r] >> c) & 1) << r;
  }
  detail::fused::transpose_bits(bits);
  for (int r = 0; r < 64; ++r) ASSERT_EQ(bits[r], expected[r]) << r;
}

// ---- every product unit of the bf16 backward, forced one at a time ----
// AMX takes D and Dv multiples of 32 and tile pairs with finite inputs; other shapes and tile
// pairs holding garbage run the f32 products, as does every other unit (the backward has no
// vdpbf16ps products: bf16-dot means f32 there, so it is not run twice). AMX on a CPU without it
// is SKIPPED with the reason: not tested here, which is not a pass.

class BackwardUnit : public testing::TestWithParam<Products> {
 protected:
  void SetUp() override {
    const CpuReport cpu = cpu_report();
    if (GetParam() == Products::amx && !cpu.amx_permitted) {
      GTEST_SKIP() << "NOT TESTED: this CPU has no usable AMX-BF16 (" << cpu.model
                   << "), so the AMX backward could not run";
    }
  }
  Products unit() const { return GetParam(); }
};

TEST_P(BackwardUnit, EveryMaskAcrossTileEdges) {
  // The rule plus 2^-8 of the largest gradient: every unit computes D_i = Σ dO·O from the
  // forward's output rounded to bf16 (as FlashAttention does), where the naive backward uses its
  // own f32 O; on the tiny shapes of this sweep that alone can exceed twice the naive error.
  constexpr float kSlack = 1.0f / 256;
  test::for_each_edge_case(500, [&](const Problem& p, const Mask& mask, const std::string& what) {
    expect_within_rule(p, DType::bf16, mask, what, unit(), kSlack);
  });
  const Problem longer(1, 4, 2, 300, 330, 64, 32, 501);
  for (const Mask& mask : {Mask(), Mask().causal(), Mask().sliding_window(100)}) {
    expect_within_rule(longer, DType::bf16, mask, "L=300 " + mask.describe(), unit(), kSlack);
  }
}

TEST_P(BackwardUnit, ModifiersAndSinksMatchTheReference) {
  const Problem p(1, 2, 1, 100, 130, 64, 64, 41, 2.0f);
  ScoreMods mods;
  mods.softcap = 5.0;
  mods.alibi_slopes = {0.5f, 0.125f};
  mods.bias = Array<float>({100, 130}, test::random_values(100 * 130, 42));
  mods.sinks = {0.5f, -1.0f};
  const std::vector<float> dout = random_dout(p, 43);
  const Grads fused =
      run_kernel(p, DType::bf16, Mask().causal(), mods, Kernel::fused, dout, 0, true, unit());
  const Grads exact =
      run_kernel(test::rounded_to(p, DType::bf16), DType::f32, Mask().causal(), mods,
                 Kernel::reference, DTypeBuffer(dout, DType::bf16).floats(dout.size()));
  for (const auto& [name, f, e] :
       {std::tuple{"dq", &fused.dq, &exact.dq}, std::tuple{"dk", &fused.dk, &exact.dk},
        std::tuple{"dv", &fused.dv, &exact.dv}, std::tuple{"dbias", &fused.dbias, &exact.dbias},
        std::tuple{"dsinks", &fused.dsinks, &exact.dsinks}}) {
    float largest = 1.0f;
    for (const float x : *e) largest = std::max(largest, std::fabs(x));
    EXPECT_LE(max_error(*f, *e), 1e-2f * largest) << name;  // bf16: 2^-8 relative, and P, dS
  }
}

TEST_P(BackwardUnit, BitwiseForAnyThreadCountAndWithoutSkipping) {
  const Problem p(2, 4, 2, 150, 200, 64, 64, 25);
  const std::vector<float> dout = random_dout(p, 26);
  for (const Mask& mask : {Mask().causal(), Mask().sliding_window(50).key_lengths({180, 120})}) {
    const Grads one = run_kernel(p, DType::bf16, mask, {}, Kernel::fused, dout, 1, true, unit());
    for (const auto& [threads, skipping] : {std::pair{2, true}, {2, false}}) {
      const Grads other =
          run_kernel(p, DType::bf16, mask, {}, Kernel::fused, dout, threads, skipping, unit());
      EXPECT_EQ(one.dq, other.dq) << threads << " threads, skipping " << skipping;
      EXPECT_EQ(one.dk, other.dk) << threads << " threads, skipping " << skipping;
      EXPECT_EQ(one.dv, other.dv) << threads << " threads, skipping " << skipping;
    }
  }
}

TEST_P(BackwardUnit, GarbageAtHiddenPositionsStaysOut) {
  // Tiles holding garbage take the guarded f32 products, the others the unit's: compared with the
  // reference, not bitwise with the clean run.
  const Problem clean(1, 2, 2, 130, 200, 64, 64, 23);
  const Mask mask = Mask().causal().query_lengths({120}).key_lengths({170});
  Problem dirty = clean;
  for (int64_t n = 0; n < 2; ++n) {
    for (int64_t j = 170; j < 200; ++j) {
      dirty.k[(n * 200 + j) * 64] = INFINITY;
      dirty.v[(n * 200 + j) * 64 + 1] = NAN;
    }
    for (int64_t i = 120; i < 130; ++i) dirty.q[(n * 130 + i) * 64 + 2] = -INFINITY;
  }
  const std::vector<float> dout = random_dout(clean, 24);
  const Grads b = run_kernel(dirty, DType::bf16, mask, {}, Kernel::fused, dout, 0, true, unit());
  const Grads r = run_kernel(test::rounded_to(dirty, DType::bf16), DType::f32, mask, {},
                             Kernel::reference, DTypeBuffer(dout, DType::bf16).floats(dout.size()));
  EXPECT_LE(max_error(r.dq, b.dq), 2e-2);
  EXPECT_LE(max_error(r.dk, b.dk), 2e-2);
  EXPECT_LE(max_error(r.dv, b.dv), 2e-2);
}

INSTANTIATE_TEST_SUITE_P(Units, BackwardUnit, testing::Values(Products::f32, Products::amx),
                         [](const testing::TestParamInfo<Products>& info) {
                           return std::string(products_name(info.param));
                         });

}  // namespace
}  // namespace maskattn
