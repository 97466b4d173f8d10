// The scalar reference evaluator: one (b, h, q, kv[, s]) at a time, one pass over the nodes, every
// node evaluated (eagerly, both sides of a where). apply() is the one definition of what a node
// computes from its arguments' values; constant folding calls it too, and the tile evaluator
// (eval_tile.cc) calls the same element functions of ir.h, so all three agree bit for bit.
#include <cmath>
#include <string>
#include <vector>

#include "maskattn/error.h"
#include "program/ir.h"

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

Scalar apply_int(const ProgramIr& ir, const Node& node, int64_t a, int64_t b) {
  switch (node.op) {
    case Op::neg:
      return {wrap_neg(a), 0};
    case Op::logical_not:
      return {a ^ 1, 0};
    case Op::abs:
      return {wrap_abs(a), 0};
    case Op::add:
      return {wrap_add(a, b), 0};
    case Op::sub:
      return {wrap_sub(a, b), 0};
    case Op::mul:
      return {wrap_mul(a, b), 0};
    case Op::floordiv:
    case Op::mod:
      if (b == 0) throw_division_by_zero(ir, node, a);
      return {node.op == Op::mod ? floor_mod(a, b) : floor_div(a, b), 0};
    case Op::eq:
      return {a == b, 0};
    case Op::ne:
      return {a != b, 0};
    case Op::lt:
      return {a < b, 0};
    case Op::le:
      return {a <= b, 0};
    case Op::gt:
      return {a > b, 0};
    case Op::ge:
      return {a >= b, 0};
    case Op::logical_and:
      return {a & b, 0};
    case Op::logical_or:
      return {a | b, 0};
    case Op::min:
      return {b < a ? b : a, 0};
    case Op::max:
      return {a < b ? b : a, 0};
    default:
      return {0, to_f32(a)};  // to_f32
  }
}

Scalar apply_f32(const Node& node, float a, float b) {
  switch (node.op) {
    case Op::neg:
      return {0, -a};
    case Op::abs:
      return {0, std::fabs(a)};
    case Op::add:
      return {0, a + b};
    case Op::sub:
      return {0, a - b};
    case Op::mul:
      return {0, a * b};
    case Op::div:
      return {0, a / b};
    case Op::eq:
      return {a == b, 0};
    case Op::ne:
      return {a != b, 0};
    case Op::lt:
      return {a < b, 0};
    case Op::le:
      return {a <= b, 0};
    case Op::gt:
      return {a > b, 0};
    case Op::ge:
      return {a >= b, 0};
    case Op::min:
      return {0, min_f32(a, b)};
    case Op::max:
      return {0, max_f32(a, b)};
    case Op::exp:
      return {0, std::exp(a)};
    case Op::log:
      return {0, std::log(a)};
    case Op::tanh:
      return {0, std::tanh(a)};
    case Op::sigmoid:
      return {0, sigmoid_f32(a)};
    default:
      return {floor_to_int(a), 0};  // floor
  }
}

}  // namespace

Scalar apply(const ProgramIr& ir, const Node& node, const Scalar* args) {
  if (node.op == Op::where) return args[0].i != 0 ? args[1] : args[2];
  if (node.op == Op::to_f32) return {0, to_f32(args[0].i)};
  const Type operand = ir.nodes[node.args[0]].type;
  if (operand == Type::f32) return apply_f32(node, args[0].f, arity(node.op) == 2 ? args[1].f : 0);
  return apply_int(ir, node, args[0].i, arity(node.op) == 2 ? args[1].i : 0);
}

// The scalar evaluation of the whole program; the caller reads the last value.
Scalar evaluate_scalar(const ProgramIr& ir, float s, int64_t b, int64_t h, int64_t q, int64_t kv) {
  std::vector<Scalar> values(ir.nodes.size());
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
