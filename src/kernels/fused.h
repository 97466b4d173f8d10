// The fused forward kernel: the tiled, mask-skipping, multi-threaded path of attention().
#pragma once

#include "kernels/problem.h"
#include "maskattn/tensor.h"

namespace maskattn::detail::fused {

// out [B, Hq, Lq, Dv] in the inputs' dtype; lse [B, Hq, Lq] f32 or null. `block_skipping` false
// treats every tile as partial (the result must not change: tests compare both).
void forward(const Problem& problem, const MutableTensorView& out, const MutableTensorView& lse,
             bool block_skipping = true);

}  // namespace maskattn::detail::fused
