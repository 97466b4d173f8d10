// The tile evaluator: one (b, h) and a tile of queries [q0, q0 + nq) × keys [kv0, kv0 + nk), one
// pass per IR node over the whole tile, so the cost of interpreting a node (the switch below) is
// paid once per node and tile, not once per pair.
//
// Hoisting. A node's deps decide the shape of its values: no q, kv or s → one value per tile
// (constants, b/h-only work such as slope[h]); q only → one row of nq values; kv only → one
// column of nk values; q and kv, or s → the full nk × nq block (key-major: value (j, i) at
// j * nq + i, the layout of the score tile). An argument of a smaller shape is read with stride 0
// along the dimension it lacks (broadcast), so `doc[q] == doc[kv]` reads the table nq + nk times,
// not nq · nk times.
//
// Vectorisation. This first piece uses plain loops over contiguous arrays (int64 for bool and
// int64 values, f32 for f32 values) that the compiler may vectorise; no Highway yet. Each element
// is computed by the same operator functions (ops.h) as the scalar evaluator, so the two agree
// exactly. Workspace: thread-local vectors, grown once and reused.
#include <cmath>
#include <cstring>
#include <vector>

#include "program/ir.h"
#include "program/ops.h"

namespace maskattn::program {
namespace {

struct Slot {
  int64_t offset = 0;  // into the int64 or the f32 workspace, by the node's type
  int64_t rows = 1;    // nk when the node depends on kv or s
  int64_t cols = 1;    // nq when the node depends on q or s
};

template <class T>
struct In {
  const T* data;
  int64_t row_stride;  // 0: broadcast along keys
  int64_t col_stride;  // 0: broadcast along queries
};

struct Workspace {
  std::vector<int64_t> ints;
  std::vector<float> floats;
  std::vector<Slot> slots;
};

template <class Out, class F, class... T>
void map(Out* out, const Slot& slot, F f, In<T>... in) {
  for (int64_t j = 0; j < slot.rows; ++j) {
    Out* row = out + j * slot.cols;
    if (((in.col_stride == 1) && ...)) {
      for (int64_t i = 0; i < slot.cols; ++i) row[i] = f(in.data[j * in.row_stride + i]...);
    } else {
      for (int64_t i = 0; i < slot.cols; ++i) {
        row[i] = f(in.data[j * in.row_stride + i * in.col_stride]...);
      }
    }
  }
}

class TileEvaluator {
 public:
  TileEvaluator(const ProgramIr& ir, const Tile& tile, Workspace& work)
      : ir_(ir), tile_(tile), work_(work) {}

  void run(const float* s);
  template <class T>
  In<T> view(int32_t node) const;

 private:
  void layout();
  void table(const Node& node, const Slot& slot);
  void int_operands(const Node& node, const Slot& slot);
  void f32_operands(const Node& node, const Slot& slot);
  int64_t* ints(size_t n) { return work_.ints.data() + work_.slots[n].offset; }
  float* floats(size_t n) { return work_.floats.data() + work_.slots[n].offset; }

  const ProgramIr& ir_;
  const Tile& tile_;
  Workspace& work_;
};

template <>
In<int64_t> TileEvaluator::view<int64_t>(int32_t node) const {
  const Slot& slot = work_.slots[node];
  return {work_.ints.data() + slot.offset, slot.rows > 1 ? slot.cols : 0, slot.cols > 1 ? 1 : 0};
}
template <>
In<float> TileEvaluator::view<float>(int32_t node) const {
  const Slot& slot = work_.slots[node];
  return {work_.floats.data() + slot.offset, slot.rows > 1 ? slot.cols : 0, slot.cols > 1 ? 1 : 0};
}

void TileEvaluator::layout() {
  work_.slots.assign(ir_.nodes.size(), Slot{});
  int64_t int_size = 0;
  int64_t float_size = 0;
  for (size_t n = 0; n < ir_.nodes.size(); ++n) {
    const Node& node = ir_.nodes[n];
    Slot& slot = work_.slots[n];
    slot.rows = (node.deps & (kKey | kScore)) ? tile_.nk : 1;
    slot.cols = (node.deps & (kQuery | kScore)) ? tile_.nq : 1;
    int64_t& size = node.type == Type::f32 ? float_size : int_size;
    slot.offset = size;
    size += slot.rows * slot.cols;
  }
  if (static_cast<int64_t>(work_.ints.size()) < int_size) work_.ints.resize(int_size);
  if (static_cast<int64_t>(work_.floats.size()) < float_size) work_.floats.resize(float_size);
}

// A table read per element of the node's shape, every index checked before the read.
void TileEvaluator::table(const Node& node, const Slot& slot) {
  const ProgramTable& table = ir_.tables[node.table];
  const size_t rank = table.sizes.size();
  In<int64_t> index_views[3] = {{nullptr, 0, 0}, {nullptr, 0, 0}, {nullptr, 0, 0}};
  for (size_t k = 0; k < rank; ++k) index_views[k] = view<int64_t>(node.args[k]);
  const size_t n = &node - ir_.nodes.data();
  float* float_out = node.type == Type::f32 ? floats(n) : nullptr;
  int64_t* out = node.type == Type::f32 ? nullptr : ints(n);
  for (int64_t j = 0; j < slot.rows; ++j) {
    for (int64_t i = 0; i < slot.cols; ++i) {
      int64_t index[3] = {0, 0, 0};
      for (size_t k = 0; k < rank; ++k) {
        const In<int64_t>& v = index_views[k];
        index[k] = v.data[j * v.row_stride + i * v.col_stride];
      }
      if (!index_in_range(table, index)) throw_index_out_of_range(ir_, node, index);
      const int64_t offset = table_offset(table, index);
      if (float_out != nullptr) {
        float_out[j * slot.cols + i] = table_f32(table, offset);
      } else {
        out[j * slot.cols + i] = table_int(table, offset);
      }
    }
  }
}

// Nodes whose (first) operand is int64 or bool: ops.h's operators mapped over the tile.
void TileEvaluator::int_operands(const Node& node, const Slot& slot) {
  const size_t n = &node - ir_.nodes.data();
  const In<int64_t> a = view<int64_t>(node.args[0]);
  if (node.op == Op::to_f32)
    return map(
        floats(n), slot, [](int64_t x) { return to_f32(x); }, a);
  int64_t* out = ints(n);
  if (arity(node.op) == 1) return with_int_unary(node.op, [&](auto f) { map(out, slot, f, a); });
  const In<int64_t> b = view<int64_t>(node.args[1]);
  const auto on_zero_divisor = [&](int64_t dividend) {
    throw_division_by_zero(ir_, node, dividend);
  };
  with_int_binary(node.op, on_zero_divisor, [&](auto f) { map(out, slot, f, a, b); });
}

// Nodes whose operands are f32: ops.h's operators mapped over the tile.
void TileEvaluator::f32_operands(const Node& node, const Slot& slot) {
  const size_t n = &node - ir_.nodes.data();
  const In<float> a = view<float>(node.args[0]);
  if (node.op == Op::floor)
    return map(
        ints(n), slot, [](float x) { return floor_to_int(x); }, a);
  if (arity(node.op) == 1) {
    return with_f32_unary(node.op, [&](auto f) { map(floats(n), slot, f, a); });
  }
  const In<float> b = view<float>(node.args[1]);
  if (is_comparison(node.op)) {
    return with_f32_comparison(node.op, [&](auto f) { map(ints(n), slot, f, a, b); });
  }
  with_f32_arithmetic(node.op, [&](auto f) { map(floats(n), slot, f, a, b); });
}

void TileEvaluator::run(const float* s) {
  layout();
  for (size_t n = 0; n < ir_.nodes.size(); ++n) {
    const Node& node = ir_.nodes[n];
    const Slot& slot = work_.slots[n];
    const bool is_f32 = node.type == Type::f32;
    switch (node.op) {
      case Op::constant:
        if (is_f32)
          floats(n)[0] = node.float_value;
        else
          ints(n)[0] = node.int_value;
        break;
      case Op::var_b:
        ints(n)[0] = tile_.b;
        break;
      case Op::var_h:
        ints(n)[0] = tile_.h;
        break;
      case Op::var_q:
        for (int64_t i = 0; i < slot.cols; ++i) ints(n)[i] = tile_.q0 + i;
        break;
      case Op::var_kv:
        for (int64_t j = 0; j < slot.rows; ++j) ints(n)[j] = tile_.kv0 + j;
        break;
      case Op::var_s:
        std::memcpy(floats(n), s, sizeof(float) * tile_.nq * tile_.nk);
        break;
      case Op::table:
        table(node, slot);
        break;
      case Op::where:
        if (is_f32) {
          map(
              floats(n), slot, [](int64_t c, float x, float y) { return c != 0 ? x : y; },
              view<int64_t>(node.args[0]), view<float>(node.args[1]), view<float>(node.args[2]));
        } else {
          map(
              ints(n), slot, [](int64_t c, int64_t x, int64_t y) { return c != 0 ? x : y; },
              view<int64_t>(node.args[0]), view<int64_t>(node.args[1]),
              view<int64_t>(node.args[2]));
        }
        break;
      default:
        if (ir_.nodes[node.args[0]].type == Type::f32)
          f32_operands(node, slot);
        else
          int_operands(node, slot);
    }
  }
}

}  // namespace

void evaluate_tile(const ProgramIr& ir, const Tile& tile, uint64_t* bits, float* s) {
  thread_local Workspace work;
  TileEvaluator evaluator(ir, tile, work);
  evaluator.run(s);
  const int32_t root = static_cast<int32_t>(ir.nodes.size()) - 1;
  if (ir.kind == ProgramKind::mask) {
    const In<int64_t> result = evaluator.view<int64_t>(root);
    for (int64_t j = 0; j < tile.nk; ++j) {
      uint64_t row = 0;
      for (int64_t i = 0; i < tile.nq; ++i) {
        row |= static_cast<uint64_t>(result.data[j * result.row_stride + i * result.col_stride])
               << i;
      }
      bits[j] = row;
    }
    return;
  }
  const In<float> result = evaluator.view<float>(root);
  for (int64_t j = 0; j < tile.nk; ++j) {
    for (int64_t i = 0; i < tile.nq; ++i) {
      s[j * tile.nq + i] = result.data[j * result.row_stride + i * result.col_stride];
    }
  }
}

}  // namespace maskattn::program
