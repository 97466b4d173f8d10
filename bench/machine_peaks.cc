// The machine's limits that the benchmark targets are stated against, measured in the same run:
//  - f32 FMA peak, with the same runtime dispatch as the kernels: 16 independent accumulator chains
//    (2 FMA ports × 4-cycle latency need at least 8 in flight);
//  - memory bandwidth: STREAM triad a = b + s·c over 3 × 256 MiB (3 arrays counted, as STREAM),
//    and the pure read bandwidth (a sum over the same 768 MiB).
// On 1 thread and on all threads. Prints lines such as
//   fma_peak target=AVX3 lanes=16 threads=2 gflops=519.7
//   triad threads=2 gbs=69.1
//   read threads=2 gbs=70.2
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/machine_peaks.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/aligned_allocator.h>
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

// a[i] = b[i] + s·c[i] over [begin, end): STREAM's triad with ordinary stores.
void Triad(float* a, const float* b, const float* c, int64_t begin, int64_t end) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto s = hn::Set(d, 3.0f);
  int64_t i = begin;
  for (; i + N <= end; i += N) {
    hn::StoreU(hn::MulAdd(s, hn::LoadU(d, c + i), hn::LoadU(d, b + i)), d, a + i);
  }
  for (; i < end; ++i) a[i] = b[i] + 3.0f * c[i];
}

// Σ a[i] over [begin, end), four independent chains: the pure read bandwidth a streaming kernel
// (decoding reads K and V once) can hope for.
float Read(const float* a, int64_t begin, int64_t end) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  auto s0 = hn::Zero(d), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = begin;
  for (; i + 4 * N <= end; i += 4 * N) {
    s0 = hn::Add(s0, hn::LoadU(d, a + i));
    s1 = hn::Add(s1, hn::LoadU(d, a + i + N));
    s2 = hn::Add(s2, hn::LoadU(d, a + i + 2 * N));
    s3 = hn::Add(s3, hn::LoadU(d, a + i + 3 * N));
  }
  float sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < end; ++i) sum += a[i];
  return sum;
}

}  // namespace HWY_NAMESPACE
}  // namespace fma_peak
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fma_peak {
HWY_EXPORT(FmaLoop);
HWY_EXPORT(Lanes);
HWY_EXPORT(Target);
HWY_EXPORT(Triad);
HWY_EXPORT(Read);
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
  // STREAM triad; arrays first touched by the threads that use them.
  const int64_t n = int64_t{64} << 20;  // 256 MiB per array
  const hwy::AlignedFreeUniquePtr<float[]> a_memory = hwy::AllocateAligned<float>(n);
  const hwy::AlignedFreeUniquePtr<float[]> b_memory = hwy::AllocateAligned<float>(n);
  const hwy::AlignedFreeUniquePtr<float[]> c_memory = hwy::AllocateAligned<float>(n);
  float* a = a_memory.get();
  float* b = b_memory.get();
  float* c = c_memory.get();
  for (int threads = 1; threads <= max_threads;
       threads = threads == max_threads ? threads + 1 : std::min(threads * 2, max_threads)) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; ++i) {
      a[i] = 0.0f;
      b[i] = 1.0f;
      c[i] = 2.0f;
    }
    double best = 0;
    for (int trial = 0; trial < 5; ++trial) {
      const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
      {
        // Each thread its own contiguous, 64-byte aligned share (streaming stores need it).
        const int64_t share = (n / threads + 15) / 16 * 16;
        const int64_t begin = std::min(n, share * omp_get_thread_num());
        HWY_DYNAMIC_DISPATCH(fma_peak::Triad)(a, b, c, begin, std::min(n, begin + share));
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      best = std::max(best, 3.0 * n * sizeof(float) / seconds * 1e-9);
    }
    std::printf("triad threads=%d gbs=%.1f\n", threads, best);
    double best_read = 0;
    for (int trial = 0; trial < 5; ++trial) {
      std::vector<float> sums(threads);
      const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
      {
        const int64_t share = (3 * n / threads + 15) / 16 * 16;  // all three arrays, end to end
        const int64_t begin = std::min(3 * n, share * omp_get_thread_num());
        const int64_t end = std::min(3 * n, begin + share);
        float sum = 0;
        for (int64_t part = begin; part < end;) {  // the arrays are separate allocations
          float* array = part < n ? a : part < 2 * n ? b : c;
          const int64_t local = part % n, stop = std::min(end - (part - local), n);
          sum += HWY_DYNAMIC_DISPATCH(fma_peak::Read)(array, local, stop);
          part += stop - local;
        }
        sums[omp_get_thread_num()] = sum;
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      best_read = std::max(best_read, 3.0 * n * sizeof(float) / seconds * 1e-9);
      if (sums[0] == -1.0f) std::printf("!");
    }
    std::printf("read threads=%d gbs=%.1f\n", threads, best_read);
    if (a[n / 2] != 7.0f) std::printf("!");
  }
  return 0;
}
#endif  // HWY_ONCE
