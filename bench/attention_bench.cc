// Google Benchmark suite: the benchmark targets' shapes (B=1, H=8, D=64 unless said), fused kernel,
// all threads. Counters: GF/s on allowed pairs and on the dense equivalent (2·(D + Dv) flops per
// pair for the forward; 2.5× that, the five products, for the backward). Ratios between cases
// (causal vs dense, backward vs forward, bf16 vs f32, …) are read from one run; bench/compare adds
// the reference, PyTorch and the machine's FMA peak.
#include <benchmark/benchmark.h>

#include "cases.h"

namespace {

using maskattn::DType;
using maskattn::bench::Case;

void set_counters(benchmark::State& state, const Case& c, double per_pair) {
  state.counters["GF/s_allowed"] = benchmark::Counter(maskattn::bench::allowed_pairs(c) * per_pair,
                                                      benchmark::Counter::kIsIterationInvariantRate,
                                                      benchmark::Counter::kIs1000);
  state.counters["GF/s_dense"] = benchmark::Counter(maskattn::bench::dense_pairs(c) * per_pair,
                                                    benchmark::Counter::kIsIterationInvariantRate,
                                                    benchmark::Counter::kIs1000);
}

// The forward, attention().
void run_case(benchmark::State& state, Case c) {
  maskattn::bench::Tensors tensors(c);
  maskattn::Options options;
  tensors.run(options);  // warm-up
  for (auto _ : state) tensors.run(options);
  set_counters(state, c, maskattn::bench::flops_per_pair(c));
}

// The backward, attention_backward() only (the warm-up call also runs the forward once, for O and
// the LSE). Five products (S, dP, dV, dK, dQ) against the forward's two: 2.5× its flops per pair.
void run_backward_case(benchmark::State& state, Case c) {
  maskattn::bench::Tensors tensors(c);
  maskattn::Options options;
  tensors.run_backward(options);  // warm-up
  for (auto _ : state) tensors.run_backward(options);
  set_counters(state, c, 2.5 * maskattn::bench::flops_per_pair(c));
}

Case make(int64_t n, const char* mask, DType dtype = DType::f32) {
  Case c;
  c.q_len = c.k_len = n;
  c.mask = mask;
  c.dtype = dtype;
  return c;
}

void register_all() {
  const auto add = [](const std::string& name, Case c, bool backward = false) {
    benchmark::RegisterBenchmark(name.c_str(), backward ? run_backward_case : run_case, c)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->MinTime(0.5);
  };
  for (int64_t n : {1024, 2048, 4096}) {
    add("dense/f32/N=" + std::to_string(n), make(n, "none"));
    add("causal/f32/N=" + std::to_string(n), make(n, "causal"));
  }
  for (int64_t n : {1024, 2048}) {
    add("backward/dense/f32/N=" + std::to_string(n), make(n, "none"), true);
    add("backward/causal/f32/N=" + std::to_string(n), make(n, "causal"), true);
  }
  add("dense/bf16/N=2048", make(2048, "none", DType::bf16));
  add("dense/f16/N=2048", make(2048, "none", DType::f16));
  add("window256/f32/N=16384", make(16384, "window:256"));
  Case padded = make(2048, "padded");
  padded.batch = 8;
  add("padded/f32/B=8/N=2048", padded);
  Case decode = make(32768, "none");
  decode.q_len = 1;
  add("decode/f32/Lk=32768", decode);
  decode.dtype = DType::bf16;
  add("decode/bf16/Lk=32768", decode);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
