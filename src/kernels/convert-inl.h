// Element conversions of the fused kernels, compiled once per Highway target (the "-inl.h"
// convention): rows of f32, f16 or bf16 tensors read as f32 and written back with rounding to
// nearest even, and the finiteness test that decides when a product may run over hidden pairs.
// f16 → f32 and bf16 → f32 are exact, so a converted row holds the same numbers as the tensor.
#if defined(MASKATTN_KERNELS_CONVERT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MASKATTN_KERNELS_CONVERT_INL_H_
#undef MASKATTN_KERNELS_CONVERT_INL_H_
#else
#define MASKATTN_KERNELS_CONVERT_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/element.h"
#include "maskattn/tensor.h"

HWY_BEFORE_NAMESPACE();
namespace maskattn::detail::fused {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// `count` elements from `offset`, `stride` apart, widened to f32 (vectorised when contiguous).
inline void LoadRow(const TensorView& t, int64_t offset, int64_t stride, int64_t count,
                    float* HWY_RESTRICT out) {
  if (count == 0) return;  // an empty row may sit at a null pointer (memcpy must not see it)
  if (stride == 1) {
    const DF df;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
    int64_t d = 0;
    switch (t.dtype()) {
      case DType::f32:
        std::memcpy(out, static_cast<const float*>(t.data()) + offset, count * sizeof(float));
        return;
      case DType::f16: {
        const hn::Rebind<hwy::float16_t, DF> dh;
        const auto* in = reinterpret_cast<const hwy::float16_t*>(t.data()) + offset;
        for (; d + lanes <= count; d += lanes)
          hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, in + d)), df, out + d);
        break;
      }
      case DType::bf16: {
        const hn::Rebind<hwy::bfloat16_t, DF> dh;
        const auto* in = reinterpret_cast<const hwy::bfloat16_t*>(t.data()) + offset;
        for (; d + lanes <= count; d += lanes)
          hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, in + d)), df, out + d);
        break;
      }
    }
    for (; d < count; ++d) out[d] = load_float(t, offset + d);
    return;
  }
  for (int64_t d = 0; d < count; ++d) out[d] = load_float(t, offset + d * stride);
}

// Rows [j0, j0 + count) of K or V for (b, g) as f32: a pointer into the tensor itself when it is
// f32 with contiguous rows, else a converted copy in `buffer`. `row_stride` receives the distance
// between rows of the returned pointer.
inline const float* TileRows(const TensorView& t, int64_t b, int64_t g, int64_t j0, int64_t count,
                             int64_t width, float* buffer, int64_t& row_stride) {
  if (t.dtype() == DType::f32 && t.stride(3) == 1) {
    row_stride = t.stride(2);
    return static_cast<const float*>(t.data()) + t.offset({b, g, j0, 0});
  }
  row_stride = width;
  const size_t element = dtype_size(t.dtype());
  const auto* base = static_cast<const uint8_t*>(t.data());
  for (int64_t r = 0; r < count; ++r) {
    // Rows ahead are requested early: without this, converting a streamed tile stalls on memory.
    if (r + 8 < count && t.stride(3) == 1) {
      const uint8_t* ahead = base + t.offset({b, g, j0 + r + 8, 0}) * element;
      for (int64_t byte = 0; byte < width * static_cast<int64_t>(element); byte += 64) {
        hwy::Prefetch(ahead + byte);
      }
    }
    LoadRow(t, t.offset({b, g, j0 + r, 0}), t.stride(3), width, buffer + r * width);
  }
  return buffer;
}

// Rows [first, first + count) of the [B·H·L] rows of t, as f32 rows of width W, `out_stride`
// apart (≥ W; the gap is zero-filled).
inline void ConvertRowsToF32(const TensorView& t, int64_t first, int64_t count, float* out,
                             int64_t out_stride) {
  const int64_t width = t.size(3);
  for (int64_t row = first; row < first + count; ++row) {
    const int64_t l = row % t.size(2), h = (row / t.size(2)) % t.size(1);
    const int64_t b = row / (t.size(2) * t.size(1));
    float* out_row = out + row * out_stride;
    LoadRow(t, t.offset({b, h, l, 0}), t.stride(3), width, out_row);
    std::fill(out_row + width, out_row + out_stride, 0.0f);
  }
}

inline void StoreRow(const MutableTensorView& t, int64_t offset, int64_t stride,
                     const float* values, int64_t count) {
  if (count == 0) return;  // an empty row may sit at a null pointer
  if (stride == 1) {
    const DF df;
    const int64_t N = static_cast<int64_t>(hn::Lanes(df));
    int64_t e = 0;
    switch (t.dtype()) {
      case DType::f32:
        std::memcpy(static_cast<float*>(t.mutable_data()) + offset, values, count * sizeof(float));
        return;
      case DType::f16: {
        // F16C conversion rounds to nearest even, like float16_from_float.
        const hn::Rebind<hwy::float16_t, DF> dh;
        auto* out = reinterpret_cast<hwy::float16_t*>(t.mutable_data()) + offset;
        for (; e + N <= count; e += N)
          hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, values + e)), dh, out + e);
        break;
      }
      case DType::bf16: {
        // Round to nearest even on the bits (Highway 1.0.3's bf16 DemoteTo truncates): add
        // 0x7FFF plus the lowest kept bit, keep the top half; NaN stays a quiet NaN.
        const hn::RebindToUnsigned<DF> du;
        const hn::Rebind<uint16_t, DF> du16;
        auto* out = static_cast<uint16_t*>(t.mutable_data()) + offset;
        for (; e + N <= count; e += N) {
          const VF x = hn::LoadU(df, values + e);
          const auto bits = hn::BitCast(du, x);
          const auto odd = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
          const auto rounded =
              hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du, 0x7FFFu), odd)));
          const auto quiet = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du, 0x40u));
          const auto half = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(x)), quiet, rounded);
          // Values ≤ 0xFFFF: the signed → unsigned 16-bit demotion keeps them as they are.
          hn::StoreU(hn::DemoteTo(du16, hn::BitCast(hn::RebindToSigned<DF>(), half)), du16,
                     out + e);
        }
        break;
      }
    }
    for (; e < count; ++e) store_float(t, offset + e, values[e]);
    return;
  }
  for (int64_t e = 0; e < count; ++e) store_float(t, offset + e * stride, values[e]);
}

// Whether every value of `rows` rows of `width` values, `stride` floats apart, is finite. x − x is
// 0 for finite x and NaN for ±inf and NaN: one test for all three, reduced once at the end (per
// row, a call, the row's offset and the reduction cost more than its 4 vectors of checks: a
// first-visit V tile check took 1.3 µs of a window's ~30 µs block, in cache).
HWY_INLINE bool RowsAllFinite(const float* first, int64_t rows, int64_t stride, int64_t width) {
  using DF = hn::ScalableTag<float>;
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  auto bad = hn::Zero(df);
  bool finite = true;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = first + r * stride;
    int64_t n = 0;
    for (; n + N <= width; n += N) {
      const auto x = hn::LoadU(df, row + n);
      bad = hn::Or(bad, hn::Sub(x, x));
    }
    for (; n < width; ++n) finite &= std::isfinite(row[n]);
  }
  return finite && hn::AllFalse(df, hn::IsNaN(bad));
}

// Whether every one of `count` values is finite.
HWY_INLINE bool AllFinite(const float* values, int64_t count) {
  return RowsAllFinite(values, 1, count, count);
}

// Row j of K or V for (b, g) as f32: a pointer into the tensor when it is f32 with contiguous
// rows, else converted into `buffer`.
HWY_INLINE const float* RowAsF32(const TensorView& t, int64_t b, int64_t g, int64_t j,
                                 int64_t width, float* buffer) {
  const int64_t offset = t.offset({b, g, j, 0});
  if (t.dtype() == DType::f32 && t.stride(3) == 1) {
    return static_cast<const float*>(t.data()) + offset;
  }
  LoadRow(t, offset, t.stride(3), width, buffer);
  return buffer;
}

template <typename T>
HWY_INLINE VF LoadAsFloat(const T* HWY_RESTRICT p) {
  const DF df;
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, p);
  } else {
    return hn::PromoteTo(df, hn::LoadU(hn::Rebind<T, DF>(), p));
  }
}

template <typename T>
HWY_INLINE float AsFloat(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    uint16_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    if constexpr (std::is_same_v<T, hwy::float16_t>) return to_float(float16{bits});
    return to_float(bfloat16{bits});
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::detail::fused
HWY_AFTER_NAMESPACE();

#endif  // MASKATTN_KERNELS_CONVERT_INL_H_
