#include "maskattn/model/trainer.h"

#include <chrono>
#include <utility>

#include "maskattn/error.h"

namespace maskattn::model {

namespace {

int32_t newline_id(const CharVocabulary& vocabulary) {
  const std::vector<int32_t> ids = vocabulary.encode("\n");
  return ids.size() == 1 && ids[0] >= CharVocabulary::kSpecialTokens ? ids[0] : -1;
}

GptParameters parameters_for(const CharVocabulary& vocabulary, TrainOptions& options) {
  options.model.vocab = vocabulary.size();
  if (options.batch < 1)
    throw Error("gpt: --batch " + std::to_string(options.batch) + " must be ≥ 1");
  if (options.steps < 0)
    throw Error("gpt: --steps " + std::to_string(options.steps) + " must be ≥ 0");
  if (!(options.lr > 0)) throw Error("gpt: --lr " + std::to_string(options.lr) + " must be > 0");
  if (options.warmup < 0) options.warmup = options.steps / 20;
  if (options.min_lr < 0) options.min_lr = options.lr / 10;
  return GptParameters(options.model);
}

}  // namespace

Trainer::Trainer(CharVocabulary vocabulary, const std::vector<int32_t>& tokens,
                 TrainOptions options)
    : Trainer(std::move(vocabulary), tokens, std::move(options), true) {}

Trainer::Trainer(CharVocabulary vocabulary, const std::vector<int32_t>& tokens,
                 TrainOptions options, bool initialise)
    : vocabulary_(std::move(vocabulary)),
      options_(std::move(options)),
      splits_(split_tokens(tokens)),
      gpt_(parameters_for(vocabulary_, options_), options_.causal),
      validation_gpt_(gpt_.parameters(), true),
      sampler_(&splits_.train, options_.model.context, options_.padded_lines,
               newline_id(vocabulary_), options_.seed) {
  // Both splits must hold a batch, so that a run fails now rather than at its first evaluation.
  std::vector<int32_t> tokens_drawn, targets_drawn;
  BatchSampler(&splits_.train, options_.model.context, options_.padded_lines,
               newline_id(vocabulary_), 0)
      .draw(1, tokens_drawn, targets_drawn);
  BatchSampler(&splits_.validation, options_.model.context, options_.padded_lines,
               newline_id(vocabulary_), 0)
      .draw(1, tokens_drawn, targets_drawn);
  const int64_t count = gpt_.parameters().count();
  params_.assign(count, 0.0f);
  grads_.assign(count, 0.0f);
  exp_avg_.assign(count, 0.0f);
  exp_avg_sq_.assign(count, 0.0f);
  if (initialise) gpt_.parameters().initialise(params_.data(), options_.seed);
}

double Trainer::step() {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const int64_t length = sampler_.draw(options_.batch, batch_tokens_, batch_targets_);
  const auto drawn = Clock::now();
  const GptBatch batch{batch_tokens_.data(), batch_targets_.data(), options_.batch, length,
                       options_.padded_lines ? static_cast<int32_t>(0) : -1};
  const CrossEntropy loss =
      gpt_.loss_and_gradients(params_.data(), batch, grads_.data(), options_.threads);
  const auto computed = Clock::now();
  // Clip by the global norm, then one AdamW step per tensor (decay on rank-2 tensors only), all
  // tensors in one parallel region.
  std::vector<float*> tensors;
  std::vector<int64_t> sizes;
  std::vector<AdamWTensor> spans;
  for (const NamedTensor& tensor : gpt_.parameters().tensors()) {
    tensors.push_back(grads_.data() + tensor.offset);
    sizes.push_back(tensor.size);
    spans.push_back({tensor.offset, tensor.size, tensor.decay});
  }
  if (options_.clip > 0) {
    clip_grad_norm(tensors.data(), sizes.data(), static_cast<int64_t>(tensors.size()),
                   options_.clip, options_.threads);
  }
  last_lr_ = learning_rate(step_, options_.lr, options_.min_lr, options_.warmup, options_.steps);
  AdamW adamw;
  adamw.weight_decay = options_.weight_decay;
  adamw_steps(adamw, last_lr_, step_ + 1, spans.data(), static_cast<int64_t>(spans.size()),
              params_.data(), grads_.data(), exp_avg_.data(), exp_avg_sq_.data(), options_.threads);
  ++step_;
  if (timings_ != nullptr) {
    timings_->batches += std::chrono::duration<double>(drawn - start).count();
    timings_->optimizer += std::chrono::duration<double>(Clock::now() - computed).count();
  }
  return loss.loss;
}

double Trainer::validation_loss(int64_t batches) {
  BatchSampler sampler(&splits_.validation, options_.model.context, options_.padded_lines,
                       newline_id(vocabulary_), options_.seed ^ (0xA5A5A5A5ull + step_));
  std::vector<int32_t> tokens, targets;
  double sum = 0;
  int64_t rows = 0;
  for (int64_t n = 0; n < batches; ++n) {
    const int64_t length = sampler.draw(options_.batch, tokens, targets);
    const GptBatch batch{tokens.data(), targets.data(), options_.batch, length,
                         options_.padded_lines ? static_cast<int32_t>(0) : -1};
    const CrossEntropy loss =
        validation_gpt_.loss_and_gradients(params_.data(), batch, nullptr, options_.threads);
    sum += loss.loss * static_cast<double>(loss.real_rows);
    rows += loss.real_rows;
  }
  return rows > 0 ? sum / static_cast<double>(rows) : 0.0;
}

}  // namespace maskattn::model
