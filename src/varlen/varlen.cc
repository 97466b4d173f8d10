// attention_varlen() and its backward: packed sequences, each attended alone.
//
// What a varlen call must give is fixed by its contract: the rows of sequence i are bit for bit
// those of attention() on sequence i alone, with the mask restricted to batch entry i
// (mask/restrict.cc). The straightforward way to honour it is also the one used here: one
// attention() call per sequence, on views of the packed tensors (no copy: a [total, H, D] tensor's
// rows [first, first + L) are a [1, H, L, D] view with the token stride on the length axis). Every
// kernel, mask component, modifier and dtype of the library then works in varlen form with no
// second implementation to keep in step, and the kernels' guarantee that a call's bits do not
// depend on its thread count carries the contract over whatever threads run it.
//
// What that leaves to this file is keeping the cores busy. A packed training batch is often many
// short sequences, and one call per sequence in turn would run, say, 100 calls of 2 query tiles
// × 8 heads = 16 work items each: every call forks and joins the threads, and its last items
// leave threads idle while the longest finishes. So the driver plans over sequences instead, as
// the fused driver plans over work items (kernels/fused.cc):
//
//   - a sequence whose cost is a large share of the whole (more than 1/(2T) of it, with T
//     threads) runs alone, on every thread: it has enough work items of its own, and dealing it
//     to one thread would leave the others idle at the end;
//   - every other sequence is dealt whole to one thread (a call with threads = 1), longest first
//     (core/parallel.h), so T of them run side by side and the imbalance is paid once, not per
//     sequence.
//
// Costs are counted as Hq·(Lq·Lk + Lq + Lk) (pairs at most, plus the rows' fixed work), from the
// shapes only. Which thread runs a sequence never changes its bits, so the plan cannot change the
// result, only the time. Memory stays O(one call per thread): the kernels' scratch is per thread,
// and each call converts only its own sequence's K and V.
//
// Checks come first, on the whole packed problem, so that nothing is written when one fails: the
// offsets (E136–E138), the packed shapes (E139), the library's own checks on the packed tensors
// viewed as one [1, H, total, D] problem (dtypes, heads, head dims, overlaps, options), and the
// mask and modifiers resolved against the padded batch [B, Hq, max_seqlen_q, max_seqlen_k], which
// is how their shapes are given.
#include "maskattn/varlen.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "mask/restrict.h"
#include "maskattn/error.h"
#include "validate.h"
#include "varlen/plan.h"
#include "varlen/varlen_checks.h"

namespace maskattn {

namespace {

using varlen_detail::check_inputs;
using varlen_detail::check_mask;
using varlen_detail::check_outputs_disjoint;
using varlen_detail::check_packed_shape;
using varlen_detail::key_length;
using varlen_detail::Plan;
using varlen_detail::query_length;
using varlen_detail::sequence_lse;
using varlen_detail::sequence_rows;
using varlen_detail::whole_rows;

void check_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                   const MutableTensorView& out, const Varlen& varlen, const Mask& mask,
                   const ScoreMods& mods, const Options& options, const MutableTensorView& lse) {
  const detail::Problem p = check_inputs(q, k, v, varlen, options);
  varlen_detail::check_packed(out, "out", "[total_q, Hq, Dv]");
  const std::string qv = "q " + q.shape_string() + " and v " + v.shape_string();
  check_packed_shape(out, {q.size(0), q.size(1), v.size(2)}, "out", qv);
  detail::require_result(MutableTensorView(out.mutable_data(), out.dtype(), whole_rows(out).sizes(),
                                           whole_rows(out).strides()),
                         {1, p.q_heads, p.q_len, p.value_dim}, q.dtype(), "out", qv);
  if (!lse.is_null()) {
    check_packed_shape(lse, {q.size(1), q.size(0)}, "lse",
                       "q " + q.shape_string() + ": [Hq, total_q]");
    if (lse.dtype() != DType::f32) {
      throw Error(std::string("lse has dtype ") + dtype_name(lse.dtype()) + " but must be f32");
    }
  }
  check_outputs_disjoint({{&out, "out"}, {&lse, "lse"}}, {{&q, "q"}, {&k, "k"}, {&v, "v"}});
  check_mask(p, varlen, mask, mods, options);
  if (options.check_finite) detail::check_finite_inputs(p, mask, mods);
}

}  // namespace

namespace varlen_detail {

SequenceProblem sequence_problem(const Varlen& varlen, int64_t i, const Mask& mask,
                                 const ScoreMods& mods, const Options& options) {
  const int64_t lq = query_length(varlen, i), lk = key_length(varlen, i);
  check_sequence_values(mask, varlen, i);
  SequenceProblem sequence{detail::restrict_mask(mask, i, lq, lk),
                           detail::restrict_mods(mods, i, lq, lk), options};
  sequence.options.dropout.batch_offset = options.dropout.batch_offset + static_cast<uint64_t>(i);
  sequence.options.check_finite = false;  // checked once, on the whole packed problem
  return sequence;
}

}  // namespace varlen_detail

SequenceProblem varlen_sequence(const Varlen& varlen, int64_t i, const Mask& mask,
                                const ScoreMods& mods, const Options& options) {
  if (varlen.cu_seqlens_q.empty() || varlen.cu_seqlens_k.empty()) {
    varlen_detail::check_offsets(varlen, 0, 0);
  }
  varlen_detail::check_offsets(varlen, varlen.cu_seqlens_q.back(), varlen.cu_seqlens_k.back());
  if (i < 0 || i >= varlen.batch()) {
    varlen_fail("varlen_sequence: sequence " + std::to_string(i) + " is outside the batch of " +
                std::to_string(varlen.batch()) + " sequences");
  }
  return varlen_detail::sequence_problem(varlen, i, mask, mods, options);
}

void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                      const MutableTensorView& out, const Varlen& varlen, const Mask& mask,
                      const ScoreMods& mods, const Options& options, const MutableTensorView& lse) {
  check_forward(q, k, v, out, varlen, mask, mods, options, lse);
  const Plan plan = varlen_detail::plan_sequences(varlen, q.size(1), options);
  varlen_detail::run_plan(plan, options, [&](int64_t i, int threads) {
    const int64_t lq = query_length(varlen, i), lk = key_length(varlen, i);
    if (lq == 0) return;  // no rows to write
    SequenceProblem s = varlen_detail::sequence_problem(varlen, i, mask, mods, options);
    s.options.threads = threads;
    const int64_t q0 = varlen.cu_seqlens_q[i], k0 = varlen.cu_seqlens_k[i];
    attention(sequence_rows(q, q0, lq), sequence_rows(k, k0, lk), sequence_rows(v, k0, lk),
              sequence_rows(out, q0, lq), s.mask, s.mods, s.options, sequence_lse(lse, q0, lq));
  });
}

}  // namespace maskattn
