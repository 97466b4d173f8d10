// A range of memory the tile kernel prefetches a few cache lines at a time between the steps of
// its products (tile_products-inl.h): what the block (or pair of blocks) will read next and the
// hardware prefetchers do not foresee, while the current tile computes.
//
// Why a stream. A hardware prefetcher stops at a 4 KB page's end, and a 64 × 64 f32 tile is four
// pages. Two cases waited for memory:
// - Blocks of a short band (a sliding window of 256 keys visits 5 tiles a block) come in runs of
//   consecutive blocks of one head (fused.cc), and each had waited about 2 µs for its 16 KB of
//   queries when packing them. Prefetching all 256 lines at a block's start, or a page per tile,
//   did not help: the prefetches themselves stalled once the core's outstanding misses were full
//   (1.7 % of the samples) and delayed the tiles' own K and V. One line per step unit (a step of 4
//   key rows of the scores is two units, one of 4 or 8 value dims of P·V one) spread them over
//   the block's work: window 256 at N = 16384 (bench/attention_run, AMD host, interleaved, medians
//   of 5) went from 53.8 to 52.3 ms on 2 threads and from 53.9 to 52.2 ms on one (4 heads).
//   Prefetching the key tile the next block's band gains, too, measured within noise.
// - A pair of blocks of a long band (fused_block.cc's AttendBlockPair) walks a head's K and V
//   tile after tile; at N = 16384 they come from L3 or memory. While a tile computes, the first
//   block's steps request the next tile's K rows and the second's its V rows, four lines a unit
//   (16 KB each over the tile's 48 units): dense N = 16384 on 2 threads, 2929 → 2837 ms
//   (bench/attention_run, interleaved), the N = 4096 rate per pair.
// Plain C++, not per SIMD target; prefetching changes no result.
#pragma once

#include <hwy/cache_control.h>

#include <cstdint>

namespace maskattn::detail::fused {

struct PrefetchStream {
  const char* at = nullptr;
  const char* end = nullptr;
  int lines_per_unit = 1;

  // [first, first + bytes), from the cache line holding `first`.
  void start(const void* first, int64_t bytes, int lines = 1) {
    const auto address = reinterpret_cast<uintptr_t>(first);
    at = reinterpret_cast<const char*>(address & ~uintptr_t{63});
    end = static_cast<const char*>(first) + bytes;
    lines_per_unit = lines;
  }
  void stop() { at = end = nullptr; }
  bool done() const { return at >= end; }

  // The next line, if any is left.
  void step() {
    if (at < end) {
      hwy::Prefetch(at);
      at += 64;
    }
  }
};

// A product step's share: `units` step units' lines, none when there is no stream.
inline void PrefetchStep(PrefetchStream* stream, int units) {
  if (stream == nullptr) return;
  for (int n = units * stream->lines_per_unit; n > 0; --n) stream->step();
}

}  // namespace maskattn::detail::fused
