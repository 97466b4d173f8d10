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
  t.work.adjoint_sink = next;  // one more array: the sink (adjoint_or_sink)
  next += t.rows * t.cols;
  std::vector<double>& adjoints = t.work.adjoints;
  if (static_cast<int64_t>(adjoints.size()) < next) adjoints.resize(next);
  std::fill(adjoints.begin(), adjoints.begin() + t.work.adjoint_sink, 0.0);
}

inline double* adjoint(TileState& t, int32_t n) {
  const int64_t offset = t.work.adjoint_offsets[n];
  return offset < 0 ? nullptr : t.work.adjoints.data() + offset;
}

// Where an argument without an adjoint has its contributions written and forgotten, so that the
// loops below need no test per pair.
inline double* adjoint_or_sink(TileState& t, int32_t n) {
  double* a = adjoint(t, n);
  return a != nullptr ? a : t.work.adjoints.data() + t.work.adjoint_sink;
}

// grad · derivative, or nothing when either is 0 (0 · inf stays 0: see the top).
inline double contribution(double grad, double derivative) {
  return grad != 0 && derivative != 0 ? grad * derivative : 0.0;
}

// f(k, values...) for every pair of the tile (k = r · cols + c), each input read along the row or
// as one value per row (with_accessors): a plain loop per row that the compiler vectorises.
template <class F, class... A>
void pairs_rows(int64_t rows, int64_t cols, F f, A... a) {
  for (int64_t r = 0; r < rows; ++r) {
    (a.row(r), ...);
    const int64_t first = r * cols;
#pragma GCC ivdep
    for (int64_t c = 0; c < cols; ++c) f(first + c, a[c]...);
  }
}
template <class F, class... T>
void for_pairs(TileState& t, F f, In<T>... in) {
  with_accessors(
      t.cols, [&](auto... a) { pairs_rows(t.rows, t.cols, f, a...); }, std::tuple<>(), in...);
}

struct Derivatives {
  double a, b;
};

// The derivatives of each binary f32 operator at (a, b) (result `out`), one function per
// operator, chosen once per node.
template <class Use>
void with_binary_derivatives(Op op, Use&& use) {
  switch (op) {
    case Op::add:
      return use([](double, double, double) { return Derivatives{1, 1}; });
    case Op::sub:
      return use([](double, double, double) { return Derivatives{1, -1}; });
    case Op::mul:
      return use([](double a, double b, double) { return Derivatives{b, a}; });
    case Op::div:
      return use([](double a, double b, double) { return Derivatives{1 / b, -a / (b * b)}; });
    case Op::min:  // torch.minimum: self gets 0 where self > other, half at a tie
      return use([](double a, double b, double) {
        return Derivatives{a == b ? 0.5 : (a > b ? 0.0 : 1.0), a == b ? 0.5 : (a < b ? 0.0 : 1.0)};
      });
    default:  // max, torch.maximum
      return use([](double a, double b, double) {
        return Derivatives{a == b ? 0.5 : (a < b ? 0.0 : 1.0), a == b ? 0.5 : (a > b ? 0.0 : 1.0)};
      });
  }
}

template <class Use>
void with_unary_derivative(Op op, Use&& use) {
  switch (op) {
    case Op::neg:
      return use([](double, double) { return -1.0; });
    case Op::abs:  // sign(a), 0 at 0 (and at NaN)
      return use([](double a, double) { return static_cast<double>((a > 0) - (a < 0)); });
    case Op::exp:
      return use([](double, double out) { return out; });
    case Op::log:
      return use([](double a, double) { return 1 / a; });
    case Op::tanh:
      return use([](double, double out) { return 1 - out * out; });
    default:  // sigmoid
      return use([](double, double out) { return out * (1 - out); });
  }
}

// where(c, x, y): each pair's adjoint to the side its condition took.
inline void propagate_where(TileState& t, const Node& node, const double* g) {
  double* x = adjoint_or_sink(t, node.args[1]);
  double* y = adjoint_or_sink(t, node.args[2]);
  const BitsIn bits = bits_of(t, node.args[0]);
  for (int64_t r = 0; r < t.rows; ++r) {
    const uint64_t word = bits.words[r * bits.step];
    const int64_t first = r * t.cols;
    for (int64_t c = 0; c < t.cols; ++c) {
      const bool taken = ((word >> c) & 1) != 0;
      x[first + c] += taken ? g[first + c] : 0.0;
      y[first + c] += taken ? 0.0 : g[first + c];
    }
  }
}

// Node n's adjoint, passed on to its arguments.
inline void propagate(TileState& t, int32_t n) {
  const Node& node = t.node(n);
  const double* g = adjoint(t, n);
  if (node.op == Op::where) return propagate_where(t, node, g);
  const In<float> out = view<float>(t, n);
  const In<float> a = view<float>(t, node.args[0]);
  double* da = adjoint_or_sink(t, node.args[0]);
  if (arity(node.op) == 1) {
    return with_unary_derivative(node.op, [&](auto derivative) {
      for_pairs(
          t, [&](int64_t k, float x, float o) { da[k] += contribution(g[k], derivative(x, o)); }, a,
          out);
    });
  }
  const In<float> b = view<float>(t, node.args[1]);
  double* db = adjoint_or_sink(t, node.args[1]);
  with_binary_derivatives(node.op, [&](auto derivatives) {
    for_pairs(
        t,
        [&](int64_t k, float x, float y, float o) {
          const Derivatives d = derivatives(x, y, o);
          da[k] += contribution(g[k], d.a);
          db[k] += contribution(g[k], d.b);
        },
        a, b, out);
  });
}

// A float32 table read's adjoints, added into the table's gradient at each pair's element
// (logical row-major index), key rows j then queries i. Affine indices (rel[h, q - kv + c]) give
// the element as an affine function of the pair, with no index written out; its arithmetic wraps
// (ir.h), harmlessly: every element it reaches was read in range by the forward.
inline void add_table_gradient(TileState& t, int32_t n, double* grad, int64_t nq, int64_t nk,
                               bool query_rows) {
  const Node& node = t.node(n);
  const ProgramTable& table = t.ir.tables[node.table];
  const size_t rank = table.sizes.size();
  const double* g = adjoint(t, n);
  bool affine = true;
  int64_t origin = 0, row_step = 0, col_step = 0;  // Horner over the logical sizes
  In<int64_t> index[3] = {{nullptr, 0, 0}, {nullptr, 0, 0}, {nullptr, 0, 0}};
  for (size_t k = 0; k < rank; ++k) {
    const Slot& slot = t.slot(node.args[k]);
    affine = affine && slot.affine;
    origin = wrap_add(wrap_mul(origin, table.sizes[k]), slot.base);
    row_step = wrap_add(wrap_mul(row_step, table.sizes[k]), slot.dr);
    col_step = wrap_add(wrap_mul(col_step, table.sizes[k]), slot.dc);
  }
  for (size_t k = 0; k < rank && !affine; ++k) index[k] = view<int64_t>(t, node.args[k]);
  for (int64_t j = 0; j < nk; ++j) {
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t r = query_rows ? i : j, c = query_rows ? j : i;
      const double value = g[r * t.cols + c];
      if (value == 0) continue;
      int64_t element = 0;
      if (affine) {
        element = wrap_add(origin, wrap_add(wrap_mul(row_step, r), wrap_mul(col_step, c)));
      } else {
        for (size_t k = 0; k < rank; ++k) {
          const In<int64_t>& v = index[k];
          element = element * table.sizes[k] + v.data[r * v.row_stride + c * v.col_stride];
        }
      }
      grad[element] += value;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::program
HWY_AFTER_NAMESPACE();

#endif  // include guard
