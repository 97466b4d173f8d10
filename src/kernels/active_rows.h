// The active rows of a partial tile (tile_products-inl.h's essay): per 16-query lane block, the key
// rows holding any allowed pair. Plain C++, not per SIMD target: the tile kernel finds them and
// hands them to its product unit (product_unit.h) through the unit's table.
#pragma once

#include <algorithm>
#include <cstdint>

namespace maskattn::detail::fused {

inline constexpr int64_t kProductLanes = 64;  // queries of a tile: kTileQ
inline constexpr int64_t kLaneBlock = 16;     // queries per lane block (one AVX-512 vector)
inline constexpr int64_t kLaneBlocks = kProductLanes / kLaneBlock;

// Per lane block c of a partial tile: key rows [first[c], end[c]) hold every allowed pair of its
// queries (first == end: none). `rows` is the sum of the blocks' row counts.
struct ActiveRows {
  int64_t first[kLaneBlocks];
  int64_t end[kLaneBlocks];
  int64_t rows = 0;
};

// Every lane block on all `rows` rows: a tile taken whole.
inline ActiveRows AllRows(int64_t rows) {
  ActiveRows all;
  for (int64_t c = 0; c < kLaneBlocks; ++c) {
    all.first[c] = 0;
    all.end[c] = rows;
  }
  all.rows = kLaneBlocks * rows;
  return all;
}

// A block of `queries` < kProductLanes queries (the end of a sequence, gathered global-token rows):
// the lane blocks holding one on all `rows` rows, the others on none.
inline ActiveRows LeadingLaneBlocks(int64_t queries, int64_t rows) {
  ActiveRows active;
  active.rows = 0;
  for (int64_t c = 0; c < kLaneBlocks; ++c) {
    active.first[c] = 0;
    active.end[c] = c * kLaneBlock < queries ? rows : 0;
    active.rows += active.end[c];
  }
  return active;
}

// From the bit rows of a partial tile (bit i of allowed[j]: query i may see key j).
inline ActiveRows FindActiveRows(const uint64_t* allowed, int64_t rows) {
  ActiveRows active;
  active.rows = 0;
  for (int64_t c = 0; c < kLaneBlocks; ++c) {
    const uint64_t lanes = uint64_t{0xFFFF} << (c * kLaneBlock);
    int64_t first = rows, end = 0;
    for (int64_t j = 0; j < rows; ++j) {
      if ((allowed[j] & lanes) == 0) continue;
      first = std::min(first, j);
      end = j + 1;
    }
    active.first[c] = first < end ? first : 0;
    active.end[c] = first < end ? end : 0;
    active.rows += active.end[c] - active.first[c];
  }
  return active;
}

}  // namespace maskattn::detail::fused
