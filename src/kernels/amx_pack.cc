// The AMX unit's operand packing (amx.h declares it; amx.cc's essay has the layouts): value, query
// and dO rows transposed per 64-row tile once per call (the A operand of P·V, dVᵀ and dKᵀ), P and
// dS as bf16 pairs of rows (the B operand, the tail zeroed) and dS as bf16 rows (the A of dQ).
// AVX-512 code, no tile instructions; compiled for amx.cc's instruction set and called only where
// the AMX unit runs. Apart from amx.cc only to keep each file within the size rule.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/amx.h"
#include "kernels/bf16_dot.h"
#include "kernels/fused_block.h"

namespace maskattn::detail::fused {

#define MASKATTN_AMX_TARGET \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

namespace {

// Vᵀ of one tile of rows: vt[e][j] = V[j][e] for j < rows ≤ 64, zero beyond; `pairs` is scratch of
// 32 · Dv uint32.
MASKATTN_AMX_TARGET void pack_tile_transposed(const uint16_t* v, int64_t v_stride, int64_t rows,
                                              int64_t value_dim, uint32_t* pairs, uint16_t* vt) {
  constexpr int64_t kPairRows = kTileK / 2;
  const int64_t filled = (rows + 1) / 2;
  bf16_pack_values(v, v_stride, rows, value_dim, pairs);
  std::memset(pairs + filled * value_dim, 0, (kPairRows - filled) * value_dim * sizeof(uint32_t));
  // vt as uint32 [Dv][32]: the pair of keys (2t, 2t+1) of column e is pairs[t][e].
  const __m512i index =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(value_dim)));
  auto* out = reinterpret_cast<uint32_t*>(vt);
  for (int64_t e = 0; e < value_dim; ++e) {
    for (int64_t t = 0; t < kPairRows; t += 16) {
      _mm512_storeu_si512(out + e * kPairRows + t,
                          _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), 0xFFFF, index,
                                                      pairs + t * value_dim + e, 4));
    }
  }
}

}  // namespace

void amx_pack_row_tiles(const TensorView& t, uint16_t* out, int threads) {
  const int64_t heads = t.size(0) * t.size(1), len = t.size(2), width = t.size(3);
  const int64_t tiles = (len + kTileK - 1) / kTileK;
#pragma omp parallel num_threads(threads)
  {
    std::vector<uint32_t> pairs(kTileK / 2 * width);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < heads * tiles; ++n) {
      const int64_t bh = n / tiles, i0 = n % tiles * kTileK;
      const auto* rows = static_cast<const uint16_t*>(t.data()) +
                         t.offset({bh / t.size(1), bh % t.size(1), i0, 0});
      pack_tile_transposed(rows, t.stride(2), std::min(kTileK, len - i0), width, pairs.data(),
                           out + n * width * kTileK);
    }
  }
}

void amx_pack_weights(const float* s, int64_t rows, uint32_t* pairs) {
  bf16_pack_weights(s, rows, pairs);
  const int64_t filled = (rows + 1) / 2;
  std::memset(pairs + filled * kTileQ, 0, (kTileK / 2 - filled) * kTileQ * sizeof(uint32_t));
}

MASKATTN_AMX_TARGET void amx_round_rows(const float* in, int64_t rows, uint16_t* out) {
  for (int64_t n = 0; n < rows * 64; n += 32) {
    const __m512bh halves =
        _mm512_cvtne2ps_pbh(_mm512_loadu_ps(in + n + 16), _mm512_loadu_ps(in + n));
    _mm512_storeu_si512(out + n, (__m512i)halves);
  }
}

}  // namespace maskattn::detail::fused
