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
#include <string>
#include <vector>

#include "core/splitmix64.h"
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

// The command line (see the top of this file).
struct Config {
  int64_t model = 512, heads = 8, kv_heads = 0, batch = 1, chunk = 512;
  std::vector<int64_t> lengths = {256, 512, 1024, 2048, 4096, 8192};
  std::string dtype_name = "f32";
  int threads = 0, repeat = 50, warmup = 5;
  double evict_mib = 0;
};

void add_options(CLI::App& app, Config& c) {
  app.add_option("--model", c.model, "embedding width E")->check(CLI::PositiveNumber);
  app.add_option("--heads", c.heads)->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", c.kv_heads, "0 = heads");
  app.add_option("--batch", c.batch)->check(CLI::PositiveNumber);
  app.add_option("--lengths", c.lengths, "cached lengths, comma separated")->delimiter(',');
  app.add_option("--dtype", c.dtype_name, "the cache's element type: f32 | f16 | bf16");
  app.add_option("--threads", c.threads, "0 = OpenMP's default");
  app.add_option("--repeat", c.repeat)->check(CLI::Range(1, 100000));
  app.add_option("--warmup", c.warmup)->check(CLI::Range(0, 100000));
  app.add_option("--chunk", c.chunk, "prefill chunk, tokens")->check(CLI::PositiveNumber);
  app.add_option("--evict-mib", c.evict_mib, "MiB read between steps (0 = none)")
      ->check(CLI::Range(0.0, 65536.0));
}

// `values` rounded to `dtype`, as the bytes of a tensor of that dtype.
std::vector<uint8_t> to_dtype_bytes(const std::vector<float>& values, maskattn::DType dtype) {
  using maskattn::DType;
  std::vector<uint8_t> bytes(values.size() * maskattn::dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    const float value = values[i];
    if (dtype == DType::f32) {
      std::memcpy(bytes.data() + 4 * i, &value, 4);
    } else {
      const uint16_t bits = dtype == DType::f16 ? maskattn::float16_from_float(value).bits
                                                : maskattn::bfloat16_from_float(value).bits;
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
    }
  }
  return bytes;
}

// Least squares median_us = intercept + slope · n over the lengths, and the worst relative
// deviation from the line.
void print_fit(const std::vector<double>& xs, const std::vector<double>& ys) {
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
}

// The layer, its cache and every buffer a decode step and attention() alone use, allocated once.
class DecodeBench {
 public:
  DecodeBench(const Config& config, maskattn::DType dtype)
      : c_(config),
        dtype_(dtype),
        layer_(maskattn::MultiHeadAttention::random(c_.model, c_.heads, c_.kv_heads, 1)),
        cache_(layer_.make_cache(c_.batch, c_.lengths.back() + 1, dtype)),
        prompt_(static_cast<size_t>(c_.batch * c_.chunk * c_.model)),
        prompt_out_(prompt_.size()),
        token_(static_cast<size_t>(c_.batch * c_.model)),
        token_out_(token_.size()) {
    options_.attention.threads = c_.threads;
    options_.dtype = dtype;
    fill(token_);
    // attention() alone: one query per head in the cache's dtype, its output likewise.
    std::vector<float> query(static_cast<size_t>(c_.batch * c_.heads * layer_.head_dim()));
    fill(query);
    query_ = to_dtype_bytes(query, dtype);
    heads_out_.resize(static_cast<size_t>(c_.batch * c_.heads * layer_.head_value_dim()) *
                      maskattn::dtype_size(dtype));
    eviction_.resize(static_cast<size_t>(c_.evict_mib * (1 << 20) / sizeof(float)));
    fill(eviction_);  // touched once here: no page faults between steps
  }

  // Bytes of the four weight matrices and their biases.
  double weights_bytes() const {
    const maskattn::LayerWeights& w = layer_.weights();
    const int64_t count = w.q_weight.numel() + w.k_weight.numel() + w.v_weight.numel() +
                          w.out_weight.numel() + w.q_bias.numel() + w.k_bias.numel() +
                          w.v_bias.numel() + w.out_bias.numel();
    return static_cast<double>(count) * sizeof(float);
  }
  // Bytes of K and V of one cached position.
  double position_bytes() const {
    return static_cast<double>(c_.batch * c_.kv_heads *
                               (layer_.head_dim() + layer_.head_value_dim()) *
                               maskattn::dtype_size(dtype_));
  }
  int64_t head_dim() const { return layer_.head_dim(); }

  // Chunked prefill of random embeddings up to n cached positions (untimed).
  void prefill_to(int64_t n) {
    while (cache_.length() < n) {
      const int64_t steps = std::min(c_.chunk, n - cache_.length());
      fill(prompt_);
      const maskattn::TensorView x(prompt_.data(), {c_.batch, steps, c_.model},
                                   {c_.chunk * c_.model, c_.model, 1});
      const maskattn::MutableTensorView y(prompt_out_.data(), {c_.batch, steps, c_.model},
                                          {c_.chunk * c_.model, c_.model, 1});
      layer_.forward_cached(x, cache_, y, {}, {}, options_);
    }
  }

  // One decode step over n cached positions, then attention() alone over the n + 1 positions
  // it attended to; microseconds of each. The cache is truncated back to n.
  std::pair<double, double> step(int64_t n) {
    using namespace maskattn;
    if (!eviction_.empty()) sink_ = sink_ + evict(eviction_);
    const auto start = Clock::now();
    layer_.forward_cached(TensorView(token_.data(), {c_.batch, 1, c_.model}), cache_,
                          MutableTensorView(token_out_.data(), {c_.batch, 1, c_.model}), {}, {},
                          options_);
    const double us = micros_since(start);
    if (!eviction_.empty()) sink_ = sink_ + evict(eviction_);
    const TensorView q_view(query_.data(), dtype_, {c_.batch, c_.heads, 1, layer_.head_dim()});
    const MutableTensorView o_view(heads_out_.data(), dtype_,
                                   {c_.batch, c_.heads, 1, layer_.head_value_dim()});
    const auto attention_start = Clock::now();
    attention(q_view, cache_.keys(), cache_.values(), o_view, cache_.step_mask(), {},
              options_.attention);
    const double attention_us = micros_since(attention_start);
    cache_.truncate(n);
    return {us, attention_us};
  }

  // Prefill to n, warm up, time --repeat steps; prints the length's line, returns the median.
  double run_length(int64_t n) {
    prefill_to(n);
    for (int warm = 0; warm < c_.warmup; ++warm) step(n);
    std::vector<double> times, attention_times;
    for (int r = 0; r < c_.repeat; ++r) {
      const auto [us, attention_us] = step(n);
      times.push_back(us);
      attention_times.push_back(attention_us);
    }
    sink_ = sink_ + token_out_[0];
    const double mid = median(times);
    const double read_bytes = position_bytes() * static_cast<double>(n + 1) + weights_bytes();
    std::printf(
        "cached=%lld median_us=%.2f min_us=%.2f max_us=%.2f tokens_per_s=%.1f cache_mib=%.2f "
        "read_mib=%.2f gbs=%.2f attention_us=%.2f\n",
        static_cast<long long>(n), mid, *std::min_element(times.begin(), times.end()),
        *std::max_element(times.begin(), times.end()), static_cast<double>(c_.batch) / mid * 1e6,
        position_bytes() * static_cast<double>(n) / (1 << 20), read_bytes / (1 << 20),
        read_bytes / mid * 1e-3, median(attention_times));
    std::fflush(stdout);
    return mid;
  }

 private:
  void fill(std::vector<float>& values) {
    for (float& value : values) value = static_cast<float>(random_.uniform(-1.0, 1.0));
  }

  const Config& c_;
  maskattn::DType dtype_;
  maskattn::MultiHeadAttention layer_;
  maskattn::KVCache cache_;
  maskattn::LayerOptions options_;
  maskattn::detail::SplitMix64 random_{2};
  std::vector<float> prompt_, prompt_out_, token_, token_out_, eviction_;
  std::vector<uint8_t> query_, heads_out_;
  volatile double sink_ = 0;  // keeps the eviction reads
};

}  // namespace

int main(int argc, char** argv) {
  using namespace maskattn;
  Config config;
  CLI::App app{"time one KV-cache decode step of a MultiHeadAttention layer against cached length"};
  add_options(app, config);
  CLI11_PARSE(app, argc, argv);
  DType dtype = DType::f32;
  try {
    dtype = parse_dtype(config.dtype_name, "--dtype");
  } catch (const Error& error) {
    std::fprintf(stderr, "decode_run: %s\n", error.what());
    return 2;
  }
  if (config.kv_heads == 0) config.kv_heads = config.heads;
  std::sort(config.lengths.begin(), config.lengths.end());
  if (config.lengths.empty() || config.lengths.front() < 0) {
    std::fprintf(stderr, "decode_run: --lengths needs non-negative lengths\n");
    return 1;
  }
  try {
    DecodeBench bench(config, dtype);
    std::printf(
        "config model=%lld heads=%lld kv_heads=%lld head_dim=%lld batch=%lld dtype=%s threads=%d "
        "repeat=%d evict_mib=%.0f weights_mib=%.2f\n",
        static_cast<long long>(config.model), static_cast<long long>(config.heads),
        static_cast<long long>(config.kv_heads), static_cast<long long>(bench.head_dim()),
        static_cast<long long>(config.batch), config.dtype_name.c_str(), config.threads,
        config.repeat, config.evict_mib, bench.weights_bytes() / (1 << 20));
    std::vector<double> xs, ys;
    for (const int64_t n : config.lengths) {
      ys.push_back(bench.run_length(n));
      xs.push_back(static_cast<double>(n));
    }
    print_fit(xs, ys);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "decode_run: %s\n", error.what());
    return 1;
  }
  return 0;
}
