// bf16 products on Intel's matrix engine (AMX: Sapphire Rapids and later). The tile kernel
// (fused_block.cc) keeps its layout, queries across the columns, and only its two products move
// to the tiles; the softmax between them stays f32 on AVX-512. Design essay in amx.cc, which ends
// with the unit's table entry (kAmxUnit, product_unit.h): the forward's products and its fused,
// pipelined tile (amx_softmax.cc), and the backward's five products.
//
// Layouts (one 64 × 64 tile of the fused kernel; bf16_dot.h has the pair layouts; the per-thread
// ones are carved from the drivers' unit workspace by amx.cc's forward_operands and
// backward_operands):
//   q_pairs [D/2][kTileQ] uint32   (Q[i][2p], Q[i][2p+1]) — bf16_pack_queries, the B operand
//   K rows read in place           16 keys × 32 dims per A tile (a tail tile goes through a copy)
//   p_pairs [kTileK/2][kTileQ]     weights rounded to bf16 — bf16_pack_weights, the B operand
//   Vᵀ tiles [Dv][kTileK] bf16     values transposed per key tile, packed once per call, the A
//   operand
#pragma once

#include <cstdint>

#include "maskattn/tensor.h"

namespace maskattn::detail::fused {

// CPUID says AMX-TILE and AMX-BF16, the OS enabled the tile state (XCR0 bits 17–18) and granted
// this process the permission to use it (arch_prctl ARCH_REQ_XCOMP_PERM, asked once).
bool amx_available();

// For tests: while one lives, amx_available() answers as if Linux had refused the tile state, so
// that the fallback and the error for a forced AMX run on any CPU.
class ScopedAmxRefusal {
 public:
  ScopedAmxRefusal();
  ~ScopedAmxRefusal();
  ScopedAmxRefusal(const ScopedAmxRefusal&) = delete;
  ScopedAmxRefusal& operator=(const ScopedAmxRefusal&) = delete;
};

// Shapes the AMX products take: D a multiple of 32 (a tile row is 32 bf16), Dv of 16.
bool amx_fits(int64_t head_dim, int64_t value_dim);

// A thread's tile configuration: load it before the products of one block, release the tile
// state after (so the OS need not save 8 KiB of tiles at every context switch).
void amx_begin();
void amx_end();

// s[j][i] = scale · Σ_d K[j][d]·Q[i][d] for j < rows ≤ kTileK; rows past `rows` up to the next
// multiple of 16 are written too (with scores of zero keys). `tail` holds 16·dim bf16. A scale
// of 1 skips the pass that applies it.
void amx_scores(const uint16_t* k, int64_t k_stride, int64_t rows, int64_t dim,
                const uint32_t* q_pairs, float scale, uint16_t* tail, float* s);

// The online-softmax step on raw scores s[j][i] = Σ_d K[j][d]·Q[i][d] (amx_scores with scale 1),
// the scale folded in (0 < scale ≤ 1), writing the weights as bf16 pairs into p_pairs (zero past
// `rows`) instead of f32 into s: softmax-inl.h's rules, design in amx_softmax.cc.
void amx_softmax_step(const float* s, int64_t rows, float scale, float* row_max, float* row_sum,
                      float* alpha, float* poisoned, uint32_t* p_pairs);

// The backward's P = exp(scale·S − LSE) in place on raw scores [q_count][64] (0 for rows with
// LSE −inf and for −inf scores); amx_softmax.cc.
void amx_backward_weights(float* s, const float* lse, int64_t q_count, float scale);

// Every 64-row tile of a bf16 [B, H, L, W] view with contiguous rows, transposed:
// out[b][h][tile][x][r] = t[b][h][64·tile + r][x], zero past L; [B, H, ⌈L/64⌉, W, 64] in all. The
// A operand of P·V (Vᵀ per key tile, forward) and of the backward's dVᵀ and dKᵀ (dOᵀ, Qᵀ per query
// tile); packed once per call, on `threads` threads.
void amx_pack_row_tiles(const TensorView& t, uint16_t* out, int threads);

// P (or dS) [rows][64] f32 as the B operand: bf16 pairs of rows (bf16_pack_weights), the pair rows
// past `rows` zeroed up to kTileK/2 (they meet zero padding in A, and must not be stale).
void amx_pack_weights(const float* s, int64_t rows, uint32_t* pairs);

// o[e][i] = alpha[i]·o[e][i] + Σ_j V[j][e]·P[j][i] over the whole tile (p_pairs rows past the
// tile's keys must be zero, as the packed Vᵀ is).
void amx_accumulate(const uint16_t* vt, int64_t value_dim, const uint32_t* p_pairs,
                    const float* alpha, float* o);

// The general product for the backward's five: C[m][n] (+)= Σ_k A[m][k]·B[k/2][n] with A bf16
// rows (`a_stride` elements apart), B bf16 pairs (`b_stride` pairs apart), C f32 (`c_stride`
// floats apart); m and n multiples of 16, k of 32. Within amx_begin()/amx_end().
void amx_product(const uint16_t* a, int64_t a_stride, const uint32_t* b, int64_t b_stride, float* c,
                 int64_t c_stride, int64_t m, int64_t n, int64_t k, bool accumulate);

// out[r][x] = bf16(in[r][x]) for `rows` rows of 64 floats (round to nearest even).
void amx_round_rows(const float* in, int64_t rows, uint16_t* out);

}  // namespace maskattn::detail::fused
