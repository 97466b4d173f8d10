// The register-blocked product C[r][x] (+)= Σ_p A(r, p)·B[p][x], compiled once per Highway target
// (the "-inl.h" convention). A is read as broadcast scalars with any row and column strides, so
// the same code multiplies by A or by Aᵀ; B is read as whole rows of lanes. Shared by the f32
// unit's backward (all five products of a tile pair, f32_fma.cc) and the dense layers of
// MultiHeadAttention.
//
// Each C element is one running sum over p in order, whatever block it falls in, so a row's
// result does not depend on how many rows are computed with it.
#if defined(MASKATTN_KERNELS_PRODUCT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MASKATTN_KERNELS_PRODUCT_INL_H_
#undef MASKATTN_KERNELS_PRODUCT_INL_H_
#else
#define MASKATTN_KERNELS_PRODUCT_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace maskattn::detail::fused {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using ProductTag = hn::ScalableTag<float>;

// Which products may meet a non-finite value next to a zero weight: guard with A ≠ 0 (the
// broadcast scalar) or with B ≠ 0 (the lanes).
enum class Guard { none, a, b };

// C[r][x] (+)= Σ_{p<inner} A[r·a_row + p·a_col]·B[p·b_stride + x] for kRows rows and kVectors
// vectors of x.
template <int kRows, int kVectors, Guard kGuard>
HWY_INLINE void ProductBlock(const float* a, int64_t a_row, int64_t a_col, int64_t inner,
                             const float* b, int64_t b_stride, bool accumulate,
                             float* HWY_RESTRICT c, int64_t c_stride) {
  const ProductTag df;
  const size_t N = hn::Lanes(df);
  const auto zero = hn::Zero(df);
  hn::Vec<ProductTag> acc[kRows][kVectors];
  for (int r = 0; r < kRows; ++r) {
    for (int x = 0; x < kVectors; ++x) {
      acc[r][x] = accumulate ? hn::LoadU(df, c + r * c_stride + x * N) : zero;
    }
  }
  for (int64_t p = 0; p < inner; ++p, a += a_col, b += b_stride) {
    hn::Vec<ProductTag> bv[kVectors];
    for (int x = 0; x < kVectors; ++x) bv[x] = hn::LoadU(df, b + x * N);
    for (int r = 0; r < kRows; ++r) {
      const float scalar = a[r * a_row];
      if constexpr (kGuard == Guard::a) {
        if (scalar == 0.0f) continue;
      }
      const auto av = hn::Set(df, scalar);
      for (int x = 0; x < kVectors; ++x) {
        if constexpr (kGuard == Guard::b) {
          acc[r][x] =
              hn::Add(acc[r][x], hn::IfThenElseZero(hn::Ne(bv[x], zero), hn::Mul(av, bv[x])));
        } else {
          acc[r][x] = hn::MulAdd(av, bv[x], acc[r][x]);
        }
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int x = 0; x < kVectors; ++x) hn::StoreU(acc[r][x], df, c + r * c_stride + x * N);
  }
}

// kRows rows of C, all `vectors` vectors of it: blocks of 4 vectors, then single ones.
template <int kRows, Guard kGuard>
HWY_INLINE void ProductRows(const float* a, int64_t a_row, int64_t a_col, int64_t inner,
                            const float* b, int64_t b_stride, int vectors, bool accumulate,
                            float* c, int64_t c_stride) {
  const size_t N = hn::Lanes(ProductTag());
  int v = 0;
  for (; v + 4 <= vectors; v += 4, b += 4 * N, c += 4 * N) {
    ProductBlock<kRows, 4, kGuard>(a, a_row, a_col, inner, b, b_stride, accumulate, c, c_stride);
  }
  for (; v < vectors; ++v, b += N, c += N) {
    ProductBlock<kRows, 1, kGuard>(a, a_row, a_col, inner, b, b_stride, accumulate, c, c_stride);
  }
}

// The same for `rows` rows and `width` columns (a multiple of the lane count; widths are head dims
// or tile sizes, far below 2^31 vectors).
template <Guard kGuard>
void Product(const float* a, int64_t a_row, int64_t a_col, int64_t inner, const float* b,
             int64_t b_stride, int64_t width, bool accumulate, float* c, int64_t c_stride,
             int64_t rows) {
  const int vectors = static_cast<int>(width / static_cast<int64_t>(hn::Lanes(ProductTag())));
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    ProductRows<4, kGuard>(a + r * a_row, a_row, a_col, inner, b, b_stride, vectors, accumulate,
                           c + r * c_stride, c_stride);
  }
  for (; r < rows; ++r) {
    ProductRows<1, kGuard>(a + r * a_row, a_row, a_col, inner, b, b_stride, vectors, accumulate,
                           c + r * c_stride, c_stride);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::detail::fused
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
