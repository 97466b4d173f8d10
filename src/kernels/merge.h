// Merging attention computed over disjoint sets of keys (split-key decoding, merge_partials, ring
// attention):
//   LSE = log(Σ_c exp(LSE_c) + exp(sink)),   O = Σ_c exp(LSE_c − LSE) · O_c
// Parts with LSE −inf (no allowed key) weigh 0; if every part is empty the row is O = 0, LSE = −inf
// (or LSE = sink). A NaN LSE makes the row NaN.
//
// This is the one merge: the decode driver's split keys, the public merge_partials() and the
// ring's in-place accumulation all call merge_row, so the three give the same bits. The
// arithmetic is in f64: weights exp(LSE_c − top) relative to the largest LSE (no overflow), each
// computed once per row, the sink's weight first in the total, the parts summed in order, one
// rounding to f32 at the end.
#pragma once

#include <cstdint>

namespace maskattn::detail {

// One query row: part c's normalised output row is rows[c] (value_dim floats), its LSE lses[c].
// Writes value_dim outputs to `out` and returns the merged LSE. `weights` is scratch for `parts`
// doubles. `out` may be one of the rows (in place: each element is read before it is written).
float merge_row(int64_t parts, const float* const* rows, const float* lses, float sink,
                int64_t value_dim, double* weights, float* out);

// The same for parts laid out with a stride: part c's row at outs + c·out_stride, its LSE at
// lses[c·lse_stride].
float merge_row(int64_t parts, const float* outs, int64_t out_stride, const float* lses,
                int64_t lse_stride, float sink, int64_t value_dim, float* out);

}  // namespace maskattn::detail
