// The fused forward kernel's inner loops, compiled once per SIMD target (Highway runtime dispatch).
//
// Design. FlashAttention-2 walks, for one block of queries, the key tiles the mask allows, keeping
// a running row maximum m, a running denominator l and an unnormalised output O:
//
//     S = scale·Q·Kᵀ (tile)   m' = max(m, rowmax S)   P = exp(S − m')   α = exp(m − m')
//     l = α·l + rowsum P      O = α·O + P·V            at the end: O /= l, LSE = m + log l
//
// We hold the block *transposed*, queries across SIMD lanes: Sᵀ[j][i] (kTileK × kTileQ) is
// computed as Σ_d K[j][d]·Qᵀ[d][i] with K[j][d] broadcast straight from K's own rows and Qᵀ packed
// once per block, so no key tile is ever packed or transposed. The softmax reductions then run
// down the columns (element-wise max and add of whole vectors, no horizontal reductions), and
// Oᵀ[e][i] += Σ_j V[j][e]·Pᵀ[j][i] broadcasts V from its own rows too. Both products are register
// blocked 4 rows × 4 vectors (16 accumulators); on AVX-512 one block of 64 queries is 4 vectors,
// and each product measured ~255 GF/s on one core of the project machine (Zen 5, 2026-11-29).
//
// Masks: the block map says per tile empty (never visited), full (no mask work) or partial (bit
// rows from TileMaskBuilder select −inf). A partial tile whose allowed pairs leave 16-query lane
// blocks empty on some keys runs on each block's active keys only (tile_products-inl.h). Score
// modifiers run between the product and the mask.
// The −inf guards are FlashAttention's: a column whose maximum is −inf uses 0 instead, so
// (−inf) − (−inf) never happens, and a row that saw no key ends with l = 0 → O = 0, LSE = −inf.
// NaN or +inf scores flag their row, which then ends as NaN (as the reference propagates them).
//
// The products are the call's product unit's (product_unit.h, one table entry per tile): the
// f32 unit (f32_fma.cc) runs the register-blocked products above, the bf16 units (bf16_dot.cc,
// amx.cc) their own on bf16 pairs; this file owns the loop, the mask, the modifiers and the
// softmax, and a unit that can fold the scale into its softmax step (AMX) gets a software-
// pipelined path below.
//
// Few queries (decoding) waste lanes in this layout: the row kernel (fused_rows.cc) serves them.
// The pieces the kernels share live beside them, one concept per file: convert-inl.h (element
// conversions), score_chain-inl.h (the modifier chain), softmax-inl.h (the online softmax's
// rules), tile_products-inl.h (the f32 products), simd-inl.h (the exp); kernels/README.md says
// how a kernel or a product unit plugs into the driver.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/fused_block.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/convert-inl.h"
#include "kernels/dropout-inl.h"
#include "kernels/fused_block.h"
#include "kernels/kv_rows-inl.h"
#include "kernels/product_unit.h"
#include "kernels/score_chain-inl.h"
#include "kernels/scratch_arena.h"
#include "kernels/simd-inl.h"
#include "kernels/softmax-inl.h"
#include "kernels/tile_prefetch.h"
#include "kernels/tile_products-inl.h"
#include "kernels/transpose-inl.h"

HWY_BEFORE_NAMESPACE();
namespace maskattn::detail::fused {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

static_assert(kTileQ == kChainTileLanes && kTileQ == kProductLanes, "64-query tiles throughout");

// Whether V's tile [j0, j0 + rows) of (b, g) holds only finite values (Context::v_tile_finite),
// checked on the first visit; `buffer` holds a converted row when V is not f32.
bool ValueTileFinite(const Context& c, int64_t b, int64_t g, int64_t k_tile, int64_t j0,
                     int64_t rows, float* buffer) {
  const Problem& p = *c.problem;
  const int64_t k_tiles = (p.k_len + kTileK - 1) / kTileK;
  std::atomic<uint8_t>& flag = c.v_tile_finite[(b * p.kv_heads + g) * k_tiles + k_tile];
  uint8_t known = flag.load(std::memory_order_relaxed);
  if (known == 0 && p.pages == nullptr && p.v.dtype() == DType::f32 && p.v.stride(3) == 1) {
    const float* first = static_cast<const float*>(p.v.data()) + p.v.offset({b, g, j0, 0});
    known = RowsAllFinite(first, rows, p.v.stride(2), p.value_dim) ? 1 : 2;
    flag.store(known, std::memory_order_relaxed);
  }
  if (known == 0) {
    bool finite = true;
    for (int64_t j = j0; j < j0 + rows; ++j) {
      finite &=
          AllFinite(KVRowAsF32(p.v, p.pages, false, b, g, j, p.value_dim, buffer), p.value_dim);
    }
    known = finite ? 1 : 2;
    flag.store(known, std::memory_order_relaxed);
  }
  return known == 1;
}

// ---- tile kernel: mask, finalisation, the loop -------------------------------------------------

// For tests: out[n] = exp(in[n]) through the kernel's exp (count a multiple of 64).
void ExpNonPositiveArray(const float* in, int64_t count, float* out) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t n = 0; n + N <= count; n += N) {
    hn::StoreU(ExpNonPositive(df, hn::LoadU(df, in + n)), df, out + n);
  }
}

// Hidden pairs of a partial tile get −inf (bit i of allowed[j]: query i may see key j), on each
// lane block's active rows (the rows the softmax and P·V will read).
void ApplyMask(const uint64_t* allowed, const ActiveRows& active, float* HWY_RESTRICT s) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const VF minus_inf = hn::Set(df, -INFINITY);
  for (int64_t c = 0; c < kLaneBlocks; ++c) {
    for (int64_t j = active.first[c]; j < active.end[c]; ++j) {
      for (int64_t i = c * kLaneBlock; i < (c + 1) * kLaneBlock; i += N) {
        const VF x = hn::LoadU(df, s + j * kTileQ + i);
        hn::StoreU(hn::IfThenElse(LanesFromBits(df, allowed[j], i), x, minus_inf), df,
                   s + j * kTileQ + i);
      }
    }
  }
}

#if HWY_TARGET != HWY_SCALAR
// out[i][e] = o[e][i] / l[i] for a whole block, a vector of queries at a time: o·(c/l), exactly
// the scalar path's rounding (c = 1, or dropout's 1/(1 − p')). Rows with l = 0 get a factor of 0
// (Finalize fills them, and poisoned rows, afterwards). Squares of 16 queries × 16 dims are
// transposed in registers where the target has it (transpose-inl.h: a scatter per vector cost a
// window of 256 keys about 3 % of its time); other dims are scattered into the rows.
void NormaliseBlock(int64_t value_dim, float keep_scale, const float* HWY_RESTRICT o,
                    const float* HWY_RESTRICT row_sum, float* HWY_RESTRICT out) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t i = 0; i < kTileQ; i += N) {
    const VF l = hn::LoadU(df, row_sum + i);
    const VF inverse =
        hn::IfThenZeroElse(hn::Eq(l, hn::Zero(df)), hn::Div(hn::Set(df, keep_scale), l));
    int64_t e = 0;
#ifdef MASKATTN_HAVE_TRANSPOSE16
    for (; e + 16 <= value_dim; e += 16) {
      TransposeScaledSquare(o + e * kTileQ + i, kTileQ, inverse.raw, out + i * value_dim + e,
                            value_dim);
    }
#endif
    const auto rows = hn::Mul(hn::Iota(di, static_cast<int32_t>(i)),
                              hn::Set(di, static_cast<int32_t>(value_dim)));
    for (; e < value_dim; ++e) {
      hn::ScatterIndex(hn::Mul(hn::LoadU(df, o + e * kTileQ + i), inverse), df, out + e, rows);
    }
  }
}
#endif

// out[i][e] = o[e][i]·c / l[i] (c: dropout's keep scale, else 1), or the fill EndOfRow gives
// (softmax-inl.h); and the LSE (the undropped one: dropout does not touch l).
void Finalize(int64_t q_count, int64_t value_dim, float keep_scale, const float* o,
              const float* row_max, const float* row_sum, const float* poisoned, float* out,
              float* lse) {
#if HWY_TARGET != HWY_SCALAR
  const bool whole_block = q_count == kTileQ;
  if (whole_block) NormaliseBlock(value_dim, keep_scale, o, row_sum, out);
#else
  const bool whole_block = false;
#endif
  for (int64_t i = 0; i < q_count; ++i) {
    const RowEnd end = EndOfRow(row_max[i], row_sum[i], poisoned[i]);
    float* row = out + i * value_dim;
    if (!end.normalise) {
      std::fill(row, row + value_dim, end.fill);
    } else if (!whole_block) {
      const float inverse = keep_scale / row_sum[i];
      for (int64_t e = 0; e < value_dim; ++e) row[e] = o[e * kTileQ + i] * inverse;
    }
    lse[i] = end.lse;
  }
}

// Oᵀ = α·Oᵀ + Vᵀ·Pᵀ for the tile. `finite`: V's tile holds no inf/NaN, so the product unit may
// multiply zero weights; else, whatever the unit, the guarded f32 product skips them, and a hidden
// key's garbage cannot reach the output.
void TileOutput(const Context& c, const Block& blk, int64_t g, int64_t j0, int64_t rows,
                bool finite, const ActiveRows* active, Scratch& scratch) {
  if (finite) {
    c.unit->accumulate(c, blk, g, j0, rows, active, scratch);
    return;
  }
  const Problem& p = *c.problem;
  int64_t v_stride = 0;
  const float* v =
      KVTileRows(p.v, p.pages, false, blk.b, g, j0, rows, p.value_dim, scratch.v, v_stride);
  if (active != nullptr) {
    AccumulateActive<true>(v, v_stride, p.value_dim, scratch.s, scratch.alpha, *active, scratch.o);
  } else {
    Accumulate<true>(v, v_stride, rows, p.value_dim, scratch.s, scratch.alpha, scratch.o);
  }
}

// The modifier chain (score_chain-inl.h) on the tile's Sᵀ[j][i]: keys are rows, queries lanes.
void TileScoreMods(const Context& c, const Block& blk, int64_t j0, int64_t rows,
                   const uint64_t* allowed, bool additive, float* s) {
  TileLayout tile;
  tile.b = blk.b;
  tile.h = blk.h;
  tile.q_first = blk.q_first;
  tile.k_first = j0;
  tile.keys_across_lanes = false;
  tile.rows = rows;
  tile.pair_lanes = blk.q_count;
  tile.allowed = allowed;
  tile.additive = additive;
  ApplyScoreChainToTile(*c.problem->mods, *c.problem->mask, tile, s);
}

// ---- the fused path, software-pipelined (units with raw_scores: AMX) ---------------------------
// Where nothing sits between the products but the mask (no modifiers, a finite V tile, 0 < scale ≤
// 1) a key tile runs as raw scores, the mask, the softmax step with the scale folded in and P
// written in the unit's own layout (amx_softmax.cc), then O += P·V. The P·V of tile k is deferred
// until the scores of tile k + 1 are issued: on AMX a tile load waits for the vector stores it
// reads (P's pairs) to reach the cache, and a vector load for the tile stores it reads (the
// scores), so each hand-off gets the other product's time to complete instead of stalling.

bool FusedPath(const Context& c, const Block& blk, int64_t k_tile, Scratch& scratch) {
  const Problem& p = *c.problem;
  if (c.unit->raw_scores == nullptr || c.score_mods || p.dropout.on ||
      !(p.scale > 0 && p.scale <= 1)) {
    return false;
  }
  const int64_t j0 = k_tile * kTileK;
  return ValueTileFinite(c, blk.b, p.kv_head(blk.h), k_tile, j0, std::min(kTileK, blk.k_end - j0),
                         scratch.v);
}

// Scores of k_tile, then the deferred P·V of tile `pending` (if ≥ 0), then k_tile's mask and
// softmax step; k_tile's own P·V is left for the caller to run later.
void FusedScoresAndWeights(const Context& c, const Block& blk, int64_t k_tile, TileKind kind,
                           int64_t pending, Scratch& scratch) {
  const Problem& p = *c.problem;
  const int64_t j0 = k_tile * kTileK, rows = std::min(kTileK, blk.k_end - j0);
  c.unit->raw_scores(c, blk, p.kv_head(blk.h), j0, rows, scratch);
  if (pending >= 0) c.unit->accumulate_weights(c, blk, pending, scratch);
  if (kind == TileKind::partial) {
    c.tile_masks->build(blk.b, blk.h, blk.q_first, blk.q_count, j0, rows, scratch.allowed);
    ApplyMask(scratch.allowed, AllRows(rows), scratch.s);
  }
  c.unit->raw_softmax_step(c, rows, scratch);
}

// Attention dropout's keep bits of the tile, per key over the block's queries (scratch.keep), from
// the pairs' global rows. The softmax step stores only the kept weights but sums all of them
// (dropout acts on the normalised weights); P·V then skips the dropped pairs, and the kept ones are
// scaled by 1/(1 − p') once, in Finalize.
const uint64_t* TileKeepBits(const Context& c, const Block& blk, int64_t j0, Scratch& scratch) {
  const Problem& p = *c.problem;
  if (!p.dropout.on) return nullptr;
  const auto bh = static_cast<uint32_t>(blk.b * p.q_heads + blk.h);
  DropoutColumnBitsAt(p.dropout, bh, blk.q_first + p.mask->q_origin(), blk.q_count,
                      j0 + p.mask->k_origin(), scratch.keep);
  return scratch.keep;
}

// The rows of a partial tile that the mask, the scores and P·V need look at: BlockMap::key_rows
// narrows a tile beside the windows' band to its global keys (with spread global tokens a block
// meets a dozen such tiles of one key each, and building, scoring and scanning 64 rows for that
// one had cost a tile of the band about a quarter of its time each). Taken only where the tile
// runs on its active rows anyway (the f32 unit, no modifiers or dropout) and the rows left out
// are at least half of it, so that the tile still runs on its active rows: rows outside
// [first, end) hold no allowed pair, so they are outside every lane block's active rows and the
// same arithmetic runs on the same rows either way, in the same order: the same bits.
struct VisitedRows {
  int64_t first = 0, count = 0;
};
VisitedRows RowsToVisit(const Context& c, const Block& blk, int64_t k_tile, int64_t rows) {
  const Problem& p = *c.problem;
  if (!c.unit->active_rows || !c.skip_hidden_rows || c.score_mods || p.dropout.on) {
    return {0, rows};
  }
  const BlockMap::TileRange keys = c.blocks->key_rows(blk.b, blk.h, blk.q_first / kTileQ, k_tile);
  const int64_t count = std::max<int64_t>(keys.end - keys.first, 1);  // ≥ 1 row to build
  if (2 * count > rows) return {0, rows};
  return {std::min(keys.first, rows - count), count};
}

// One key tile of a block: scores, modifiers, mask, one online-softmax step, O += P·V. A partial
// tile whose allowed pairs leave lane blocks empty on some rows (tile_products-inl.h) runs on the
// active rows alone when that saves at least a quarter of the work (units with `active_rows`), and
// so does a full tile of a block with whole lane blocks of no query. Of a partial tile, only the
// rows RowsToVisit keeps are built, scored and summed ([j, j + n) below).
void AttendTile(const Context& c, const Block& blk, int64_t k_tile, TileKind kind,
                Scratch& scratch) {
  const Problem& p = *c.problem;
  const int64_t g = p.kv_head(blk.h);
  const int64_t j0 = k_tile * kTileK;
  const int64_t rows = std::min(kTileK, blk.k_end - j0);
  const VisitedRows visit =
      kind == TileKind::partial ? RowsToVisit(c, blk, k_tile, rows) : VisitedRows{0, rows};
  const int64_t j = j0 + visit.first, n = visit.count;
  const uint64_t* allowed = nullptr;
  ActiveRows active_rows;
  const ActiveRows* active = nullptr;
  if (kind == TileKind::partial) {
    c.tile_masks->build(blk.b, blk.h, blk.q_first, blk.q_count, j, n, scratch.allowed);
    allowed = scratch.allowed;
    if (c.unit->active_rows && c.skip_hidden_rows) {
      active_rows = FindActiveRows(allowed, n);
      if (4 * active_rows.rows <= 3 * kLaneBlocks * rows) active = &active_rows;
    }
  } else if (blk.q_count <= kTileQ - kLaneBlock && c.unit->active_rows && c.skip_hidden_rows) {
    active_rows = LeadingLaneBlocks(blk.q_count, rows);  // lane blocks with no query left out
    active = &active_rows;
  }
  c.unit->scores(c, blk, g, j, n, active, scratch);
  if (c.score_mods) {
    const bool additive = p.mask->has_additive() && kind == TileKind::partial;
    TileScoreMods(c, blk, j, n, allowed, additive, scratch.s);
  }
  if (allowed != nullptr) ApplyMask(allowed, active != nullptr ? *active : AllRows(n), scratch.s);
  SoftmaxStepColumns<kTileQ>(scratch.s, n, scratch.row_max, scratch.row_sum, scratch.alpha,
                             scratch.poisoned, active != nullptr ? active->first : nullptr,
                             active != nullptr ? active->end : nullptr, kLaneBlock,
                             TileKeepBits(c, blk, j, scratch));
  // The whole tile's finiteness, as a tile visited whole would see it (the guarded product's
  // rounding differs from the FMA's, so this decides bits).
  const bool finite = ValueTileFinite(c, blk.b, g, k_tile, j0, rows, scratch.v);
  TileOutput(c, blk, g, j, n, finite, active, scratch);
}

// The block's first non-empty key tile in [from, end) (`end` when there is none), and its kind.
// Past an empty tile the block map says where the next non-empty one can be at the earliest.
struct VisitedTile {
  int64_t k_tile;
  TileKind kind;
};
VisitedTile NextVisitedTile(const Context& c, const Block& blk, int64_t q_tile, int64_t from,
                            int64_t end) {
  while (from < end) {
    const TileKind kind = c.blocks->kind(blk.b, blk.h, q_tile, from);
    if (kind != TileKind::empty) return {from, kind};
    from = c.blocks->next_candidate(blk.b, blk.h, q_tile, from + 1);
  }
  return {end, TileKind::empty};
}

// A block's walk over its key tiles: the next one to visit, and where they end.
struct BlockWalk {
  int64_t q_tile = 0, k_tile_end = 0;
  VisitedTile next{0, TileKind::empty};
  bool done() const { return next.k_tile >= k_tile_end; }
};

// Starts a block: its queries in the unit's layout, the softmax's start, O = 0, its first tile.
BlockWalk BeginBlock(const Context& c, const Block& blk, Scratch& scratch) {
  const Problem& p = *c.problem;
  BlockWalk walk;
  walk.q_tile = blk.q_first / kTileQ;
  const BlockMap::TileRange band = c.blocks->k_tile_range(blk.b, blk.h, walk.q_tile);
  walk.k_tile_end = std::min(band.end, (blk.k_end + kTileK - 1) / kTileK);
  c.unit->begin_block(c, blk, scratch);
  scratch.prefetch.stop();  // AttendBlock and AttendBlockPair start it
  SoftmaxStart(p, blk.h, blk.with_sink, scratch.row_max, scratch.row_sum, scratch.poisoned, kTileQ);
  std::memset(scratch.o, 0, p.value_dim * kTileQ * sizeof(float));
  walk.next = NextVisitedTile(c, blk, walk.q_tile, std::max(band.first, blk.k_first / kTileK),
                              walk.k_tile_end);
  return walk;
}

// The walk's next tile, stepped past; a full tile the walk then jumps to is prefetched.
VisitedTile StepWalk(const Context& c, const Block& blk, BlockWalk& walk) {
  const VisitedTile tile = walk.next;
  walk.next = NextVisitedTile(c, blk, walk.q_tile, tile.k_tile + 1, walk.k_tile_end);
  if (!walk.done() && walk.next.k_tile != tile.k_tile + 1 && walk.next.kind == TileKind::full) {
    PrefetchKeyTile(c, blk, walk.next.k_tile);
  }
  return tile;
}

// Ends a block: the unit's block state released, the rows normalised into scratch.out/lse.
void FinishBlock(const Context& c, const Block& blk, Scratch& scratch) {
  if (c.unit->end_block != nullptr) c.unit->end_block();
  Finalize(blk.q_count, c.problem->value_dim, c.problem->dropout.keep_scale_f32, scratch.o,
           scratch.row_max, scratch.row_sum, scratch.poisoned, scratch.out, scratch.lse);
}

// The tile kernel: the FlashAttention-2 loop of the essay above over the block's key tiles.
void AttendBlock(const Context& c, const Block& blk, Scratch& scratch) {
  const ProductUnit& unit = *c.unit;
  BlockWalk walk = BeginBlock(c, blk, scratch);
  StartNextBlock(c, blk, scratch.prefetch);
  int64_t pending = -1;  // the fused path's key tile whose P·V is still to come
  while (!walk.done()) {
    const VisitedTile tile = StepWalk(c, blk, walk);
    if (FusedPath(c, blk, tile.k_tile, scratch)) {
      FusedScoresAndWeights(c, blk, tile.k_tile, tile.kind, pending, scratch);
      pending = tile.k_tile;
      continue;
    }
    if (pending >= 0) unit.accumulate_weights(c, blk, pending, scratch);
    pending = -1;
    AttendTile(c, blk, tile.k_tile, tile.kind, scratch);
  }
  if (pending >= 0) unit.accumulate_weights(c, blk, pending, scratch);
  FinishBlock(c, blk, scratch);
}

// Two blocks of one head against the same key tiles, tile by tile: each K and V tile is read
// from the caches once for both. At long N a head's K and V no longer fit in L2, and a block
// alone re-reads them from L3 (dense N = 16384 ran at 77–79 GF/s per thread against 93 at
// N = 4096). Each block meets its own tiles in its own order with its own scratch: the same bits
// as AttendBlock for each. Units whose blocks hold state outside the scratch (end_block) or run
// the software-pipelined path (raw_scores) are not paired (fused.cc).
void AttendBlockPair(const Context& c, const Block* blk, Scratch* scratch) {
  BlockWalk walk[2] = {BeginBlock(c, blk[0], scratch[0]), BeginBlock(c, blk[1], scratch[1])};
  while (!walk[0].done() || !walk[1].done()) {
    // The lower of the two next tiles: both blocks run it when both visit it.
    const int64_t k_tile = std::min(walk[0].done() ? INT64_MAX : walk[0].next.k_tile,
                                    walk[1].done() ? INT64_MAX : walk[1].next.k_tile);
    VisitedTile tile[2] = {{-1, TileKind::empty}, {-1, TileKind::empty}};
    Scratch* running[2] = {nullptr, nullptr};  // the scratch of each block that runs the tile
    int count = 0;
    for (int n = 0; n < 2; ++n) {
      if (walk[n].done() || walk[n].next.k_tile != k_tile) continue;
      tile[n] = StepWalk(c, blk[n], walk[n]);
      running[count++] = &scratch[n];
    }
    // The tile the walks go to next, requested while this one runs when it is the adjacent one.
    const int64_t next = std::min(walk[0].done() ? INT64_MAX : walk[0].next.k_tile,
                                  walk[1].done() ? INT64_MAX : walk[1].next.k_tile);
    StartNextKeyTile(c, blk[0], next == k_tile + 1 ? next : -1, running);
    for (int n = 0; n < 2; ++n) {
      if (tile[n].k_tile == k_tile) AttendTile(c, blk[n], k_tile, tile[n].kind, scratch[n]);
    }
  }
  for (int n = 0; n < 2; ++n) FinishBlock(c, blk[n], scratch[n]);
}

// store_row over `rows` rows `row_stride` elements apart, from values `values_stride` apart: one
// dispatch and no offset arithmetic per row (a block's 64 rows, which a sliding window writes every
// five tiles).
void StoreRows(const MutableTensorView& t, int64_t offset, int64_t row_stride, int64_t stride,
               const float* values, int64_t values_stride, int64_t rows, int64_t count) {
  for (int64_t r = 0; r < rows; ++r) {
    StoreRow(t, offset + r * row_stride, stride, values + r * values_stride, count);
  }
}

uint64_t DropoutRowBitsForTest(const DropoutRule& rule, uint32_t bh, int64_t q, int64_t kv) {
  return DropoutRowBitsAt(rule, bh, q, kv);
}

void DropoutColumnBitsForTest(const DropoutRule& rule, uint32_t bh, int64_t q0, int64_t q_count,
                              int64_t kv, uint64_t* keep) {
  DropoutColumnBitsAt(rule, bh, q0, q_count, kv, keep);
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::detail::fused
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace maskattn::detail::fused {

HWY_EXPORT(AttendBlock);
HWY_EXPORT(AttendBlockPair);
HWY_EXPORT(DropoutRowBitsForTest);
HWY_EXPORT(DropoutColumnBitsForTest);

uint64_t dropout_row_bits(const DropoutRule& rule, uint32_t bh, int64_t q, int64_t kv) {
  return HWY_DYNAMIC_DISPATCH(DropoutRowBitsForTest)(rule, bh, q, kv);
}

void dropout_column_bits(const DropoutRule& rule, uint32_t bh, int64_t q0, int64_t q_count,
                         int64_t kv, uint64_t* keep) {
  HWY_DYNAMIC_DISPATCH(DropoutColumnBitsForTest)(rule, bh, q0, q_count, kv, keep);
}
HWY_EXPORT(ExpNonPositiveArray);

void exp_non_positive(const float* in, int64_t count, float* out) {
  HWY_DYNAMIC_DISPATCH(ExpNonPositiveArray)(in, count, out);
}
HWY_EXPORT(ConvertRowsToF32);

// The OpenMP loops live here, outside the per-target code: clang 14 crashes compiling OpenMP
// regions inside Highway's target-attributed namespaces (seen building the fuzzers).
void convert_to_f32(const TensorView& t, float* out, int threads, int64_t out_stride) {
  if (out_stride < 0) out_stride = t.size(3);
  const int64_t rows = t.size(0) * t.size(1) * t.size(2);
  constexpr int64_t kRowsPerTask = 64;
  const int64_t tasks = (rows + kRowsPerTask - 1) / kRowsPerTask;
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : omp_get_max_threads())
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t first = task * kRowsPerTask;
    HWY_DYNAMIC_DISPATCH(ConvertRowsToF32)
    (t, first, std::min(kRowsPerTask, rows - first), out, out_stride);
  }
}
HWY_EXPORT(StoreRow);

void store_row(const MutableTensorView& t, int64_t offset, int64_t stride, const float* values,
               int64_t count) {
  HWY_DYNAMIC_DISPATCH(StoreRow)(t, offset, stride, values, count);
}
HWY_EXPORT(StoreRows);

void store_rows(const MutableTensorView& t, int64_t offset, int64_t row_stride, int64_t stride,
                const float* values, int64_t values_stride, int64_t rows, int64_t count) {
  HWY_DYNAMIC_DISPATCH(StoreRows)
  (t, offset, row_stride, stride, values, values_stride, rows, count);
}

void attend_block(const Context& context, const Block& block, Scratch& scratch) {
  HWY_DYNAMIC_DISPATCH(AttendBlock)(context, block, scratch);
}

void attend_block_pair(const Context& context, const Block* blocks, Scratch* scratch) {
  HWY_DYNAMIC_DISPATCH(AttendBlockPair)(context, blocks, scratch);
}

void Scratch::reserve(int64_t head_dim, int64_t value_dim, int64_t unit_bytes) {
  if (head_dim <= head_dim_ && value_dim <= value_dim_ && unit_bytes <= unit_bytes_) return;
  head_dim_ = std::max(head_dim, head_dim_);
  value_dim_ = std::max(value_dim, value_dim_);
  unit_bytes_ = std::max(unit_bytes, unit_bytes_);
  const int64_t d = head_dim_, dv = value_dim_;
  float* unit_floats = nullptr;
  carve_scratch(storage_, {{&q_t, d * kTileQ},
                           {&q_rows, kTileQ * d},
                           {&k, kTileK * d},
                           {&v, kTileK * dv},
                           {&s, kTileK * kTileQ},
                           {&o, dv * kTileQ},
                           {&row_max, kTileQ},
                           {&row_sum, kTileQ},
                           {&alpha, kTileQ},
                           {&out, kTileQ * dv},
                           {&lse, kTileQ},
                           {&poisoned, kTileQ},
                           {&unit_floats, (unit_bytes_ + 3) / 4}});
  unit = unit_floats;
  bits_.assign(kTileQ + 3 * kTileK, 0);
  allowed = bits_.data();
  keep = allowed + kTileQ + kTileK;
}

}  // namespace maskattn::detail::fused
#endif  // HWY_ONCE
