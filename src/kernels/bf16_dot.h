// bf16 products on CPUs with AVX512-BF16 (vdpbf16ps: 32 bf16 products summed in pairs into 16 f32
// lanes per instruction, twice the f32 FMA rate). Highway 1.0.3 has no such operation, so these
// few functions use the intrinsics directly, compiled for that instruction set and called only
// after bf16_dot_available() said yes at run time. bf16_dot.cc ends with the unit's table entry
// (kBf16DotUnit, product_unit.h): V paired once per call, Q per block, these products per tile; it
// has no backward products (a backward call takes the f32 unit's).
//
// Layouts (one tile of the fused kernel, queries across lanes as everywhere there):
//   q_pairs [D/2][kTileQ] uint32: (Q[i][2p], Q[i][2p+1]) per query i  — packed once per q-block
//   K rows read in place: K[j][2p], K[j][2p+1] are adjacent in memory  — broadcast as one uint32
//   p_pairs [kTileK/2][kTileQ] uint32: (P[2t][i], P[2t+1][i]), weights rounded to bf16
//   v_pairs [kTileK/2][Dv] uint32: (V[2t][e], V[2t+1][e])             — packed once per call
// q_pairs and p_pairs are the unit's per-thread operands (ProductUnit::thread_bytes), carved from
// Scratch::unit by bf16_operands; the AMX unit's forward operands begin with the same two.
#pragma once

#include <cstdint>

#include "kernels/scratch_arena.h"

namespace maskattn::detail::fused {

struct Context;
struct Block;
struct Scratch;

// The unit's per-thread operands, in this order: q_pairs [⌈D/2⌉][kTileQ], p_pairs
// [kTileK/2][kTileQ] (scratch_arena.h's carving: each 64-byte aligned, a spare line after it).
struct Bf16Operands {
  uint32_t* q_pairs;
  uint32_t* p_pairs;
};
Bf16Operands bf16_operands(ScratchCarver& carve, int64_t head_dim);

bool bf16_dot_available();

// vdpbf16ps's flop rate over the f32 FMA rate on this core, measured once per process (≈ 0.1 ms;
// 0 without AVX512-BF16). CPUID cannot tell: it is 2 on AMD Zen 5, 0.5 on Intel Sapphire Rapids.
double bf16_dot_speedup();

// q_pairs from `count` query rows of bf16 (row i at rows + i·row_stride), D even; columns beyond
// count are zero.
void bf16_pack_queries(const uint16_t* rows, int64_t row_stride, int64_t count, int64_t dim,
                       uint32_t* q_pairs);

// s[j][i] = scale · Σ_d K[j][d]·Q[i][d] for j < rows (K bf16 rows in place, D even).
void bf16_scores(const uint16_t* k, int64_t k_stride, int64_t rows, int64_t dim,
                 const uint32_t* q_pairs, float scale, float* s);

// p_pairs from the f32 weights s [rows][kTileQ] (an odd last row is paired with zeros).
void bf16_pack_weights(const float* s, int64_t rows, uint32_t* p_pairs);

// v_pairs from `rows` bf16 value rows (row j at v + j·v_stride).
void bf16_pack_values(const uint16_t* v, int64_t v_stride, int64_t rows, int64_t value_dim,
                      uint32_t* v_pairs);

// o[e][i] = alpha[i]·o[e][i] + Σ_j V[j][e]·P[j][i], over ⌈rows/2⌉ pairs.
void bf16_accumulate(const uint32_t* v_pairs, int64_t rows, int64_t value_dim,
                     const uint32_t* p_pairs, const float* alpha, float* o);

// The block's queries as the q_pairs of Scratch::unit (bf16_pack_queries): the bf16 units'
// begin_block.
void bf16_pack_block_queries(const Context& c, const Block& blk, Scratch& scratch);

}  // namespace maskattn::detail::fused
