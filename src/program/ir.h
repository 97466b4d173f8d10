// The typed IR of a program, and the arithmetic both evaluators share.
//
// A program is a flat vector of nodes in evaluation order: a node's arguments are indices of
// earlier nodes, the last node is the result. No pointers, so the IR is copied and shared freely,
// and an evaluator is one loop over the vector. Each node carries its type (bool, int64, f32) and
// what it depends on (Deps: nothing, b/h, q, kv, s as bits). A node's deps are the union of its
// arguments' deps, so the tile evaluator computes a node once per tile (no q, kv or s), once per
// query column (q only), once per key row (kv only), or per pair — the hoisting of (b, h)-only and
// q-only / kv-only work out of the inner loop comes from the tags alone.
//
// Invariants after compile (compile.cc): arguments precede their users; implicit int64 → f32
// promotions are explicit to_f32 nodes; a node whose arguments are all constants has been folded
// into a constant (table reads are never folded: the table memory is borrowed and may change);
// unreachable nodes have been removed; equal nodes are one node (compile.cc). The element
// functions below are the only definition of the arithmetic: folding, the scalar evaluator and
// the tile evaluator all call them, which is why the evaluators agree bit for bit. (The tile
// evaluator's other forms, bit-row comparisons and affine values, are exact by construction:
// tile_slots-inl.h.)
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "maskattn/program.h"

namespace maskattn::program {

enum class Type : uint8_t { boolean, int64, f32 };

enum class Op : uint8_t {
  constant,
  var_b,
  var_h,
  var_q,
  var_kv,
  var_s,
  table,
  to_f32,
  neg,
  logical_not,
  add,
  sub,
  mul,
  div,
  floordiv,
  mod,
  eq,
  ne,
  lt,
  le,
  gt,
  ge,
  logical_and,
  logical_or,
  where,
  min,
  max,
  abs,
  exp,
  log,
  tanh,
  sigmoid,
  floor
};

enum Deps : uint8_t { kNone = 0, kBatchHead = 1, kQuery = 2, kKey = 4, kScore = 8 };

struct Node {
  Op op = Op::constant;
  Type type = Type::int64;
  uint8_t deps = kNone;
  int32_t args[3] = {-1, -1, -1};
  int32_t table = -1;     // Op::table: index into ProgramIr::tables
  int32_t column = 0;     // 1-based column of the construct in the source text, for messages
  int64_t int_value = 0;  // Op::constant of type bool or int64
  float float_value = 0;  // Op::constant of type f32
};

struct ProgramIr {
  ProgramKind kind = ProgramKind::mask;
  std::string source;
  std::vector<ProgramTable> tables;  // validated; strides filled in
  std::vector<Node> nodes;           // evaluation order; nodes.back() is the result
};

const char* type_name(Type type);
int arity(Op op);
bool is_folded_leaf(Op op);  // constant
std::string shape_text(const std::vector<int64_t>& sizes);

// The element arithmetic. Int64 wraps; // and % follow Python (the caller rejects a 0 divisor).
inline int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
inline int64_t wrap_sub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
inline int64_t wrap_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}
inline int64_t wrap_neg(int64_t a) {
  return wrap_sub(0, a);
}
inline int64_t wrap_abs(int64_t a) {
  return a < 0 ? wrap_neg(a) : a;
}
inline int64_t floor_div(int64_t a, int64_t b) {
  if (b == -1) return wrap_neg(a);  // INT64_MIN // -1 wraps instead of trapping
  const int64_t quotient = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? quotient - 1 : quotient;
}
inline int64_t floor_mod(int64_t a, int64_t b) {
  if (b == -1) return 0;
  const int64_t remainder = a % b;
  return (remainder != 0 && ((remainder < 0) != (b < 0))) ? remainder + b : remainder;
}
inline float to_f32(int64_t a) {
  return static_cast<float>(a);
}
inline int64_t floor_to_int(float x) {
  constexpr float kTwo63 = 9223372036854775808.0f;
  if (std::isnan(x)) return 0;
  if (x >= kTwo63) return std::numeric_limits<int64_t>::max();
  if (x < -kTwo63) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(std::floor(x));
}
inline float min_f32(float a, float b) {
  return b < a ? b : a;
}
inline float max_f32(float a, float b) {
  return a < b ? b : a;
}
// exp, log, tanh, sigmoid of n floats: Highway's vector math for this CPU (eval_tile.cc), the one
// definition every evaluator uses.
void math_f32(Op op, const float* in, float* out, int64_t n);
inline float math_f32(Op op, float x) {
  float y = 0.0f;
  math_f32(op, &x, &y, 1);
  return y;
}
inline bool is_vector_math(Op op) {
  return op == Op::exp || op == Op::log || op == Op::tanh || op == Op::sigmoid;
}

// One table element; the caller has checked every index against the sizes.
inline int64_t table_offset(const ProgramTable& table, const int64_t* index) {
  int64_t offset = 0;
  for (size_t k = 0; k < table.sizes.size(); ++k) offset += index[k] * table.strides[k];
  return offset;
}
inline bool index_in_range(const ProgramTable& table, const int64_t* index) {
  for (size_t k = 0; k < table.sizes.size(); ++k) {
    if (index[k] < 0 || index[k] >= table.sizes[k]) return false;
  }
  return true;
}
inline int64_t table_int(const ProgramTable& table, int64_t offset) {
  switch (table.type) {
    case ProgramTableType::int32:
      return static_cast<const int32_t*>(table.data)[offset];
    case ProgramTableType::boolean:
      return static_cast<const uint8_t*>(table.data)[offset] != 0 ? 1 : 0;
    default:
      return static_cast<const int64_t*>(table.data)[offset];
  }
}
inline float table_f32(const ProgramTable& table, int64_t offset) {
  return static_cast<const float*>(table.data)[offset];
}

// One value of any type: bool and int64 in i, f32 in f.
struct Scalar {
  int64_t i = 0;
  float f = 0;
};

// A node's value from its arguments' values (eval_scalar.cc); folding and the scalar evaluator
// both use it. Not for Op::var_* (the evaluator supplies those).
Scalar apply(const ProgramIr& ir, const Node& node, const Scalar* args);

// The evaluators: the whole program for one pair (eval_scalar.cc; the last node's value), and
// for one tile (eval_tile.cc; writes bits for a mask program, maps s for a score program).
Scalar evaluate_scalar(const ProgramIr& ir, float s, int64_t b, int64_t h, int64_t q, int64_t kv);
// A mask tile is always key rows (bits), a score tile either layout (s, mapped in place).
void evaluate_tile(const ProgramIr& ir, const ProgramTile& tile, uint64_t* bits, float* s);
// eval_tile.cc: score_tile's reverse mode (Program::score_tile_backward).
void evaluate_tile_backward(const ProgramIr& ir, const ProgramTile& tile, const float* s, float* ds,
                            double* const* table_grads);
std::string program_text(const ProgramIr& ir);  // text.cc
// Program::check (program.cc): throws Error (E128) unless no evaluation anywhere in the domain can
// index outside a table or divide by zero.
void check_program(const ProgramIr& ir, const ProgramDomain& domain);

// Errors raised while evaluating (shared by both evaluators, so the messages agree too).
[[noreturn]] void throw_index_out_of_range(const ProgramIr& ir, const Node& node,
                                           const int64_t* index);
[[noreturn]] void throw_division_by_zero(const ProgramIr& ir, const Node& node, int64_t dividend);

}  // namespace maskattn::program
