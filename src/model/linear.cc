#include "model/linear.h"

#include "kernels/gemm.h"
#include "kernels/matmul.h"
#include "model/parallel_ranges.h"

namespace maskattn::model {

namespace {

void add_bias(const float* b, int64_t rows, int64_t out, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t n = 0; n < out; ++n) y[r * out + n] += b[n];
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
  for_column_ranges(rows, out, threads, [&](int64_t first, int64_t end) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t n = first; n < end; ++n) db[n] += dy[r * out + n];
    }
  });
}

}  // namespace maskattn::model
