// Training's optimiser pieces, as nanoGPT uses them: AdamW (PyTorch's torch.optim.AdamW,
// step for step), the learning-rate schedule (linear warm-up, then cosine decay to a floor), and
// clipping by the global gradient norm (torch.nn.utils.clip_grad_norm_).
//
// AdamW, per parameter p with gradient g at step t ≥ 1 (decoupled weight decay λ):
//
//   p ← p·(1 − lr·λ)
//   m ← m + (1 − β₁)(g − m)          v ← β₂·v + (1 − β₂)·g²
//   p ← p − (lr / (1 − β₁ᵗ)) · m / (√v / √(1 − β₂ᵗ) + ε)
//
// in this order and grouping, which is PyTorch's single-tensor implementation, so that the same
// gradients give the same parameters to rounding. Elementwise: the same bits for any thread count.
#pragma once

#include <cstdint>

namespace maskattn::model {

struct AdamW {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.1;  // applied only to the tensors the caller marks as decayed
};

// One step over `count` values: p, m, v updated in place; `step` counts from 1.
void adamw_step(const AdamW& config, double lr, int64_t step, bool decay, float* p, const float* g,
                float* m, float* v, int64_t count, int threads);

// A tensor of a flat parameter array: `size` values from `offset`, weight-decayed or not.
struct AdamWTensor {
  int64_t offset = 0, size = 0;
  bool decay = false;
};

// adamw_step on each tensor of flat arrays p, g, m, v (the same bits), in one parallel region
// rather than one per tensor: a model's many small tensors (biases, LayerNorms) each cost a
// region's start and end barrier more than their arithmetic.
void adamw_steps(const AdamW& config, double lr, int64_t step, const AdamWTensor* tensors,
                 int64_t count, float* p, const float* g, float* m, float* v, int threads);

// nanoGPT's get_lr: lr·(it + 1)/(warmup + 1) for it < warmup; then cosine from lr at `warmup` to
// min_lr at `decay_steps`; min_lr after.
double learning_rate(int64_t it, double lr, double min_lr, int64_t warmup, int64_t decay_steps);

// The global L2 norm of the gradients; when it exceeds max_norm, every gradient is scaled by
// max_norm / (norm + 1e-6), as clip_grad_norm_ does. Returns the norm before clipping. `tensors`
// pointers to gradients with `sizes` values each. The squares are summed in f64 over fixed blocks
// of each tensor (eight interleaved partial sums per block), the blocks' sums in tensor order: the
// order depends on the sizes only, so the bits do not depend on `threads`.
double clip_grad_norm(float* const* tensors, const int64_t* sizes, int64_t count, double max_norm,
                      int threads = 1);

}  // namespace maskattn::model
