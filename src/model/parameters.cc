#include "maskattn/model/parameters.h"

#include <cmath>

#include "core/splitmix64.h"
#include "maskattn/error.h"

namespace maskattn::model {

void GptConfig::validate() const {
  const auto positive = [](int64_t value, const char* name) {
    if (value < 1) {
      throw Error(std::string("gpt: ") + name + " = " + std::to_string(value) + " must be ≥ 1");
    }
  };
  positive(vocab, "vocabulary size");
  positive(context, "--context");
  positive(layers, "--layers");
  positive(d_model, "--d-model");
  positive(heads, "--heads");
  if (d_model % heads != 0) {
    throw Error("gpt: --heads " + std::to_string(heads) + " does not divide --d-model " +
                std::to_string(d_model) + " (each head gets d_model / heads dimensions)");
  }
}

GptParameters::GptParameters(const GptConfig& config) : config_(config) {
  config.validate();
  const int64_t E = config.d_model, H4 = config.hidden();
  wte_ = add("transformer.wte.weight", {config.vocab, E});
  wpe_ = add("transformer.wpe.weight", {config.context, E});
  for (int64_t l = 0; l < config.layers; ++l) {
    const std::string prefix = "transformer.h." + std::to_string(l) + ".";
    BlockOffsets block;
    block.ln_1_weight = add(prefix + "ln_1.weight", {E});
    block.ln_1_bias = add(prefix + "ln_1.bias", {E});
    block.c_attn_weight = add(prefix + "attn.c_attn.weight", {3 * E, E});
    block.c_attn_bias = add(prefix + "attn.c_attn.bias", {3 * E});
    block.attn_proj_weight = add(prefix + "attn.c_proj.weight", {E, E});
    block.attn_proj_bias = add(prefix + "attn.c_proj.bias", {E});
    block.ln_2_weight = add(prefix + "ln_2.weight", {E});
    block.ln_2_bias = add(prefix + "ln_2.bias", {E});
    block.c_fc_weight = add(prefix + "mlp.c_fc.weight", {H4, E});
    block.c_fc_bias = add(prefix + "mlp.c_fc.bias", {H4});
    block.mlp_proj_weight = add(prefix + "mlp.c_proj.weight", {E, H4});
    block.mlp_proj_bias = add(prefix + "mlp.c_proj.bias", {E});
    blocks_.push_back(block);
  }
  ln_f_weight_ = add("transformer.ln_f.weight", {E});
  ln_f_bias_ = add("transformer.ln_f.bias", {E});
}

int64_t GptParameters::add(std::string name, Dims shape) {
  int64_t size = 1;
  for (const int64_t n : shape) size *= n;
  const bool decay = shape.size() == 2;
  tensors_.push_back({std::move(name), std::move(shape), count_, size, decay});
  count_ += size;
  return count_ - size;
}

void GptParameters::initialise(float* values, uint64_t seed) const {
  detail::NormalDraws normal(seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config_.layers));
  for (const NamedTensor& tensor : tensors_) {
    float* first = values + tensor.offset;
    const bool layer_norm_weight = tensor.name.ends_with("ln_1.weight") ||
                                   tensor.name.ends_with("ln_2.weight") ||
                                   tensor.name.ends_with("ln_f.weight");
    if (!tensor.decay) {
      for (int64_t n = 0; n < tensor.size; ++n) first[n] = layer_norm_weight ? 1.0f : 0.0f;
      continue;
    }
    const double std = tensor.name.ends_with("c_proj.weight") ? residual_std : 0.02;
    for (int64_t n = 0; n < tensor.size; ++n) first[n] = static_cast<float>(std * normal.next());
  }
}

}  // namespace maskattn::model
