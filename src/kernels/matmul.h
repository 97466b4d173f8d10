// Dense f32 matrix products for the projections of MultiHeadAttention, on the fused backward
// kernel's register-blocked product (kernels/product-inl.h), compiled per SIMD target.
#pragma once

#include <cstdint>

namespace maskattn::detail {

// C[m][n] (+)= Σ_{p < inner} A[m·a_row + p·a_col] · B[p·b_stride + n]   for m < rows, n < cols.
// A with (a_row, a_col) = (inner, 1) is a row-major matrix, with (1, rows) its transpose. With
// `accumulate` false C is overwritten. Each element is one sum over p in order, so the result does
// not depend on `threads` (0 = OpenMP's default) or on which other rows are in the call.
void matmul(const float* a, int64_t a_row, int64_t a_col, int64_t rows, int64_t inner,
            const float* b, int64_t b_stride, int64_t cols, float* c, int64_t c_stride,
            bool accumulate, int threads);

}  // namespace maskattn::detail
