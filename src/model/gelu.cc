// GELU forward and backward in f32 SIMD (Highway, compiled once per target, dispatched at run
// time), exact-erf form as PyTorch's nn.GELU().
//
// The formula. Both directions need Φ(x) = ½·(1 + erf(x/√2)), the backward also φ(x). Written as
// 1 + erf, Φ loses its relative accuracy in the lower tail (at x = −4, 1 + erf is 6·10⁻⁵ and an f32
// erf's last bit is 6·10⁻⁸ of it: 10⁻³ relative); instead we compute the tail directly and take
// the upper half by symmetry. With a = |x|:
//
//     q = Φ(−a) = e^(−a²/2) · t·P(t − kCentre),   t = 1/(1 + kScale·a)
//     Φ(x) = q for x < 0, 1 − q for x ≥ 0;   gelu = x·Φ(x),   gelu' = Φ(x) + x·e^(−a²/2)/√(2π)
//
// t·P(·) stands for ½·erfcx(a/√2) = ½·e^(a²/2)·erfc(a/√2), which falls smoothly like 1/a, so one
// polynomial of degree 11 in t covers a ∈ [0, 14] (scripts/fit_gelu.py fits it against mpmath,
// rounding coefficients to f32 one at a time: 3.7·10⁻⁸ relative, about half an ulp). Past a = 14,
// q < 10⁻⁴⁴, so q and e^(−a²/2) are set to 0 (then ±inf give gelu(−inf) = NaN, as 1 + erf does,
// and gelu'(±inf) = NaN, as PyTorch's backward gives).
//
// Accuracy, by error source, in units of u = 2⁻²⁴ relative (half an ulp): the fit ≤ 1u; t ≈ 1u
// (one Newton step corrects the sum's and the quotient's roundings), which erfcx's slope amplifies
// by up to about 1.5×; the f32 Horner steps on |t − kCentre| ≤ 0.42, where each term is under half
// the one before, about 1–2u; e^(−a²/2) from Highway's Exp, 2u (one ulp; the rounding of a² is
// corrected to first order with its FMA residual: at large a it would put up to 100·2⁻²⁴ of
// absolute error into the exponent); the two or three products 1u each. Summed, at most about 10u,
// i.e. 5 ulps, usually far less as the errors do not line up. Measured over every 7th f32 with
// |x| in [2⁻³⁰, 16] (2026-12-04, AVX-512): gelu at most 5.4 ulps of the result, gelu' at most
// 3.9 ulps of |Φ| + |x·φ| (the scale of its two terms: gelu' cancels near x ≈ −0.75, as in any
// formula); tests/gelu_test.cc samples every 101st against double std::erfc and bounds both by 6.
// The upper half, 1 − q, carries at most q's absolute error, which relative to Φ ≥ ½ is smaller.
// Where results go subnormal (x < −13.2) the error is bounded in absolute terms (≤ 2⁻¹²⁶).

// Determinism. Every element goes through the same lane arithmetic (the ragged tail too, through
// a padded vector), so the bits do not depend on the thread count, the split into chunks, or where
// a row sits in a batch (the decoders rely on that). They may differ across SIMD targets (FMA or
// not), as the attention kernels' do.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/gelu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>

#include "model/gelu.h"
#include "model/parallel_ranges.h"

HWY_BEFORE_NAMESPACE();
namespace maskattn::model {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// scripts/fit_gelu.py's output.
constexpr float kScale = 0.3535533845424652f;
constexpr float kCentre = 0.584037184715271f;
constexpr float kTail[] = {0.28628167510032654f, 0.39188075065612793f,    0.2939293384552002f,
                           0.04092017933726311f, -0.10202635079622269f,   -0.024133045226335526f,
                           0.05450374260544777f, -0.0036541754379868507f, -0.01980816386640072f,
                           0.03778093308210373f, -0.021848659962415695f,  -0.06513559073209763f};
constexpr float kTailEnd = 14.0f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// The lower tail Φ(−|x|) = e·r, as its two factors: e = e^(−x²/2) (also φ without its constant) and
// r = t·P(t − kCentre) = ½·erfcx(|x|/√2).
template <class V>
struct Tail {
  V e, r;
};

template <class D, class V = hn::Vec<D>>
HWY_INLINE Tail<V> LowerTail(D d, V x) {
  const V a = hn::Abs(x);
  const V clamped = hn::Min(a, hn::Set(d, kTailEnd));
  const V square = hn::Mul(clamped, clamped);
  const V square_error = hn::MulSub(clamped, clamped, square);  // exact: a² − fl(a²)
  const V half = hn::Set(d, 0.5f);
  const V e0 = hn::Exp(d, hn::Neg(hn::Mul(half, square)));
  // e^(−(h + δ)) ≈ e^(−h)·(1 − δ): |δ| ≤ 100·2⁻²⁵, its square is far below an ulp.
  V e = hn::NegMulAdd(e0, hn::Mul(half, square_error), e0);
  e = hn::IfThenZeroElse(hn::Gt(a, hn::Set(d, kTailEnd)), e);
  // t = 1/(1 + kScale·a) to about half an ulp: the sum's rounding error (exact by FMA, as 1 − s is
  // exact) and the quotient's enter one Newton step.
  const V one = hn::Set(d, 1.0f);
  const V scale = hn::Set(d, kScale);
  const V sum = hn::MulAdd(scale, clamped, one);
  const V sum_error = hn::MulAdd(scale, clamped, hn::Sub(one, sum));
  const V t0 = hn::Div(one, sum);
  const V residual = hn::NegMulAdd(t0, sum_error, hn::NegMulAdd(t0, sum, one));
  const V t = hn::MulAdd(t0, residual, t0);
  const V u = hn::Sub(t, hn::Set(d, kCentre));
  constexpr int kDegree = static_cast<int>(sizeof(kTail) / sizeof(kTail[0])) - 1;
  V p = hn::Set(d, kTail[kDegree]);
  for (int k = kDegree - 1; k >= 0; --k) p = hn::MulAdd(p, u, hn::Set(d, kTail[k]));
  return {e, hn::Mul(t, p)};
}

template <class D, class V = hn::Vec<D>>
HWY_INLINE V ForwardVector(D d, V x) {
  const Tail<V> tail = LowerTail(d, x);
  // x·e·r for x < 0 multiplies e last: Φ(x) itself goes subnormal from x ≈ −13.1, x·Φ(x) not yet.
  const V lower = hn::Mul(hn::Mul(x, tail.r), tail.e);
  const V upper = hn::Mul(x, hn::NegMulAdd(tail.e, tail.r, hn::Set(d, 1.0f)));
  return hn::IfThenElse(hn::Lt(x, hn::Zero(d)), lower, upper);
}

template <class D, class V = hn::Vec<D>>
HWY_INLINE V BackwardVector(D d, V x, V dy) {
  const Tail<V> tail = LowerTail(d, x);
  const V q = hn::Mul(tail.e, tail.r);
  const V cdf = hn::IfThenElse(hn::Lt(x, hn::Zero(d)), q, hn::Sub(hn::Set(d, 1.0f), q));
  const V pdf = hn::Mul(tail.e, hn::Set(d, kInvSqrt2Pi));
  return hn::Mul(dy, hn::MulAdd(x, pdf, cdf));
}

void GeluForwardImpl(const float* HWY_RESTRICT x, int64_t count, float* HWY_RESTRICT y) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t n = 0;
  for (; n + N <= count; n += N) hn::StoreU(ForwardVector(d, hn::LoadU(d, x + n)), d, y + n);
  if (n == count) return;
  HWY_ALIGN float rest[hn::MaxLanes(d)] = {};
  for (int64_t k = n; k < count; ++k) rest[k - n] = x[k];
  hn::Store(ForwardVector(d, hn::Load(d, rest)), d, rest);
  for (int64_t k = n; k < count; ++k) y[k] = rest[k - n];
}

// dx may be dy (the same element is read before it is written), hence no HWY_RESTRICT on them.
void GeluBackwardImpl(const float* HWY_RESTRICT x, const float* dy, int64_t count, float* dx) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t n = 0;
  for (; n + N <= count; n += N) {
    hn::StoreU(BackwardVector(d, hn::LoadU(d, x + n), hn::LoadU(d, dy + n)), d, dx + n);
  }
  if (n == count) return;
  HWY_ALIGN float rest_x[hn::MaxLanes(d)] = {};
  HWY_ALIGN float rest_dy[hn::MaxLanes(d)] = {};
  for (int64_t k = n; k < count; ++k) {
    rest_x[k - n] = x[k];
    rest_dy[k - n] = dy[k];
  }
  hn::Store(BackwardVector(d, hn::Load(d, rest_x), hn::Load(d, rest_dy)), d, rest_x);
  for (int64_t k = n; k < count; ++k) dx[k] = rest_x[k - n];
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::model
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace maskattn::model {

HWY_EXPORT(GeluForwardImpl);
HWY_EXPORT(GeluBackwardImpl);

void gelu_forward(const float* x, int64_t count, float* y, int threads) {
  for_chunks(count, threads, [&](int64_t first, int64_t size) {
    HWY_DYNAMIC_DISPATCH(GeluForwardImpl)(x + first, size, y + first);
  });
}

void gelu_backward(const float* x, const float* dy, int64_t count, float* dx, int threads) {
  for_chunks(count, threads, [&](int64_t first, int64_t size) {
    HWY_DYNAMIC_DISPATCH(GeluBackwardImpl)(x + first, dy + first, size, dx + first);
  });
}

}  // namespace maskattn::model
#endif  // HWY_ONCE
