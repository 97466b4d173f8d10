// MultiHeadAttention (include/maskattn/multihead.h): projections on the dense product kernel,
// attention on the masked kernels, heads split and merged by strides.
//
// Buffers: a call's f32 projections live in vectors of the calling thread kept across calls
// (kernels/work_items.h: a fresh allocation would be page faults, 11–16 µs per 4 KiB here); only
// what forward() saves for backward() and backward()'s results are allocated per call.
#include "maskattn/multihead.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <utility>

#include "core/element.h"
#include "kernels/matmul.h"
#include "kernels/work_items.h"
#include "maskattn/error.h"
#include "maskattn/memory.h"
#include "maskattn/npy.h"
#include "validate.h"

namespace maskattn {

namespace {

using detail::fused::reused;
struct LayerBuffers;  // owner tag of the reused vectors

// A [B, L, H·W] buffer of element type `dtype` seen as [B, H, L, W]: the head split by strides.
Dims head_strides(int64_t length, int64_t heads, int64_t width) {
  return {length * heads * width, width, heads * width, 1};
}
TensorView heads_view(const void* data, DType dtype, int64_t batch, int64_t length, int64_t heads,
                      int64_t width) {
  return TensorView(data, dtype, {batch, heads, length, width}, head_strides(length, heads, width));
}
MutableTensorView mutable_heads_view(void* data, DType dtype, int64_t batch, int64_t length,
                                     int64_t heads, int64_t width) {
  return MutableTensorView(data, dtype, {batch, heads, length, width},
                           head_strides(length, heads, width));
}

std::vector<float> transposed(const Array<float>& matrix) {
  const int64_t rows = matrix.dim(0), cols = matrix.dim(1);
  std::vector<float> result(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) result[c * rows + r] = matrix.at(r, c);
  }
  return result;
}

// A [B, L, E] view whose rows are already contiguous f32 [B·L, E].
bool is_contiguous_f32(const TensorView& t) {
  return t.dtype() == DType::f32 && t.stride(2) == 1 && t.stride(1) == t.size(2) &&
         (t.size(0) == 1 || t.stride(0) == t.size(1) * t.size(2));
}

// The rows of a [B, L, E] view as contiguous f32 [B·L, E] (in `buffer`, or in place when they
// already are).
const float* rows_as_f32(const TensorView& x, std::vector<float>& buffer) {
  if (is_contiguous_f32(x)) return static_cast<const float*>(x.data());
  const int64_t batch = x.size(0), length = x.size(1), width = x.size(2);
  buffer.resize(static_cast<size_t>(batch * length * width));
  float* row = buffer.data();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < length; ++t, row += width) {
      const int64_t first = x.offset({b, t, 0, 0});
      for (int64_t e = 0; e < width; ++e) row[e] = detail::load_float(x, first + e * x.stride(2));
    }
  }
  return buffer.data();
}

// y [rows, out] = x [rows, in] · Wᵀ + bias, with Wᵀ given as [in, out].
void linear(const float* x, int64_t rows, int64_t in, const std::vector<float>& weight_t,
            const Array<float>& bias, int64_t out, float* y, int threads) {
  if (!bias.empty()) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(y + r * out, bias.data(), out * sizeof(float));
  }
  detail::matmul(x, in, 1, rows, in, weight_t.data(), out, out, y, out, !bias.empty(), threads);
}

// f32 values rounded into `dtype` bytes (a plain copy for f32).
void store_as(DType dtype, const float* values, int64_t count, std::vector<uint8_t>& bytes) {
  bytes.resize(static_cast<size_t>(count) * dtype_size(dtype));
  if (count == 0) return;  // an empty batch: no pointer to copy to or from
  const MutableTensorView to(bytes.data(), dtype, {count});
  if (dtype == DType::f32) {
    std::memcpy(bytes.data(), values, count * sizeof(float));
    return;
  }
  for (int64_t n = 0; n < count; ++n) detail::store_float(to, n, values[n]);
}

// `dtype` bytes as f32 (in `buffer`, or in place for f32).
const float* load_as_f32(DType dtype, const std::vector<uint8_t>& bytes, int64_t count,
                         std::vector<float>& buffer) {
  if (dtype == DType::f32) return reinterpret_cast<const float*>(bytes.data());
  buffer.resize(static_cast<size_t>(count));
  const TensorView from(bytes.data(), dtype, {count});
  for (int64_t n = 0; n < count; ++n) buffer[n] = detail::load_float(from, n);
  return buffer.data();
}

// Σ over rows of a [rows, cols] matrix: a bias's gradient.
Array<float> column_sums(const float* matrix, int64_t rows, int64_t cols) {
  std::vector<float> sums(static_cast<size_t>(cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) sums[c] += matrix[r * cols + c];
  }
  return Array<float>({cols}, std::move(sums));
}

// The gradients of y = x·Wᵀ + b from dy: dW = dyᵀ·x [out, in], db = Σ dy, and dx = dy·W.
struct LinearGradients {
  Array<float> dx, dweight, dbias;
};
LinearGradients linear_backward(const float* x, const float* dy, int64_t rows, int64_t in,
                                int64_t out, const Array<float>& weight, bool bias,
                                const Dims& x_shape, int threads) {
  std::vector<float> dweight(static_cast<size_t>(out * in));
  detail::matmul(dy, 1, out, out, rows, x, in, in, dweight.data(), in, false, threads);
  std::vector<float> dx(static_cast<size_t>(rows * in));
  detail::matmul(dy, out, 1, rows, out, weight.data(), in, in, dx.data(), in, false, threads);
  LinearGradients result{
      Array<float>(x_shape, std::move(dx)), Array<float>({out, in}, std::move(dweight)), {}};
  if (bias) result.dbias = column_sums(dy, rows, out);
  return result;
}

void require_matrix(const Array<float>& w, const std::string& name) {
  if (w.rank() != 2 || w.dim(0) <= 0 || w.dim(1) <= 0) {
    throw Error("MultiHeadAttention " + name + " has shape " + shape_string(w.shape()) +
                "; expected a non-empty [out_features, in_features] matrix");
  }
}

void require_bias(const Array<float>& bias, int64_t rows, const std::string& name) {
  if (bias.shape() != Dims{rows}) {
    throw Error("MultiHeadAttention " + name + " has shape " + shape_string(bias.shape()) +
                "; expected [" + std::to_string(rows) + "]");
  }
}

// Uniform in ±bound, seeded: nn.Linear's default initialisation.
Array<float> uniform(Dims shape, double bound, std::mt19937_64& random) {
  std::uniform_real_distribution<double> draw(-bound, bound);
  std::vector<float> values(static_cast<size_t>(checked_numel(shape, "weight")));
  for (float& value : values) value = static_cast<float>(draw(random));
  return Array<float>(std::move(shape), std::move(values));
}

Array<float> read_matrix(const std::filesystem::path& path, int rank) {
  const NpyArray array = read_npy(path.string());
  if (array.rank() != rank) {
    throw Error(path.string() + " has shape " + shape_string(array.shape()) + "; expected " +
                (rank == 2 ? "a [out_features, in_features] matrix" : "a vector"));
  }
  return Array<float>(array.shape(), array.to_float32(path.string()));
}

// Rows [first, first + count) of a matrix or vector.
Array<float> row_slice(const Array<float>& a, int64_t first, int64_t count) {
  const int64_t width = a.rank() == 2 ? a.dim(1) : 1;
  Dims shape = a.shape();
  shape[0] = count;
  return Array<float>(shape, std::vector<float>(a.values().begin() + first * width,
                                                a.values().begin() + (first + count) * width));
}

Array<float> stacked(const std::vector<const Array<float>*>& parts) {
  std::vector<float> values;
  Dims shape = parts.front()->shape();
  shape[0] = 0;
  for (const Array<float>* part : parts) {
    values.insert(values.end(), part->values().begin(), part->values().end());
    shape[0] += part->dim(0);
  }
  return Array<float>(shape, std::move(values));
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(LayerWeights weights, int64_t heads, int64_t kv_heads)
    : weights_(std::move(weights)), heads_(heads), kv_heads_(kv_heads == 0 ? heads : kv_heads) {
  const LayerWeights& w = weights_;
  require_matrix(w.q_weight, "q_weight");
  require_matrix(w.k_weight, "k_weight");
  require_matrix(w.v_weight, "v_weight");
  require_matrix(w.out_weight, "out_weight");
  if (heads_ <= 0 || kv_heads_ <= 0 || heads_ % kv_heads_ != 0) {
    throw Error("MultiHeadAttention needs heads > 0 and kv_heads dividing it; got heads " +
                std::to_string(heads_) + ", kv_heads " + std::to_string(kv_heads_));
  }
  const auto divide = [](int64_t rows, int64_t by, const char* name, const char* count) {
    if (rows % by != 0) {
      throw Error(std::string("MultiHeadAttention ") + name + " has " + std::to_string(rows) +
                  " rows, not a multiple of " + count + " " + std::to_string(by));
    }
    return rows / by;
  };
  head_dim_ = divide(w.q_weight.dim(0), heads_, "q_weight", "heads");
  head_value_dim_ = divide(w.v_weight.dim(0), kv_heads_, "v_weight", "kv_heads");
  if (w.k_weight.dim(0) != kv_heads_ * head_dim_) {
    throw Error("MultiHeadAttention k_weight has shape " + shape_string(w.k_weight.shape()) +
                "; with kv_heads " + std::to_string(kv_heads_) + " and head_dim " +
                std::to_string(head_dim_) + " (from q_weight " + shape_string(w.q_weight.shape()) +
                ", heads " + std::to_string(heads_) + ") it needs " +
                std::to_string(kv_heads_ * head_dim_) + " rows");
  }
  if (w.out_weight.dim(1) != heads_ * head_value_dim_) {
    throw Error("MultiHeadAttention out_weight has shape " + shape_string(w.out_weight.shape()) +
                "; it needs heads · head value dim = " + std::to_string(heads_ * head_value_dim_) +
                " columns");
  }
  embed_dim_ = w.out_weight.dim(0);
  const int biases =
      !w.q_bias.empty() + !w.k_bias.empty() + !w.v_bias.empty() + !w.out_bias.empty();
  if (biases != 0 && biases != 4) {
    throw Error("MultiHeadAttention needs all four biases or none; got " + std::to_string(biases));
  }
  if (biases == 4) {
    require_bias(w.q_bias, w.q_weight.dim(0), "q_bias");
    require_bias(w.k_bias, w.k_weight.dim(0), "k_bias");
    require_bias(w.v_bias, w.v_weight.dim(0), "v_bias");
    require_bias(w.out_bias, embed_dim_, "out_bias");
  }
  q_weight_t_ = transposed(w.q_weight);
  k_weight_t_ = transposed(w.k_weight);
  v_weight_t_ = transposed(w.v_weight);
  out_weight_t_ = transposed(w.out_weight);
}

int64_t MultiHeadAttention::query_dim() const {
  return weights_.q_weight.dim(1);
}
int64_t MultiHeadAttention::key_dim() const {
  return weights_.k_weight.dim(1);
}
int64_t MultiHeadAttention::value_dim() const {
  return weights_.v_weight.dim(1);
}

MultiHeadAttention MultiHeadAttention::random(int64_t embed_dim, int64_t heads, int64_t kv_heads,
                                              uint64_t seed, bool bias) {
  if (embed_dim <= 0 || heads <= 0 || embed_dim % heads != 0) {
    throw Error("MultiHeadAttention::random needs embed_dim divisible by heads; got embed_dim " +
                std::to_string(embed_dim) + ", heads " + std::to_string(heads));
  }
  if (kv_heads == 0) kv_heads = heads;
  if (kv_heads < 0 || heads % kv_heads != 0) {
    throw Error("MultiHeadAttention::random needs kv_heads dividing heads; got heads " +
                std::to_string(heads) + ", kv_heads " + std::to_string(kv_heads));
  }
  const int64_t kv_rows = embed_dim / heads * kv_heads;
  const double bound = 1.0 / std::sqrt(static_cast<double>(embed_dim));
  std::mt19937_64 random(seed);
  LayerWeights w;
  w.q_weight = uniform({embed_dim, embed_dim}, bound, random);
  w.k_weight = uniform({kv_rows, embed_dim}, bound, random);
  w.v_weight = uniform({kv_rows, embed_dim}, bound, random);
  w.out_weight = uniform({embed_dim, embed_dim}, bound, random);
  if (bias) {
    w.q_bias = uniform({embed_dim}, bound, random);
    w.k_bias = uniform({kv_rows}, bound, random);
    w.v_bias = uniform({kv_rows}, bound, random);
    w.out_bias = uniform({embed_dim}, bound, random);
  }
  return MultiHeadAttention(std::move(w), heads, kv_heads);
}

MultiHeadAttention MultiHeadAttention::load(const std::string& directory, int64_t heads,
                                            int64_t kv_heads) {
  namespace fs = std::filesystem;
  const fs::path dir(directory);
  if (!fs::is_directory(dir)) {
    throw Error("weights directory '" + directory + "' does not exist or is not a directory");
  }
  if (heads <= 0 || kv_heads < 0 || (kv_heads > 0 && heads % kv_heads != 0)) {
    throw Error("MultiHeadAttention needs heads > 0 and kv_heads dividing it; got heads " +
                std::to_string(heads) + ", kv_heads " + std::to_string(kv_heads));
  }
  if (kv_heads == 0) kv_heads = heads;
  for (const char* name : {"bias_k.npy", "bias_v.npy"}) {
    if (fs::exists(dir / name)) {
      throw Error("weights directory '" + directory + "' holds " + name +
                  ": nn.MultiheadAttention's add_bias_kv (a learned key and value appended to "
                  "every sequence) is not supported");
    }
  }
  LayerWeights w;
  const fs::path packed = dir / "in_proj_weight.npy";
  const bool has_packed = fs::exists(packed);
  if (has_packed) {
    // [Hq·D + 2·Hkv·D, E]: with E = Hq·D (nn.MultiheadAttention), the rows are Hq·D·(1 + 2/g).
    const Array<float> in_proj = read_matrix(packed, 2);
    const int64_t rows = in_proj.dim(0);
    // heads + 2·kv_heads ≤ rows, else there is not one row per head (and rows·heads could
    // overflow).
    const bool fits = heads <= rows && kv_heads <= rows && heads + 2 * kv_heads <= rows;
    const int64_t q_rows = fits ? rows * heads / (heads + 2 * kv_heads) : 0;
    if (!fits || q_rows * (heads + 2 * kv_heads) != rows * heads || q_rows % heads != 0) {
      throw Error(packed.string() + " has shape " + shape_string(in_proj.shape()) +
                  "; with heads " + std::to_string(heads) + " and kv_heads " +
                  std::to_string(kv_heads) + " its rows must be (heads + 2·kv_heads)·head_dim");
    }
    const int64_t kv_rows = q_rows / heads * kv_heads;
    w.q_weight = row_slice(in_proj, 0, q_rows);
    w.k_weight = row_slice(in_proj, q_rows, kv_rows);
    w.v_weight = row_slice(in_proj, q_rows + kv_rows, kv_rows);
  } else {
    for (const char* name : {"q_proj_weight.npy", "k_proj_weight.npy", "v_proj_weight.npy"}) {
      if (!fs::exists(dir / name)) {
        throw Error("weights directory '" + directory + "' has neither in_proj_weight.npy nor " +
                    name);
      }
    }
    w.q_weight = read_matrix(dir / "q_proj_weight.npy", 2);
    w.k_weight = read_matrix(dir / "k_proj_weight.npy", 2);
    w.v_weight = read_matrix(dir / "v_proj_weight.npy", 2);
  }
  const fs::path out_weight = dir / "out_proj.weight.npy";
  if (!fs::exists(out_weight)) {
    throw Error("weights directory '" + directory + "' has no out_proj.weight.npy");
  }
  w.out_weight = read_matrix(out_weight, 2);
  const fs::path in_bias = dir / "in_proj_bias.npy", out_bias = dir / "out_proj.bias.npy";
  if (fs::exists(in_bias) != fs::exists(out_bias)) {
    throw Error("weights directory '" + directory +
                "' must hold both in_proj_bias.npy and out_proj.bias.npy, or neither");
  }
  if (fs::exists(in_bias)) {
    const Array<float> bias = read_matrix(in_bias, 1);
    const int64_t q_rows = w.q_weight.dim(0), k_rows = w.k_weight.dim(0);
    const int64_t v_rows = w.v_weight.dim(0);
    if (bias.dim(0) != q_rows + k_rows + v_rows) {
      throw Error(in_bias.string() + " has shape " + shape_string(bias.shape()) + "; expected [" +
                  std::to_string(q_rows + k_rows + v_rows) + "] (the q, k and v rows)");
    }
    w.q_bias = row_slice(bias, 0, q_rows);
    w.k_bias = row_slice(bias, q_rows, k_rows);
    w.v_bias = row_slice(bias, q_rows + k_rows, v_rows);
    w.out_bias = read_matrix(out_bias, 1);
  }
  return MultiHeadAttention(std::move(w), heads, kv_heads);
}

void MultiHeadAttention::save(const std::string& directory) const {
  namespace fs = std::filesystem;
  const fs::path dir(directory);
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) throw Error("cannot create weights directory '" + directory + "': " + error.message());
  const auto write = [&](const char* name, const Array<float>& a) {
    write_npy((dir / name).string(), NpyArray::from_floats(a.values(), a.shape()));
  };
  const LayerWeights& w = weights_;
  // The packed form has one head dim for q, k and v rows (load() splits it by the head counts).
  const bool packed =
      key_dim() == query_dim() && value_dim() == query_dim() && head_value_dim_ == head_dim_;
  if (packed) {
    write("in_proj_weight.npy", stacked({&w.q_weight, &w.k_weight, &w.v_weight}));
  } else {
    write("q_proj_weight.npy", w.q_weight);
    write("k_proj_weight.npy", w.k_weight);
    write("v_proj_weight.npy", w.v_weight);
  }
  write("out_proj.weight.npy", w.out_weight);
  if (has_bias()) {
    write("in_proj_bias.npy", stacked({&w.q_bias, &w.k_bias, &w.v_bias}));
    write("out_proj.bias.npy", w.out_bias);
  }
}

KVCache MultiHeadAttention::make_cache(int64_t batch, int64_t capacity, DType dtype) const {
  return KVCache(batch, kv_heads_, capacity, head_dim_, dtype, head_value_dim_);
}

namespace {

// A [B, L, width] input of the layer.
void require_tokens(const TensorView& x, const char* name, int64_t width, const char* weight,
                    const Dims& weight_shape) {
  detail::require_view(x, 3, name, "[B,L,E]");
  if (x.size(2) != width) {
    throw Error(std::string(name) + " has shape " + x.shape_string() + " but the layer's " +
                weight + " " + shape_string(weight_shape) + " takes " + std::to_string(width) +
                " features per token");
  }
}

// Writes f32 rows [B·L, E] into a [B, L, E] view of any dtype and strides.
void store_rows(const float* rows, const MutableTensorView& out) {
  const int64_t batch = out.size(0), length = out.size(1), width = out.size(2);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < length; ++t, rows += width) {
      const int64_t first = out.offset({b, t, 0, 0});
      for (int64_t e = 0; e < width; ++e)
        detail::store_float(out, first + e * out.stride(2), rows[e]);
    }
  }
}

// out [B, L, E] = heads [B·L, in] · Wᵀ + bias: straight into `out` when it is contiguous f32, else
// through `buffer` and store_rows().
void output_projection(const float* heads, int64_t in, const std::vector<float>& weight_t,
                       const Array<float>& bias, const MutableTensorView& out,
                       std::vector<float>& buffer, int threads) {
  const int64_t rows = out.size(0) * out.size(1), width = out.size(2);
  const bool direct = is_contiguous_f32(out);
  if (!direct) buffer.resize(static_cast<size_t>(rows * width));
  float* y = direct ? static_cast<float*>(out.mutable_data()) : buffer.data();
  linear(heads, rows, in, weight_t, bias, width, y, threads);
  if (!direct) store_rows(y, out);
}

}  // namespace

void MultiHeadAttention::forward(const TensorView& query, const TensorView& key,
                                 const TensorView& value, const MutableTensorView& out,
                                 const Mask& mask, const ScoreMods& mods,
                                 const LayerOptions& options, LayerActivations* saved) const {
  const LayerWeights& w = weights_;
  require_tokens(query, "query", query_dim(), "q_weight", w.q_weight.shape());
  require_tokens(key, "key", key_dim(), "k_weight", w.k_weight.shape());
  require_tokens(value, "value", value_dim(), "v_weight", w.v_weight.shape());
  const int64_t batch = query.size(0), q_len = query.size(1), k_len = key.size(1);
  if (key.size(0) != batch || value.size(0) != batch || value.size(1) != k_len) {
    throw Error("query " + query.shape_string() + ", key " + key.shape_string() + " and value " +
                value.shape_string() + " must share B, and key and value their length");
  }
  detail::require_output(
      out, {batch, q_len, embed_dim_}, out.dtype(), "out",
      "query " + query.shape_string() + " and out_weight " + shape_string(w.out_weight.shape()));
  detail::require_disjoint(out, "out", query, "query");
  detail::require_disjoint(out, "out", key, "key");
  detail::require_disjoint(out, "out", value, "value");
  const int64_t q_count = batch * q_len * heads_ * head_dim_;
  const int64_t k_count = batch * k_len * kv_heads_ * head_dim_;
  const int64_t v_count = batch * k_len * kv_heads_ * head_value_dim_;
  const int64_t o_count = batch * q_len * heads_ * head_value_dim_;
  require_memory(4.0 * (2.0 * (q_count + k_count + v_count + o_count) +
                        static_cast<double>(batch) * q_len * embed_dim_),
                 "MultiHeadAttention::forward on query " + query.shape_string());
  const int threads = options.attention.threads;
  const DType dtype = options.dtype;

  // Projections (f32), then Q, K, V in the compute dtype.
  const float* xq = rows_as_f32(query, reused<float, LayerBuffers, 0>());
  const float* xk = rows_as_f32(key, reused<float, LayerBuffers, 1>());
  const float* xv = rows_as_f32(value, reused<float, LayerBuffers, 2>());
  std::vector<float>& qf = reused<float, LayerBuffers, 3>();
  std::vector<float>& kf = reused<float, LayerBuffers, 4>();
  std::vector<float>& vf = reused<float, LayerBuffers, 5>();
  qf.resize(q_count);
  kf.resize(k_count);
  vf.resize(v_count);
  linear(xq, batch * q_len, query_dim(), q_weight_t_, w.q_bias, heads_ * head_dim_, qf.data(),
         threads);
  linear(xk, batch * k_len, key_dim(), k_weight_t_, w.k_bias, kv_heads_ * head_dim_, kf.data(),
         threads);
  linear(xv, batch * k_len, value_dim(), v_weight_t_, w.v_bias, kv_heads_ * head_value_dim_,
         vf.data(), threads);
  std::vector<uint8_t>& q_bytes = reused<uint8_t, LayerBuffers, 0>();
  std::vector<uint8_t>& k_bytes = reused<uint8_t, LayerBuffers, 1>();
  std::vector<uint8_t>& v_bytes = reused<uint8_t, LayerBuffers, 2>();
  std::vector<uint8_t>& o_bytes = reused<uint8_t, LayerBuffers, 3>();
  store_as(dtype, qf.data(), q_count, q_bytes);
  store_as(dtype, kf.data(), k_count, k_bytes);
  store_as(dtype, vf.data(), v_count, v_bytes);
  o_bytes.resize(static_cast<size_t>(o_count) * dtype_size(dtype));

  MutableTensorView lse;
  if (saved != nullptr) {
    saved->lse.resize(static_cast<size_t>(batch * heads_ * q_len));
    lse = MutableTensorView(saved->lse.data(), {batch, heads_, q_len});
  }
  attention(heads_view(q_bytes.data(), dtype, batch, q_len, heads_, head_dim_),
            heads_view(k_bytes.data(), dtype, batch, k_len, kv_heads_, head_dim_),
            heads_view(v_bytes.data(), dtype, batch, k_len, kv_heads_, head_value_dim_),
            mutable_heads_view(o_bytes.data(), dtype, batch, q_len, heads_, head_value_dim_), mask,
            mods, options.attention, lse);

  // The heads' outputs, merged by layout, through the output projection.
  // kf is dead by now (K went to k_bytes): it serves as the output's buffer.
  output_projection(load_as_f32(dtype, o_bytes, o_count, qf), heads_ * head_value_dim_,
                    out_weight_t_, w.out_bias, out, kf, threads);

  if (saved != nullptr) {
    saved->batch = batch;
    saved->query_length = q_len;
    saved->key_length = k_len;
    saved->dtype = dtype;
    saved->query.assign(xq, xq + batch * q_len * query_dim());
    saved->key.assign(xk, xk + batch * k_len * key_dim());
    saved->value.assign(xv, xv + batch * k_len * value_dim());
    saved->q = q_bytes;
    saved->k = k_bytes;
    saved->v = v_bytes;
    saved->heads = o_bytes;
  }
}

void MultiHeadAttention::forward_cached(const TensorView& query, KVCache& cache,
                                        const MutableTensorView& out, const Mask& mask,
                                        const ScoreMods& mods, const LayerOptions& options) const {
  const LayerWeights& w = weights_;
  require_tokens(query, "query", query_dim(), "q_weight", w.q_weight.shape());
  if (key_dim() != query_dim() || value_dim() != query_dim()) {
    throw Error("forward_cached is self-attention: the layer's key and value inputs (" +
                std::to_string(key_dim()) + ", " + std::to_string(value_dim()) +
                " features) must have the query's width " + std::to_string(query_dim()));
  }
  const int64_t batch = query.size(0), steps = query.size(1);
  if (cache.batch() != batch || cache.kv_heads() != kv_heads_ || cache.head_dim() != head_dim_ ||
      cache.value_dim() != head_value_dim_) {
    throw Error("KVCache [" + std::to_string(cache.batch()) + "," +
                std::to_string(cache.kv_heads()) + ",capacity," + std::to_string(cache.head_dim()) +
                "] does not fit query " + query.shape_string() + " and this layer (kv_heads " +
                std::to_string(kv_heads_) + ", head_dim " + std::to_string(head_dim_) +
                "); make it with make_cache()");
  }
  detail::require_output(out, {batch, steps, embed_dim_}, out.dtype(), "out",
                         "query " + query.shape_string());
  detail::require_disjoint(out, "out", query, "query");
  const int threads = options.attention.threads;
  const DType dtype = cache.dtype();
  const int64_t rows = batch * steps;
  const int64_t q_count = rows * heads_ * head_dim_;
  const int64_t o_count = rows * heads_ * head_value_dim_;

  const float* x = rows_as_f32(query, reused<float, LayerBuffers, 0>());
  std::vector<float>& qf = reused<float, LayerBuffers, 3>();
  std::vector<float>& kf = reused<float, LayerBuffers, 4>();
  std::vector<float>& vf = reused<float, LayerBuffers, 5>();
  qf.resize(q_count);
  kf.resize(rows * kv_heads_ * head_dim_);
  vf.resize(rows * kv_heads_ * head_value_dim_);
  linear(x, rows, query_dim(), q_weight_t_, w.q_bias, heads_ * head_dim_, qf.data(), threads);
  linear(x, rows, query_dim(), k_weight_t_, w.k_bias, kv_heads_ * head_dim_, kf.data(), threads);
  linear(x, rows, query_dim(), v_weight_t_, w.v_bias, kv_heads_ * head_value_dim_, vf.data(),
         threads);
  std::vector<uint8_t>& q_bytes = reused<uint8_t, LayerBuffers, 0>();
  std::vector<uint8_t>& o_bytes = reused<uint8_t, LayerBuffers, 3>();
  store_as(dtype, qf.data(), q_count, q_bytes);
  o_bytes.resize(static_cast<size_t>(o_count) * dtype_size(dtype));

  const int64_t before = cache.length();
  // Refuses a step that does not fit (E89) before changing anything.
  cache.append(heads_view(kf.data(), DType::f32, batch, steps, kv_heads_, head_dim_),
               heads_view(vf.data(), DType::f32, batch, steps, kv_heads_, head_value_dim_));
  try {
    attention(heads_view(q_bytes.data(), dtype, batch, steps, heads_, head_dim_), cache.keys(),
              cache.values(),
              mutable_heads_view(o_bytes.data(), dtype, batch, steps, heads_, head_value_dim_),
              cache.step_mask() & mask, mods, options.attention);
  } catch (...) {
    cache.truncate(before);  // a refused step leaves the cache as it was
    throw;
  }
  // kf is dead by now (K is in the cache): it serves as the output's buffer.
  output_projection(load_as_f32(dtype, o_bytes, o_count, qf), heads_ * head_value_dim_,
                    out_weight_t_, w.out_bias, out, kf, threads);
}

LayerGradients MultiHeadAttention::backward(const LayerActivations& saved, const TensorView& dout,
                                            const Mask& mask, const ScoreMods& mods,
                                            const LayerOptions& options) const {
  const LayerWeights& w = weights_;
  const int64_t batch = saved.batch, q_len = saved.query_length, k_len = saved.key_length;
  const DType dtype = saved.dtype;
  const int64_t q_rows = batch * q_len, k_rows = batch * k_len;
  const int64_t q_width = heads_ * head_dim_, k_width = kv_heads_ * head_dim_;
  const int64_t v_width = kv_heads_ * head_value_dim_, o_width = heads_ * head_value_dim_;
  const size_t size = dtype_size(dtype);
  if (saved.query.size() != static_cast<size_t>(q_rows * query_dim()) ||
      saved.key.size() != static_cast<size_t>(k_rows * key_dim()) ||
      saved.value.size() != static_cast<size_t>(k_rows * value_dim()) ||
      saved.q.size() != q_rows * q_width * size || saved.k.size() != k_rows * k_width * size ||
      saved.v.size() != k_rows * v_width * size || saved.heads.size() != q_rows * o_width * size ||
      saved.lse.size() != static_cast<size_t>(batch * heads_ * q_len)) {
    throw Error("MultiHeadAttention::backward needs the activations this layer's forward() saved");
  }
  if (options.dtype != dtype) {
    throw Error(std::string("MultiHeadAttention::backward got options.dtype ") +
                dtype_name(options.dtype) + " but forward() ran in " + dtype_name(dtype));
  }
  detail::require_view(dout, 3, "dout", "[B,Lq,E]");
  if (dout.sizes() != Dims{batch, q_len, embed_dim_}) {
    throw Error("dout has shape " + dout.shape_string() + " but the layer's output is " +
                shape_string({batch, q_len, embed_dim_}));
  }
  const int threads = options.attention.threads;
  const bool bias = has_bias();
  std::vector<float> buffer;
  const float* dy = rows_as_f32(dout, buffer);

  // Output projection, then the heads' gradient in the compute dtype.
  std::vector<float> heads_buffer;
  const float* heads = load_as_f32(dtype, saved.heads, q_rows * o_width, heads_buffer);
  LinearGradients out_grads = linear_backward(heads, dy, q_rows, o_width, embed_dim_, w.out_weight,
                                              bias, {batch, q_len, o_width}, threads);
  std::vector<uint8_t> dheads, dq(saved.q.size()), dk(saved.k.size()), dv(saved.v.size());
  store_as(dtype, out_grads.dx.data(), q_rows * o_width, dheads);

  Gradients grads;
  grads.dq = mutable_heads_view(dq.data(), dtype, batch, q_len, heads_, head_dim_);
  grads.dk = mutable_heads_view(dk.data(), dtype, batch, k_len, kv_heads_, head_dim_);
  grads.dv = mutable_heads_view(dv.data(), dtype, batch, k_len, kv_heads_, head_value_dim_);
  attention_backward(heads_view(saved.q.data(), dtype, batch, q_len, heads_, head_dim_),
                     heads_view(saved.k.data(), dtype, batch, k_len, kv_heads_, head_dim_),
                     heads_view(saved.v.data(), dtype, batch, k_len, kv_heads_, head_value_dim_),
                     heads_view(saved.heads.data(), dtype, batch, q_len, heads_, head_value_dim_),
                     TensorView(saved.lse.data(), {batch, heads_, q_len}),
                     heads_view(dheads.data(), dtype, batch, q_len, heads_, head_value_dim_), grads,
                     mask, mods, options.attention);

  // The input projections.
  std::vector<float> dq_f32, dk_f32, dv_f32;
  LinearGradients q_grads =
      linear_backward(saved.query.data(), load_as_f32(dtype, dq, q_rows * q_width, dq_f32), q_rows,
                      query_dim(), q_width, w.q_weight, bias, {batch, q_len, query_dim()}, threads);
  LinearGradients k_grads =
      linear_backward(saved.key.data(), load_as_f32(dtype, dk, k_rows * k_width, dk_f32), k_rows,
                      key_dim(), k_width, w.k_weight, bias, {batch, k_len, key_dim()}, threads);
  LinearGradients v_grads =
      linear_backward(saved.value.data(), load_as_f32(dtype, dv, k_rows * v_width, dv_f32), k_rows,
                      value_dim(), v_width, w.v_weight, bias, {batch, k_len, value_dim()}, threads);

  LayerGradients result;
  result.dquery = std::move(q_grads.dx);
  result.dkey = std::move(k_grads.dx);
  result.dvalue = std::move(v_grads.dx);
  result.dweights.q_weight = std::move(q_grads.dweight);
  result.dweights.k_weight = std::move(k_grads.dweight);
  result.dweights.v_weight = std::move(v_grads.dweight);
  result.dweights.out_weight = std::move(out_grads.dweight);
  result.dweights.q_bias = std::move(q_grads.dbias);
  result.dweights.k_bias = std::move(k_grads.dbias);
  result.dweights.v_bias = std::move(v_grads.dbias);
  result.dweights.out_bias = std::move(out_grads.dbias);
  return result;
}

}  // namespace maskattn
