// attention(), attention_weights(), attention_scores(), allowed_pairs(): validate once at the
// boundary, build the Problem, run the kernel. Every check here has an entry in docs/errors.md.
#include "maskattn/attention.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/block_skipping.h"
#include "core/element.h"
#include "kernels/fused.h"
#include "kernels/merge.h"
#include "kernels/problem.h"
#include "kernels/reference.h"
#include "mask/block_map.h"
#include "mask/resolved_mask.h"
#include "mask/resolved_mods.h"
#include "mask/tile_mask.h"
#include "maskattn/error.h"
#include "maskattn/memory.h"
#include "validate.h"

namespace maskattn {

namespace {

using detail::make_problem;
using detail::Problem;
using detail::require_disjoint;
using detail::require_no_self_overlap;
using detail::require_output;
using detail::require_view;
using detail::resolve_and_run;
using detail::ResolvedMask;
using detail::shapes_of;

// The [B, Hq, Lq, Lk] f32 debug outputs (weights, scores).
void require_pair_output(const MutableTensorView& t, const Problem& p, const std::string& name) {
  require_output(t, {p.batch, p.q_heads, p.q_len, p.k_len}, DType::f32, name, shapes_of(p.q, p.k));
  require_disjoint(t, name, p.q, "q");
  require_disjoint(t, name, p.k, "k");
}

// One byte per element of `dims`, for the arrays allowed_pairs() and block_map() return; checked
// against the memory cap first.
std::vector<uint8_t> flag_buffer(const Dims& dims, const std::string& what) {
  const int64_t count = checked_numel(dims, what);
  require_memory(static_cast<double>(count), what + " " + shape_string(dims));
  return std::vector<uint8_t>(static_cast<size_t>(count));
}

}  // namespace

void attention(const TensorView& q, const TensorView& k, const TensorView& v,
               const MutableTensorView& out, const Mask& mask, const ScoreMods& mods,
               const Options& options, const MutableTensorView& lse) {
  Problem p = make_problem(q, k, &v, options);
  detail::require_result(out, {p.batch, p.q_heads, p.q_len, p.value_dim}, q.dtype(), "out",
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
      detail::fused::forward(checked, out, lse, detail::block_skipping());
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

namespace {

// merge_partials's work, once the arguments are checked: per query row (b, h, i), each part's row
// and LSE read as f32 (any dtype, any strides), merged by the one merge (kernels/merge.h), stored
// in out's dtype. Rows are independent, so they are spread over the threads; the bits do not
// depend on how.
void merge_rows(const std::vector<PartialResult>& parts, const MutableTensorView& out,
                const MutableTensorView& lse) {
  const Dims shape = out.sizes();
  const int64_t count = static_cast<int64_t>(parts.size()), value_dim = shape[3];
  const int64_t rows = shape[0] * shape[1] * shape[2];
  const bool threaded = rows * count * value_dim >= (int64_t{1} << 16);
#pragma omp parallel if (threaded)
  {
    std::vector<float> values(count * value_dim), lses(count), merged(value_dim);
    std::vector<const float*> row_of(count);
    std::vector<double> weights(count);
    for (int64_t c = 0; c < count; ++c) row_of[c] = values.data() + c * value_dim;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = r / (shape[1] * shape[2]), h = r / shape[2] % shape[1], i = r % shape[2];
      for (int64_t c = 0; c < count; ++c) {
        const TensorView& part = parts[c].out;
        for (int64_t e = 0; e < value_dim; ++e) {
          values[c * value_dim + e] = detail::load_float(part, part.offset({b, h, i, e}));
        }
        lses[c] = detail::load_float(parts[c].lse, parts[c].lse.offset({b, h, i, 0}));
      }
      const float row_lse = detail::merge_row(count, row_of.data(), lses.data(), -INFINITY,
                                              value_dim, weights.data(), merged.data());
      for (int64_t e = 0; e < value_dim; ++e) {
        detail::store_float(out, out.offset({b, h, i, e}), merged[e]);
      }
      if (!lse.is_null())
        static_cast<float*>(lse.mutable_data())[lse.offset({b, h, i, 0})] = row_lse;
    }
  }
}

}  // namespace

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
  merge_rows(parts, out, lse);
}

Array<uint8_t> allowed_pairs(const Mask& mask, const MaskShape& shape) {
  const ResolvedMask resolved(mask, shape);
  const Dims dims = {shape.batch, shape.q_heads, shape.q_len, shape.k_len};
  std::vector<uint8_t> values = flag_buffer(dims, "allowed_pairs");
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
  std::vector<uint8_t> kinds = flag_buffer(dims, "block_map");
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

namespace {

// Walks the tiles a call's kernels would visit, in the kernels' tiling (so the block
// classifications are the ones a call computes and caches), and hands each one's count of allowed
// pairs to `add`: a full tile counts whole, a partial one by its element mask (which may still
// hide every pair). Stops early when `add` returns true.
template <typename Add>
void visit_allowed_tiles(const Mask& mask, const MaskShape& shape, const Frame& frame, Add add) {
  const ResolvedMask resolved(mask, shape, frame);
  constexpr int64_t kTile = detail::TileMaskBuilder::kMaxQueries;
  const detail::BlockMap map(resolved, kTile, kTile);
  const detail::TileMaskBuilder tile_masks(resolved);
  std::array<uint64_t, kTile> bits{};
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.q_heads; ++h) {
      for (int64_t qt = 0; qt < map.q_tiles(); ++qt) {
        const detail::BlockMap::TileRange band = map.k_tile_range(b, h, qt);
        const int64_t q_first = qt * kTile, q_count = std::min(kTile, shape.q_len - q_first);
        for (int64_t kt = band.first; kt < band.end; ++kt) {
          const detail::TileKind kind = map.kind(b, h, qt, kt);
          if (kind == detail::TileKind::empty) continue;
          const int64_t k_first = kt * kTile, k_count = std::min(kTile, shape.k_len - k_first);
          int64_t allowed = q_count * k_count;
          if (kind == detail::TileKind::partial) {
            tile_masks.build(b, h, q_first, q_count, k_first, k_count, bits.data());
            allowed = 0;
            for (int64_t n = 0; n < k_count; ++n) allowed += std::popcount(bits[n]);
          }
          if (add(allowed)) return;
        }
      }
    }
  }
}

}  // namespace

bool any_allowed(const Mask& mask, const MaskShape& shape, const Frame& frame) {
  bool any = false;
  visit_allowed_tiles(mask, shape, frame, [&](int64_t allowed) { return any = allowed > 0; });
  return any;
}

int64_t count_allowed(const Mask& mask, const MaskShape& shape, const Frame& frame) {
  int64_t total = 0;
  visit_allowed_tiles(mask, shape, frame, [&](int64_t allowed) {
    total += allowed;
    return false;
  });
  return total;
}

Array<uint8_t> allowed_pairs(const Mask& mask, const MaskShape& shape, int64_t batch,
                             int64_t head) {
  if (batch < 0 || batch >= shape.batch || head < 0 || head >= shape.q_heads) {
    throw Error("allowed_pairs: batch " + std::to_string(batch) + ", head " + std::to_string(head) +
                " is outside scores " + detail::scores_shape_string(shape));
  }
  const ResolvedMask resolved(mask, shape);
  const Dims dims = {shape.q_len, shape.k_len};
  std::vector<uint8_t> values = flag_buffer(dims, "allowed_pairs");
  size_t n = 0;
  for (int64_t i = 0; i < shape.q_len; ++i) {
    for (int64_t j = 0; j < shape.k_len; ++j) values[n++] = resolved.allowed(batch, head, i, j);
  }
  return Array<uint8_t>(dims, std::move(values));
}

}  // namespace maskattn
