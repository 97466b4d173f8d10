// Dense layers of the GPT model: y = x·Wᵀ + b with W [out, in] as PyTorch's nn.Linear stores it,
// and its backward. Training (whole batches) runs on the library product of kernels/gemm.h, whose
// bits do not depend on the thread count; the decoders (one or a few rows per step, served batches
// that must equal each request alone) run on kernels/matmul.h, where every row is one sum in a
// fixed order whatever other rows share the call, and which reads Wᵀ by rows.
#pragma once

#include <cstdint>
#include <vector>

namespace maskattn::model {

// out [cols, rows] = in [rows, cols] transposed.
void transpose(const float* in, int64_t rows, int64_t cols, std::vector<float>& out);

// y [rows, out] = x [rows, in] · Wᵀ + b, given W [out, in] (kernels/gemm.h); with `residual`
// [rows, out], y = (x·Wᵀ + b) + residual (a block's residual connection, added in the product's
// epilogue; y may not alias it).
void linear_forward(const float* x, int64_t rows, int64_t in, const float* w, const float* b,
                    int64_t out, float* y, int threads, const float* residual = nullptr);

// The same on kernels/matmul.h, given wt = Wᵀ [in, out]: each row's bits do not depend on the
// other rows (the decoders' path).
void linear_forward_per_row(const float* x, int64_t rows, int64_t in, const float* wt,
                            const float* b, int64_t out, float* y, int threads);

// For y = x·Wᵀ + b: dx = dy·W (overwritten, or added to with `accumulate_dx`), dW += dyᵀ·x,
// db += Σ_rows dy (in row order).
void linear_backward(const float* x, const float* dy, int64_t rows, int64_t in, int64_t out,
                     const float* w, float* dx, float* dw, float* db, int threads,
                     bool accumulate_dx = false);

}  // namespace maskattn::model
