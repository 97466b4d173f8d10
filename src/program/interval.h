// Interval arithmetic over the IR, for Program::check (program.cc): every node gets a range that
// holds each value it can take anywhere in the domain, and the check then compares the ranges of
// table indices and integer divisors against what the evaluators accept.
//
// Soundness is the one requirement: a range may be wider than the values, never narrower, so a
// program that passes can never fail at evaluation. Exactness is a bonus that makes the common
// refusals honest: an affine index such as q - kv + 63 (each variable once) gets exactly its
// values' range, so check refuses it iff some pair reads out of range.
//
// Int64 (and bool, as 0/1). The range is [lo, hi], inclusive. The evaluators wrap on overflow, so
// wherever a bound's computation overflows the result is the whole int64 range: a wrapped value
// can be anything. Products and floor quotients take their extremes at the corners of the box of
// their operands (each is monotone in one operand while the other's sign is fixed, and a divisor
// range never contains 0 here: the check refuses that first), so four corner values bound them.
//
// F32. Only floor(x) turns an f32 into an int64 that can reach an index or a divisor, so f32
// ranges may be coarse, but they must be sound too: [lo, hi] over the non-NaN values (±inf
// included) and a flag for NaN. Each IEEE operation rounds monotonically, so the same operation
// on the bounds bounds the results; NaN comes from inf − inf, 0 · inf, 0/0 and inf/inf, and the
// flag is raised whenever the operand ranges make one of those possible. Library functions (exp,
// log, tanh, sigmoid) are accurate to an ulp or two, not monotone by contract, so their bounds are
// widened by four ulps.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "program/ir.h"

namespace maskattn::program {

struct IntRange {
  int64_t lo = 0, hi = 0;
};

struct F32Range {
  float lo = 0, hi = 0;  // lo ≤ hi always; a NaN-only value is the whole range with nan
  bool nan = false;
};

constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr float kInf = std::numeric_limits<float>::infinity();

inline IntRange whole_int64() {
  return {kInt64Min, kInt64Max};
}
inline F32Range whole_f32() {
  return {-kInf, kInf, true};
}
inline bool contains(const IntRange& r, int64_t x) {
  return r.lo <= x && x <= r.hi;
}
inline IntRange hull(const IntRange& a, const IntRange& b) {
  return {std::min(a.lo, b.lo), std::max(a.hi, b.hi)};
}
inline F32Range hull(const F32Range& a, const F32Range& b) {
  return {std::min(a.lo, b.lo), std::max(a.hi, b.hi), a.nan || b.nan};
}

// The hull of four corner values, or the whole range when one of them overflowed.
inline IntRange corners(const int64_t (&value)[4], bool overflow) {
  if (overflow) return whole_int64();
  return {*std::min_element(value, value + 4), *std::max_element(value, value + 4)};
}

inline IntRange add_range(const IntRange& a, const IntRange& b) {
  IntRange r;
  if (__builtin_add_overflow(a.lo, b.lo, &r.lo) || __builtin_add_overflow(a.hi, b.hi, &r.hi)) {
    return whole_int64();
  }
  return r;
}
inline IntRange sub_range(const IntRange& a, const IntRange& b) {
  IntRange r;
  if (__builtin_sub_overflow(a.lo, b.hi, &r.lo) || __builtin_sub_overflow(a.hi, b.lo, &r.hi)) {
    return whole_int64();
  }
  return r;
}
inline IntRange mul_range(const IntRange& a, const IntRange& b) {
  int64_t value[4];
  bool overflow = __builtin_mul_overflow(a.lo, b.lo, &value[0]);
  overflow |= __builtin_mul_overflow(a.lo, b.hi, &value[1]);
  overflow |= __builtin_mul_overflow(a.hi, b.lo, &value[2]);
  overflow |= __builtin_mul_overflow(a.hi, b.hi, &value[3]);
  return corners(value, overflow);
}
inline IntRange neg_range(const IntRange& a) {
  if (a.lo == kInt64Min) return whole_int64();  // -INT64_MIN wraps to itself
  return {-a.hi, -a.lo};
}
inline IntRange abs_range(const IntRange& a) {
  if (a.lo == kInt64Min) return whole_int64();  // abs(INT64_MIN) wraps to itself
  if (a.lo >= 0) return a;
  if (a.hi <= 0) return {-a.hi, -a.lo};
  return {0, std::max(-a.lo, a.hi)};
}
// The divisor range d must not contain 0 (the caller refuses it first).
inline IntRange floordiv_range(const IntRange& a, const IntRange& d) {
  if (contains(d, -1) && a.lo == kInt64Min) return whole_int64();  // INT64_MIN // -1 wraps
  const int64_t value[4] = {floor_div(a.lo, d.lo), floor_div(a.lo, d.hi), floor_div(a.hi, d.lo),
                            floor_div(a.hi, d.hi)};
  return corners(value, false);
}
inline IntRange mod_range(const IntRange& a, const IntRange& d) {
  if (d.lo > 0) {
    if (a.lo >= 0 && a.hi < d.lo) return a;  // smaller than every divisor: unchanged
    return {0, d.hi - 1};
  }
  if (a.hi <= 0 && a.lo > d.hi) return a;
  return {d.lo + 1, 0};
}

// An f32 range from a set of candidate results (NaN candidates raise the flag).
inline F32Range from_candidates(const float* value, int count, bool nan) {
  F32Range r{kInf, -kInf, nan};
  for (int k = 0; k < count; ++k) {
    if (std::isnan(value[k])) {
      r.nan = true;
    } else {
      r.lo = std::min(r.lo, value[k]);
      r.hi = std::max(r.hi, value[k]);
    }
  }
  if (r.lo > r.hi) return whole_f32();  // only NaN
  return r;
}

inline bool has_zero(const F32Range& a) {
  return a.lo <= 0 && a.hi >= 0;
}
inline bool has_inf(const F32Range& a) {
  return a.lo == -kInf || a.hi == kInf;
}

// add, sub, mul, div on f32 ranges: the operation on the four corners.
template <class F>
F32Range f32_corners(const F32Range& a, const F32Range& b, bool nan, F f) {
  const float value[4] = {f(a.lo, b.lo), f(a.lo, b.hi), f(a.hi, b.lo), f(a.hi, b.hi)};
  return from_candidates(value, 4, nan || a.nan || b.nan);
}
inline F32Range f32_add_range(const F32Range& a, const F32Range& b) {
  return f32_corners(a, b, false, [](float x, float y) { return x + y; });
}
inline F32Range f32_sub_range(const F32Range& a, const F32Range& b) {
  return f32_corners(a, b, false, [](float x, float y) { return x - y; });
}
inline F32Range f32_mul_range(const F32Range& a, const F32Range& b) {
  const bool zero_times_inf = (has_zero(a) && has_inf(b)) || (has_inf(a) && has_zero(b));
  return f32_corners(a, b, zero_times_inf, [](float x, float y) { return x * y; });
}
inline F32Range f32_div_range(const F32Range& a, const F32Range& b) {
  if (has_zero(b)) return whole_f32();  // x/0 = ±inf, 0/0 = NaN, and signs flip across 0
  return f32_corners(a, b, has_inf(a) && has_inf(b), [](float x, float y) { return x / y; });
}
// min_f32(a, b) = b < a ? b : a: a NaN b gives a; a NaN a gives NaN.
inline F32Range f32_min_range(const F32Range& a, const F32Range& b) {
  F32Range r{std::min(a.lo, b.lo), std::min(a.hi, b.hi), a.nan};
  return b.nan ? hull(r, a) : r;
}
inline F32Range f32_max_range(const F32Range& a, const F32Range& b) {
  F32Range r{std::max(a.lo, b.lo), std::max(a.hi, b.hi), a.nan};
  return b.nan ? hull(r, a) : r;
}
inline F32Range f32_neg_range(const F32Range& a) {
  return {-a.hi, -a.lo, a.nan};
}
inline F32Range f32_abs_range(const F32Range& a) {
  if (a.lo >= 0) return a;
  if (a.hi <= 0) return f32_neg_range(a);
  return {0, std::max(-a.lo, a.hi), a.nan};
}

// A non-decreasing library function on [lo, hi], widened by four ulps each way and kept
// inside the function's own range [floor_value, ceiling_value].
template <class F>
F32Range f32_monotone(const F32Range& a, F f, float floor_value, float ceiling_value) {
  float lo = f(a.lo);
  float hi = f(a.hi);
  for (int k = 0; k < 4; ++k) {
    lo = std::nextafter(lo, -kInf);
    hi = std::nextafter(hi, kInf);
  }
  return {std::max(lo, floor_value), std::min(hi, ceiling_value), a.nan};
}
inline F32Range f32_log_range(const F32Range& a) {
  // log of a negative number is NaN; log(±0) = −inf.
  const F32Range positive{std::max(a.lo, 0.0f), std::max(a.hi, 0.0f), a.nan || a.lo < 0};
  return f32_monotone(
      positive, [](float x) { return math_f32(Op::log, x); }, -kInf, kInf);
}
inline float f32_of_int(int64_t x) {
  return to_f32(x);  // rounding to nearest is monotone
}
// floor_to_int is monotone; NaN gives 0.
inline IntRange floor_range(const F32Range& a) {
  IntRange r{floor_to_int(a.lo), floor_to_int(a.hi)};
  return a.nan ? hull(r, IntRange{0, 0}) : r;
}

}  // namespace maskattn::program
