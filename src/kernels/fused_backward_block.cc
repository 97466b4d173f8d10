// The fused backward kernel's inner loops, compiled once per SIMD target (Highway runtime
// dispatch).
//
// Design (FlashAttention-2's backward, docs/design.md §4). A work item owns key tiles: for each of
// its 64-key tiles it walks every 64-query tile of every query head sharing the kv head, in a fixed
// order, recomputing the scores and weights from the forward's LSE instead of storing them:
//
//     S = Q·(scale·K)ᵀ   (+ modifiers, mask)        P = exp(S − LSE)
//     dP = dO·Vᵀ         dS = P∘(dP − D)            D_i = Σ_e dO_ie·O_ie (precomputed per row)
//     dV += Pᵀ·dO        dK += dSᵀ·Q                dQ_chunk += dS·K
//
// dK and dV of the tile belong to the item alone (no atomics); dQ gets one partial per chunk of
// key tiles, summed in chunk order by the driver, so the result does not depend on the threads.
//
// Layout: a tile pair is held as S[i][j], keys across SIMD lanes (64 keys = 4 vectors on AVX-512).
// All five products are then one shape, C[r][x] (+)= Σ_p A(r, p)·B[p][x], with A read as
// broadcast scalars (Q, dO rows; P, dS by rows or by columns) and B whole rows (scale·Kᵀ and Vᵀ
// packed per key tile here; K, Q, dO rows read in place, padded to a multiple of 16 floats).
// dK and dV come out one row per key.
//
// Products: the call's product unit computes them (product_unit.h, one table entry per tile pair
// step): the f32 unit (f32_fma.cc) register blocked 4 rows × 4 vectors like the forward's, the
// AMX unit (amx.cc) on tiles with P and dS rounded to bf16, its scale folded into the exp. This
// file owns the walk, the modifiers, the mask, the weights and dS; a pair with non-finite inputs
// takes the f32 unit's products whatever the call's unit.
//
// Dropout (core/dropout.h): the pair's keep bits are regenerated from the seed, never stored.
// With Z the kept pairs and c = 1/(1 − p'), the forward's O = (c·Z∘P)·V, so dV = (c·Z∘P)ᵀ·dO and
// ∂L/∂P = c·Z∘(dO·Vᵀ); the softmax's backward then runs on the undropped P as always, with
// D_i = Σ_e dO_ie·O_ie = Σ_j P_ij·∂L/∂P_ij still (O being the dropped output). So dP is masked and
// scaled before dS, and P after it, before the products that read it.
//
// Hidden pairs: P = 0 there (the mask writes −inf before the exp) and dS is selected to 0, so no
// gradient flows through them. When a tile holds non-finite inputs (padding garbage), the
// products also skip zero weights, so that 0·inf cannot turn into NaN.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/fused_backward_block.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/element.h"
#include "kernels/convert-inl.h"
#include "kernels/dropout-inl.h"
#include "kernels/fused_backward_block.h"
#include "kernels/fused_block.h"
#include "kernels/product_unit.h"
#include "kernels/score_chain-inl.h"
#include "kernels/scratch_arena.h"
#include "kernels/simd-inl.h"
#include "kernels/transpose-inl.h"

HWY_BEFORE_NAMESPACE();
namespace maskattn::detail::fused {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr int64_t T = kBackwardTile;
static_assert(T == kChainTileLanes, "the modifier chain walks 64-lane tile rows");

#ifdef MASKATTN_HAVE_TRANSPOSE16
// out[c][j] = factor·in[j][c] for a whole tile of f32 rows (T rows `stride` apart, `width` a
// multiple of 16), 16 × 16 squares transposed in registers (transpose-inl.h): stored one value
// at a time, the packing of a short sequence's single key tile cost more than its products (a
// training step of the tiny GPT, context 64, spent 8 % of its time here).
void TransposeTile(const float* in, int64_t stride, int64_t width, float factor, float* out) {
  const __m512 f = _mm512_set1_ps(factor);
  for (int64_t j = 0; j < T; j += 16) {
    for (int64_t c = 0; c < width; c += 16) {
      TransposeScaledSquare(in + j * stride + c, stride, f, out + c * T + j, T);
    }
  }
}

// PackKeyTile for a whole tile of f32 K and V with contiguous rows and dims in 16s.
bool PackWholeKeyTile(const BackwardContext& c, int64_t b, int64_t g, int64_t j0,
                      BackwardScratch& sc) {
  const Problem& p = *c.problem;
  const float* k = static_cast<const float*>(p.k.data()) + p.k.offset({b, g, j0, 0});
  const float* v = static_cast<const float*>(p.v.data()) + p.v.offset({b, g, j0, 0});
  sc.k_source = k;
  sc.k_source_stride = p.k.stride(2);
  // scale·k is the scalar path's f32 product: the same bits.
  TransposeTile(k, p.k.stride(2), p.head_dim, static_cast<float>(p.scale), sc.k_t);
  TransposeTile(v, p.v.stride(2), p.value_dim, 1.0f, sc.v_t);
  return RowsAllFinite(k, T, p.k.stride(2), p.head_dim) &&
         RowsAllFinite(v, T, p.v.stride(2), p.value_dim);
}
#endif

// Packs key tile [j0, j0 + rows) of (b, g): scale·Kᵀ and Vᵀ, zero beyond `rows`, and points
// sc.k_source at K's rows for dQ (in place when K is f32 with contiguous rows and D a multiple
// of 16, else a zero-padded copy). Returns whether K and V of the tile are all finite.
bool PackKeyTile(const BackwardContext& c, int64_t b, int64_t g, int64_t j0, int64_t rows,
                 BackwardScratch& sc) {
  const Problem& p = *c.problem;
  const int64_t dim = p.head_dim, value_dim = p.value_dim;
  const bool in_place = p.k.dtype() == DType::f32 && p.k.stride(3) == 1 && dim == c.dq_width;
#ifdef MASKATTN_HAVE_TRANSPOSE16
  if (in_place && rows == T && dim > 0 && dim % 16 == 0 && value_dim > 0 && value_dim % 16 == 0 &&
      p.v.dtype() == DType::f32 && p.v.stride(3) == 1) {
    return PackWholeKeyTile(c, b, g, j0, sc);
  }
#endif
  std::memset(sc.k_t, 0, dim * T * sizeof(float));
  std::memset(sc.v_t, 0, value_dim * T * sizeof(float));
  if (in_place) {
    sc.k_source =
        dim > 0 ? static_cast<const float*>(p.k.data()) + p.k.offset({b, g, j0, 0}) : sc.k_rows;
    sc.k_source_stride = p.k.stride(2);
  } else {
    std::memset(sc.k_rows, 0, T * c.dq_width * sizeof(float));
    sc.k_source = sc.k_rows;
    sc.k_source_stride = c.dq_width;
  }
  const float scale = static_cast<float>(p.scale);
  bool finite = true;
  for (int64_t j = 0; j < rows; ++j) {
    const float* k_row = dim == 0 ? sc.row : RowAsF32(p.k, b, g, j0 + j, dim, sc.row);
    if (!in_place) std::copy_n(k_row, dim, sc.k_rows + j * c.dq_width);
    finite &= AllFinite(k_row, dim);
    for (int64_t d = 0; d < dim; ++d) sc.k_t[d * T + j] = scale * k_row[d];
    const float* v_row = value_dim == 0 ? sc.row : RowAsF32(p.v, b, g, j0 + j, value_dim, sc.row);
    finite &= AllFinite(v_row, value_dim);
    for (int64_t e = 0; e < value_dim; ++e) sc.v_t[e * T + j] = v_row[e];
  }
  return finite;
}

// dK_j = scale·(Σ_i dS_ij·Q_i) and dV_j, rounded once into the outputs' dtype.
void StoreKeyTile(const BackwardContext& c, int64_t b, int64_t g, int64_t j0, int64_t rows,
                  BackwardScratch& sc) {
  const Problem& p = *c.problem;
  const float scale = static_cast<float>(p.scale);
  for (int64_t j = 0; j < rows; ++j) {
    float* dk = sc.dk + j * c.dq_width;
    for (int64_t d = 0; d < p.head_dim; ++d) dk[d] *= scale;
  }
  // One call per tensor: no dispatch and offset per row.
  store_rows(c.dk, c.dk.offset({b, g, j0, 0}), c.dk.stride(2), c.dk.stride(3), sc.dk, c.dq_width,
             rows, p.head_dim);
  store_rows(c.dv, c.dv.offset({b, g, j0, 0}), c.dv.stride(2), c.dv.stride(3), sc.dv, c.dv_width,
             rows, p.value_dim);
}

// The modifier chain (score_chain-inl.h) on rows [0, q_count) of the tile's S[i][j]: queries
// are rows, keys lanes; softcap also leaves its derivative in cap_grad. `row_bits` (per query,
// bit j = key j allowed) is null for a full tile.
void ApplyScoreMods(const BackwardContext& c, int64_t b, int64_t h, int64_t q_first,
                    int64_t q_count, int64_t j0, int64_t rows, const uint64_t* row_bits,
                    bool additive, float* HWY_RESTRICT s, float* HWY_RESTRICT cap_grad,
                    float* HWY_RESTRICT program_in) {
  TileLayout tile;
  tile.b = b;
  tile.h = h;
  tile.q_first = q_first;
  tile.k_first = j0;
  tile.keys_across_lanes = true;
  tile.rows = q_count;
  tile.pair_lanes = rows;
  tile.allowed = row_bits;
  tile.additive = additive;
  tile.cap_grad = cap_grad;
  tile.program_input = program_in;
  ApplyScoreChainToTile(*c.problem->mods, *c.problem->mask, tile, s);
}

// Hidden pairs and keys past the tile's end get −inf; `row_bits` null means all keys allowed.
void ApplyMask(const uint64_t* row_bits, int64_t q_count, int64_t rows, float* HWY_RESTRICT s) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF minus_inf = hn::Set(df, -INFINITY);
  const uint64_t in_tile = rows == 64 ? ~uint64_t{0} : (uint64_t{1} << rows) - 1;
  for (int64_t i = 0; i < q_count; ++i) {
    const uint64_t bits = (row_bits != nullptr ? row_bits[i] : ~uint64_t{0}) & in_tile;
    for (size_t j = 0; j < static_cast<size_t>(T); j += N) {
      const VF x = hn::LoadU(df, s + i * T + j);
      hn::StoreU(hn::IfThenElse(LanesFromBits(df, bits, j), x, minus_inf), df, s + i * T + j);
    }
  }
}

// P = exp(S − LSE_i) in place; a row without keys (LSE −inf) gets P = 0. NaN (from NaN inputs or
// a NaN LSE) stays NaN, so that it reaches the gradients as it reached the forward's output;
// `finite_scores` (finite Q and K) lets rows with a finite LSE skip that check.
void Weights(const float* lse, int64_t q_count, bool finite_scores, float* HWY_RESTRICT s) {
  const DF df;
  const size_t N = hn::Lanes(df);
  for (int64_t i = 0; i < q_count; ++i) {
    if (lse[i] == -INFINITY) {
      std::memset(s + i * T, 0, T * sizeof(float));
      continue;
    }
    const VF row_lse = hn::Set(df, lse[i]);
    const bool check_nan = !finite_scores || !std::isfinite(lse[i]);
    for (size_t j = 0; j < static_cast<size_t>(T); j += N) {
      // ≤ 0 up to rounding when LSE is this row's; capped so that a foreign LSE cannot overflow
      // the exponent bits.
      const VF x = hn::Min(hn::Sub(hn::LoadU(df, s + i * T + j), row_lse), hn::Set(df, 88.0f));
      const VF w = ExpNonPositive(df, x);
      hn::StoreU(check_nan ? hn::IfThenElse(hn::IsNaN(x), x, w) : w, df, s + i * T + j);
    }
  }
}

// dS = P∘(dP − D_i) in place of dP, exactly 0 where P is 0 (hidden pairs), then back through the
// chain: the score program (its derivative, and its tables' gradients), the bias (dbias: it sits
// after softcap), softcap's derivative.
void ScoreGradients(const BackwardContext& c, int64_t b, int64_t h, int64_t q_first,
                    int64_t q_count, int64_t j0, int64_t rows, const float* HWY_RESTRICT pw,
                    const float* delta, const BackwardScratch& sc, float* HWY_RESTRICT ds) {
  const float* HWY_RESTRICT cap_grad = sc.cap_grad;
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF zero = hn::Zero(df);
  for (int64_t i = 0; i < q_count; ++i) {
    const VF d = hn::Set(df, delta[i]);
    for (size_t j = 0; j < static_cast<size_t>(T); j += N) {
      const VF w = hn::LoadU(df, pw + i * T + j);
      const VF g = hn::Mul(w, hn::Sub(hn::LoadU(df, ds + i * T + j), d));
      hn::StoreU(hn::IfThenElseZero(hn::Ne(w, zero), g), df, ds + i * T + j);
    }
  }
  const ResolvedMods& mods = *c.problem->mods;
  if (mods.program != nullptr && q_count > 0 && rows > 0) {
    mods.program->score_tile_backward(mods.program_tile(b, h, q_first, q_count, j0, rows, true, T),
                                      sc.program_in, ds, sc.table_grads);
  }
  if (c.dbias != nullptr) {
    for (int64_t i = 0; i < q_count; ++i) {
      for (int64_t j = 0; j < rows; ++j) {
        c.dbias[mods.bias_offset(b, h, q_first + i, j0 + j)] += ds[i * T + j];
      }
    }
  }
  if (mods.softcap) {
    for (int64_t i = 0; i < q_count; ++i) {
      for (size_t j = 0; j < static_cast<size_t>(T); j += N) {
        const VF g = hn::Mul(hn::LoadU(df, ds + i * T + j), hn::LoadU(df, cap_grad + i * T + j));
        hn::StoreU(g, df, ds + i * T + j);
      }
    }
  }
}

// A partial tile's mask as bit rows per query (bit j: key j allowed) in sc.bits; null for a
// full tile.
const uint64_t* TileRowBits(const BackwardContext& c, int64_t b, int64_t h, int64_t q_first,
                            int64_t q_count, int64_t j0, int64_t rows, TileKind kind,
                            BackwardScratch& sc) {
  if (kind != TileKind::partial) return nullptr;
  std::memset(sc.bits, 0, T * sizeof(uint64_t));
  c.tile_masks->build(b, h, q_first, q_count, j0, rows, sc.bits);
  transpose_bits(sc.bits);
  return sc.bits;
}

// The tile pair's scores (in sc.s, scaled) become weights: modifiers, mask, P = exp(S − LSE).
void ScoresToWeights(const BackwardContext& c, int64_t b, int64_t h, int64_t q_first,
                     int64_t q_count, int64_t j0, int64_t rows, TileKind kind, bool guarded,
                     BackwardScratch& sc) {
  const Problem& p = *c.problem;
  const uint64_t* row_bits = TileRowBits(c, b, h, q_first, q_count, j0, rows, kind, sc);
  if (c.score_mods) {
    const bool additive = p.mask->has_additive() && kind == TileKind::partial;
    ApplyScoreMods(c, b, h, q_first, q_count, j0, rows, row_bits, additive, sc.s, sc.cap_grad,
                   sc.program_in);
  }
  if (row_bits != nullptr || rows < T) ApplyMask(row_bits, q_count, rows, sc.s);
  Weights(c.lse + (b * p.q_heads + h) * p.q_len + q_first, q_count, !guarded, sc.s);
}

void ScaleRows(float scale, int64_t rows, float* HWY_RESTRICT s) {
  const DF df;
  const VF factor = hn::Set(df, scale);
  for (int64_t n = 0; n < rows * T; n += static_cast<int64_t>(hn::Lanes(df))) {
    hn::StoreU(hn::Mul(factor, hn::LoadU(df, s + n)), df, s + n);
  }
}

// The pair's dropout keep bits by query row (bit j: key j0 + j kept) in sc.keep, from the pairs'
// global rows: the forward's bits exactly (core/dropout.h defines them per pair, not per tile).
void DropoutBits(const BackwardContext& c, const BackwardPair& pair, BackwardScratch& sc) {
  const Problem& p = *c.problem;
  const auto bh = static_cast<uint32_t>(pair.b * p.q_heads + pair.h);
  DropoutTileRows(p.dropout, bh, pair.q_first + p.mask->q_origin(), pair.q_count,
                  pair.j0 + p.mask->k_origin(), sc.keep);
}

// One (query tile, key tile) pair; the key tile is packed in the scratch (the f32 unit's operands,
// and the unit's own). Its products are the call's unit's, or the f32 unit's for a guarded pair.
void TilePair(const BackwardContext& c, const BackwardItem& item, const BackwardPair& pair,
              TileKind kind, BackwardScratch& sc) {
  const Problem& p = *c.problem;
  const ProductUnit& unit = pair.guarded ? kF32Unit : *c.unit;
  const int64_t b = pair.b, h = pair.h, q_first = pair.q_first, q_count = pair.q_count;
  const int64_t j0 = pair.j0, rows = pair.rows;
  const int64_t row0 = (b * p.q_heads + h) * p.q_len + q_first;

  // S = Q·(scale·K)ᵀ, then the modifiers and the mask, then P = exp(S − LSE).
  unit.backward_scores(c, pair, sc);
  if (unit.backward_weights != nullptr && !c.score_mods) {
    // The scale folds into the exp (the unit's), after the mask's −inf.
    const uint64_t* row_bits = TileRowBits(c, b, h, q_first, q_count, j0, rows, kind, sc);
    if (row_bits != nullptr || rows < T) ApplyMask(row_bits, q_count, rows, sc.s);
    unit.backward_weights(c, pair, sc);
  } else {
    // The modifiers see scaled scores.
    if (unit.backward_weights != nullptr) ScaleRows(static_cast<float>(p.scale), q_count, sc.s);
    ScoresToWeights(c, b, h, q_first, q_count, j0, rows, kind, pair.guarded, sc);
  }

  // dP = dO·Vᵀ (with dropout: c·Z∘dP), then dS = P∘(dP − D) (then P ← c·Z∘P for dV).
  unit.backward_dp(c, pair, sc);
  if (p.dropout.on) {
    DropoutBits(c, pair, sc);
    ApplyDropoutRows(sc.keep, q_count, p.dropout.keep_scale_f32, sc.ds);
  }
  ScoreGradients(c, b, h, q_first, q_count, j0, rows, sc.s, c.delta + row0, sc, sc.ds);
  if (p.dropout.on) ApplyDropoutRows(sc.keep, q_count, p.dropout.keep_scale_f32, sc.s);

  // dV_j += Σ_i P_ij·dO_i   dK_j += Σ_i dS_ij·Q_i   dQ_chunk,i += Σ_j dS_ij·K_j
  unit.backward_accumulate(c, item, pair, sc);
}

RowDelta RowDeltaImpl(const float* dout, const float* o, int64_t value_dim, const float* q,
                      int64_t head_dim) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const VF zero = hn::Zero(df);
  VF sum = zero;
  int64_t e = 0;
  for (; e + N <= value_dim; e += N) {
    const VF ov = hn::LoadU(df, o + e);
    sum = hn::Add(sum, hn::IfThenElseZero(hn::Ne(ov, zero), hn::Mul(hn::LoadU(df, dout + e), ov)));
  }
  float delta = hn::GetLane(hn::SumOfLanes(df, sum));
  for (; e < value_dim; ++e) {
    if (o[e] != 0.0f) delta += dout[e] * o[e];
  }
  return {delta, AllFinite(q, head_dim) && AllFinite(dout, value_dim)};
}

void BackwardItemImpl(const BackwardContext& c, const BackwardItem& item, BackwardScratch& sc) {
  const Problem& p = *c.problem;
  const int64_t group = p.q_heads / p.kv_heads;
  const int64_t q_tiles = (p.q_len + T - 1) / T, k_tiles = (p.k_len + T - 1) / T;
  const ProductUnit& unit = *c.unit;
  for (int64_t b = item.b_first; b < item.b_end; ++b) {
    for (int64_t g = item.g_first; g < item.g_end; ++g) {
      for (int64_t k_tile = item.chunk; k_tile < k_tiles; k_tile += c.chunks) {
        const int64_t j0 = k_tile * T, rows = std::min(T, p.k_len - j0);
        const bool kv_finite = PackKeyTile(c, b, g, j0, rows, sc);
        std::memset(sc.dk, 0, T * c.dq_width * sizeof(float));
        std::memset(sc.dv, 0, T * c.dv_width * sizeof(float));
        if (unit.begin_key_tile != nullptr) unit.begin_key_tile(c, b, g, j0, rows, sc);
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          for (int64_t q_tile = 0; q_tile < q_tiles; ++q_tile) {
            const TileKind kind = c.blocks->kind(b, h, q_tile, k_tile);
            if (kind == TileKind::empty) continue;
            BackwardPair pair;
            pair.b = b;
            pair.h = h;
            pair.q_tile = q_tile;
            pair.q_first = q_tile * T;
            pair.q_count = std::min(T, p.q_len - pair.q_first);
            pair.k_tile = k_tile;
            pair.j0 = j0;
            pair.rows = rows;
            pair.guarded = !kv_finite || !c.q_tile_finite[(b * p.q_heads + h) * q_tiles + q_tile];
            TilePair(c, item, pair, kind, sc);
          }
        }
        if (unit.end_key_tile != nullptr) unit.end_key_tile(c, sc);
        StoreKeyTile(c, b, g, j0, rows, sc);
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::detail::fused
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace maskattn::detail::fused {

HWY_EXPORT(BackwardItemImpl);
HWY_EXPORT(RowDeltaImpl);

RowDelta row_delta_of(const float* dout, const float* o, int64_t value_dim, const float* q,
                      int64_t head_dim) {
  return HWY_DYNAMIC_DISPATCH(RowDeltaImpl)(dout, o, value_dim, q, head_dim);
}

void backward_item(const BackwardContext& context, const BackwardItem& item,
                   BackwardScratch& scratch) {
  HWY_DYNAMIC_DISPATCH(BackwardItemImpl)(context, item, scratch);
}

void BackwardScratch::reserve(int64_t head_dim, int64_t value_dim, int64_t unit_bytes) {
  if (head_dim <= head_dim_ && value_dim <= value_dim_ && unit_bytes <= unit_bytes_) return;
  head_dim_ = std::max(head_dim, head_dim_);
  value_dim_ = std::max(value_dim, value_dim_);
  unit_bytes_ = std::max(unit_bytes, unit_bytes_);
  const int64_t d = head_dim_, e = value_dim_, T = kBackwardTile;
  const int64_t d_padded = (d + 15) / 16 * 16, e_padded = (e + 15) / 16 * 16;
  float* unit_floats = nullptr;
  carve_scratch(storage_, {{&k_t, d * T},
                           {&k_rows, T * d_padded},
                           {&v_t, e * T},
                           {&s, T * T},
                           {&ds, T * T},
                           {&cap_grad, T * T},
                           {&program_in, T * T},
                           {&dk, T * d_padded},
                           {&dv, T * e_padded},
                           {&row, std::max(d_padded, e_padded)},
                           {&unit_floats, (unit_bytes_ + 3) / 4}});
  unit = unit_floats;
  bits_.assign(3 * T, 0);
  bits = bits_.data();
  keep = bits + 2 * T;
}

}  // namespace maskattn::detail::fused
#endif  // HWY_ONCE
