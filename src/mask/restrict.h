// A padded batch's mask and score modifiers restricted to one batch entry, cut to that entry's
// own Lq × Lk: what a call on the entry alone applies (restrict.cc's essay). attention_varlen
// runs each sequence so, and so does a paged call whose draft tree sits at each sequence's own
// end (paged_run.cc).
#pragma once

#include <cstdint>

#include "maskattn/mask.h"
#include "maskattn/score_mods.h"
#include "maskattn/shape.h"

namespace maskattn::detail {

// Entry i, lq queries and lk keys. Lengths and starts are taken as they are, and a tree's draft as
// the entry's last T keys: the caller checks that they fit the entry (a varlen call: E138).
Mask restrict_mask(const Mask& mask, int64_t i, int64_t lq, int64_t lk);
ScoreMods restrict_mods(const ScoreMods& mods, int64_t i, int64_t lq, int64_t lk);
// whole += part, where part is ∂L/∂(the bias restricted to entry i) and whole ∂L/∂bias, both
// row-major (the varlen backward's dbias, summed over the sequences).
void add_restricted_bias(const Dims& bias_shape, int64_t i, int64_t lq, int64_t lk,
                         const float* part, double* whole);

}  // namespace maskattn::detail
