// The machine's limits that the benchmark targets are stated against, measured in the same run:
//  - f32 FMA peak, with the same runtime dispatch as the kernels: 16 independent accumulator chains
//    (2 FMA ports × 4-cycle latency need at least 8 in flight), the best of 5 trials;
//  - the matrix units bf16 inputs can use, each where CPUID, XCR0 and (AMX) Linux allow it, the
//    median of 5 trials after a warm-up, operands held in registers or tiles:
//    AMX tdpbf16ps (16384 flop per instruction, 4 accumulator tiles, random non-zero bf16 data)
//    and AVX512-BF16 vdpbf16ps on zmm (64 flop per instruction, 16 accumulators);
//  - memory bandwidth: STREAM triad a = b + s·c over 3 × 256 MiB (3 arrays counted, as STREAM),
//    and the pure read bandwidth (a sum over the same 768 MiB).
// On 1 thread and on all threads. Prints lines such as
//   fma_peak target=AVX3 lanes=16 threads=2 gflops=519.7
//   amx_peak threads=2 gflops=4321.0        (or: amx_peak unavailable reason=cpuid-lacks-amx-…)
//   bf16_dot_peak threads=2 gflops=139.0    (or: bf16_dot_peak unavailable reason=…)
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
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "src/core/splitmix64.h"  // the one seeded generator (bench/ is not on the path)

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

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

namespace {

// 1, 2, 4, … threads up to and always including `max_threads`.
std::vector<int> ThreadCounts(int max_threads) {
  std::vector<int> counts;
  for (int threads = 1; threads < max_threads; threads *= 2) counts.push_back(threads);
  counts.push_back(max_threads);
  return counts;
}

// Runs `body` on `threads` threads once untimed (the AMX unit in particular powers up on first
// use), then `trials` times timed; the median wall time in seconds. The median rather than the
// best: on the shared Xeon VM the AMX rate was seen to drop to half for seconds at a time (from
// outside the VM, probably a neighbour on the same cores), and a typical trial describes what a
// benchmark run meets better than the luckiest one.
template <typename Body>
double MedianSeconds(int threads, int trials, const Body& body) {
  std::vector<double> seconds;
  for (int trial = -1; trial < trials; ++trial) {
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    body(omp_get_thread_num());
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (trial >= 0) seconds.push_back(elapsed);
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

void FmaPeak(int max_threads) {
  constexpr int64_t kIterations = 20'000'000;
  const size_t lanes = HWY_DYNAMIC_DISPATCH(fma_peak::Lanes)();
  for (const int threads : ThreadCounts(max_threads)) {
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
}

// ---- Matrix units: AMX tdpbf16ps and AVX512-BF16 vdpbf16ps. Compiled for their instruction sets
// with target attributes and entered only after CPUID, XCR0 and (AMX) the kernel agree, so that
// the binary still runs on a CPU without them and prints why they were not measured.

#if defined(__x86_64__)
struct CpuidRegisters {
  uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
};

CpuidRegisters Cpuid(uint32_t leaf, uint32_t subleaf) {
  CpuidRegisters r;
  // Zeros when the CPU's highest leaf is below `leaf`, which reads as "feature absent".
  if (!__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx)) return {};
  return r;
}

// The state components the OS saves on context switches (XCR0); zero when XGETBV would fault
// (no OSXSAVE), so every state then reads as disabled.
uint64_t EnabledStates() {
  if (!(Cpuid(1, 0).ecx & (1u << 27))) return 0;
  uint32_t low = 0, high = 0;
  asm volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
  return (uint64_t{high} << 32) | low;
}

// Why AMX bf16 cannot run in this process, or nullptr when it can (the permission is then held).
const char* AmxUnavailable() {
  const CpuidRegisters leaf7 = Cpuid(7, 0);
  if (!(leaf7.edx & (1u << 24)) || !(leaf7.edx & (1u << 22))) return "cpuid-lacks-amx-tile-bf16";
  // Bits 17 (XTILECFG) and 18 (XTILEDATA): the OS must save the tile state.
  if ((EnabledStates() & 0x60000) != 0x60000) return "xcr0-tile-state-disabled";
  // Linux ≥ 5.16 hands out the 8 KiB tile state per process on request; without it the first
  // tile instruction raises SIGILL. ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18.
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) return "arch_prctl-xtiledata-denied";
  return nullptr;
}

// vdpbf16ps on zmm registers: AVX512-BF16 in CPUID and the AVX-512 state (XCR0 bits 1, 2, 5–7).
const char* Bf16DotUnavailable() {
  if (!(Cpuid(7, 1).eax & (1u << 5))) return "cpuid-lacks-avx512-bf16";
  if ((EnabledStates() & 0xe6) != 0xe6) return "xcr0-avx512-state-disabled";
  return nullptr;
}

// Palette 1 with all 8 tiles at their largest, 16 rows × 64 bytes: a tile holds 16×16 f32 or
// 16 rows of 32 bf16 (16 pairs in VNNI order, what tdpbf16ps's B operand takes).
struct alignas(64) TileConfig {
  uint8_t palette = 0, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

constexpr TileConfig FullTiles() {
  TileConfig config;
  config.palette = 1;
  for (int tile = 0; tile < 8; ++tile) {
    config.rows[tile] = 16;
    config.bytes_per_row[tile] = 64;
  }
  return config;
}
// A static handed to ldtilecfg as a memory operand: GCC 12 treats the stores into a local config
// passed to _tile_loadconfig as dead, loads a zeroed palette and the first tile instruction faults.
const TileConfig kFullTiles = FullTiles();

constexpr int64_t kTileElements = 16 * 32;  // bf16 per 16 × 64-byte tile

// `iterations` × 4 tdpbf16ps into 4 accumulator tiles (C0..C3 += A0|A1 · B0|B1), operands kept in
// tiles so that only the unit's rate is measured. Each instruction is 16·16·32·2 = 16384 flop.
// Returns a sum of the accumulators so that the work has a visible result.
__attribute__((target("amx-tile,amx-bf16"))) float AmxLoop(int64_t iterations, const uint16_t* a,
                                                           const uint16_t* b) {
  asm volatile("ldtilecfg %0" ::"m"(kFullTiles));
  // The tile loads read memory through a register operand the compiler cannot see: make the
  // caller's stores into a and b happen first.
  asm volatile("" ::: "memory");
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a + kTileElements, 64);
  _tile_loadd(6, b, 64);
  _tile_loadd(7, b + kTileElements, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t it = 0; it < iterations; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float c[4][256];
  _tile_stored(0, c[0], 64);
  _tile_stored(1, c[1], 64);
  _tile_stored(2, c[2], 64);
  _tile_stored(3, c[3], 64);
  _tile_release();
  float sum = 0;
  for (const auto& tile : c) sum += tile[0] + tile[255];
  return sum;
}

// 16 independent vdpbf16ps chains (latency ≈ 8 cycles × up to 2 per cycle), 64 flop each: every
// one of the 16 lanes sums two bf16 products into f32.
__attribute__((target("avx512f,avx512bf16"))) float Bf16DotLoop(int64_t iterations, float seed) {
  __m512 acc[16];
  for (int n = 0; n < 16; ++n) acc[n] = _mm512_set1_ps(seed + 0.001f * n);
  const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(-2e-3f));
  const __m512bh y = _mm512_cvtne2ps_pbh(_mm512_set1_ps(3e-3f), _mm512_set1_ps(1e-3f));
  for (int64_t it = 0; it < iterations; ++it) {
    for (int n = 0; n < 16; ++n) acc[n] = _mm512_dpbf16_ps(acc[n], x, y);
  }
  __m512 sum = acc[0];
  for (int n = 1; n < 16; ++n) sum = _mm512_add_ps(sum, acc[n]);
  // Stored and summed by hand: GCC 12's _mm512_reduce_add_ps trips -Wuninitialized in its header.
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  return lanes[0] + lanes[15];
}

// bf16 bits of random values of magnitude [0.5, 2) and random sign: never zero, because the AMX
// unit runs measurably faster on zero tiles than on real data.
void RandomBf16(uint16_t* out, int64_t count, uint32_t seed) {
  maskattn::detail::SplitMix64 random(seed);
  for (int64_t i = 0; i < count; ++i) {
    const float magnitude = static_cast<float>(random.uniform(0.5, 2.0));
    const float value = random.next() & 1 ? magnitude : -magnitude;
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof bits);
    out[i] = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);  // to nearest
  }
}
#endif  // __x86_64__

// Prints `NAME threads=T gflops=G` per thread count: `loop(thread)` runs one thread's timed loop
// of `flops_per_thread` and returns a value that keeps it from being optimised away.
template <typename Loop>
void PrintLoopPeak(const char* name, int max_threads, double flops_per_thread, const Loop& loop) {
  for (const int threads : ThreadCounts(max_threads)) {
    std::vector<float> sink(threads);
    const double seconds =
        MedianSeconds(threads, 5, [&](int thread) { sink[thread] = loop(thread); });
    std::printf("%s threads=%d gflops=%.1f\n", name, threads,
                flops_per_thread * threads / seconds * 1e-9);
    if (sink[0] == 12345.0f) std::printf("!");
  }
}

// Prints `amx_peak threads=T gflops=G` per thread count, or `amx_peak unavailable reason=R`.
void AmxPeak(int max_threads) {
#if defined(__x86_64__)
  if (const char* reason = AmxUnavailable()) {
    std::printf("amx_peak unavailable reason=%s\n", reason);
    return;
  }
  constexpr int64_t kIterations = 2'000'000;  // ≈ 60 ms per thread at 2.2 TF/s
  PrintLoopPeak("amx_peak", max_threads, 4.0 * 16 * 16 * 32 * 2 * kIterations, [](int thread) {
    // Each thread configures its own tiles (the configuration is per thread) with its own data.
    alignas(64) uint16_t a[2 * kTileElements], b[2 * kTileElements];
    RandomBf16(a, 2 * kTileElements, 1 + 2 * thread);
    RandomBf16(b, 2 * kTileElements, 2 + 2 * thread);
    return AmxLoop(kIterations, a, b);
  });
#else
  (void)max_threads;
  std::printf("amx_peak unavailable reason=not-x86-64\n");
#endif
}

// Prints `bf16_dot_peak threads=T gflops=G` per thread count, or `… unavailable reason=R`.
void Bf16DotPeak(int max_threads) {
#if defined(__x86_64__)
  if (const char* reason = Bf16DotUnavailable()) {
    std::printf("bf16_dot_peak unavailable reason=%s\n", reason);
    return;
  }
  constexpr int64_t kIterations = 5'000'000;  // ≈ 65 ms per thread at 78 GF/s
  PrintLoopPeak("bf16_dot_peak", max_threads, 16.0 * 64 * kIterations,
                [](int) { return Bf16DotLoop(kIterations, 0.5f); });
#else
  (void)max_threads;
  std::printf("bf16_dot_peak unavailable reason=not-x86-64\n");
#endif
}

// STREAM triad and the read pass (see the top of this file).
void Bandwidth(int max_threads) {
  // STREAM triad; arrays first touched by the threads that use them.
  const int64_t n = int64_t{64} << 20;  // 256 MiB per array
  const hwy::AlignedFreeUniquePtr<float[]> a_memory = hwy::AllocateAligned<float>(n);
  const hwy::AlignedFreeUniquePtr<float[]> b_memory = hwy::AllocateAligned<float>(n);
  const hwy::AlignedFreeUniquePtr<float[]> c_memory = hwy::AllocateAligned<float>(n);
  float* a = a_memory.get();
  float* b = b_memory.get();
  float* c = c_memory.get();
  for (const int threads : ThreadCounts(max_threads)) {
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
}

}  // namespace

int main() {
  const int max_threads = omp_get_max_threads();
  FmaPeak(max_threads);
  AmxPeak(max_threads);
  Bf16DotPeak(max_threads);
  Bandwidth(max_threads);
  return 0;
}

#endif  // HWY_ONCE
