// The GPT block's attention sublayer (nanoGPT's CausalSelfAttention), forward and backward, on
// the model's flat parameters:
//
//   [Q | K | V] = x·W_attnᵀ + b_attn      (attn.c_attn: W_attn [3E, E], one product)
//   O = attention(Q, K, V, mask)         (heads split by strides: [B, L, H·D] seen as [B, H, L, D])
//   y = O·W_projᵀ + b_proj               (attn.c_proj)
//
// and, from dy, through attention_backward:
//
//   dO = dy·W_proj,  dW_proj += dyᵀ·O,  db_proj += Σ dy
//   dQ, dK, dV = attention_backward(...)
//   dx = dQ·W_q + dK·W_k + dV·W_v,  dW_attn += [dQ | dK | dV]ᵀ·x,  db_attn += Σ [dQ | dK | dV]
//
// Why not MultiHeadAttention: the layer owns a copy of its weights (and their transposes for the
// per-row product), so a model whose weights change every step would rebuild it every step, and
// its backward returns freshly allocated gradients that the model then copies into place. Here
// every product reads the parameters where they are and writes the gradients where they go, and
// the buffers (SelfAttentionState and SelfAttentionScratch, in maskattn/model/gpt.h) are the
// model's, kept across steps. Every product is kernels/gemm.h's, whose bits
// do not depend on the thread count, so neither does a step's.
#pragma once

#include <cstdint>

#include "maskattn/mask.h"
#include "maskattn/model/gpt.h"

namespace maskattn::model {

// The sizes of one call: x is [batch·length, embed] with embed = heads·head_dim.
struct SelfAttentionShape {
  int64_t batch = 0, length = 0, heads = 0, embed = 0;
  int64_t rows() const { return batch * length; }
  int64_t head_dim() const { return embed / heads; }
};

// Where the sublayer's parameters (or their gradients) are: W_attn [3E, E], b_attn [3E],
// W_proj [E, E], b_proj [E] (nn.Linear's layout).
template <typename T>
struct SelfAttentionWeights {
  T* attn_weight;
  T* attn_bias;
  T* proj_weight;
  T* proj_bias;
};

// Q, K and V as views into state.qkv.
QkvViews qkv_views(const SelfAttentionState& state, const SelfAttentionShape& shape);

// y [rows, E] (overwritten) from x [rows, E]; `state` is resized and filled for the backward.
// With `residual` [rows, E] (not aliasing y), y = residual + the sublayer's output (added in the
// output projection's epilogue).
void self_attention_forward(const float* x, const SelfAttentionShape& shape,
                            const SelfAttentionWeights<const float>& weights, const Mask& mask,
                            float* y, SelfAttentionState& state, int threads,
                            const float* residual = nullptr);

// dx [rows, E] (overwritten) from dy [rows, E]; the parameter gradients are accumulated (+=).
void self_attention_backward(const float* x, const float* dy, const SelfAttentionShape& shape,
                             const SelfAttentionWeights<const float>& weights,
                             const SelfAttentionWeights<float>& grads, const Mask& mask,
                             const SelfAttentionState& state, SelfAttentionScratch& scratch,
                             float* dx, int threads);

}  // namespace maskattn::model
