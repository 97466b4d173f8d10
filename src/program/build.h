// The builder between the parser and the IR: every node the parser asks for is type-checked,
// given its implicit int64 → f32 promotions and its deps, and folded when its arguments are
// constants (compile.cc). The parser (parse.cc) knows the grammar and nothing about types; the
// builder knows the types and nothing about the grammar.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "program/ir.h"

namespace maskattn::program {

// "program `<source>`, column <column>: <what>" as a maskattn::Error.
[[noreturn]] void fail(const ProgramIr& ir, int column, const std::string& what);

class Builder {
 public:
  explicit Builder(ProgramIr& ir) : ir_(ir) {}
  int32_t identifier(std::string_view name, int column);
  int32_t int_literal(int64_t value, int column);
  int32_t float_literal(float value, int column);
  int32_t unary(Op op, int32_t operand, int column);
  int32_t binary(Op op, int32_t left, int32_t right, int column);
  int32_t call(std::string_view name, const std::vector<int32_t>& args, int column);
  int32_t index(std::string_view table, const std::vector<int32_t>& indices, int column);
  // The result: checks the program's type (promoting an int64 score), then drops unused nodes.
  void finish(int32_t root);

 private:
  int32_t push(Node node);
  int32_t promote(int32_t node);  // int64 → f32 (a to_f32 node, or a folded constant)
  int32_t fold(int32_t node);     // a node whose arguments are constants becomes a constant
  Type type(int32_t node) const { return ir_.nodes[node].type; }
  ProgramIr& ir_;
};

// Parses ir.source into ir.nodes through a Builder. Throws maskattn::Error.
void parse_program(ProgramIr& ir);

}  // namespace maskattn::program
