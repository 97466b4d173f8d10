// SIMD helpers shared by the fused forward and backward kernels, compiled once per Highway target
// (the "-inl.h" convention: re-included by each target pass of foreach_target.h).
#if defined(MASKATTN_KERNELS_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MASKATTN_KERNELS_SIMD_INL_H_
#undef MASKATTN_KERNELS_SIMD_INL_H_
#else
#define MASKATTN_KERNELS_SIMD_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace maskattn::detail::fused {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// exp(x) for the arguments the online softmax produces: x ≤ 0 or −inf (never NaN: those rows are
// flagged separately). exp(x) = 2^n · e^r with n = round(x·log2 e) and r = x − n·ln 2 computed in
// two steps (Cody–Waite: ln 2 split in a short high part and a low part, so that n·ln2_hi is
// exact), |r| ≤ ln2/2, and e^r by its degree-7 Taylor polynomial (truncation < 6e-9 relative).
// Results below 2^-126 flush to 0, so exp(−inf) = 0 exactly. About 15 operations against Highway
// Exp's ~21, which matters because one exp per score is the softmax's whole cost. Measured max
// relative error over (−88, 0]: see FusedExp in tests/fused_test.cc.
template <class DF, class VF = hn::Vec<DF>>
HWY_INLINE VF ExpNonPositive(DF df, VF x) {
  const hn::RebindToSigned<DF> di;
  x = hn::Max(x, hn::Set(df, -88.0f));  // e^-88 ≈ 6e-39 flushes below; −inf lands here too
  const auto n = hn::NearestInt(hn::Mul(x, hn::Set(df, 1.44269504088896341f)));
  const VF nf = hn::ConvertTo(df, n);
  VF r = hn::NegMulAdd(nf, hn::Set(df, 0.693359375f), x);  // n·ln2_hi is exact
  r = hn::NegMulAdd(nf, hn::Set(df, -2.12194440e-4f), r);
  // e^r = Σ r^k / k!, Horner form.
  VF p = hn::Set(df, 1.0f / 5040);
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f / 720));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f / 120));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f / 24));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f / 6));
  p = hn::MulAdd(p, r, hn::Set(df, 0.5f));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f));
  // 2^n as float bits, exponent n + 127 ≥ 0 (n ≥ −127); n = −127 gives +0: flushed.
  const auto biased = hn::Max(hn::Add(n, hn::Set(di, 127)), hn::Zero(di));
  return hn::Mul(p, hn::BitCast(df, hn::ShiftLeft<23>(biased)));
}

// Lane i of the result is set iff bit (first + i) of `bits` is.
template <class DF>
HWY_INLINE hn::Mask<DF> LanesFromBits(DF df, uint64_t bits, size_t first) {
  const hn::RebindToUnsigned<DF> du;
  const auto lane_bit = hn::Shl(hn::Set(du, 1u), hn::Iota(du, 0));
  const auto chunk = hn::Set(du, static_cast<uint32_t>(bits >> first));
  return hn::RebindMask(df, hn::Ne(hn::And(chunk, lane_bit), hn::Zero(du)));
}

// Lane l of the result is set iff bit (first + l) of `bits` is; `first` a multiple of the lane
// count. With 8 or more lanes the bits load straight into the mask (no per-lane work).
template <class DF>
HWY_INLINE hn::Mask<DF> LanesKept(DF df, const uint64_t& bits, size_t first) {
  if (hn::Lanes(df) >= 8) {
    return hn::LoadMaskBits(df, reinterpret_cast<const uint8_t*>(&bits) + first / 8);
  }
  return LanesFromBits(df, bits, first);
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::detail::fused
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
