// ring_model: what ring attention would cost on a cluster, from compute measured here.
//
//   ring_model [--chunk 1024] [--heads 32 --kv-heads 8 --dim 128] [--dtype f32|bf16]
//              [--node-tflops 10] [--link-gbps 12.5] [--latency-us 5] [--window 4096]
//              [--tokens 131072,1048576] [--ranks 8,64]
//
// A ring step is attention() of one rank's queries against one rank's keys in the global frame
// (Options::frame). This program times three such c×c slice pairs on this machine — a fully
// allowed one (causal, keys before the queries), a causal diagonal one, and a sliding window's
// edge (the neighbour's keys under window(c/2, 0)) — and takes from them what the model cannot
// know: how much more a pair costs in a partially masked slice than in a full one. With the
// stated node flop rate, link bandwidth and latency it then projects step time, total time and
// efficiency of the forward pass (bench/ring_projection.h) for dense, causal-zigzag,
// causal-contiguous and sliding-window masks, and the overlap threshold: the tokens per rank
// above which every message hides behind its step's compute. docs/distributed.md explains the
// model and shows its output.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/splitmix64.h"
#include "maskattn/cpu.h"
#include "maskattn/maskattn.h"
#include "ring_projection.h"

namespace {

using namespace maskattn;

double median_seconds(const std::function<void()>& run, int repeat) {
  run();  // warm-up: scratch allocated, pages touched
  std::vector<double> seconds;
  for (int r = 0; r < repeat; ++r) {
    const auto start = std::chrono::steady_clock::now();
    run();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

std::vector<float> random_values(int64_t count, uint64_t seed) {
  maskattn::detail::SplitMix64 random(seed);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& x : values) x = static_cast<float>(random.uniform(-1.0, 1.0));
  return values;
}

// One timed slice pair: queries of global chunk 1 against keys of chunk `key_chunk`, in a
// problem of two chunks of c rows.
struct SlicePair {
  const char* name;
  Mask mask;
  int64_t key_chunk;
  int64_t window;  // for counting allowed pairs (≥ 2c: causal)
};

struct Measured {
  double seconds = 0;
  double pairs = 0;  // allowed (query, key) pairs per head
};

class PairTimer {
 public:
  PairTimer(const bench::ModelShape& shape, int64_t chunk, int threads, int repeat)
      : shape_(shape),
        chunk_(chunk),
        repeat_(repeat),
        q_(random_values(shape.q_heads * chunk * shape.dim, 1)),
        k_(random_values(shape.kv_heads * chunk * shape.dim, 2)),
        v_(random_values(shape.kv_heads * chunk * shape.dim, 3)),
        out_(static_cast<size_t>(shape.q_heads * chunk * shape.dim)),
        lse_(static_cast<size_t>(shape.q_heads * chunk)) {
    options_.threads = threads;
  }

  Measured time(const SlicePair& pair) {
    Options options = options_;
    options.frame = {chunk_, pair.key_chunk * chunk_, 2 * chunk_, 2 * chunk_};
    const auto run = [&] {
      attention(q_view(), kv_view(k_), kv_view(v_), out_view(), pair.mask, {}, options,
                MutableTensorView(lse_.data(), {1, shape_.q_heads, chunk_}));
    };
    const int64_t k_first = pair.key_chunk * chunk_;
    return {median_seconds(run, repeat_),
            bench::banded_pairs(chunk_, 2 * chunk_, k_first, k_first + chunk_, pair.window)};
  }

  // merge_partials of two parts of this rank's rows: the per-step bookkeeping of a ring.
  double time_merge() {
    std::vector<float> merged(out_.size()), merged_lse(lse_.size());
    const TensorView part(out_.data(), {1, shape_.q_heads, chunk_, shape_.dim});
    const TensorView part_lse(lse_.data(), {1, shape_.q_heads, chunk_});
    return median_seconds(
        [&] {
          merge_partials({{part, part_lse}, {part, part_lse}},
                         MutableTensorView(merged.data(), {1, shape_.q_heads, chunk_, shape_.dim}),
                         MutableTensorView(merged_lse.data(), {1, shape_.q_heads, chunk_}));
        },
        repeat_);
  }

 private:
  TensorView q_view() const {
    return TensorView(q_.data(), {1, shape_.q_heads, chunk_, shape_.dim});
  }
  TensorView kv_view(const std::vector<float>& x) const {
    return TensorView(x.data(), {1, shape_.kv_heads, chunk_, shape_.dim});
  }
  MutableTensorView out_view() {
    return MutableTensorView(out_.data(), {1, shape_.q_heads, chunk_, shape_.dim});
  }

  bench::ModelShape shape_;
  int64_t chunk_;
  int repeat_;
  Options options_;
  std::vector<float> q_, k_, v_, out_, lse_;
};

std::string seconds_text(double seconds) {
  char text[32];
  if (seconds >= 1) {
    std::snprintf(text, sizeof text, "%.2f s", seconds);
  } else if (seconds >= 1e-3) {
    std::snprintf(text, sizeof text, "%.2f ms", seconds * 1e3);
  } else {
    std::snprintf(text, sizeof text, "%.1f us", seconds * 1e6);
  }
  return text;
}

// The cluster table: one line per mask, sequence length and rank count.
void print_projections(const bench::ModelShape& shape, const bench::Cluster& cluster,
                       const bench::PairCosts& costs, const std::vector<int64_t>& token_counts,
                       const std::vector<int>& rank_counts) {
  std::printf("%-18s %9s %5s %8s %6s %10s %10s %10s %10s %10s %10s\n", "mask", "N", "P", "n=N/P",
              "steps", "mean step", "message", "ring fwd", "1-node fwd", "efficiency", "imbalance");
  const bench::RingMask masks[] = {bench::RingMask::dense, bench::RingMask::causal_zigzag,
                                   bench::RingMask::causal_contiguous,
                                   bench::RingMask::sliding_window};
  for (const bench::RingMask mask : masks) {
    for (const int64_t tokens : token_counts) {
      for (const int ranks : rank_counts) {
        const bench::Projection p = bench::project(mask, tokens, ranks, shape, cluster, costs);
        std::printf("%-18s %9lld %5d %8lld %6lld %10s %10s %10s %10s %9.1f%% %9.1f%%\n",
                    bench::ring_mask_name(mask), static_cast<long long>(tokens), ranks,
                    static_cast<long long>(tokens / ranks), static_cast<long long>(p.steps),
                    seconds_text(p.mean_step_seconds).c_str(),
                    seconds_text(p.message_seconds).c_str(), seconds_text(p.ring_seconds).c_str(),
                    seconds_text(p.one_node_seconds).c_str(), 100 * p.efficiency,
                    std::max(0.0, 100 * p.compute_imbalance));
      }
    }
  }
}

void print_thresholds(const bench::ModelShape& shape, const bench::Cluster& cluster,
                      const bench::PairCosts& costs, int ranks) {
  std::printf(
      "\noverlap threshold (P = %d): tokens per rank n above which every message hides "
      "behind its step's compute\n",
      ranks);
  const double base = static_cast<double>(shape.kv_heads * shape.element_bytes) * cluster.flops /
                      (2.0 * static_cast<double>(shape.q_heads) * cluster.bytes_per_second);
  const bench::RingMask masks[] = {bench::RingMask::dense, bench::RingMask::causal_zigzag,
                                   bench::RingMask::causal_contiguous,
                                   bench::RingMask::sliding_window};
  for (const bench::RingMask mask : masks) {
    const int64_t n = bench::overlap_threshold(mask, ranks, shape, cluster, costs);
    if (n < 0) {
      std::printf(
          "  %-18s never: W = %lld is below the break-even window %.0f (the message "
          "grows with n as fast as the compute)\n",
          bench::ring_mask_name(mask), static_cast<long long>(shape.window),
          bench::window_break_even(shape, cluster, costs));
    } else {
      std::printf("  %-18s n >= %lld\n", bench::ring_mask_name(mask), static_cast<long long>(n));
    }
  }
  std::printf(
      "  formula, latency aside: dense n >= (Hkv/Hq)*bytes*F/(2*beta) = %.0f; causal "
      "zigzag twice that; sliding window hidden iff W >= %.0f\n",
      base, bench::window_break_even(shape, cluster, costs));
}

// Times the three slice pairs and merge_partials here, prints them, and returns what a pair
// costs in the partial slice pairs relative to the full one.
bench::PairCosts measure_here(const bench::ModelShape& shape, int64_t chunk, int threads,
                              int repeat) {
  PairTimer timer(shape, chunk, threads, repeat);
  const int64_t two = 2 * chunk;
  const SlicePair pairs[] = {
      {"dense (causal, keys before queries)", Mask().causal(), 0, two},
      {"causal diagonal", Mask().causal(), 1, two},
      {"sliding-window edge, W = c/2", Mask().window(chunk / 2, 0), 0, chunk / 2},
  };
  std::printf(
      "\nper-step compute here: queries [c, 2c) of a 2c-token problem (Options::frame), "
      "c = %lld, median of %d\n",
      static_cast<long long>(chunk), repeat);
  std::printf("  %-38s %14s %10s %10s %16s\n", "slice pair", "allowed pairs", "time", "GF/s",
              "cost/pair vs full");
  std::vector<Measured> measured;
  for (const SlicePair& pair : pairs) measured.push_back(timer.time(pair));
  const double flops_per_pair = 4.0 * static_cast<double>(shape.dim * shape.q_heads);
  const double full_cost = measured[0].seconds / measured[0].pairs;
  for (size_t p = 0; p < measured.size(); ++p) {
    std::printf("  %-38s %14.0f %10s %10.1f %16.2f\n", pairs[p].name, measured[p].pairs,
                seconds_text(measured[p].seconds).c_str(),
                measured[p].pairs * flops_per_pair / measured[p].seconds * 1e-9,
                measured[p].seconds / measured[p].pairs / full_cost);
  }
  const double merge = timer.time_merge();
  std::printf("  merge_partials of two parts (%lld rows): %s = %.1f%% of the full pair\n",
              static_cast<long long>(chunk), seconds_text(merge).c_str(),
              100 * merge / measured[0].seconds);

  return {measured[1].seconds / measured[1].pairs / full_cost,
          measured[2].seconds / measured[2].pairs / full_cost};
}

}  // namespace

int main(int argc, char** argv) {
  bench::ModelShape shape;
  bench::Cluster cluster;
  int64_t chunk = 1024;
  int threads = 0, repeat = 5;
  std::string dtype = "f32";
  double node_tflops = 10, link_gbps = 12.5, latency_us = 5;
  std::vector<int64_t> token_counts = {131072, 1048576};
  std::vector<int> rank_counts = {8, 64};
  CLI::App app{"ring_model: project ring attention to a cluster from compute timed here"};
  app.add_option("--chunk", chunk, "rows per slice timed here (default 1024)")
      ->check(CLI::Range(64, 16384));
  app.add_option("--heads", shape.q_heads, "query heads (default 32)")->check(CLI::Range(1, 256));
  app.add_option("--kv-heads", shape.kv_heads, "kv heads (default 8)")->check(CLI::Range(1, 256));
  app.add_option("--dim", shape.dim, "head dim D = Dv (default 128)")->check(CLI::Range(1, 1024));
  app.add_option("--dtype", dtype, "K/V element type on the wire: f32 (4 bytes) or bf16 (2)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--window", shape.window, "sliding window W (default 4096)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--node-tflops", node_tflops, "node flop rate on full slices, TF/s (default 10)")
      ->check(CLI::PositiveNumber);
  app.add_option("--link-gbps", link_gbps, "link bandwidth, GB/s (default 12.5 = 100 Gb/s)")
      ->check(CLI::PositiveNumber);
  app.add_option("--latency-us", latency_us, "message latency, microseconds (default 5)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--tokens", token_counts, "sequence lengths N (default 131072,1048576)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--ranks", rank_counts, "rank counts P, one per node (default 8,64)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--threads", threads, "threads for the timing here (default: all cores)");
  app.add_option("--repeat", repeat, "timed runs per slice pair (median; default 5)")
      ->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  if (shape.q_heads % shape.kv_heads != 0) {
    std::fprintf(stderr, "ring_model: --heads %lld is not a multiple of --kv-heads %lld\n",
                 static_cast<long long>(shape.q_heads), static_cast<long long>(shape.kv_heads));
    return 2;
  }
  shape.element_bytes = dtype == "bf16" ? 2 : 4;
  cluster.flops = node_tflops * 1e12;
  cluster.bytes_per_second = link_gbps * 1e9;
  cluster.latency = latency_us * 1e-6;

  try {
    const CpuReport cpu = cpu_report();
    std::printf("ring_model: Hq=%lld Hkv=%lld D=Dv=%lld, K/V %s on the wire, B=1, forward pass\n",
                static_cast<long long>(shape.q_heads), static_cast<long long>(shape.kv_heads),
                static_cast<long long>(shape.dim), dtype.c_str());
    std::printf(
        "measured here: %s (lscpu model name), %u cores, SIMD %s, f32 compute, %s threads\n",
        cpu.model.c_str(), std::thread::hardware_concurrency(), cpu.simd_target.c_str(),
        threads > 0 ? std::to_string(threads).c_str() : "all");

    const bench::PairCosts costs = measure_here(shape, chunk, threads, repeat);
    std::printf(
        "\ncluster: F = %.3g TF/s per node on full slice pairs (partial ones at the costs "
        "above), beta = %.3g GB/s, alpha = %.3g us, one rank per node, W = %lld\n",
        node_tflops, link_gbps, latency_us, static_cast<long long>(shape.window));
    print_projections(shape, cluster, costs, token_counts, rank_counts);
    print_thresholds(shape, cluster, costs, rank_counts.front());
  } catch (const Error& error) {
    std::fprintf(stderr, "ring_model: %s\n", error.what());
    return 1;
  }
  return 0;
}
