// Attention dropout inside the fused kernels: the keep bits of a 64-key tile, made eight Philox
// instances per vector, and applied to a tile of weights. Compiled once per Highway target (the
// "-inl.h" convention).
//
// Design. core/dropout.h defines which pairs are kept (Philox4x32-10 of the pair's global rows);
// this file makes the same bits fast. One Philox instance yields eight 16-bit draws, and the
// counter gives instance o of a 64-key tile the keys o, o + 8, …, o + 56 of one query, so:
//
// - DropoutRowBits (one query, the tile's 64 keys: the backward's and the row kernel's layout)
//   runs the eight instances o = 0..7 side by side, one per u64 lane; draw t of every lane,
//   compared with T, is a lane mask whose bit o is key 8t + o — byte t of the row's keep word.
// - DropoutColumnBits (one key at a time, 64 queries: the forward tile's layout, keys rows and
//   queries lanes) runs one instance o for N queries side by side; draw t gives key 8t + o's bits
//   for those queries directly. No transpose either way.
//
// A Philox round on u64 lanes holding 32-bit words is two MulEven (32×32→64), two shifts and two
// three-way XORs: the low half of a product is the product itself, since MulEven reads only the low
// 32 bits of each lane and the final draws mask them, so the high garbage never needs clearing.
// On AVX-512 that is ~60 operations for a row of 64 keep bits, ~1 per pair against the ~2·D
// multiply-adds the pair's two products cost. The bits are tested against core/dropout.h's scalar
// definition for every target (tests/dropout_test.cc).
#if defined(MASKATTN_KERNELS_DROPOUT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MASKATTN_KERNELS_DROPOUT_INL_H_
#undef MASKATTN_KERNELS_DROPOUT_INL_H_
#else
#define MASKATTN_KERNELS_DROPOUT_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

#include "core/dropout.h"

HWY_BEFORE_NAMESPACE();
namespace maskattn::detail::fused {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR

using DU64 = hn::ScalableTag<uint64_t>;
using VU64 = hn::Vec<DU64>;

// Philox4x32-10 in every lane (words in the low halves; the high halves may hold garbage).
HWY_INLINE void PhiloxLanes(VU64& c0, VU64& c1, VU64& c2, VU64& c3, uint32_t k0, uint32_t k1) {
  const DU64 d;
  const hn::Repartition<uint32_t, DU64> d32;
  const auto m0 = hn::Set(d32, kPhiloxM0), m1 = hn::Set(d32, kPhiloxM1);
  for (int round = 0; round < kPhiloxRounds; ++round) {
    const VU64 p0 = hn::MulEven(hn::BitCast(d32, c0), m0);
    const VU64 p1 = hn::MulEven(hn::BitCast(d32, c2), m1);
    c0 = hn::Xor3(hn::ShiftRight<32>(p1), c1, hn::Set(d, k0));
    c1 = p1;
    c2 = hn::Xor3(hn::ShiftRight<32>(p0), c3, hn::Set(d, k1));
    c3 = p0;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
}

// Lane masks of the eight draws (bit l: lane l's draw t is kept), `lanes` lanes.
HWY_INLINE void KeptDraws(const VU64 (&words)[4], uint32_t threshold, uint8_t (&kept)[8]) {
  const DU64 d;
  const hn::RebindToSigned<DU64> di;
  const auto low16 = hn::Set(d, 0xFFFF);
  const auto limit = hn::Set(di, static_cast<int64_t>(threshold));
  for (int t = 0; t < 8; ++t) {
    const VU64 word = (t & 1) != 0 ? hn::ShiftRight<16>(words[t >> 1]) : words[t >> 1];
    const auto draw = hn::BitCast(di, hn::And(word, low16));
    uint8_t bytes[8] = {};
    hn::StoreMaskBits(di, hn::Not(hn::Lt(draw, limit)), bytes);
    kept[t] = bytes[0];
  }
}

// Bit j: pair (q, kv0 + j) kept, j < 64 (kv0 a multiple of 64; bits past the problem's keys are
// draws of keys that do not exist: callers ignore them).
HWY_INLINE uint64_t DropoutRowBits(const DropoutRule& rule, uint32_t bh, int64_t q, int64_t kv0) {
  const DU64 d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const uint32_t column0 = dropout_counter_column(kv0);
  uint64_t bits = 0;
  for (int64_t o = 0; o < 8; o += lanes) {
    VU64 words[4] = {hn::Iota(d, column0 + o), hn::Set(d, static_cast<uint32_t>(q)), hn::Set(d, bh),
                     hn::Set(d, rule.offset)};
    PhiloxLanes(words[0], words[1], words[2], words[3], rule.key0, rule.key1);
    uint8_t kept[8];
    KeptDraws(words, rule.threshold, kept);
    for (int t = 0; t < 8; ++t) bits |= uint64_t{kept[t]} << (8 * t + o);
  }
  return bits;
}

// keep[j] bit i: pair (q0 + i, kv0 + j) kept, for j < 64 and i < q_count (other bits 0).
HWY_INLINE void DropoutColumnBits(const DropoutRule& rule, uint32_t bh, int64_t q0, int64_t q_count,
                                  int64_t kv0, uint64_t* HWY_RESTRICT keep) {
  const DU64 d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const uint32_t column0 = dropout_counter_column(kv0);
  for (int64_t j = 0; j < 64; ++j) keep[j] = 0;
  for (int64_t i = 0; i < q_count; i += lanes) {
    const uint64_t in_range = q_count - i >= 64 ? ~uint64_t{0} : (uint64_t{1} << (q_count - i)) - 1;
    for (uint32_t o = 0; o < 8; ++o) {
      VU64 words[4] = {hn::Set(d, column0 + o), hn::Iota(d, static_cast<uint64_t>(q0 + i)),
                       hn::Set(d, bh), hn::Set(d, rule.offset)};
      PhiloxLanes(words[0], words[1], words[2], words[3], rule.key0, rule.key1);
      uint8_t kept[8];
      KeptDraws(words, rule.threshold, kept);
      for (int t = 0; t < 8; ++t) keep[8 * t + o] |= (uint64_t{kept[t]} & in_range) << i;
    }
  }
}

#else  // HWY_SCALAR: one pair at a time, by the definition

HWY_INLINE uint64_t DropoutRowBits(const DropoutRule& rule, uint32_t bh, int64_t q, int64_t kv0) {
  const int64_t b = bh / rule.q_heads, h = bh % rule.q_heads;
  uint64_t bits = 0;
  for (int64_t j = 0; j < 64; ++j) bits |= uint64_t{dropout_keeps(rule, b, h, q, kv0 + j)} << j;
  return bits;
}

HWY_INLINE void DropoutColumnBits(const DropoutRule& rule, uint32_t bh, int64_t q0, int64_t q_count,
                                  int64_t kv0, uint64_t* HWY_RESTRICT keep) {
  for (int64_t j = 0; j < 64; ++j) keep[j] = 0;
  for (int64_t i = 0; i < q_count; ++i) {
    const uint64_t row = DropoutRowBits(rule, bh, q0 + i, kv0);
    for (int64_t j = 0; j < 64; ++j) keep[j] |= ((row >> j) & 1) << i;
  }
}

#endif

// The same for a tile starting at any global key row kv (frames place a call's keys anywhere):
// bit j is pair (q, kv + j), from the one or two 64-key groups the tile overlaps.
HWY_INLINE uint64_t DropoutRowBitsAt(const DropoutRule& rule, uint32_t bh, int64_t q, int64_t kv) {
  const int64_t shift = kv & 63, group = kv - shift;
  const uint64_t low = DropoutRowBits(rule, bh, q, group);
  if (shift == 0) return low;
  return (low >> shift) | (DropoutRowBits(rule, bh, q, group + 64) << (64 - shift));
}

// keep[j] bit i: pair (q0 + i, kv + j) kept, j < 64, any kv; `keep` has room for 128 words.
HWY_INLINE void DropoutColumnBitsAt(const DropoutRule& rule, uint32_t bh, int64_t q0,
                                    int64_t q_count, int64_t kv, uint64_t* HWY_RESTRICT keep) {
  const int64_t shift = kv & 63, group = kv - shift;
  DropoutColumnBits(rule, bh, q0, q_count, group, keep);
  if (shift == 0) return;
  DropoutColumnBits(rule, bh, q0, q_count, group + 64, keep + 64);
  for (int64_t j = 0; j < 64; ++j) keep[j] = keep[j + shift];  // keep[64..) is the next group
}

// s[r·64 + j] ← keep bit j of row r ? scale·s : 0, for rows r < count of 64 floats (the
// backward's P and dP by query rows, the row kernel's weights).
HWY_INLINE void ApplyDropoutRows(const uint64_t* keep, int64_t count, float scale,
                                 float* HWY_RESTRICT s) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto factor = hn::Set(df, scale);
  const auto lane_bit = hn::Shl(hn::Set(du, 1u), hn::Iota(du, 0));
  for (int64_t r = 0; r < count; ++r) {
    for (int64_t j = 0; j < 64; j += N) {
      const auto chunk = hn::Set(du, static_cast<uint32_t>(keep[r] >> j));
      const auto kept = hn::RebindMask(df, hn::Ne(hn::And(chunk, lane_bit), hn::Zero(du)));
      float* at = s + r * 64 + j;
      hn::StoreU(hn::IfThenElseZero(kept, hn::Mul(factor, hn::LoadU(df, at))), df, at);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::detail::fused
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
