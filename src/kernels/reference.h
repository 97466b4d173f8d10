// The f64 reference kernel: the oracle every faster kernel is tested against.
//
// It follows docs/design.md §1–3 literally, one query row at a time: scores of the row in f64, the
// modifiers in their fixed order, hidden pairs removed, a plain max-subtracted softmax, O = P·V.
// Scratch is O(Lk + D) per thread; nothing of size Lq·Lk is allocated.
#pragma once

#include "kernels/problem.h"
#include "maskattn/tensor.h"

namespace maskattn::detail::reference {

// out [B, Hq, Lq, Dv] in the inputs' dtype, rounded once from f64; lse [B, Hq, Lq] f32 or null.
void forward(const Problem& problem, const MutableTensorView& out, const MutableTensorView& lse);

// out [B, Hq, Lq, Dv] contiguous, not rounded: the f64 forward finite differences are taken of.
void forward_f64(const Problem& problem, double* out);

// Gradients computed in f64 from q, k, v and dout alone (P, O and D recomputed exactly; the
// forward's own outputs are not read), each rounded once into its view's dtype. Work is split
// across threads by (b, kv head), each owning its dK, dV and dQ rows; with dbias or dsinks,
// which every (b, kv head) adds into, it runs on one thread.
void backward(const Problem& problem, const TensorView& dout, const Gradients& grads);

// weights [B, Hq, Lq, Lk] f32.
void weights(const Problem& problem, const MutableTensorView& weights);

// scores [B, Hq, Lq, Lk] f32 at one stage.
void scores(const Problem& problem, ScoreStage stage, const MutableTensorView& scores);

}  // namespace maskattn::detail::reference
