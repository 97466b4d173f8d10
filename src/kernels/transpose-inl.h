// A 16 × 16 f32 transpose in AVX-512 registers, compiled per Highway target (the "-inl.h"
// convention) and defined on AVX-512 targets only (MASKATTN_HAVE_TRANSPOSE16): the tile kernel
// holds a block transposed (queries across lanes, fused_block.cc), so its queries come in and its
// normalised outputs go out through a transpose (f32_fma.cc's Qᵀ, fused_block.cc's
// NormaliseBlock). Done one value at a time (64 strided stores per query row, or a scatter per
// vector) these cost a sliding window, whose blocks visit only five tiles, about 5 % and 3 % of
// its time; in registers a 16 × 16 square is 64 permutes.
//
// Design. A transpose swaps the bits of the row index with those of the column index. Stage k
// swaps bit k: rows r and r + 2ᵏ (r without bit k) exchange the lanes whose bit k differs from
// their own, one two-source permute (vpermt2ps) per new row, so four stages of 16 permutes do the
// whole square. With A = row r and B = row r + 2ᵏ, the new row r takes lane c from A[c] where bit
// k of c is clear and from B[c − 2ᵏ] where it is set; the new row r + 2ᵏ takes A[c + 2ᵏ] and B[c].
#if defined(MASKATTN_KERNELS_TRANSPOSE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MASKATTN_KERNELS_TRANSPOSE_INL_H_
#undef MASKATTN_KERNELS_TRANSPOSE_INL_H_
#else
#define MASKATTN_KERNELS_TRANSPOSE_INL_H_
#endif

#include <hwy/highway.h>

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace maskattn::detail::fused {
namespace HWY_NAMESPACE {

// Redefined by every target's pass: only the AVX-512 passes have the transpose.
#undef MASKATTN_HAVE_TRANSPOSE16
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define MASKATTN_HAVE_TRANSPOSE16 1

// Lane c of the new rows r (kLow) and r + 2ᵏ (kHigh) at stage k, as vpermt2ps indices (16 + n:
// lane n of the second source).
struct TransposeStage {
  alignas(64) int32_t low[16];
  alignas(64) int32_t high[16];
};

constexpr TransposeStage MakeTransposeStage(int k) {
  TransposeStage stage{};
  const int step = 1 << k;
  for (int c = 0; c < 16; ++c) {
    const bool set = (c & step) != 0;
    stage.low[c] = set ? 16 + c - step : c;
    stage.high[c] = set ? 16 + c : c + step;
  }
  return stage;
}

inline constexpr TransposeStage kTransposeStages[4] = {
    MakeTransposeStage(0), MakeTransposeStage(1), MakeTransposeStage(2), MakeTransposeStage(3)};

// rows[r][c] becomes rows[c][r].
HWY_INLINE void Transpose16(__m512* rows) {
  // Fully unrolled, so that the 16 rows stay in registers (a loop over them spilled every row
  // to the stack between stages).
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const int step = 1 << k;
    const __m512i low = _mm512_load_si512(kTransposeStages[k].low);
    const __m512i high = _mm512_load_si512(kTransposeStages[k].high);
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      if ((r & step) != 0) continue;
      const __m512 a = rows[r], b = rows[r + step];
      rows[r] = _mm512_permutex2var_ps(a, low, b);
      rows[r + step] = _mm512_permutex2var_ps(a, high, b);
    }
  }
}

// Stores rows[c] at out + c·out_stride, c < 16.
HWY_INLINE void StoreRows16(const __m512* rows, float* out, int64_t out_stride) {
#pragma GCC unroll 16
  for (int c = 0; c < 16; ++c) _mm512_storeu_ps(out + c * out_stride, rows[c]);
}

// out[c][r] = in[r][c]·factor[c] for the 16 × 16 square at `in` (rows in_stride floats apart),
// into the 16 rows at `out` (out_stride apart): each loaded row times `factor` lane by lane, then
// transposed. Every product is one f32 multiplication, as the scalar loops compute it.
HWY_INLINE void TransposeScaledSquare(const float* in, int64_t in_stride, __m512 factor, float* out,
                                      int64_t out_stride) {
  __m512 rows[16];
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) rows[r] = _mm512_mul_ps(_mm512_loadu_ps(in + r * in_stride), factor);
  Transpose16(rows);
  StoreRows16(rows, out, out_stride);
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::detail::fused
HWY_AFTER_NAMESPACE();

#endif  // MASKATTN_KERNELS_TRANSPOSE_INL_H_
