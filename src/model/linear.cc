#include "model/linear.h"

#include "kernels/matmul.h"

namespace maskattn::model {

void transpose(const float* in, int64_t rows, int64_t cols, std::vector<float>& out) {
  out.resize(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
  }
}

void linear_forward(const float* x, int64_t rows, int64_t in, const float* wt, const float* b,
                    int64_t out, float* y, int threads) {
  detail::matmul(x, in, 1, rows, in, wt, out, out, y, out, false, threads);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t n = 0; n < out; ++n) y[r * out + n] += b[n];
  }
}

void linear_backward(const float* x, const float* dy, int64_t rows, int64_t in, int64_t out,
                     const float* w, float* dx, float* dw, float* db, int threads) {
  detail::matmul(dy, out, 1, rows, out, w, in, in, dx, in, false, threads);
  detail::matmul(dy, 1, out, out, rows, x, in, in, dw, in, true, threads);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t n = 0; n < out; ++n) db[n] += dy[r * out + n];
  }
}

}  // namespace maskattn::model
