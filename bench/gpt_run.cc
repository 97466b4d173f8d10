// One measurement of the GPT model of include/maskattn/model/ (bench/gpt_compare runs it):
//   gpt_run [--layers 4 --d-model 128 --heads 4 --context 64 --batch 16] --steps 20 --warmup 3
//           --threads 2 [--generate R]
// trains `warmup` steps untimed, then `steps` timed steps on Debian's licence texts, and prints
// one line of key=value pairs: the median step, tokens/s, and where the time went (seconds over
// the timed steps: attention layers, MLPs, LayerNorms, embeddings + tied head + loss, optimiser,
// batches). With --generate R it also times R greedy generations of context − 1 characters from
// a one-character prompt through the KV cache (the trained parameters), as tokens/s.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "maskattn/model/generate.h"
#include "maskattn/model/trainer.h"

int main(int argc, char** argv) {
  using namespace maskattn;
  model::TrainOptions options;
  options.model.layers = 4;
  options.model.d_model = 128;
  options.model.heads = 4;
  options.model.context = 64;
  options.batch = 16;
  int steps = 20, warmup = 3, generate = 0;
  CLI::App app{"time the GPT model's training steps and generation"};
  app.add_option("--layers", options.model.layers);
  app.add_option("--d-model", options.model.d_model);
  app.add_option("--heads", options.model.heads);
  app.add_option("--context", options.model.context);
  app.add_option("--batch", options.batch);
  app.add_option("--steps", steps)->check(CLI::Range(1, 100000));
  app.add_option("--warmup", warmup)->check(CLI::Range(0, 100000));
  app.add_option("--threads", options.threads);
  app.add_option("--generate", generate)->check(CLI::Range(0, 1000));
  CLI11_PARSE(app, argc, argv);
  options.steps = warmup + steps;
  try {
    const model::TextCorpus corpus = model::read_corpus({});
    const model::CharVocabulary vocabulary = model::CharVocabulary::from_text(corpus.text);
    model::Trainer trainer(vocabulary, vocabulary.encode(corpus.text), options);
    for (int n = 0; n < warmup; ++n) trainer.step();
    model::GptTimings timings;
    trainer.time_into(&timings);
    std::vector<double> ms;
    for (int n = 0; n < steps; ++n) {
      const auto start = std::chrono::steady_clock::now();
      trainer.step();
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
    }
    trainer.time_into(nullptr);
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    const double tokens = static_cast<double>(options.batch * options.model.context);
    std::printf(
        "step_ms=%.3f train_tokens_per_s=%.1f attention_s=%.4f mlp_s=%.4f layer_norm_s=%.4f "
        "embedding_head_loss_s=%.4f optimizer_s=%.4f batches_s=%.4f total_s=%.4f",
        median, tokens / median * 1e3, timings.attention, timings.mlp, timings.layer_norm,
        timings.embedding_head_loss, timings.optimizer, timings.batches, [&] {
          double sum = 0;
          for (const double x : ms) sum += x;
          return sum / 1e3;
        }());
    if (generate > 0) {
      model::GptDecoder decoder(trainer.parameters(), trainer.values().data(), options.threads);
      model::GenerateOptions greedy;
      greedy.temperature = 0;
      greedy.tokens = options.model.context - 1;
      model::generate(decoder, {vocabulary.encode("T")[0]}, greedy);  // warm-up
      std::vector<double> rates;
      for (int r = 0; r < generate; ++r) {
        const auto start = std::chrono::steady_clock::now();
        const model::Generated out = model::generate(decoder, {vocabulary.encode("T")[0]}, greedy);
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        rates.push_back(static_cast<double>(out.tokens.size()) / seconds);
      }
      std::sort(rates.begin(), rates.end());
      std::printf(" generate_tokens_per_s=%.1f", rates[rates.size() / 2]);
    }
    std::printf("\n");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "gpt_run: %s\n", error.what());
    return 1;
  }
  return 0;
}
