// One decode step of attention over a paged KV cache, per cache format: the time of
// attention_paged() for one query per head against a long cached sequence, and the bytes it must
// read. Used by bench/paged_compare.
//   paged_decode_run --kv-heads 8 --q-heads 8 --dim 128 --length 32768 --block 64
//                    --formats bf16,int8,q4 --threads 2 --repeat 30 --evict-mib 256
//
// What is timed: attention_paged(q [batch, Hq, 1, D], cache, ids, out) — the fused row kernel
// reading every cached key and value of the batch's sequences through their block tables, in the
// cache's format (quantized rows decoded in registers). The cache is filled once per format
// (untimed) with random keys and values; between steps --evict-mib MiB are read (untimed) so that
// each step reads the cache from memory, as in a model whose other layers have run in between.
//
// The formats' steps run round-robin. Prints per format one line of key=value pairs:
//   format=int8 median_us min_us bytes_mib (keys and values of every cached position, scales
//   included: what one step must read) gbs (bytes / median) cache_blocks
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/splitmix64.h"
#include "maskattn/maskattn.h"

using namespace maskattn;

namespace {

struct Config {
  int64_t kv_heads = 8, q_heads = 8, dim = 128, length = 32768, block = 64, batch = 1;
  std::string formats = "bf16,int8,q4";
  int threads = 0, repeat = 30, warmup = 3;
  double evict_mib = 256;
};

std::vector<float> random_floats(size_t count, uint64_t seed) {
  detail::SplitMix64 rng(seed);
  std::vector<float> out(count);
  for (float& x : out) x = static_cast<float>(rng.uniform(-1.0, 1.0));
  return out;
}

double evict(const std::vector<float>& buffer) {
  double sum = 0;
  for (size_t n = 0; n < buffer.size(); n += 16) sum += buffer[n];
  return sum;
}

// One cache per format, filled with the same random keys and values (untimed).
struct FormatCase {
  KVFormat format;
  PagedKVCache cache;
  std::vector<int64_t> ids;
  std::vector<double> times;
};

FormatCase filled_cache(const Config& c, KVFormat format) {
  const int64_t blocks = c.batch * ((c.length + c.block - 1) / c.block);
  FormatCase f{format, PagedKVCache(blocks, c.block, c.kv_heads, c.dim, format), {}, {}};
  const int64_t chunk = 1024;
  for (int64_t b = 0; b < c.batch; ++b) {
    f.ids.push_back(f.cache.add_sequence());
    for (int64_t at = 0; at < c.length; at += chunk) {
      const int64_t count = std::min(chunk, c.length - at);
      const std::vector<float> k = random_floats(c.kv_heads * count * c.dim, 2 * at + b);
      const std::vector<float> v = random_floats(c.kv_heads * count * c.dim, 2 * at + b + 1);
      f.cache.append(f.ids.back(), TensorView(k.data(), {c.kv_heads, count, c.dim}),
                     TensorView(v.data(), {c.kv_heads, count, c.dim}));
    }
  }
  return f;
}

// The formats' steps round-robin (so that they share the machine's drift), then one line each.
void run_formats(const Config& c, std::vector<FormatCase>& cases,
                 const std::vector<float>& eviction) {
  const std::vector<float> q = random_floats(c.batch * c.q_heads * c.dim, 99);
  std::vector<float> out(q.size());
  Options options;
  options.threads = c.threads;
  double sink = 0;
  for (int n = 0; n < c.warmup + c.repeat; ++n) {
    for (FormatCase& f : cases) {
      sink += evict(eviction);
      const auto start = std::chrono::steady_clock::now();
      attention_paged(TensorView(q.data(), {c.batch, c.q_heads, 1, c.dim}), f.cache, f.ids,
                      MutableTensorView(out.data(), {c.batch, c.q_heads, 1, c.dim}), {}, {}, {},
                      options);
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count();
      if (n >= c.warmup) f.times.push_back(us);
      sink += out[0];
    }
  }
  for (FormatCase& f : cases) {
    std::sort(f.times.begin(), f.times.end());
    const double median = f.times[f.times.size() / 2];
    const double bytes = static_cast<double>(c.batch) * c.length * f.cache.bytes_per_position();
    std::printf("format=%s median_us=%.1f min_us=%.1f bytes_mib=%.2f gbs=%.2f cache_blocks=%lld\n",
                kv_format_name(f.format), median, f.times.front(), bytes / (1 << 20),
                bytes / median / 1e3, static_cast<long long>(f.cache.blocks_in_use()));
  }
  std::printf("checksum=%g\n", sink);
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"one decode step over a paged KV cache, per cache format"};
  app.add_option("--kv-heads", c.kv_heads, "kv heads");
  app.add_option("--q-heads", c.q_heads, "query heads (a multiple of --kv-heads)");
  app.add_option("--dim", c.dim, "head dim");
  app.add_option("--length", c.length, "cached positions per sequence");
  app.add_option("--block", c.block, "positions per cache block");
  app.add_option("--batch", c.batch, "sequences decoded together");
  app.add_option("--formats", c.formats, "comma-separated cache formats");
  app.add_option("--threads", c.threads, "threads (0 = all)");
  app.add_option("--repeat", c.repeat, "timed steps per format");
  app.add_option("--warmup", c.warmup, "untimed steps first");
  app.add_option("--evict-mib", c.evict_mib, "MiB read between steps (0 = none)");
  CLI11_PARSE(app, argc, argv);
  try {
    const std::vector<float> eviction(static_cast<size_t>(c.evict_mib * (1 << 20) / 4), 1.0f);
    std::printf(
        "paged_decode kv_heads=%lld q_heads=%lld dim=%lld length=%lld block=%lld "
        "batch=%lld threads=%d\n",
        static_cast<long long>(c.kv_heads), static_cast<long long>(c.q_heads),
        static_cast<long long>(c.dim), static_cast<long long>(c.length),
        static_cast<long long>(c.block), static_cast<long long>(c.batch), c.threads);
    std::vector<FormatCase> cases;
    size_t start = 0;
    while (start <= c.formats.size()) {
      const size_t comma = std::min(c.formats.find(',', start), c.formats.size());
      cases.push_back(
          filled_cache(c, parse_kv_format(c.formats.substr(start, comma - start), "--formats")));
      start = comma + 1;
    }
    run_formats(c, cases, eviction);
  } catch (const Error& e) {
    std::fprintf(stderr, "paged_decode_run: %s\n", e.what());
    return 1;
  }
  return 0;
}
