// Validation shared by the public entry points (attention.cc, attention_backward.cc): every check
// here has an entry in docs/errors.md. Each throws maskattn::Error naming the argument and shapes.
#pragma once

#include <string>
#include <vector>

#include "kernels/problem.h"
#include "maskattn/attention.h"

namespace maskattn::detail {

// The view exists, has `rank` axes, a data pointer when non-empty, and offsets inside int64.
void require_view(const TensorView& t, int rank, const std::string& name, const char* layout);
// No two indices of an output view share an element.
void require_no_self_overlap(const TensorView& t, const std::string& name);
// `out` does not share memory with `in`.
void require_disjoint(const TensorView& out, const std::string& out_name, const TensorView& in,
                      const std::string& in_name);
// An output of exactly `expected` shape and `dtype`, without self-overlap.
void require_output(const MutableTensorView& t, const Dims& expected, DType dtype,
                    const std::string& name, const std::string& derived_from);
// An output in the inputs' dtype, or f32 for f16/bf16 inputs (partial results and gradient
// accumulators kept unrounded); otherwise as require_output.
void require_result(const MutableTensorView& t, const Dims& expected, DType input_dtype,
                    const std::string& name, const std::string& derived_from);
// "q [..], k [..]" for messages.
std::string shapes_of(const TensorView& q, const TensorView& k);
// Checks q, k (and v when given) and fills the Problem's sizes, scale and thread count.
Problem make_problem(const TensorView& q, const TensorView& k, const TensorView* v,
                     const Options& options);
MaskShape mask_shape_of(const Problem& p);
// check_finite: the first NaN or Inf in row-major index order, named with its full index.
void require_finite(const TensorView& t, const std::string& name);
// check_finite over q, k, v, the bias and additive masks.
void check_finite_inputs(const Problem& p, const Mask& mask, const ScoreMods& mods);

// A paged call with a draft tree (Mask::tree; docs/semantics.md §18): each sequence's draft is
// its own last T positions, so every sequence must hold T of them. Returns whether the call runs
// one sequence at a time (paged_run.h): when a tree meets sequences of different lengths, or with
// fewer than Lq queries, one call would place the draft in its own last rows (§3) instead. Such a
// call slices nothing, so it takes no frame. Throws E148 otherwise: `who` names the call, and
// `sequences` the cache's ids of a PagedKVCache call (null: the caller's `lengths`).
bool tree_per_sequence(const Mask& mask, const std::vector<int64_t>& lengths,
                       const std::vector<int64_t>& query_lengths, int64_t q_len, const Frame& frame,
                       const char* who, const std::vector<int64_t>* sequences = nullptr);

// Resolves the mask and modifiers against the problem size, checks finiteness when asked, then
// runs the kernel. Nothing is written before every check has passed.
template <typename Kernel>
void resolve_and_run(Problem& p, const Mask& mask, const ScoreMods& mods, const Options& options,
                     Kernel&& kernel) {
  const ResolvedMask resolved_mask(mask, mask_shape_of(p), options.frame);
  const ResolvedMods resolved_mods(mods, mask_shape_of(p), options.frame, options.count_sinks);
  p.mask = &resolved_mask;
  p.mods = &resolved_mods;
  p.dropout = resolve_dropout(options.dropout, resolved_mask.global_shape());
  if (options.check_finite) check_finite_inputs(p, mask, mods);
  kernel(p);
}

}  // namespace maskattn::detail
