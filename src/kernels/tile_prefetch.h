// The tile kernel's software prefetches (fused_block.cc): rows of Q, K and V that the hardware
// prefetchers do not foresee, requested all at once (a key tile a block jumps to) or a few lines
// per product step through a PrefetchStream (prefetch_stream.h says why and what each gained).
// Plain C++, not per SIMD target: prefetching changes no result.
#pragma once

#include <hwy/cache_control.h>

#include <algorithm>
#include <cstdint>

#include "kernels/fused_block.h"
#include "kernels/prefetch_stream.h"

namespace maskattn::detail::fused {

// Rows of one tensor to prefetch: `count` rows of `bytes`, `stride` bytes apart from `first`.
struct RowSpan {
  const char* first = nullptr;
  int64_t count = 0, stride = 0, bytes = 0;
};

// Rows [l, l + count) of (b, h) in a [B, H, L, W] view with contiguous rows, W values each.
inline RowSpan RowsOf(const TensorView& t, int64_t b, int64_t h, int64_t l, int64_t count,
                      int64_t width) {
  const int64_t size = static_cast<int64_t>(dtype_size(t.dtype()));
  return {static_cast<const char*>(t.data()) + t.offset({b, h, l, 0}) * size, count,
          t.stride(2) * size, width * size};
}

// The cache lines of [first, end).
inline void PrefetchBytes(const char* first, const char* end) {
  for (uintptr_t at = reinterpret_cast<uintptr_t>(first) & ~uintptr_t{63};
       at < reinterpret_cast<uintptr_t>(end); at += 64) {
    hwy::Prefetch(reinterpret_cast<const char*>(at));
  }
}

inline void PrefetchRows(const RowSpan& span) {
  if (span.stride == span.bytes) {  // contiguous rows: one range
    PrefetchBytes(span.first, span.first + span.count * span.stride);
    return;
  }
  for (int64_t r = 0; r < span.count; ++r) {
    const char* row = span.first + r * span.stride;
    PrefetchBytes(row, row + span.bytes);
  }
}

// The K and V rows of key tile `k_tile`, all at once: for a full tile the block jumps to (BigBird's
// random and global blocks), which no hardware prefetcher foresees. A partial tile jumped to is
// mostly a global key or two (Longformer's spread global tokens): the products read only its
// active rows, and fetching all 64 cost those blocks about 3 % (32 KB of K and V per tile).
inline void PrefetchKeyTile(const Context& c, const Block& blk, int64_t k_tile) {
  const Problem& p = *c.problem;
  if (p.pages != nullptr || p.k.stride(3) != 1 || p.v.stride(3) != 1) return;
  const int64_t g = p.kv_head(blk.h), j0 = k_tile * kTileK;
  const int64_t rows = std::min(kTileK, p.k_len - j0);
  PrefetchRows(RowsOf(p.k, blk.b, g, j0, rows, p.head_dim));
  PrefetchRows(RowsOf(p.v, blk.b, g, j0, rows, p.value_dim));
}

// What the block after `blk` (the same head's next 64 queries) reads first and `blk` does not, for
// the f32 products to prefetch while `blk` runs (prefetch_stream.h): its queries, and when its
// band ends one key tile further (a band along the diagonal: a sliding window, a causal chunk) that
// tile's K and V rows, four lines a step unit then (a block of a window of 256 keys has about 200
// units for its 768 lines); nothing of a range whose rows are not one contiguous range.
inline void StartNextBlock(const Context& c, const Block& blk, PrefetchStream& stream) {
  constexpr int kLinesPerUnitWithKeys = 4;
  const Problem& p = *c.problem;
  stream.stop();
  const int64_t next = blk.q_first + kTileQ;
  if (p.q.stride(3) != 1 || next >= p.q_len) return;
  const RowSpan rows =
      RowsOf(p.q, blk.b, blk.h, next, std::min(kTileQ, p.q_len - next), p.head_dim);
  if (rows.stride == rows.bytes) stream.start(rows.first, rows.count * rows.bytes);
  if (p.pages != nullptr || p.k.stride(3) != 1 || p.v.stride(3) != 1) return;
  const int64_t q_tile = blk.q_first / kTileQ;
  const int64_t end = c.blocks->k_tile_range(blk.b, blk.h, q_tile).end;
  if (c.blocks->k_tile_range(blk.b, blk.h, q_tile + 1).end != end + 1) return;
  const int64_t g = p.kv_head(blk.h), j0 = end * kTileK;
  if (j0 >= std::min(p.k_len, blk.k_end)) return;
  const int64_t keys = std::min(kTileK, p.k_len - j0);
  const RowSpan k = RowsOf(p.k, blk.b, g, j0, keys, p.head_dim);
  const RowSpan v = RowsOf(p.v, blk.b, g, j0, keys, p.value_dim);
  if (k.stride != k.bytes || v.stride != v.bytes) return;
  stream.lines_per_unit = kLinesPerUnitWithKeys;
  stream.add(k.first, k.count * k.bytes);
  stream.add(v.first, v.count * v.bytes);
}

// A pair's requests while a key tile computes: key tile `next` (or none, when negative), its K rows
// through the steps of the first block that runs the tile, its V rows through the second's (K
// alone when one block runs it), 4 lines a step unit (prefetch_stream.h); none for paged caches
// or where rows are not contiguous. A tile the walks jump to instead is prefetched whole by
// StepWalk (fused_block.cc).
inline void StartNextKeyTile(const Context& c, const Block& blk, int64_t next, Scratch** running) {
  constexpr int kLinesPerUnit = 4;
  const Problem& p = *c.problem;
  for (int n = 0; n < 2; ++n) {
    if (running[n] != nullptr) running[n]->prefetch.stop();
  }
  const int64_t j0 = next * kTileK;
  if (next < 0 || p.pages != nullptr || p.k.stride(3) != 1 || p.v.stride(3) != 1 || j0 >= p.k_len ||
      running[0] == nullptr) {
    return;
  }
  const int64_t g = p.kv_head(blk.h), rows = std::min(kTileK, p.k_len - j0);
  const RowSpan k = RowsOf(p.k, blk.b, g, j0, rows, p.head_dim);
  const RowSpan v = RowsOf(p.v, blk.b, g, j0, rows, p.value_dim);
  if (k.stride == k.bytes) running[0]->prefetch.start(k.first, k.count * k.bytes, kLinesPerUnit);
  if (running[1] != nullptr && v.stride == v.bytes) {
    running[1]->prefetch.start(v.first, v.count * v.bytes, kLinesPerUnit);
  }
}

}  // namespace maskattn::detail::fused
