#include "maskattn/model/generate.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/splitmix64.h"
#include "kernels/matmul.h"
#include "maskattn/error.h"
#include "maskattn/model/char_vocabulary.h"
#include "maskattn/model/gpt.h"
#include "maskattn/tokens.h"
#include "model/gelu.h"
#include "model/layer_norm.h"
#include "model/linear.h"

namespace maskattn::model {

GptDecoder::GptDecoder(const GptParameters& parameters, const float* params, int threads)
    : parameters_(parameters), params_(params), threads_(threads) {
  const GptConfig& config = parameters.config();
  for (int64_t l = 0; l < config.layers; ++l) {
    MultiHeadAttention attention(attention_weights(parameters, params, l), config.heads);
    KVCache cache = attention.make_cache(1, config.context);
    Layer layer{std::move(attention), std::move(cache), {}, {}};
    const BlockOffsets& o = parameters.block(l);
    transpose(params + o.c_fc_weight, config.hidden(), config.d_model, layer.fc_t);
    transpose(params + o.mlp_proj_weight, config.d_model, config.hidden(), layer.proj_t);
    layers_.push_back(std::move(layer));
  }
  transpose(params + parameters.wte(), config.vocab, config.d_model, wte_t_);
}

void GptDecoder::restart() {
  for (Layer& layer : layers_) layer.cache.clear();
  position_ = 0;
}

const std::vector<float>& GptDecoder::feed(const std::vector<int32_t>& tokens) {
  const GptConfig& config = parameters_.config();
  const int64_t E = config.d_model, H4 = config.hidden(), T = static_cast<int64_t>(tokens.size());
  if (T == 0) throw Error("gpt: nothing to feed the decoder (no tokens)");
  if (position_ + T > config.context) {
    throw Error("gpt: feeding " + std::to_string(T) + " tokens at position " +
                std::to_string(position_) + " passes the context of " +
                std::to_string(config.context));
  }
  x_.resize(T * E);
  for (int64_t t = 0; t < T; ++t) {
    if (tokens[t] < 0 || tokens[t] >= config.vocab) {
      throw Error("gpt: token " + std::to_string(tokens[t]) + " is outside the vocabulary");
    }
    const float* token = params_ + parameters_.wte() + tokens[t] * E;
    const float* place = params_ + parameters_.wpe() + (position_ + t) * E;
    for (int64_t n = 0; n < E; ++n) x_[t * E + n] = token[n] + place[n];
  }
  normed_.resize(T * E);
  attended_.resize(T * E);
  hidden_.resize(T * H4);
  activated_.resize(T * H4);
  mean_.resize(T);
  rstd_.resize(T);
  LayerOptions options;
  options.attention.threads = threads_;
  for (int64_t l = 0; l < config.layers; ++l) {
    const BlockOffsets& o = parameters_.block(l);
    Layer& layer = layers_[l];
    layer_norm_forward(x_.data(), T, E, params_ + o.ln_1_weight, params_ + o.ln_1_bias,
                       config.ln_eps, normed_.data(), mean_.data(), rstd_.data(), threads_);
    layer.attention.forward_cached(TensorView(normed_.data(), {1, T, E}), layer.cache,
                                   MutableTensorView(attended_.data(), {1, T, E}), {}, {}, options);
    for (int64_t n = 0; n < T * E; ++n) x_[n] += attended_[n];
    layer_norm_forward(x_.data(), T, E, params_ + o.ln_2_weight, params_ + o.ln_2_bias,
                       config.ln_eps, normed_.data(), mean_.data(), rstd_.data(), threads_);
    linear_forward_per_row(normed_.data(), T, E, layer.fc_t.data(), params_ + o.c_fc_bias, H4,
                           hidden_.data(), threads_);
    gelu_forward(hidden_.data(), T * H4, activated_.data(), threads_);
    linear_forward_per_row(activated_.data(), T, H4, layer.proj_t.data(), params_ + o.mlp_proj_bias,
                           E, attended_.data(), threads_);
    for (int64_t n = 0; n < T * E; ++n) x_[n] += attended_[n];
  }
  // The last position only: ln_f, then the tied head.
  layer_norm_forward(x_.data() + (T - 1) * E, 1, E, params_ + parameters_.ln_f_weight(),
                     params_ + parameters_.ln_f_bias(), config.ln_eps, normed_.data(), mean_.data(),
                     rstd_.data(), threads_);
  logits_.resize(config.vocab);
  detail::matmul(normed_.data(), E, 1, 1, E, wte_t_.data(), config.vocab, config.vocab,
                 logits_.data(), config.vocab, false, threads_);
  position_ += T;
  return logits_;
}

int32_t sample_token(const float* logits, int64_t vocab, const GenerateOptions& options,
                     uint64_t& state, bool allow_eos) {
  std::vector<std::pair<double, int32_t>> candidates;
  for (int32_t id = 0; id < static_cast<int32_t>(vocab); ++id) {
    if (id < CharVocabulary::kSpecialTokens && (id != kEosId || !allow_eos)) continue;
    candidates.emplace_back(logits[id], id);
  }
  if (candidates.empty())
    return static_cast<int32_t>(kEosId);  // a vocabulary of special tokens only: nothing to say
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  if (options.temperature <= 0) return candidates.front().second;
  if (options.top_k > 0 && options.top_k < static_cast<int64_t>(candidates.size())) {
    candidates.resize(options.top_k);
  }
  double total = 0;
  for (auto& [weight, id] : candidates) {
    weight = std::exp((weight - candidates.front().first) / options.temperature);
    total += weight;
  }
  detail::SplitMix64 draws(state);
  double target = draws.unit() * total;
  state = draws.state();
  for (const auto& [weight, id] : candidates) {
    if ((target -= weight) < 0) return id;
  }
  return candidates.back().second;
}

Generated generate(GptDecoder& decoder, const std::vector<int32_t>& prompt,
                   const GenerateOptions& options) {
  if (prompt.empty()) throw Error("gpt: the prompt is empty; give at least one character");
  Generated result;
  std::vector<int32_t> text = prompt;
  uint64_t state = options.seed;
  std::vector<float> logits;
  const auto refill = [&](int64_t keep) {
    decoder.restart();
    const std::vector<int32_t> window(text.end() - keep, text.end());
    logits = decoder.feed(window);
  };
  const int64_t limit = decoder.context();
  if (static_cast<int64_t>(text.size()) > limit) {
    result.prompt_dropped = static_cast<int64_t>(text.size()) - limit;
  }
  refill(std::min<int64_t>(limit, static_cast<int64_t>(text.size())));
  for (int64_t n = 0; n < options.tokens; ++n) {
    const int32_t next =
        sample_token(logits.data(), static_cast<int64_t>(logits.size()), options, state, true);
    if (next == kEosId) break;
    result.tokens.push_back(next);
    text.push_back(next);
    if (decoder.position() == limit) {
      refill(std::max<int64_t>(limit / 2, 1));
    } else {
      logits = decoder.feed({next});
    }
  }
  return result;
}

}  // namespace maskattn::model
