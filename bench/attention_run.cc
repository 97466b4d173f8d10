// One benchmark case per process, so that its peak RSS is its own. Used by bench/compare.
//   attention_run --lq 2048 --lk 2048 --mask causal --dtype f32 --threads 2 --repeat 5
// prints one line of key=value pairs: median_ms, min_ms, max_ms, median_us (the median at 10 ns
// resolution, for calls of a few µs), allowed_pairs, dense_pairs,
// gflops_allowed, gflops_dense, peak_rss_mib, io_mib (inputs + outputs). --pass backward times
// attention_backward() instead (flops counted as its five products).
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "cases.h"

int main(int argc, char** argv) {
  using namespace maskattn;
  bench::Case c;
  std::string dtype = "f32", kernel = "fused", pass = "forward";
  int threads = 0, repeat = 5;
  CLI::App app{"run one attention benchmark case"};
  app.add_option("--batch", c.batch);
  app.add_option("--heads", c.heads);
  app.add_option("--kv-heads", c.kv_heads);
  app.add_option("--lq", c.q_len);
  app.add_option("--lk", c.k_len);
  app.add_option("--dim", c.dim);
  app.add_option("--mask", c.mask,
                 "none | causal | window:W | padded | longformer:W:G[:spread] | "
                 "bigbird:BLOCK:S:G:R | dense-longformer:… | dense-bigbird:…");
  app.add_option("--mods", c.mods, "none | relative-program");
  app.add_option("--dtype", dtype, "f32 | f16 | bf16");
  app.add_option("--kernel", kernel, "fused | reference | auto");
  app.add_option("--threads", threads);
  app.add_option("--pass", pass, "forward | backward")
      ->check(CLI::IsMember({"forward", "backward"}));
  app.add_option("--repeat", repeat)->check(CLI::Range(1, 1000));
  double dropout = 0.0;
  app.add_option("--dropout", dropout, "attention dropout probability (seed 1)")
      ->check(CLI::Range(0.0, 1.0));
  CLI11_PARSE(app, argc, argv);

  try {
    c.dtype = parse_dtype(dtype, "--dtype");
    bench::Tensors tensors(c);
    Options options;
    options.threads = threads;
    options.kernel = parse_kernel(kernel, "--kernel");
    options.dropout = Dropout{dropout, 1, 0};
    const auto run = [&] {
      if (pass == "backward") {
        tensors.run_backward(options);
      } else {
        tensors.run(options);
      }
    };
    run();  // warm-up: scratch allocated, pages touched
    std::vector<double> ms;
    for (int r = 0; r < repeat; ++r) {
      const auto start = std::chrono::steady_clock::now();
      run();
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    // The backward's five products (S, dP, dV, dK, dQ) against the forward's two: 2·(3D + 2Dv).
    const double flops = bench::flops_per_pair(c) * (pass == "backward" ? 2.5 : 1.0);
    const double allowed = bench::allowed_pairs(c);  // count_allowed: a walk over the tiles
    // The 64×64 tiles the kernel visits (block map: not empty) and how many need the element mask.
    const Array<uint8_t> tiles =
        block_map(bench::make_mask(c), {c.batch, c.heads, c.q_len, c.k_len});
    const auto visited = std::count_if(tiles.values().begin(), tiles.values().end(),
                                       [](uint8_t kind) { return kind != 0; });
    const auto partial = std::count(tiles.values().begin(), tiles.values().end(), uint8_t{2});
    std::printf(
        "median_ms=%.3f min_ms=%.3f max_ms=%.3f median_us=%.2f allowed_pairs=%.0f dense_pairs=%.0f "
        "gflops_allowed=%.1f gflops_dense=%.1f peak_rss_mib=%.1f io_mib=%.1f tiles_visited=%ld "
        "tiles_partial=%ld tiles_total=%ld\n",
        median, ms.front(), ms.back(), median * 1e3, allowed, bench::dense_pairs(c),
        allowed * flops / median * 1e-6, bench::dense_pairs(c) * flops / median * 1e-6,
        usage.ru_maxrss / 1024.0, tensors.bytes() / (1 << 20), static_cast<long>(visited),
        static_cast<long>(partial), static_cast<long>(tiles.numel()));
  } catch (const std::exception& error) {
    std::fprintf(stderr, "attention_run: %s\n", error.what());
    return 1;
  }
  return 0;
}
