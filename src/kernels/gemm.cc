// The layers' dense products on oneDNN (kernels/gemm.h says why this library and how the threads
// are shared out).
#include "kernels/gemm.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <string>

#include "maskattn/error.h"

namespace maskattn::detail {

namespace {

// The block of C that one library call computes. 64 rows × 512 columns was the fastest grid of
// those bench/gemm_run --mode blocks tried at the model's shapes (128 × 128, 128 × 256, 256 × 128,
// 256 × 256): it keeps a whole row of a 512-wide output in one call, and still gives the 128-row
// weight gradients (dW = dyᵀ·x) two blocks, one per thread.
constexpr int64_t kBlockRows = 64;
constexpr int64_t kBlockCols = 512;

dnnl_status_t block_product(Layout a_layout, Layout b_layout, int64_t rows, int64_t cols,
                            int64_t inner, const float* a, int64_t lda, const float* b, int64_t ldb,
                            float* c, int64_t ldc, bool accumulate) {
  const char a_op = a_layout == Layout::transposed ? 'T' : 'N';
  const char b_op = b_layout == Layout::transposed ? 'T' : 'N';
  return dnnl_sgemm(a_op, b_op, rows, cols, inner, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f,
                    c, ldc);
}

// The epilogue on the block [rows, cols] of C at `c` (its first row r0 of the whole product,
// column n0): (C + bias) + residual, element by element.
void apply_epilogue(const GemmEpilogue& epilogue, int64_t r0, int64_t n0, int64_t rows,
                    int64_t cols, float* c, int64_t ldc) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = c + r * ldc;
    if (epilogue.bias != nullptr) {
      const float* bias = epilogue.bias + n0;
      for (int64_t n = 0; n < cols; ++n) row[n] += bias[n];
    }
    if (epilogue.residual != nullptr) {
      const float* residual = epilogue.residual + (r0 + r) * epilogue.ld_residual + n0;
      for (int64_t n = 0; n < cols; ++n) row[n] += residual[n];
    }
  }
}

bool has_epilogue(const GemmEpilogue& epilogue) {
  return epilogue.bias != nullptr || epilogue.residual != nullptr;
}

}  // namespace

void gemm(Layout a_layout, Layout b_layout, int64_t rows, int64_t cols, int64_t inner,
          const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
          bool accumulate, int threads, const GemmEpilogue& epilogue) {
  if (rows <= 0 || cols <= 0) return;
  if (inner <= 0) {  // an empty sum: C is 0, or stays as it is
    if (!accumulate) {
      for (int64_t r = 0; r < rows; ++r) std::fill(c + r * ldc, c + r * ldc + cols, 0.0f);
    }
    if (has_epilogue(epilogue)) apply_epilogue(epilogue, 0, 0, rows, cols, c, ldc);
    return;
  }
  const int64_t row_blocks = (rows + kBlockRows - 1) / kBlockRows;
  const int64_t col_blocks = (cols + kBlockCols - 1) / kBlockCols;
  const int64_t blocks = row_blocks * col_blocks;
  // Small products are not worth waking the thread team for.
  const bool parallel =
      blocks > 1 && static_cast<double>(rows) * static_cast<double>(inner) * cols > 1e6;
  // The region runs even with one block or one thread: oneDNN takes its own thread count from
  // OpenMP (omp_get_max_threads() outside a parallel region), and setting it to 1 here applies to
  // this region's tasks only, never to the caller's.
  int failure = dnnl_success;  // an exception may not leave an OpenMP region
#pragma omp parallel for schedule(static) if (parallel) \
    num_threads(threads > 0 ? threads : omp_get_max_threads())
  for (int64_t block = 0; block < blocks; ++block) {
    omp_set_num_threads(1);
    const int64_t first_row = block / col_blocks * kBlockRows;
    const int64_t first_col = block % col_blocks * kBlockCols;
    // Row `first_row` of op(A) and column `first_col` of op(B), whichever way each is stored.
    const float* a_block = a_layout == Layout::transposed ? a + first_row : a + first_row * lda;
    const float* b_block = b_layout == Layout::transposed ? b + first_col * ldb : b + first_col;
    const int64_t block_rows = std::min(kBlockRows, rows - first_row);
    const int64_t block_cols = std::min(kBlockCols, cols - first_col);
    float* c_block = c + first_row * ldc + first_col;
    const dnnl_status_t status =
        block_product(a_layout, b_layout, block_rows, block_cols, inner, a_block, lda, b_block, ldb,
                      c_block, ldc, accumulate);
    if (status == dnnl_success && has_epilogue(epilogue)) {
      apply_epilogue(epilogue, first_row, first_col, block_rows, block_cols, c_block, ldc);
    }
    if (status != dnnl_success) {
#pragma omp atomic write
      failure = status;
    }
  }
  if (failure != dnnl_success) {
    throw Error("gemm: oneDNN's dnnl_sgemm failed (status " + std::to_string(failure) + ") on [" +
                std::to_string(rows) + "x" + std::to_string(inner) + "]·[" + std::to_string(inner) +
                "x" + std::to_string(cols) + "]");
  }
}

}  // namespace maskattn::detail
