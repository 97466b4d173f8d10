// A product unit of the fused tile kernels, described once: the table the drivers consult.
//
// The tile kernels (fused_block.cc forward, fused_backward_block.cc backward) own the loop, the
// mask, the score modifiers and the online softmax; a product unit owns the products and whatever
// layout they want their operands in: what is packed once per call, once per block of queries and
// once per tile, the per-thread buffers those operands live in (carved by the unit from the
// drivers' untyped Scratch::unit / BackwardScratch::unit, sized by its thread_bytes), and the
// products themselves. Each unit is one `ProductUnit` defined in its own
// file (kF32Unit in f32_fma.cc, kBf16DotUnit in bf16_dot.cc, kAmxUnit in amx.cc), and
// product_unit() (products.cc) holds the one table row per `Products` value that finds it. The
// drivers call through these pointers once per tile or block, never per element: a 64 × 64 tile's
// products are ≥ 0.2 Mflop, next to which an indirect call is nothing.
//
// Rules every unit keeps (kernels/README.md):
//   - Its arithmetic depends on the shapes only, never on the thread count.
//   - `accumulate` is only called for a V tile known finite (Context::v_tile_finite): it may
//     multiply zero weights. The driver takes the guarded f32 product for any other tile,
//     whatever the unit, so a hidden key's inf or NaN never reaches the output.
//   - Scores are left in Scratch::s as Sᵀ[j][i] (keys rows, queries lanes, kTileQ floats apart),
//     scaled, so that the modifiers, the mask and the softmax step (softmax-inl.h) run unchanged.
#pragma once

#include <cstdint>

#include "kernels/active_rows.h"
#include "kernels/problem.h"
#include "maskattn/attention.h"
#include "maskattn/tensor.h"

namespace maskattn::detail::fused {

struct Context;
struct Block;
struct Scratch;
struct BackwardContext;
struct BackwardItem;
struct BackwardPair;
struct BackwardScratch;

struct ProductUnit {
  const char* name;  // as products_name() spells it
  // Whether the unit takes Q, K and V with these head dims; `contiguous_rows`: their last axes
  // have unit stride. tile_products() (products.cc) falls back to another unit when not.
  bool (*fits)(int64_t head_dim, int64_t value_dim, bool contiguous_rows);

  // ---- per thread, reserved once and kept across calls ----
  // Bytes of the unit's own per-thread operands for these head dims (forward; backward): the
  // drivers reserve them as Scratch::unit and BackwardScratch::unit, 64-byte aligned, and the unit
  // carves its buffers from there by a layout in its own file (scratch_arena.h's ScratchCarver,
  // from the call's head dims). Null: the unit needs none.
  int64_t (*thread_bytes)(int64_t head_dim, int64_t value_dim);
  int64_t (*backward_thread_bytes)(int64_t head_dim, int64_t value_dim);

  // ---- forward, once per call (fused.cc) ----
  // Bytes `prepare` will allocate, for the memory check made before anything is allocated.
  double (*call_bytes)(const Problem& p);
  // Packs what every block reads (in buffers the calling thread keeps); may replace p.k and p.v
  // by copies. Returns what the per-tile entries find in Context::prepared (null: nothing).
  const void* (*prepare)(Problem& p);

  // ---- forward, once per block of queries (fused_block.cc) ----
  // Loads the block's queries into the unit's layout (and takes any per-block state it needs).
  void (*begin_block)(const Context& c, const Block& blk, Scratch& scratch);
  void (*end_block)();  // releases that state; null: nothing to release

  // ---- forward, once per key tile [j0, j0 + rows) of kv head g ----
  // scratch.s = Sᵀ, scaled. `active` (non-null only for units with `active_rows`): only the
  // scores each lane block reads are needed.
  void (*scores)(const Context& c, const Block& blk, int64_t g, int64_t j0, int64_t rows,
                 const ActiveRows* active, Scratch& scratch);
  // Oᵀ = α·Oᵀ + Vᵀ·Pᵀ, P in scratch.s and α in scratch.alpha, for a finite V tile.
  void (*accumulate)(const Context& c, const Block& blk, int64_t g, int64_t j0, int64_t rows,
                     const ActiveRows* active, Scratch& scratch);
  bool active_rows;  // the products can run on a partial tile's active rows alone

  // ---- forward, optional: a fused, software-pipelined tile (all three or none) ----
  // Where nothing sits between the products but the mask (no modifiers, a finite V tile,
  // 0 < scale ≤ 1) the driver runs a tile as: raw_scores (Sᵀ unscaled), the previous tile's
  // deferred accumulate_weights, the mask, raw_softmax_step (the step with the scale folded in,
  // leaving P in the unit's own layout), and defers this tile's accumulate_weights until the next
  // tile's scores are issued (amx.cc's essay says why that pays).
  void (*raw_scores)(const Context& c, const Block& blk, int64_t g, int64_t j0, int64_t rows,
                     Scratch& scratch);
  void (*raw_softmax_step)(const Context& c, int64_t rows, Scratch& scratch);
  void (*accumulate_weights)(const Context& c, const Block& blk, int64_t k_tile, Scratch& scratch);

  // ---- backward (fused_backward.cc, fused_backward_block.cc) ----
  // A unit whose `backward_scores` is null has no backward products: its calls take the f32
  // unit's. So does, whatever the unit, a tile pair whose inputs are not all finite (the f32
  // products skip zero weights there), and the driver packs the f32 unit's key operands (scale·Kᵀ,
  // Vᵀ, K's rows: BackwardScratch) for every key tile so that such a pair can run at any time.
  // Whether the unit takes a backward call (beyond `fits`); null: whenever `fits` does.
  bool (*backward_fits)(const Problem& p);
  // Bytes and packing once per call, as for the forward; `dout` is dO as the caller passed it.
  // `backward_prepare` returns what the entries find in BackwardContext::prepared.
  double (*backward_call_bytes)(const Problem& p);
  const void* (*backward_prepare)(const Problem& p, const TensorView& dout, int threads);
  // Around the pairs of key tile [j0, j0 + rows) of (b, g): the unit's own key operands and
  // accumulators, and after the pairs their dK, dV added into sc.dk, sc.dv (unscaled, one row per
  // key). Null: nothing (the products accumulate into sc.dk, sc.dv directly).
  void (*begin_key_tile)(const BackwardContext& c, int64_t b, int64_t g, int64_t j0, int64_t rows,
                         BackwardScratch& sc);
  void (*end_key_tile)(const BackwardContext& c, BackwardScratch& sc);
  // One tile pair (fused_backward_block.cc's essay): sc.s = S = Q·(scale·K)ᵀ [q_count][64], or
  // unscaled for a unit with `backward_weights`.
  void (*backward_scores)(const BackwardContext& c, const BackwardPair& pair, BackwardScratch& sc);
  // Optional: P = exp(scale·S − LSE) in place from the unscaled, masked S, where no modifier sits
  // between the product and the weights (with modifiers the driver scales S and takes the generic
  // weights).
  void (*backward_weights)(const BackwardContext& c, const BackwardPair& pair, BackwardScratch& sc);
  // sc.ds = dP = dO·Vᵀ.
  void (*backward_dp)(const BackwardContext& c, const BackwardPair& pair, BackwardScratch& sc);
  // From P (sc.s) and dS (sc.ds): dV_j += Σ_i P_ij·dO_i, dK_j += Σ_i dS_ij·Q_i (into sc.dk, sc.dv
  // or the unit's own accumulators) and the item's dQ partial += dS·K.
  void (*backward_accumulate)(const BackwardContext& c, const BackwardItem& item,
                              const BackwardPair& pair, BackwardScratch& sc);
};

extern const ProductUnit kF32Unit;      // f32_fma.cc
extern const ProductUnit kBf16DotUnit;  // bf16_dot.cc
extern const ProductUnit kAmxUnit;      // amx.cc

// The unit of a resolved `Products` value (not automatic: tile_products() resolves it first).
const ProductUnit& product_unit(Products products);

}  // namespace maskattn::detail::fused
