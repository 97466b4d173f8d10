// The online-softmax step of the AMX tile kernel, fused with the rounding of P to bf16 pairs.
//
// Design. Once AMX does the products, the f32 softmax between them is most of a tile's time (the
// products take ≈ 0.5 µs per 64 × 64 tile, the generic step ≈ 1 µs; docs/benchmarks.md). The
// generic path makes four passes over the 16 KiB of scores: scale them, take the column maxima,
// exponentiate in place, then read the weights again to pack them for the second product. This
// step makes two, and cheaper ones:
//   - the scale is folded into the exponent: with m the running maximum of scale·s,
//         w = exp(scale·s − m) = 2^(s·(scale·log2 e) − m·log2 e)     (one FMA per score)
//     and scale·max(s) = max(scale·s) for scale > 0, so the raw AMX scores are never rewritten;
//   - 2^t is computed as 2^n · 2^f with n = round(t), |f| ≤ ½, a degree-5 polynomial for 2^f
//     (relative error 2.4e-6, far below the 2^-9 of the bf16 weights that multiply V) and
//     vscalefps for the 2^n; t < −126 gives exactly 0 (as the generic exp's flush), so a hidden
//     score (−inf) weighs exactly 0 and a row that saw no key ends with l = 0 → O = 0;
//   - the weights are rounded to bf16 pairs as they are made, never stored as f32.
//   - the running maximum moves only when a score passes it by more than kMaxLag = 8 (natural
//     log units): softmax is the same for any subtracted constant, and weights up to e^8 ≈ 3000
//     cannot overflow a sum in f32; but α = 1 then holds for almost every tile after the first,
//     which spares the output its rescaling pass — vector stores that the next tile loads of O
//     would have to wait for (a tile load does not take data from pending vector stores).
// The rules are softmax-inl.h's: the −inf guard (a column whose maximum is −inf subtracts 0),
// α = exp(m_old − m_new), l = α·l + Σ w with w in f32, NaN/+inf scores poison their row.
//
// It runs only where nothing sits between the products but the mask (no score modifiers), the
// value tile is finite (P·V may multiply hidden keys' zero weights) and 0 < scale ≤ 1 (so that
// scale·s cannot overflow where s did not); the tile kernel takes the generic path otherwise.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels/amx.h"
#include "kernels/fused_block.h"

namespace maskattn::detail::fused {

#define MASKATTN_AMX_SOFTMAX_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

namespace {

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kMaxLag = 8.0f;  // how far a score may pass the running maximum before it moves

// 2^t for t ≤ ~0: exactly 0 below −126 (and for −inf), never a subnormal.
MASKATTN_AMX_SOFTMAX_TARGET inline __m512 Exp2(__m512 t) {
  t = _mm512_maskz_max_ps(0xFFFF, t, _mm512_set1_ps(-127.0f));  // −inf → −127: no inf − inf below
  const __mmask16 kept = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
  const __m512 n =
      _mm512_maskz_roundscale_ps(0xFFFF, t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  // 2^f = e^(f·ln 2) = Σ (f·ln 2)^k / k!, Horner in f.
  __m512 p = _mm512_set1_ps(1.3333558146e-3f);                  // ln2^5 / 120
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076e-3f));  // ln2^4 / 24
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108665e-2f));  // ln2^3 / 6
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650696e-1f));  // ln2^2 / 2
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718056e-1f));  // ln2
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(kept, p, n);
}

}  // namespace

MASKATTN_AMX_SOFTMAX_TARGET void amx_softmax_step(const float* s, int64_t rows, float scale,
                                                  float* row_max, float* row_sum, float* alpha,
                                                  float* poisoned, uint32_t* p_pairs) {
  // [a0, b0, a1, b1, …] from vcvtne2ps2bf16's [a0 … a15 | b0 … b15].
  alignas(64) uint16_t order[32];
  for (int n = 0; n < 16; ++n) {
    order[2 * n] = static_cast<uint16_t>(n);
    order[2 * n + 1] = static_cast<uint16_t>(16 + n);
  }
  const __m512i interleave = _mm512_load_si512(order);
  const __m512 c = _mm512_set1_ps(scale * kLog2e), minus_inf = _mm512_set1_ps(-INFINITY);
  const int64_t pairs = (rows + 1) / 2;
  for (int64_t i = 0; i < kTileQ; i += 16) {
    const __m512 m_old = _mm512_loadu_ps(row_max + i);
    __m512 raw_max = minus_inf;
    __mmask16 bad =
        _mm512_cmp_ps_mask(_mm512_loadu_ps(poisoned + i), _mm512_setzero_ps(), _CMP_NEQ_UQ);
    for (int64_t j = 0; j < rows; ++j) {
      const __m512 x = _mm512_loadu_ps(s + j * kTileQ + i);
      raw_max = _mm512_maskz_max_ps(0xFFFF, raw_max, x);
      bad |= _mm512_cmp_ps_mask(x, _mm512_set1_ps(INFINITY), _CMP_NLT_UQ);  // NaN or +inf
    }
    const __m512 candidate =
        _mm512_maskz_max_ps(0xFFFF, m_old, _mm512_mul_ps(raw_max, _mm512_set1_ps(scale)));
    // Moves when it passes by more than kMaxLag (always from −inf: −inf + lag is −inf).
    const __mmask16 moves =
        _mm512_cmp_ps_mask(candidate, _mm512_add_ps(m_old, _mm512_set1_ps(kMaxLag)), _CMP_GT_OQ);
    const __m512 m = _mm512_mask_blend_ps(moves, m_old, candidate);
    const __mmask16 empty = _mm512_cmp_ps_mask(m, minus_inf, _CMP_EQ_OQ);
    const __m512 m_used = _mm512_mask_blend_ps(empty, m, _mm512_setzero_ps());  // the −inf guard
    const __m512 offset = _mm512_mul_ps(m_used, _mm512_set1_ps(kLog2e));
    const __m512 a = Exp2(_mm512_mul_ps(_mm512_sub_ps(m_old, m_used), _mm512_set1_ps(kLog2e)));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < pairs; ++t) {
      const float* first = s + 2 * t * kTileQ + i;
      const __m512 w0 = Exp2(_mm512_fmsub_ps(_mm512_loadu_ps(first), c, offset));
      const __m512 w1 = 2 * t + 1 < rows
                            ? Exp2(_mm512_fmsub_ps(_mm512_loadu_ps(first + kTileQ), c, offset))
                            : _mm512_setzero_ps();
      sum = _mm512_add_ps(sum, _mm512_add_ps(w0, w1));
      const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(w1, w0);
      _mm512_storeu_si512(p_pairs + t * kTileQ + i, _mm512_permutexvar_epi16(interleave, halves));
    }
    _mm512_storeu_ps(row_sum + i, _mm512_fmadd_ps(a, _mm512_loadu_ps(row_sum + i), sum));
    _mm512_storeu_ps(row_max + i, m);
    _mm512_storeu_ps(alpha + i, a);
    _mm512_storeu_ps(poisoned + i, _mm512_maskz_mov_ps(bad, _mm512_set1_ps(1.0f)));
  }
  // Pairs past the tile's keys meet Vᵀ's zero padding: zero, not stale.
  std::memset(p_pairs + pairs * kTileQ, 0, (kTileK / 2 - pairs) * kTileQ * sizeof(uint32_t));
}

// The backward's weights from raw scores: s[i][j] = exp(scale·s[i][j] − lse[i]) for rows
// i < q_count, 0 for a row without keys (LSE −inf) and for hidden pairs (−inf scores). The
// backward takes this on AMX tile pairs without modifiers, whose inputs are finite.
MASKATTN_AMX_SOFTMAX_TARGET void amx_backward_weights(float* s, const float* lse, int64_t q_count,
                                                      float scale) {
  const __m512 c = _mm512_set1_ps(scale * kLog2e), cap = _mm512_set1_ps(127.0f);
  for (int64_t i = 0; i < q_count; ++i) {
    float* row = s + i * kTileK;
    if (lse[i] == -INFINITY) {
      std::memset(row, 0, kTileK * sizeof(float));
      continue;
    }
    const __m512 offset = _mm512_set1_ps(lse[i] * kLog2e);
    for (int64_t j = 0; j < kTileK; j += 16) {
      // ≤ 0 up to rounding for this row's LSE; capped so that 2^t cannot overflow.
      const __m512 t =
          _mm512_maskz_min_ps(0xFFFF, _mm512_fmsub_ps(_mm512_loadu_ps(row + j), c, offset), cap);
      _mm512_storeu_ps(row + j, Exp2(t));
    }
  }
}

}  // namespace maskattn::detail::fused
