// Draft trees (mask/tree.h) in the block map and the tile masks.
//
// A tree splits a problem in two. Against the prefix keys it is a bottom-right causal mask in
// rows, which the block map classifies from the corners of a block like any causal mask. Against
// the draft keys (the last T) only draft queries see anything, and which pairs they see depends
// on the tree: those blocks, at most ⌈T/64⌉ + 1 per side, are classified by counting their
// allowed pairs once per BlockMap (the draft-by-draft part of a problem is T × T pairs at most,
// which the kernels then compute anyway). A block straddling the draft's first key gets both
// parts' verdicts combined.
#pragma once

#include <cstdint>
#include <vector>

#include "mask/resolved_mask.h"
#include "mask/scan_cache.h"
#include "mask/tree.h"

namespace maskattn::detail {

class TreeTiles {
 public:
  // Tiles of tile_q × tile_k over the call's rows from the frame's offsets, as BlockMap cuts them.
  TreeTiles(const ResolvedMask& mask, int64_t tile_q, int64_t tile_k);

  // The trees' verdict on block (q_tile, k_tile) of sequence b for head h: global rows
  // [q_first, q_end) × [k_first, k_end). Full when no tree applies to h.
  TileKind kind(int64_t b, int64_t h, int64_t q_tile, int64_t k_tile, int64_t q_first,
                int64_t q_end, int64_t k_first, int64_t k_end) const;

  // The last key row that queries up to row q_last may see under the trees of head h (they are
  // causal in rows); INT64_MAX when no tree applies to h.
  int64_t last_key(int64_t h, int64_t q_last) const;

 private:
  // One tree, with the kinds of the blocks that hold both draft queries and draft keys: [rows,
  // q_tiles, k_tiles] from tile (q_tile0, k_tile0) on, counting only the block's draft keys.
  struct Entry {
    const component::Tree* tree;
    TreePlacement at;
    int64_t q_tile0 = 0, k_tile0 = 0, q_tiles = 0, k_tiles = 0;
    std::vector<TileKind> draft_kinds;
  };

  void count_draft_blocks(Entry& entry) const;

  const ResolvedMask& mask_;
  int64_t tile_q_, tile_k_;
  std::vector<Entry> entries_;
};

// ANDs the bit rows of every tree of head h into allowed[0, k_count) (TileMaskBuilder's layout:
// bit i of allowed[n] is query q_first + i against key k_first + n; global rows, q_count ≤ 64).
void and_tree_bits(const ResolvedMask& mask, int64_t b, int64_t h, int64_t q_first, int64_t q_count,
                   int64_t k_first, int64_t k_count, uint64_t* allowed);

}  // namespace maskattn::detail
