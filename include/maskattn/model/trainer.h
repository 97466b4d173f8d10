// Training the GPT model: AdamW with weight decay on the rank-2 tensors, a warm-up + cosine
// learning-rate schedule, clipping by the global gradient norm, batches from a BatchSampler, and
// checkpoints that resume bitwise (parameters, both AdamW moments, the step and the sampler's
// state are saved; a resumed run draws the batches and takes the steps an uninterrupted one
// would).
//
// The validation loss is always evaluated under the causal mask — the inference condition, where
// a token's prediction can only use the tokens before it — whatever mask the model trained with.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "maskattn/model/char_vocabulary.h"
#include "maskattn/model/gpt.h"
#include "maskattn/model/optimizer.h"
#include "maskattn/model/text_data.h"

namespace maskattn::model {

struct TrainOptions {
  GptConfig model;  // vocab is set from the vocabulary
  bool causal = true;
  bool padded_lines = false;
  int64_t batch = 16;
  int64_t steps = 600;
  int64_t warmup = -1;  // −1: steps / 20
  double lr = 2e-3;
  double min_lr = -1;  // −1: lr / 10
  double weight_decay = 0.1;
  double clip = 1.0;
  uint64_t seed = 1;
  int threads = 0;  // 0: OpenMP's default
};

// A trained model read from a checkpoint directory (what generation needs: no optimiser state,
// no text). Throws Error naming a missing or mis-shaped tensor.
struct LoadedModel {
  CharVocabulary vocabulary;
  GptParameters parameters;
  std::vector<float> values;
  bool causal = true;  // the mask it was trained with
  int64_t steps = 0;   // optimiser steps taken
};
LoadedModel load_model(const std::string& directory);

class Trainer {
 public:
  // A new model, initialised from options.seed, on the 90 % / 10 % split of `tokens`.
  Trainer(CharVocabulary vocabulary, const std::vector<int32_t>& tokens, TrainOptions options);

  // The checkpoint in `directory` (written by save()), continuing on `tokens` (the same text).
  static Trainer resume(const std::string& directory, const std::vector<int32_t>& tokens,
                        int threads);

  // One optimiser step; returns the batch's training loss (under the training mask).
  double step();
  // The mean loss of `batches` validation batches (seeded by the step: the same batches for the
  // same step), under the causal mask.
  double validation_loss(int64_t batches);

  void save(const std::string& directory) const;

  // Adds where the following steps' time goes into `timings` (null: stop).
  void time_into(GptTimings* timings) {
    timings_ = timings;
    gpt_.time_into(timings);
  }

  int64_t steps_done() const { return step_; }
  const TrainOptions& options() const { return options_; }
  const CharVocabulary& vocabulary() const { return vocabulary_; }
  const GptParameters& parameters() const { return gpt_.parameters(); }
  const std::vector<float>& values() const { return params_; }
  double last_learning_rate() const { return last_lr_; }

 private:
  Trainer(CharVocabulary vocabulary, const std::vector<int32_t>& tokens, TrainOptions options,
          bool initialise);

  CharVocabulary vocabulary_;
  TrainOptions options_;
  TokenSplits splits_;
  Gpt gpt_;
  Gpt validation_gpt_;  // the same parameters under the causal mask, its buffers kept
  BatchSampler sampler_;
  std::vector<float> params_, grads_, exp_avg_, exp_avg_sq_;
  std::vector<int32_t> batch_tokens_, batch_targets_;
  int64_t step_ = 0;
  double last_lr_ = 0;
  GptTimings* timings_ = nullptr;
};

}  // namespace maskattn::model
