// One measurement of the serving loop (include/maskattn/model/serve.h), for bench/serve_compare:
//
//   serve_run --mode served|alone [--requests 32 --min-tokens 64 --max-tokens 2048]
//             [--layers 4 --d-model 128 --heads 4 --context 2048] [--kv-format f32]
//             [--block-size 16] [--pool-blocks N | --pool-percent 100]
//             [--max-batch 32 --token-budget 256
//             --prefill-chunk 64] [--threads 2] [--seed 1]
//
// The model is the GPT of include/maskattn/model/ at nanoGPT's initialisation plus noise (an
// untrained model is enough for equality and speed). The requests are drawn from the seed: a
// total of min–max tokens each (prompt + generation), the prompt 10–50 % of it, arrivals spread
// over the first 64 steps, greedy, <eos> ignored so that every request runs its whole length.
// `served` runs them all through one Server; `alone` runs each by itself through a Server of its
// own, one after another (the same decoder and pool). Prints one line of key=value pairs: time,
// generated tokens per second, the peak RSS (getrusage), the peak of blocks in use and what they
// hold, and a hash of every request's tokens (bench/serve_compare compares the two modes').
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/splitmix64.h"
#include "maskattn/model/serve.h"

namespace {

using namespace maskattn;

struct Settings {
  std::string mode = "served";
  int64_t requests = 32, min_tokens = 64, max_tokens = 2048;
  model::GptConfig config;
  std::string kv_format = "f32";
  int64_t block_size = 16, pool_blocks = 0, pool_percent = 100;
  model::ServeOptions serve;
  int threads = 2;
  uint64_t seed = 1;
};

std::vector<model::ServeRequest> draw_requests(const Settings& s) {
  detail::SplitMix64 draws(s.seed);
  std::vector<model::ServeRequest> requests(s.requests);
  for (model::ServeRequest& r : requests) {
    const int64_t total = draws.between(s.min_tokens, s.max_tokens);
    const int64_t prompt = std::max<int64_t>(1, total * draws.between(10, 50) / 100);
    r.prompt.resize(prompt);
    for (int32_t& t : r.prompt) t = static_cast<int32_t>(draws.between(7, s.config.vocab - 1));
    r.max_new_tokens = total - prompt + 1;  // positions: prompt + new − 1 = total
    r.arrival = draws.between(0, 63);
    r.stop_at_eos = false;
  }
  return requests;
}

uint64_t hash_tokens(const std::vector<int32_t>& tokens) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the token ids' bytes
  for (const int32_t t : tokens) {
    for (int byte = 0; byte < 4; ++byte) {
      h = (h ^ ((static_cast<uint32_t>(t) >> (8 * byte)) & 0xff)) * 1099511628211ull;
    }
  }
  return h;
}

struct Outcome {
  std::vector<uint64_t> hashes;
  int64_t steps = 0, peak_blocks = 0;
};

// Every request through one Server (served), or each through a Server of its own (alone).
Outcome run_mode(const Settings& s, model::PagedGptDecoder& decoder,
                 const std::vector<model::ServeRequest>& requests) {
  Outcome outcome;
  if (s.mode == "served") {
    model::Server server(decoder, s.serve);
    for (const model::ServeRequest& r : requests) server.submit(r);
    server.run();
    for (int64_t n = 0; n < s.requests; ++n) {
      outcome.hashes.push_back(hash_tokens(server.result(n).tokens));
    }
    outcome.steps = server.steps();
    outcome.peak_blocks = server.peak_blocks_in_use();
    return outcome;
  }
  for (model::ServeRequest r : requests) {
    r.arrival = 0;
    model::Server server(decoder, s.serve);
    server.submit(r);
    server.run();
    outcome.hashes.push_back(hash_tokens(server.result(0).tokens));
    outcome.steps += server.steps();
    outcome.peak_blocks = std::max(outcome.peak_blocks, server.peak_blocks_in_use());
  }
  return outcome;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  s.config.vocab = 93;
  s.config.context = 2048;
  s.config.layers = 4;
  s.config.d_model = 128;
  s.config.heads = 4;
  CLI::App app{"time the serving loop, served or one request at a time"};
  app.add_option("--mode", s.mode)->check(CLI::IsMember({"served", "alone"}));
  app.add_option("--requests", s.requests);
  app.add_option("--min-tokens", s.min_tokens);
  app.add_option("--max-tokens", s.max_tokens);
  app.add_option("--layers", s.config.layers);
  app.add_option("--d-model", s.config.d_model);
  app.add_option("--heads", s.config.heads);
  app.add_option("--context", s.config.context);
  app.add_option("--kv-format", s.kv_format);
  app.add_option("--block-size", s.block_size);
  app.add_option("--pool-blocks", s.pool_blocks);
  app.add_option("--pool-percent", s.pool_percent)->check(CLI::Range(1, 100));
  app.add_option("--max-batch", s.serve.max_batch);
  app.add_option("--token-budget", s.serve.token_budget);
  app.add_option("--prefill-chunk", s.serve.prefill_chunk);
  app.add_option("--threads", s.threads);
  app.add_option("--seed", s.seed);
  CLI11_PARSE(app, argc, argv);
  try {
    const model::GptParameters parameters(s.config);
    std::vector<float> values(parameters.count());
    parameters.initialise(values.data(), s.seed);
    detail::SplitMix64 noise(s.seed + 1);
    for (float& v : values) v += 0.05f * static_cast<float>(noise.unit() * 2 - 1);
    const std::vector<model::ServeRequest> requests = draw_requests(s);
    model::PagedDecoderOptions options;
    options.format = parse_kv_format(s.kv_format, "--kv-format");
    options.block_size = s.block_size;
    options.threads = s.threads;
    int64_t needed = 0, largest = 0;
    for (const model::ServeRequest& r : requests) {
      const int64_t positions = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens - 1;
      const int64_t blocks = (positions + s.block_size - 1) / s.block_size;
      needed += blocks;
      largest = std::max(largest, blocks);
    }
    // Default pool: --pool-percent of every request at once (served), the largest one (alone).
    options.blocks =
        s.pool_blocks > 0
            ? s.pool_blocks
            : (s.mode == "served" ? std::max(largest, needed * s.pool_percent / 100) : largest);
    model::PagedGptDecoder decoder(parameters, values.data(), options);
    const auto start = std::chrono::steady_clock::now();
    const Outcome outcome = run_mode(s, decoder, requests);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    int64_t generated = 0;
    for (const model::ServeRequest& r : requests) generated += r.max_new_tokens;
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    std::string hash_list;
    for (const uint64_t h : outcome.hashes)
      hash_list += (hash_list.empty() ? "" : ":") + std::to_string(h);
    std::printf(
        "mode=%s seconds=%.4f generated=%lld tokens_per_s=%.1f steps=%lld peak_rss_mib=%.2f "
        "peak_blocks=%lld pool_blocks=%lld block_size=%lld bytes_per_position=%lld "
        "pool_mib=%.2f params_mib=%.2f hashes=%s\n",
        s.mode.c_str(), seconds, static_cast<long long>(generated),
        static_cast<double>(generated) / seconds, static_cast<long long>(outcome.steps),
        static_cast<double>(usage.ru_maxrss) / 1024.0, static_cast<long long>(outcome.peak_blocks),
        static_cast<long long>(decoder.blocks()), static_cast<long long>(s.block_size),
        static_cast<long long>(decoder.bytes_per_position()),
        static_cast<double>(decoder.pool_bytes()) / 1048576.0,
        static_cast<double>(values.size() * sizeof(float)) / 1048576.0, hash_list.c_str());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "serve_run: %s\n", error.what());
    return 1;
  }
  return 0;
}
