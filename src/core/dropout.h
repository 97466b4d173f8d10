// Attention dropout's rule (docs/semantics.md §17): which pairs are kept, and by what the kept
// weights are scaled. One definition, read by every kernel:
//
//   pair (b, h, q, kv) — q, kv the pair's global rows (the call's rows plus the frame's offsets),
//   h the query head — draws from Philox4x32-10 with key (seed mod 2³², seed >> 32) and counter
//       (8·⌊kv/64⌋ + ⌊(kv mod 32)/4⌋,  q,  b·Hq + h,  offset),
//   the 16-bit half t = 4·⌊(kv mod 64)/32⌋ + kv mod 4 of the output words (word ⌊t/2⌋, its low
//   half first): u ∈ [0, 65536); kept iff u ≥ T, T = round(p·65536); kept weights are scaled by
//   65536 / (65536 − T).
//
// Why that assignment: one Philox call yields eight 16-bit draws, and the 64 keys of a 64-aligned
// group are the 8 draws of 8 instances (instance o: keys 4o..4o+3 and 32+4o..32+4o+3). Eight
// instances side by side (one AVX-512 vector of u64 lanes) then hold words x0, x1 of every
// instance, interleaved, as 32 u16 lanes in key order 0..31, and x2, x3 as keys 32..63: two u16
// compares give a row of 64 keep bits with no bit shuffling (kernels/dropout-inl.h). Why 16 bits:
// a 64 × 64 tile needs 4096 draws, and 16-bit draws halve the generator's share of the tile's
// time against 32-bit ones; the quantisation of p is at most 2^-17, far below what 10⁷ pairs can
// detect (σ ≥ 1e-4), and the scale uses the quantised p, so E[O] stays exactly the undropped O.
#pragma once

#include <cstdint>

#include "core/philox.h"
#include "maskattn/attention.h"
#include "maskattn/mask.h"

namespace maskattn::detail {

struct DropoutRule {
  bool on = false;          // p > 0
  uint32_t threshold = 0;   // T: drop when the 16-bit draw is below it; 65536 drops every pair
  double keep_scale = 1.0;  // 65536 / (65536 − T), 0 when every pair is dropped
  float keep_scale_f32 = 1.0f;
  uint32_t key0 = 0, key1 = 0;  // the seed's halves
  uint32_t offset = 0;
  int64_t q_heads = 0;  // Hq, for the counter's b·Hq + h
  // Dropout::batch_offset·Hq, added to every b·Hq + h (the kernels' `bh`; dropout-inl.h adds it
  // where a kernel's bh enters the generator).
  uint32_t head_row_offset = 0;
};

// Checks `dropout` against the whole problem (the call's shape with the frame's totals) and
// builds its rule. Errors (docs/errors.md E135): p outside [0, 1] or NaN, offset ≥ 2³², a problem
// whose rows or heads leave the counter's 32-bit words (Lq ≥ 2³², Lk ≥ 2³⁵, B·Hq > 2³²).
DropoutRule resolve_dropout(const Dropout& dropout, const MaskShape& whole_problem);

// The counter's first word for key row kv: instance ⌊(kv mod 32)/4⌋ of 64-key group ⌊kv/64⌋.
constexpr uint32_t dropout_counter_column(int64_t kv) {
  return static_cast<uint32_t>(((kv >> 6) << 3) | ((kv & 31) >> 2));
}

// Which of the instance's eight 16-bit draws is key kv's: 4·⌊(kv mod 64)/32⌋ + kv mod 4.
constexpr int dropout_draw_index(int64_t kv) {
  return static_cast<int>(((kv >> 5) & 1) * 4 + (kv & 3));
}

// Whether pair (b, h, q, kv) (global rows) is kept: the scalar definition, for the reference
// kernel and the tests. The fast kernels make 64 of these at once (kernels/dropout-inl.h).
inline bool dropout_keeps(const DropoutRule& rule, int64_t b, int64_t h, int64_t q, int64_t kv) {
  if (!rule.on) return true;
  const PhiloxWords words = philox4x32_10(
      {dropout_counter_column(kv), static_cast<uint32_t>(q),
       static_cast<uint32_t>(rule.head_row_offset + b * rule.q_heads + h), rule.offset},
      rule.key0, rule.key1);
  const int draw_index = dropout_draw_index(kv);
  const uint32_t draw = (words[draw_index >> 1] >> (16 * (draw_index & 1))) & 0xFFFFu;
  return draw >= rule.threshold;
}

}  // namespace maskattn::detail
