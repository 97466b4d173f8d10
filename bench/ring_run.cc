// One timed ring-attention measurement under mpirun (bench/ring_compare runs it):
//   mpirun -np P ring_run --n 32768 --heads 8 --dim 64 --mask causal|none|window:W
//                         --layout zigzag|contiguous --threads T --repeats R [--backward]
// Every rank fills its own shard (random, seeded by rank: the values do not change the time),
// runs one untimed warm-up ring, then R timed rings, each started together (MPI_Barrier) and
// timed as the slowest rank's. Rank 0 prints one line of key=value pairs: the median and min
// seconds, and per rank the compute and wait seconds and the bytes sent of the median run.
// With P = 1 the ring is one attention() call (local_ranges coalesces the chunks), so
// `-np 1 --threads 2` is the one-process baseline measured by the same harness.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/splitmix64.h"
#include "maskattn/dist/ring_mpi.h"
#include "maskattn/mask_spec.h"

namespace {

using namespace maskattn;

std::vector<float> filled(size_t count, uint64_t seed) {
  std::vector<float> values(count);
  detail::SplitMix64 random(seed);
  for (float& x : values) x = static_cast<float>(random.uniform(-1.0, 1.0));
  return values;
}

struct RunConfig {
  int64_t n = 32768, heads = 8, dim = 64;
  std::string mask = "causal", layout = "zigzag";
  int threads = 1, repeats = 5;
  bool backward = false;
};

// One timed run: the slowest rank's seconds; `stats` gets this rank's figures.
double timed_ring(const RunConfig& c, const Mask& mask, const dist::RingOptions& options,
                  int64_t rows, dist::RingStats* stats) {
  static std::vector<float> q, k, v, out, lse, dout, dq, dk, dv;
  const size_t count = static_cast<size_t>(c.heads * rows * c.dim);
  if (q.size() != count) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    q = filled(count, 3 * rank + 1);
    k = filled(count, 3 * rank + 2);
    v = filled(count, 3 * rank + 3);
    dout = filled(count, 3 * rank + 4);
    out.assign(count, 0.0f);
    lse.assign(static_cast<size_t>(c.heads * rows), 0.0f);
    dq.assign(count, 0.0f);
    dk.assign(count, 0.0f);
    dv.assign(count, 0.0f);
  }
  const Dims shape = {1, c.heads, rows, c.dim};
  const TensorView qv(q.data(), shape), kv(k.data(), shape), vv(v.data(), shape);
  const MutableTensorView ov(out.data(), shape), lv(lse.data(), {1, c.heads, rows});
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  if (c.backward) {
    Gradients grads;
    grads.dq = MutableTensorView(dq.data(), shape);
    grads.dk = MutableTensorView(dk.data(), shape);
    grads.dv = MutableTensorView(dv.data(), shape);
    dist::ring_attention_backward(MPI_COMM_WORLD, c.n, c.n, qv, kv, vv, ov, lv,
                                  TensorView(dout.data(), shape), grads, mask, {}, options, stats);
  } else {
    dist::ring_attention(MPI_COMM_WORLD, c.n, c.n, qv, kv, vv, ov, mask, {}, options, lv, stats);
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return seconds;
}

// Rank 0 prints the figures of every rank for the median run.
void report(const RunConfig& c, int world, std::vector<double> times,
            const std::vector<dist::RingStats>& per_run) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const size_t median_run = std::find(times.begin(), times.end(), median) - times.begin();
  const dist::RingStats& s = per_run[median_run];
  double mine[3] = {s.compute_seconds, s.wait_seconds, static_cast<double>(s.bytes_sent)};
  std::vector<double> all(3 * world);
  MPI_Gather(mine, 3, MPI_DOUBLE, all.data(), 3, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank != 0) return;
  std::printf("ranks=%d threads=%d n=%lld mask=%s layout=%s pass=%s median_s=%.4f min_s=%.4f",
              world, c.threads, static_cast<long long>(c.n), c.mask.c_str(), c.layout.c_str(),
              c.backward ? "backward" : "forward", median, sorted.front());
  for (int r = 0; r < world; ++r) {
    std::printf(" compute_s_%d=%.4f wait_s_%d=%.4f bytes_%d=%.0f", r, all[3 * r], r, all[3 * r + 1],
                r, all[3 * r + 2]);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  RunConfig c;
  CLI::App app{"time ring attention under mpirun (bench/ring_compare)"};
  app.add_option("--n", c.n, "sequence length N")->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--heads", c.heads)->check(CLI::Range(1, 1024));
  app.add_option("--dim", c.dim)->check(CLI::Range(1, 1024));
  app.add_option("--mask", c.mask, "a maskattn mask SPEC (causal, none, window:L:R, ...)");
  app.add_option("--layout", c.layout)->check(CLI::IsMember({"zigzag", "contiguous"}));
  app.add_option("--threads", c.threads)->check(CLI::Range(1, 1024));
  app.add_option("--repeats", c.repeats)->check(CLI::Range(1, 1000));
  app.add_flag("--backward", c.backward, "time ring_attention_backward instead");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    MPI_Finalize();
    return code;
  }
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  try {
    Mask mask;
    ScoreMods unused;
    if (c.mask != "none") apply_mask_spec(c.mask, mask, unused);
    dist::RingOptions options;
    options.base.threads = c.threads;
    options.layout = c.layout == "zigzag" ? dist::Layout::zigzag : dist::Layout::contiguous;
    const int64_t rows = dist::row_count(dist::local_ranges(c.n, options.layout, rank, world));
    dist::RingStats warmup;
    timed_ring(c, mask, options, rows, &warmup);
    std::vector<double> times;
    std::vector<dist::RingStats> stats(c.repeats);
    for (int r = 0; r < c.repeats; ++r)
      times.push_back(timed_ring(c, mask, options, rows, &stats[r]));
    report(c, world, times, stats);
  } catch (const Error& e) {
    std::fprintf(stderr, "ring_run: rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return 0;
}
