// maskattn gpt eval: what a KV-cache format does to a trained model. The validation loss is
// computed through the paged cache — every window of context + 1 validation tokens fed in
// prefill chunks, each token attending to keys and values as the cache stores them (quantized for
// int8, fp8, q4) — beside the same windows through the training forward (f32, no cache); then a
// greedy continuation of a validation prompt through the paged cache in that format (past the
// context as gpt generate goes: restarting on the last context / 2 tokens).
#include <fmt/core.h>

#include <cmath>
#include <cstdio>

#include "commands.h"
#include "maskattn/error.h"
#include "maskattn/model/cross_entropy.h"
#include "maskattn/model/generate.h"
#include "maskattn/model/paged_decoder.h"
#include "maskattn/model/trainer.h"
#include "maskattn/tokens.h"

namespace maskattn::cli {

namespace {

// The validation windows: `count` windows of context + 1 tokens, evenly spaced over the split.
std::vector<std::vector<int32_t>> validation_windows(const std::vector<int32_t>& validation,
                                                     int64_t context, int64_t count) {
  const int64_t size = static_cast<int64_t>(validation.size());
  if (size < context + 1) {
    throw Error("gpt eval: the validation split has " + std::to_string(size) +
                " tokens, fewer than one window of context + 1 = " + std::to_string(context + 1));
  }
  std::vector<std::vector<int32_t>> windows;
  for (int64_t w = 0; w < count; ++w) {
    const int64_t first = count > 1 ? w * (size - context - 1) / (count - 1) : 0;
    windows.emplace_back(validation.begin() + first, validation.begin() + first + context + 1);
  }
  return windows;
}

// The mean loss over the windows' next-token predictions, through the paged cache.
double paged_loss(model::PagedGptDecoder& decoder, const std::vector<std::vector<int32_t>>& windows,
                  int64_t chunk, int64_t vocab) {
  double sum = 0;
  int64_t rows = 0;
  std::vector<float> logits;
  for (const std::vector<int32_t>& window : windows) {
    const int64_t length = static_cast<int64_t>(window.size()) - 1;
    const int64_t sequence = decoder.add_sequence();
    logits.clear();
    for (int64_t first = 0; first < length; first += chunk) {
      const int64_t count = std::min(chunk, length - first);
      const std::vector<float>& part =
          decoder.forward({{sequence, window.data() + first, count}}, true);
      logits.insert(logits.end(), part.begin(), part.end());
    }
    decoder.free(sequence);
    const model::CrossEntropy loss =
        model::cross_entropy(logits.data(), window.data() + 1, length, vocab, -1, nullptr, 1);
    sum += loss.loss * static_cast<double>(loss.real_rows);
    rows += loss.real_rows;
  }
  return sum / static_cast<double>(rows);
}

// The same windows through the training forward (causal, f32, no cache).
double forward_loss(const model::LoadedModel& loaded,
                    const std::vector<std::vector<int32_t>>& windows, int threads) {
  model::Gpt gpt(loaded.parameters, true);
  double sum = 0;
  int64_t rows = 0;
  for (const std::vector<int32_t>& window : windows) {
    const int64_t length = static_cast<int64_t>(window.size()) - 1;
    const model::CrossEntropy loss = gpt.loss_and_gradients(
        loaded.values.data(), {window.data(), window.data() + 1, 1, length, -1}, nullptr, threads);
    sum += loss.loss * static_cast<double>(loss.real_rows);
    rows += loss.real_rows;
  }
  return sum / static_cast<double>(rows);
}

// The default prompt: 24 characters after the validation split's first newline (as gpt ablate).
std::vector<int32_t> default_prompt(const model::LoadedModel& loaded,
                                    const std::vector<int32_t>& validation) {
  const std::vector<int32_t> newline = loaded.vocabulary.encode("\n");
  size_t first = 0;
  for (size_t n = 0; n + 25 < validation.size(); ++n) {
    if (validation[n] == newline[0]) {
      first = n + 1;
      break;
    }
  }
  const size_t end = std::min(first + 24, validation.size());
  return {validation.begin() + static_cast<std::ptrdiff_t>(first),
          validation.begin() + static_cast<std::ptrdiff_t>(end)};
}

// Feeds `tokens` to a new sequence in pieces of `chunk`; returns it and the last logits.
int64_t feed(model::PagedGptDecoder& decoder, const std::vector<int32_t>& tokens, int64_t chunk,
             std::vector<float>& logits) {
  const int64_t sequence = decoder.add_sequence();
  for (size_t first = 0; first < tokens.size(); first += static_cast<size_t>(chunk)) {
    const int64_t count = std::min<int64_t>(chunk, static_cast<int64_t>(tokens.size() - first));
    logits = decoder.forward({{sequence, tokens.data() + first, count}});
  }
  return sequence;
}

// `count` greedy tokens after `prompt` (its last `context` tokens), as gpt generate makes them:
// at the context the cache restarts on the last context / 2 tokens.
std::vector<int32_t> greedy(model::PagedGptDecoder& decoder, const std::vector<int32_t>& prompt,
                            int64_t count, int64_t chunk) {
  const int64_t context = decoder.context();
  std::vector<int32_t> text(prompt.end() - std::min<int64_t>(context, prompt.size()), prompt.end());
  std::vector<float> logits;
  int64_t sequence = feed(decoder, text, chunk, logits);
  std::vector<int32_t> out;
  model::GenerateOptions options;
  options.temperature = 0;
  uint64_t state = 0;
  const int64_t vocab = decoder.parameters().config().vocab;
  for (int64_t n = 0; n < count; ++n) {
    int32_t next = model::sample_token(logits.data(), vocab, options, state, true);
    if (next == kEosId) break;
    out.push_back(next);
    text.push_back(next);
    if (decoder.length(sequence) == context) {
      decoder.free(sequence);
      const std::vector<int32_t> window(text.end() - std::max<int64_t>(context / 2, 1), text.end());
      sequence = feed(decoder, window, chunk, logits);
    } else {
      logits = decoder.forward({{sequence, &next, 1}});
    }
  }
  decoder.free(sequence);
  return out;
}

}  // namespace

int run_gpt_eval(const GptArgs& args) {
  const model::LoadedModel loaded = model::load_model(args.model);
  const model::TextCorpus corpus = model::read_corpus(args.texts);
  const std::vector<int32_t> validation =
      model::split_tokens(loaded.vocabulary.encode(corpus.text)).validation;
  const model::GptConfig& config = loaded.parameters.config();
  const auto windows = validation_windows(validation, config.context, args.windows);
  model::PagedDecoderOptions options;
  options.format = parse_kv_format(args.kv_format, "--kv-format");
  options.block_size = args.block_size;
  options.blocks = (config.context + args.block_size - 1) / args.block_size;
  options.threads = args.threads;
  model::PagedGptDecoder decoder(loaded.parameters, loaded.values.data(), options);
  const double paged = paged_loss(decoder, windows, args.prefill_chunk, config.vocab);
  const double forward = forward_loss(loaded, windows, args.threads);
  std::printf(
      "validation loss %.5f through the paged KV cache (%s, blocks of %lld, prefill chunks of "
      "%lld), %lld windows of %lld tokens\n",
      paged, kv_format_name(options.format), static_cast<long long>(args.block_size),
      static_cast<long long>(args.prefill_chunk), static_cast<long long>(args.windows),
      static_cast<long long>(config.context));
  std::printf("validation loss %.5f through the training forward (f32, no cache): %+.3f %%\n",
              forward, 100.0 * (paged - forward) / forward);
  const std::vector<int32_t> prompt = args.prompt.empty() ? default_prompt(loaded, validation)
                                                          : loaded.vocabulary.encode(args.prompt);
  const std::vector<int32_t> text = greedy(decoder, prompt, args.tokens, args.prefill_chunk);
  std::printf("greedy: %s|%s\n", loaded.vocabulary.decode(prompt).c_str(),
              loaded.vocabulary.decode(text).c_str());
  return 0;
}

}  // namespace maskattn::cli
