// The driver splits C into tiles of kTileRows rows × kTileCols columns, run on OpenMP threads; a
// tile streams a kTileCols-wide strip of B (inner × 64 floats: 128 KiB at inner 512, L2-resident)
// past 4 rows of A at a time. Columns past the last full SIMD vector are summed by scalar code in
// the same order.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/matmul.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "kernels/matmul.h"
#include "kernels/product-inl.h"

HWY_BEFORE_NAMESPACE();
namespace maskattn::detail::fused {
namespace HWY_NAMESPACE {

// One tile: rows [0, rows) and columns [0, cols) of the pointers given.
void MatmulTileImpl(const float* a, int64_t a_row, int64_t a_col, int64_t rows, int64_t inner,
                    const float* b, int64_t b_stride, int64_t cols, float* c, int64_t c_stride,
                    bool accumulate) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(ProductTag()));
  const int64_t width = cols / lanes * lanes;
  if (width > 0) {
    Product<Guard::none>(a, a_row, a_col, inner, b, b_stride, width, accumulate, c, c_stride, rows);
  }
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t n = width; n < cols; ++n) {
      float sum = accumulate ? c[m * c_stride + n] : 0.0f;
      for (int64_t p = 0; p < inner; ++p) sum += a[m * a_row + p * a_col] * b[p * b_stride + n];
      c[m * c_stride + n] = sum;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::detail::fused
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace maskattn::detail {
namespace fused {
HWY_EXPORT(MatmulTileImpl);
}  // namespace fused

namespace {
constexpr int64_t kTileRows = 64;
constexpr int64_t kTileCols = 64;  // a multiple of every target's lane count
}  // namespace

void matmul(const float* a, int64_t a_row, int64_t a_col, int64_t rows, int64_t inner,
            const float* b, int64_t b_stride, int64_t cols, float* c, int64_t c_stride,
            bool accumulate, int threads) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t row_tiles = (rows + kTileRows - 1) / kTileRows;
  const int64_t col_tiles = (cols + kTileCols - 1) / kTileCols;
  const int64_t tiles = row_tiles * col_tiles;
  // Small products are not worth waking the thread team for; a decoding step's few rows still are
  // when B is large (inner × cols floats to stream: the product is bandwidth-bound, not FMA-bound).
  const bool parallel =
      tiles > 1 && static_cast<double>(std::max<int64_t>(rows, 4)) * inner * cols > 1e6;
#pragma omp parallel for schedule(static) if (parallel) \
    num_threads(threads > 0 ? threads : omp_get_max_threads())
  for (int64_t t = 0; t < tiles; ++t) {
    // Column strips outermost: consecutive tiles of a thread reuse the strip of B.
    const int64_t first_col = t / row_tiles * kTileCols;
    const int64_t first_row = t % row_tiles * kTileRows;
    HWY_DYNAMIC_DISPATCH(fused::MatmulTileImpl)
    (a + first_row * a_row, a_row, a_col, std::min(kTileRows, rows - first_row), inner,
     b + first_col, b_stride, std::min(kTileCols, cols - first_col),
     c + first_row * c_stride + first_col, c_stride, accumulate);
  }
}

}  // namespace maskattn::detail
#endif  // HWY_ONCE
