#include "model/linear.h"

#include <algorithm>

#include "kernels/gemm.h"
#include "kernels/matmul.h"

namespace maskattn::model {

namespace {

void add_bias(const float* b, int64_t rows, int64_t out, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t n = 0; n < out; ++n) y[r * out + n] += b[n];
  }
}

// db[n] += Σ_r dy[r][n], each column summed over the rows in row order (the bits do not depend on
// the thread count); the threads take column ranges. On one thread, with the other waiting, this
// sum over the GPT's [1024, 512] activations had been about a third of a millisecond a step.
void add_column_sums(const float* dy, int64_t rows, int64_t out, float* db, int threads) {
  constexpr int64_t kColumns = 64;  // a range: whole cache lines of every row
  const int64_t ranges = (out + kColumns - 1) / kColumns;
#pragma omp parallel for schedule(static) \
    num_threads(threads > 0 ? threads : 1) if (threads != 1 && ranges > 1 && rows * out >= 65536)
  for (int64_t range = 0; range < ranges; ++range) {
    const int64_t first = range * kColumns, end = std::min(out, first + kColumns);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = dy + r * out;
      for (int64_t n = first; n < end; ++n) db[n] += row[n];
    }
  }
}

}  // namespace

void transpose(const float* in, int64_t rows, int64_t cols, std::vector<float>& out) {
  out.resize(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
  }
}

void linear_forward(const float* x, int64_t rows, int64_t in, const float* w, const float* b,
                    int64_t out, float* y, int threads, const float* residual) {
  using detail::Layout;
  detail::gemm(Layout::as_stored, Layout::transposed, rows, out, in, x, in, w, in, y, out, false,
               threads, {b, residual, out});
}

void linear_forward_per_row(const float* x, int64_t rows, int64_t in, const float* wt,
                            const float* b, int64_t out, float* y, int threads) {
  detail::matmul(x, in, 1, rows, in, wt, out, out, y, out, false, threads);
  add_bias(b, rows, out, y);
}

void linear_backward(const float* x, const float* dy, int64_t rows, int64_t in, int64_t out,
                     const float* w, float* dx, float* dw, float* db, int threads,
                     bool accumulate_dx) {
  using detail::Layout;
  detail::gemm(Layout::as_stored, Layout::as_stored, rows, in, out, dy, out, w, in, dx, in,
               accumulate_dx, threads);
  detail::gemm(Layout::transposed, Layout::as_stored, out, in, rows, dy, out, x, in, dw, in, true,
               threads);
  add_column_sums(dy, rows, out, db, threads);
}

}  // namespace maskattn::model
