// The backward of score_tile (Program::score_tile_backward): reverse mode over the IR for one tile,
// compiled once per SIMD target with the forward it reruns (eval_tile.cc).
//
// The forward runs first, its result kept in the workspace, so every node's values are at hand
// (the slots). Then each f32 node that depends on s or on a float32 table carries an adjoint, one
// f64 per pair of the tile whatever the node's own shape: a node computed once per tile (slope[h])
// is used by every pair, and its adjoint is the pairs' sum, added into the table's gradient pair by
// pair in a fixed order. Adjoints flow from the result to the arguments, node by node from last to
// first, with the derivatives PyTorch uses:
//
//   a ± b → (1, ±1)   a · b → (b, a)   a / b → (1/b, −a/b²)   −a → −1   exp → result
//   log a → 1/a   tanh → 1 − result²   sigmoid → result · (1 − result)   abs a → sign(a), 0 at 0
//   where(c, a, b) → the taken side gets all, the other nothing
//   min/max(a, b) → the smaller (larger) side gets all; at a tie each gets half (PyTorch 2's
//                   torch.minimum / torch.maximum: derivatives.yaml splits grad / 2 on self ==
//                   other)
//
// and none through to_f32, floor, comparisons or integer work (they are not differentiable).
// An adjoint that is exactly 0 propagates nothing: the hidden pairs of a masked tile (∂L/∂output
// 0) get ∂L/∂s = 0 and add nothing to a table, and an untaken branch never makes 0 · inf = NaN.
//
// Precision: the forward's values are f32 (they are the program's), the derivatives and adjoints
// f64, rounded once into ds; table gradients accumulate in f64, pairs in order key row j then
// query i, tables' reads in node order, so the sum does not depend on the layout or the thread.
#if defined(MASKATTN_PROGRAM_TILE_BACKWARD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MASKATTN_PROGRAM_TILE_BACKWARD_INL_H_
#undef MASKATTN_PROGRAM_TILE_BACKWARD_INL_H_
#else
#define MASKATTN_PROGRAM_TILE_BACKWARD_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "program/ir.h"
#include "program/tile_bits-inl.h"
#include "program/tile_slots-inl.h"

HWY_BEFORE_NAMESPACE();
namespace maskattn::program {
namespace HWY_NAMESPACE {

// Which nodes carry an adjoint, and where each one's f64 array is in the workspace (-1: none).
inline void place_adjoints(TileState& t, double* const* table_grads) {
  std::vector<int64_t>& offset = t.work.adjoint_offsets;
  const size_t count = t.ir.nodes.size();
  offset.assign(count, -1);
  int64_t next = 0;
  for (size_t n = 0; n < count; ++n) {
    const Node& node = t.ir.nodes[n];
    bool carries = false;
    if (node.type != Type::f32 || node.op == Op::constant || node.op == Op::to_f32) {
      carries = false;
    } else if (node.op == Op::var_s) {
      carries = true;
    } else if (node.op == Op::table) {
      carries = table_grads != nullptr && table_grads[node.table] != nullptr;
    } else {
      for (int k = node.op == Op::where ? 1 : 0; k < 3; ++k) {
        carries = carries || (node.args[k] >= 0 && offset[node.args[k]] >= 0);
      }
    }
    if (carries) {
      offset[n] = next;
      next += t.rows * t.cols;
    }
  }
  std::vector<double>& adjoints = t.work.adjoints;
  if (static_cast<int64_t>(adjoints.size()) < next) adjoints.resize(next);
  std::fill(adjoints.begin(), adjoints.begin() + next, 0.0);
}

inline double* adjoint(TileState& t, int32_t n) {
  const int64_t offset = t.work.adjoint_offsets[n];
  return offset < 0 ? nullptr : t.work.adjoints.data() + offset;
}

// f(g, r, c, k) for every pair whose adjoint g is not 0 (k = r · cols + c).
template <class F>
void for_each_adjoint(TileState& t, const double* g, F f) {
  for (int64_t r = 0; r < t.rows; ++r) {
    for (int64_t c = 0; c < t.cols; ++c) {
      const int64_t k = r * t.cols + c;
      if (g[k] != 0) f(g[k], r, c, k);
    }
  }
}

inline double value_at(const In<float>& v, int64_t r, int64_t c) {
  return v.data[r * v.row_stride + c * v.col_stride];
}

// ∂/∂a and ∂/∂b of a binary f32 operator at (a, b), `out` its result.
inline void binary_derivatives(Op op, double a, double b, double out, double& da, double& db) {
  (void)out;
  switch (op) {
    case Op::add:
      da = 1, db = 1;
      return;
    case Op::sub:
      da = 1, db = -1;
      return;
    case Op::mul:
      da = b, db = a;
      return;
    case Op::div:
      da = 1 / b, db = -a / (b * b);
      return;
    case Op::min:  // torch.minimum: self gets 0 where self > other, half at a tie
      da = a == b ? 0.5 : (a > b ? 0 : 1);
      db = a == b ? 0.5 : (a < b ? 0 : 1);
      return;
    default:  // max, torch.maximum
      da = a == b ? 0.5 : (a < b ? 0 : 1);
      db = a == b ? 0.5 : (a > b ? 0 : 1);
  }
}

inline double unary_derivative(Op op, double a, double out) {
  switch (op) {
    case Op::neg:
      return -1;
    case Op::abs:
      return (a > 0) - (a < 0);
    case Op::exp:
      return out;
    case Op::log:
      return 1 / a;
    case Op::tanh:
      return 1 - out * out;
    default:  // sigmoid
      return out * (1 - out);
  }
}

// Node n's adjoint, passed on to its arguments.
inline void propagate(TileState& t, int32_t n) {
  const Node& node = t.node(n);
  const double* g = adjoint(t, n);
  if (node.op == Op::where) {
    double* x = adjoint(t, node.args[1]);
    double* y = adjoint(t, node.args[2]);
    const BitsIn bits = bits_of(t, node.args[0]);
    for_each_adjoint(t, g, [&](double grad, int64_t r, int64_t c, int64_t k) {
      double* side = ((bits.words[r * bits.step] >> c) & 1) != 0 ? x : y;
      if (side != nullptr) side[k] += grad;
    });
    return;
  }
  const In<float> out = view<float>(t, n);
  const In<float> a = view<float>(t, node.args[0]);
  double* da = adjoint(t, node.args[0]);
  if (arity(node.op) == 1) {
    if (da == nullptr) return;
    for_each_adjoint(t, g, [&](double grad, int64_t r, int64_t c, int64_t k) {
      da[k] += grad * unary_derivative(node.op, value_at(a, r, c), value_at(out, r, c));
    });
    return;
  }
  const In<float> b = view<float>(t, node.args[1]);
  double* db = adjoint(t, node.args[1]);
  for_each_adjoint(t, g, [&](double grad, int64_t r, int64_t c, int64_t k) {
    double d0 = 0, d1 = 0;
    binary_derivatives(node.op, value_at(a, r, c), value_at(b, r, c), value_at(out, r, c), d0, d1);
    if (da != nullptr && d0 != 0) da[k] += grad * d0;
    if (db != nullptr && d1 != 0) db[k] += grad * d1;
  });
}

// A float32 table read's adjoints, added into the table's gradient at each pair's element
// (logical row-major index), key rows j then queries i.
inline void add_table_gradient(TileState& t, int32_t n, double* grad, int64_t nq, int64_t nk,
                               bool query_rows) {
  const Node& node = t.node(n);
  const ProgramTable& table = t.ir.tables[node.table];
  const double* g = adjoint(t, n);
  In<int64_t> index[3] = {{nullptr, 0, 0}, {nullptr, 0, 0}, {nullptr, 0, 0}};
  const size_t rank = table.sizes.size();
  for (size_t k = 0; k < rank; ++k) index[k] = view<int64_t>(t, node.args[k]);
  for (int64_t j = 0; j < nk; ++j) {
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t r = query_rows ? i : j, c = query_rows ? j : i;
      const double value = g[r * t.cols + c];
      if (value == 0) continue;
      int64_t element = 0;
      for (size_t k = 0; k < rank; ++k) {
        element = element * table.sizes[k] +
                  index[k].data[r * index[k].row_stride + c * index[k].col_stride];
      }
      grad[element] += value;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::program
HWY_AFTER_NAMESPACE();

#endif  // include guard
