// Reading KV cache rows (maskattn/kv_format.h, kernels/kv_pages.h), compiled once per Highway
// target: the row kernel's products on quantized rows — scores q·k̂ of four keys at a time and
// O += Σ_j w_j·v̂_j, dequantizing in registers (nothing is widened in memory: decoding reads a
// cache row once, and the point of a quantized cache is to read fewer bytes) — and the tile
// kernel's rows of a paged cache decoded to f32 tiles (KVTileRows), which a 64-query block reuses
// 64 times.
//
// Design. A row is [f16 scales][codes]; x̂ = scale_g · decode(code). The scale is constant over a
// group, so a score is Σ_g scale_g · (Σ_{d∈g} q_d · decode(k_d)): the inner sums run on decoded
// codes (exact small numbers: int8, q4's n − 8, fp8 values) and one FMA per group and key folds the
// scale in; the four keys' sums are reduced together as fused_rows.cc's DotFour does. Values fold
// the scale into the weight: w_j · scale_g multiplies the decoded codes of group g.
//
// Decoding in registers:
//   int8   sign-extend to i32, convert;
//   e5m2   the code is the top byte of an f16: shift into place, convert f16 → f32 (F16C);
//   e4m3   the same f16 bits after moving the sign (s eeee mmm → s 0eeee mmm 0000000) are the value
//          times 2⁻⁸ (exponent bias 15 instead of 7, subnormals included): the 2⁸ joins the scale;
//   q4     nibbles zero-extended, minus 8 (the low nibbles of a group's 16 bytes are elements
//          0–15, the high ones 16–31); with 16-float vectors one vpermps looks n − 8 up.
// Scales are copied out of a run's rows next to each other and widened N at a time (F16C); the
// key loop for rows of whole groups of 32 is unrolled with every offset known at compile time,
// and the value loop keeps up to 8 output vectors in registers: per element, a decode and an FMA.
// Lanes never straddle a group: groups are 32 elements or a whole row, and a vector is ≤ 16
// floats; a whole-row group's last partial vector is finished by scalar code.
#if defined(MASKATTN_KERNELS_KV_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MASKATTN_KERNELS_KV_ROWS_INL_H_
#undef MASKATTN_KERNELS_KV_ROWS_INL_H_
#else
#define MASKATTN_KERNELS_KV_ROWS_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/convert-inl.h"
#include "kernels/kv_pages.h"
#include "maskattn/kv_format.h"

HWY_BEFORE_NAMESPACE();
namespace maskattn::detail::fused {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// out[x] = Σ lanes of a_x, for four accumulators: an interleave tree inside 128-bit blocks, then
// the blocks summed (one reduction for four keys instead of four).
template <class D>
HWY_INLINE void StoreSumsOfFour(D df, hn::Vec<D> a0, hn::Vec<D> a1, hn::Vec<D> a2, hn::Vec<D> a3,
                                float* HWY_RESTRICT out) {
#if HWY_TARGET == HWY_SCALAR
  (void)df;
  out[0] = hn::GetLane(a0), out[1] = hn::GetLane(a1), out[2] = hn::GetLane(a2);
  out[3] = hn::GetLane(a3);
#else
  const hn::Repartition<uint64_t, D> d64;
  const auto t01 = hn::Add(hn::InterleaveLower(df, a0, a1), hn::InterleaveUpper(df, a0, a1));
  const auto t23 = hn::Add(hn::InterleaveLower(df, a2, a3), hn::InterleaveUpper(df, a2, a3));
  const auto w01 = hn::BitCast(d64, t01), w23 = hn::BitCast(d64, t23);
  auto blocks = hn::Add(hn::BitCast(df, hn::InterleaveLower(d64, w01, w23)),
                        hn::BitCast(df, hn::InterleaveUpper(d64, w01, w23)));
  if constexpr (hn::MaxLanes(D()) > 8) {
    const hn::Half<D> dh;
    const auto half = hn::Add(hn::LowerHalf(dh, blocks), hn::UpperHalf(dh, blocks));
    const hn::Half<decltype(dh)> dq;
    hn::StoreU(hn::Add(hn::LowerHalf(dq, half), hn::UpperHalf(dq, half)), dq, out);
  } else if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    hn::StoreU(hn::Add(hn::LowerHalf(dh, blocks), hn::UpperHalf(dh, blocks)), dh, out);
  } else {
    hn::StoreU(blocks, df, out);
  }
#endif
}

// The f16 scale of group g of a row, times the format's decoding factor (2⁸ for e4m3).
// (Scales are finite: append() refuses anything else.)
template <KVFormat F>
HWY_INLINE float GroupScale(const uint8_t* row, int64_t g) {
  uint16_t h;
  std::memcpy(&h, row + 2 * g, 2);
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1Fu;
  float scale;
  if (exponent == 0) {  // zero or subnormal: mantissa · 2⁻²⁴
    scale = static_cast<float>(h & 0x3FFu) * (1.0f / 16777216.0f);
    if (sign != 0) scale = -scale;
  } else {
    const uint32_t bits =
        sign | ((exponent + 112u) << 23) | (static_cast<uint32_t>(h & 0x3FFu) << 13);
    std::memcpy(&scale, &bits, 4);
  }
  return F == KVFormat::fp8_e4m3 ? scale * 256.0f : scale;
}

// Bytes of codes before element `first` of a row (q4: two per byte).
template <KVFormat F>
constexpr int64_t CodeOffset(int64_t first) {
  return F == KVFormat::q4 ? first / 2 : first;
}

// The decoded codes of elements [e, e + lanes) of one group (`codes` at the group's first code;
// e a multiple of the lane count, and for q4 below 32).
template <KVFormat F, class D>
HWY_INLINE hn::Vec<D> DecodeCodes(D df, const uint8_t* HWY_RESTRICT codes, int64_t e) {
  if constexpr (F == KVFormat::int8) {
    const hn::Rebind<int32_t, D> di;
    const hn::Rebind<int8_t, D> d8;
    return hn::ConvertTo(
        df, hn::PromoteTo(di, hn::LoadU(d8, reinterpret_cast<const int8_t*>(codes) + e)));
  } else if constexpr (F == KVFormat::q4) {
    const hn::Rebind<int32_t, D> di;
    const hn::Rebind<uint8_t, D> d8;
    auto nibbles = hn::PromoteTo(di, hn::LoadU(d8, codes + e % 16));
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if constexpr (sizeof(hn::Vec<D>) == 64) {
      // A 16-float vector is the whole code book: vpermps looks each nibble's n − 8 up (it reads
      // only an index's low 4 bits, so the low nibble needs no mask), one instruction for the
      // mask or shift, conversion and subtraction below; the values are the same exact floats.
      const __m512 book = _mm512_setr_ps(-8.0f, -7.0f, -6.0f, -5.0f, -4.0f, -3.0f, -2.0f, -1.0f,
                                         0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f);
      if (e >= 16) nibbles = hn::ShiftRight<4>(nibbles);
      // (The zero-masking form with every lane kept: GCC 12 warns on the plain intrinsic.)
      return hn::Vec<D>{_mm512_maskz_permutexvar_ps(0xFFFF, nibbles.raw, book)};
    }
#endif
    nibbles = e < 16 ? hn::And(nibbles, hn::Set(di, 0x0F)) : hn::ShiftRight<4>(nibbles);
    return hn::Sub(hn::ConvertTo(df, nibbles), hn::Set(df, 8.0f));
  } else {
    const hn::Rebind<uint16_t, D> d16;
    const hn::Rebind<uint8_t, D> d8;
    const hn::Rebind<hwy::float16_t, D> dh;
    auto bits = hn::PromoteTo(d16, hn::LoadU(d8, codes + e));
    if constexpr (F == KVFormat::fp8_e5m2) {
      bits = hn::ShiftLeft<8>(bits);
    } else {
      bits = hn::Or(hn::ShiftLeft<8>(hn::And(bits, hn::Set(d16, 0x80))),
                    hn::ShiftLeft<7>(hn::And(bits, hn::Set(d16, 0x7F))));
    }
    return hn::PromoteTo(df, hn::BitCast(dh, bits));
  }
}

// One decoded code, unscaled except for e4m3's 2⁻⁸ (as DecodeCodes): the scalar tails.
template <KVFormat F>
HWY_INLINE float DecodeCode(const uint8_t* codes, int64_t e) {
  if constexpr (F == KVFormat::int8) {
    return static_cast<float>(static_cast<int8_t>(codes[e]));
  } else if constexpr (F == KVFormat::q4) {
    const uint8_t byte = codes[e % 16];
    return static_cast<float>(e < 16 ? (byte & 0x0F) : (byte >> 4)) - 8.0f;
  } else if constexpr (F == KVFormat::fp8_e5m2) {
    return float_from_fp8_e5m2(codes[e]);
  } else {
    return float_from_fp8_e4m3(codes[e]) * (1.0f / 256.0f);
  }
}

constexpr int64_t kRowsAhead = 24;

// A per-thread buffer of at least `count` floats for the scales of one run of rows, and room for
// their f16 bits after them.
HWY_INLINE float* ScaleBuffer(int64_t count) {
  thread_local std::vector<float> buffer;
  const auto needed = static_cast<size_t>(count + count / 2 + 16);
  if (buffer.size() < needed) buffer.resize(needed);
  return buffer.data();
}

// scales[j·groups + g] = group g's scale of row j (rows `stride` bytes apart; `scales` from
// ScaleBuffer), times the format's decoding factor. The f16 scales are first copied next to each
// other, then widened N at a time with the CPU's f16 conversion: a row kernel's run decodes each
// row's scales once, and per-row scalar decoding (branches on the exponent) cost as much as the
// row's products. This pass is the run's first touch of each row, so it also requests rows ahead.
template <KVFormat F>
HWY_INLINE void DecodeScales(const uint8_t* HWY_RESTRICT rows, int64_t stride, int64_t count,
                             int64_t groups, float* HWY_RESTRICT scales) {
  const int64_t total = count * groups;
  auto* bits = reinterpret_cast<uint16_t*>(scales + total);
  // Group by group, row by row: each copy moves two bytes from `stride` apart (a loop of
  // contiguous copies is turned into a call to libc's memmove by the compiler, and for rows of
  // one group that call cost as much as the row's products).
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t j = 0; j < count; ++j) {
      // Quantized rows are short, so 8 rows ahead (the row kernel's distance for bf16) is too
      // little to cover a miss to memory; 24 measured best here.
      if (g == 0 && j + kRowsAhead < count && stride > 0) {
        const uint8_t* ahead = rows + (j + kRowsAhead) * stride;
        for (int64_t byte = 0; byte < stride; byte += 64) hwy::Prefetch(ahead + byte);
      }
      uint16_t half;
      std::memcpy(&half, rows + j * stride + 2 * g, 2);
      bits[j * groups + g] = half;
    }
  }
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto factor = hn::Set(df, F == KVFormat::fp8_e4m3 ? 256.0f : 1.0f);
  const auto* halves = reinterpret_cast<const hwy::float16_t*>(bits);
  int64_t e = 0;
  for (; e + N <= total; e += N) {
    hn::StoreU(hn::Mul(hn::PromoteTo(df, hn::LoadU(dh, halves + e)), factor), df, scales + e);
  }
  for (; e < total; ++e) scales[e] = GroupScale<F>(reinterpret_cast<const uint8_t*>(bits + e), 0);
}

// out[x] = q·k̂_x for the four rows at k + x·stride (bytes); `group` elements per scale,
// `scales` the four rows' decoded scales (DecodeScales).
template <KVFormat F>
HWY_INLINE void DotFourQuantized(const float* HWY_RESTRICT q, const uint8_t* HWY_RESTRICT k,
                                 int64_t stride, int64_t dim, int64_t group,
                                 const float* HWY_RESTRICT scales, float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t groups = (dim + group - 1) / group;
  auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  float tail[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const uint8_t* rows[4] = {k, k + stride, k + 2 * stride, k + 3 * stride};
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t first = g * group, count = std::min(group, dim - first);
    const int64_t codes = 2 * groups + CodeOffset<F>(first);
    auto p0 = hn::Zero(df), p1 = hn::Zero(df), p2 = hn::Zero(df), p3 = hn::Zero(df);
    int64_t e = 0;
    for (; e + N <= count; e += N) {
      const auto qv = hn::LoadU(df, q + first + e);
      p0 = hn::MulAdd(qv, DecodeCodes<F>(df, rows[0] + codes, e), p0);
      p1 = hn::MulAdd(qv, DecodeCodes<F>(df, rows[1] + codes, e), p1);
      p2 = hn::MulAdd(qv, DecodeCodes<F>(df, rows[2] + codes, e), p2);
      p3 = hn::MulAdd(qv, DecodeCodes<F>(df, rows[3] + codes, e), p3);
    }
    a0 = hn::MulAdd(hn::Set(df, scales[g]), p0, a0);
    a1 = hn::MulAdd(hn::Set(df, scales[groups + g]), p1, a1);
    a2 = hn::MulAdd(hn::Set(df, scales[2 * groups + g]), p2, a2);
    a3 = hn::MulAdd(hn::Set(df, scales[3 * groups + g]), p3, a3);
    for (; e < count; ++e) {
      for (int x = 0; x < 4; ++x) {
        tail[x] += scales[x * groups + g] * (q[first + e] * DecodeCode<F>(rows[x] + codes, e));
      }
    }
  }
  StoreSumsOfFour(df, a0, a1, a2, a3, out);
  for (int x = 0; x < 4; ++x) out[x] += tail[x];
}

// DotFourQuantized for rows of whole groups of 32 (dim a multiple of 32, the common case): each
// group's vectors are unrolled with their offsets known at compile time (q4's nibble half too).
template <KVFormat F>
HWY_INLINE void DotFourGroups32(const float* HWY_RESTRICT q, const uint8_t* HWY_RESTRICT k,
                                int64_t stride, int64_t groups, const float* HWY_RESTRICT scales,
                                float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  const uint8_t* codes = k + 2 * groups;
  for (int64_t g = 0; g < groups; ++g, codes += CodeOffset<F>(32), q += 32) {
    auto p0 = hn::Zero(df), p1 = hn::Zero(df), p2 = hn::Zero(df), p3 = hn::Zero(df);
    HWY_UNROLL(8)
    for (int64_t e = 0; e < 32; e += N) {
      const auto qv = hn::LoadU(df, q + e);
      p0 = hn::MulAdd(qv, DecodeCodes<F>(df, codes, e), p0);
      p1 = hn::MulAdd(qv, DecodeCodes<F>(df, codes + stride, e), p1);
      p2 = hn::MulAdd(qv, DecodeCodes<F>(df, codes + 2 * stride, e), p2);
      p3 = hn::MulAdd(qv, DecodeCodes<F>(df, codes + 3 * stride, e), p3);
    }
    a0 = hn::MulAdd(hn::Set(df, scales[g]), p0, a0);
    a1 = hn::MulAdd(hn::Set(df, scales[groups + g]), p1, a1);
    a2 = hn::MulAdd(hn::Set(df, scales[2 * groups + g]), p2, a2);
    a3 = hn::MulAdd(hn::Set(df, scales[3 * groups + g]), p3, a3);
  }
  StoreSumsOfFour(df, a0, a1, a2, a3, out);
}

// q·k̂ for one row (`scales`: its decoded scales).
template <KVFormat F>
HWY_INLINE float DotQuantized(const float* HWY_RESTRICT q, const uint8_t* HWY_RESTRICT k,
                              int64_t dim, int64_t group, const float* HWY_RESTRICT scales) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t groups = (dim + group - 1) / group;
  auto acc = hn::Zero(df);
  float tail = 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t first = g * group, count = std::min(group, dim - first);
    const uint8_t* codes = k + 2 * groups + CodeOffset<F>(first);
    auto part = hn::Zero(df);
    int64_t e = 0;
    for (; e + N <= count; e += N) {
      part = hn::MulAdd(hn::LoadU(df, q + first + e), DecodeCodes<F>(df, codes, e), part);
    }
    acc = hn::MulAdd(hn::Set(df, scales[g]), part, acc);
    for (; e < count; ++e) tail += scales[g] * (q[first + e] * DecodeCode<F>(codes, e));
  }
  return hn::GetLane(hn::SumOfLanes(df, acc)) + tail;
}

// s[j] = q·k̂_j for `count` rows `stride` bytes apart: scales decoded once (which requests the
// rows ahead), then four keys at a time.
template <KVFormat F>
void DotQuantizedRun(const float* HWY_RESTRICT q, const uint8_t* HWY_RESTRICT keys, int64_t stride,
                     int64_t count, int64_t dim, int64_t group, float* HWY_RESTRICT s) {
  const int64_t groups = (dim + group - 1) / group;
  float* scales = ScaleBuffer(count * groups);
  DecodeScales<F>(keys, stride, count, groups, scales);
  int64_t j = 0;
  const auto lanes = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  const bool whole_groups = group == 32 && dim % 32 == 0 && 32 % lanes == 0;
  for (; j + 4 <= count; j += 4) {
    if (whole_groups) {
      DotFourGroups32<F>(q, keys + j * stride, stride, groups, scales + j * groups, s + j);
    } else {
      DotFourQuantized<F>(q, keys + j * stride, stride, dim, group, scales + j * groups, s + j);
    }
  }
  for (; j < count; ++j) {
    s[j] = DotQuantized<F>(q, keys + j * stride, dim, group, scales + j * groups);
  }
}

// out[e] += Σ_j weights[j·groups + g(e)]·decode(v_j[e]) for e in [e0, e0 + kVectors·N), where
// g(e) = e / 32 (q4) or 0 (the other formats: a value row is one group). The output vectors stay
// in registers across the keys; keys of weight w[j] = 0 are skipped (a hidden key's row is never
// read). e0 is a multiple of 32 for q4 (kVectors·N is too), so every vector's group and nibble
// half are known at compile time: per key, one broadcast per group and a decode and FMA per vector.
template <KVFormat F, int kVectors>
HWY_INLINE void AccumulateQuantizedVectors(const uint8_t* HWY_RESTRICT v, int64_t stride,
                                           int64_t count, int64_t e0, int64_t groups,
                                           const float* HWY_RESTRICT w,
                                           const float* HWY_RESTRICT weights,
                                           float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  constexpr bool kGroups32 = F == KVFormat::q4;
  hn::Vec<decltype(df)> acc[kVectors];
  for (int x = 0; x < kVectors; ++x) acc[x] = hn::LoadU(df, out + e0 + x * N);
  const uint8_t* codes = v + 2 * groups + CodeOffset<F>(e0);
  const float* row_weights = weights + (kGroups32 ? e0 / 32 : 0);
  for (int64_t j = 0; j < count; ++j, codes += stride, row_weights += groups) {
    if (w[j] == 0.0f) continue;
    const auto whole = hn::Set(df, row_weights[0]);
    for (int x = 0; x < kVectors; ++x) {
      const int64_t e = x * N;  // from e0; for q4 its group is e / 32 and its lane e % 32
      const auto weight = kGroups32 ? hn::Set(df, row_weights[e / 32]) : whole;
      const auto decoded = kGroups32 ? DecodeCodes<F>(df, codes + e / 32 * 16, e % 32)
                                     : DecodeCodes<F>(df, codes, e);
      acc[x] = hn::MulAdd(weight, decoded, acc[x]);
    }
  }
  for (int x = 0; x < kVectors; ++x) hn::StoreU(acc[x], df, out + e0 + x * N);
}

// weights[j·groups + g] *= w[j]: each row's scales join its weight once (0 stays 0: finite).
HWY_INLINE void ScaleWeights(const float* HWY_RESTRICT w, int64_t count, int64_t groups,
                             float* HWY_RESTRICT weights) {
  if (groups != 1) {
    for (int64_t j = 0; j < count; ++j) {
      for (int64_t g = 0; g < groups; ++g) weights[j * groups + g] *= w[j];
    }
    return;
  }
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t j = 0;
  for (; j + N <= count; j += N) {
    hn::StoreU(hn::Mul(hn::LoadU(df, weights + j), hn::LoadU(df, w + j)), df, weights + j);
  }
  for (; j < count; ++j) weights[j] *= w[j];
}

// out[e] += Σ_j w[j]·v̂_j[e] over `count` rows `stride` bytes apart and every column: each row's
// scales join its weight once (w_j·s_jg), then each element is one sum over j in order, in blocks
// of 8, 4, 2 and 1 vectors (q4 rows are multiples of 32 elements, so its blocks start at one).
template <KVFormat F>
void AccumulateQuantized(const uint8_t* HWY_RESTRICT v, int64_t stride, int64_t count,
                         int64_t value_dim, int64_t group, const float* HWY_RESTRICT w,
                         float* HWY_RESTRICT out) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  const int64_t groups = (value_dim + group - 1) / group;
  float* weights = ScaleBuffer(count * groups);
  DecodeScales<F>(v, stride, count, groups, weights);
  ScaleWeights(w, count, groups, weights);
  int64_t e = 0;
  for (; e + 8 * N <= value_dim; e += 8 * N) {
    AccumulateQuantizedVectors<F, 8>(v, stride, count, e, groups, w, weights, out);
  }
  if (e + 4 * N <= value_dim) {
    AccumulateQuantizedVectors<F, 4>(v, stride, count, e, groups, w, weights, out);
    e += 4 * N;
  }
  if (e + 2 * N <= value_dim) {
    AccumulateQuantizedVectors<F, 2>(v, stride, count, e, groups, w, weights, out);
    e += 2 * N;
  }
  if (e + N <= value_dim) {
    AccumulateQuantizedVectors<F, 1>(v, stride, count, e, groups, w, weights, out);
    e += N;
  }
  for (; e < value_dim; ++e) {  // past the last whole vector (not q4: its rows are whole groups)
    const int64_t g = e / group;
    float sum = out[e];
    for (int64_t j = 0; j < count; ++j) {
      const float weight = weights[j * groups + g];
      if (weight == 0.0f) continue;
      sum += weight *
             DecodeCode<F>(v + j * stride + 2 * groups + CodeOffset<F>(g * group), e - g * group);
    }
    out[e] = sum;
  }
}

// Calls fn(std::integral_constant<KVFormat, F>) for a quantized format F.
template <typename Fn>
HWY_INLINE void WithQuantized(KVFormat format, Fn&& fn) {
  switch (format) {
    case KVFormat::int8:
      fn(std::integral_constant<KVFormat, KVFormat::int8>());
      break;
    case KVFormat::fp8_e4m3:
      fn(std::integral_constant<KVFormat, KVFormat::fp8_e4m3>());
      break;
    case KVFormat::fp8_e5m2:
      fn(std::integral_constant<KVFormat, KVFormat::fp8_e5m2>());
      break;
    case KVFormat::q4:
      fn(std::integral_constant<KVFormat, KVFormat::q4>());
      break;
    default:
      break;
  }
}

// One quantized row decoded to `width` floats: x̂ = scale·code exactly as kv_decode_row computes
// it (e4m3's 2⁸ sits in the scale and 2⁻⁸ in the code: both exact, so the product is the same).
template <KVFormat F>
HWY_INLINE void DecodeQuantizedRow(const uint8_t* HWY_RESTRICT row, int64_t width, int64_t group,
                                   float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t groups = (width + group - 1) / group;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t first = g * group, count = std::min(group, width - first);
    const uint8_t* codes = row + 2 * groups + CodeOffset<F>(first);
    const float s = GroupScale<F>(row, g);
    int64_t e = 0;
    for (; e + N <= count; e += N) {
      hn::StoreU(hn::Mul(hn::Set(df, s), DecodeCodes<F>(df, codes, e)), df, out + first + e);
    }
    for (; e < count; ++e) out[first + e] = s * DecodeCode<F>(codes, e);
  }
}

// One cache row of any format as `width` floats in `out`.
HWY_INLINE void DecodeCacheRow(KVFormat format, bool keys, const uint8_t* HWY_RESTRICT row,
                               int64_t width, float* HWY_RESTRICT out) {
  if (!is_quantized(format)) {
    const auto widen = [&](const auto* in) {
      const hn::ScalableTag<float> df;
      const int64_t N = static_cast<int64_t>(hn::Lanes(df));
      int64_t e = 0;
      for (; e + N <= width; e += N) hn::StoreU(LoadAsFloat(in + e), df, out + e);
      for (; e < width; ++e) out[e] = AsFloat(in[e]);
    };
    if (format == KVFormat::f16) {
      widen(reinterpret_cast<const hwy::float16_t*>(row));
    } else if (format == KVFormat::bf16) {
      widen(reinterpret_cast<const hwy::bfloat16_t*>(row));
    } else {
      std::memcpy(out, row, width * sizeof(float));
    }
    return;
  }
  const int64_t group = kv_group_size(format, keys, width);
  WithQuantized(format,
                [&](auto f) { DecodeQuantizedRow<decltype(f)::value>(row, width, group, out); });
}

// K (keys) or V rows [j0, j0 + count) of (b, g) as f32: read through a paged cache's block tables
// when `pages` is set (decoded into `buffer`), otherwise TileRows on the tensor.
HWY_INLINE const float* KVTileRows(const TensorView& t, const KVPages* pages, bool keys, int64_t b,
                                   int64_t g, int64_t j0, int64_t count, int64_t width,
                                   float* buffer, int64_t& row_stride) {
  if (pages == nullptr) return TileRows(t, b, g, j0, count, width, buffer, row_stride);
  row_stride = width;
  for (int64_t r = 0; r < count; ++r) {
    DecodeCacheRow(pages->format, keys, pages->row(keys, b, g, j0 + r), width, buffer + r * width);
  }
  return buffer;
}

HWY_INLINE const float* KVRowAsF32(const TensorView& t, const KVPages* pages, bool keys, int64_t b,
                                   int64_t g, int64_t j, int64_t width, float* buffer) {
  if (pages == nullptr) return RowAsF32(t, b, g, j, width, buffer);
  DecodeCacheRow(pages->format, keys, pages->row(keys, b, g, j), width, buffer);
  return buffer;
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::detail::fused
HWY_AFTER_NAMESPACE();

#endif  // MASKATTN_KERNELS_KV_ROWS_INL_H_
