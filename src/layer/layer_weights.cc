// MultiHeadAttention's weights: checked and transposed once at construction, drawn like
// nn.Linear's default initialisation, and loaded from / saved to .npy files named like
// nn.MultiheadAttention.state_dict() keys.
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>

#include "core/splitmix64.h"
#include "maskattn/error.h"
#include "maskattn/multihead.h"
#include "maskattn/npy.h"

namespace maskattn {

namespace {

std::vector<float> transposed(const Array<float>& matrix) {
  const int64_t rows = matrix.dim(0), cols = matrix.dim(1);
  std::vector<float> result(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) result[c * rows + r] = matrix.at(r, c);
  }
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
Array<float> uniform(Dims shape, double bound, detail::SplitMix64& random) {
  std::vector<float> values(static_cast<size_t>(checked_numel(shape, "weight")));
  for (float& value : values) value = static_cast<float>(random.uniform(-bound, bound));
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
  detail::SplitMix64 random(seed);
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

}  // namespace maskattn
