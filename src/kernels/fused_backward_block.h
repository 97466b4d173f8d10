// The fused backward's unit of work: one chunk of key tiles of one (b, kv head), walked against
// every query tile the mask lets see it (FlashAttention-2's backward, docs/design.md §4). Compiled
// once per SIMD target (Highway) and dispatched at run time; see fused_backward_block.cc for the
// design.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/problem.h"
#include "kernels/product_unit.h"
#include "kernels/transpose_bits.h"
#include "mask/block_map.h"
#include "mask/tile_mask.h"

namespace maskattn::detail::fused {

inline constexpr int64_t kBackwardTile = 64;  // queries per q-tile and keys per k-tile

// Rows of a [B, H, L, W] tensor as f32 with unit inner stride: the tensor itself when it is f32
// with contiguous rows, else a converted copy.
struct F32Rows {
  const float* data = nullptr;
  int64_t stride_b = 0, stride_h = 0, stride_l = 0;
  const float* row(int64_t b, int64_t h, int64_t l) const {
    return data + b * stride_b + h * stride_h + l * stride_l;
  }
};

// Read-only state shared by every work item of one call, plus the accumulators items own parts of.
struct BackwardContext {
  const Problem* problem = nullptr;
  const BlockMap* blocks = nullptr;
  const TileMaskBuilder* tile_masks = nullptr;
  F32Rows q, dout;  // rows readable to dq_width and dv_width floats (zero-padded copies if needed)
  const float* lse = nullptr;    // [B, Hq, Lq] contiguous copy of the forward's LSE
  const float* delta = nullptr;  // [B, Hq, Lq] D_i = Σ_e dO_ie·O_ie (0 for rows without keys)
  // [B, Hq, q_tiles]: 1 when the tile's Q and dO rows are all finite, so that 0·x = 0 and the
  // products need no guard against NaN from hidden pairs.
  const uint8_t* q_tile_finite = nullptr;
  bool score_mods = false;  // softcap, ALiBi, bias, a program, threshold or additive masks
  int64_t chunks = 1;       // key tiles are dealt round-robin to this many chunks
  int64_t dq_width = 0;     // D rounded up to a multiple of 16: row width of dq_partial
  int64_t dv_width = 0;     // Dv rounded up likewise
  // [chunks][B][Hq][Lq][dq_width]: each chunk's unscaled Σ_j dS_ij·K_j, summed in chunk order.
  float* dq_partial = nullptr;
  float* dbias = nullptr;  // the bias's shape, row-major, f32: Σ dS over its broadcast axes
  MutableTensorView dk, dv;
  // The product unit (product_unit.h; the f32 unit for any unit without backward products) and
  // what its backward_prepare packed once per call.
  const ProductUnit* unit = nullptr;
  const void* prepared = nullptr;
  TensorView dout_input;  // dO as the caller passed it (any dtype and strides)
};

// Batches [b_first, b_end) × kv heads [g_first, g_end) × the key tiles t with t % chunks == chunk.
// Items cover more than one (b, kv head) only when dbias broadcasts across them.
struct BackwardItem {
  int64_t b_first = 0, b_end = 0, g_first = 0, g_end = 0, chunk = 0;
  int64_t cost = 0;  // non-empty tile pairs, for scheduling
};

// One (query tile, key tile) pair of head h: queries [q_first, q_first + q_count), keys
// [j0, j0 + rows). `guarded`: its inputs hold inf or NaN, so the products skip zero weights.
struct BackwardPair {
  int64_t b = 0, h = 0, q_tile = 0, q_first = 0, q_count = 0, k_tile = 0, j0 = 0, rows = 0;
  bool guarded = false;
};

// One thread's working memory: the f32 tiles (the f32 unit's key operands, packed for every key
// tile) and the product unit's own operands; kept across calls (first-touch page faults are
// expensive here).
struct BackwardScratch {
  // Grows to these head dims and `unit_bytes` of unit operands (never shrinks).
  void reserve(int64_t head_dim, int64_t value_dim, int64_t unit_bytes);

  float* k_t = nullptr;             // [D][64]  scale·Kᵀ of the key tile
  float* k_rows = nullptr;          // [64][dq_width]  K rows, zero padded (when not read in place)
  const float* k_source = nullptr;  // K rows of the current tile for dQ: k_rows or K itself
  int64_t k_source_stride = 0;
  float* v_t = nullptr;         // [Dv][64] Vᵀ
  float* s = nullptr;           // [64][64] scores, then P
  float* ds = nullptr;          // [64][64] dP, then dS
  float* cap_grad = nullptr;    // [64][64] 1 − tanh²(s/cap) with softcap
  float* program_in = nullptr;  // [64][64] the scores entering a score program
  // The current item's table-gradient buffers (TableGradients::Lease), or null.
  double* const* table_grads = nullptr;
  float* dk = nullptr;       // [64][dq_width] Σ_i dS_ij·Q_i of the key tile, one row per key
  float* dv = nullptr;       // [64][dv_width] Σ_i P_ij·dO_i
  float* row = nullptr;      // [max(D, Dv)]
  uint64_t* bits = nullptr;  // [64 + 64] a partial tile's mask, per key then per query
  uint64_t* keep = nullptr;  // [64] dropout's keep bits of a tile pair, per query
  // The product unit's own operands (ProductUnit::backward_thread_bytes), 64-byte aligned, the
  // arena's last piece: the unit's file carves them (amx.cc: bf16 pairs, transposed accumulators).
  void* unit = nullptr;

 private:
  int64_t head_dim_ = -1, value_dim_ = -1, unit_bytes_ = -1;
  std::vector<float> storage_;
  std::vector<uint64_t> bits_;
};

void backward_item(const BackwardContext& context, const BackwardItem& item,
                   BackwardScratch& scratch);

// D_i = Σ_e dO_ie·O_ie over the nonzero O_ie (a row whose keys are all hidden has O = 0, also
// with a sink, and its dO may be anything, even NaN, without reaching D or the sink's gradient),
// and whether the row's Q and dO are all finite.
struct RowDelta {
  float delta;
  bool finite;
};
RowDelta row_delta_of(const float* dout, const float* o, int64_t value_dim, const float* q,
                      int64_t head_dim);

}  // namespace maskattn::detail::fused
