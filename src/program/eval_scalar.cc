// The scalar reference evaluator: one (b, h, q, kv[, s]) at a time, one pass over the nodes, every
// node evaluated (eagerly, both sides of a where). apply() is the one definition of what a node
// computes from its arguments' values; constant folding calls it too, and the tile evaluator
// (eval_tile.cc) maps the same operator functions (ops.h), so all three agree bit for bit.
#include <cmath>
#include <string>
#include <vector>

#include "maskattn/error.h"
#include "program/ir.h"
#include "program/ops.h"

namespace maskattn::program {

const char* type_name(Type type) {
  switch (type) {
    case Type::boolean:
      return "bool";
    case Type::int64:
      return "int64";
    default:
      return "f32";
  }
}

int arity(Op op) {
  switch (op) {
    case Op::constant:
    case Op::var_b:
    case Op::var_h:
    case Op::var_q:
    case Op::var_kv:
    case Op::var_s:
    case Op::table:
      return 0;  // a table's arity is its rank
    case Op::where:
      return 3;
    case Op::to_f32:
    case Op::neg:
    case Op::logical_not:
    case Op::abs:
    case Op::exp:
    case Op::log:
    case Op::tanh:
    case Op::sigmoid:
    case Op::floor:
      return 1;
    default:
      return 2;
  }
}

std::string shape_text(const std::vector<int64_t>& sizes) {
  std::string text = "[";
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (k > 0) text += ',';
    text += std::to_string(sizes[k]);
  }
  return text + "]";
}

void throw_index_out_of_range(const ProgramIr& ir, const Node& node, const int64_t* index) {
  const ProgramTable& table = ir.tables[node.table];
  std::vector<int64_t> values(index, index + table.sizes.size());
  std::string text = shape_text(values);
  throw Error("program `" + ir.source + "`, column " + std::to_string(node.column) + ": index " +
              text + " is outside table " + table.name + " of shape " + shape_text(table.sizes));
}

void throw_division_by_zero(const ProgramIr& ir, const Node& node, int64_t dividend) {
  throw Error("program `" + ir.source + "`, column " + std::to_string(node.column) + ": " +
              std::to_string(dividend) + (node.op == Op::mod ? " % 0" : " // 0") +
              ": integer division by zero");
}

namespace {

// An operator on int64 (or bool) operands, through ops.h's one definition.
Scalar apply_int(const ProgramIr& ir, const Node& node, int64_t a, int64_t b) {
  if (node.op == Op::to_f32) return {0, to_f32(a)};
  if (arity(node.op) == 1) return {with_int_unary(node.op, [&](auto f) { return f(a); }), 0};
  const auto on_zero_divisor = [&](int64_t dividend) {
    throw_division_by_zero(ir, node, dividend);
  };
  return {with_int_binary(node.op, on_zero_divisor, [&](auto f) { return f(a, b); }), 0};
}

// An operator on f32 operands, through ops.h's one definition.
Scalar apply_f32(const Node& node, float a, float b) {
  if (node.op == Op::floor) return {floor_to_int(a), 0};
  if (arity(node.op) == 1) return {0, with_f32_unary(node.op, [&](auto f) { return f(a); })};
  if (is_comparison(node.op)) {
    return {with_f32_comparison(node.op, [&](auto f) { return f(a, b); }), 0};
  }
  return {0, with_f32_arithmetic(node.op, [&](auto f) { return f(a, b); })};
}

}  // namespace

Scalar apply(const ProgramIr& ir, const Node& node, const Scalar* args) {
  if (node.op == Op::where) return args[0].i != 0 ? args[1] : args[2];
  const Type operand = ir.nodes[node.args[0]].type;
  if (operand == Type::f32) return apply_f32(node, args[0].f, arity(node.op) == 2 ? args[1].f : 0);
  return apply_int(ir, node, args[0].i, arity(node.op) == 2 ? args[1].i : 0);
}

// The scalar evaluation of the whole program; the caller reads the last value.
Scalar evaluate_scalar(const ProgramIr& ir, float s, int64_t b, int64_t h, int64_t q, int64_t kv) {
  thread_local std::vector<Scalar> values;  // grown once per thread: no allocation per pair
  values.assign(ir.nodes.size(), Scalar{});
  for (size_t n = 0; n < ir.nodes.size(); ++n) {
    const Node& node = ir.nodes[n];
    Scalar args[3];
    for (int k = 0; k < 3; ++k) {
      if (node.args[k] >= 0) args[k] = values[node.args[k]];
    }
    switch (node.op) {
      case Op::constant:
        values[n] = {node.int_value, node.float_value};
        break;
      case Op::var_b:
        values[n] = {b, 0};
        break;
      case Op::var_h:
        values[n] = {h, 0};
        break;
      case Op::var_q:
        values[n] = {q, 0};
        break;
      case Op::var_kv:
        values[n] = {kv, 0};
        break;
      case Op::var_s:
        values[n] = {0, s};
        break;
      case Op::table: {
        const ProgramTable& table = ir.tables[node.table];
        const int64_t index[3] = {args[0].i, args[1].i, args[2].i};
        if (!index_in_range(table, index)) throw_index_out_of_range(ir, node, index);
        const int64_t offset = table_offset(table, index);
        values[n] = node.type == Type::f32 ? Scalar{0, table_f32(table, offset)}
                                           : Scalar{table_int(table, offset), 0};
        break;
      }
      default:
        values[n] = apply(ir, node, args);
    }
  }
  return values.back();
}

}  // namespace maskattn::program
