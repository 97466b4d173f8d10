// The fused kernel's unit of work: one block of queries of one (b, h) against a range of keys,
// computed tile by tile with an online softmax (FlashAttention-2), never materialising more than
// one kTileK × kTileQ block of scores. Compiled once per SIMD target (Highway) and dispatched at
// run time; see fused_block.cc (tile kernel) and fused_rows.cc (row kernel) for the designs.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "kernels/prefetch_stream.h"
#include "kernels/problem.h"
#include "kernels/product_unit.h"
#include "mask/block_map.h"
#include "mask/tile_mask.h"

namespace maskattn::detail::fused {

inline constexpr int64_t kTileQ = 64;    // queries per block: one bit each in a partial-tile mask
inline constexpr int64_t kTileK = 64;    // keys per tile
inline constexpr int64_t kMaxRows = 32;  // rows of one attend_rows() call

// One thread's working memory: the kernels' f32 tiles, and the product unit's own operands. Kept
// across calls (thread_local in the driver) because the first touch of a fresh page costs
// 11–16 µs on this VM.
struct Scratch {
  // Grows to these head dims and `unit_bytes` of unit operands (never shrinks).
  void reserve(int64_t head_dim, int64_t value_dim, int64_t unit_bytes);

  float* q_t = nullptr;         // [D][kTileQ]       scaled queries, transposed (tile kernel)
  float* q_rows = nullptr;      // [kTileQ][D]       scaled query rows (row kernel)
  float* k = nullptr;           // [kTileK][D]       keys converted to f32 when they are not
  float* v = nullptr;           // [kTileK][Dv]      values likewise
  float* s = nullptr;           // [kTileK][kTileQ]  scores, then weights
  float* o = nullptr;           // [Dv][kTileQ]      unnormalised output (tile kernel, transposed)
  float* row_max = nullptr;     // [kTileQ]
  float* row_sum = nullptr;     // [kTileQ]
  float* alpha = nullptr;       // [kTileQ]          rescale factor of the current tile
  float* poisoned = nullptr;    // [kTileQ]          1 for rows that met a NaN or +inf score
  float* out = nullptr;         // [kTileQ][Dv]      normalised output rows of the block
  float* lse = nullptr;         // [kTileQ]
  uint64_t* allowed = nullptr;  // [kTileQ + kTileK] bit rows of a partial tile
  uint64_t* keep = nullptr;     // [2·kTileK] dropout's keep bits of a tile (and the next group)
  // What the f32 products' steps prefetch as they run (prefetch_stream.h): the next block's
  // queries, or for a pair of blocks the next key tile's K (first block) or V (second).
  PrefetchStream prefetch;
  // The product unit's own operands (ProductUnit::thread_bytes), 64-byte aligned, the arena's last
  // piece: the unit's file carves them (bf16 query and weight pairs, a bf16 key tail, …).
  void* unit = nullptr;

 private:
  int64_t head_dim_ = -1, value_dim_ = -1, unit_bytes_ = -1;
  std::vector<float> storage_;
  std::vector<uint64_t> bits_;
};

// Read-only state shared by every block of one call.
struct Context {
  const Problem* problem = nullptr;
  const BlockMap* blocks = nullptr;
  const TileMaskBuilder* tile_masks = nullptr;
  // [B, Hkv, k_tiles], all 0 at the start: per V tile, 1 once known to hold only finite values
  // (a weight of 0 times a value is then 0, and the fast P·V product may run over hidden keys),
  // 2 once known not to. Filled on first use by whichever thread gets there: the answer is the
  // tile's own, so it does not depend on which. A separate pass over all of V cost a band mask
  // (a sliding window reads only its band) 5 % of its time.
  std::atomic<uint8_t>* v_tile_finite = nullptr;
  bool score_mods = false;  // softcap, ALiBi, bias, score_fn, threshold or additive masks present
  // Partial tiles may run on their active rows only (tile_products-inl.h). Off together with
  // block skipping, so that tests compare the skipping kernel with the plain one bitwise.
  bool skip_hidden_rows = true;
  // The unit of the tile kernel's two products (product_unit.h, chosen by cpu.h's tile_products),
  // and what its `prepare` packed once per call (its file describes the layout; null for none).
  const ProductUnit* unit = nullptr;
  const void* prepared = nullptr;
};

// Queries [q_first, q_first + q_count) of (b, h), all in one kTileQ-aligned block (tile kernel),
// or of the rows listed (row kernel); keys [k_first, k_end), k_first a multiple of kTileK.
struct Block {
  int64_t b = 0, h = 0, q_first = 0, q_count = 0;
  int64_t k_first = 0, k_end = 0;
  bool with_sink = true;  // false for a key chunk whose partial result is merged later
};

// All rows of a [B, H, L, W] view (any dtype, any strides) as f32 rows in `out`, `out_stride`
// floats apart (default W; a larger stride zero-fills each row's tail), on `threads` threads
// (0 = all).
void convert_to_f32(const TensorView& t, float* out, int threads, int64_t out_stride = -1);

// Writes `count` f32 values to a view of any dtype, `stride` elements apart, rounding to nearest
// even (vectorised for contiguous rows).
void store_row(const MutableTensorView& t, int64_t offset, int64_t stride, const float* values,
               int64_t count);
// store_row for `rows` rows: row r from values + r·values_stride to offset + r·row_stride.
void store_rows(const MutableTensorView& t, int64_t offset, int64_t row_stride, int64_t stride,
                const float* values, int64_t values_stride, int64_t rows, int64_t count);

// The softmax's exp for arguments x ≤ 0 or −inf, as the kernels compute it (count a multiple of
// kTileQ). For tests of its accuracy.
void exp_non_positive(const float* in, int64_t count, float* out);

// Dropout's keep bits as the kernels make them (kernels/dropout-inl.h), for tests of their
// agreement with core/dropout.h: bit j of the result is pair (q, kv + j); keep[j] bit i is pair
// (q0 + i, kv + j), j < 64, i < q_count ≤ 64; `keep` has room for 128 words.
uint64_t dropout_row_bits(const DropoutRule& rule, uint32_t bh, int64_t q, int64_t kv);
void dropout_column_bits(const DropoutRule& rule, uint32_t bh, int64_t q0, int64_t q_count,
                         int64_t kv, uint64_t* keep);

// Tile kernel (queries across SIMD lanes): results in scratch.out [q_count][Dv] (normalised, 0 for
// rows without keys) and scratch.lse [q_count].
void attend_block(const Context& context, const Block& block, Scratch& scratch);
// Two blocks of one (b, h) at once, each with its own scratch: each K and V tile read once for
// both (long key bands); the same results as attend_block on each. Only for units without
// end_block or raw_scores.
void attend_block_pair(const Context& context, const Block* blocks, Scratch* scratch);

// Row kernel (fused_rows.cc) for a few queries (D across SIMD lanes, memory-bound decoding): rows
// are (head, query) pairs of one batch entry that share kv head g (row_count ≤ kMaxRows); same
// outputs, one row each.
struct Row {
  int64_t h, i;
};
void attend_rows(const Context& context, int64_t b, const Row* rows, int64_t row_count,
                 int64_t k_first, int64_t k_end, bool with_sink, Scratch& scratch);

}  // namespace maskattn::detail::fused
