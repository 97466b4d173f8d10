// Writing an f32 buffer into a view of any dtype and strides, or adding it to what the view holds:
// the last step of every path that keeps results in f32 until they are final (split-key merges,
// accumulated gradients, the ring's accumulators).
#pragma once

#include "maskattn/tensor.h"

namespace maskattn::detail {

// dst = src, or dst + src when `add` (the sum in f32), rounded once into dst's dtype. `src` is
// contiguous, row-major, in dst's shape. Walks dst row by row (its last axis innermost), so the
// cost is a pass over memory, not an index computation per element.
void store_f32(const float* src, const MutableTensorView& dst, bool add);

}  // namespace maskattn::detail
