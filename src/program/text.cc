// The canonical text of a program: the IR printed back with Python's precedence, parenthesised
// only where a looser operator sits under a tighter one (or on the right of a left-associative
// operator of the same level, or under a comparison, which does not chain). Implicit to_f32
// promotions print as their operand (compiling re-inserts them); constants print so that they
// lex back to the same type and value: f32 with 9 significant digits and always a '.' or an
// exponent, negative values in parentheses, ±inf as (±1e39), NaN as (0.0 / 0.0).
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "program/ir.h"

namespace maskattn::program {
namespace {

// Binding strength: comparison 1, | 2, & 3, + - 4, * / // % 5, unary 6, primary 7.
int level(Op op) {
  switch (op) {
    case Op::eq:
    case Op::ne:
    case Op::lt:
    case Op::le:
    case Op::gt:
    case Op::ge:
      return 1;
    case Op::logical_or:
      return 2;
    case Op::logical_and:
      return 3;
    case Op::add:
    case Op::sub:
      return 4;
    case Op::mul:
    case Op::div:
    case Op::floordiv:
    case Op::mod:
      return 5;
    case Op::neg:
    case Op::logical_not:
      return 6;
    default:
      return 7;
  }
}

const char* spelling(Op op) {
  static const char* const kSpellings[] = {"",     "b",   "h",    "q",       "kv",   "s",    "",
                                           "",     "-",   "~",    " + ",     " - ",  " * ",  " / ",
                                           " // ", " % ", " == ", " != ",    " < ",  " <= ", " > ",
                                           " >= ", " & ", " | ",  "where",   "min",  "max",  "abs",
                                           "exp",  "log", "tanh", "sigmoid", "floor"};
  return kSpellings[static_cast<int>(op)];
}

std::string constant_text(const Node& node) {
  if (node.type == Type::boolean) return node.int_value != 0 ? "(0 == 0)" : "(0 != 0)";
  if (node.type == Type::int64) {
    if (node.int_value == std::numeric_limits<int64_t>::min()) return "(-9223372036854775807 - 1)";
    const std::string digits = std::to_string(node.int_value);
    return node.int_value < 0 ? "(" + digits + ")" : digits;
  }
  const float value = node.float_value;
  if (std::isnan(value)) return "(0.0 / 0.0)";
  if (std::isinf(value)) return value > 0 ? "1e39" : "(-1e39)";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.9g", static_cast<double>(value));
  std::string text = buffer;
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return value < 0 || std::signbit(value) ? "(" + text + ")" : text;
}

class Printer {
 public:
  explicit Printer(const ProgramIr& ir) : ir_(ir) {}

  // The text of node n, parenthesised when its level is below `at_least`.
  std::string print(int32_t n, int at_least) const {
    const Node& node = ir_.nodes[n];
    if (node.op == Op::to_f32) return print(node.args[0], at_least);
    std::string text = bare(node);
    return level(node.op) < at_least ? "(" + text + ")" : text;
  }

 private:
  std::string bare(const Node& node) const {
    const int own = level(node.op);
    switch (node.op) {
      case Op::constant:
        return constant_text(node);
      case Op::table:
        return ir_.tables[node.table].name + "[" + list(node, arity_of(node)) + "]";
      case Op::neg:
      case Op::logical_not:
        return spelling(node.op) + print(node.args[0], own);
      default:
        break;
    }
    if (own == 7 && arity(node.op) == 0) return spelling(node.op);
    if (own == 7) return std::string(spelling(node.op)) + "(" + list(node, arity(node.op)) + ")";
    // Binary: left-associative, so the right operand must bind strictly tighter; a comparison's
    // operands must bind tighter than a comparison.
    const int left_level = own == 1 ? 2 : own;
    return print(node.args[0], left_level) + spelling(node.op) + print(node.args[1], own + 1);
  }

  int arity_of(const Node& node) const {
    return static_cast<int>(ir_.tables[node.table].sizes.size());
  }

  std::string list(const Node& node, int count) const {
    std::string text;
    for (int k = 0; k < count; ++k) {
      if (k > 0) text += ", ";
      text += print(node.args[k], 1);
    }
    return text;
  }

  const ProgramIr& ir_;
};

}  // namespace

std::string program_text(const ProgramIr& ir) {
  return Printer(ir).print(static_cast<int32_t>(ir.nodes.size()) - 1, 1);
}

}  // namespace maskattn::program
