// maskattn gpt train|generate|ablate|serve|eval: the small character-level GPT of
// include/maskattn/model/ on the command line (docs/gpt.md). This file parses the options and runs
// training and generation; the ablation (two models, one table, pictures) is gpt_ablate.cc, serving
// a requests file gpt_serve.cc, the KV-cache formats' effect gpt_eval.cc.
#include <fmt/core.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "gpt_progress.h"
#include "maskattn/error.h"
#include "maskattn/model/generate.h"
#include "maskattn/model/trainer.h"

namespace maskattn::cli {

namespace {

void add_model_options(CLI::App* command, GptArgs& args) {
  command->add_option("--text", args.texts,
                      "training text file(s); default: every file of /usr/share/common-licenses");
  command->add_option("--layers", args.layers, "Transformer blocks (default 4)")
      ->check(CLI::Range(1, 64));
  command->add_option("--d-model", args.d_model, "embedding width E (default 128)")
      ->check(CLI::Range(1, 4096));
  command->add_option("--heads", args.heads, "attention heads; must divide --d-model (default 4)")
      ->check(CLI::Range(1, 256));
  command->add_option("--context", args.context, "context length T (default 64)")
      ->check(CLI::Range(1, 65536));
  command->add_option("--batch", args.batch, "sequences per step (default 16)")
      ->check(CLI::Range(1, 65536));
  command->add_option("--steps", args.steps, "optimiser steps (default 600)")
      ->check(CLI::Range(0, 100000000));
  command->add_option("--lr", args.lr, "peak learning rate (default 2e-3)")
      ->check(CLI::PositiveNumber);
  command->add_option("--seed", args.seed, "initialisation and batch seed (default 1)");
  command->add_option("--threads", args.threads, "threads (default: all cores)")
      ->check(CLI::Range(0, 1024));
  command->add_flag("--padded", args.padded,
                    "train on padded batches of <bos> line <eos> (the padding masks)");
  command
      ->add_option("--eval-every", args.eval_every,
                   "validation loss every N steps (default steps / 10)")
      ->check(CLI::Range(0, 100000000));
}

// The paged KV cache's options (serve, eval).
void add_cache_options(CLI::App* command, GptArgs& args) {
  command->add_option("--kv-format", args.kv_format,
                      "KV cache format: f32 (default), f16, bf16, int8, fp8-e4m3, fp8-e5m2, q4");
  command->add_option("--block-size", args.block_size, "positions per cache block (default 16)")
      ->check(CLI::Range(16, 1024));
  command
      ->add_option("--prefill-chunk", args.prefill_chunk,
                   "prompt tokens fed per piece (default 64)")
      ->check(CLI::Range(1, 1000000));
  command->add_option("--threads", args.threads, "threads (default: all cores)")
      ->check(CLI::Range(0, 1024));
}

void add_serve_command(CLI::App* gpt, const std::shared_ptr<GptArgs>& args) {
  CLI::App* serve = gpt->add_subcommand(
      "serve", "run a file of requests through continuous batching over a paged KV cache");
  serve->add_option("--model", args->model, "a gpt train checkpoint directory")->required();
  serve->add_option("--requests", args->requests, "the requests: JSON lines (docs/cli.md)")
      ->required();
  serve->add_option("--out", args->results, "write the results (JSON lines) here; default stdout");
  add_cache_options(serve, *args);
  serve->add_option("--pool-blocks", args->pool_blocks, "cache blocks per layer")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 31));
  serve->add_option("--pool-mib", args->pool_mib, "cache memory of all layers, in MiB")
      ->check(CLI::PositiveNumber);
  serve->add_option("--max-batch", args->max_batch, "requests running at once (default 32)")
      ->check(CLI::Range(1, 1000000));
  serve->add_option("--token-budget", args->token_budget, "tokens fed per step (default 256)")
      ->check(CLI::Range(1, 100000000));
  serve->callback([args] { args->action = "serve"; });

  CLI::App* eval = gpt->add_subcommand(
      "eval", "validation loss and a greedy sample through the paged KV cache in one format");
  eval->add_option("--model", args->model, "a gpt train checkpoint directory")->required();
  eval->add_option("--text", args->texts, "the training text file(s) (default as gpt train)");
  eval->add_option("--windows", args->windows, "validation windows (default 16)")
      ->check(CLI::Range(1, 100000));
  eval->add_option("--prompt", args->prompt,
                   "greedy sample's prompt (default: 24 validation characters)");
  eval->add_option("--tokens", args->tokens, "greedy sample's new characters (default 200)")
      ->check(CLI::Range(1, 1000000));
  add_cache_options(eval, *args);
  eval->callback([args] { args->action = "eval"; });
}

}  // namespace

model::TrainOptions train_options(const GptArgs& args) {
  model::TrainOptions options;
  options.model.layers = args.layers;
  options.model.d_model = args.d_model;
  options.model.heads = args.heads;
  options.model.context = args.context;
  options.causal = args.mask == "causal";
  options.padded_lines = args.padded;
  options.batch = args.batch;
  options.steps = args.steps;
  options.lr = args.lr;
  options.seed = args.seed;
  options.threads = args.threads;
  return options;
}

TrainedRun train_model(const GptArgs& args, const model::TextCorpus& corpus, const std::string& out,
                       bool resume) {
  model::TrainOptions options = train_options(args);
  std::unique_ptr<model::Trainer> trainer;
  if (resume) {
    const model::LoadedModel saved = model::load_model(out);
    trainer = std::make_unique<model::Trainer>(
        model::Trainer::resume(out, saved.vocabulary.encode(corpus.text), args.threads));
  } else {
    const model::CharVocabulary vocabulary = model::CharVocabulary::from_text(corpus.text);
    trainer = std::make_unique<model::Trainer>(vocabulary, vocabulary.encode(corpus.text), options);
  }
  const model::TrainOptions& used = trainer->options();
  std::fprintf(
      stderr,
      "gpt: %zu characters from %zu file(s), vocabulary %lld (7 special tokens), %lld "
      "parameters; mask %s, %lld layers, d_model %lld, %lld heads, context %lld, batch "
      "%lld%s\n",
      corpus.text.size(), corpus.files.size(), static_cast<long long>(trainer->vocabulary().size()),
      static_cast<long long>(trainer->parameters().count()), used.causal ? "causal" : "none",
      static_cast<long long>(used.model.layers), static_cast<long long>(used.model.d_model),
      static_cast<long long>(used.model.heads), static_cast<long long>(used.model.context),
      static_cast<long long>(used.batch), used.padded_lines ? ", padded lines" : "");
  TrainedRun run;
  const int64_t eval_every =
      args.eval_every > 0 ? args.eval_every : std::max<int64_t>(used.steps / 10, 1);
  Progress progress(used.steps, trainer->steps_done());
  std::filesystem::create_directories(out);
  std::ofstream log(out + "/loss.csv", resume ? std::ios::app : std::ios::trunc);
  if (!resume) log << "step,lr,train_loss,validation_loss\n";
  while (trainer->steps_done() < used.steps) {
    const double loss = trainer->step();
    run.train_losses.push_back(loss);
    const int64_t step = trainer->steps_done();
    std::string validation;
    if (step % eval_every == 0 || step == used.steps) {
      const double value = trainer->validation_loss(8);
      run.validation_losses.emplace_back(step, value);
      validation = fmt::format("{:.6f}", value);
    }
    log << step << ',' << fmt::format("{:.6g}", trainer->last_learning_rate()) << ','
        << fmt::format("{:.6f}", loss) << ',' << validation << '\n';
    progress.update(step, loss, used.batch * used.model.context);
  }
  progress.finish();
  trainer->save(out);
  run.final_train_loss = run.train_losses.empty() ? 0.0 : run.train_losses.back();
  run.validation_loss = trainer->validation_loss(16);
  run.vocabulary_size = trainer->vocabulary().size();
  return run;
}

int run_gpt_train(const GptArgs& args) {
  if (args.out.empty()) throw Error("gpt train: give --out DIR for the checkpoint");
  const model::TextCorpus corpus = model::read_corpus(args.texts);
  const bool resume = args.resume && std::filesystem::exists(args.out + "/config.txt");
  if (args.resume && !resume) {
    throw Error("gpt train --resume: " + args.out + " holds no checkpoint (no config.txt)");
  }
  const TrainedRun run = train_model(args, corpus, args.out, resume);
  std::printf(
      "wrote %s: the checkpoint (state_dict .npy files, AdamW state, vocabulary.npy, "
      "config.txt) and loss.csv\nfinal training loss %.4f, validation loss (causal mask) %.4f, "
      "uniform guess ln(V) %.4f\n",
      args.out.c_str(), run.final_train_loss, run.validation_loss,
      std::log(static_cast<double>(run.vocabulary_size)));
  return 0;
}

int run_gpt_generate(const GptArgs& args) {
  if (args.model.empty()) throw Error("gpt generate: give --model DIR (a gpt train checkpoint)");
  const model::LoadedModel loaded = model::load_model(args.model);
  const std::vector<int32_t> prompt = loaded.vocabulary.encode(args.prompt);
  int64_t unknown = 0;
  for (const int32_t id : prompt) unknown += id == 1;
  if (unknown > 0) {
    std::fprintf(stderr, "gpt: %lld prompt character(s) not in the vocabulary became <unk>\n",
                 static_cast<long long>(unknown));
  }
  model::GptDecoder decoder(loaded.parameters, loaded.values.data(), args.threads);
  model::GenerateOptions options;
  options.tokens = args.tokens;
  options.temperature = args.temperature;
  options.top_k = args.top_k;
  options.seed = args.seed;
  const auto start = std::chrono::steady_clock::now();
  const model::Generated generated = model::generate(decoder, prompt, options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (generated.prompt_dropped > 0) {
    std::fprintf(stderr,
                 "gpt: the prompt is longer than the context of %lld; its first %lld "
                 "character(s) were dropped\n",
                 static_cast<long long>(loaded.parameters.config().context),
                 static_cast<long long>(generated.prompt_dropped));
  }
  std::printf("%s%s\n", args.prompt.c_str(), loaded.vocabulary.decode(generated.tokens).c_str());
  std::fprintf(stderr, "gpt: %zu tokens in %.3f s (%.0f tokens/s) through the KV cache\n",
               generated.tokens.size(), seconds,
               seconds > 0 ? static_cast<double>(generated.tokens.size()) / seconds : 0.0);
  return 0;
}

Command add_gpt_command(CLI::App& app) {
  auto args = std::make_shared<GptArgs>();
  CLI::App* gpt = app.add_subcommand(
      "gpt",
      "train, sample, ablate and serve a small character-level GPT (why the look-ahead mask)");
  gpt->require_subcommand(1);

  CLI::App* train = gpt->add_subcommand("train", "train a model; checkpoint and loss log in --out");
  train->add_option("--out", args->out, "checkpoint directory")->required();
  train->add_option("--mask", args->mask, "causal (default) or none")
      ->check(CLI::IsMember({"causal", "none"}));
  train->add_flag("--resume", args->resume, "continue the checkpoint in --out");
  add_model_options(train, *args);
  train->callback([args] { args->action = "train"; });

  CLI::App* generate = gpt->add_subcommand("generate", "continue a prompt through the KV cache");
  generate->add_option("--model", args->model, "a gpt train checkpoint directory")->required();
  generate->add_option("--prompt", args->prompt, "the text to continue")->required();
  generate->add_option("--tokens", args->tokens, "new characters (default 200)")
      ->check(CLI::Range(0, 1000000));
  generate->add_option("--temperature", args->temperature, "0 = greedy (default 0.8)")
      ->check(CLI::Range(0.0, 100.0));
  generate->add_option("--top-k", args->top_k, "sample among the k likeliest (default: all)")
      ->check(CLI::Range(0, 1000000));
  generate->add_option("--seed", args->seed, "sampling seed (default 1)");
  generate->add_option("--threads", args->threads, "threads (default: all cores)")
      ->check(CLI::Range(0, 1024));
  generate->callback([args] { args->action = "generate"; });

  CLI::App* ablate = gpt->add_subcommand(
      "ablate", "train the same model with the causal mask and with none; compare them");
  ablate->add_option("--out", args->out, "directory for both checkpoints and the pictures")
      ->default_str("gpt-ablation");
  add_model_options(ablate, *args);
  ablate->callback([args] { args->action = "ablate"; });
  add_serve_command(gpt, args);

  return {gpt, [args] {
            if (args->action == "train") return run_gpt_train(*args);
            if (args->action == "generate") return run_gpt_generate(*args);
            if (args->action == "serve") return run_gpt_serve(*args);
            if (args->action == "eval") return run_gpt_eval(*args);
            return run_gpt_ablate(*args);
          }};
}

}  // namespace maskattn::cli
