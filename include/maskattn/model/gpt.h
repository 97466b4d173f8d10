// The decoder-only Transformer (nanoGPT's shape) on maskattn's attention layer: forward and
// backward of the whole model for one batch, the loss over real tokens only.
//
//   x₀ = wte[token] + wpe[t]
//   per block:  x ← x + attn(ln_1(x)),  x ← x + c_proj(gelu(c_fc(ln_2(x))))
//   logits = ln_f(x) · wteᵀ  (the LM head tied to the embedding),  loss = cross_entropy(logits)
//
// The attention is maskattn's attention() and attention_backward() on Q, K, V from one c_attn
// product (src/model/self_attention.h), then attn.c_proj, under the model's mask: causal (the
// look-ahead mask) or none, and, for a padded batch, the padding keys hidden (key_keep of
// tokens ≠ pad), so a right-padded batch computes each sequence as if it were alone. Every step
// is deterministic: the same bits for any thread count. (The decoders of generate.h run the same
// weights through MultiHeadAttention and its KV cache.)
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "maskattn/mask.h"
#include "maskattn/model/cross_entropy.h"
#include "maskattn/model/parameters.h"
#include "maskattn/multihead.h"
#include "maskattn/tensor.h"

namespace maskattn::model {

// Targets equal to this take no part in the loss (nanoGPT's ignore_index).
inline constexpr int32_t kIgnoreTarget = -1;

struct GptBatch {
  const int32_t* tokens = nullptr;   // [batch, length], each in [0, vocab)
  const int32_t* targets = nullptr;  // [batch, length], a token or kIgnoreTarget
  int64_t batch = 0, length = 0;
  int32_t pad = -1;  // a token id that is padding (its keys are hidden), or −1 for none
};

// What a block's attention sublayer keeps for its backward: c_attn's output [rows, 3E] (each
// token's Q, K, V side by side), the heads' outputs merged [rows, E] (c_proj's input), and the
// softmax's log-normalisers [batch, heads, length].
struct SelfAttentionState {
  std::vector<float> qkv, heads, lse;
};

// The sublayer backward's working buffers, [rows, E] each: the heads' gradient, dQ, dK, dV.
struct SelfAttentionScratch {
  std::vector<float> dheads, dq, dk, dv;
};

// Q, K and V [batch, heads, length, head_dim]: views into a SelfAttentionState's qkv.
struct QkvViews {
  TensorView q, k, v;
};

// What one block's forward keeps for its backward ([rows, width] each, rows = batch·length).
struct GptBlockState {
  std::vector<float> x_in, ln_1, ln_1_mean, ln_1_rstd;  // the block's input and ln_1(x_in)
  SelfAttentionState attention;
  std::vector<float> x_mid, ln_2, ln_2_mean, ln_2_rstd;  // x_in + attn(...), ln_2(x_mid)
  std::vector<float> fc, act;                            // c_fc(ln_2) and gelu of it [rows, 4E]
};

// Layer `layer`'s attention weights from the flat parameters: Q, K, V are attn.c_attn's three row
// blocks (and its bias's thirds), the output projection attn.c_proj.
LayerWeights attention_weights(const GptParameters& parameters, const float* params, int64_t layer);

// Where a step's time goes, in seconds, summed over calls while enabled (benchmarks): the
// attention layers (their Q/K/V and output projections included), the MLPs, the LayerNorms, the
// embeddings with the tied head and the loss, forward and backward together; the Trainer adds
// the optimiser (clipping and AdamW) and drawing the batches.
struct GptTimings {
  double attention = 0, mlp = 0, layer_norm = 0, embedding_head_loss = 0;
  double optimizer = 0, batches = 0;
};

class Gpt {
 public:
  Gpt(GptParameters parameters, bool causal);

  const GptParameters& parameters() const { return parameters_; }
  bool causal() const { return causal_; }

  // The loss of the batch under `params` (parameters().count() values); with `grads` (the same
  // layout) also its gradient, written (not accumulated). Throws Error for tokens outside the
  // vocabulary or a length beyond the context.
  CrossEntropy loss_and_gradients(const float* params, const GptBatch& batch, float* grads,
                                  int threads);

  // Timings of the following calls, added into `timings` (null: none, the default).
  void time_into(GptTimings* timings) { timings_ = timings; }

  // The logits [batch·length, vocab] of the last forward pass.
  const std::vector<float>& logits() const { return logits_; }
  // What block `layer` kept in the last forward pass (its attention's Q, K, V among it).
  const GptBlockState& block_state(int64_t layer) const { return blocks_[layer]; }
  // Q, K and V of block `layer` in the last forward pass: views into its block_state(layer),
  // valid until the next call.
  QkvViews qkv(int64_t layer) const;
  // The attention mask of the last forward pass.
  const Mask& last_mask() const { return mask_; }

 private:
  Mask mask_for(const GptBatch& batch) const;
  // Adds the time since the last mark to `part` of the timings (when timing), and marks now.
  void charge(double GptTimings::*part);
  void forward(const float* params, const GptBatch& batch, int threads);
  void backward(const float* params, const GptBatch& batch, float* grads, int threads);

  GptParameters parameters_;
  bool causal_;
  // Buffers kept across calls (sized on first use): no per-step allocation of activations.
  std::vector<GptBlockState> blocks_;
  std::vector<float> residual_, ln_f_, ln_f_mean_, ln_f_rstd_, logits_;
  std::vector<float> dx_, scratch_a_, scratch_h_;
  SelfAttentionScratch attention_scratch_;
  int64_t last_batch_ = 0, last_length_ = 0;
  Mask mask_;
  GptTimings* timings_ = nullptr;
  std::chrono::steady_clock::time_point mark_;
};

}  // namespace maskattn::model
