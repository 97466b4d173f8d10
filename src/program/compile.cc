// The type rules, promotions, deps and constant folding of the builder (build.h), and the dead-node
// removal at the end. Type rules: arithmetic (+ - * unary -, min, max, abs) takes int64 or f32 and
// promotes a mixed pair to f32; / and exp/log/tanh/sigmoid promote to f32; // and % take int64;
// comparisons take two numbers, == and != also two bools; & | ~ take bools; where takes a bool and
// two bools or two numbers; floor takes a number and gives int64; table indices are int64.
#include <bit>
#include <string>
#include <vector>

#include "maskattn/error.h"
#include "program/build.h"

namespace maskattn::program {
namespace {

constexpr const char* kFunctions = "where, min, max, abs, exp, log, tanh, sigmoid, floor";

struct Function {
  const char* name;
  Op op;
  int args;
};
constexpr Function kFunctionTable[] = {
    {"where", Op::where, 3}, {"min", Op::min, 2},         {"max", Op::max, 2},
    {"abs", Op::abs, 1},     {"exp", Op::exp, 1},         {"log", Op::log, 1},
    {"tanh", Op::tanh, 1},   {"sigmoid", Op::sigmoid, 1}, {"floor", Op::floor, 1}};

const char* op_spelling(Op op) {
  switch (op) {
    case Op::neg:
    case Op::sub:
      return "-";
    case Op::logical_not:
      return "~";
    case Op::add:
      return "+";
    case Op::mul:
      return "*";
    case Op::div:
      return "/";
    case Op::floordiv:
      return "//";
    case Op::mod:
      return "%";
    case Op::eq:
      return "==";
    case Op::ne:
      return "!=";
    case Op::lt:
      return "<";
    case Op::le:
      return "<=";
    case Op::gt:
      return ">";
    case Op::ge:
      return ">=";
    case Op::logical_and:
      return "&";
    case Op::logical_or:
      return "|";
    default:
      return "?";
  }
}

bool numeric(Type type) {
  return type != Type::boolean;
}

std::string table_list(const ProgramIr& ir) {
  if (ir.tables.empty()) return "no tables were given";
  std::string list = "the tables are";
  for (size_t t = 0; t < ir.tables.size(); ++t) {
    list += (t == 0 ? " " : ", ") + ir.tables[t].name + shape_text(ir.tables[t].sizes);
  }
  return list;
}

}  // namespace

void fail(const ProgramIr& ir, int column, const std::string& what) {
  throw Error("program `" + ir.source + "`, column " + std::to_string(column) + ": " + what);
}

// Common subexpressions are shared: a node equal to an earlier one (same operation, type, arguments
// and value; the column aside) is that node, so `q - kv` written twice is computed once by both
// evaluators, and Program::check sees one node where a where's condition and its branch test the
// same expression (program.cc narrows the branch's range by the condition). Sharing cannot change
// a value or an error: nodes are pure, and the first of equal nodes is the one that would raise.
// A linear search: programs are a few dozen nodes.
int32_t Builder::push(Node node) {
  for (size_t n = 0; n < ir_.nodes.size(); ++n) {
    const Node& old = ir_.nodes[n];
    if (old.op == node.op && old.type == node.type && old.table == node.table &&
        old.args[0] == node.args[0] && old.args[1] == node.args[1] && old.args[2] == node.args[2] &&
        old.int_value == node.int_value &&
        std::bit_cast<uint32_t>(old.float_value) == std::bit_cast<uint32_t>(node.float_value)) {
      return static_cast<int32_t>(n);
    }
  }
  ir_.nodes.push_back(node);
  return static_cast<int32_t>(ir_.nodes.size()) - 1;
}

int32_t Builder::identifier(std::string_view name, int column) {
  Node node;
  node.column = column;
  if (name == "b" || name == "h") {
    node.op = name == "b" ? Op::var_b : Op::var_h;
    node.deps = kBatchHead;
  } else if (name == "q" || name == "kv") {
    node.op = name == "q" ? Op::var_q : Op::var_kv;
    node.deps = name == "q" ? kQuery : kKey;
  } else if (name == "s" && ir_.kind == ProgramKind::score) {
    node.op = Op::var_s;
    node.type = Type::f32;
    node.deps = kScore;
  } else if (name == "s") {
    fail(ir_, column,
         "the score s exists only in a score program; a mask program sees b, h, q, kv");
  } else {
    for (const ProgramTable& table : ir_.tables) {
      if (table.name == name) {
        fail(ir_, column,
             "table " + table.name + shape_text(table.sizes) + " must be indexed, as " +
                 table.name + "[...]");
      }
    }
    const char* variables = ir_.kind == ProgramKind::score ? "b, h, q, kv, s" : "b, h, q, kv";
    fail(ir_, column,
         "unknown identifier '" + std::string(name) + "'; the variables are " + variables + "; " +
             table_list(ir_));
  }
  return push(node);
}

int32_t Builder::int_literal(int64_t value, int column) {
  Node node;
  node.int_value = value;
  node.column = column;
  return push(node);
}

int32_t Builder::float_literal(float value, int column) {
  Node node;
  node.type = Type::f32;
  node.float_value = value;
  node.column = column;
  return push(node);
}

int32_t Builder::promote(int32_t index) {
  if (type(index) != Type::int64) return index;
  Node node;
  node.op = Op::to_f32;
  node.type = Type::f32;
  node.deps = ir_.nodes[index].deps;
  node.args[0] = index;
  node.column = ir_.nodes[index].column;
  return fold(push(node));
}

int32_t Builder::fold(int32_t index) {
  const Node node = ir_.nodes[index];
  if (node.op == Op::table) return index;
  const int count = arity(node.op);
  if (node.op == Op::where && ir_.nodes[node.args[0]].op == Op::constant) {
    return ir_.nodes[node.args[0]].int_value != 0 ? node.args[1] : node.args[2];
  }
  Scalar values[3];
  for (int k = 0; k < count; ++k) {
    const Node& arg = ir_.nodes[node.args[k]];
    if (arg.op != Op::constant) return index;
    values[k] = {arg.int_value, arg.float_value};
  }
  if (count == 0) return index;
  const Scalar value = apply(ir_, node, values);
  Node constant;
  constant.type = node.type;
  constant.column = node.column;
  constant.int_value = node.type == Type::f32 ? 0 : value.i;
  constant.float_value = node.type == Type::f32 ? value.f : 0;
  // The folded node and its arguments become unreachable (finish() drops them); an equal constant
  // already present is shared.
  return push(constant);
}

int32_t Builder::unary(Op op, int32_t operand, int column) {
  const Type operand_type = type(operand);
  if (op == Op::logical_not ? operand_type != Type::boolean : !numeric(operand_type)) {
    fail(ir_, column,
         std::string("'") + op_spelling(op) + "' needs " +
             (op == Op::logical_not ? "a bool" : "an int64 or f32") + " operand, got " +
             type_name(operand_type));
  }
  Node node;
  node.op = op;
  node.type = operand_type;
  node.deps = ir_.nodes[operand].deps;
  node.args[0] = operand;
  node.column = column;
  return fold(push(node));
}

int32_t Builder::binary(Op op, int32_t left, int32_t right, int column) {
  const Type a = type(left);
  const Type b = type(right);
  const bool logical = op == Op::logical_and || op == Op::logical_or;
  const bool equality = op == Op::eq || op == Op::ne;
  const bool integral = op == Op::floordiv || op == Op::mod;
  bool ok = numeric(a) && numeric(b);
  if (logical) ok = a == Type::boolean && b == Type::boolean;
  if (equality) ok = ok || (a == Type::boolean && b == Type::boolean);
  if (integral) ok = a == Type::int64 && b == Type::int64;
  if (!ok) {
    const char* wanted = logical    ? "two bools (& and | combine masks)"
                         : integral ? "two int64"
                         : equality ? "two numbers or two bools"
                                    : "two numbers (int64 or f32)";
    fail(ir_, column,
         std::string("'") + op_spelling(op) + "' needs " + wanted + ", got " + type_name(a) +
             " and " + type_name(b));
  }
  Type result = a;
  if (op == Op::div || (numeric(a) && (a == Type::f32 || b == Type::f32))) {
    left = promote(left);
    right = promote(right);
    result = Type::f32;
  }
  const bool comparison = op >= Op::eq && op <= Op::ge;
  Node node;
  node.op = op;
  node.type = comparison ? Type::boolean : result;
  node.deps = ir_.nodes[left].deps | ir_.nodes[right].deps;
  node.args[0] = left;
  node.args[1] = right;
  node.column = column;
  return fold(push(node));
}

int32_t Builder::call(std::string_view name, const std::vector<int32_t>& args, int column) {
  const Function* function = nullptr;
  for (const Function& candidate : kFunctionTable) {
    if (name == candidate.name) function = &candidate;
  }
  if (function == nullptr) {
    fail(ir_, column,
         "unknown function '" + std::string(name) + "'; the functions are " + kFunctions);
  }
  if (static_cast<int>(args.size()) != function->args) {
    fail(ir_, column,
         std::string(function->name) + " takes " + std::to_string(function->args) + " argument" +
             (function->args == 1 ? "" : "s") + ", got " + std::to_string(args.size()));
  }
  std::vector<int32_t> operands = args;
  const size_t first_value = function->op == Op::where ? 1 : 0;
  if (function->op == Op::where && type(args[0]) != Type::boolean) {
    fail(ir_, column,
         std::string("where's condition must be a bool, got ") + type_name(type(args[0])));
  }
  bool all_bool = true;
  bool any_f32 = false;
  for (size_t k = first_value; k < args.size(); ++k) {
    all_bool = all_bool && type(args[k]) == Type::boolean;
    any_f32 = any_f32 || type(args[k]) == Type::f32;
    if (type(args[k]) == Type::boolean && function->op != Op::where) {
      fail(ir_, column, std::string(function->name) + " needs int64 or f32 arguments, got bool");
    }
  }
  if (function->op == Op::where && !all_bool && type(args[1]) != type(args[2]) &&
      (type(args[1]) == Type::boolean || type(args[2]) == Type::boolean)) {
    fail(ir_, column,
         std::string("where needs two bools or two numbers, got ") + type_name(type(args[1])) +
             " and " + type_name(type(args[2])));
  }
  const bool to_float = function->op >= Op::exp && function->op <= Op::sigmoid;
  if (function->op == Op::floor && type(args[0]) == Type::int64) return args[0];
  Node node;
  node.op = function->op;
  node.type = all_bool ? Type::boolean : (any_f32 || to_float) ? Type::f32 : Type::int64;
  if (function->op == Op::floor) node.type = Type::int64;
  for (size_t k = 0; k < operands.size(); ++k) {
    if (k >= first_value && (any_f32 || to_float) && function->op != Op::floor) {
      operands[k] = promote(operands[k]);
    }
    node.args[k] = operands[k];
    node.deps |= ir_.nodes[operands[k]].deps;
  }
  node.column = column;
  return fold(push(node));
}

int32_t Builder::index(std::string_view name, const std::vector<int32_t>& indices, int column) {
  int32_t found = -1;
  for (size_t t = 0; t < ir_.tables.size(); ++t) {
    if (ir_.tables[t].name == name) found = static_cast<int32_t>(t);
  }
  if (found < 0) {
    fail(ir_, column, "unknown table '" + std::string(name) + "'; " + table_list(ir_));
  }
  const ProgramTable& table = ir_.tables[found];
  if (indices.size() != table.sizes.size()) {
    fail(ir_, column,
         "table " + table.name + shape_text(table.sizes) + " takes " +
             std::to_string(table.sizes.size()) + " indices, got " +
             std::to_string(indices.size()));
  }
  Node node;
  node.op = Op::table;
  node.table = found;
  node.column = column;
  node.type = table.type == ProgramTableType::float32   ? Type::f32
              : table.type == ProgramTableType::boolean ? Type::boolean
                                                        : Type::int64;
  for (size_t k = 0; k < indices.size(); ++k) {
    if (type(indices[k]) != Type::int64) {
      fail(ir_, column,
           "index " + std::to_string(k) + " of table " + table.name + shape_text(table.sizes) +
               " must be int64, got " + type_name(type(indices[k])) +
               " (floor(x) makes an f32 an int64)");
    }
    node.args[k] = indices[k];
    node.deps |= ir_.nodes[indices[k]].deps;
  }
  return push(node);
}

void Builder::finish(int32_t root) {
  const bool score = ir_.kind == ProgramKind::score;
  if (score && type(root) == Type::int64) root = promote(root);
  const Type wanted = score ? Type::f32 : Type::boolean;
  if (type(root) != wanted) {
    fail(ir_, ir_.nodes[root].column,
         std::string(score ? "a score program must be a number (f32 or int64)"
                           : "a mask program must be a bool (a comparison, &, |, ~)") +
             ", got " + type_name(type(root)));
  }
  // Keep the nodes the root reaches, in their order, and renumber their arguments.
  std::vector<int32_t> renumbered(ir_.nodes.size(), -1);
  std::vector<bool> reached(ir_.nodes.size(), false);
  reached[root] = true;
  for (int32_t n = root; n >= 0; --n) {
    if (!reached[n]) continue;
    for (int k = 0; k < 3; ++k) {
      if (ir_.nodes[n].args[k] >= 0) reached[ir_.nodes[n].args[k]] = true;
    }
  }
  std::vector<Node> kept;
  for (int32_t n = 0; n <= root; ++n) {
    if (!reached[n]) continue;
    Node node = ir_.nodes[n];
    for (int k = 0; k < 3; ++k) {
      if (node.args[k] >= 0) node.args[k] = renumbered[node.args[k]];
    }
    renumbered[n] = static_cast<int32_t>(kept.size());
    kept.push_back(node);
  }
  ir_.nodes = std::move(kept);
}

}  // namespace maskattn::program
