// The fused backward kernel: the tiled, mask-skipping, multi-threaded path of attention_backward().
#pragma once

#include "kernels/problem.h"
#include "maskattn/attention.h"

namespace maskattn::detail::fused {

// Gradients from the forward's out and lse (P recomputed as exp(S − LSE)); `block_skipping` false
// treats every tile as partial (the result must not change: tests compare both).
void backward(const Problem& problem, const TensorView& out, const TensorView& lse,
              const TensorView& dout, const Gradients& grads, bool block_skipping = true);

}  // namespace maskattn::detail::fused
