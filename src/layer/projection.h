// The layer's per-token arithmetic on f32 rows: projections (nn.Linear) and their gradients on
// the dense products (kernels/gemm.h for the layer's forward and backward, kernels/matmul.h for the
// KV-cache path), conversion between a [B, L, E] view and contiguous rows, and the
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

// Where a projection of `count` values writes its f32 results so that they end in `bytes` in
// `dtype`: for f32, `bytes` itself (resized; nothing to round, so no copy); otherwise `f32`, which
// finish_as then rounds into `bytes`.
float* projection_target(DType dtype, int64_t count, std::vector<float>& f32,
                         std::vector<uint8_t>& bytes);
void finish_as(DType dtype, const std::vector<float>& f32, int64_t count,
               std::vector<uint8_t>& bytes);

// `dtype` bytes as f32 (in `buffer`, or in place for f32).
const float* load_as_f32(DType dtype, const std::vector<uint8_t>& bytes, int64_t count,
                         std::vector<float>& buffer);

// Which product a projection runs on. `batched` (forward and backward over whole sequences): the
// library product of kernels/gemm.h, the fastest on many rows, with bits that do not depend on the
// thread count. `per_row` (forward_cached, i.e. prefill and decoding through the KV cache):
// kernels/matmul.h, whose rows come out bitwise the same whatever other rows share the call (a
// padded batch decodes exactly as its sequences alone) and which has no library overhead on a
// decode step's one row.
enum class Rows : uint8_t { batched, per_row };

// A projection's weights: W [out, in] as nn.Linear stores it, its transpose [in, out] (what
// kernels/matmul.h reads), and the bias [out] or empty.
struct Projection {
  const Array<float>& weight;
  const std::vector<float>& weight_t;
  const Array<float>& bias;
};

// y [rows, out] = x [rows, in] · Wᵀ + bias.
void linear(const float* x, int64_t rows, int64_t in, const Projection& projection, int64_t out,
            float* y, int threads, Rows path);

// out [B, L, E] = heads [B·L, in] · Wᵀ + bias: straight into `out` when it is contiguous f32, else
// through `buffer`.
void output_projection(const float* heads, int64_t in, const Projection& projection,
                       const MutableTensorView& out, std::vector<float>& buffer, int threads,
                       Rows path);

// The gradients of y = x·Wᵀ + b from dy: dW = dyᵀ·x [out, in], db = Σ dy, and dx = dy·W (on
// kernels/gemm.h).
struct LinearGradients {
  Array<float> dx, dweight, dbias;
};
LinearGradients linear_backward(const float* x, const float* dy, int64_t rows, int64_t in,
                                int64_t out, const Array<float>& weight, bool bias,
                                const Dims& x_shape, int threads);

}  // namespace maskattn::detail
