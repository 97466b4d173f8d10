// The layer's per-token arithmetic on f32 rows: projections (nn.Linear) on the dense product
// kernel and their gradients, conversion between a [B, L, E] view and contiguous rows, and the
// [B, L, H·W] buffer seen as the [B, H, L, W] heads the attention kernel takes.
#pragma once

#include <cstdint>
#include <vector>

#include "maskattn/array.h"
#include "maskattn/dtype.h"
#include "maskattn/shape.h"
#include "maskattn/tensor.h"

namespace maskattn::detail {

// A [B, L, H·W] buffer of element type `dtype` seen as [B, H, L, W]: the head split by strides.
TensorView heads_view(const void* data, DType dtype, int64_t batch, int64_t length, int64_t heads,
                      int64_t width);
MutableTensorView mutable_heads_view(void* data, DType dtype, int64_t batch, int64_t length,
                                     int64_t heads, int64_t width);

// A [B, L, E] view whose rows are already contiguous f32 [B·L, E].
bool is_contiguous_f32(const TensorView& t);

// The rows of a [B, L, E] view as contiguous f32 [B·L, E] (in `buffer`, or in place when they
// already are).
const float* rows_as_f32(const TensorView& x, std::vector<float>& buffer);

// f32 values rounded into `dtype` bytes (a plain copy for f32).
void store_as(DType dtype, const float* values, int64_t count, std::vector<uint8_t>& bytes);

// `dtype` bytes as f32 (in `buffer`, or in place for f32).
const float* load_as_f32(DType dtype, const std::vector<uint8_t>& bytes, int64_t count,
                         std::vector<float>& buffer);

// y [rows, out] = x [rows, in] · Wᵀ + bias, with Wᵀ given as [in, out].
void linear(const float* x, int64_t rows, int64_t in, const std::vector<float>& weight_t,
            const Array<float>& bias, int64_t out, float* y, int threads);

// out [B, L, E] = heads [B·L, in] · Wᵀ + bias: straight into `out` when it is contiguous f32, else
// through `buffer`.
void output_projection(const float* heads, int64_t in, const std::vector<float>& weight_t,
                       const Array<float>& bias, const MutableTensorView& out,
                       std::vector<float>& buffer, int threads);

// The gradients of y = x·Wᵀ + b from dy: dW = dyᵀ·x [out, in], db = Σ dy, and dx = dy·W.
struct LinearGradients {
  Array<float> dx, dweight, dbias;
};
LinearGradients linear_backward(const float* x, const float* dy, int64_t rows, int64_t in,
                                int64_t out, const Array<float>& weight, bool bias,
                                const Dims& x_shape, int threads);

}  // namespace maskattn::detail
