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
// and one 32-bit gather per 16 pairs (amx_pack.cc, with the backward's packing of P and dS).
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
//
// The unit (end of this file, kAmxUnit: product_unit.h) is what the drivers see: Vᵀ packed per
// call, the query pairs and the tile configuration per block (released after it), these products
// per tile, its per-thread operands carved from the drivers' unit workspace (forward_operands,
// backward_operands: the one place their order and sizes are written), and the fused tile where no
// modifier sits between the products (raw scores, amx_softmax_step, P·V deferred by one tile:
// fused_block.cc). Its backward entries run a finite tile pair's five products on the tiles (the
// backward driver's guarded pairs stay f32).
#include "kernels/amx.h"

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "core/reused.h"
#include "kernels/bf16_dot.h"
#include "kernels/fused_backward_block.h"
#include "kernels/fused_block.h"
#include "kernels/product_unit.h"
#include "kernels/scratch_arena.h"

namespace maskattn::detail::fused {

#define MASKATTN_AMX_TARGET \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

namespace {

static_assert(kTileQ == 64 && kTileK == 64, "the AMX products assume 64 × 64 tiles");

constexpr int64_t kGroup = 16;  // rows of a tile register

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

}  // namespace maskattn::detail::fused

// ---- the product unit (product_unit.h) ------------------------------------------------------

namespace maskattn::detail::fused {

namespace {

struct AmxUnit;  // tag of this unit's reused() buffers

bool fits(int64_t head_dim, int64_t value_dim, bool contiguous_rows) {
  return contiguous_rows && amx_fits(head_dim, value_dim);
}

double call_bytes(const Problem& p) {
  const double keys = static_cast<double>(p.k.size(0)) * p.k.size(1) * p.k_len;
  return 2.0 * (keys + kTileK * p.batch * p.kv_heads) * p.value_dim;
}

// V's key tiles transposed once for all query blocks: [B, Hkv, k_tiles, Dv, kTileK] bf16.
const void* prepare(Problem& p) {
  std::vector<uint16_t>& packed = reused<uint16_t, AmxUnit>();
  packed.resize(p.batch * p.kv_heads * (p.k_len + kTileK - 1) / kTileK * p.value_dim * kTileK);
  amx_pack_row_tiles(p.v, packed.data(), p.threads > 0 ? p.threads : omp_get_max_threads());
  return packed.data();
}

// The forward's per-thread operands (Scratch::unit), in this order: the bf16 unit's q_pairs and
// p_pairs (bf16_pack_block_queries packs the former), then k_tail [16][D], the copy of a key
// tile's last rows. scratch_arena.h's carving (64-byte aligned, a spare line after each): the
// offsets stay apart modulo 4 KiB, which matters on the tiles.
struct ForwardOperands {
  uint32_t* q_pairs;
  uint32_t* p_pairs;
  uint16_t* k_tail;
};

ForwardOperands forward_operands(ScratchCarver& carve, int64_t head_dim) {
  const Bf16Operands pairs = bf16_operands(carve, head_dim);
  return {pairs.q_pairs, pairs.p_pairs, carve.take<uint16_t>(kGroup * head_dim)};
}

int64_t thread_bytes(int64_t head_dim, int64_t) {
  ScratchCarver count(nullptr);
  forward_operands(count, head_dim);
  return count.bytes();
}

ForwardOperands operands(const Context& c, const Scratch& scratch) {
  ScratchCarver carve(scratch.unit);
  return forward_operands(carve, c.problem->head_dim);
}

// The query pairs, then the tile configuration: configured per block and released after it
// (cheap next to a block's work, and no thread holds 8 KiB of tile state between calls).
void begin_block(const Context& c, const Block& blk, Scratch& scratch) {
  bf16_pack_block_queries(c, blk, scratch);
  amx_begin();
}

void scores_scaled(const Context& c, const Block& blk, int64_t g, int64_t j0, int64_t rows,
                   float scale, Scratch& scratch) {
  const Problem& p = *c.problem;
  const ForwardOperands ops = operands(c, scratch);
  amx_scores(static_cast<const uint16_t*>(p.k.data()) + p.k.offset({blk.b, g, j0, 0}),
             p.k.stride(2), rows, p.head_dim, ops.q_pairs, scale, ops.k_tail, scratch.s);
}

void scores(const Context& c, const Block& blk, int64_t g, int64_t j0, int64_t rows,
            const ActiveRows*, Scratch& scratch) {
  scores_scaled(c, blk, g, j0, rows, static_cast<float>(c.problem->scale), scratch);
}

void raw_scores(const Context& c, const Block& blk, int64_t g, int64_t j0, int64_t rows,
                Scratch& scratch) {
  scores_scaled(c, blk, g, j0, rows, 1.0f, scratch);
}

void raw_softmax_step(const Context& c, int64_t rows, Scratch& scratch) {
  amx_softmax_step(scratch.s, rows, static_cast<float>(c.problem->scale), scratch.row_max,
                   scratch.row_sum, scratch.alpha, scratch.poisoned, operands(c, scratch).p_pairs);
}

// O += P·V for key tile k_tile, whose P (as bf16 pairs) and α are in the scratch.
void accumulate_weights(const Context& c, const Block& blk, int64_t k_tile, Scratch& scratch) {
  const Problem& p = *c.problem;
  const int64_t k_tiles = (p.k_len + kTileK - 1) / kTileK;
  const uint16_t* vt =
      static_cast<const uint16_t*>(c.prepared) +
      ((blk.b * p.kv_heads + p.kv_head(blk.h)) * k_tiles + k_tile) * p.value_dim * kTileK;
  amx_accumulate(vt, p.value_dim, operands(c, scratch).p_pairs, scratch.alpha, scratch.o);
}

void accumulate(const Context& c, const Block& blk, int64_t, int64_t j0, int64_t rows,
                const ActiveRows*, Scratch& scratch) {
  amx_pack_weights(scratch.s, rows, operands(c, scratch).p_pairs);
  accumulate_weights(c, blk, j0 / kTileK, scratch);
}

// ---- backward: the five products of a finite tile pair on the tiles (fused_backward_block.cc)
// ---- P and dS are rounded to bf16 for the last three, as the forward rounds P. Qᵀ and dOᵀ are
// packed per query tile once per call (the A operands of dVᵀ and dKᵀ); per key tile, K and V as
// pairs (B of S and dP), K as pairs of rows (B of dQ), and dKᵀ, dVᵀ accumulate on the tiles' side,
// transposed, until the tile's pairs are done.

constexpr int64_t T = kBackwardTile;

// The backward's per-thread operands (BackwardScratch::unit), in this order (scratch_arena.h's
// carving, each 64-byte aligned with a spare line after it, so that pieces 4 KiB long stay apart
// modulo 4 KiB): the f32 accumulators dKᵀ [D][64], dVᵀ [Dv][64] and a short pair's dQ [64][D];
// the B operands as bf16 pairs, K and V pairs [⌈D/2⌉][64], [⌈Dv/2⌉][64] (of S and dP), K's row
// pairs [32][D] (of dQ), P and dS row pairs [32][64] (of dVᵀ and dKᵀ); and bf16 rows, dS [64][64]
// (A of dQ) and a short tile's Q or dO rows [64][max(D, Dv)], zero padded.
struct BackwardOperands {
  float* dk_t;
  float* dv_t;
  float* dq_tile;
  uint32_t* k_pairs;
  uint32_t* v_pairs;
  uint32_t* k_vnni;
  uint32_t* p_pairs;
  uint32_t* ds_pairs;
  uint16_t* ds_rows;
  uint16_t* a_rows;
};

BackwardOperands backward_operands(ScratchCarver& carve, int64_t d, int64_t e) {
  return {carve.take<float>(d * T),
          carve.take<float>(e * T),
          carve.take<float>(T * d),
          carve.take<uint32_t>((d + 1) / 2 * T),
          carve.take<uint32_t>((e + 1) / 2 * T),
          carve.take<uint32_t>(T / 2 * d),
          carve.take<uint32_t>(T / 2 * T),
          carve.take<uint32_t>(T / 2 * T),
          carve.take<uint16_t>(T * T),
          carve.take<uint16_t>(T * std::max(d, e))};
}

int64_t backward_thread_bytes(int64_t head_dim, int64_t value_dim) {
  ScratchCarver count(nullptr);
  backward_operands(count, head_dim, value_dim);
  return count.bytes();
}

BackwardOperands operands(const BackwardContext& c, const BackwardScratch& sc) {
  ScratchCarver carve(sc.unit);
  return backward_operands(carve, c.problem->head_dim, c.problem->value_dim);
}

bool backward_fits(const Problem& p) {
  return p.value_dim % 32 == 0;
}

double backward_call_bytes(const Problem& p) {
  return 2.0 * p.batch * p.q_heads * p.q_len * (p.head_dim + p.value_dim);
}

// Qᵀ and dOᵀ per query tile: [B, Hq, q_tiles, D, 64] then [B, Hq, q_tiles, Dv, 64], bf16.
const void* backward_prepare(const Problem& p, const TensorView& dout, int threads) {
  const int64_t q_tiles = (p.q_len + T - 1) / T;
  std::vector<uint16_t>& packed = reused<uint16_t, AmxUnit, 1>();
  packed.resize(p.batch * p.q_heads * q_tiles * T * (p.head_dim + p.value_dim));
  amx_pack_row_tiles(p.q, packed.data(), threads);
  amx_pack_row_tiles(dout, packed.data() + p.batch * p.q_heads * q_tiles * T * p.head_dim, threads);
  return packed.data();
}

const uint16_t* q_transposed(const BackwardContext& c) {
  return static_cast<const uint16_t*>(c.prepared);
}

const uint16_t* dout_transposed(const BackwardContext& c) {
  const Problem& p = *c.problem;
  return q_transposed(c) + p.batch * p.q_heads * ((p.q_len + T - 1) / T) * T * p.head_dim;
}

// The key tile's B operands for S, dP and dQ, and zeroed transposed dK/dV accumulators; starts
// the tile state for the tile's pairs (released by end_key_tile).
void begin_key_tile(const BackwardContext& c, int64_t b, int64_t g, int64_t j0, int64_t rows,
                    BackwardScratch& sc) {
  const Problem& p = *c.problem;
  const BackwardOperands ops = operands(c, sc);
  const auto* k = static_cast<const uint16_t*>(p.k.data()) + p.k.offset({b, g, j0, 0});
  const auto* v = static_cast<const uint16_t*>(p.v.data()) + p.v.offset({b, g, j0, 0});
  bf16_pack_queries(k, p.k.stride(2), rows, p.head_dim, ops.k_pairs);
  bf16_pack_queries(v, p.v.stride(2), rows, p.value_dim, ops.v_pairs);
  const int64_t filled = (rows + 1) / 2;
  bf16_pack_values(k, p.k.stride(2), rows, p.head_dim, ops.k_vnni);
  std::memset(ops.k_vnni + filled * p.head_dim, 0, (T / 2 - filled) * p.head_dim * 4);
  std::memset(ops.dk_t, 0, p.head_dim * T * sizeof(float));
  std::memset(ops.dv_t, 0, p.value_dim * T * sizeof(float));
  amx_begin();
}

// rows[j][x] += t[x][j] for x < width, j < 64 (the transposed accumulators into the rows).
MASKATTN_AMX_TARGET void add_transposed(const float* t, int64_t width, float* rows,
                                        int64_t row_stride) {
  for (int64_t x = 0; x < width; ++x) {
    for (int64_t j = 0; j < T; ++j) rows[j * row_stride + x] += t[x * T + j];
  }
}

void end_key_tile(const BackwardContext& c, BackwardScratch& sc) {
  const BackwardOperands ops = operands(c, sc);
  amx_end();
  add_transposed(ops.dk_t, c.problem->head_dim, sc.dk, c.dq_width);
  add_transposed(ops.dv_t, c.problem->value_dim, sc.dv, c.dv_width);
}

// `count` bf16 rows of a [B, H, L, W] view from row i0 of (b, h): in place when there are 64 of
// them, else copied into zero-padded scratch (a tile load reads 16 whole rows).
const uint16_t* tile_rows_bf16(const TensorView& t, int64_t b, int64_t h, int64_t i0, int64_t count,
                               uint16_t* scratch, int64_t& stride) {
  const auto* first = static_cast<const uint16_t*>(t.data()) + t.offset({b, h, i0, 0});
  const int64_t width = t.size(3);
  if (count == T) {
    stride = t.stride(2);
    return first;
  }
  std::memset(scratch, 0, T * width * sizeof(uint16_t));
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(scratch + i * width, first + i * t.stride(2), width * sizeof(uint16_t));
  }
  stride = width;
  return scratch;
}

// S = Q·Kᵀ, unscaled (backward_weights folds the scale in).
void backward_scores(const BackwardContext& c, const BackwardPair& pair, BackwardScratch& sc) {
  const Problem& p = *c.problem;
  const BackwardOperands ops = operands(c, sc);
  int64_t q_stride = 0;
  const uint16_t* q =
      tile_rows_bf16(p.q, pair.b, pair.h, pair.q_first, pair.q_count, ops.a_rows, q_stride);
  amx_product(q, q_stride, ops.k_pairs, T, sc.s, T, T, T, p.head_dim, false);
}

void backward_weights(const BackwardContext& c, const BackwardPair& pair, BackwardScratch& sc) {
  const Problem& p = *c.problem;
  const int64_t row0 = (pair.b * p.q_heads + pair.h) * p.q_len + pair.q_first;
  amx_backward_weights(sc.s, c.lse + row0, pair.q_count, static_cast<float>(p.scale));
}

void backward_dp(const BackwardContext& c, const BackwardPair& pair, BackwardScratch& sc) {
  const Problem& p = *c.problem;
  const BackwardOperands ops = operands(c, sc);
  int64_t dout_stride = 0;
  const uint16_t* dout = tile_rows_bf16(c.dout_input, pair.b, pair.h, pair.q_first, pair.q_count,
                                        ops.a_rows, dout_stride);
  amx_product(dout, dout_stride, ops.v_pairs, T, sc.ds, T, T, T, p.value_dim, false);
}

void backward_accumulate(const BackwardContext& c, const BackwardItem& item,
                         const BackwardPair& pair, BackwardScratch& sc) {
  const Problem& p = *c.problem;
  const int64_t dim = p.head_dim, value_dim = p.value_dim, q_tiles = (p.q_len + T - 1) / T;
  const int64_t q_count = pair.q_count;
  const BackwardOperands ops = operands(c, sc);
  // P and dS as pairs of query rows (zero past q_count) and dS as bf16 rows.
  amx_pack_weights(sc.s, q_count, ops.p_pairs);
  amx_pack_weights(sc.ds, q_count, ops.ds_pairs);
  amx_round_rows(sc.ds, T, ops.ds_rows);

  // dVᵀ += dOᵀ·P   dKᵀ += Qᵀ·dS   dQ_tile = dS·K
  const int64_t tile = (pair.b * p.q_heads + pair.h) * q_tiles + pair.q_tile;
  amx_product(dout_transposed(c) + tile * value_dim * T, T, ops.p_pairs, T, ops.dv_t, T, value_dim,
              T, T, true);
  amx_product(q_transposed(c) + tile * dim * T, T, ops.ds_pairs, T, ops.dk_t, T, dim, T, T, true);
  float* dq = c.dq_partial +
              (((item.chunk * p.batch + pair.b) * p.q_heads + pair.h) * p.q_len + pair.q_first) *
                  c.dq_width;
  if (q_count == T) {  // straight into the partial's rows
    amx_product(ops.ds_rows, T, ops.k_vnni, dim, dq, c.dq_width, T, dim, T, true);
    return;
  }
  // A short tile: its rows past q_count are not this head's, so the tile goes through scratch.
  amx_product(ops.ds_rows, T, ops.k_vnni, dim, ops.dq_tile, dim, T, dim, T, false);
  for (int64_t i = 0; i < q_count; ++i) {
    for (int64_t d = 0; d < dim; ++d) dq[i * c.dq_width + d] += ops.dq_tile[i * dim + d];
  }
}

}  // namespace

const ProductUnit kAmxUnit = {
    .name = "amx",
    .fits = fits,
    .thread_bytes = thread_bytes,
    .backward_thread_bytes = backward_thread_bytes,
    .call_bytes = call_bytes,
    .prepare = prepare,
    .begin_block = begin_block,
    .end_block = amx_end,
    .scores = scores,
    .accumulate = accumulate,
    .active_rows = false,
    .raw_scores = raw_scores,
    .raw_softmax_step = raw_softmax_step,
    .accumulate_weights = accumulate_weights,
    .backward_fits = backward_fits,
    .backward_call_bytes = backward_call_bytes,
    .backward_prepare = backward_prepare,
    .begin_key_tile = begin_key_tile,
    .end_key_tile = end_key_tile,
    .backward_scores = backward_scores,
    .backward_weights = backward_weights,
    .backward_dp = backward_dp,
    .backward_accumulate = backward_accumulate,
};

}  // namespace maskattn::detail::fused
