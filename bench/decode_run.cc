// KV-cache decoding of one attention layer: the time of one decode step against the cached length.
// Used by bench/decode_compare.
//   decode_run --model 512 --heads 8 --lengths 256,512,1024,2048,4096,8192 --dtype f32
//              --threads 2 --repeat 50
//
// What is timed: MultiHeadAttention::forward_cached() with T = 1, the whole step a generating
// model runs per layer and token: the q, k and v projections of the new token, the append of its
// key and value to the cache, attention of the one query over the n + 1 cached positions, and the
// output projection. The layer is MultiHeadAttention::random(model, heads, kv_heads) (biases,
// f32 weights); the cache holds K and V in --dtype (f32, f16 or bf16; the query and the heads'
// outputs are rounded to it too, the sums stay f32).
//
// For each cached length n (ascending): the cache, of capacity max(lengths) + 1, allocated once, is
// filled to n by chunked prefill (forward_cached over --chunk tokens of random embeddings at a
// time, untimed), then the decode step of a random token runs --warmup times and --repeat times
// timed; after every step the cache is truncated back to n, so each step sees exactly n cached
// positions plus its own. With --evict-mib M, M MiB are read between steps (untimed) so that the
// cache and the weights come from memory, as in a many-layer model where a layer's cache has left
// the caches by the time its next token comes; the default (0) leaves them wherever the previous
// step left them (the L3 holds 32 MiB here, an f32 cache of 4096 positions is 16 MiB).
//
// Besides the step, attention() alone over the same cache views (a random query in the cache's
// dtype, the cache's step mask) is timed interleaved with the steps, so that step − attention is
// what the projections, the append and the call overheads cost.
//
// Prints a header line, then per n one line of key=value pairs:
//   cached=N median_us min_us max_us tokens_per_s (batch / median) cache_mib (K and V of the n
//   positions) read_mib (what one step must read: K and V of n + 1 positions and the four weight
//   matrices with their biases) gbs (read_mib / median) attention_us (median of attention() alone)
// and one line fitting median_us = intercept + slope · n by least squares: slope_us_per_1k,
// intercept_us, max_rel_dev (the largest |measured − fitted| / measured over the lengths).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "maskattn/attention.h"
#include "maskattn/dtype.h"
#include "maskattn/kv_cache.h"
#include "maskattn/multihead.h"
#include "maskattn/tensor.h"

namespace {

using Clock = std::chrono::steady_clock;

double micros_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Reads `buffer` from end to end: what the other layers of a model do to the caches between two
// visits of this one.
double evict(const std::vector<float>& buffer) {
  float sums[16] = {};
  for (size_t i = 0; i + 16 <= buffer.size(); i += 16) {
    for (int lane = 0; lane < 16; ++lane) sums[lane] += buffer[i + lane];
  }
  double total = 0;
  for (float sum : sums) total += sum;
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace maskattn;
  int64_t model = 512, heads = 8, kv_heads = 0, batch = 1, chunk = 512;
  std::vector<int64_t> lengths = {256, 512, 1024, 2048, 4096, 8192};
  std::string dtype_name = "f32";
  int threads = 0, repeat = 50, warmup = 5;
  double evict_mib = 0;
  CLI::App app{"time one KV-cache decode step of a MultiHeadAttention layer against cached length"};
  app.add_option("--model", model, "embedding width E")->check(CLI::PositiveNumber);
  app.add_option("--heads", heads)->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", kv_heads, "0 = heads");
  app.add_option("--batch", batch)->check(CLI::PositiveNumber);
  app.add_option("--lengths", lengths, "cached lengths, comma separated")->delimiter(',');
  app.add_option("--dtype", dtype_name, "the cache's element type")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  app.add_option("--threads", threads, "0 = OpenMP's default");
  app.add_option("--repeat", repeat)->check(CLI::Range(1, 100000));
  app.add_option("--warmup", warmup)->check(CLI::Range(0, 100000));
  app.add_option("--chunk", chunk, "prefill chunk, tokens")->check(CLI::PositiveNumber);
  app.add_option("--evict-mib", evict_mib, "MiB read between steps (0 = none)")
      ->check(CLI::Range(0.0, 65536.0));
  CLI11_PARSE(app, argc, argv);
  const DType dtype = dtype_name == "f16"    ? DType::f16
                      : dtype_name == "bf16" ? DType::bf16
                                             : DType::f32;
  if (kv_heads == 0) kv_heads = heads;
  std::sort(lengths.begin(), lengths.end());
  if (lengths.empty() || lengths.front() < 0) {
    std::fprintf(stderr, "decode_run: --lengths needs non-negative lengths\n");
    return 1;
  }

  try {
    const MultiHeadAttention layer = MultiHeadAttention::random(model, heads, kv_heads, 1);
    KVCache cache = layer.make_cache(batch, lengths.back() + 1, dtype);
    LayerOptions options;
    options.attention.threads = threads;
    options.dtype = dtype;

    std::mt19937_64 random(2);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    const auto fill = [&](std::vector<float>& values) {
      for (float& value : values) value = uniform(random);
    };
    std::vector<float> prompt(static_cast<size_t>(batch * chunk * model));
    std::vector<float> prompt_out(prompt.size());
    std::vector<float> token(static_cast<size_t>(batch * model)), token_out(token.size());
    fill(token);
    // attention() alone: one query per head in the cache's dtype, its output likewise.
    const int64_t head_dim = layer.head_dim(), value_dim = layer.head_value_dim();
    std::vector<float> query_f32(static_cast<size_t>(batch * heads * head_dim));
    fill(query_f32);
    std::vector<uint8_t> query(query_f32.size() * dtype_size(dtype));
    std::vector<uint8_t> heads_out(static_cast<size_t>(batch * heads * value_dim) *
                                   dtype_size(dtype));
    for (size_t i = 0; i < query_f32.size(); ++i) {
      const float value = query_f32[i];
      if (dtype == DType::f32) {
        std::memcpy(query.data() + 4 * i, &value, 4);
      } else {
        const uint16_t bits =
            dtype == DType::f16 ? float16_from_float(value).bits : bfloat16_from_float(value).bits;
        std::memcpy(query.data() + 2 * i, &bits, 2);
      }
    }
    const TensorView q_view(query.data(), dtype, {batch, heads, 1, head_dim});
    const MutableTensorView o_view(heads_out.data(), dtype, {batch, heads, 1, value_dim});
    std::vector<float> eviction(static_cast<size_t>(evict_mib * (1 << 20) / sizeof(float)));
    fill(eviction);            // touched once here: no page faults between steps
    volatile double sink = 0;  // keeps the eviction reads

    const LayerWeights& w = layer.weights();
    const int64_t weight_count = w.q_weight.numel() + w.k_weight.numel() + w.v_weight.numel() +
                                 w.out_weight.numel() + w.q_bias.numel() + w.k_bias.numel() +
                                 w.v_bias.numel() + w.out_bias.numel();
    const double weights_bytes = static_cast<double>(weight_count) * sizeof(float);
    const double position_bytes =
        static_cast<double>(batch * kv_heads * (head_dim + value_dim) * dtype_size(dtype));
    std::printf(
        "config model=%lld heads=%lld kv_heads=%lld head_dim=%lld batch=%lld dtype=%s threads=%d "
        "repeat=%d evict_mib=%.0f weights_mib=%.2f\n",
        static_cast<long long>(model), static_cast<long long>(heads),
        static_cast<long long>(kv_heads), static_cast<long long>(head_dim),
        static_cast<long long>(batch), dtype_name.c_str(), threads, repeat, evict_mib,
        weights_bytes / (1 << 20));

    std::vector<double> xs, ys;
    for (const int64_t n : lengths) {
      // Chunked prefill up to n (the cache is at the previous length, or empty).
      while (cache.length() < n) {
        const int64_t steps = std::min(chunk, n - cache.length());
        fill(prompt);
        const TensorView x(prompt.data(), {batch, steps, model}, {chunk * model, model, 1});
        const MutableTensorView y(prompt_out.data(), {batch, steps, model},
                                  {chunk * model, model, 1});
        layer.forward_cached(x, cache, y, {}, {}, options);
      }
      const auto step = [&] {
        if (!eviction.empty()) sink = sink + evict(eviction);
        const auto start = Clock::now();
        layer.forward_cached(TensorView(token.data(), {batch, 1, model}), cache,
                             MutableTensorView(token_out.data(), {batch, 1, model}), {}, {},
                             options);
        const double us = micros_since(start);
        // attention() alone over the n + 1 positions the step attended to.
        if (!eviction.empty()) sink = sink + evict(eviction);
        const auto attention_start = Clock::now();
        attention(q_view, cache.keys(), cache.values(), o_view, cache.step_mask(), {},
                  options.attention);
        const double attention_us = micros_since(attention_start);
        cache.truncate(n);
        return std::pair{us, attention_us};
      };
      for (int warm = 0; warm < warmup; ++warm) step();
      std::vector<double> times, attention_times;
      for (int r = 0; r < repeat; ++r) {
        const auto [us, attention_us] = step();
        times.push_back(us);
        attention_times.push_back(attention_us);
      }
      sink = sink + token_out[0];
      const double mid = median(times);
      const double read_bytes = position_bytes * static_cast<double>(n + 1) + weights_bytes;
      std::printf(
          "cached=%lld median_us=%.2f min_us=%.2f max_us=%.2f tokens_per_s=%.1f cache_mib=%.2f "
          "read_mib=%.2f gbs=%.2f attention_us=%.2f\n",
          static_cast<long long>(n), mid, *std::min_element(times.begin(), times.end()),
          *std::max_element(times.begin(), times.end()), static_cast<double>(batch) / mid * 1e6,
          position_bytes * static_cast<double>(n) / (1 << 20), read_bytes / (1 << 20),
          read_bytes / mid * 1e-3, median(attention_times));
      std::fflush(stdout);
      xs.push_back(static_cast<double>(n));
      ys.push_back(mid);
    }

    // Least squares: y = intercept + slope·x.
    const double count = static_cast<double>(xs.size());
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      sx += xs[i];
      sy += ys[i];
      sxx += xs[i] * xs[i];
      sxy += xs[i] * ys[i];
    }
    const double denominator = count * sxx - sx * sx;
    const double slope = denominator > 0 ? (count * sxy - sx * sy) / denominator : 0.0;
    const double intercept = (sy - slope * sx) / count;
    double deviation = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double fitted = intercept + slope * xs[i];
      deviation = std::max(deviation, std::abs(ys[i] - fitted) / ys[i]);
    }
    std::printf("fit slope_us_per_1k=%.3f intercept_us=%.2f max_rel_dev=%.4f\n", slope * 1000,
                intercept, deviation);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "decode_run: %s\n", error.what());
    return 1;
  }
  return 0;
}
