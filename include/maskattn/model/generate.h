// Generation from the GPT model through the attention layers' KV caches: the prompt is fed once
// (prefill), then one token per step attends over the cached keys and values — O(position) work
// per token instead of recomputing the whole prefix.
//
// The context is the model's: learned positions stop at context − 1. A prompt longer than the
// context keeps its last `context` tokens (the earlier ones are dropped, and generate() says how
// many); when generation reaches the context, the cache restarts on the last context / 2 tokens
// at positions 0… (nanoGPT crops its input to the context the same way, recomputing it).
#pragma once

#include <cstdint>
#include <vector>

#include "maskattn/kv_cache.h"
#include "maskattn/model/parameters.h"
#include "maskattn/multihead.h"

namespace maskattn::model {

class GptDecoder {
 public:
  // `params` must outlive the decoder (it reads the embeddings and LayerNorms in place).
  GptDecoder(const GptParameters& parameters, const float* params, int threads);

  // Appends `tokens` at the next positions and returns the logits [vocab] after the last one.
  // Throws Error when the cache would pass the context (call restart() first).
  const std::vector<float>& feed(const std::vector<int32_t>& tokens);
  // Empties the caches: the next feed() starts at position 0.
  void restart();
  int64_t position() const { return position_; }
  int64_t context() const { return parameters_.config().context; }

 private:
  struct Layer {
    MultiHeadAttention attention;
    KVCache cache;
    std::vector<float> fc_t, proj_t;  // mlp.c_fc and mlp.c_proj transposed
  };

  const GptParameters& parameters_;
  const float* params_;
  int threads_;
  std::vector<Layer> layers_;
  std::vector<float> wte_t_, x_, normed_, attended_, hidden_, activated_, mean_, rstd_, logits_;
  int64_t position_ = 0;
};

struct GenerateOptions {
  int64_t tokens = 200;      // new tokens
  double temperature = 0.8;  // 0: greedy (argmax)
  int64_t top_k = 0;         // 0: every token
  uint64_t seed = 1;
};

struct Generated {
  std::vector<int32_t> tokens;  // the new tokens only
  int64_t prompt_dropped = 0;   // prompt tokens dropped to fit the context
};

// The next token from `logits` [vocab]: the argmax for temperature 0, else a draw from
// softmax(z / temperature) over the top k (one splitmix64 draw from `state`, which advances).
// Special tokens are never chosen, except <eos> when `allow_eos`.
int32_t sample_token(const float* logits, int64_t vocab, const GenerateOptions& options,
                     uint64_t& state, bool allow_eos);

// Samples `options.tokens` tokens after `prompt` (non-empty). Special tokens other than <eos> are
// never sampled; <eos> ends the text early.
Generated generate(GptDecoder& decoder, const std::vector<int32_t>& prompt,
                   const GenerateOptions& options);

}  // namespace maskattn::model
