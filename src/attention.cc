// attention(), attention_weights(), attention_scores(), allowed_pairs(): validate once at the
// boundary, build the Problem, run the kernel. Every check here has an entry in docs/errors.md.
#include "maskattn/attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/element.h"
#include "kernels/fused.h"
#include "kernels/merge.h"
#include "kernels/problem.h"
#include "kernels/reference.h"
#include "mask/block_map.h"
#include "mask/resolved_mask.h"
#include "mask/resolved_mods.h"
#include "maskattn/error.h"

namespace maskattn {

namespace {

using detail::Problem;
using detail::ResolvedMask;
using detail::ResolvedMods;

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

std::string shapes_of(const TensorView& q, const TensorView& k) {
  return "q " + q.shape_string() + ", k " + k.shape_string();
}

// Checks q, k (and v when given) and fills the Problem's sizes, scale and thread count.
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
  return p;
}

MaskShape mask_shape_of(const Problem& p) {
  return {p.batch, p.q_heads, p.q_len, p.k_len};
}

// check_finite: the first NaN or Inf in row-major index order, named with its full index.
void require_finite(const TensorView& t, const std::string& name) {
  std::array<int64_t, 4> index{};
  const int64_t count = t.numel();
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t rest = flat;
    for (int axis = t.rank() - 1; axis >= 0; --axis) {
      index[axis] = rest % t.size(axis);
      rest /= t.size(axis);
    }
    const float value = detail::load_float(t, t.offset(index));
    if (!std::isfinite(value)) {
      Dims position(index.begin(), index.begin() + t.rank());
      std::string where = shape_string(position);  // "[0,1,2,3]"
      throw Error("check_finite: " + name + where + " is " + (std::isnan(value) ? "nan" : "inf"));
    }
  }
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

// Resolves the mask and modifiers against the problem size, checks finiteness when asked, then
// runs the kernel. Nothing is written before every check has passed.
template <typename Kernel>
void resolve_and_run(Problem& p, const Mask& mask, const ScoreMods& mods, const Options& options,
                     Kernel&& kernel) {
  const ResolvedMask resolved_mask(mask, mask_shape_of(p));
  const ResolvedMods resolved_mods(mods, mask_shape_of(p));
  p.mask = &resolved_mask;
  p.mods = &resolved_mods;
  if (options.check_finite) check_finite_inputs(p, mask, mods);
  kernel(p);
}

// The [B, Hq, Lq, Lk] f32 debug outputs (weights, scores).
void require_pair_output(const MutableTensorView& t, const Problem& p, const std::string& name) {
  require_output(t, {p.batch, p.q_heads, p.q_len, p.k_len}, DType::f32, name, shapes_of(p.q, p.k));
  require_disjoint(t, name, p.q, "q");
  require_disjoint(t, name, p.k, "k");
}

}  // namespace

void attention(const TensorView& q, const TensorView& k, const TensorView& v,
               const MutableTensorView& out, const Mask& mask, const ScoreMods& mods,
               const Options& options, const MutableTensorView& lse) {
  Problem p = make_problem(q, k, &v, options);
  require_output(out, {p.batch, p.q_heads, p.q_len, p.value_dim}, q.dtype(), "out",
                 "q " + q.shape_string() + " and v " + v.shape_string());
  for (const auto& [input, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    require_disjoint(out, "out", *input, name);
  }
  if (!lse.is_null()) {
    require_output(lse, {p.batch, p.q_heads, p.q_len}, DType::f32, "lse", "q " + q.shape_string());
    for (const auto& [input, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}}) {
      require_disjoint(lse, "lse", *input, name);
    }
  }
  resolve_and_run(p, mask, mods, options, [&](const Problem& checked) {
    if (options.kernel == Kernel::reference) {
      detail::reference::forward(checked, out, lse);
    } else {
      detail::fused::forward(checked, out, lse, options.block_skipping);
    }
  });
}

void attention_weights(const TensorView& q, const TensorView& k, const MutableTensorView& weights,
                       const Mask& mask, const ScoreMods& mods, const Options& options) {
  Problem p = make_problem(q, k, nullptr, options);
  require_pair_output(weights, p, "weights");
  resolve_and_run(p, mask, mods, options,
                  [&](const Problem& checked) { detail::reference::weights(checked, weights); });
}

void attention_scores(const TensorView& q, const TensorView& k, const MutableTensorView& scores,
                      ScoreStage stage, const Mask& mask, const ScoreMods& mods,
                      const Options& options) {
  Problem p = make_problem(q, k, nullptr, options);
  require_pair_output(scores, p, "scores");
  resolve_and_run(p, mask, mods, options, [&](const Problem& checked) {
    detail::reference::scores(checked, stage, scores);
  });
}

void merge_partials(const std::vector<PartialResult>& parts, const MutableTensorView& out,
                    const MutableTensorView& lse) {
  require_view(out, 4, "out", "[B,Hq,Lq,Dv]");
  if (parts.empty()) throw Error("merge_partials: no parts to merge");
  const Dims shape = out.sizes();
  const Dims lse_shape = {shape[0], shape[1], shape[2]};
  require_no_self_overlap(out, "out");
  for (size_t c = 0; c < parts.size(); ++c) {
    const std::string name = "part " + std::to_string(c);
    require_view(parts[c].out, 4, name + " out", "[B,Hq,Lq,Dv]");
    require_view(parts[c].lse, 3, name + " lse", "[B,Hq,Lq]");
    if (parts[c].out.sizes() != shape) {
      throw Error(name + " out has shape " + parts[c].out.shape_string() + " but out is " +
                  out.shape_string());
    }
    if (parts[c].lse.sizes() != lse_shape || parts[c].lse.dtype() != DType::f32) {
      throw Error(name + " lse must be f32 " + shape_string(lse_shape) + ", got " +
                  dtype_name(parts[c].lse.dtype()) + " " + parts[c].lse.shape_string());
    }
    require_disjoint(out, "out", parts[c].out, name + " out");
    require_disjoint(out, "out", parts[c].lse, name + " lse");
    if (!lse.is_null()) {
      require_disjoint(lse, "lse", parts[c].out, name + " out");
      require_disjoint(lse, "lse", parts[c].lse, name + " lse");
    }
  }
  if (!lse.is_null()) {
    require_output(lse, lse_shape, DType::f32, "lse", "out " + out.shape_string());
    require_disjoint(lse, "lse", out, "out");
  }
  const int64_t count = static_cast<int64_t>(parts.size()), value_dim = shape[3];
  std::vector<float> rows(count * value_dim), lses(count), merged(value_dim);

  for (int64_t b = 0; b < shape[0]; ++b) {
    for (int64_t h = 0; h < shape[1]; ++h) {
      for (int64_t i = 0; i < shape[2]; ++i) {
        for (int64_t c = 0; c < count; ++c) {
          const TensorView& part = parts[c].out;
          for (int64_t e = 0; e < value_dim; ++e) {
            rows[c * value_dim + e] = detail::load_float(part, part.offset({b, h, i, e}));
          }
          lses[c] = detail::load_float(parts[c].lse, parts[c].lse.offset({b, h, i, 0}));
        }
        const float row_lse = detail::merge_row(count, rows.data(), value_dim, lses.data(), 1,
                                                -INFINITY, value_dim, merged.data());
        for (int64_t e = 0; e < value_dim; ++e) {
          detail::store_float(out, out.offset({b, h, i, e}), merged[e]);
        }
        if (!lse.is_null())
          static_cast<float*>(lse.mutable_data())[lse.offset({b, h, i, 0})] = row_lse;
      }
    }
  }
}

Array<uint8_t> allowed_pairs(const Mask& mask, const MaskShape& shape) {
  const ResolvedMask resolved(mask, shape);
  const Dims dims = {shape.batch, shape.q_heads, shape.q_len, shape.k_len};
  std::vector<uint8_t> values(static_cast<size_t>(checked_numel(dims, "allowed_pairs")));
  size_t n = 0;
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.q_heads; ++h) {
      for (int64_t i = 0; i < shape.q_len; ++i) {
        for (int64_t j = 0; j < shape.k_len; ++j) values[n++] = resolved.allowed(b, h, i, j);
      }
    }
  }
  return Array<uint8_t>(dims, std::move(values));
}

Array<uint8_t> block_map(const Mask& mask, const MaskShape& shape, int64_t tile_q, int64_t tile_k) {
  if (tile_q < 1 || tile_k < 1) {
    throw Error("block_map: tile sizes " + std::to_string(tile_q) + "x" + std::to_string(tile_k) +
                " must be ≥ 1");
  }
  const ResolvedMask resolved(mask, shape);
  const detail::BlockMap map(resolved, tile_q, tile_k);
  const Dims dims = {shape.batch, shape.q_heads, map.q_tiles(), map.k_tiles()};
  std::vector<uint8_t> kinds(static_cast<size_t>(checked_numel(dims, "block_map")));
  size_t n = 0;
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.q_heads; ++h) {
      for (int64_t qt = 0; qt < map.q_tiles(); ++qt) {
        for (int64_t kt = 0; kt < map.k_tiles(); ++kt) {
          kinds[n++] = static_cast<uint8_t>(map.kind(b, h, qt, kt));
        }
      }
    }
  }
  return Array<uint8_t>(dims, std::move(kinds));
}

Array<uint8_t> allowed_pairs(const Mask& mask, const MaskShape& shape, int64_t batch,
                             int64_t head) {
  if (batch < 0 || batch >= shape.batch || head < 0 || head >= shape.q_heads) {
    throw Error("allowed_pairs: batch " + std::to_string(batch) + ", head " + std::to_string(head) +
                " is outside scores " + detail::scores_shape_string(shape));
  }
  const ResolvedMask resolved(mask, shape);
  const Dims dims = {shape.q_len, shape.k_len};
  std::vector<uint8_t> values(static_cast<size_t>(checked_numel(dims, "allowed_pairs")));
  size_t n = 0;
  for (int64_t i = 0; i < shape.q_len; ++i) {
    for (int64_t j = 0; j < shape.k_len; ++j) values[n++] = resolved.allowed(batch, head, i, j);
  }
  return Array<uint8_t>(dims, std::move(values));
}

}  // namespace maskattn
