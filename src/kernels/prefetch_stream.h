// Ranges of memory the tile kernel prefetches a few cache lines at a time between the steps of
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
//   The key tile the next block's band gains came next: through the same stream after the
//   queries, four lines a unit, its K then V rows, which the block had otherwise met cold on its
//   first visit (V's finiteness check and the scores waited for them): 52.9 → 51.2 ms together
//   with longer runs of blocks (fused.cc), of which the prefetch alone was about 2.5 % (an
//   earlier version of it had measured within noise).
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

// Up to kMaxRanges ranges, walked in the order they were added, a line at a time.
struct PrefetchStream {
  static constexpr int kMaxRanges = 3;  // the next block's queries, then a key tile's K and V
  struct Range {
    const char* at = nullptr;
    const char* end = nullptr;
  };
  Range ranges[kMaxRanges];
  int count = 0, current = 0;
  int lines_per_unit = 1;

  // [first, first + bytes), from the cache line holding `first`, alone.
  void start(const void* first, int64_t bytes, int lines = 1) {
    stop();
    lines_per_unit = lines;
    add(first, bytes);
  }
  // [first, first + bytes) after the ranges already there (ignored when kMaxRanges are).
  void add(const void* first, int64_t bytes) {
    if (count == kMaxRanges || bytes <= 0) return;
    const auto address = reinterpret_cast<uintptr_t>(first);
    ranges[count++] = {reinterpret_cast<const char*>(address & ~uintptr_t{63}),
                       static_cast<const char*>(first) + bytes};
  }
  void stop() { count = current = 0; }
  bool done() const { return current >= count; }
  // The line step() prefetches next (null when done).
  const char* next() const { return done() ? nullptr : ranges[current].at; }

  // The next line, if any is left.
  void step() {
    if (done()) return;
    Range& range = ranges[current];
    hwy::Prefetch(range.at);
    range.at += 64;
    if (range.at >= range.end) ++current;
  }
};

// A product step's share: `units` step units' lines, none when there is no stream.
inline void PrefetchStep(PrefetchStream* stream, int units) {
  if (stream == nullptr) return;
  for (int n = units * stream->lines_per_unit; n > 0; --n) stream->step();
}

}  // namespace maskattn::detail::fused
