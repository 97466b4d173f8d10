// The machine's f32 FMA peak, measured with the same runtime dispatch as the kernels: 16
// independent accumulator chains (2 FMA ports × 4-cycle latency need at least 8 in flight), on 1
// thread and on all threads. Prints: fma_peak target=AVX3 lanes=16 threads=1 gflops=... and the
// same for every thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "fma_peak.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

HWY_BEFORE_NAMESPACE();
namespace fma_peak {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

float FmaLoop(int64_t iterations, float seed) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  V acc[16];
  for (int n = 0; n < 16; ++n) acc[n] = hn::Set(d, seed + 0.001f * n);
  const V x = hn::Set(d, 0.9999999f), y = hn::Set(d, 1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int n = 0; n < 16; ++n) acc[n] = hn::MulAdd(acc[n], x, y);
  }
  V sum = acc[0];
  for (int n = 1; n < 16; ++n) sum = hn::Add(sum, acc[n]);
  return hn::GetLane(sum);
}

size_t Lanes() {
  return hn::Lanes(hn::ScalableTag<float>());
}
const char* Target() {
  return hwy::TargetName(HWY_TARGET);
}

}  // namespace HWY_NAMESPACE
}  // namespace fma_peak
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fma_peak {
HWY_EXPORT(FmaLoop);
HWY_EXPORT(Lanes);
HWY_EXPORT(Target);
}  // namespace fma_peak

int main() {
  constexpr int64_t kIterations = 20'000'000;
  const size_t lanes = HWY_DYNAMIC_DISPATCH(fma_peak::Lanes)();
  const int max_threads = omp_get_max_threads();
  for (int threads = 1; threads <= max_threads;
       threads = threads == max_threads ? threads + 1 : std::min(threads * 2, max_threads)) {
    double best = 0;
    for (int trial = 0; trial < 5; ++trial) {
      std::vector<float> sink(threads);
      const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
      sink[omp_get_thread_num()] = HWY_DYNAMIC_DISPATCH(fma_peak::FmaLoop)(kIterations, 0.5f);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double flops = 2.0 * 16 * lanes * kIterations * threads;
      best = std::max(best, flops / seconds * 1e-9);
      if (sink[0] == 12345.0f) std::printf("!");  // keep the results alive
    }
    std::printf("fma_peak target=%s lanes=%zu threads=%d gflops=%.1f\n",
                HWY_DYNAMIC_DISPATCH(fma_peak::Target)(), lanes, threads, best);
  }
  return 0;
}
#endif  // HWY_ONCE
