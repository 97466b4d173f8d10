// The GPT model's configuration and parameters: every tensor under its nanoGPT / PyTorch
// state_dict name, all of them in one flat f32 buffer (gradients and the optimiser's moments use
// the same layout, so an optimiser step is one loop per tensor).
//
// Names and shapes (E = d_model, V = vocabulary, T = context, per layer l):
//   transformer.wte.weight [V, E]           token embedding, tied to lm_head.weight
//   transformer.wpe.weight [T, E]           learned positions
//   transformer.h.l.ln_1.{weight,bias} [E]
//   transformer.h.l.attn.c_attn.weight [3E, E], .bias [3E]   Q, K, V stacked (nanoGPT)
//   transformer.h.l.attn.c_proj.weight [E, E], .bias [E]
//   transformer.h.l.ln_2.{weight,bias} [E]
//   transformer.h.l.mlp.c_fc.weight [4E, E], .bias [4E]
//   transformer.h.l.mlp.c_proj.weight [E, 4E], .bias [E]
//   transformer.ln_f.{weight,bias} [E]
// Initialisation is nanoGPT's: N(0, 0.02) for weights and embeddings, N(0, 0.02/√(2·layers)) for
// the two residual projections (c_proj), zero biases, LayerNorm weights 1; weight decay applies
// to the tensors of rank 2.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "maskattn/shape.h"

namespace maskattn::model {

struct GptConfig {
  int64_t vocab = 0;
  int64_t context = 128;
  int64_t layers = 4;
  int64_t d_model = 128;
  int64_t heads = 4;
  float ln_eps = 1e-5f;

  int64_t head_dim() const { return d_model / heads; }
  int64_t hidden() const { return 4 * d_model; }  // the MLP's width
  // Throws Error naming the setting: sizes < 1, heads not dividing d_model.
  void validate() const;
};

struct NamedTensor {
  std::string name;
  Dims shape;
  int64_t offset = 0;  // in the flat buffer
  int64_t size = 0;
  bool decay = false;  // rank 2: weight decay applies
};

// Offsets of one block's tensors in the flat buffer.
struct BlockOffsets {
  int64_t ln_1_weight, ln_1_bias, c_attn_weight, c_attn_bias, attn_proj_weight, attn_proj_bias;
  int64_t ln_2_weight, ln_2_bias, c_fc_weight, c_fc_bias, mlp_proj_weight, mlp_proj_bias;
};

class GptParameters {
 public:
  explicit GptParameters(const GptConfig& config);

  const GptConfig& config() const { return config_; }
  const std::vector<NamedTensor>& tensors() const { return tensors_; }
  int64_t count() const { return count_; }  // values in the flat buffer
  int64_t wte() const { return wte_; }
  int64_t wpe() const { return wpe_; }
  int64_t ln_f_weight() const { return ln_f_weight_; }
  int64_t ln_f_bias() const { return ln_f_bias_; }
  const BlockOffsets& block(int64_t layer) const { return blocks_[layer]; }

  // nanoGPT's initialisation into `values` (count() of them), from `seed`.
  void initialise(float* values, uint64_t seed) const;

 private:
  int64_t add(std::string name, Dims shape);

  GptConfig config_;
  std::vector<NamedTensor> tensors_;
  std::vector<BlockOffsets> blocks_;
  int64_t count_ = 0, wte_ = 0, wpe_ = 0, ln_f_weight_ = 0, ln_f_bias_ = 0;
};

}  // namespace maskattn::model
