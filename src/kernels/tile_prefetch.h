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

  bool contiguous() const { return stride == bytes; }  // one range, which a stream can walk
  int64_t total_bytes() const { return count * bytes; }
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
  if (span.contiguous()) {
    PrefetchBytes(span.first, span.first + span.count * span.stride);
    return;
  }
  for (int64_t r = 0; r < span.count; ++r) {
    const char* row = span.first + r * span.stride;
    PrefetchBytes(row, row + span.bytes);
  }
}

// The K and V rows of key tile `k_tile` of the block's kv head; false where none can be prefetched
// (a paged cache, rows whose values are not contiguous, a tile past the keys).
struct KeyTileRows {
  RowSpan k, v;
};
inline bool RowsOfKeyTile(const Context& c, const Block& blk, int64_t k_tile, KeyTileRows& rows) {
  const Problem& p = *c.problem;
  const int64_t j0 = k_tile * kTileK;
  if (p.pages != nullptr || p.k.stride(3) != 1 || p.v.stride(3) != 1 || j0 >= p.k_len) return false;
  const int64_t g = p.kv_head(blk.h), count = std::min(kTileK, p.k_len - j0);
  rows = {RowsOf(p.k, blk.b, g, j0, count, p.head_dim),
          RowsOf(p.v, blk.b, g, j0, count, p.value_dim)};
  return true;
}

// The K and V rows of key tile `k_tile`, all at once: for a full tile the block jumps to (BigBird's
// random and global blocks), which no hardware prefetcher foresees. A partial tile jumped to is
// mostly a global key or two (Longformer's spread global tokens): the products read only its
// active rows, and fetching all 64 cost those blocks about 3 % (32 KB of K and V per tile).
inline void PrefetchKeyTile(const Context& c, const Block& blk, int64_t k_tile) {
  KeyTileRows rows;
  if (!RowsOfKeyTile(c, blk, k_tile, rows)) return;
  PrefetchRows(rows.k);
  PrefetchRows(rows.v);
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
  const RowSpan queries =
      RowsOf(p.q, blk.b, blk.h, next, std::min(kTileQ, p.q_len - next), p.head_dim);
  if (queries.contiguous()) stream.start(queries.first, queries.total_bytes());
  const int64_t q_tile = blk.q_first / kTileQ;
  const int64_t end = c.blocks->k_tile_range(blk.b, blk.h, q_tile).end;
  if (c.blocks->k_tile_range(blk.b, blk.h, q_tile + 1).end != end + 1) return;
  KeyTileRows rows;
  if (end * kTileK >= blk.k_end || !RowsOfKeyTile(c, blk, end, rows)) return;
  if (!rows.k.contiguous() || !rows.v.contiguous()) return;
  stream.lines_per_unit = kLinesPerUnitWithKeys;
  stream.add(rows.k.first, rows.k.total_bytes());
  stream.add(rows.v.first, rows.v.total_bytes());
}

// A pair's requests while a key tile computes: key tile `next` (or none, when negative), its K rows
// through the steps of the first block that runs the tile, its V rows through the second's (K
// alone when one block runs it), 4 lines a step unit (prefetch_stream.h); none for paged caches
// or where rows are not contiguous. A tile the walks jump to instead is prefetched whole by
// StepWalk (fused_block.cc).
inline void StartNextKeyTile(const Context& c, const Block& blk, int64_t next, Scratch** running) {
  constexpr int kLinesPerUnit = 4;
  for (int n = 0; n < 2; ++n) {
    if (running[n] != nullptr) running[n]->prefetch.stop();
  }
  KeyTileRows rows;
  if (next < 0 || running[0] == nullptr || !RowsOfKeyTile(c, blk, next, rows)) return;
  if (rows.k.contiguous()) {
    running[0]->prefetch.start(rows.k.first, rows.k.total_bytes(), kLinesPerUnit);
  }
  if (running[1] != nullptr && rows.v.contiguous()) {
    running[1]->prefetch.start(rows.v.first, rows.v.total_bytes(), kLinesPerUnit);
  }
}

}  // namespace maskattn::detail::fused
