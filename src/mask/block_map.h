// The block map (docs/design.md §4): every (query tile, key tile) block of a problem is empty, full
// or partial. Structured components are classified in O(1) from the tile's corner positions (and
// per-tile summaries of per-token arrays); dense masks and predicates by one scan, cached in the
// Mask. A kernel skips empty blocks, runs no mask code on full ones and the element mask on
// partial ones, so its cost follows the allowed pairs, not Lq·Lk.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "mask/resolved_mask.h"
#include "mask/scan_cache.h"
#include "mask/tree_tiles.h"

namespace maskattn::detail {

class BlockMap {
 public:
  // `skipping` false classifies every block as partial (for tests: the same results must come
  // out with no block skipped and no mask work left out).
  // `global_queries_apart` classifies as if no query were a global token: a caller that computes
  // the global rows apart (GlobalRows in kernels/fused.cc) keeps their blocks to their bands. Only
  // for masks whose global queries see every key (global_queries_see_every_key).
  BlockMap(const ResolvedMask& mask, int64_t tile_q, int64_t tile_k, bool skipping = true,
           bool global_queries_apart = false);

  // Whether a query that is a global token sees every key of the call: the mask holds windows and
  // global tokens only (no padding, chunk, span, prefix-LM, segment, dense, additive, predicate,
  // program, layout or tree component).
  static bool global_queries_see_every_key(const ResolvedMask& mask);
  // The call's query rows that are global tokens for head h of sequence b, ascending.
  static std::vector<int64_t> global_query_rows(const ResolvedMask& mask, int64_t b, int64_t h);

  int64_t tile_q() const { return tile_q_; }
  int64_t tile_k() const { return tile_k_; }
  int64_t q_tiles() const { return q_tiles_; }
  int64_t k_tiles() const { return k_tiles_; }

  TileKind kind(int64_t b, int64_t h, int64_t q_tile, int64_t k_tile) const;

  // Tiles cover the call's rows; these are their global rows [first, end) (a call with a frame
  // starts at the frame's offsets, mask.h), which every classification below works in.
  int64_t q_origin() const { return mask_.q_origin(); }
  int64_t k_origin() const { return mask_.k_origin(); }
  int64_t q_first(int64_t q_tile) const { return q_origin() + q_tile * tile_q_; }
  int64_t k_first(int64_t k_tile) const { return k_origin() + k_tile * tile_k_; }
  int64_t q_end(int64_t q_tile) const {
    return std::min(q_origin() + mask_.shape().q_len, q_first(q_tile) + tile_q_);
  }
  int64_t k_end(int64_t k_tile) const {
    return std::min(k_origin() + mask_.shape().k_len, k_first(k_tile) + tile_k_);
  }

  // Key tiles [first, end) outside which every block of this query tile is empty, from the
  // structured components in O(1): a causal or windowed query tile visits only its band.
  struct TileRange {
    int64_t first, end;
  };
  TileRange k_tile_range(int64_t b, int64_t h, int64_t q_tile) const;

  // A key tile ≥ k_tile before which every block of this query tile is empty (k_tile itself when
  // nothing is known): a kernel that met an empty tile jumps here instead of asking kind() of each
  // tile in between, which for Longformer's global keys or BigBird's layout is most of the row.
  int64_t next_candidate(int64_t b, int64_t h, int64_t q_tile, int64_t k_tile) const;

  // Key rows [first, end) of the tile, counted from its first key, outside which no query of the
  // query tile may see a key; the whole tile when that is not known in O(log L). Known for masks of
  // windows and global tokens only (global_queries_see_every_key): the windows' band widened to
  // the tile's first and last global key, or the whole tile when the query tile holds a global
  // query (its row sees every key, whether or not the kernel computes it apart). A tile beside the
  // band holding one global key is one row, which is all a kernel then needs to mask and score.
  TileRange key_rows(int64_t b, int64_t h, int64_t q_tile, int64_t k_tile) const;

  struct Range {
    int64_t lo, hi;  // inclusive
  };

 private:
  // Real tokens counted by prefix sums, for keep-vector and token-id padding: count of real
  // tokens among [0, t) of sequence b is prefix[b * (L + 1) + t].
  struct PaddingCounts {
    const component::Padding* padding;
    std::vector<int64_t> prefix;
  };

  // Global tokens: prefix counts of global queries and keys per sequence ([rows, L + 1], rows = B
  // or 1), and per sequence the first and last global key (lo > hi when there is none).
  struct GlobalCounts {
    const component::GlobalTokens* global;
    std::vector<int64_t> queries, keys;
    std::vector<Range> key_span;
  };
  // Per block-sparse layout and mask program, per (b, h, query tile) of its scanned kinds: the key
  // tiles from the first to the last non-empty one.
  struct LayoutRows {
    std::shared_ptr<const ScannedKinds> kinds;
    std::vector<TileRange> rows;
    TileRange at(int64_t b, int64_t h, int64_t q_tile) const {
      const int64_t bb = kinds->batch == 1 ? 0 : b, hh = kinds->heads == 1 ? 0 : h;
      return rows[(bb * kinds->heads + hh) * kinds->q_tiles + q_tile];
    }
  };

  ScanGrid grid() const;  // the cache key of this map's scans
  void count_global_tokens();
  void classify_layouts();
  LayoutRows rows_of(std::shared_ptr<const ScannedKinds> kinds) const;
  // Global tokens allow pairs of the block the windows hide: full when every query or every key
  // of the block is global, partial when some is, empty otherwise.
  TileKind global_kind(int64_t b, int64_t h, int64_t q_first, int64_t q_end, int64_t k_first,
                       int64_t k_end) const;
  // Dense masks, predicates and programs: their blocks classified by one scan of the data (cached
  // in the Mask, so later calls for the same problem size do not rescan).
  void scan_data_components();
  TileKind padding_kind(const component::Padding& padding, const PaddingCounts* counts, int64_t b,
                        int64_t first, int64_t end, int64_t length) const;
  TileKind order_kind(int64_t b, int64_t h, int64_t q_first, int64_t q_end, int64_t k_first,
                      int64_t k_end) const;
  // Spans or prefix-LM may allow pairs of head h anywhere outside the windows.
  bool windows_relaxed(int64_t h) const;
  // `keys` (global rows) narrowed to the keys inside every window of head h for some query of the
  // tile (unchanged when windows_relaxed).
  Range window_band(int64_t b, int64_t h, int64_t q_tile, Range keys) const;
  bool holds_global_query(const GlobalCounts& counts, int64_t b, int64_t q_tile) const;
  int64_t next_global_candidate(int64_t b, int64_t h, int64_t q_tile, int64_t k_tile) const;

  const ResolvedMask& mask_;
  int64_t tile_q_, tile_k_, q_tiles_, k_tiles_;
  bool skipping_;
  bool global_queries_apart_;
  std::vector<PaddingCounts> query_counts_, key_counts_;
  // Per segment component: [B, q_tiles] and [B, k_tiles] id ranges.
  std::vector<std::vector<Range>> segment_q_, segment_k_;
  std::vector<std::shared_ptr<const ScannedKinds>> scanned_;  // layouts included
  std::vector<GlobalCounts> global_counts_;
  std::vector<LayoutRows> layout_rows_;
  TreeTiles trees_;
};

}  // namespace maskattn::detail
