// MultiHeadAttention: the attention layer of a Transformer around the masked attention kernel
// (docs/semantics.md §13):
//
//   Q = X_q·W_qᵀ + b_q    K = X_k·W_kᵀ + b_k    V = X_v·W_vᵀ + b_v        (nn.Linear, per token)
//   O_h = attention(Q_h, K_{h/(Hq/Hkv)}, V_{h/(Hq/Hkv)}, mask)            (heads split by strides)
//   Y = concat_h(O_h)·W_oᵀ + b_o
//
// Inputs and outputs are [B, L, E]. Heads are split and merged through strides: the projection of
// a token is laid out [H, D], so the [B, L, H·D] buffer is the [B, H, L, D] view the kernel takes,
// and the kernel writes its output straight into the [B, L, H·Dv] rows the output projection
// reads. Weights are f32 in PyTorch's (out_features, in_features) layout, and load from .npy files
// named like nn.MultiheadAttention.state_dict() keys, so a PyTorch layer ports unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "maskattn/array.h"
#include "maskattn/attention.h"
#include "maskattn/kv_cache.h"
#include "maskattn/mask.h"
#include "maskattn/score_mods.h"
#include "maskattn/tensor.h"

namespace maskattn {

struct LayerWeights {
  Array<float> q_weight;    // [Hq·D, Eq]
  Array<float> k_weight;    // [Hkv·D, Ek]
  Array<float> v_weight;    // [Hkv·Dv, Ev]
  Array<float> out_weight;  // [E, Hq·Dv]
  // [rows of the matching weight] each, or empty for no bias. All four or none.
  Array<float> q_bias, k_bias, v_bias, out_bias;
};

struct LayerOptions {
  Options attention;         // scale (default 1/√D), kernel, threads, check_finite
  DType dtype = DType::f32;  // Q, K, V and the heads' outputs are rounded to it; sums stay f32
};

// What forward() keeps for backward(): the inputs as f32, Q, K, V, the heads' outputs and LSE.
// Each forward() that saves into it may exchange these vectors' buffers with the layer's own
// (no copy): their contents are always this forward's, but a pointer into them does not outlive
// the next forward() that saves into the same activations.
struct LayerActivations {
  int64_t batch = 0, query_length = 0, key_length = 0;
  DType dtype = DType::f32;
  std::vector<float> query, key, value;  // [B, L, E*] as f32
  std::vector<uint8_t> q, k, v, heads;   // [B, L, H·D] in `dtype`
  std::vector<float> lse;                // [B, Hq, Lq]
};

struct LayerGradients {
  Array<float> dquery, dkey, dvalue;  // [B, L, E*]; for self-attention the input's gradient is
                                      // their sum
  LayerWeights dweights;              // the weights' shapes (biases only if the layer has them)
};

class MultiHeadAttention {
 public:
  // Checks the shapes: Hq·D rows in q_weight with D = rows / Hq, Hkv·D rows in k_weight, Hq % Hkv
  // == 0, out_weight [E, Hq·Dv], and matching biases. kv_heads 0 means heads.
  MultiHeadAttention(LayerWeights weights, int64_t heads, int64_t kv_heads = 0);

  // Loads DIR/in_proj_weight.npy [Hq·D + 2·Hkv·D, E] (nn.MultiheadAttention's packed form), or
  // DIR/q_proj_weight.npy, k_proj_weight.npy, v_proj_weight.npy (its kdim/vdim form); plus
  // out_proj.weight.npy and, when present, in_proj_bias.npy and out_proj.bias.npy. float32 or
  // float16 files. bias_k.npy/bias_v.npy (add_bias_kv) are refused.
  static MultiHeadAttention load(const std::string& directory, int64_t heads, int64_t kv_heads = 0);
  // Writes the weights in the packed form when Ek = Ev = Eq and Dv = D, else the separate form.
  void save(const std::string& directory) const;

  // nn.Linear's default initialisation, seeded: every weight and bias uniform in ±1/√in_features.
  static MultiHeadAttention random(int64_t embed_dim, int64_t heads, int64_t kv_heads,
                                   uint64_t seed, bool bias = true);

  int64_t embed_dim() const { return embed_dim_; }  // E: the output's width
  int64_t query_dim() const;                        // Eq
  int64_t key_dim() const;                          // Ek
  int64_t value_dim() const;                        // Ev
  int64_t heads() const { return heads_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t head_value_dim() const { return head_value_dim_; }
  bool has_bias() const { return !weights_.q_bias.empty(); }
  const LayerWeights& weights() const { return weights_; }

  // query [B, Lq, Eq], key [B, Lk, Ek], value [B, Lk, Ev] (any element type and strides), out
  // [B, Lq, E]. Self-attention passes the same tensor three times; cross-attention passes the
  // encoder's output as key and value, and the encoder's padding in the mask. `saved`, when given,
  // receives what backward() needs.
  void forward(const TensorView& query, const TensorView& key, const TensorView& value,
               const MutableTensorView& out, const Mask& mask = {}, const ScoreMods& mods = {},
               const LayerOptions& options = {}, LayerActivations* saved = nullptr) const;

  // Decoding and chunked prefill: query [B, T, Eq] holds the next T positions of every sequence.
  // Their keys and values are projected and appended to `cache`, then the T queries attend over
  // the whole cache under cache.step_mask() & mask. T tokens fed at once or one by one give the
  // same outputs (to rounding). The cache must match the layer's Hkv, D and Dv. Q, K, V and the
  // heads' outputs take the cache's element type: LayerOptions::dtype applies to forward() only.
  void forward_cached(const TensorView& query, KVCache& cache, const MutableTensorView& out,
                      const Mask& mask = {}, const ScoreMods& mods = {},
                      const LayerOptions& options = {}) const;

  // A cache for this layer.
  KVCache make_cache(int64_t batch, int64_t capacity, DType dtype = DType::f32) const;

  // Gradients of a loss L given dout = ∂L/∂out [B, Lq, E], for the activations forward() saved
  // with the same mask, modifiers and options.
  LayerGradients backward(const LayerActivations& saved, const TensorView& dout,
                          const Mask& mask = {}, const ScoreMods& mods = {},
                          const LayerOptions& options = {}) const;

 private:
  LayerWeights weights_;
  // Transposed copies [in, out] of the weights: the product kernel reads B by rows.
  std::vector<float> q_weight_t_, k_weight_t_, v_weight_t_, out_weight_t_;
  int64_t embed_dim_ = 0, heads_ = 0, kv_heads_ = 0, head_dim_ = 0, head_value_dim_ = 0;
};

}  // namespace maskattn
