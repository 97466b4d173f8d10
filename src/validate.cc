#include "validate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "core/element.h"
#include "kernels/products.h"
#include "maskattn/error.h"

namespace maskattn::detail {

namespace {

// Smallest and largest element offsets a view can touch; throws if they overflow int64.
struct OffsetRange {
  int64_t lowest = 0, highest = 0;
};

OffsetRange offset_range(const TensorView& t, const std::string& name) {
  __int128 lowest = 0, highest = 0;
  for (int axis = 0; axis < t.rank(); ++axis) {
    const __int128 reach = static_cast<__int128>(t.stride(axis)) * (t.size(axis) - 1);
    if (reach < 0)
      lowest += reach;
    else
      highest += reach;
  }
  constexpr __int128 kLimit = INT64_MAX / 8;  // byte offsets must fit too
  if (lowest < -kLimit || highest > kLimit) {
    throw Error(name + " strides " + shape_string(t.strides()) + " for shape " + t.shape_string() +
                " reach beyond addressable memory");
  }
  return {static_cast<int64_t>(lowest), static_cast<int64_t>(highest)};
}

// Additive masks and biases may hold −inf (it hides a pair), but NaN or +inf poisons the row.
void require_finite_or_minus_inf(const Array<float>& values, const std::string& name) {
  for (int64_t n = 0; n < values.numel(); ++n) {
    const float value = values.values()[n];
    if (std::isnan(value) || value == INFINITY) {
      throw Error("check_finite: " + name + " flat index " + std::to_string(n) + " is " +
                  (std::isnan(value) ? "nan" : "+inf"));
    }
  }
}

// "sequences[b] = id holds L positions" (a PagedKVCache call) or "lengths[b] = L".
std::string sequence_length(const std::vector<int64_t>& lengths, size_t b,
                            const std::vector<int64_t>* sequences) {
  std::string text = sequences != nullptr ? "sequences[" : "lengths[";
  text += std::to_string(b);
  text += "] = ";
  if (sequences == nullptr) return text + std::to_string(lengths[b]);
  text += std::to_string((*sequences)[b]);
  text += " holds ";
  text += std::to_string(lengths[b]);
  return text + " positions";
}

}  // namespace

void require_view(const TensorView& t, int rank, const std::string& name, const char* layout) {
  if (t.is_null()) throw Error(name + " is a null view; expected " + layout);
  if (t.rank() != rank) {
    throw Error(name + " has shape " + t.shape_string() + "; expected " + layout);
  }
  if (t.numel() > 0 && t.data() == nullptr) {
    throw Error(name + " of shape " + t.shape_string() + " has a null data pointer");
  }
  if (t.numel() > 0) offset_range(t, name);
}

// Writing through a view whose elements overlap would make the result depend on write order.
// Sufficient test: with axes sorted by |stride|, each stride clears everything the smaller axes
// span.
void require_no_self_overlap(const TensorView& t, const std::string& name) {
  if (t.numel() <= 1) return;
  // Axes of size > 1, sorted by |stride| (at most 4: insertion sort).
  std::vector<int> axes;
  for (int axis = 0; axis < t.rank(); ++axis) {
    if (t.size(axis) > 1) axes.push_back(axis);
  }
  for (size_t n = 1; n < axes.size(); ++n) {
    for (size_t m = n; m > 0 && std::llabs(t.stride(axes[m])) < std::llabs(t.stride(axes[m - 1]));
         --m) {
      std::swap(axes[m], axes[m - 1]);
    }
  }
  int64_t span = 0;  // elements covered by the smaller axes, minus one
  for (int axis : axes) {
    const int64_t stride = std::llabs(t.stride(axis));
    if (stride <= span) {
      throw Error(name + " has overlapping elements: strides " + shape_string(t.strides()) +
                  " for shape " + t.shape_string() + " (an output needs one element per index)");
    }
    span += stride * (t.size(axis) - 1);
  }
}

void require_disjoint(const TensorView& out, const std::string& out_name, const TensorView& in,
                      const std::string& in_name) {
  if (out.is_null() || in.is_null() || out.numel() == 0 || in.numel() == 0) return;
  const auto bytes = [](const TensorView& t, const std::string& name) {
    const OffsetRange range = offset_range(t, name);
    const auto base = reinterpret_cast<uintptr_t>(t.data());
    const auto size = static_cast<int64_t>(dtype_size(t.dtype()));
    return std::array<uintptr_t, 2>{base + range.lowest * size, base + (range.highest + 1) * size};
  };
  const auto a = bytes(out, out_name);
  const auto b = bytes(in, in_name);
  if (a[0] < b[1] && b[0] < a[1]) {
    throw Error(out_name + " " + out.shape_string() + " shares memory with " + in_name + " " +
                in.shape_string() + "; outputs must not overlap inputs or other outputs");
  }
}

void require_output(const MutableTensorView& t, const Dims& expected, DType dtype,
                    const std::string& name, const std::string& derived_from) {
  require_view(t, static_cast<int>(expected.size()), name, shape_string(expected).c_str());
  if (t.sizes() != expected) {
    throw Error(name + " has shape " + t.shape_string() + " but must be " + shape_string(expected) +
                " (from " + derived_from + ")");
  }
  if (t.dtype() != dtype) {
    throw Error(name + " has dtype " + dtype_name(t.dtype()) + " but must be " + dtype_name(dtype));
  }
  require_no_self_overlap(t, name);
}

void require_result(const MutableTensorView& t, const Dims& expected, DType input_dtype,
                    const std::string& name, const std::string& derived_from) {
  if (t.dtype() == DType::f32 || input_dtype == DType::f32) {
    require_output(t, expected, DType::f32, name, derived_from);
    return;
  }
  require_view(t, static_cast<int>(expected.size()), name, shape_string(expected).c_str());
  if (t.dtype() != input_dtype) {
    throw Error(name + " has dtype " + dtype_name(t.dtype()) + " but must be " +
                dtype_name(input_dtype) + " (the inputs') or f32 (unrounded, for merging)");
  }
  require_output(t, expected, input_dtype, name, derived_from);
}

std::string shapes_of(const TensorView& q, const TensorView& k) {
  return "q " + q.shape_string() + ", k " + k.shape_string();
}

Problem make_problem(const TensorView& q, const TensorView& k, const TensorView* v,
                     const Options& options) {
  require_view(q, 4, "q", "[B,Hq,Lq,D]");
  require_view(k, 4, "k", "[B,Hkv,Lk,D]");
  if (v != nullptr) require_view(*v, 4, "v", "[B,Hkv,Lk,Dv]");
  if (k.dtype() != q.dtype()) {
    throw Error(std::string("k has dtype ") + dtype_name(k.dtype()) + " but q has " +
                dtype_name(q.dtype()) + "; q, k, v and out share one element type");
  }
  if (v != nullptr && v->dtype() != q.dtype()) {
    throw Error(std::string("v has dtype ") + dtype_name(v->dtype()) + " but q has " +
                dtype_name(q.dtype()) + "; q, k, v and out share one element type");
  }
  Problem p;
  p.q = q;
  p.k = k;
  p.batch = q.size(0);
  p.q_heads = q.size(1);
  p.q_len = q.size(2);
  p.head_dim = q.size(3);
  p.kv_heads = k.size(1);
  p.k_len = k.size(2);
  if (k.size(0) != p.batch) {
    throw Error("k batch " + std::to_string(k.size(0)) + " does not match q batch " +
                std::to_string(p.batch) + " (" + shapes_of(q, k) + ")");
  }
  if (k.size(3) != p.head_dim) {
    throw Error("k head dim " + std::to_string(k.size(3)) + " does not match q head dim " +
                std::to_string(p.head_dim) + " (" + shapes_of(q, k) + ")");
  }
  if (p.kv_heads == 0 ? p.q_heads != 0 : p.q_heads % p.kv_heads != 0) {
    throw Error("Hq=" + std::to_string(p.q_heads) + " is not a multiple of Hkv=" +
                std::to_string(p.kv_heads) + " (" + shapes_of(q, k) + ")");
  }
  if (v != nullptr) {
    p.v = *v;
    p.value_dim = v->size(3);
    if (v->size(0) != k.size(0) || v->size(1) != k.size(1) || v->size(2) != k.size(2)) {
      throw Error("v shape " + v->shape_string() + " does not match k shape " + k.shape_string() +
                  " in [B,Hkv,Lk]");
    }
  }
  if (options.scale) {
    if (!std::isfinite(*options.scale)) {
      throw Error("scale = " + std::to_string(*options.scale) + " must be finite");
    }
    p.scale = *options.scale;
  } else {
    if (p.head_dim == 0) {
      throw Error(
          "q has head dim D=0, so the default scale 1/sqrt(D) is undefined; set "
          "Options::scale");
    }
    p.scale = 1.0 / std::sqrt(static_cast<double>(p.head_dim));
  }
  if (options.threads < 0 || options.threads > kMaxThreads) {
    throw Error("threads = " + std::to_string(options.threads) + " must be in [0, " +
                std::to_string(kMaxThreads) + "] (0 = all cores)");
  }
  p.threads = options.threads;
  p.products = requested_products(options.products);
  return p;
}

MaskShape mask_shape_of(const Problem& p) {
  return {p.batch, p.q_heads, p.q_len, p.k_len};
}

void require_finite(const TensorView& t, const std::string& name) {
  std::array<int64_t, 4> index{};
  const int64_t count = t.numel();
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t rest = flat;
    for (int axis = t.rank() - 1; axis >= 0; --axis) {
      index[axis] = rest % t.size(axis);
      rest /= t.size(axis);
    }
    const float value = load_float(t, t.offset(index));
    if (!std::isfinite(value)) {
      Dims position(index.begin(), index.begin() + t.rank());
      std::string where = shape_string(position);  // "[0,1,2,3]"
      throw Error("check_finite: " + name + where + " is " + (std::isnan(value) ? "nan" : "inf"));
    }
  }
}

void check_finite_inputs(const Problem& p, const Mask& mask, const ScoreMods& mods) {
  require_finite(p.q, "q");
  require_finite(p.k, "k");
  if (!p.v.is_null()) require_finite(p.v, "v");
  if (mods.bias) require_finite_or_minus_inf(*mods.bias, "bias");
  for (size_t n = 0; n < mask.components().size(); ++n) {
    if (const auto* additive = std::get_if<component::DenseAdditive>(&mask.components()[n])) {
      require_finite_or_minus_inf(additive->values, mask.labels()[n]);
    }
  }
}

bool tree_per_sequence(const Mask& mask, const std::vector<int64_t>& lengths,
                       const std::vector<int64_t>& query_lengths, int64_t q_len, const Frame& frame,
                       const char* who, const std::vector<int64_t>* sequences) {
  bool any_tree = false;
  for (size_t n = 0; n < mask.components().size(); ++n) {
    const auto* tree = std::get_if<component::Tree>(&mask.components()[n]);
    if (tree == nullptr) continue;
    any_tree = true;
    for (size_t b = 0; b < lengths.size(); ++b) {
      if (lengths[b] >= tree->size()) continue;
      throw Error(std::string(who) + ": " + sequence_length(lengths, b, sequences) +
                  ", fewer than the " + std::to_string(tree->size()) + " draft tokens of " +
                  mask.labels()[n] +
                  ": each sequence's draft is its own last T positions, already appended");
    }
  }
  if (!any_tree || lengths.empty()) return false;
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  bool ragged = false;
  for (size_t b = 0; b < lengths.size(); ++b) {
    ragged |= lengths[b] != longest || query_lengths[b] != q_len;
  }
  if (ragged && !frame.is_whole()) {
    throw Error(std::string(who) +
                ": options.frame is set, but a tree mask over sequences of different lengths or "
                "fewer than Lq queries runs each sequence alone (its draft at its own end), and a "
                "frame slices one problem: call each sequence alone with its frame");
  }
  return ragged;
}

}  // namespace maskattn::detail
