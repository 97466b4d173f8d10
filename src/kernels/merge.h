// Merging attention computed over disjoint sets of keys (split-key decoding, ring attention):
//   LSE = log(Σ_c exp(LSE_c) + exp(sink)),   O = Σ_c exp(LSE_c − LSE) · O_c
// Parts with LSE −inf (no allowed key) weigh 0; if every part is empty the row is O = 0, LSE = −inf
// (or LSE = sink). A NaN LSE makes the row NaN.
#pragma once

#include <cstdint>

namespace maskattn::detail {

// One query row: part c's normalised output starts at outs + c·out_stride, its LSE at
// lses[c·lse_stride]. Writes value_dim outputs to `out` and returns the merged LSE.
float merge_row(int64_t parts, const float* outs, int64_t out_stride, const float* lses,
                int64_t lse_stride, float sink, int64_t value_dim, float* out);

}  // namespace maskattn::detail
