// The attention API with fuzzer-chosen shapes, dtypes, masks, modifiers and values, on small
// sizes: the fused forward and backward must agree with the f64 reference (or both reject the
// input with maskattn::Error), and nothing may crash or touch memory it should not.
//
// Comparisons are made only where the math is well conditioned: finite inputs of moderate size,
// additive masks from {0, −0.5, −2, −inf} and no threshold (a threshold is a step: f32 and f64
// scores may fall on either side of it). Everything else still runs, for the sanitizers.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/block_skipping.h"
#include "core/element.h"
#include "maskattn/attention.h"
#include "maskattn/dtype.h"
#include "maskattn/error.h"
#include "maskattn/paged_kv_cache.h"

namespace {

using namespace maskattn;

std::string g_case;  // the case under test, printed with any failure

struct Tensor {
  DType dtype;
  Dims shape;
  std::vector<uint16_t> words;  // f32 takes two words per element
  Tensor(DType type, Dims dims) : dtype(type), shape(std::move(dims)) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    words.assign(static_cast<size_t>(count) * (dtype == DType::f32 ? 2 : 1), 0);
  }
  int64_t numel() const {
    return static_cast<int64_t>(words.size()) / (dtype == DType::f32 ? 2 : 1);
  }
  void set(int64_t n, float x) { detail::store_float(mutable_view(), n, x); }
  float get(int64_t n) const { return detail::load_float(view(), n); }
  TensorView view() const { return TensorView(words.data(), dtype, shape); }
  MutableTensorView mutable_view() { return MutableTensorView(words.data(), dtype, shape); }
};

// A value from the fuzzer: usually a multiple of 1/16 in [−4, 4]; rarely NaN or ±inf.
float value(FuzzedDataProvider& in, bool& finite) {
  const uint8_t byte = in.ConsumeIntegral<uint8_t>();
  if (byte == 255) {
    finite = false;
    return NAN;
  }
  if (byte == 254) {
    finite = false;
    return -INFINITY;
  }
  return (static_cast<int>(byte) - 127) / 16.0f * 0.5f;
}

// |a − b| ≤ tol·(1 + scale) + slack for every element; NaN only together.
void expect_close(const Tensor& fused, const Tensor& exact, double tol, const char* what,
                  double slack = 0.0) {
  double scale = 0.0;
  for (int64_t n = 0; n < exact.numel(); ++n) {
    if (std::isfinite(exact.get(n))) scale = std::max(scale, std::fabs(double{exact.get(n)}));
  }
  for (int64_t n = 0; n < exact.numel(); ++n) {
    const double a = fused.get(n), b = exact.get(n);
    if (std::isnan(a) != std::isnan(b) || std::fabs(a - b) > tol * (1.0 + scale) + slack) {
      std::fprintf(stderr, "%s: element %lld fused %.9g reference %.9g (scale %.3g)\ncase: %s\n",
                   what, static_cast<long long>(n), a, b, scale, g_case.c_str());
      std::abort();
    }
  }
}

// The sizes of one case: q [B,Hq,Lq,D], k [B,Hkv,Lk,D], v [B,Hkv,Lk,Dv].
struct Shapes {
  int64_t B, Hkv, Hq, Lq, Lk, D, Dv;
};

Shapes consume_shapes(FuzzedDataProvider& in) {
  Shapes s{};
  s.B = in.ConsumeIntegralInRange<int64_t>(1, 2);
  s.Hkv = in.ConsumeIntegralInRange<int64_t>(1, 2);
  s.Hq = s.Hkv * in.ConsumeIntegralInRange<int64_t>(1, 2);
  s.Lq = in.ConsumeIntegralInRange<int64_t>(0, 70);
  s.Lk = in.ConsumeIntegralInRange<int64_t>(0, 70);
  s.D = in.ConsumeIntegralInRange<int64_t>(1, 9);
  s.Dv = in.ConsumeIntegralInRange<int64_t>(0, 5);
  return s;
}

// The mask components and score modifiers the fuzzer picks. False if a component rejected its
// arguments. A threshold makes the kernels incomparable (a step: see the top of this file).
bool consume_mask_and_mods(FuzzedDataProvider& in, const Shapes& s, Mask& mask, ScoreMods& mods,
                           bool& comparable) {
  const uint32_t parts = in.ConsumeIntegral<uint32_t>();
  const auto lengths = [&](int64_t limit) {
    std::vector<int64_t> values(s.B);
    for (int64_t& x : values) x = in.ConsumeIntegralInRange<int64_t>(-1, limit + 1);
    return values;
  };
  try {
    if (parts & 1) mask.causal((parts & 2) ? Alignment::top_left : Alignment::bottom_right);
    if (parts & 4)
      mask.window(in.ConsumeIntegralInRange<int64_t>(-1, 20),
                  in.ConsumeIntegralInRange<int64_t>(-1, 20));
    if (parts & 8) mask.chunk(in.ConsumeIntegralInRange<int64_t>(0, 40));
    if (parts & 16) mask.key_lengths(lengths(s.Lk));
    if (parts & 32) mask.query_lengths(lengths(s.Lq));
    if (parts & 64) mask.key_starts(lengths(s.Lk));
    if (parts & 128) {
      std::vector<int64_t> ids(s.B * s.Lk);
      for (int64_t& x : ids) x = in.ConsumeIntegralInRange<int64_t>(0, 2);
      mask.segments(Array<int64_t>({s.B, s.Lk}, ids), Array<int64_t>({s.B, s.Lk}, ids));
    }
    if (parts & 256) {
      std::vector<uint8_t> keep(s.Lq * s.Lk);
      for (uint8_t& x : keep) x = in.ConsumeBool();
      mask.keep(Array<uint8_t>({s.Lq, s.Lk}, keep));
    }
    if (parts & 512) {
      std::vector<float> additive(s.Lk);
      for (float& x : additive) x = in.PickValueInArray({0.0f, -0.5f, -2.0f, -INFINITY});
      mask.additive(Array<float>({1, 1, 1, s.Lk}, additive));
    }
    if (parts & 1024) {
      const int64_t modulus = in.ConsumeIntegralInRange<int64_t>(2, 5);
      mask.predicate([modulus](int64_t b, int64_t h, int64_t i, int64_t j) {
        return (b + h + i + 2 * j) % modulus != 0;
      });
    }
    if (parts & 2048) mask.prefix_lm(in.ConsumeIntegralInRange<int64_t>(-1, 10));
    if (parts & (1u << 17)) {  // global tokens, one array per side
      std::vector<int64_t> q_ids(s.B * s.Lq), k_ids(s.B * s.Lk);
      for (int64_t& x : q_ids) x = in.ConsumeIntegralInRange<int64_t>(0, 4) == 0;
      for (int64_t& x : k_ids) x = in.ConsumeIntegralInRange<int64_t>(0, 4) == 0;
      mask.global_tokens(Array<int64_t>({s.B, s.Lq}, q_ids), Array<int64_t>({s.B, s.Lk}, k_ids),
                         in.ConsumeBool() ? HeadSet{} : HeadSet{0});
    }
    if (parts & (1u << 18)) {  // a block-sparse layout; block counts off by one now and then
      const int64_t block_q = in.ConsumeIntegralInRange<int64_t>(0, 20);
      const int64_t block_k = in.ConsumeIntegralInRange<int64_t>(1, 20);
      const int64_t n_q =
          (s.Lq + std::max<int64_t>(block_q, 1) - 1) / std::max<int64_t>(block_q, 1);
      const int64_t n_k =
          (s.Lk + block_k - 1) / block_k + in.ConsumeIntegralInRange<int64_t>(0, 8) / 8;
      std::vector<uint8_t> layout(s.Hq * n_q * n_k);
      for (uint8_t& x : layout) x = in.ConsumeBool();
      mask.block_sparse(Array<uint8_t>({s.Hq, n_q, n_k}, layout), block_q, block_k);
    }
    if (parts & 4096) mods.softcap = in.ConsumeIntegralInRange<int>(0, 40) / 4.0;
    if (parts & 8192) {
      for (int64_t h = 0; h < s.Hq; ++h) mods.alibi_slopes.push_back(0.25f * (h + 1));
    }
    if (parts & 16384) {
      std::vector<float> bias(s.Lq * s.Lk);
      for (float& x : bias) x = in.ConsumeIntegralInRange<int>(-8, 8) / 8.0f;
      mods.bias = Array<float>({s.Lq, s.Lk}, bias);
    }
    if (parts & 32768) {
      for (int64_t h = 0; h < s.Hq; ++h)
        mods.sinks.push_back(in.ConsumeIntegralInRange<int>(-8, 8) / 4.0f);
    }
    if (parts & 65536) {
      mods.threshold = in.ConsumeIntegralInRange<int>(-16, 16) / 4.0;
      comparable = false;
    }
  } catch (const Error&) {
    return false;
  }
  return true;
}

std::string describe_case(DType dtype, const Shapes& s, const Mask& mask, const ScoreMods& mods) {
  return std::string(dtype_name(dtype)) + " q " + shape_string({s.B, s.Hq, s.Lq, s.D}) + " k " +
         shape_string({s.B, s.Hkv, s.Lk, s.D}) + " Dv " + std::to_string(s.Dv) + " mask " +
         mask.describe() + " mods:" + (mods.softcap ? " softcap" : "") +
         (mods.alibi_slopes.empty() ? "" : " alibi") + (mods.bias ? " bias" : "") +
         (mods.sinks.empty() ? "" : " sinks") + (mods.threshold ? " threshold" : "");
}

// The same keys and values in a paged cache of a fuzzed format and block size, each sequence of
// its own fuzzed length with its own number of queries: the fused kernel reading the blocks (in
// place, quantized rows decoded in registers) must agree with the reference on the decoded
// values, and for an f32 cache be bitwise the contiguous call with the placed mask.
void check_paged(FuzzedDataProvider& in, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Mask& mask, Options options) {
  const int64_t B = q.shape[0], Hq = q.shape[1], Lq = q.shape[2], Hkv = k.shape[1];
  const int64_t Lk = k.shape[2], D = k.shape[3], Dv = v.shape[3];
  if (Dv == 0 || D == 0) return;  // a cache row has at least one element
  const KVFormat format =
      in.PickValueInArray({KVFormat::f32, KVFormat::f16, KVFormat::bf16, KVFormat::int8,
                           KVFormat::fp8_e4m3, KVFormat::fp8_e5m2});
  const int64_t block = 16 * in.ConsumeIntegralInRange<int64_t>(1, 3);
  PagedKVCache cache(B * ((Lk + block - 1) / block) + 1, block, Hkv, D, format, Dv);
  std::vector<int64_t> ids, query_lengths;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t length = in.ConsumeIntegralInRange<int64_t>(0, Lk);
    ids.push_back(cache.add_sequence());
    query_lengths.push_back(in.ConsumeIntegralInRange<int64_t>(0, std::min(length, Lq)));
    // Batch entry b's first `length` positions, [Hkv, length, width].
    const auto rows = [&](const Tensor& t) {
      const int64_t width = t.shape[3], words = t.dtype == DType::f32 ? 2 : 1;
      return TensorView(t.words.data() + b * Hkv * Lk * width * words, t.dtype,
                        {Hkv, length, width}, {Lk * width, width, 1});
    };
    try {
      cache.append(ids.back(), rows(k), rows(v));
    } catch (const Error&) {
      return;  // a value the cache cannot hold (inf, NaN): refused, nothing to compare
    }
  }
  g_case += std::string(" paged ") + kv_format_name(format) + " block " + std::to_string(block);
  Tensor out(q.dtype, {B, Hq, Lq, Dv}), exact(q.dtype, {B, Hq, Lq, Dv});
  const Mask extra = mask.alignment_is_set() ? Mask() : mask;  // the placement is bottom-right
  bool failed[2] = {false, false};
  for (Kernel kernel : {Kernel::fused, Kernel::reference}) {
    options.kernel = kernel;
    try {
      attention_paged(q.view(), cache, ids, (kernel == Kernel::fused ? out : exact).mutable_view(),
                      query_lengths, extra, {}, options);
    } catch (const Error&) {
      failed[kernel == Kernel::fused ? 0 : 1] = true;
    }
  }
  if (failed[0] != failed[1]) {
    std::fprintf(stderr, "paged: one kernel rejected the input, the other did not\ncase: %s\n",
                 g_case.c_str());
    std::abort();
  }
  if (failed[0]) return;
  const double tol = q.dtype == DType::f32 ? 1e-4 : q.dtype == DType::f16 ? 1e-2 : 5e-2;
  expect_close(out, exact, tol, "paged out");
}

// The forward with both kernels: both must accept or both reject. False if both rejected; else
// the fused kernel's O and LSE are in `out` and `lse`.
bool check_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask,
                   const ScoreMods& mods, Options options, bool comparable, Tensor& out,
                   Tensor& lse) {
  Tensor out_exact(out.dtype, out.shape), lse_exact(DType::f32, lse.shape);
  bool fused_failed = false, exact_failed = false;
  try {
    options.kernel = Kernel::fused;
    attention(q.view(), k.view(), v.view(), out.mutable_view(), mask, mods, options,
              lse.mutable_view());
  } catch (const Error&) {
    fused_failed = true;
  }
  try {
    options.kernel = Kernel::reference;
    attention(q.view(), k.view(), v.view(), out_exact.mutable_view(), mask, mods, options,
              lse_exact.mutable_view());
  } catch (const Error&) {
    exact_failed = true;
  }
  if (fused_failed != exact_failed) {
    std::fprintf(stderr, "one kernel rejected the input, the other did not\n");
    std::abort();
  }
  if (fused_failed) return false;
  const DType dtype = q.dtype;
  const double tol = dtype == DType::f32 ? 1e-4 : dtype == DType::f16 ? 1e-2 : 5e-2;
  if (comparable) {
    expect_close(out, out_exact, tol, "out");
    expect_close(lse, lse_exact, tol, "lse");
  }
  return true;
}

// What rounding in f32 alone costs the fused backward. dS = P∘(dP − D) cancels where dP ≈ D (a
// value vector shared by the keys a row sees makes it exactly 0), so its f32 error is not
// relative to the gradients: D_i = dO_i·O_i takes the forward's rounded O (off from the exact O
// by what the forward check allowed: the exact difference is used here); dP_ij = dO_i·V_j and
// D_i, each a Dv-term f32 dot product, are off by up to 2·Dv·u·Σ_e |dO_ie·V_je| and
// 2·Dv·u·Σ_e |dO_ie·O_ie| (u = 2^-24); and P,
// recomputed as exp(s − lse) from s and lse rounded near u·|s| and u·|lse|, carries a relative
// error δ ≤ 8u·(|s| + |lse|), large where scores are (|s| reaches 30 with D = 4 and inputs up to
// 4). Both reach dS_ij through P_ij, and from there dQ_i = scale·Σ_j dS_ij·K_j,
// dK_j = scale·Σ_i dS_ij·Q_i and dV_j = Σ_i P_ij·dO_i. P and s come from the reference kernel
// (weights and final scores); the sums are in f64.
struct RecomputeSlack {
  double dq = 0, dk = 0, dv = 0;
};

RecomputeSlack recompute_slack(const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& dout, const Tensor& out, const Tensor& lse,
                               const Mask& mask, const ScoreMods& mods, Options options) {
  const int64_t B = q.shape[0], Hq = q.shape[1], Lq = q.shape[2], D = q.shape[3];
  const int64_t Hkv = k.shape[1], Lk = k.shape[2], Dv = v.shape[3], group = Hq / Hkv;
  Tensor weights(DType::f32, {B, Hq, Lq, Lk}), scores(DType::f32, {B, Hq, Lq, Lk});
  Tensor out_exact(out.dtype, out.shape);
  options.kernel = Kernel::reference;
  attention(q.view(), k.view(), v.view(), out_exact.mutable_view(), mask, mods, options);
  attention_weights(q.view(), k.view(), weights.mutable_view(), mask, mods, options);
  attention_scores(q.view(), k.view(), scores.mutable_view(), ScoreStage::final, mask, mods,
                   options);
  double max_q = 0, max_k = 0;
  for (int64_t n = 0; n < q.numel(); ++n) max_q = std::max(max_q, std::fabs(double{q.get(n)}));
  for (int64_t n = 0; n < k.numel(); ++n) max_k = std::max(max_k, std::fabs(double{k.get(n)}));
  const double scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  const double u = 0x1p-24;
  RecomputeSlack slack;
  std::vector<double> dk_sum(B * Hkv * Lk, 0.0), dv_sum(B * Hkv * Lk, 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      for (int64_t i = 0; i < Lq; ++i) {
        const int64_t row = (b * Hq + h) * Lq + i;
        double d_row = 0, d_row_abs = 0, d_error = 0, max_dout = 0, row_sum = 0;
        for (int64_t e = 0; e < Dv; ++e) {
          d_error += double{dout.get(row * Dv + e)} *
                     (double{out.get(row * Dv + e)} - out_exact.get(row * Dv + e));
          d_row += double{dout.get(row * Dv + e)} * out.get(row * Dv + e);
          d_row_abs += std::fabs(double{dout.get(row * Dv + e)} * out.get(row * Dv + e));
          max_dout = std::max(max_dout, std::fabs(double{dout.get(row * Dv + e)}));
        }
        for (int64_t j = 0; j < Lk; ++j) {
          const double p = weights.get(row * Lk + j), score = scores.get(row * Lk + j);
          if (p == 0 || !std::isfinite(score) || !std::isfinite(lse.get(row))) continue;
          const int64_t kv_row = (b * Hkv + h / group) * Lk + j;
          double dp = 0, dp_abs = 0;
          for (int64_t e = 0; e < Dv; ++e) {
            const double term = double{dout.get(row * Dv + e)} * v.get(kv_row * Dv + e);
            dp += term;
            dp_abs += std::fabs(term);
          }
          const double delta = 8 * u * (std::fabs(score) + std::fabs(double{lse.get(row)}));
          const double ds_error = p * (delta * std::fabs(dp - d_row) + std::fabs(d_error) +
                                       2 * Dv * u * (dp_abs + d_row_abs));
          row_sum += ds_error;
          dk_sum[kv_row] += ds_error;
          dv_sum[kv_row] += delta * p * max_dout;
        }
        slack.dq = std::max(slack.dq, scale * max_k * row_sum);
      }
    }
  }
  for (size_t n = 0; n < dk_sum.size(); ++n) {
    slack.dk = std::max(slack.dk, scale * max_q * dk_sum[n]);
    slack.dv = std::max(slack.dv, dv_sum[n]);
  }
  return slack;
}

// The backward, both kernels, from the fused forward's outputs.
void check_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                    const Tensor& out, const Tensor& lse, const Mask& mask, const ScoreMods& mods,
                    Options options, bool comparable) {
  const DType dtype = q.dtype;
  Tensor dq_f(dtype, q.shape), dk_f(dtype, k.shape), dv_f(dtype, v.shape);
  Tensor dq_r(dtype, q.shape), dk_r(dtype, k.shape), dv_r(dtype, v.shape);
  try {
    options.kernel = Kernel::fused;
    attention_backward(q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(),
                       {dq_f.mutable_view(), dk_f.mutable_view(), dv_f.mutable_view(), {}, {}},
                       mask, mods, options);
    options.kernel = Kernel::reference;
    attention_backward(q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(),
                       {dq_r.mutable_view(), dk_r.mutable_view(), dv_r.mutable_view(), {}, {}},
                       mask, mods, options);
  } catch (const Error&) {
    std::fprintf(stderr, "the backward rejected what the forward accepted\n");
    std::abort();
  }
  if (comparable) {
    const int64_t D = q.shape[3], Dv = v.shape[3];
    // The fused backward takes D_i = Σ_e dO_ie·O_ie from the forward's O, rounded to the dtype;
    // the reference recomputes O exactly. With 16-bit O, D_i is off by up to
    // u·Σ_e |dO_ie·O_ie| (u the unit roundoff), which dS = P∘(dP − D) passes on to dQ (at most
    // scale·max|K| per unit of D) and to dK (scale·max|Q| summed over the rows). dV does not
    // use D.
    const double u = dtype == DType::f32 ? 0.0 : dtype == DType::f16 ? 0x1p-11 : 0x1p-8;
    double max_error_d = 0.0, sum_error_d = 0.0, max_q = 0.0, max_k = 0.0;
    for (int64_t row = 0; row < q.shape[0] * q.shape[1] * q.shape[2]; ++row) {
      double sum = 0.0;
      for (int64_t e = 0; e < Dv; ++e) {
        sum += std::fabs(double{dout.get(row * Dv + e)} * out.get(row * Dv + e));
      }
      max_error_d = std::max(max_error_d, 2 * u * sum);
      sum_error_d += 2 * u * sum;
    }
    for (int64_t n = 0; n < q.numel(); ++n) max_q = std::max(max_q, std::fabs(double{q.get(n)}));
    for (int64_t n = 0; n < k.numel(); ++n) max_k = std::max(max_k, std::fabs(double{k.get(n)}));
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    const double grad_tol = dtype == DType::f32 ? 1e-3 : dtype == DType::f16 ? 3e-2 : 1e-1;
    const RecomputeSlack f32 = recompute_slack(q, k, v, dout, out, lse, mask, mods, options);
    expect_close(dq_f, dq_r, grad_tol, "dq", scale * max_k * max_error_d + f32.dq);
    expect_close(dk_f, dk_r, grad_tol, "dk", scale * max_q * sum_error_d + f32.dk);
    expect_close(dv_f, dv_r, grad_tol, "dv", f32.dv);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const DType dtype = in.PickValueInArray({DType::f32, DType::f16, DType::bf16});
  const Shapes s = consume_shapes(in);
  bool comparable = true;
  Mask mask;
  ScoreMods mods;  // score_fn is never set here: the backward takes the same modifiers
  if (!consume_mask_and_mods(in, s, mask, mods, comparable)) return 0;

  g_case = describe_case(dtype, s, mask, mods);
  Tensor q(dtype, {s.B, s.Hq, s.Lq, s.D}), k(dtype, {s.B, s.Hkv, s.Lk, s.D});
  Tensor v(dtype, {s.B, s.Hkv, s.Lk, s.Dv}), dout(dtype, {s.B, s.Hq, s.Lq, s.Dv});
  for (Tensor* t : {&q, &k, &v, &dout}) {
    for (int64_t n = 0; n < t->numel(); ++n) t->set(n, value(in, comparable));
  }

  Options options;
  options.threads = in.ConsumeIntegralInRange<int>(1, 3);
  const detail::ScopedBlockSkipping scoped_skipping(in.ConsumeBool());
  g_case += " threads " + std::to_string(options.threads) +
            (detail::block_skipping() ? "" : " no-skipping");
  Tensor out(dtype, {s.B, s.Hq, s.Lq, s.Dv}), lse(DType::f32, {s.B, s.Hq, s.Lq});
  const bool dropout = in.ConsumeBool();
  const double dropout_p = in.ConsumeProbability<double>();
  const uint64_t dropout_seed = in.ConsumeIntegral<uint64_t>();
  if (!check_forward(q, k, v, mask, mods, options, comparable, out, lse)) return 0;
  check_backward(q, k, v, dout, out, lse, mask, mods, options, comparable);
  if (dropout) {
    // Attention dropout: both kernels must drop the same pairs (the reference applies the
    // definition pair by pair, the fused kernel 64 pairs at a time), so they agree as without.
    options.dropout = Dropout{dropout_p, dropout_seed, 0};
    g_case += " dropout " + std::to_string(dropout_p);
    check_forward(q, k, v, mask, mods, options, comparable, out, lse);
    options.dropout = Dropout{};
  }
  check_paged(in, q, k, v, mask, options);
  return 0;
}
