// Dense layers of the GPT model on the library's f32 product (kernels/matmul.h): y = x·Wᵀ + b
// with W [out, in] as PyTorch's nn.Linear stores it, its backward, and the transposes the product
// needs (it reads its right operand by rows). Every element is one sum in a fixed order, so results
// do not depend on the thread count.
#pragma once

#include <cstdint>
#include <vector>

namespace maskattn::model {

// out [cols, rows] = in [rows, cols] transposed.
void transpose(const float* in, int64_t rows, int64_t cols, std::vector<float>& out);

// y [rows, out] = x [rows, in] · Wᵀ + b, given wt = Wᵀ [in, out].
void linear_forward(const float* x, int64_t rows, int64_t in, const float* wt, const float* b,
                    int64_t out, float* y, int threads);

// For y = x·Wᵀ + b: dx = dy·W (overwritten), dW += dyᵀ·x, db += Σ_rows dy (in row order).
void linear_backward(const float* x, const float* dy, int64_t rows, int64_t in, int64_t out,
                     const float* w, float* dx, float* dw, float* db, int threads);

}  // namespace maskattn::model
