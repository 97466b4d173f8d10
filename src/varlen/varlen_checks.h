// The varlen layer's internals: the checks of its arguments (docs/errors.md E136–E139) and the
// views of one sequence's rows. The restriction of a mask to one sequence is mask/restrict.h's.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/problem.h"
#include "maskattn/varlen.h"

namespace maskattn {

// Throws maskattn::Error with `message` (one place, so every varlen check reads the same).
[[noreturn]] void varlen_fail(const std::string& message);

namespace varlen_detail {

// cu_seqlens_q/k: B + 1 entries each, 0 first, non-decreasing, the last total_q (total_k);
// max_seqlen_q/k ≥ every length (E136–E138).
void check_offsets(const Varlen& varlen, int64_t total_q, int64_t total_k);
// A packed tensor [total, H, D]: rank 3 (E139).
void check_packed(const TensorView& t, const char* name, const char* layout);
// Entry i of a lengths or starts component fits its sequence's `length` (E138).
void check_padding_value(const component::Padding& padding, int64_t i, int64_t length);
// The mask's lengths and starts, and its draft trees, fit each sequence (E138), checked before
// anything is written; with `only` ≥ 0, sequence `only` alone.
void check_sequence_values(const Mask& mask, const Varlen& varlen, int64_t only = -1);
// The checks every varlen call makes on q, k, v, the offsets and the options; returns the packed
// problem as one [1, Hq, total_q, D] call (its sizes, and the library's checks of the tensors).
detail::Problem check_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                             const Varlen& varlen, const Options& options);
// A packed tensor of exactly `expected` shape (E139).
void check_packed_shape(const TensorView& t, const Dims& expected, const char* name,
                        const std::string& from);
// The mask, the modifiers and the dropout resolved against the padded batch
// [B, Hq, max_seqlen_q, max_seqlen_k], and the lengths and starts against each sequence.
void check_mask(const detail::Problem& p, const Varlen& varlen, const Mask& mask,
                const ScoreMods& mods, const Options& options);
// Outputs (null views skipped) that overlap no input, no other output and not themselves.
using NamedViews = std::vector<std::pair<const TensorView*, std::string>>;
void check_outputs_disjoint(const NamedViews& outputs, const NamedViews& inputs);
// The mask, modifiers and options of sequence i (varlen_sequence without its checks).
SequenceProblem sequence_problem(const Varlen& varlen, int64_t i, const Mask& mask,
                                 const ScoreMods& mods, const Options& options);
// The options a varlen call takes: no frame (E139).
void check_options(const Options& options);

// The packed rows [first, first + count) of t [total, H, D] as a [1, H, count, D] view.
TensorView sequence_rows(const TensorView& t, int64_t first, int64_t count);
MutableTensorView sequence_rows(const MutableTensorView& t, int64_t first, int64_t count);
// Columns [first, first + count) of lse [Hq, total_q] as a [1, Hq, count] view.
MutableTensorView sequence_lse(const TensorView& lse, int64_t first, int64_t count);
// The whole packed tensor [total, H, D] as one [1, H, total, D] problem (for the library's checks).
TensorView whole_rows(const TensorView& t);

}  // namespace varlen_detail
}  // namespace maskattn
