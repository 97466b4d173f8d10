// The tile evaluator: one (b, h) and a tile of queries [q0, q0 + nq) × keys [kv0, kv0 + nk), one
// pass per IR node over the whole tile, so the cost of interpreting a node (the switch below) is
// paid once per node and tile, not once per pair. Compiled once per SIMD target (Highway runtime
// dispatch), so the plain loops over a row are vectorised for the CPU at hand.
//
// Hoisting comes from the nodes' shapes (tile_slots-inl.h): a node computes one value per tile,
// per query, per key or per pair, whichever its deps ask for. What makes the block-map scan cheap
// (mask_tile on every 64 × 64 tile of an L × L problem, a million tiles at L = 65536) is that the
// common masks never touch a pair at a time: bool pair nodes are bit rows, comparisons of affine
// expressions (q >= kv, q - kv < 256) are one threshold per row, other comparisons are vector
// compares straight into the words (tile_bits-inl.h), and a table indexed along an affine
// expression is viewed in place (tile_tables-inl.h). Score programs map each operator over the
// rows with ops.h's element functions, reading the caller's scores and writing the result into
// the caller's tile in either layout.
//
// Exactness. Every value is computed by the same element function as in the scalar evaluator
// (ops.h), or, for the representations above, proved equal to it: affine values are kept only when
// no element of the tile wraps, comparisons of integers are exact either way, and float
// comparisons are IEEE's. So the two evaluators agree bit for bit (program_test checks it).
//
// Errors: every table index is checked before its read and every integer divisor tested, in the
// node order of the scalar evaluator and pair order within a node, so a bad tile raises an Error
// rather than reading outside a table. A program that passed Program::check never raises.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "program/eval_tile.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <cstdint>
#include <limits>

#include "program/ir.h"
#include "program/ops.h"
#include "program/tile_backward-inl.h"
#include "program/tile_bits-inl.h"
#include "program/tile_slots-inl.h"
#include "program/tile_tables-inl.h"

HWY_BEFORE_NAMESPACE();
namespace maskattn::program {
namespace HWY_NAMESPACE {

// Where the result goes: a mask tile's bit rows, or the caller's scores (none: the backward keeps
// the forward's result in the workspace).
struct Destination {
  uint64_t* bits = nullptr;
  float* scores = nullptr;
  int64_t stride = 0;
};

// exp, log, tanh and sigmoid over n floats with Highway's vector math (hwy/contrib/math): their
// one definition. The scalar evaluator and constant folding call it for one element (math_f32,
// dispatched to this same target), so every evaluator agrees bit for bit while tiles run whole
// vectors. IEEE's special values are set explicitly (the polynomials' contracts stop at them):
// log(0) = −inf, log(x < 0) = NaN, log(inf) = inf; exp overflows to inf and underflows to 0; NaN
// stays NaN.
template <class D>
hn::Vec<D> MathVector(D d, Op op, hn::Vec<D> x) {
  using V = hn::Vec<D>;
  const V nan = hn::Set(d, std::numeric_limits<float>::quiet_NaN());
  const V inf = hn::Set(d, std::numeric_limits<float>::infinity());
  const V zero = hn::Zero(d), one = hn::Set(d, 1.0f);
  const auto exp = [&](V v) {
    // Beyond these the result is inf or 0 (the clamped polynomial would give a finite value).
    const V y = hn::Exp(d, hn::Min(hn::Max(v, hn::Set(d, -104.0f)), hn::Set(d, 88.5f)));
    const V high = hn::IfThenElse(hn::Gt(v, hn::Set(d, 88.72283f)), inf, y);
    return hn::IfThenElse(hn::Lt(v, hn::Set(d, -103.97208f)), zero, high);
  };
  V y;
  switch (op) {
    case Op::exp:
      y = exp(x);
      break;
    case Op::log: {
      const V positive = hn::IfThenElse(hn::Gt(x, zero), x, one);
      y = hn::Log(d, hn::Min(positive, hn::Set(d, std::numeric_limits<float>::max())));
      y = hn::IfThenElse(hn::Eq(x, inf), inf, y);
      y = hn::IfThenElse(hn::Eq(x, zero), hn::Neg(inf), y);
      y = hn::IfThenElse(hn::Lt(x, zero), nan, y);
      break;
    }
    case Op::tanh:
      y = hn::Tanh(d, hn::Min(hn::Max(x, hn::Set(d, -20.0f)), hn::Set(d, 20.0f)));
      break;
    default:  // sigmoid = 1 / (1 + exp(−x))
      y = hn::Div(one, hn::Add(one, exp(hn::Neg(x))));
  }
  return hn::IfThenElse(hn::IsNaN(x), x, y);
}

void MathF32(Op op, const float* HWY_RESTRICT in, float* HWY_RESTRICT out, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(MathVector(d, op, hn::LoadU(d, in + i)), d, out + i);
  if (i == n) return;
  HWY_ALIGN float rest[hn::MaxLanes(d)] = {};
  for (int64_t k = i; k < n; ++k) rest[k - i] = in[k];
  hn::Store(MathVector(d, op, hn::Load(d, rest)), d, rest);
  for (int64_t k = i; k < n; ++k) out[k] = rest[k - i];
}

Workspace& workspace() {
  thread_local Workspace work;
  return work;
}

void ensure_values(TileState& t, int32_t n) {
  Slot& slot = t.slot(n);
  if (slot.has_values) return;
  int64_t* out = own<int64_t>(t, n);
  if (slot.affine) {  // locals: out may alias the slot's int64 fields as far as the compiler knows
    const int64_t rows = t.rows_of(n), cols = t.cols_of(n), stride = slot.row_stride;
    const int64_t base = slot.base, dr = slot.dr, dc = slot.dc;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t start = base + dr * r;  // exact: affine nodes never wrap
      for (int64_t c = 0; c < cols; ++c) out[r * stride + c] = start + dc * c;
    }
  } else {  // a bool pair node known as bit rows only
    for (int64_t r = 0; r < t.rows; ++r) {
      for (int64_t c = 0; c < t.cols; ++c) {
        out[r * slot.row_stride + c] = static_cast<int64_t>((slot.bits[r] >> c) & 1);
      }
    }
  }
  mark_written<int64_t>(t, n);
}

// ---- layout --------------------------------------------------------------------------------

uint8_t axes_of(const TileState& t, const Node& node) {
  uint8_t axes = 0;
  if (node.deps & kQuery) axes |= t.q_axis;
  if (node.deps & kKey) axes |= t.kv_axis;
  if (node.deps & kScore) axes |= kBothAxes;
  return axes;
}

// Every node's storage in the workspace (grown, never shrunk), then the result's destination.
void layout(TileState& t, const Destination& dest) {
  Workspace& w = t.work;
  const size_t count = t.ir.nodes.size();
  w.slots.assign(count, Slot{});
  int64_t sizes[3] = {0, 0, 0};  // ints, floats, bit words
  for (size_t n = 0; n < count; ++n) {
    w.slots[n].axes = axes_of(t, t.ir.nodes[n]);
    const int64_t elements = t.rows_of(n) * t.cols_of(n);
    sizes[t.ir.nodes[n].type == Type::f32 ? 1 : 0] += elements;
    if (t.ir.nodes[n].type == Type::boolean) sizes[2] += t.rows_of(n);
  }
  if (static_cast<int64_t>(w.ints.size()) < sizes[0]) w.ints.resize(sizes[0]);
  if (static_cast<int64_t>(w.floats.size()) < sizes[1]) w.floats.resize(sizes[1]);
  if (static_cast<int64_t>(w.bits.size()) < sizes[2]) w.bits.resize(sizes[2]);
  int64_t next[3] = {0, 0, 0};
  for (size_t n = 0; n < count; ++n) {
    Slot& slot = w.slots[n];
    const Node& node = t.ir.nodes[n];
    const bool f32 = node.type == Type::f32;
    slot.own = f32 ? static_cast<void*>(w.floats.data() + next[1])
                   : static_cast<void*>(w.ints.data() + next[0]);
    next[f32 ? 1 : 0] += t.rows_of(n) * t.cols_of(n);
    if (node.type == Type::boolean) {
      slot.bits = w.bits.data() + next[2];
      next[2] += t.rows_of(n);
    }
    slot.row_stride = (slot.axes & kRowAxis) ? t.cols_of(n) : 0;
    slot.col_stride = (slot.axes & kColAxis) ? 1 : 0;
  }
  // The result is computed into the caller's tile, except s itself and a table read (which may
  // raise half-way: nothing of the caller's is written before every read is known good).
  Slot& root = w.slots[count - 1];
  const Op root_op = t.ir.nodes[count - 1].op;
  if (dest.bits != nullptr && root.axes == kBothAxes) root.bits = dest.bits;
  if (dest.scores != nullptr && root.axes == kBothAxes && root_op != Op::var_s &&
      root_op != Op::table) {
    root.own = dest.scores;
    root.row_stride = dest.stride;
  }
}

// ---- the operators -------------------------------------------------------------------------

void set_affine(TileState& t, int32_t n, int64_t base, int64_t dr, int64_t dc) {
  Slot& slot = t.slot(n);
  slot.affine = true;
  slot.base = base;
  slot.dr = dr;
  slot.dc = dc;
}

// A node with one value per tile that was computed (not affine yet): its value is its base.
void note_uniform(TileState& t, int32_t n) {
  const Slot& slot = t.slot(n);
  if (slot.axes == 0 && t.node(n).type == Type::int64 && slot.has_values) {
    set_affine(t, n, static_cast<const int64_t*>(slot.data)[0], 0, 0);
  }
}

bool fits(Wide x) {
  return x >= std::numeric_limits<int64_t>::min() && x <= std::numeric_limits<int64_t>::max();
}

// + - * and unary - of affine operands stay affine when no element of the tile wraps.
bool try_affine(TileState& t, int32_t n) {
  const Node& node = t.node(n);
  if (node.type != Type::int64 || node.args[0] < 0) return false;
  const Slot& a = t.slot(node.args[0]);
  const Slot* b = arity(node.op) == 2 ? &t.slot(node.args[1]) : nullptr;
  if (!a.affine || (b != nullptr && !b->affine)) return false;
  Wide base, dr, dc;
  if (node.op == Op::neg) {
    base = -Wide{a.base}, dr = -Wide{a.dr}, dc = -Wide{a.dc};
  } else if (node.op == Op::add || node.op == Op::sub) {
    const Wide sign = node.op == Op::add ? 1 : -1;
    base = a.base + sign * b->base, dr = a.dr + sign * b->dr, dc = a.dc + sign * b->dc;
  } else if (node.op == Op::mul && (a.dr == 0 && a.dc == 0)) {
    base = Wide{a.base} * b->base, dr = Wide{a.base} * b->dr, dc = Wide{a.base} * b->dc;
  } else if (node.op == Op::mul && (b->dr == 0 && b->dc == 0)) {
    base = Wide{b->base} * a.base, dr = Wide{b->base} * a.dr, dc = Wide{b->base} * a.dc;
  } else {
    return false;
  }
  const Wide last_row = t.rows_of(n) - 1, last_col = t.cols_of(n) - 1;
  if (!fits(base) || !fits(dr) || !fits(dc) || !fits(base + dr * last_row) ||
      !fits(base + dc * last_col) || !fits(base + dr * last_row + dc * last_col)) {
    return false;
  }
  set_affine(t, n, static_cast<int64_t>(base), static_cast<int64_t>(dr), static_cast<int64_t>(dc));
  return true;
}

// A comparison, &, |, ~ whose result has both axes: bit rows.
void bits_node(TileState& t, int32_t n) {
  const Node& node = t.node(n);
  const Node& first = t.node(node.args[0]);
  if (first.type == Type::boolean) {
    logic_rows(t, n);
  } else if (first.type == Type::f32) {
    compare_rows(t, n, node.op, view<float>(t, node.args[0]), view<float>(t, node.args[1]));
  } else if (t.slot(node.args[0]).affine && t.slot(node.args[1]).affine) {
    compare_affine(t, n, node.op, t.slot(node.args[0]), t.slot(node.args[1]));
  } else if (In<int32_t> narrow[2]; narrow_to_int32(t, {node.args[0], node.args[1]}, narrow)) {
    compare_rows(t, n, node.op, narrow[0], narrow[1]);
  } else {
    compare_rows(t, n, node.op, view<int64_t>(t, node.args[0]), view<int64_t>(t, node.args[1]));
  }
  t.slot(n).has_bits = true;
}

// Nodes whose (first) operand is int64 or bool: ops.h's operators mapped over the tile.
void int_node(TileState& t, int32_t n) {
  const Node& node = t.node(n);
  const In<int64_t> a = view<int64_t>(t, node.args[0]);
  if (node.op == Op::to_f32) {
    return map<float>(
        t, n, [](int64_t x) { return to_f32(x); }, a);
  }
  if (arity(node.op) == 1) {
    return with_int_unary(node.op, [&](auto f) { map<int64_t>(t, n, f, a); });
  }
  const In<int64_t> b = view<int64_t>(t, node.args[1]);
  const auto on_zero_divisor = [&](int64_t dividend) {
    throw_division_by_zero(t.ir, node, dividend);
  };
  with_int_binary(node.op, on_zero_divisor, [&](auto f) { map<int64_t>(t, n, f, a, b); });
}

// Nodes whose operands are f32: ops.h's operators mapped over the tile.
void f32_node(TileState& t, int32_t n) {
  const Node& node = t.node(n);
  const In<float> a = view<float>(t, node.args[0]);
  if (node.op == Op::floor) {
    return map<int64_t>(
        t, n, [](float x) { return floor_to_int(x); }, a);
  }
  if (is_vector_math(node.op) && (a.col_stride == 1 || t.cols_of(n) == 1)) {
    float* out = own<float>(t, n);
    for (int64_t r = 0; r < t.rows_of(n); ++r) {
      MathF32(node.op, a.data + r * a.row_stride, out + r * t.slot(n).row_stride, t.cols_of(n));
    }
    return mark_written<float>(t, n);
  }
  if (arity(node.op) == 1) {
    return with_f32_unary(node.op, [&](auto f) { map<float>(t, n, f, a); });
  }
  const In<float> b = view<float>(t, node.args[1]);
  if (is_comparison(node.op)) {
    return with_f32_comparison(node.op, [&](auto f) { map<int64_t>(t, n, f, a, b); });
  }
  with_f32_arithmetic(node.op, [&](auto f) { map<float>(t, n, f, a, b); });
}

void where_node(TileState& t, int32_t n) {
  const Node& node = t.node(n);
  const bool pair = t.slot(n).axes == kBothAxes;
  if (node.type == Type::boolean && pair) {
    where_bits(t, n);
    t.slot(n).has_bits = true;
    return;
  }
  const bool cond_bits = t.slot(node.args[0]).axes == kBothAxes;
  if (node.type == Type::f32) {
    const In<float> x = view<float>(t, node.args[1]), y = view<float>(t, node.args[2]);
    if (cond_bits) return where_numbers(t, n, x, y);
    return map<float>(
        t, n, [](int64_t c, float p, float q) { return c != 0 ? p : q; },
        view<int64_t>(t, node.args[0]), x, y);
  }
  const In<int64_t> x = view<int64_t>(t, node.args[1]), y = view<int64_t>(t, node.args[2]);
  if (cond_bits) return where_numbers(t, n, x, y);
  map<int64_t>(
      t, n, [](int64_t c, int64_t p, int64_t q) { return c != 0 ? p : q; },
      view<int64_t>(t, node.args[0]), x, y);
}

void variable(TileState& t, int32_t n, const float* s, int64_t s_stride) {
  Slot& slot = t.slot(n);
  switch (t.node(n).op) {
    case Op::var_b:
      return set_affine(t, n, t.b, 0, 0);
    case Op::var_h:
      return set_affine(t, n, t.h, 0, 0);
    case Op::var_q:
      return set_affine(t, n, t.q0, t.q_axis == kRowAxis, t.q_axis == kColAxis);
    case Op::var_kv:
      return set_affine(t, n, t.kv0, t.kv_axis == kRowAxis, t.kv_axis == kColAxis);
    default:  // var_s: the caller's scores, viewed in place
      slot.data = s;
      slot.row_stride = s_stride;
      slot.col_stride = 1;
      slot.has_values = true;
  }
}

void run_node(TileState& t, int32_t n, const float* s, int64_t s_stride) {
  const Node& node = t.node(n);
  switch (node.op) {
    case Op::constant:
      if (node.type == Type::f32) {
        own<float>(t, n)[0] = node.float_value;
        return mark_written<float>(t, n);
      }
      return set_affine(t, n, node.int_value, 0, 0);
    case Op::var_b:
    case Op::var_h:
    case Op::var_q:
    case Op::var_kv:
    case Op::var_s:
      return variable(t, n, s, s_stride);
    case Op::table:
      read_table(t, n);
      return note_uniform(t, n);
    case Op::where:
      where_node(t, n);
      return note_uniform(t, n);
    default:
      break;
  }
  const bool bits = node.type == Type::boolean && t.slot(n).axes == kBothAxes;
  if (bits) return bits_node(t, n);
  if (try_affine(t, n)) return;
  if (t.node(node.args[0]).type == Type::f32) {
    f32_node(t, n);
  } else {
    int_node(t, n);
  }
  note_uniform(t, n);
}

// Runs every node of the program on the tile.
TileState run_tile(const ProgramIr& ir, const ProgramTile& tile, const Destination& dest,
                   const float* s) {
  const bool query_rows = tile.query_rows;
  TileState t{ir,
              workspace(),
              tile.b,
              tile.h,
              tile.q0,
              tile.kv0,
              query_rows ? tile.nq : tile.nk,
              query_rows ? tile.nk : tile.nq,
              static_cast<uint8_t>(query_rows ? kRowAxis : kColAxis),
              static_cast<uint8_t>(query_rows ? kColAxis : kRowAxis),
              0};
  t.full = low_bits(t.cols);
  const int64_t stride = tile.row_stride != 0 ? tile.row_stride : t.cols;
  layout(t, dest);
  for (int32_t n = 0; n < static_cast<int32_t>(ir.nodes.size()); ++n) run_node(t, n, s, stride);
  return t;
}

void EvaluateTileImpl(const ProgramIr& ir, const ProgramTile& tile, uint64_t* bits, float* s) {
  const int64_t stride =
      tile.row_stride != 0 ? tile.row_stride : (tile.query_rows ? tile.nk : tile.nq);
  TileState t = run_tile(ir, tile, {bits, bits != nullptr ? nullptr : s, stride}, s);
  const int32_t root = static_cast<int32_t>(ir.nodes.size()) - 1;
  if (bits != nullptr) {
    const BitsIn words = bits_of(t, root);
    if (words.words != bits) {
      for (int64_t r = 0; r < t.rows; ++r) bits[r] = words.words[r * words.step];
    }
    return;
  }
  const Slot& slot = t.slot(root);
  if (slot.data == s) return;  // written in place (or the program is s itself)
  const In<float> result = view<float>(t, root);
  for (int64_t r = 0; r < t.rows; ++r) {
    for (int64_t c = 0; c < t.cols; ++c) {
      s[r * stride + c] = result.data[r * result.row_stride + c * result.col_stride];
    }
  }
}

// The forward with its values kept, then the adjoints from the result back (tile_backward-inl.h).
void EvaluateTileBackwardImpl(const ProgramIr& ir, const ProgramTile& tile, const float* s,
                              float* ds, double* const* table_grads) {
  TileState t = run_tile(ir, tile, Destination{}, s);
  place_adjoints(t, table_grads);
  const int32_t count = static_cast<int32_t>(ir.nodes.size());
  const int64_t stride = tile.row_stride != 0 ? tile.row_stride : t.cols;
  double* result = adjoint(t, count - 1);
  for (int64_t r = 0; r < t.rows; ++r) {
    for (int64_t c = 0; c < t.cols; ++c) {
      if (result != nullptr) result[r * t.cols + c] = ds[r * stride + c];
    }
  }
  for (int32_t n = count - 1; n >= 0; --n) {
    const Op op = ir.nodes[n].op;
    if (adjoint(t, n) != nullptr && op != Op::var_s && op != Op::table) propagate(t, n);
  }
  const double* score = nullptr;  // s's adjoint (one node: equal nodes are shared)
  for (int32_t n = 0; n < count; ++n) {
    if (ir.nodes[n].op == Op::var_s) score = adjoint(t, n);
  }
  for (int64_t r = 0; r < t.rows; ++r) {
    float* row = ds + r * stride;
    for (int64_t c = 0; c < t.cols; ++c) {
      const double value = score != nullptr ? score[r * t.cols + c] : 0.0;
      row[c] = row[c] == 0 ? 0.0f : static_cast<float>(value);
    }
  }
  for (int32_t n = 0; n < count; ++n) {
    if (ir.nodes[n].op == Op::table && adjoint(t, n) != nullptr) {
      add_table_gradient(t, n, table_grads[ir.nodes[n].table], tile.nq, tile.nk, tile.query_rows);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::program
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace maskattn::program {

HWY_EXPORT(EvaluateTileImpl);
HWY_EXPORT(MathF32);

void math_f32(Op op, const float* in, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(MathF32)(op, in, out, n);
}

void evaluate_tile(const ProgramIr& ir, const ProgramTile& tile, uint64_t* bits, float* s) {
  HWY_DYNAMIC_DISPATCH(EvaluateTileImpl)(ir, tile, bits, s);
}

HWY_EXPORT(EvaluateTileBackwardImpl);

void evaluate_tile_backward(const ProgramIr& ir, const ProgramTile& tile, const float* s, float* ds,
                            double* const* table_grads) {
  HWY_DYNAMIC_DISPATCH(EvaluateTileBackwardImpl)(ir, tile, s, ds, table_grads);
}

}  // namespace maskattn::program
#endif  // HWY_ONCE
