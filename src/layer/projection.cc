// The layer's per-token arithmetic (layer/projection.h).
#include "layer/projection.h"

#include <cstring>
#include <utility>

#include "core/element.h"
#include "kernels/gemm.h"
#include "kernels/matmul.h"

namespace maskattn::detail {

namespace {

Dims head_strides(int64_t length, int64_t heads, int64_t width) {
  return {length * heads * width, width, heads * width, 1};
}

// Σ over rows of a [rows, cols] matrix: a bias's gradient.
Array<float> column_sums(const float* matrix, int64_t rows, int64_t cols) {
  std::vector<float> sums(static_cast<size_t>(cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) sums[c] += matrix[r * cols + c];
  }
  return Array<float>({cols}, std::move(sums));
}

// Writes f32 rows [B·L, E] into a [B, L, E] view of any dtype and strides.
void store_rows(const float* rows, const MutableTensorView& out) {
  const int64_t batch = out.size(0), length = out.size(1), width = out.size(2);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < length; ++t, rows += width) {
      const int64_t first = out.offset({b, t, 0, 0});
      for (int64_t e = 0; e < width; ++e) store_float(out, first + e * out.stride(2), rows[e]);
    }
  }
}

}  // namespace

TensorView heads_view(const void* data, DType dtype, int64_t batch, int64_t length, int64_t heads,
                      int64_t width) {
  return TensorView(data, dtype, {batch, heads, length, width}, head_strides(length, heads, width));
}
MutableTensorView mutable_heads_view(void* data, DType dtype, int64_t batch, int64_t length,
                                     int64_t heads, int64_t width) {
  return MutableTensorView(data, dtype, {batch, heads, length, width},
                           head_strides(length, heads, width));
}

bool is_contiguous_f32(const TensorView& t) {
  return t.dtype() == DType::f32 && t.stride(2) == 1 && t.stride(1) == t.size(2) &&
         (t.size(0) == 1 || t.stride(0) == t.size(1) * t.size(2));
}

const float* rows_as_f32(const TensorView& x, std::vector<float>& buffer) {
  if (is_contiguous_f32(x)) return static_cast<const float*>(x.data());
  const int64_t batch = x.size(0), length = x.size(1), width = x.size(2);
  buffer.resize(static_cast<size_t>(batch * length * width));
  float* row = buffer.data();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < length; ++t, row += width) {
      const int64_t first = x.offset({b, t, 0, 0});
      for (int64_t e = 0; e < width; ++e) row[e] = load_float(x, first + e * x.stride(2));
    }
  }
  return buffer.data();
}

void linear(const float* x, int64_t rows, int64_t in, const Projection& projection, int64_t out,
            float* y, int threads, Rows path) {
  const bool bias = !projection.bias.empty();
  if (bias) {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(y + r * out, projection.bias.data(), out * sizeof(float));
    }
  }
  if (path == Rows::per_row) {
    matmul(x, in, 1, rows, in, projection.weight_t.data(), out, out, y, out, bias, threads);
    return;
  }
  gemm(Layout::as_stored, Layout::transposed, rows, out, in, x, in, projection.weight.data(), in, y,
       out, bias, threads);
}

void store_as(DType dtype, const float* values, int64_t count, std::vector<uint8_t>& bytes) {
  bytes.resize(static_cast<size_t>(count) * dtype_size(dtype));
  if (count == 0) return;  // an empty batch: no pointer to copy to or from
  const MutableTensorView to(bytes.data(), dtype, {count});
  if (dtype == DType::f32) {
    std::memcpy(bytes.data(), values, count * sizeof(float));
    return;
  }
  for (int64_t n = 0; n < count; ++n) store_float(to, n, values[n]);
}

float* projection_target(DType dtype, int64_t count, std::vector<float>& f32,
                         std::vector<uint8_t>& bytes) {
  if (dtype == DType::f32) {
    bytes.resize(static_cast<size_t>(count) * sizeof(float));  // operator new: float-aligned
    return reinterpret_cast<float*>(bytes.data());
  }
  f32.resize(static_cast<size_t>(count));
  return f32.data();
}

void finish_as(DType dtype, const std::vector<float>& f32, int64_t count,
               std::vector<uint8_t>& bytes) {
  if (dtype != DType::f32) store_as(dtype, f32.data(), count, bytes);
}

const float* load_as_f32(DType dtype, const std::vector<uint8_t>& bytes, int64_t count,
                         std::vector<float>& buffer) {
  if (dtype == DType::f32) return reinterpret_cast<const float*>(bytes.data());
  buffer.resize(static_cast<size_t>(count));
  const TensorView from(bytes.data(), dtype, {count});
  for (int64_t n = 0; n < count; ++n) buffer[n] = load_float(from, n);
  return buffer.data();
}

void output_projection(const float* heads, int64_t in, const Projection& projection,
                       const MutableTensorView& out, std::vector<float>& buffer, int threads,
                       Rows path) {
  const int64_t rows = out.size(0) * out.size(1), width = out.size(2);
  const bool direct = is_contiguous_f32(out);
  if (!direct) buffer.resize(static_cast<size_t>(rows * width));
  float* y = direct ? static_cast<float*>(out.mutable_data()) : buffer.data();
  linear(heads, rows, in, projection, width, y, threads, path);
  if (!direct) store_rows(y, out);
}

LinearGradients linear_backward(const float* x, const float* dy, int64_t rows, int64_t in,
                                int64_t out, const Array<float>& weight, bool bias,
                                const Dims& x_shape, int threads) {
  std::vector<float> dweight(static_cast<size_t>(out * in));
  gemm(Layout::transposed, Layout::as_stored, out, in, rows, dy, out, x, in, dweight.data(), in,
       false, threads);
  std::vector<float> dx(static_cast<size_t>(rows * in));
  gemm(Layout::as_stored, Layout::as_stored, rows, in, out, dy, out, weight.data(), in, dx.data(),
       in, false, threads);
  LinearGradients result{
      Array<float>(x_shape, std::move(dx)), Array<float>({out, in}, std::move(dweight)), {}};
  if (bias) result.dbias = column_sums(dy, rows, out);
  return result;
}

}  // namespace maskattn::detail
