// bf16 products on Intel's matrix engine (AMX: Sapphire Rapids and later). The tile kernel
// (fused_block.cc) keeps its layout, queries across the columns, and only its two products move
// to the tiles; the softmax between them stays f32 on AVX-512. Design essay in amx.cc.
//
// Layouts (one 64 × 64 tile of the fused kernel; bf16_dot.h has the pair layouts):
//   q_pairs [D/2][kTileQ] uint32   (Q[i][2p], Q[i][2p+1]) — bf16_pack_queries, the B operand
//   K rows read in place           16 keys × 32 dims per A tile (a tail tile goes through a copy)
//   p_pairs [kTileK/2][kTileQ]     weights rounded to bf16 — bf16_pack_weights, the B operand
//   Vᵀ tiles [Dv][kTileK] bf16     values transposed per key tile, packed once per call, the A
//   operand
#pragma once

#include <cstdint>

namespace maskattn::detail::fused {

// CPUID says AMX-TILE and AMX-BF16, the OS enabled the tile state (XCR0 bits 17–18) and granted
// this process the permission to use it (arch_prctl ARCH_REQ_XCOMP_PERM, asked once).
bool amx_available();

// Shapes the AMX products take: D a multiple of 32 (a tile row is 32 bf16), Dv of 16.
bool amx_fits(int64_t head_dim, int64_t value_dim);

// A thread's tile configuration: load it before the products of one block, release the tile
// state after (so the OS need not save 8 KiB of tiles at every context switch).
void amx_begin();
void amx_end();

// s[j][i] = scale · Σ_d K[j][d]·Q[i][d] for j < rows ≤ kTileK; rows past `rows` up to the next
// multiple of 16 are written too (with scores of zero keys). `tail` holds 16·dim bf16.
void amx_scores(const uint16_t* k, int64_t k_stride, int64_t rows, int64_t dim,
                const uint32_t* q_pairs, float scale, uint16_t* tail, float* s);

// Vᵀ of one key tile: vt[e][j] = V[j][e] for j < rows ≤ kTileK, zero beyond. `pairs` is scratch
// of kTileK/2 · Dv uint32.
void amx_pack_values(const uint16_t* v, int64_t v_stride, int64_t rows, int64_t value_dim,
                     uint32_t* pairs, uint16_t* vt);

// o[e][i] = alpha[i]·o[e][i] + Σ_j V[j][e]·P[j][i] over the whole tile (p_pairs rows past the
// tile's keys must be zero, as the packed Vᵀ is).
void amx_accumulate(const uint16_t* vt, int64_t value_dim, const uint32_t* p_pairs,
                    const float* alpha, float* o);

}  // namespace maskattn::detail::fused
