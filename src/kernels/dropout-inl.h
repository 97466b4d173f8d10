// Attention dropout inside the fused kernels: the keep bits of a 64-key tile, made eight Philox
// instances per vector, and applied to a tile of weights. Compiled once per Highway target (the
// "-inl.h" convention).
//
// Design. core/dropout.h defines which pairs are kept (Philox4x32-10 of the pair's global rows);
// this file makes the same bits fast. One Philox instance yields eight 16-bit draws, and the
// counter gives instance o of a 64-key group the keys 4o..4o+3 (words x0, x1) and 32+4o..32+4o+3
// (words x2, x3) of one query. So DropoutRowBits (one query, 64 keys) runs the eight instances
// side by side, one per u64 lane; interleaving x0 with x1 (and x2 with x3) as u32 lanes puts the
// draws of keys 0..31 (32..63) in key order in 16-bit lanes, and one saturating subtraction and
// compare per vector gives the row's 64 keep bits as two lane masks. The forward's tile, which
// wants bits per key over 64 queries, runs one instance across 8 queries instead and picks each
// key's query bits out of the lane masks with pext (DropoutKeyColumns); targets without BMI2 make
// 64 rows and transpose them (transpose_bits).
//
// A Philox round on u64 lanes holding 32-bit words is two MulEven (32×32→64), two shifts and two
// three-way XORs: the low half of a product is the product itself, since MulEven reads only the low
// 32 bits of each lane and the draws take only those, so the high garbage never needs clearing.
// On AVX-512 that is ~65 operations for a row of 64 keep bits, ~1 per pair against the 2·D
// multiply-adds the pair's two products cost. The bits are tested against core/dropout.h's scalar
// definition for every target (tests/dropout_test.cc).
#if defined(MASKATTN_KERNELS_DROPOUT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MASKATTN_KERNELS_DROPOUT_INL_H_
#undef MASKATTN_KERNELS_DROPOUT_INL_H_
#else
#define MASKATTN_KERNELS_DROPOUT_INL_H_
#endif

#include <hwy/highway.h>

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>

#include "core/dropout.h"
#include "kernels/simd-inl.h"
#include "kernels/transpose_bits.h"

HWY_BEFORE_NAMESPACE();
namespace maskattn::detail::fused {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR

using DU64 = hn::ScalableTag<uint64_t>;
using VU64 = hn::Vec<DU64>;

// Philox4x32 rounds [first_round, 10) on R states in flight, each lane one instance (its words
// in the low halves of x[r][0..3]; the high halves may hold garbage: MulEven reads only the low
// 32 bits, and the draws take only those). One round waits on its multiply, so a single state is
// latency-bound and R independent ones fill the pipes.
template <int R>
HWY_INLINE void PhiloxRounds(VU64 (&x)[R][4], int first_round, uint32_t k0, uint32_t k1) {
  const DU64 d;
  const hn::Repartition<uint32_t, DU64> d32;
  const auto m0 = hn::Set(d32, kPhiloxM0), m1 = hn::Set(d32, kPhiloxM1);
  k0 += first_round * kPhiloxW0;
  k1 += first_round * kPhiloxW1;
  for (int round = first_round; round < kPhiloxRounds; ++round) {
    const VU64 key0 = hn::Set(d, k0), key1 = hn::Set(d, k1);
    for (int r = 0; r < R; ++r) {
      const VU64 p0 = hn::MulEven(hn::BitCast(d32, x[r][0]), m0);
      const VU64 p1 = hn::MulEven(hn::BitCast(d32, x[r][2]), m1);
      x[r][0] = hn::Xor3(hn::ShiftRight<32>(p1), x[r][1], key0);
      x[r][1] = p1;
      x[r][2] = hn::Xor3(hn::ShiftRight<32>(p0), x[r][3], key1);
      x[r][3] = p0;
    }
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
}

// The kept draws of one state as lane masks: bit 4·l + t of `low` is draw t < 4 of lane l (words
// x0, x1), of `high` draw 4 + t (words x2, x3) — interleaving x0 with x1 as u32 lanes puts the
// draws in 16-bit lanes in that order. kept ⇔ draw ≥ T ⇔ T ⊖ draw = 0 (saturating: no unsigned
// compare needed).
struct KeptDraws {
  uint64_t low = 0, high = 0;
};
HWY_INLINE KeptDraws KeptDrawsOf(const VU64 (&x)[4], uint16_t threshold) {
  const hn::Repartition<uint32_t, DU64> d32;
  const hn::Repartition<uint16_t, DU64> d16;
  const auto limit = hn::Set(d16, threshold);
  const auto low = hn::BitCast(
      d16, hn::OddEven(hn::BitCast(d32, hn::ShiftLeft<32>(x[1])), hn::BitCast(d32, x[0])));
  const auto high = hn::BitCast(
      d16, hn::OddEven(hn::BitCast(d32, hn::ShiftLeft<32>(x[3])), hn::BitCast(d32, x[2])));
  KeptDraws kept;
  hn::StoreMaskBits(d16, hn::Eq(hn::SaturatedSub(limit, low), hn::Zero(d16)),
                    reinterpret_cast<uint8_t*>(&kept.low));
  hn::StoreMaskBits(d16, hn::Eq(hn::SaturatedSub(limit, high), hn::Zero(d16)),
                    reinterpret_cast<uint8_t*>(&kept.high));
  return kept;
}

// Rows r < R of keep bits: out[r] bit j = pair (q[r], kv0 + j) of head row bh[r] kept (kv0 a
// multiple of 64; bits past the problem's keys are draws of keys that do not exist: callers
// ignore them), R rows in flight.
template <int R>
HWY_INLINE void DropoutRowGroup(const DropoutRule& rule, const uint32_t* bh, const int64_t* q,
                                int64_t kv0, uint64_t* HWY_RESTRICT out) {
  for (int r = 0; r < R; ++r) out[r] = 0;
  if (rule.threshold > 0xFFFF) return;  // p' = 1: every pair dropped
  const DU64 d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  // Lane numbers built once: Highway 1.0's Iota goes through memory (a store-forwarding stall
  // per call, measured as most of this function's time when it sat in the loop).
  const VU64 lane = hn::Iota(d, 0);
  const uint32_t column0 = dropout_counter_column(kv0);
  for (int64_t o = 0; o < 8; o += lanes) {
    VU64 x[R][4];
    for (int r = 0; r < R; ++r) {
      x[r][0] = hn::Add(lane, hn::Set(d, column0 + o));
      x[r][1] = hn::Set(d, static_cast<uint32_t>(q[r]));
      x[r][2] = hn::Set(d, bh[r]);
      x[r][3] = hn::Set(d, rule.offset);
    }
    PhiloxRounds<R>(x, 0, rule.key0, rule.key1);
    for (int r = 0; r < R; ++r) {
      // Lane l is instance o + l: draws t of keys 4(o + l) + t and 32 + 4(o + l) + t.
      const KeptDraws kept = KeptDrawsOf(x[r], static_cast<uint16_t>(rule.threshold));
      out[r] |= (kept.low << (4 * o)) | (kept.high << (32 + 4 * o));
    }
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// keep[j] bit i: pair (q0 + i, kv0 + j) kept, for i < q_count ≤ 64 (other bits 0), j < 64, kv0 a
// multiple of 64: the forward tile's layout (keys rows, queries lanes), made directly with the
// queries across the lanes. For instance o, lane l's draws t sit at u16 lanes 4l + t, so the lane
// mask's bits 4l + t, l = 0…, are key 4o + t's queries: one pext (BMI2, which Highway's AVX2 and
// AVX-512 targets imply) per key instead of a 64 × 64 bit transpose. Four instances in flight.
HWY_INLINE void DropoutKeyColumns(const DropoutRule& rule, uint32_t bh, int64_t q0, int64_t q_count,
                                  int64_t kv0, uint64_t* HWY_RESTRICT keep) {
  for (int64_t j = 0; j < 64; ++j) keep[j] = 0;
  if (rule.threshold > 0xFFFF) return;  // p' = 1: every pair dropped
  const DU64 d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  constexpr int kInFlight = 4;       // query groups of one instance, in flight
  const VU64 lane = hn::Iota(d, 0);  // built once (see DropoutRowGroup)
  const uint32_t nibble_bits =
      static_cast<uint32_t>((uint64_t{1} << (4 * lanes)) - 1) & 0x11111111u;
  // Round 1 has no lane-dependent product here (column, b·Hq + h and offset are the same in every
  // lane; only q differs, and it enters by XOR): it runs once, in scalars.
  const uint64_t head_product = uint64_t{kPhiloxM1} * bh;
  const uint32_t round1_x0 = static_cast<uint32_t>(head_product >> 32) ^ rule.key0;
  for (int o = 0; o < 8; ++o) {
    const uint64_t column_product = uint64_t{kPhiloxM0} * (dropout_counter_column(kv0) + o);
    uint64_t kept_keys[8] = {};  // keys 4o + t, then 32 + 4o + t: their query bits
    for (int64_t i = 0; i < q_count; i += kInFlight * lanes) {
      VU64 x[kInFlight][4];
      for (int r = 0; r < kInFlight; ++r) {
        const auto q = static_cast<uint32_t>(q0 + i + r * lanes);
        x[r][0] = hn::Xor(hn::Add(lane, hn::Set(d, q)), hn::Set(d, round1_x0));
        x[r][1] = hn::Set(d, static_cast<uint32_t>(head_product));
        x[r][2] = hn::Set(d, static_cast<uint32_t>(column_product >> 32) ^ rule.offset ^ rule.key1);
        x[r][3] = hn::Set(d, static_cast<uint32_t>(column_product));
      }
      PhiloxRounds<kInFlight>(x, 1, rule.key0, rule.key1);
      for (int r = 0; r < kInFlight && i + r * lanes < q_count; ++r) {
        const int64_t first = i + r * lanes;
        const uint32_t in_range =
            q_count - first >= lanes
                ? ~uint32_t{0}
                : static_cast<uint32_t>((uint64_t{1} << (q_count - first)) - 1);
        const KeptDraws kept = KeptDrawsOf(x[r], static_cast<uint16_t>(rule.threshold));
        const auto kept_low = static_cast<uint32_t>(kept.low);
        const auto kept_high = static_cast<uint32_t>(kept.high);
        for (int t = 0; t < 4; ++t) {
          kept_keys[t] |= uint64_t{_pext_u32(kept_low, nibble_bits << t) & in_range} << first;
          kept_keys[4 + t] |= uint64_t{_pext_u32(kept_high, nibble_bits << t) & in_range} << first;
        }
      }
    }
    for (int t = 0; t < 4; ++t) {
      keep[4 * o + t] = kept_keys[t];
      keep[32 + 4 * o + t] = kept_keys[4 + t];
    }
  }
}
#endif

HWY_INLINE uint64_t DropoutRowBits(const DropoutRule& rule, uint32_t bh, int64_t q, int64_t kv0) {
  uint64_t bits = 0;
  DropoutRowGroup<1>(rule, &bh, &q, kv0, &bits);
  return bits;
}

#else  // HWY_SCALAR: one pair at a time, by the definition

HWY_INLINE uint64_t DropoutRowBits(const DropoutRule& rule, uint32_t bh, int64_t q, int64_t kv0) {
  const int64_t row = bh - rule.head_row_offset;  // dropout_keeps adds the offset back
  const int64_t b = row / rule.q_heads, h = row % rule.q_heads;
  uint64_t bits = 0;
  for (int64_t j = 0; j < 64; ++j) bits |= uint64_t{dropout_keeps(rule, b, h, q, kv0 + j)} << j;
  return bits;
}

template <int R>
HWY_INLINE void DropoutRowGroup(const DropoutRule& rule, const uint32_t* bh, const int64_t* q,
                                int64_t kv0, uint64_t* HWY_RESTRICT out) {
  for (int r = 0; r < R; ++r) out[r] = DropoutRowBits(rule, bh[r], q[r], kv0);
}

#endif

// The same for a tile starting at any global key row kv (frames place a call's keys anywhere):
// bit j is pair (q, kv + j), from the one or two 64-key groups the tile overlaps.
// The kernels' bh is b·Hq + h of the call: these entry points add the rule's head_row_offset.
HWY_INLINE uint64_t DropoutRowBitsAt(const DropoutRule& rule, uint32_t call_bh, int64_t q,
                                     int64_t kv) {
  const uint32_t bh = call_bh + rule.head_row_offset;
  const int64_t shift = kv & 63, group = kv - shift;
  const uint64_t low = DropoutRowBits(rule, bh, q, group);
  if (shift == 0) return low;
  return (low >> shift) | (DropoutRowBits(rule, bh, q, group + 64) << (64 - shift));
}

// out[i] bit j: pair (q0 + i, kv + j) kept, for i < count, j < 64, any kv: four rows in flight.
HWY_INLINE void DropoutTileRows(const DropoutRule& rule, uint32_t bh, int64_t q0, int64_t count,
                                int64_t kv, uint64_t* HWY_RESTRICT out) {
  constexpr int kInFlight = 4;
  const int64_t shift = kv & 63, group = kv - shift;
  const uint32_t row = bh + rule.head_row_offset;
  const uint32_t heads[kInFlight] = {row, row, row, row};
  for (int64_t i = 0; i < count; i += kInFlight) {
    int64_t rows[kInFlight];  // past the end: the last row again (its bits are not stored)
    for (int r = 0; r < kInFlight; ++r) rows[r] = q0 + std::min<int64_t>(i + r, count - 1);
    uint64_t low[kInFlight], high[kInFlight];
    DropoutRowGroup<kInFlight>(rule, heads, rows, group, low);
    if (shift != 0) DropoutRowGroup<kInFlight>(rule, heads, rows, group + 64, high);
    for (int64_t r = 0; r < kInFlight && i + r < count; ++r) {
      out[i + r] = shift == 0 ? low[r] : (low[r] >> shift) | (high[r] << (64 - shift));
    }
  }
}

// keep[j] bit i: pair (q0 + i, kv + j) kept, j < 64, any kv, i < q_count (other bits 0); `keep`
// has room for 128 words. From the key columns where BMI2 is there, else the rows transposed.
HWY_INLINE void DropoutColumnBitsAt(const DropoutRule& rule, uint32_t bh, int64_t q0,
                                    int64_t q_count, int64_t kv, uint64_t* HWY_RESTRICT keep) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  const int64_t shift = kv & 63, group = kv - shift;
  DropoutKeyColumns(rule, bh + rule.head_row_offset, q0, q_count, group, keep);
  if (shift == 0) return;
  DropoutKeyColumns(rule, bh + rule.head_row_offset, q0, q_count, group + 64, keep + 64);
  for (int64_t j = 0; j < 64; ++j) keep[j] = keep[j + shift];  // keep[64..) is the next group
#else
  DropoutTileRows(rule, bh, q0, q_count, kv, keep);
  for (int64_t i = q_count; i < 64; ++i) keep[i] = 0;
  transpose_bits(keep);
#endif
}

// s[r·64 + j] ← keep bit j of row r ? scale·s : 0, for rows r < count of 64 floats (the
// backward's P and dP by queries, the row kernel's weights). Scale 1 (the row kernel, which
// scales once at the end) multiplies nothing.
HWY_INLINE void ApplyDropoutRows(const uint64_t* keep, int64_t count, float scale,
                                 float* HWY_RESTRICT s) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  const auto factor = hn::Set(df, scale);
  for (int64_t r = 0; r < count; ++r) {
    for (size_t j = 0; j < 64; j += N) {
      float* at = s + r * 64 + j;
      const auto x = hn::LoadU(df, at);
      hn::StoreU(
          hn::IfThenElseZero(LanesKept(df, keep[r], j), scale == 1.0f ? x : hn::Mul(factor, x)), df,
          at);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::detail::fused
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
