// maskattn gpt serve: a requests file through the continuous-batching loop of
// include/maskattn/model/serve.h over a paged, optionally quantized KV cache (docs/cli.md). This
// file sizes the pool, feeds the requests, draws the progress line and writes the results; the
// loop itself is the library's.
#include <fmt/core.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "commands.h"
#include "gpt_progress.h"
#include "maskattn/error.h"
#include "maskattn/model/serve.h"
#include "maskattn/model/trainer.h"
#include "serve_requests.h"

namespace maskattn::cli {

namespace {

// Blocks per layer: --pool-blocks, or --pool-mib over every layer's cache, or by default room for
// --max-batch sequences of the whole context.
int64_t pool_blocks(const GptArgs& args, const model::GptConfig& config, KVFormat format) {
  if (args.pool_blocks > 0 && args.pool_mib > 0) {
    throw Error("gpt serve: give --pool-blocks or --pool-mib, not both");
  }
  if (args.pool_blocks > 0) return args.pool_blocks;
  const int64_t per_block = config.layers * config.heads * args.block_size *
                            (kv_row_bytes(format, true, config.head_dim()) +
                             kv_row_bytes(format, false, config.head_dim()));
  if (args.pool_mib > 0) return static_cast<int64_t>(args.pool_mib * 1048576.0) / per_block;
  return args.max_batch * ((config.context + args.block_size - 1) / args.block_size);
}

// One result as a JSON line.
std::string result_line(int64_t id, const RequestLine& line, const model::ServeResult& result,
                        const model::CharVocabulary& vocabulary) {
  std::string tokens;
  for (const int32_t token : result.tokens) {
    if (!tokens.empty()) tokens += ',';
    tokens += std::to_string(token);
  }
  std::string out = fmt::format("{{\"id\": {}, \"line\": {}, \"status\": \"{}\"", id, line.line,
                                model::serve_status_name(result.status));
  if (result.reason != model::FinishReason::none) {
    out += fmt::format(", \"reason\": \"{}\"", model::finish_reason_name(result.reason));
  }
  if (!result.error.empty()) out += ", \"error\": " + json_string(result.error);
  out += ", \"text\": " + json_string(vocabulary.decode(result.tokens));
  out += ", \"tokens\": [" + tokens + "]";
  out += fmt::format(", \"admitted_step\": {}, \"first_token_step\": {}, \"done_step\": {}}}",
                     result.admitted_step, result.first_token_step, result.done_step);
  return out;
}

}  // namespace

ServeProgress::ServeProgress(int64_t requests, int64_t pool_blocks)
    : requests_(requests),
      pool_blocks_(pool_blocks),
      terminal_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()) {}

void ServeProgress::update(const model::ServeStep& step) {
  generated_ += step.sampled;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const std::string line =
      fmt::format("step {}  waiting {}  running {}  done {}/{}  {:.0f} tok/s  blocks {}/{}",
                  step.step, step.waiting, step.running, step.done, requests_,
                  seconds > 0 ? static_cast<double>(generated_) / seconds : 0.0, step.blocks_in_use,
                  pool_blocks_);
  if (terminal_) {
    std::fprintf(stderr, "\r%-90s", line.c_str());
    std::fflush(stderr);
    return;
  }
  // A log gets a line each time another tenth of the requests is done.
  const int64_t tenth = std::max<int64_t>(requests_ / 10, 1);
  if (step.done / tenth != last_tenth_ || step.done == requests_) {
    if (step.done != last_done_) std::fprintf(stderr, "%s\n", line.c_str());
    last_tenth_ = step.done / tenth;
    last_done_ = step.done;
  }
}

void ServeProgress::finish() {
  if (terminal_) std::fprintf(stderr, "\n");
}

int run_gpt_serve(const GptArgs& args) {
  const model::LoadedModel loaded = model::load_model(args.model);
  const std::vector<RequestLine> lines = read_requests(args.requests, loaded.vocabulary);
  const model::GptConfig& config = loaded.parameters.config();
  model::PagedDecoderOptions options;
  options.format = parse_kv_format(args.kv_format, "--kv-format");
  options.block_size = args.block_size;
  options.blocks = pool_blocks(args, config, options.format);
  options.threads = args.threads;
  model::PagedGptDecoder decoder(loaded.parameters, loaded.values.data(), options);
  model::ServeOptions serve;
  serve.max_batch = args.max_batch;
  serve.token_budget = args.token_budget;
  serve.prefill_chunk = args.prefill_chunk;
  model::Server server(decoder, serve);
  for (const RequestLine& line : lines) {
    if (line.unknown_characters > 0) {
      std::fprintf(stderr,
                   "gpt serve: line %lld: %lld prompt character(s) not in the vocabulary "
                   "became <unk>\n",
                   static_cast<long long>(line.line),
                   static_cast<long long>(line.unknown_characters));
    }
    try {
      server.submit(line.request);
    } catch (const Error& error) {
      throw Error(args.requests + " line " + std::to_string(line.line) + ": " + error.what());
    }
  }
  std::fprintf(stderr,
               "gpt serve: %zu requests; KV cache %s, %lld blocks of %lld positions per layer "
               "(%.1f MiB), max batch %lld, token budget %lld, prefill chunk %lld\n",
               lines.size(), kv_format_name(options.format), static_cast<long long>(options.blocks),
               static_cast<long long>(options.block_size),
               static_cast<double>(decoder.pool_bytes()) / 1048576.0,
               static_cast<long long>(serve.max_batch), static_cast<long long>(serve.token_budget),
               static_cast<long long>(serve.prefill_chunk));
  ServeProgress progress(static_cast<int64_t>(lines.size()), decoder.blocks());
  const auto start = std::chrono::steady_clock::now();
  while (!server.idle()) progress.update(server.step());
  progress.finish();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::ofstream file;
  if (!args.results.empty()) {
    file.open(args.results);
    if (!file) throw Error("gpt serve: cannot write the results file " + args.results);
  }
  std::ostream& out = args.results.empty() ? std::cout : file;
  int64_t counts[5] = {}, generated = 0;
  for (int64_t id = 0; id < server.requests(); ++id) {
    const model::ServeResult& result = server.result(id);
    out << result_line(id, lines[id], result, loaded.vocabulary) << '\n';
    counts[static_cast<int>(result.status)] += 1;
    generated += static_cast<int64_t>(result.tokens.size());
  }
  std::fprintf(stderr,
               "gpt serve: %lld finished, %lld cancelled, %lld failed; %lld tokens generated in "
               "%lld steps, %.3f s (%.0f tokens/s); at most %lld of %lld blocks in use\n",
               static_cast<long long>(counts[2]), static_cast<long long>(counts[3]),
               static_cast<long long>(counts[4]), static_cast<long long>(generated),
               static_cast<long long>(server.steps()), seconds,
               seconds > 0 ? static_cast<double>(generated) / seconds : 0.0,
               static_cast<long long>(server.peak_blocks_in_use()),
               static_cast<long long>(decoder.blocks()));
  return 0;
}

}  // namespace maskattn::cli
