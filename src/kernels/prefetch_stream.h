// A range of memory the tile kernel prefetches a cache line at a time between the steps of its
// products (tile_products-inl.h): the next block's queries, while the current block runs.
//
// Why a stream. Blocks of a short band (a sliding window of 256 keys visits 5 tiles a block) come
// in runs of consecutive blocks of one head (fused.cc), and each had waited about 2 µs for its 16
// KB of queries to come from memory when packing them: a hardware prefetcher stops at a 4 KB
// page's end, and these blocks are 4 pages. Prefetching all 256 lines at a block's start, or a page
// per tile, did not help: the prefetches themselves stalled once the core's outstanding misses were
// full (1.7 % of the samples) and delayed the tiles' own K and V. One or two lines per product
// step (4 key rows of the scores, 4 or 8 value dims of P·V) spread them over the block's work:
// window 256 at N = 16384 (bench/attention_run, AMD host, interleaved, medians of 5) went from
// 53.8 to 52.3 ms on 2 threads and from 53.9 to 52.2 ms on one (4 heads). Also prefetching the
// key tile the next block's band gains (its K and V, through the same steps at twice the lines)
// measured within noise of this on 2 threads, so it was left out.
// Plain C++, not per SIMD target; prefetching changes no result.
#pragma once

#include <hwy/cache_control.h>

#include <cstdint>

namespace maskattn::detail::fused {

struct PrefetchStream {
  const char* at = nullptr;
  const char* end = nullptr;

  // [first, first + bytes), from the cache line holding `first`.
  void start(const void* first, int64_t bytes) {
    const auto address = reinterpret_cast<uintptr_t>(first);
    at = reinterpret_cast<const char*>(address & ~uintptr_t{63});
    end = static_cast<const char*>(first) + bytes;
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

// A product step's share: none when there is no stream.
inline void PrefetchStep(PrefetchStream* stream, int lines) {
  if (stream == nullptr) return;
  for (int n = 0; n < lines; ++n) stream->step();
}

}  // namespace maskattn::detail::fused
