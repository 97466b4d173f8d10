// The forward tile kernel's two f32 products, compiled once per Highway target (the "-inl.h"
// convention): the f32 unit's (f32_fma.cc), and the guarded product fused_block.cc takes for a V
// tile with inf/NaN whatever the unit. Both hold the tile transposed, queries across the SIMD
// lanes (fused_block.cc):
//
//     scores   Sᵀ[j][i]  = Σ_d K[j][d]·Qᵀ[d][i]              K broadcast from its own rows
//     output   Oᵀ[e][i]  = α[i]·Oᵀ[e][i] + Σ_j V[j][e]·Pᵀ[j][i]   V broadcast from its own rows
//
// register blocked kRows rows × kVectors vectors (4 × 4 = 16 accumulators for whole tiles). Each
// element is one sum in a fixed order (d, or j), whatever the blocking: the blocking decides
// speed, never bits.
//
// Partial tiles whose allowed pairs leave whole lane blocks (16 queries) empty on some key rows —
// the triangle on a causal or sliding-window diagonal, the far edge of a window — run on the
// active rows only: ActiveRows (active_rows.h) gives, per lane block, the key rows [first, end)
// holding any allowed pair, and the "Active" products, the mask and the softmax step touch nothing
// else. A triangle costs 10 of its 16 (row block, lane block) pieces instead of 16. The rows left
// out are hidden for every query of the lane block, so their weights would be exactly 0: skipping
// them changes no bit.
#if defined(MASKATTN_KERNELS_TILE_PRODUCTS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MASKATTN_KERNELS_TILE_PRODUCTS_INL_H_
#undef MASKATTN_KERNELS_TILE_PRODUCTS_INL_H_
#else
#define MASKATTN_KERNELS_TILE_PRODUCTS_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>

#include "kernels/active_rows.h"      // ActiveRows, kLaneBlock: plain C++, included once
#include "kernels/prefetch_stream.h"  // PrefetchStream: plain C++, included once

HWY_BEFORE_NAMESPACE();
namespace maskattn::detail::fused {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// ---- scores ------------------------------------------------------------------------------------

// s[r][x] = Σ_d k[r][d]·q_t[d][x] for kRows key rows and kVectors vectors of queries from x = 0
// (q_t and s point at the first query; their rows are kProductLanes apart).
template <int kRows, int kVectors>
HWY_INLINE void ScoreBlock(const float* HWY_RESTRICT k, int64_t k_stride, int64_t dim,
                           const float* HWY_RESTRICT q_t, float* HWY_RESTRICT s) {
  using DF = hn::ScalableTag<float>;
  const DF df;
  const size_t N = hn::Lanes(df);
  hn::Vec<DF> acc[kRows][kVectors];
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kVectors; ++c) acc[r][c] = hn::Zero(df);
  }
  for (int64_t d = 0; d < dim; ++d) {
    hn::Vec<DF> q[kVectors];
    for (int c = 0; c < kVectors; ++c) q[c] = hn::LoadU(df, q_t + d * kProductLanes + c * N);
    for (int r = 0; r < kRows; ++r) {
      const auto key = hn::Set(df, k[r * k_stride + d]);
      for (int c = 0; c < kVectors; ++c) acc[r][c] = hn::MulAdd(key, q[c], acc[r][c]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kVectors; ++c) hn::StoreU(acc[r][c], df, s + r * kProductLanes + c * N);
  }
}

// ScoreBlock over queries [lane_first, lane_end): four vectors at a time, then what is left.
template <int kRows>
HWY_INLINE void ScoreLanes(const float* k, int64_t k_stride, int64_t dim, const float* q_t,
                           float* s, int64_t lane_first, int64_t lane_end) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  int64_t x = lane_first;
  for (; x + 4 * N <= lane_end; x += 4 * N) {
    ScoreBlock<kRows, 4>(k, k_stride, dim, q_t + x, s + x);
  }
  switch ((lane_end - x) / N) {
    case 3:
      ScoreBlock<kRows, 3>(k, k_stride, dim, q_t + x, s + x);
      break;
    case 2:
      ScoreBlock<kRows, 2>(k, k_stride, dim, q_t + x, s + x);
      break;
    case 1:
      ScoreBlock<kRows, 1>(k, k_stride, dim, q_t + x, s + x);
      break;
    default:
      break;
  }
}

// All queries of `rows` key rows. Each step of four rows also prefetches two step units' lines of
// `stream` (prefetch_stream.h); the other products' steps below one unit's.
inline void Scores(const float* k, int64_t k_stride, int64_t rows, int64_t dim, const float* q_t,
                   float* s, PrefetchStream* stream = nullptr) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    PrefetchStep(stream, 2);
    ScoreLanes<4>(k + r * k_stride, k_stride, dim, q_t, s + r * kProductLanes, 0, kProductLanes);
  }
  for (; r < rows; ++r) {
    ScoreLanes<1>(k + r * k_stride, k_stride, dim, q_t, s + r * kProductLanes, 0, kProductLanes);
  }
}

// The lane blocks whose active rows meet key rows [r, r + count), as a query range (the blocks
// between the first and the last such block: scoring a few extra pairs is harmless).
inline void ActiveLanes(const ActiveRows& active, int64_t r, int64_t count, int64_t& lane_first,
                        int64_t& lane_end) {
  lane_first = kProductLanes;
  lane_end = 0;
  for (int64_t c = 0; c < kLaneBlocks; ++c) {
    if (active.first[c] >= r + count || active.end[c] <= r) continue;
    lane_first = std::min(lane_first, c * kLaneBlock);
    lane_end = (c + 1) * kLaneBlock;
  }
}

// The scores every lane block reads: its active rows. Where eight rows need one vector of queries
// (a triangle's tip), they go as one 8 × 1 block: four rows × one vector is only four independent
// accumulators, half of what two FMA pipes of latency 4 need to stay busy.
inline void ScoresActive(const float* k, int64_t k_stride, int64_t rows, int64_t dim,
                         const float* q_t, const ActiveRows& active, float* s,
                         PrefetchStream* stream = nullptr) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  int64_t r = 0, lane_first = 0, lane_end = 0;
  for (; r + 8 <= rows; r += 8) {
    PrefetchStep(stream, 2);
    ActiveLanes(active, r, 8, lane_first, lane_end);
    if (lane_first >= lane_end) continue;
    if (lane_end - lane_first == N) {
      ScoreBlock<8, 1>(k + r * k_stride, k_stride, dim, q_t + lane_first,
                       s + r * kProductLanes + lane_first);
      continue;
    }
    for (int64_t half = r; half < r + 8; half += 4) {
      ActiveLanes(active, half, 4, lane_first, lane_end);
      if (lane_first >= lane_end) continue;
      ScoreLanes<4>(k + half * k_stride, k_stride, dim, q_t, s + half * kProductLanes, lane_first,
                    lane_end);
    }
  }
  for (; r + 4 <= rows; r += 4) {
    ActiveLanes(active, r, 4, lane_first, lane_end);
    if (lane_first >= lane_end) continue;
    ScoreLanes<4>(k + r * k_stride, k_stride, dim, q_t, s + r * kProductLanes, lane_first,
                  lane_end);
  }
  for (; r < rows; ++r) {
    ActiveLanes(active, r, 1, lane_first, lane_end);
    if (lane_first >= lane_end) continue;
    ScoreLanes<1>(k + r * k_stride, k_stride, dim, q_t, s + r * kProductLanes, lane_first,
                  lane_end);
  }
}

// ---- output ------------------------------------------------------------------------------------

// o[r][x] = alpha[x]·o[r][x] + Σ_{j<rows} v[j][r]·p[j][x] for kRows value dims r and kVectors
// vectors of queries from x = 0 (p, alpha, o point at the first query). `Careful` skips zero
// weights so that a non-finite value of a hidden key cannot turn 0·v into NaN.
template <int kRows, int kVectors, bool kCareful>
HWY_INLINE void OutputBlock(const float* HWY_RESTRICT v, int64_t v_stride, int64_t rows,
                            const float* HWY_RESTRICT p, const float* HWY_RESTRICT alpha,
                            float* HWY_RESTRICT o) {
  using DF = hn::ScalableTag<float>;
  const DF df;
  const size_t N = hn::Lanes(df);
  hn::Vec<DF> acc[kRows][kVectors];
  for (int c = 0; c < kVectors; ++c) {
    const auto scale = hn::LoadU(df, alpha + c * N);
    for (int r = 0; r < kRows; ++r) {
      acc[r][c] = hn::Mul(scale, hn::LoadU(df, o + r * kProductLanes + c * N));
    }
  }
  for (int64_t j = 0; j < rows; ++j) {
    hn::Vec<DF> w[kVectors];
    for (int c = 0; c < kVectors; ++c) w[c] = hn::LoadU(df, p + j * kProductLanes + c * N);
    for (int r = 0; r < kRows; ++r) {
      const auto value = hn::Set(df, v[j * v_stride + r]);
      for (int c = 0; c < kVectors; ++c) {
        if constexpr (kCareful) {
          const auto term = hn::IfThenElseZero(hn::Ne(w[c], hn::Zero(df)), hn::Mul(value, w[c]));
          acc[r][c] = hn::Add(acc[r][c], term);
        } else {
          acc[r][c] = hn::MulAdd(value, w[c], acc[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kVectors; ++c) hn::StoreU(acc[r][c], df, o + r * kProductLanes + c * N);
  }
}

// The whole tile: 4 value dims × 4 vectors at a time.
template <bool kCareful>
void Accumulate(const float* v, int64_t v_stride, int64_t rows, int64_t value_dim, const float* p,
                const float* alpha, float* o, PrefetchStream* stream = nullptr) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  for (int64_t x = 0; x < kProductLanes; x += 4 * N) {
    int64_t e = 0;
    for (; e + 4 <= value_dim; e += 4) {
      PrefetchStep(stream, 1);
      OutputBlock<4, 4, kCareful>(v + e, v_stride, rows, p + x, alpha + x,
                                  o + e * kProductLanes + x);
    }
    for (; e < value_dim; ++e) {
      OutputBlock<1, 4, kCareful>(v + e, v_stride, rows, p + x, alpha + x,
                                  o + e * kProductLanes + x);
    }
  }
}

// Each lane block over its active rows only (every block is rescaled by α, even one with none).
// A lane block is 16 queries: on AVX-512 one vector, so 8 value dims are blocked instead of 4 to
// keep eight accumulators in flight.
template <bool kCareful>
void AccumulateActive(const float* v, int64_t v_stride, int64_t value_dim, const float* p,
                      const float* alpha, const ActiveRows& active, float* o,
                      PrefetchStream* stream = nullptr) {
  constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(hn::ScalableTag<float>()));
  constexpr int kVectors = kLanes >= kLaneBlock ? 1 : static_cast<int>(kLaneBlock / kLanes);
  constexpr int kRows = kVectors >= 8 ? 1 : 8 / kVectors;
  for (int64_t c = 0; c < kLaneBlocks; ++c) {
    const int64_t first = active.first[c], rows = active.end[c] - active.first[c];
    const int64_t x = c * kLaneBlock;
    const float* v_rows = v + first * v_stride;
    const float* p_rows = p + first * kProductLanes + x;
    int64_t e = 0;
    for (; e + kRows <= value_dim; e += kRows) {
      PrefetchStep(stream, 1);
      OutputBlock<kRows, kVectors, kCareful>(v_rows + e, v_stride, rows, p_rows, alpha + x,
                                             o + e * kProductLanes + x);
    }
    for (; e < value_dim; ++e) {
      OutputBlock<1, kVectors, kCareful>(v_rows + e, v_stride, rows, p_rows, alpha + x,
                                         o + e * kProductLanes + x);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::detail::fused
HWY_AFTER_NAMESPACE();

#endif  // MASKATTN_KERNELS_TILE_PRODUCTS_INL_H_
