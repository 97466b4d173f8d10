// Bool pair nodes as bit rows (tile_slots-inl.h): comparisons that write 64 pairs per word, and the
// logic on words. Compiled once per SIMD target.
//
// Comparisons. Two affine operands (q >= kv, q - kv < 256) differ by an affine d(r, c) computed
// exactly in 128 bits, so on each row the pairs where d ≥ 0 (or > 0, = 0, …) are one run of
// columns, found by one division: no value is written at all. Otherwise the operands are compared
// a vector at a time (Highway) and each vector's mask becomes a piece of the row's word; the
// comparisons are IEEE's and C++'s (Highway's float != is ordered, so != is not ==).
#if defined(MASKATTN_PROGRAM_TILE_BITS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MASKATTN_PROGRAM_TILE_BITS_INL_H_
#undef MASKATTN_PROGRAM_TILE_BITS_INL_H_
#else
#define MASKATTN_PROGRAM_TILE_BITS_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>

#include "program/ir.h"
#include "program/ops.h"
#include "program/tile_slots-inl.h"

HWY_BEFORE_NAMESPACE();
namespace maskattn::program {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// ---- affine comparisons -------------------------------------------------------------------

using Wide = __int128;

// a / d for a ≥ 0, d > 0, in 64 bits when both fit (128-bit division is a slow library call),
// and no division at all for d = 1, the usual slope of q and kv.
inline Wide quotient(Wide a, Wide d) {
  constexpr Wide kMax = std::numeric_limits<int64_t>::max();
  if (d == 1) return a;
  if (a <= kMax && d <= kMax) return static_cast<int64_t>(a) / static_cast<int64_t>(d);
  return a / d;
}

// The columns c of [0, n) where v0 + dc · c ≥ k, as bits (a run: the values are monotone in c).
inline uint64_t at_least(Wide v0, Wide dc, Wide k, int64_t n) {
  const uint64_t all = low_bits(n);
  if (dc == 0) return v0 >= k ? all : 0;
  if (dc > 0) {  // from the first c with dc · c ≥ k − v0 on
    if (v0 >= k) return all;
    const Wide need = k - v0;
    if (need > dc * (n - 1)) return 0;
    const int64_t first = static_cast<int64_t>(quotient(need + dc - 1, dc));
    return all & ~low_bits(first);
  }
  if (v0 < k) return 0;  // up to the last c with −dc · c ≤ v0 − k
  const Wide slack = v0 - k;
  if (slack >= -dc * (n - 1)) return all;
  return low_bits(static_cast<int64_t>(quotient(slack, -dc)) + 1);
}

// The columns where d op 0, op a comparison, from at_least(k): the columns where d ≥ k.
template <Op kOp, class AtLeast>
HWY_INLINE uint64_t comparison_bits(uint64_t all, const AtLeast& at_least) {
  if constexpr (kOp == Op::ge) return at_least(0);
  if constexpr (kOp == Op::gt) return at_least(1);
  if constexpr (kOp == Op::lt) return all & ~at_least(0);
  if constexpr (kOp == Op::le) return all & ~at_least(1);
  if constexpr (kOp == Op::eq) return at_least(0) & ~at_least(1);
  if constexpr (kOp == Op::ne) return all & ~(at_least(0) & ~at_least(1));
}

// The usual case, a slope of -1, 0 or 1 along the row and values far from int64's ends: the run
// starts or ends at a column found without division, in 64-bit arithmetic.
HWY_INLINE uint64_t at_least_unit(int64_t v0, int64_t dc, int64_t k, int64_t n) {
  if (dc == 0) return v0 >= k ? low_bits(n) : 0;
  if (dc > 0) return low_bits(n) & ~low_bits(std::clamp<int64_t>(k - v0, 0, n));
  return low_bits(std::clamp<int64_t>(v0 - k + 1, 0, n));
}

// d op 0 for d(r, c) = base + dr · r + dc · c, into bit rows.
template <Op kOp>
void affine_rows(Wide base, Wide dr, Wide dc, int64_t rows, int64_t cols, uint64_t* out) {
  const uint64_t all = low_bits(cols);
  constexpr Wide kSmall = Wide{1} << 62;
  const Wide corners[4] = {base, base + dr * (rows - 1), base + dc * (cols - 1),
                           base + dr * (rows - 1) + dc * (cols - 1)};
  bool small = dc >= -1 && dc <= 1;
  for (const Wide corner : corners) small = small && corner > -kSmall && corner < kSmall;
  if (small) {
    const int64_t base64 = static_cast<int64_t>(base), dr64 = static_cast<int64_t>(dr);
    const int64_t dc64 = static_cast<int64_t>(dc);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t v0 = base64 + dr64 * r;
      out[r] =
          comparison_bits<kOp>(all, [&](int64_t k) { return at_least_unit(v0, dc64, k, cols); });
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const Wide v0 = base + dr * r;
    out[r] = comparison_bits<kOp>(all, [&](int64_t k) { return at_least(v0, dc, k, cols); });
  }
}

// a op b for two affine int64 nodes, into node n's bit rows: d = a − b, exactly.
inline void compare_affine(TileState& t, int32_t n, Op op, const Slot& a, const Slot& b) {
  const Wide base = Wide{a.base} - b.base;
  const Wide dr = Wide{a.dr} - b.dr;
  const Wide dc = Wide{a.dc} - b.dc;
  uint64_t* out = t.slot(n).bits;
  switch (op) {
    case Op::eq:
      return affine_rows<Op::eq>(base, dr, dc, t.rows, t.cols, out);
    case Op::ne:
      return affine_rows<Op::ne>(base, dr, dc, t.rows, t.cols, out);
    case Op::lt:
      return affine_rows<Op::lt>(base, dr, dc, t.rows, t.cols, out);
    case Op::le:
      return affine_rows<Op::le>(base, dr, dc, t.rows, t.cols, out);
    case Op::gt:
      return affine_rows<Op::gt>(base, dr, dc, t.rows, t.cols, out);
    default:
      return affine_rows<Op::ge>(base, dr, dc, t.rows, t.cols, out);
  }
}

// ---- vector comparisons -------------------------------------------------------------------

// The lanes of a mask as the low Lanes(d) bits of a word.
template <class D>
HWY_INLINE uint64_t MaskWord(D d, hn::Mask<D> mask) {
  uint8_t bytes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const size_t count = hn::StoreMaskBits(d, mask, bytes);
  uint64_t word = 0;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&word, bytes, sizeof word);  // on AVX-512: the mask register itself
  } else {
    for (size_t k = 0; k < count; ++k) word |= uint64_t{bytes[k]} << (8 * k);
  }
  (void)count;
  return word & low_bits(static_cast<int64_t>(hn::Lanes(d)));
}

// Each comparison as a vector operation and as the scalar one for a row's last columns: C++'s
// integer and IEEE comparisons both (Highway's float != is ordered, so != is "not ==", and its
// integers have no <=, so a <= b is "not a > b", which floats must not use: NaN <= x is false).
template <Op kOp>
struct Comparison {
  template <class V>
  static HWY_INLINE auto Vector(V a, V b) {
    constexpr bool kFloat = hwy::IsFloat<hn::TFromV<V>>();
    if constexpr (kOp == Op::eq) return hn::Eq(a, b);
    if constexpr (kOp == Op::ne) return hn::Not(hn::Eq(a, b));
    if constexpr (kOp == Op::lt) return hn::Lt(a, b);
    if constexpr (kOp == Op::gt) return hn::Gt(a, b);
    if constexpr (kOp == Op::le && kFloat) return a <= b;
    if constexpr (kOp == Op::le && !kFloat) return hn::Not(hn::Gt(a, b));
    if constexpr (kOp == Op::ge && kFloat) return a >= b;
    if constexpr (kOp == Op::ge && !kFloat) return hn::Not(hn::Lt(a, b));
  }
  template <class T>
  static bool Scalar(T a, T b) {
    if constexpr (kOp == Op::eq) return a == b;
    if constexpr (kOp == Op::ne) return a != b;
    if constexpr (kOp == Op::lt) return a < b;
    if constexpr (kOp == Op::gt) return a > b;
    if constexpr (kOp == Op::le) return a <= b;
    if constexpr (kOp == Op::ge) return a >= b;
  }
};

// The word of one row: a op b, each operand contiguous along the row (kAlongA/B) or one value.
template <Op kOp, bool kAlongA, bool kAlongB, class T>
HWY_INLINE uint64_t compare_row(const T* ar, const T* br, int64_t cols) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  uint64_t word = 0;
  int64_t c = 0;
  for (; c + lanes <= cols; c += lanes) {
    const auto va = kAlongA ? hn::LoadU(d, ar + c) : hn::Set(d, ar[0]);
    const auto vb = kAlongB ? hn::LoadU(d, br + c) : hn::Set(d, br[0]);
    word |= MaskWord(d, Comparison<kOp>::Vector(va, vb)) << c;
  }
  for (; c < cols; ++c) {
    const uint64_t bit = Comparison<kOp>::Scalar(ar[kAlongA ? c : 0], br[kAlongB ? c : 0]);
    word |= bit << c;
  }
  return word;
}

// a op b into node n's bit rows. When one operand is the same row for every row (doc[q]) and the
// other one value per row (doc[kv]), a row's word depends on that value alone, and neighbouring
// keys mostly share it (a document spans many keys): the last word is reused while the value
// repeats (equal values compare alike, -0.0 and 0.0 included; a NaN never repeats).
template <Op kOp, bool kAlongA, bool kAlongB, class T>
void compare_rows_as(TileState& t, int32_t n, In<T> a, In<T> b) {
  uint64_t* out = t.slot(n).bits;
  const bool repeats = kAlongA != kAlongB && (kAlongA ? a.row_stride : b.row_stride) == 0;
  T last = T();
  uint64_t last_word = 0;
  bool have_last = false;
  for (int64_t r = 0; r < t.rows; ++r) {
    const T* ar = a.data + r * a.row_stride;
    const T* br = b.data + r * b.row_stride;
    const T key = kAlongA ? br[0] : ar[0];
    if (repeats && have_last && key == last) {
      out[r] = last_word;
      continue;
    }
    out[r] = compare_row<kOp, kAlongA, kAlongB>(ar, br, t.cols);
    last = key, last_word = out[r], have_last = true;
  }
}

template <Op kOp, class T>
void compare_rows_op(TileState& t, int32_t n, In<T> a, In<T> b) {
  const bool along_a = a.col_stride != 0 && t.cols > 1, along_b = b.col_stride != 0 && t.cols > 1;
  if (along_a && along_b) return compare_rows_as<kOp, true, true>(t, n, a, b);
  if (along_a) return compare_rows_as<kOp, true, false>(t, n, a, b);
  if (along_b) return compare_rows_as<kOp, false, true>(t, n, a, b);
  compare_rows_as<kOp, false, false>(t, n, a, b);
}

// a op b into node n's bit rows (T: int64_t, int32_t or float).
template <class T>
void compare_rows(TileState& t, int32_t n, Op op, In<T> a, In<T> b) {
  switch (op) {
    case Op::eq:
      return compare_rows_op<Op::eq>(t, n, a, b);
    case Op::ne:
      return compare_rows_op<Op::ne>(t, n, a, b);
    case Op::lt:
      return compare_rows_op<Op::lt>(t, n, a, b);
    case Op::le:
      return compare_rows_op<Op::le>(t, n, a, b);
    case Op::gt:
      return compare_rows_op<Op::gt>(t, n, a, b);
    default:
      return compare_rows_op<Op::ge>(t, n, a, b);
  }
}

// Int64 operands with one value per row or per column (doc[q], doc[kv]: at most 64 values each)
// whose values all fit int32, as int32 copies: compared with twice the lanes, the same results.
inline bool narrow_to_int32(TileState& t, const int32_t (&operands)[2], In<int32_t> (&out)[2]) {
  int32_t* next = t.work.narrow.data();
  for (int k = 0; k < 2; ++k) {
    const int32_t m = operands[k];
    if (t.slot(m).axes == kBothAxes) return false;
    const In<int64_t> v = view<int64_t>(t, m);
    const int64_t count = t.rows_of(m) * t.cols_of(m);
    const int64_t step = v.row_stride != 0 ? v.row_stride : v.col_stride;
    int64_t wide = 0;  // the bits lost by some value; no early exit: the loop vectorises
    if (step == 1) {
      for (int64_t i = 0; i < count; ++i) {
        const int64_t x = v.data[i];
        next[i] = static_cast<int32_t>(x);
        wide |= x ^ static_cast<int32_t>(x);
      }
    } else {
      for (int64_t i = 0; i < count; ++i) {
        const int64_t x = v.data[i * step];
        next[i] = static_cast<int32_t>(x);
        wide |= x ^ static_cast<int32_t>(x);
      }
    }
    if (wide != 0) return false;
    const bool rows = t.slot(m).axes & kRowAxis;
    const bool cols = t.slot(m).axes & kColAxis;
    out[k] = {next, rows ? 1 : 0, cols ? 1 : 0};
    next += 64;
  }
  return true;
}

// ---- bit rows of any bool node, and the logic on them ----------------------------------------

struct BitsIn {
  const uint64_t* words;
  int64_t step;  // 1: a word per row; 0: one word for every row
};

// A bool node as words: a pair node has them already; a query- or key-only node (0/1 values) is
// turned into one column word or a word per row, once.
inline BitsIn bits_of(TileState& t, int32_t n) {
  Slot& slot = t.slot(n);
  if (!slot.has_bits) {
    const In<int64_t> v = view<int64_t>(t, n);
    if (slot.axes == kBothAxes) {  // written as 0/1 values by a generic path: pack them
      for (int64_t r = 0; r < t.rows; ++r) {
        uint64_t word = 0;
        for (int64_t c = 0; c < t.cols; ++c) {
          word |= static_cast<uint64_t>(v.data[r * v.row_stride + c] != 0) << c;
        }
        slot.bits[r] = word;
      }
    } else if (slot.axes & kRowAxis) {
      for (int64_t r = 0; r < t.rows; ++r) slot.bits[r] = v.data[r] != 0 ? t.full : 0;
    } else if (slot.axes & kColAxis) {
      uint64_t word = 0;
      for (int64_t c = 0; c < t.cols; ++c) word |= static_cast<uint64_t>(v.data[c] != 0) << c;
      slot.bits[0] = word;
    } else {
      slot.bits[0] = v.data[0] != 0 ? t.full : 0;
    }
    slot.has_bits = true;
  }
  return {slot.bits, (slot.axes & kRowAxis) ? 1 : 0};
}

// ~, &, |, and == / != of bools, word by word, into node n's bit rows.
template <Op kOp>
void logic_rows_as(TileState& t, int32_t n, BitsIn a, BitsIn b) {
  uint64_t* out = t.slot(n).bits;
  for (int64_t r = 0; r < t.rows; ++r) {
    const uint64_t x = a.words[r * a.step];
    const uint64_t y = b.words[r * b.step];
    if constexpr (kOp == Op::logical_not) out[r] = ~x & t.full;
    if constexpr (kOp == Op::logical_and) out[r] = x & y;
    if constexpr (kOp == Op::logical_or) out[r] = x | y;
    if constexpr (kOp == Op::eq) out[r] = ~(x ^ y) & t.full;
    if constexpr (kOp == Op::ne) out[r] = x ^ y;
  }
}

inline void logic_rows(TileState& t, int32_t n) {
  const Node& node = t.node(n);
  const BitsIn a = bits_of(t, node.args[0]);
  const BitsIn b = node.op == Op::logical_not ? a : bits_of(t, node.args[1]);
  switch (node.op) {
    case Op::logical_not:
      return logic_rows_as<Op::logical_not>(t, n, a, b);
    case Op::logical_and:
      return logic_rows_as<Op::logical_and>(t, n, a, b);
    case Op::logical_or:
      return logic_rows_as<Op::logical_or>(t, n, a, b);
    case Op::eq:
      return logic_rows_as<Op::eq>(t, n, a, b);
    default:
      return logic_rows_as<Op::ne>(t, n, a, b);
  }
}

// where(c, x, y) of bools: (c & x) | (~c & y).
inline void where_bits(TileState& t, int32_t n) {
  const Node& node = t.node(n);
  const BitsIn c = bits_of(t, node.args[0]);
  const BitsIn x = bits_of(t, node.args[1]);
  const BitsIn y = bits_of(t, node.args[2]);
  uint64_t* out = t.slot(n).bits;
  for (int64_t r = 0; r < t.rows; ++r) {
    const uint64_t w = c.words[r * c.step];
    out[r] = (w & x.words[r * x.step]) | (~w & y.words[r * y.step]);
  }
}

// where(c, x, y) of numbers with a bit-row condition: each row's word picks x or y per column.
template <class T>
void where_numbers(TileState& t, int32_t n, In<T> x, In<T> y) {
  const BitsIn c = bits_of(t, t.node(n).args[0]);
  T* out = own<T>(t, n);
  const int64_t stride = t.slot(n).row_stride;
  for (int64_t r = 0; r < t.rows; ++r) {
    const uint64_t word = c.words[r * c.step];
    const T* xr = x.data + r * x.row_stride;
    const T* yr = y.data + r * y.row_stride;
    T* o = out + r * stride;
    for (int64_t k = 0; k < t.cols; ++k) {
      o[k] = ((word >> k) & 1) != 0 ? xr[k * x.col_stride] : yr[k * y.col_stride];
    }
  }
  mark_written<T>(t, n);
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::program
HWY_AFTER_NAMESPACE();

#endif  // include guard
