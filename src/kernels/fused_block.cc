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
// rows from TileMaskBuilder select −inf). Score modifiers run between the product and the mask.
// The −inf guards are FlashAttention's: a column whose maximum is −inf uses 0 instead, so
// (−inf) − (−inf) never happens, and a row that saw no key ends with l = 0 → O = 0, LSE = −inf.
// NaN or +inf scores flag their row, which then ends as NaN (as the reference propagates them).
//
// Few queries (decoding) waste lanes in this layout, so attend_rows() puts D across the lanes
// instead and streams each key and value row once for all rows of a kv head: memory-bound.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/fused_block.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/element.h"
#include "kernels/bf16_dot.h"
#include "kernels/fused_block.h"
#include "kernels/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace maskattn::detail::fused {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr float kNegInf = -INFINITY;

// `count` elements from `offset`, `stride` apart, widened to f32 (vectorised when contiguous).
void LoadRow(const TensorView& t, int64_t offset, int64_t stride, int64_t count,
             float* HWY_RESTRICT out) {
  if (count == 0) return;  // an empty row may sit at a null pointer (memcpy must not see it)
  if (stride == 1) {
    const DF df;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
    int64_t d = 0;
    switch (t.dtype()) {
      case DType::f32:
        std::memcpy(out, static_cast<const float*>(t.data()) + offset, count * sizeof(float));
        return;
      case DType::f16: {
        const hn::Rebind<hwy::float16_t, DF> dh;
        const auto* in = reinterpret_cast<const hwy::float16_t*>(t.data()) + offset;
        for (; d + lanes <= count; d += lanes)
          hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, in + d)), df, out + d);
        break;
      }
      case DType::bf16: {
        const hn::Rebind<hwy::bfloat16_t, DF> dh;
        const auto* in = reinterpret_cast<const hwy::bfloat16_t*>(t.data()) + offset;
        for (; d + lanes <= count; d += lanes)
          hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, in + d)), df, out + d);
        break;
      }
    }
    for (; d < count; ++d) out[d] = load_float(t, offset + d);
    return;
  }
  for (int64_t d = 0; d < count; ++d) out[d] = load_float(t, offset + d * stride);
}

// Rows [j0, j0 + count) of K or V for (b, g) as f32: a pointer into the tensor itself when it is
// f32 with contiguous rows, else a converted copy in `buffer`. `row_stride` receives the distance
// between rows of the returned pointer.
const float* TileRows(const TensorView& t, int64_t b, int64_t g, int64_t j0, int64_t count,
                      int64_t width, float* buffer, int64_t& row_stride) {
  if (t.dtype() == DType::f32 && t.stride(3) == 1) {
    row_stride = t.stride(2);
    return static_cast<const float*>(t.data()) + t.offset({b, g, j0, 0});
  }
  row_stride = width;
  const size_t element = dtype_size(t.dtype());
  const auto* base = static_cast<const uint8_t*>(t.data());
  for (int64_t r = 0; r < count; ++r) {
    // Rows ahead are requested early: without this, converting a streamed tile stalls on memory.
    if (r + 8 < count && t.stride(3) == 1) {
      const uint8_t* ahead = base + t.offset({b, g, j0 + r + 8, 0}) * element;
      for (int64_t byte = 0; byte < width * static_cast<int64_t>(element); byte += 64) {
        hwy::Prefetch(ahead + byte);
      }
    }
    LoadRow(t, t.offset({b, g, j0 + r, 0}), t.stride(3), width, buffer + r * width);
  }
  return buffer;
}

// Rows [first, first + count) of the [B·H·L] rows of t, as f32 rows of width W, `out_stride`
// apart (≥ W; the gap is zero-filled).
void ConvertRowsToF32(const TensorView& t, int64_t first, int64_t count, float* out,
                      int64_t out_stride) {
  const int64_t width = t.size(3);
  for (int64_t row = first; row < first + count; ++row) {
    const int64_t l = row % t.size(2), h = (row / t.size(2)) % t.size(1);
    const int64_t b = row / (t.size(2) * t.size(1));
    float* out_row = out + row * out_stride;
    LoadRow(t, t.offset({b, h, l, 0}), t.stride(3), width, out_row);
    std::fill(out_row + width, out_row + out_stride, 0.0f);
  }
}

// The flags of kv head (b, g): one per key tile.
void MarkFiniteValueTilesOf(const Problem& p, int64_t b, int64_t g, uint8_t* flags) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t k_tiles = (p.k_len + kTileK - 1) / kTileK;
  const TensorView& v = p.v;
  const bool contiguous_f32 = v.dtype() == DType::f32 && v.stride(3) == 1;
  std::vector<float> row(contiguous_f32 ? 0 : p.value_dim);
  for (int64_t t = 0; t < k_tiles; ++t) {
    // x − x is 0 for finite x and NaN for ±inf and NaN: one test for all three.
    auto bad = hn::Zero(df);
    bool all_finite = true;
    for (int64_t j = t * kTileK; j < std::min(p.k_len, (t + 1) * kTileK); ++j) {
      const float* values = contiguous_f32
                                ? static_cast<const float*>(v.data()) + v.offset({b, g, j, 0})
                                : row.data();
      if (!contiguous_f32) LoadRow(v, v.offset({b, g, j, 0}), v.stride(3), p.value_dim, row.data());
      int64_t e = 0;
      for (; e + N <= p.value_dim; e += N) {
        const VF x = hn::LoadU(df, values + e);
        bad = hn::Or(bad, hn::Sub(x, x));
      }
      for (; e < p.value_dim; ++e) all_finite &= std::isfinite(values[e]);
    }
    all_finite &= hn::AllFalse(df, hn::IsNaN(bad));
    flags[(b * p.kv_heads + g) * k_tiles + t] = all_finite;
  }
}

void StoreRow(const MutableTensorView& t, int64_t offset, int64_t stride, const float* values,
              int64_t count) {
  if (count == 0) return;  // an empty row may sit at a null pointer
  if (stride == 1) {
    const DF df;
    const int64_t N = static_cast<int64_t>(hn::Lanes(df));
    int64_t e = 0;
    switch (t.dtype()) {
      case DType::f32:
        std::memcpy(static_cast<float*>(t.mutable_data()) + offset, values, count * sizeof(float));
        return;
      case DType::f16: {
        // F16C conversion rounds to nearest even, like float16_from_float.
        const hn::Rebind<hwy::float16_t, DF> dh;
        auto* out = reinterpret_cast<hwy::float16_t*>(t.mutable_data()) + offset;
        for (; e + N <= count; e += N)
          hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, values + e)), dh, out + e);
        break;
      }
      case DType::bf16: {
        // Round to nearest even on the bits (Highway 1.0.3's bf16 DemoteTo truncates): add
        // 0x7FFF plus the lowest kept bit, keep the top half; NaN stays a quiet NaN.
        const hn::RebindToUnsigned<DF> du;
        const hn::Rebind<uint16_t, DF> du16;
        auto* out = static_cast<uint16_t*>(t.mutable_data()) + offset;
        for (; e + N <= count; e += N) {
          const VF x = hn::LoadU(df, values + e);
          const auto bits = hn::BitCast(du, x);
          const auto odd = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
          const auto rounded =
              hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du, 0x7FFFu), odd)));
          const auto quiet = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du, 0x40u));
          const auto half = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(x)), quiet, rounded);
          // Values ≤ 0xFFFF: the signed → unsigned 16-bit demotion keeps them as they are.
          hn::StoreU(hn::DemoteTo(du16, hn::BitCast(hn::RebindToSigned<DF>(), half)), du16,
                     out + e);
        }
        break;
      }
    }
    for (; e < count; ++e) store_float(t, offset + e, values[e]);
    return;
  }
  for (int64_t e = 0; e < count; ++e) store_float(t, offset + e * stride, values[e]);
}

// ---- tile kernel: products ------------------------------------------------------------------

// s[r][i] = Σ_d k[r][d]·q_t[d][i] for kRows key rows and all kTileQ queries.
template <int kRows>
HWY_INLINE void ScoreRows(const float* HWY_RESTRICT k, int64_t k_stride, int64_t dim,
                          const float* HWY_RESTRICT q_t, float* HWY_RESTRICT s) {
  const DF df;
  const size_t N = hn::Lanes(df);
  for (size_t i = 0; i < static_cast<size_t>(kTileQ); i += 4 * N) {
    VF acc[kRows][4];
    for (int r = 0; r < kRows; ++r) {
      for (int c = 0; c < 4; ++c) acc[r][c] = hn::Zero(df);
    }
    for (int64_t d = 0; d < dim; ++d) {
      const float* q = q_t + d * kTileQ + i;
      const VF q0 = hn::LoadU(df, q), q1 = hn::LoadU(df, q + N);
      const VF q2 = hn::LoadU(df, q + 2 * N), q3 = hn::LoadU(df, q + 3 * N);
      for (int r = 0; r < kRows; ++r) {
        const VF key = hn::Set(df, k[r * k_stride + d]);
        acc[r][0] = hn::MulAdd(key, q0, acc[r][0]);
        acc[r][1] = hn::MulAdd(key, q1, acc[r][1]);
        acc[r][2] = hn::MulAdd(key, q2, acc[r][2]);
        acc[r][3] = hn::MulAdd(key, q3, acc[r][3]);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      for (int c = 0; c < 4; ++c) hn::StoreU(acc[r][c], df, s + r * kTileQ + i + c * N);
    }
  }
}

void Scores(const float* k, int64_t k_stride, int64_t rows, int64_t dim, const float* q_t,
            float* s) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) ScoreRows<4>(k + r * k_stride, k_stride, dim, q_t, s + r * kTileQ);
  for (; r < rows; ++r) ScoreRows<1>(k + r * k_stride, k_stride, dim, q_t, s + r * kTileQ);
}

// o[e][i] = alpha[i]·o[e][i] + Σ_{j<rows} v[j][e]·p[j][i] for kRows value dims e. `Careful`
// skips zero weights so that a non-finite value of a hidden key cannot turn 0·v into NaN.
template <int kRows, bool kCareful>
HWY_INLINE void AccumulateRows(const float* HWY_RESTRICT v, int64_t v_stride, int64_t rows,
                               const float* HWY_RESTRICT p, const float* HWY_RESTRICT alpha,
                               float* HWY_RESTRICT o) {
  const DF df;
  const size_t N = hn::Lanes(df);
  for (size_t i = 0; i < static_cast<size_t>(kTileQ); i += 4 * N) {
    VF acc[kRows][4];
    for (int c = 0; c < 4; ++c) {
      const VF scale = hn::LoadU(df, alpha + i + c * N);
      for (int r = 0; r < kRows; ++r) {
        acc[r][c] = hn::Mul(scale, hn::LoadU(df, o + r * kTileQ + i + c * N));
      }
    }
    for (int64_t j = 0; j < rows; ++j) {
      const float* w = p + j * kTileQ + i;
      const VF p0 = hn::LoadU(df, w), p1 = hn::LoadU(df, w + N);
      const VF p2 = hn::LoadU(df, w + 2 * N), p3 = hn::LoadU(df, w + 3 * N);
      for (int r = 0; r < kRows; ++r) {
        const VF value = hn::Set(df, v[j * v_stride + r]);
        if constexpr (kCareful) {
          const VF zero = hn::Zero(df);
          acc[r][0] = hn::Add(acc[r][0], hn::IfThenElseZero(hn::Ne(p0, zero), hn::Mul(value, p0)));
          acc[r][1] = hn::Add(acc[r][1], hn::IfThenElseZero(hn::Ne(p1, zero), hn::Mul(value, p1)));
          acc[r][2] = hn::Add(acc[r][2], hn::IfThenElseZero(hn::Ne(p2, zero), hn::Mul(value, p2)));
          acc[r][3] = hn::Add(acc[r][3], hn::IfThenElseZero(hn::Ne(p3, zero), hn::Mul(value, p3)));
        } else {
          acc[r][0] = hn::MulAdd(value, p0, acc[r][0]);
          acc[r][1] = hn::MulAdd(value, p1, acc[r][1]);
          acc[r][2] = hn::MulAdd(value, p2, acc[r][2]);
          acc[r][3] = hn::MulAdd(value, p3, acc[r][3]);
        }
      }
    }
    for (int r = 0; r < kRows; ++r) {
      for (int c = 0; c < 4; ++c) hn::StoreU(acc[r][c], df, o + r * kTileQ + i + c * N);
    }
  }
}

template <bool kCareful>
void Accumulate(const float* v, int64_t v_stride, int64_t rows, int64_t value_dim, const float* p,
                const float* alpha, float* o) {
  int64_t e = 0;
  for (; e + 4 <= value_dim; e += 4) {
    AccumulateRows<4, kCareful>(v + e, v_stride, rows, p, alpha, o + e * kTileQ);
  }
  for (; e < value_dim; ++e)
    AccumulateRows<1, kCareful>(v + e, v_stride, rows, p, alpha, o + e * kTileQ);
}

// ---- tile kernel: modifiers, mask, online softmax ----------------------------------------------

// For tests: out[n] = exp(in[n]) through the kernel's exp (count a multiple of 64).
void ExpNonPositiveArray(const float* in, int64_t count, float* out) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t n = 0; n + N <= count; n += N) {
    hn::StoreU(ExpNonPositive(df, hn::LoadU(df, in + n)), df, out + n);
  }
}

// softcap → ALiBi + bias + additive masks → score_fn → threshold (DESIGN.md §3), on the allowed
// pairs of the tile; `allowed` is null for a full tile.
void ApplyScoreMods(const Context& c, const Block& blk, int64_t j0, int64_t rows,
                    const uint64_t* allowed, bool additive, float* HWY_RESTRICT s) {
  const Problem& p = *c.problem;
  const ResolvedMods& mods = *p.mods;
  const ResolvedMask& mask = *p.mask;
  const DF df;
  const size_t N = hn::Lanes(df);
  if (mods.softcap || mods.alibi_slopes != nullptr) {
    const float cap = mods.softcap ? static_cast<float>(*mods.softcap) : 1.0f;
    const VF cap_v = hn::Set(df, cap), inverse_cap = hn::Set(df, 1.0f / cap);
    const float slope = mods.alibi_slopes != nullptr ? mods.alibi_slopes[blk.h] : 0.0f;
    for (int64_t j = 0; j < rows; ++j) {
      // distance(i) = qpos(i) − kpos(j) = i + (qpos(q_first) − kpos(j0 + j))
      const int64_t base = mask.qpos(blk.b, blk.q_first) - mask.kpos(blk.b, j0 + j);
      for (size_t i = 0; i < static_cast<size_t>(kTileQ); i += N) {
        VF x = hn::LoadU(df, s + j * kTileQ + i);
        if (mods.softcap) x = hn::Mul(cap_v, hn::Tanh(df, hn::Mul(x, inverse_cap)));
        if (mods.alibi_slopes != nullptr) {
          const VF distance = hn::Abs(
              hn::Add(hn::Iota(df, static_cast<float>(i)), hn::Set(df, static_cast<float>(base))));
          x = hn::NegMulAdd(hn::Set(df, slope), distance, x);
        }
        hn::StoreU(x, df, s + j * kTileQ + i);
      }
    }
  }
  if (mods.bias != nullptr || additive || mods.score_fn != nullptr) {
    for (int64_t j = 0; j < rows; ++j) {
      for (int64_t i = 0; i < blk.q_count; ++i) {
        if (allowed != nullptr && !((allowed[j] >> i) & 1)) continue;
        const int64_t qi = blk.q_first + i, kj = j0 + j;
        float& x = s[j * kTileQ + i];
        if (mods.bias != nullptr) x += mods.bias[mods.bias_index.offset(blk.b, blk.h, qi, kj)];
        if (additive) x += static_cast<float>(mask.additive(blk.b, blk.h, qi, kj));
        if (mods.score_fn != nullptr) {
          x = static_cast<float>((*mods.score_fn)(x, blk.b, blk.h, qi, kj));
        }
      }
    }
  }
  if (mods.threshold) {
    const VF tau = hn::Set(df, static_cast<float>(*mods.threshold));
    const VF minus_inf = hn::Set(df, kNegInf);
    for (int64_t j = 0; j < rows; ++j) {
      for (size_t i = 0; i < static_cast<size_t>(kTileQ); i += N) {
        const VF x = hn::LoadU(df, s + j * kTileQ + i);
        hn::StoreU(hn::IfThenElse(hn::Lt(x, tau), minus_inf, x), df, s + j * kTileQ + i);
      }
    }
  }
}

void ApplyMask(const uint64_t* allowed, int64_t rows, float* HWY_RESTRICT s) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF minus_inf = hn::Set(df, kNegInf);
  for (int64_t j = 0; j < rows; ++j) {
    for (size_t i = 0; i < static_cast<size_t>(kTileQ); i += N) {
      const VF x = hn::LoadU(df, s + j * kTileQ + i);
      hn::StoreU(hn::IfThenElse(LanesFromBits(df, allowed[j], i), x, minus_inf), df,
                 s + j * kTileQ + i);
    }
  }
}

// One online-softmax step over `rows` key rows: scores become weights exp(s − m'), and row_max,
// row_sum, alpha (the factor old sums and outputs are rescaled by) are updated per query.
void SoftmaxStep(float* HWY_RESTRICT s, int64_t rows, float* HWY_RESTRICT row_max,
                 float* HWY_RESTRICT row_sum, float* HWY_RESTRICT alpha, float* HWY_RESTRICT bad) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF minus_inf = hn::Set(df, kNegInf), plus_inf = hn::Set(df, INFINITY);
  for (size_t i = 0; i < static_cast<size_t>(kTileQ); i += N) {
    const VF m_old = hn::LoadU(df, row_max + i);
    VF m = m_old;
    auto poisoned = hn::Ne(hn::LoadU(df, bad + i), hn::Zero(df));
    for (int64_t j = 0; j < rows; ++j) {
      const VF x = hn::LoadU(df, s + j * kTileQ + i);
      m = hn::Max(m, x);
      // NaN and +inf are exactly the scores that are not below +inf: one compare flags both.
      poisoned = hn::Or(poisoned, hn::Not(hn::Lt(x, plus_inf)));
    }
    // A column that has seen only −inf keeps m = −inf; subtract 0 instead (no (−inf) − (−inf)).
    const VF m_used = hn::IfThenZeroElse(hn::Eq(m, minus_inf), m);
    const VF a = ExpNonPositive(df, hn::Sub(m_old, m_used));
    VF sum = hn::Zero(df);
    for (int64_t j = 0; j < rows; ++j) {
      const VF w = ExpNonPositive(df, hn::Sub(hn::LoadU(df, s + j * kTileQ + i), m_used));
      hn::StoreU(w, df, s + j * kTileQ + i);
      sum = hn::Add(sum, w);
    }
    hn::StoreU(hn::MulAdd(a, hn::LoadU(df, row_sum + i), sum), df, row_sum + i);
    hn::StoreU(m, df, row_max + i);
    hn::StoreU(a, df, alpha + i);
    hn::StoreU(hn::IfThenElseZero(poisoned, hn::Set(df, 1.0f)), df, bad + i);
  }
}

// out[i][e] = o[e][i] / l[i]; rows that saw no key give 0 and LSE −inf, poisoned rows NaN.
void Finalize(int64_t q_count, int64_t value_dim, const float* o, const float* row_max,
              const float* row_sum, const float* bad, float* out, float* lse) {
  for (int64_t i = 0; i < q_count; ++i) {
    const float l = row_sum[i];
    float* row = out + i * value_dim;
    if (bad[i] != 0.0f) {
      for (int64_t e = 0; e < value_dim; ++e) row[e] = NAN;
      lse[i] = NAN;
    } else if (l == 0.0f) {
      for (int64_t e = 0; e < value_dim; ++e) row[e] = 0.0f;
      lse[i] = kNegInf;
    } else {
      const float inverse = 1.0f / l;
      for (int64_t e = 0; e < value_dim; ++e) row[e] = o[e * kTileQ + i] * inverse;
      lse[i] = row_max[i] + std::log(l);
    }
  }
}

// The initial softmax state: a sink is a key of logit sink[h] with no value.
void InitState(const Problem& p, int64_t h, bool with_sink, float* row_max, float* row_sum,
               float* bad, int64_t count) {
  const bool sink = with_sink && p.mods->sinks != nullptr;
  for (int64_t i = 0; i < count; ++i) {
    row_max[i] = sink ? p.mods->sinks[h] : kNegInf;
    row_sum[i] = sink ? 1.0f : 0.0f;
    bad[i] = 0.0f;
  }
}

void AttendBlock(const Context& c, const Block& blk, Scratch& scratch) {
  const Problem& p = *c.problem;
  const int64_t dim = p.head_dim, value_dim = p.value_dim;
  const int64_t g = p.kv_head(blk.h);
  const int64_t q_tile = blk.q_first / kTileQ;

  const auto bf16_rows = [](const TensorView& t, int64_t b, int64_t h, int64_t l) {
    return static_cast<const uint16_t*>(t.data()) + t.offset({b, h, l, 0});
  };
  if (c.bf16_dot) {
    bf16_pack_queries(bf16_rows(p.q, blk.b, blk.h, blk.q_first), p.q.stride(2), blk.q_count, dim,
                      scratch.q_pairs);
  }
  // Qᵀ, scaled once here rather than every score later; unused columns are 0.
  if (!c.bf16_dot) std::memset(scratch.q_t, 0, dim * kTileQ * sizeof(float));
  for (int64_t i = 0; !c.bf16_dot && i < blk.q_count; ++i) {
    float* row = scratch.q_rows + i * dim;
    LoadRow(p.q, p.q.offset({blk.b, blk.h, blk.q_first + i, 0}), p.q.stride(3), dim, row);
    for (int64_t d = 0; d < dim; ++d) {
      scratch.q_t[d * kTileQ + i] = static_cast<float>(row[d] * p.scale);
    }
  }
  float* bad = scratch.poisoned;
  InitState(p, blk.h, blk.with_sink, scratch.row_max, scratch.row_sum, bad, kTileQ);
  std::memset(scratch.o, 0, value_dim * kTileQ * sizeof(float));
  const bool additive = p.mask->has_additive();

  const BlockMap::TileRange band = c.blocks->k_tile_range(blk.b, blk.h, q_tile);
  const int64_t k_tile_end = std::min(band.end, (blk.k_end + kTileK - 1) / kTileK);
  for (int64_t k_tile = std::max(band.first, blk.k_first / kTileK); k_tile < k_tile_end; ++k_tile) {
    const TileKind kind = c.blocks->kind(blk.b, blk.h, q_tile, k_tile);
    if (kind == TileKind::empty) continue;
    const int64_t j0 = k_tile * kTileK;
    const int64_t rows = std::min(kTileK, blk.k_end - j0);
    int64_t k_stride = 0, v_stride = 0;
    if (c.bf16_dot) {
      bf16_scores(bf16_rows(p.k, blk.b, g, j0), p.k.stride(2), rows, dim, scratch.q_pairs,
                  static_cast<float>(p.scale), scratch.s);
    } else {
      const float* k = TileRows(p.k, blk.b, g, j0, rows, dim, scratch.k, k_stride);
      Scores(k, k_stride, rows, dim, scratch.q_t, scratch.s);
    }

    const uint64_t* allowed = nullptr;
    if (kind == TileKind::partial) {
      c.tile_masks->build(blk.b, blk.h, blk.q_first, blk.q_count, j0, rows, scratch.allowed);
      allowed = scratch.allowed;
    }
    if (c.score_mods) {
      ApplyScoreMods(c, blk, j0, rows, allowed, additive && kind == TileKind::partial, scratch.s);
    }
    if (allowed != nullptr) ApplyMask(allowed, rows, scratch.s);
    SoftmaxStep(scratch.s, rows, scratch.row_max, scratch.row_sum, scratch.alpha, bad);

    const int64_t k_tiles = (p.k_len + kTileK - 1) / kTileK;
    const bool finite = c.v_tile_finite[(blk.b * p.kv_heads + g) * k_tiles + k_tile];
    if (c.bf16_dot && finite) {
      bf16_pack_weights(scratch.s, rows, scratch.p_pairs);
      // V was packed into pairs once per call; tiles start at even keys.
      const uint32_t* v_pairs =
          c.v_pairs + ((blk.b * p.kv_heads + g) * ((p.k_len + 1) / 2) + j0 / 2) * value_dim;
      bf16_accumulate(v_pairs, rows, value_dim, scratch.p_pairs, scratch.alpha, scratch.o);
      continue;
    }
    const float* v = TileRows(p.v, blk.b, g, j0, rows, value_dim, scratch.v, v_stride);
    if (finite) {
      Accumulate<false>(v, v_stride, rows, value_dim, scratch.s, scratch.alpha, scratch.o);
    } else {
      Accumulate<true>(v, v_stride, rows, value_dim, scratch.s, scratch.alpha, scratch.o);
    }
  }
  Finalize(blk.q_count, value_dim, scratch.o, scratch.row_max, scratch.row_sum, bad, scratch.out,
           scratch.lse);
}

// ---- row kernel (few queries) ------------------------------------------------------------------

constexpr int64_t kPrefetchRows = 8;

// A key or value tile read in place by the row kernel: rows of f32, f16 or bf16 with unit inner
// stride, `stride` elements apart (decoding reads each row once, so converting first would only
// add a pass over memory).
struct RowSource {
  const void* base = nullptr;
  DType dtype = DType::f32;
  int64_t stride = 0;       // elements between rows
  int64_t row_bytes = 0;    // bytes between rows
  int64_t width_bytes = 0;  // bytes of one row's data
};

RowSource SourceRows(const TensorView& t, int64_t b, int64_t g, int64_t j0, int64_t count,
                     int64_t width, float* buffer) {
  if (t.stride(3) == 1) {
    const auto* bytes = static_cast<const uint8_t*>(t.data()) +
                        t.offset({b, g, j0, 0}) * static_cast<int64_t>(dtype_size(t.dtype()));
    const auto element = static_cast<int64_t>(dtype_size(t.dtype()));
    return {bytes, t.dtype(), t.stride(2), t.stride(2) * element, width * element};
  }
  int64_t stride = 0;
  const float* rows = TileRows(t, b, g, j0, count, width, buffer, stride);
  return {rows, DType::f32, stride, stride * 4, width * 4};
}

template <typename T>
HWY_INLINE VF LoadAsFloat(const T* HWY_RESTRICT p) {
  const DF df;
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, p);
  } else {
    return hn::PromoteTo(df, hn::LoadU(hn::Rebind<T, DF>(), p));
  }
}

template <typename T>
HWY_INLINE float AsFloat(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    uint16_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    if constexpr (std::is_same_v<T, hwy::float16_t>) return to_float(float16{bits});
    return to_float(bfloat16{bits});
  }
}

template <typename T>
float DotT(const float* HWY_RESTRICT a, const T* HWY_RESTRICT b, int64_t count) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  int64_t d = 0;
  for (; d + 2 * N <= count; d += 2 * N) {
    acc0 = hn::MulAdd(hn::LoadU(df, a + d), LoadAsFloat(b + d), acc0);
    acc1 = hn::MulAdd(hn::LoadU(df, a + d + N), LoadAsFloat(b + d + N), acc1);
  }
  for (; d + N <= count; d += N) acc0 = hn::MulAdd(hn::LoadU(df, a + d), LoadAsFloat(b + d), acc0);
  float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
  for (; d < count; ++d) sum += a[d] * AsFloat(b[d]);
  return sum;
}

#if HWY_TARGET != HWY_SCALAR  // one-lane vectors have no blocks to interleave
// The four-lane vector of block sums: lane i = Σ over the 128-bit blocks of v of their lane i.
template <class D>
HWY_INLINE hn::Vec<hn::Full128<float>> SumOfBlocks(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    return SumOfBlocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    (void)d;
    return v;
  }
}

// out[x] = Σ_d q[d]·K[x][d] for four key rows (row x at k + x·stride). The four accumulators are
// reduced together (an interleave tree inside 128-bit blocks, then the blocks summed) instead of
// one horizontal sum per key, which cost more than the key's products when decoding.
template <typename T>
HWY_INLINE void DotFour(const float* HWY_RESTRICT q, const T* HWY_RESTRICT k, int64_t stride,
                        int64_t dim, float* HWY_RESTRICT out) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  int64_t d = 0;
  for (; d + N <= dim; d += N) {
    const VF qv = hn::LoadU(df, q + d);
    a0 = hn::MulAdd(qv, LoadAsFloat(k + d), a0);
    a1 = hn::MulAdd(qv, LoadAsFloat(k + stride + d), a1);
    a2 = hn::MulAdd(qv, LoadAsFloat(k + 2 * stride + d), a2);
    a3 = hn::MulAdd(qv, LoadAsFloat(k + 3 * stride + d), a3);
  }
  const hn::Repartition<uint64_t, DF> d64;
  const VF t01 = hn::Add(hn::InterleaveLower(df, a0, a1), hn::InterleaveUpper(df, a0, a1));
  const VF t23 = hn::Add(hn::InterleaveLower(df, a2, a3), hn::InterleaveUpper(df, a2, a3));
  const auto w01 = hn::BitCast(d64, t01), w23 = hn::BitCast(d64, t23);
  const VF blocks = hn::Add(hn::BitCast(df, hn::InterleaveLower(d64, w01, w23)),
                            hn::BitCast(df, hn::InterleaveUpper(d64, w01, w23)));
  hn::StoreU(SumOfBlocks(df, blocks), hn::Full128<float>(), out);
  for (; d < dim; ++d) {
    for (int x = 0; x < 4; ++x) out[x] += q[d] * AsFloat(k[x * stride + d]);
  }
}
#endif

HWY_INLINE void PrefetchSourceRow(const RowSource& source, int64_t j) {
  const auto* row = static_cast<const uint8_t*>(source.base) + j * source.row_bytes;
  for (int64_t byte = 0; byte < source.width_bytes; byte += 64) hwy::Prefetch(row + byte);
}

// out[e] += Σ_j w[j]·V[j][e] for e in [0, kVectors·N), keys j in order, zero weights skipped; the
// kVectors output vectors stay in registers across the keys (accumulating in memory instead made
// every key wait for the previous key's store: a store-to-load chain through `out`).
template <int kVectors, typename T>
HWY_INLINE void AccumulateValueVectors(const T* HWY_RESTRICT v, int64_t stride, int64_t count,
                                       const float* HWY_RESTRICT w, float* HWY_RESTRICT out,
                                       const RowSource* prefetch) {
  const DF df;
  const size_t N = hn::Lanes(df);
  VF acc[kVectors];
  for (int x = 0; x < kVectors; ++x) acc[x] = hn::LoadU(df, out + x * N);
  for (int64_t j = 0; j < count; ++j, v += stride) {
    if (prefetch != nullptr && j + kPrefetchRows < count)
      PrefetchSourceRow(*prefetch, j + kPrefetchRows);
    if (w[j] == 0.0f) continue;
    const VF weight = hn::Set(df, w[j]);
    for (int x = 0; x < kVectors; ++x) acc[x] = hn::MulAdd(weight, LoadAsFloat(v + x * N), acc[x]);
  }
  for (int x = 0; x < kVectors; ++x) hn::StoreU(acc[x], df, out + x * N);
}

// out[e] += Σ_j w[j]·V[j][e] over `count` value rows (row j at v + j·stride) and all value_dim
// columns: blocks of up to 4 vectors, then the columns past the last whole vector. Each element is
// one sum over j in order, so the result does not depend on the blocking. `prefetch` (or null)
// asks for rows ahead during the first block.
template <typename T>
void AccumulateValues(const T* HWY_RESTRICT v, int64_t stride, int64_t count, int64_t value_dim,
                      const float* HWY_RESTRICT w, float* HWY_RESTRICT out,
                      const RowSource* prefetch) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  int64_t e = 0;
  for (; e + 4 * N <= value_dim; e += 4 * N, prefetch = nullptr) {
    AccumulateValueVectors<4>(v + e, stride, count, w, out + e, prefetch);
  }
  switch ((value_dim - e) / N) {
    case 3:
      AccumulateValueVectors<3>(v + e, stride, count, w, out + e, prefetch);
      break;
    case 2:
      AccumulateValueVectors<2>(v + e, stride, count, w, out + e, prefetch);
      break;
    case 1:
      AccumulateValueVectors<1>(v + e, stride, count, w, out + e, prefetch);
      break;
    default:
      break;
  }
  e += (value_dim - e) / N * N;
  for (; e < value_dim; ++e) {
    float sum = out[e];
    for (int64_t j = 0; j < count; ++j) {
      if (w[j] != 0.0f) sum += w[j] * AsFloat(v[j * stride + e]);
    }
    out[e] = sum;
  }
}

// Calls fn(row pointer) with the row typed by the source's dtype.
template <typename Fn>
HWY_INLINE void WithRow(const RowSource& source, int64_t j, Fn&& fn) {
  switch (source.dtype) {
    case DType::f32:
      fn(static_cast<const float*>(source.base) + j * source.stride);
      break;
    case DType::f16:
      fn(static_cast<const hwy::float16_t*>(source.base) + j * source.stride);
      break;
    case DType::bf16:
      fn(static_cast<const hwy::bfloat16_t*>(source.base) + j * source.stride);
      break;
  }
}

void AttendRows(const Context& c, int64_t b, const Row* rows_in, int64_t row_count, int64_t k_first,
                int64_t k_end, bool with_sink, Scratch& scratch) {
  const Problem& p = *c.problem;
  const ResolvedMods& mods = *p.mods;
  const ResolvedMask& mask = *p.mask;
  const int64_t dim = p.head_dim, value_dim = p.value_dim;
  const int64_t g = p.kv_head(rows_in[0].h);
  float* bad = scratch.poisoned;
  for (int64_t r = 0; r < row_count; ++r) {
    const Row row = rows_in[r];
    LoadRow(p.q, p.q.offset({b, row.h, row.i, 0}), p.q.stride(3), dim, scratch.q_rows + r * dim);
    for (int64_t d = 0; d < dim; ++d) scratch.q_rows[r * dim + d] *= static_cast<float>(p.scale);
    InitState(p, row.h, with_sink, scratch.row_max + r, scratch.row_sum + r, bad + r, 1);
  }
  std::memset(scratch.out, 0, row_count * value_dim * sizeof(float));
  const bool additive = mask.has_additive();
  const DF df;
  const size_t N = hn::Lanes(df);

  // The union of the rows' bands.
  BlockMap::TileRange band{INT64_MAX, 0};
  for (int64_t r = 0; r < row_count; ++r) {
    const BlockMap::TileRange row = c.blocks->k_tile_range(b, rows_in[r].h, rows_in[r].i / kTileQ);
    if (row.first < row.end) band = {std::min(band.first, row.first), std::max(band.end, row.end)};
  }
  const int64_t k_tile_end = std::min(band.end, (k_end + kTileK - 1) / kTileK);
  for (int64_t k_tile = std::max(band.first, k_first / kTileK); k_tile < k_tile_end; ++k_tile) {
    const int64_t j0 = k_tile * kTileK;
    const int64_t count = std::min(kTileK, k_end - j0);
    TileKind kinds[kMaxRows];
    bool any = false;
    for (int64_t r = 0; r < row_count; ++r) {
      kinds[r] = c.blocks->kind(b, rows_in[r].h, rows_in[r].i / kTileQ, k_tile);
      any |= kinds[r] != TileKind::empty;
    }
    if (!any) continue;
    const RowSource k = SourceRows(p.k, b, g, j0, count, dim, scratch.k);
    // s[r][j]: one score per (row, key), keys padded with −inf to a whole tile.
    for (int64_t r = 0; r < row_count; ++r) {
      float* s = scratch.s + r * kTileK;
      for (int64_t j = count; j < kTileK; ++j) s[j] = kNegInf;
      if (kinds[r] == TileKind::empty) {
        for (int64_t j = 0; j < count; ++j) s[j] = kNegInf;
        continue;
      }
      const Row row = rows_in[r];
      const float* q = scratch.q_rows + r * dim;
      // Decoding streams K and V from memory once: rows are requested well ahead of their use
      // (measured: 4.8 → 3.4 ms for Lq=1, Lk=32768, H=8 on 2 threads; computing four dot
      // products at a time instead was slower, 4.2 ms).
      WithRow(k, 0, [&](const auto* keys) {
        int64_t j = 0;
#if HWY_TARGET != HWY_SCALAR
        for (; j + 4 <= count; j += 4) {
          if (r == 0) {
            for (int64_t ahead = j + kPrefetchRows; ahead < std::min(j + kPrefetchRows + 4, count);
                 ++ahead) {
              PrefetchSourceRow(k, ahead);
            }
          }
          DotFour(q, keys + j * k.stride, k.stride, dim, s + j);
        }
#endif
        for (; j < count; ++j) s[j] = DotT(q, keys + j * k.stride, dim);
      });
      uint64_t* allowed = nullptr;
      if (kinds[r] == TileKind::partial) {
        c.tile_masks->build(b, row.h, row.i, 1, j0, count, scratch.allowed);
        allowed = scratch.allowed;
      }
      for (int64_t j = 0; j < count; ++j) {
        if (allowed != nullptr && !(allowed[j] & 1)) {
          s[j] = kNegInf;
          continue;
        }
        if (!c.score_mods) continue;
        double x = s[j];
        const int64_t kj = j0 + j;
        if (mods.softcap) x = *mods.softcap * std::tanh(x / *mods.softcap);
        if (mods.alibi_slopes != nullptr) {
          x -= mods.alibi_slopes[row.h] *
               std::fabs(static_cast<double>(mask.qpos(b, row.i) - mask.kpos(b, kj)));
        }
        if (mods.bias != nullptr) x += mods.bias[mods.bias_index.offset(b, row.h, row.i, kj)];
        if (additive && kinds[r] == TileKind::partial) x += mask.additive(b, row.h, row.i, kj);
        if (mods.score_fn != nullptr) x = (*mods.score_fn)(x, b, row.h, row.i, kj);
        if (mods.threshold && x < *mods.threshold) x = kNegInf;
        s[j] = static_cast<float>(x);
      }
    }
    // Online softmax per row, the keys of the tile across the lanes.
    for (int64_t r = 0; r < row_count; ++r) {
      float* s = scratch.s + r * kTileK;
      VF m = hn::Set(df, kNegInf);
      bool poisoned = bad[r] != 0.0f;
      for (size_t j = 0; j < static_cast<size_t>(kTileK); j += N) {
        const VF x = hn::LoadU(df, s + j);
        m = hn::Max(m, x);
        poisoned |= !hn::AllFalse(df, hn::Or(hn::IsNaN(x), hn::Eq(x, hn::Set(df, INFINITY))));
      }
      const float m_old = scratch.row_max[r];
      const float m_new = std::max(m_old, hn::GetLane(hn::MaxOfLanes(df, m)));
      const float m_used = m_new == kNegInf ? 0.0f : m_new;
      const float a = std::exp(m_old - m_used);
      VF sum = hn::Zero(df);
      for (size_t j = 0; j < static_cast<size_t>(kTileK); j += N) {
        const VF w = hn::Exp(df, hn::Sub(hn::LoadU(df, s + j), hn::Set(df, m_used)));
        hn::StoreU(w, df, s + j);
        sum = hn::Add(sum, w);
      }
      scratch.row_sum[r] = a * scratch.row_sum[r] + hn::GetLane(hn::SumOfLanes(df, sum));
      scratch.row_max[r] = m_new;
      bad[r] = poisoned ? 1.0f : 0.0f;
      if (a != 1.0f) {
        float* out = scratch.out + r * value_dim;
        for (int64_t e = 0; e < value_dim; ++e) out[e] *= a;
      }
    }
    // O += P·V, each value row read once for all rows; zero weights are skipped, so hidden
    // values are never read into the result.
    const RowSource v = SourceRows(p.v, b, g, j0, count, value_dim, scratch.v);
    for (int64_t r = 0; r < row_count; ++r) {
      WithRow(v, 0, [&](const auto* values) {
        AccumulateValues(values, v.stride, count, value_dim, scratch.s + r * kTileK,
                         scratch.out + r * value_dim, r == 0 ? &v : nullptr);
      });
    }
  }
  for (int64_t r = 0; r < row_count; ++r) {
    const float l = scratch.row_sum[r];
    float* out = scratch.out + r * value_dim;
    if (bad[r] != 0.0f) {
      for (int64_t e = 0; e < value_dim; ++e) out[e] = NAN;
      scratch.lse[r] = NAN;
    } else if (l == 0.0f) {
      scratch.lse[r] = kNegInf;  // out is still all zeros
    } else {
      for (int64_t e = 0; e < value_dim; ++e) out[e] /= l;
      scratch.lse[r] = scratch.row_max[r] + std::log(l);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::detail::fused
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace maskattn::detail::fused {

HWY_EXPORT(AttendBlock);
HWY_EXPORT(AttendRows);
HWY_EXPORT(MarkFiniteValueTilesOf);
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

void mark_finite_value_tiles(const Problem& p, uint8_t* flags) {
  const int threads = p.threads > 0 ? p.threads : omp_get_max_threads();
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t g = 0; g < p.kv_heads; ++g) {
      HWY_DYNAMIC_DISPATCH(MarkFiniteValueTilesOf)(p, b, g, flags);
    }
  }
}

void store_row(const MutableTensorView& t, int64_t offset, int64_t stride, const float* values,
               int64_t count) {
  HWY_DYNAMIC_DISPATCH(StoreRow)(t, offset, stride, values, count);
}

void attend_block(const Context& context, const Block& block, Scratch& scratch) {
  HWY_DYNAMIC_DISPATCH(AttendBlock)(context, block, scratch);
}

void attend_rows(const Context& context, int64_t b, const Row* rows, int64_t row_count,
                 int64_t k_first, int64_t k_end, bool with_sink, Scratch& scratch) {
  HWY_DYNAMIC_DISPATCH(AttendRows)(context, b, rows, row_count, k_first, k_end, with_sink, scratch);
}

void Scratch::reserve(int64_t head_dim, int64_t value_dim) {
  if (head_dim <= head_dim_ && value_dim <= value_dim_) return;
  head_dim_ = std::max(head_dim, head_dim_);
  value_dim_ = std::max(value_dim, value_dim_);
  const int64_t d = head_dim_, dv = value_dim_;
  // Every piece starts on a 64-byte boundary.
  const auto padded = [](int64_t floats) { return (floats + 15) / 16 * 16; };
  const int64_t sizes[] = {padded(d * kTileQ),  padded(kTileQ * d),      padded(kTileK * d),
                           padded(kTileK * dv), padded(kTileK * kTileQ), padded(dv * kTileQ),
                           padded(kTileQ),      padded(kTileQ),          padded(kTileQ),
                           padded(kTileQ * dv), padded(kTileQ),          padded(kTileQ)};
  int64_t total = 16;
  for (int64_t size : sizes) total += size;
  storage_.assign(total, 0.0f);
  float* next = storage_.data();
  next += (16 - (reinterpret_cast<uintptr_t>(next) / sizeof(float)) % 16) % 16;
  float** pieces[] = {&q_t,     &q_rows,  &k,     &v,   &s,   &o,
                      &row_max, &row_sum, &alpha, &out, &lse, &poisoned};
  for (size_t n = 0; n < std::size(pieces); ++n) {
    *pieces[n] = next;
    next += sizes[n];
  }
  bits_.assign(kTileQ + kTileK, 0);
  allowed = bits_.data();
  const int64_t q_pairs_size = (d + 1) / 2 * kTileQ, p_pairs_size = kTileK / 2 * kTileQ;
  pairs_.assign(q_pairs_size + p_pairs_size + kTileK / 2 * dv, 0);
  q_pairs = pairs_.data();
  p_pairs = q_pairs + q_pairs_size;
  v_pairs = p_pairs + p_pairs_size;
}

}  // namespace maskattn::detail::fused
#endif  // HWY_ONCE
