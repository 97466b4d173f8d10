// The score-modifier chain (score_chain.h) on a 64 × 64 tile of f32 scores, one SIMD vector at a
// time: the arithmetic of the forward and backward tile kernels. Compiled once per Highway target
// (the "-inl.h" convention).
//
// The two kernels hold their tiles transposed to each other: the forward keeps Sᵀ[j][i] (queries
// across the lanes), the backward S[i][j] (keys across the lanes). A TileLayout says which, so
// one function serves both: element (r, x) of the tile sits at s[r·64 + x]; r is a key and x a
// query in the forward, the other way round in the backward.
//
// softcap, ALiBi and the threshold are computed on whole vectors (lanes of hidden pairs and past
// the tile's end included: the mask overwrites them). bias, additive masks and score_fn read
// per-pair data and run lane by lane, on the allowed pairs only.
#if defined(MASKATTN_KERNELS_SCORE_CHAIN_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MASKATTN_KERNELS_SCORE_CHAIN_INL_H_
#undef MASKATTN_KERNELS_SCORE_CHAIN_INL_H_
#else
#define MASKATTN_KERNELS_SCORE_CHAIN_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/score_chain.h"

HWY_BEFORE_NAMESPACE();
namespace maskattn::detail::fused {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// This target's copy of the chain's order (see score_chain_steps.h for why it is a copy).
#include "kernels/score_chain_steps.h"

inline constexpr int64_t kChainTileLanes = 64;  // the tile's width: kTileQ and kBackwardTile

// Where a tile sits and which of its pairs the per-pair steps may touch.
struct TileLayout {
  int64_t b = 0, h = 0;
  int64_t q_first = 0, k_first = 0;   // the pair of element (0, 0)
  bool keys_across_lanes = false;     // backward S[i][j]; false: forward Sᵀ[j][i]
  int64_t rows = 0;                   // rows r of the tile to modify
  int64_t pair_lanes = 0;             // per-pair steps only for lanes x < pair_lanes
  const uint64_t* allowed = nullptr;  // per row r, bit x = pair allowed; null: all allowed
  bool additive = false;              // additive masks apply to this tile
  float* cap_grad = nullptr;          // if not null: ∂softcap/∂s per element, for the backward
  float* program_input = nullptr;     // if not null: the scores entering the program (backward)
};

// The f32 vector arithmetic of the chain, positioned at row r, lanes [x0, x0 + N) of a tile.
template <class DF>
struct TileScoreChain {
  using Score = hn::Vec<DF>;

  const ResolvedMods& mods;
  const ResolvedMask& mask;
  const TileLayout& tile;
  DF df;
  int64_t r = 0, x0 = 0;
  float distance_base = 0.0f;  // qpos − kpos at (r, 0), with ALiBi

  void set_row(int64_t row) {
    r = row;
    if (mods.alibi_slopes == nullptr) return;  // the distance serves ALiBi alone
    const int64_t q = tile.q_first + (tile.keys_across_lanes ? r : 0);
    const int64_t k = tile.k_first + (tile.keys_across_lanes ? 0 : r);
    distance_base = static_cast<float>(mask.qpos(tile.b, q) - mask.kpos(tile.b, k));
  }

  Score softcap(Score s) const {
    const float cap = static_cast<float>(*mods.softcap);
    const Score t = hn::Tanh(df, hn::Mul(s, hn::Set(df, 1.0f / cap)));
    if (tile.cap_grad != nullptr) {  // ∂(cap·tanh(s/cap))/∂s = 1 − tanh²(s/cap)
      hn::StoreU(hn::NegMulAdd(t, t, hn::Set(df, 1.0f)), df,
                 tile.cap_grad + r * kChainTileLanes + x0);
    }
    return hn::Mul(hn::Set(df, cap), t);
  }
  // score −= slope[h]·|qpos − kpos|; along the lanes the query moves (forward) or the key does.
  Score alibi(Score s) const {
    const Score lanes = hn::Iota(df, static_cast<float>(x0));
    const Score base = hn::Set(df, distance_base);
    const Score distance =
        hn::Abs(tile.keys_across_lanes ? hn::Sub(base, lanes) : hn::Add(lanes, base));
    return hn::NegMulAdd(hn::Set(df, mods.alibi_slopes[tile.h]), distance, s);
  }
  Score bias(Score s) const {
    return PerPair(s, [&](float x, int64_t i, int64_t j) {
      return x + mods.bias[mods.bias_offset(tile.b, tile.h, i, j)];
    });
  }
  Score additive(Score s) const {
    return PerPair(s, [&](float x, int64_t i, int64_t j) {
      return x + static_cast<float>(mask.additive(tile.b, tile.h, i, j));
    });
  }
  Score score_fn(Score s) const {
    return PerPair(s, [&](float x, int64_t i, int64_t j) {
      return static_cast<float>(mods.call_score_fn(x, tile.b, tile.h, i, j));
    });
  }
  Score threshold(Score s) const {
    const Score tau = hn::Set(df, static_cast<float>(*mods.threshold));
    return hn::IfThenElse(hn::Lt(s, tau), hn::Set(df, -INFINITY), s);
  }

 private:
  // fn(score, query, key) on the allowed pairs of the vector, lane by lane.
  template <class Fn>
  Score PerPair(Score s, Fn&& fn) const {
    HWY_ALIGN float lanes[hn::MaxLanes(DF())];
    hn::Store(s, df, lanes);
    const int64_t N = static_cast<int64_t>(hn::Lanes(df));
    const int64_t end = std::min<int64_t>(N, tile.pair_lanes - x0);
    for (int64_t n = 0; n < end; ++n) {
      const int64_t x = x0 + n;
      if (tile.allowed != nullptr && !((tile.allowed[r] >> x) & 1)) continue;
      const int64_t i = tile.q_first + (tile.keys_across_lanes ? r : x);
      const int64_t j = tile.k_first + (tile.keys_across_lanes ? x : r);
      lanes[n] = fn(lanes[n], i, j);
    }
    return hn::Load(df, lanes);
  }
};

// The score program on the tile's pairs, at global rows (Program::score_tile reads the tile in
// place: key rows in the forward, query rows in the backward; 64 floats a row).
HWY_INLINE void ApplyProgramToTile(const ResolvedMods& mods, const TileLayout& tile,
                                   float* HWY_RESTRICT s) {
  if (tile.rows <= 0 || tile.pair_lanes <= 0) return;
  const bool query_rows = tile.keys_across_lanes;
  mods.program->score_tile(
      mods.program_tile(tile.b, tile.h, tile.q_first, query_rows ? tile.rows : tile.pair_lanes,
                        tile.k_first, query_rows ? tile.pair_lanes : tile.rows, query_rows,
                        kChainTileLanes),
      s);
}

// The chain on rows [0, tile.rows) of s (all 64 lanes each). Without a program, one pass of
// vectors; with one: the head of the chain on vectors, the program on the whole tile (its
// interpreter pays its dispatch once per tile), then the tail on vectors.
HWY_INLINE void ApplyScoreChainToTile(const ResolvedMods& mods, const ResolvedMask& mask,
                                      const TileLayout& tile, float* HWY_RESTRICT s) {
  using DF = hn::ScalableTag<float>;
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  TileScoreChain<DF> chain{mods, mask, tile, df};
  const bool program = mods.program != nullptr;
  // Qualified: the scalar maskattn::detail versions must not be found through ADL.
  for (int64_t r = 0; r < tile.rows; ++r) {
    chain.set_row(r);
    for (int64_t x0 = 0; x0 < kChainTileLanes; x0 += N) {
      chain.x0 = x0;
      float* at = s + r * kChainTileLanes + x0;
      auto v =
          fused::HWY_NAMESPACE::ApplyScoreChainHead(mods, tile.additive, chain, hn::LoadU(df, at));
      if (!program) v = fused::HWY_NAMESPACE::ApplyScoreChainTail(mods, chain, v);
      hn::StoreU(v, df, at);
    }
  }
  if (!program) return;
  if (tile.program_input != nullptr) {
    std::copy(s, s + tile.rows * kChainTileLanes, tile.program_input);
  }
  ApplyProgramToTile(mods, tile, s);
  if (!mods.threshold) return;
  for (int64_t r = 0; r < tile.rows; ++r) {
    chain.set_row(r);
    for (int64_t x0 = 0; x0 < kChainTileLanes; x0 += N) {
      chain.x0 = x0;
      float* at = s + r * kChainTileLanes + x0;
      hn::StoreU(fused::HWY_NAMESPACE::ApplyScoreChainTail(mods, chain, hn::LoadU(df, at)), df, at);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::detail::fused
HWY_AFTER_NAMESPACE();

#endif  // MASKATTN_KERNELS_SCORE_CHAIN_INL_H_
