// The tile kernel's two products on AMX tiles.
//
// Design. AMX adds eight tile registers of 16 rows × 64 bytes and one product,
//     tdpbf16ps C, A, B:   C[m][n] += Σ_k A[m][2k]·B[k][2n] + A[m][2k+1]·B[k][2n+1]
// with A a 16 × 32 bf16 tile, B a 16 × 16 tile of bf16 *pairs* (the "VNNI" layout) and C a
// 16 × 16 f32 tile: 16 Kflop per instruction, ≈ 30× the f32 FMA rate of one AVX-512 core on the
// Xeon we measured (../docs/benchmarks.md). The tile kernel holds a block transposed, queries
// across the columns, and that happens to be the layout AMX wants on both sides:
//
//     Sᵀ[j][i] = Σ_d K[j][d]·Q[i][d]   A = K rows in place,   B = q_pairs[d/2][i] (packed per
//     block) Oᵀ[e][i] += Σ_j Vᵀ[e][j]·P[j][i]  A = Vᵀ per key tile,   B = p_pairs[j/2][i] (packed
//     per tile)
//
// so the softmax between them (softmax-inl.h, f32 on AVX-512) runs unchanged on Sᵀ and the
// vdpbf16ps kernel's packing code (bf16_dot.cc) makes both B operands. Only Vᵀ is new: packed once
// per call (each value tile is read by every query block of its head), through the pair layout
// and one 32-bit gather per 16 pairs.
//
// Blocking: "B-stationary". For D = 64 the four B tiles of two query columns (2 × 16 queries × 2
// halves of D) stay in registers while the key rows stream past in A tiles — 2 C + 2 A + 4 B = all
// 8 tiles; the measurement (docs/benchmarks.md) gave 76 % of the engine's peak for this order
// against 66 % for the classic 2 × 2 blocking. Other D go through a plain loop over D.
//
// Rounding: products of bf16 are exact in f32 and AMX accumulates in f32, so S differs from the
// vdpbf16ps kernel's only in summation order. P is rounded to bf16 for P·V, as there. The scale is
// applied to S in f32 afterwards (folding it into the bf16 queries would round again). AMX treats
// bf16 subnormals as zero; they are below 1e-38 and change no result at our tolerances.
//
// Edges: a tile row is 64 bytes, so D must be a multiple of 32 and Dv of 16 (amx_fits; other
// shapes take the vdpbf16ps or f32 kernel). A key tile's last 16-row group may run past the
// tensor: that group is copied into zero-padded scratch first, never read past its end.
//
// Permission: Linux enables the 8 KiB tile state per process on request (arch_prctl
// ARCH_REQ_XCOMP_PERM); amx_available() asks once, and a refusal means the other kernels run.
// The configuration is loaded from a static: GCC 12 drops the stores to a local configuration
// before `_tile_loadconfig` as dead (seen crashing), hence the asm memory operand.
#include "kernels/amx.h"

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "kernels/bf16_dot.h"
#include "kernels/fused_block.h"

namespace maskattn::detail::fused {

#define MASKATTN_AMX_TARGET \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

namespace {

static_assert(kTileQ == 64 && kTileK == 64, "the AMX products assume 64 × 64 tiles");

constexpr int64_t kGroup = 16;             // rows of a tile register
constexpr int64_t kRowBytes = kTileQ * 4;  // a row of s, o, q_pairs and p_pairs: 64 floats/pairs

struct alignas(64) TileConfig {
  uint8_t palette = 1;  // palette 1: 8 tiles of at most 16 rows × 64 bytes
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t column_bytes[16] = {};
  uint8_t rows[16] = {};
};

const TileConfig& tile_config() {
  static const TileConfig config = [] {
    TileConfig c;
    for (int t = 0; t < 8; ++t) {
      c.rows[t] = kGroup;
      c.column_bytes[t] = 64;
    }
    return c;
  }();
  return config;
}

uint64_t extended_control_register() {
  uint32_t low = 0, high = 0;
  asm volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
  return (static_cast<uint64_t>(high) << 32) | low;
}

bool cpu_has_amx() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0 || (c & bit_OSXSAVE) == 0) return false;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  constexpr unsigned kAmxBf16 = 1u << 22, kAmxTile = 1u << 24;
  if ((d & kAmxBf16) == 0 || (d & kAmxTile) == 0) return false;
  constexpr uint64_t kTileState = 3ull << 17;  // XTILECFG and XTILEDATA enabled by the OS
  return (extended_control_register() & kTileState) == kTileState;
}

bool request_tile_permission() {
  constexpr long kRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
  constexpr long kTileData = 18;               // XFEATURE_XTILEDATA
  return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
}

std::atomic<int> refusals{0};  // live ScopedAmxRefusal objects

}  // namespace

bool amx_available() {
  static const bool available = cpu_has_amx() && bf16_dot_available() && request_tile_permission();
  return available && refusals.load(std::memory_order_relaxed) == 0;
}

ScopedAmxRefusal::ScopedAmxRefusal() {
  refusals.fetch_add(1);
}
ScopedAmxRefusal::~ScopedAmxRefusal() {
  refusals.fetch_sub(1);
}

bool amx_fits(int64_t head_dim, int64_t value_dim) {
  return head_dim > 0 && head_dim % 32 == 0 && value_dim > 0 && value_dim % 16 == 0;
}

MASKATTN_AMX_TARGET void amx_begin() {
  asm volatile("ldtilecfg %0" ::"m"(tile_config()));
}

MASKATTN_AMX_TARGET void amx_end() {
  _tile_release();
}

namespace {

// C[m][n] (+)= A·B for k = 64, "B-stationary": the four B tiles of two 16-column blocks (tiles
// 4–7) stay while the row groups pass through A (2, 3) and C (0, 1). Every product of the forward
// and most of the backward's have this shape.
MASKATTN_AMX_TARGET void product_k64(const uint16_t* a, int64_t a_bytes, const uint32_t* b,
                                     int64_t b_stride, float* c, int64_t c_stride, int64_t m,
                                     int64_t n, bool accumulate) {
  const int64_t b_bytes = b_stride * 4, c_bytes = c_stride * 4;
  for (int64_t col = 0; col < n; col += 2 * kGroup) {
    _tile_loadd(4, b + col, b_bytes);
    _tile_loadd(5, b + col + kGroup, b_bytes);
    _tile_loadd(6, b + kGroup * b_stride + col, b_bytes);
    _tile_loadd(7, b + kGroup * b_stride + col + kGroup, b_bytes);
    for (int64_t row = 0; row < m; row += kGroup) {
      const uint16_t* a0 = a + row * (a_bytes / 2);
      float* c0 = c + row * c_stride + col;
      if (accumulate) {
        _tile_loadd(0, c0, c_bytes);
        _tile_loadd(1, c0 + kGroup, c_bytes);
      } else {
        _tile_zero(0);
        _tile_zero(1);
      }
      _tile_loadd(2, a0, a_bytes);
      _tile_loadd(3, a0 + 32, a_bytes);
      _tile_dpbf16ps(0, 2, 4);
      _tile_dpbf16ps(1, 2, 5);
      _tile_dpbf16ps(0, 3, 6);
      _tile_dpbf16ps(1, 3, 7);
      _tile_stored(0, c0, c_bytes);
      _tile_stored(1, c0 + kGroup, c_bytes);
    }
  }
}

}  // namespace

MASKATTN_AMX_TARGET void amx_scores(const uint16_t* k, int64_t k_stride, int64_t rows, int64_t dim,
                                    const uint32_t* q_pairs, float scale, uint16_t* tail,
                                    float* s) {
  const int64_t full_groups = rows / kGroup, left = rows % kGroup;
  const uint16_t* tail_rows = nullptr;
  if (left > 0) {
    std::memset(tail, 0, kGroup * dim * sizeof(uint16_t));
    for (int64_t r = 0; r < left; ++r) {
      std::memcpy(tail + r * dim, k + (full_groups * kGroup + r) * k_stride, dim * 2);
    }
    tail_rows = tail;
  }
  // The key rows in place, then the copied tail group.
  amx_product(k, k_stride, q_pairs, kTileQ, s, kTileQ, full_groups * kGroup, kTileQ, dim, false);
  if (tail_rows != nullptr) {
    amx_product(tail_rows, dim, q_pairs, kTileQ, s + full_groups * kGroup * kTileQ, kTileQ, kGroup,
                kTileQ, dim, false);
  }
  if (scale == 1.0f) return;
  const __m512 factor = _mm512_set1_ps(scale);
  const int64_t written = (full_groups + (left > 0 ? 1 : 0)) * kGroup;
  for (int64_t n = 0; n < written * kTileQ; n += 16) {
    _mm512_storeu_ps(s + n, _mm512_mul_ps(factor, _mm512_loadu_ps(s + n)));
  }
}

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

MASKATTN_AMX_TARGET void amx_accumulate(const uint16_t* vt, int64_t value_dim,
                                        const uint32_t* p_pairs, const float* alpha, float* o) {
  // O·α first (in place, skipped when no row maximum moved), then O += P·V on the tiles.
  __m512 a[4];
  __mmask16 moved = 0;
  for (int c = 0; c < 4; ++c) {
    a[c] = _mm512_loadu_ps(alpha + 16 * c);
    moved |= _mm512_cmp_ps_mask(a[c], _mm512_set1_ps(1.0f), _CMP_NEQ_UQ);
  }
  if (moved != 0) {
    for (int64_t e = 0; e < value_dim; ++e) {
      for (int c = 0; c < 4; ++c) {
        float* row = o + e * kTileQ + 16 * c;
        _mm512_storeu_ps(row, _mm512_mul_ps(a[c], _mm512_loadu_ps(row)));
      }
    }
  }
  product_k64(vt, kTileK * 2, p_pairs, kTileQ, o, kTileQ, value_dim, kTileQ, true);
}

MASKATTN_AMX_TARGET void amx_product(const uint16_t* a, int64_t a_stride, const uint32_t* b,
                                     int64_t b_stride, float* c, int64_t c_stride, int64_t m,
                                     int64_t n, int64_t k, bool accumulate) {
  if (k == 64 && n % (2 * kGroup) == 0) {
    product_k64(a, a_stride * 2, b, b_stride, c, c_stride, m, n, accumulate);
    return;
  }
  // Any k: two C tiles side by side (0, 1), one A (2), two B (4, 5), B reloaded per row group.
  const int64_t a_bytes = a_stride * 2, b_bytes = b_stride * 4, c_bytes = c_stride * 4;
  for (int64_t col = 0; col < n; col += 2 * kGroup) {
    const bool two = col + kGroup < n;
    for (int64_t row = 0; row < m; row += kGroup) {
      float* c0 = c + row * c_stride + col;
      if (accumulate) {
        _tile_loadd(0, c0, c_bytes);
        if (two) _tile_loadd(1, c0 + kGroup, c_bytes);
      } else {
        _tile_zero(0);
        _tile_zero(1);
      }
      for (int64_t inner = 0; inner < k; inner += 32) {
        const uint32_t* b0 = b + (inner / 2) * b_stride + col;
        _tile_loadd(2, a + row * a_stride + inner, a_bytes);
        _tile_loadd(4, b0, b_bytes);
        _tile_dpbf16ps(0, 2, 4);
        if (two) {
          _tile_loadd(5, b0 + kGroup, b_bytes);
          _tile_dpbf16ps(1, 2, 5);
        }
      }
      _tile_stored(0, c0, c_bytes);
      if (two) _tile_stored(1, c0 + kGroup, c_bytes);
    }
  }
}

MASKATTN_AMX_TARGET void amx_round_rows(const float* in, int64_t rows, uint16_t* out) {
  for (int64_t n = 0; n < rows * 64; n += 32) {
    const __m512bh halves =
        _mm512_cvtne2ps_pbh(_mm512_loadu_ps(in + n + 16), _mm512_loadu_ps(in + n));
    _mm512_storeu_si512(out + n, (__m512i)halves);
  }
}

}  // namespace maskattn::detail::fused
