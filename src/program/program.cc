// maskattn::Program: compiling (table validation, then parse.cc through the builder of
// compile.cc) and the public entry points, which check their arguments and hand the shared
// immutable IR to an evaluator. A Program is a shared_ptr to const IR: copies are cheap and
// evaluation is thread-safe (the tile evaluator's workspace is thread-local).
#include <string>
#include <utility>
#include <vector>

#include "maskattn/error.h"
#include "maskattn/program.h"
#include "program/build.h"

namespace maskattn {
namespace {

bool is_reserved(const std::string& name) {
  static const char* const kReserved[] = {"b",   "h",   "q",   "kv",  "s",    "where",   "min",
                                          "max", "abs", "exp", "log", "tanh", "sigmoid", "floor"};
  for (const char* reserved : kReserved) {
    if (name == reserved) return true;
  }
  return false;
}

bool is_identifier(const std::string& name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  for (const char c : name) {
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!letter && !(c >= '0' && c <= '9')) return false;
  }
  return true;
}

void validate_table(ProgramTable& table, const std::vector<ProgramTable>& earlier) {
  const std::string what = "program table '" + table.name + "'";
  if (!is_identifier(table.name)) {
    throw Error(what + ": a table name must be a non-empty identifier (letters, digits, _)");
  }
  if (is_reserved(table.name)) {
    throw Error(what + ": the name is a variable or a function of the language");
  }
  for (const ProgramTable& other : earlier) {
    if (other.name == table.name) throw Error(what + " is given twice");
  }
  const std::string shape = program::shape_text(table.sizes);
  if (table.sizes.empty() || table.sizes.size() > 3) {
    throw Error(what + " of shape " + shape + " must have 1 to 3 dimensions");
  }
  if (table.strides.empty()) {
    table.strides.assign(table.sizes.size(), 1);
    for (size_t k = table.sizes.size() - 1; k > 0; --k) {
      table.strides[k - 1] = table.strides[k] * table.sizes[k];
    }
  }
  if (table.strides.size() != table.sizes.size()) {
    throw Error(what + " of shape " + shape + " has " + std::to_string(table.strides.size()) +
                " strides");
  }
  int64_t elements = 1;
  for (const int64_t size : table.sizes) {
    if (size < 0) throw Error(what + " of shape " + shape + " has a negative size");
    elements *= size;
  }
  if (elements > 0 && table.data == nullptr) {
    throw Error(what + " of shape " + shape + " has a null data pointer");
  }
}

std::shared_ptr<const program::ProgramIr> compile(ProgramKind kind, std::string_view text,
                                                  std::vector<ProgramTable> tables) {
  auto ir = std::make_shared<program::ProgramIr>();
  ir->kind = kind;
  ir->source = std::string(text);
  for (size_t t = 0; t < tables.size(); ++t) {
    validate_table(tables[t], std::vector<ProgramTable>(tables.begin(), tables.begin() + t));
  }
  ir->tables = std::move(tables);
  program::parse_program(*ir);
  return ir;
}

void check_tile(const char* what, int64_t nq, int64_t nk, const void* out) {
  if (nq < 1 || nq > 64 || nk < 1 || nk > 64) {
    throw Error(std::string(what) + ": a tile has 1 to 64 queries and keys, got nq=" +
                std::to_string(nq) + ", nk=" + std::to_string(nk));
  }
  if (out == nullptr) throw Error(std::string(what) + ": the output pointer is null");
}

}  // namespace

Program::Program(std::shared_ptr<const program::ProgramIr> ir) : ir_(std::move(ir)) {}

Program Program::mask(std::string_view text, std::vector<ProgramTable> tables) {
  return Program(compile(ProgramKind::mask, text, std::move(tables)));
}

Program Program::score(std::string_view text, std::vector<ProgramTable> tables) {
  return Program(compile(ProgramKind::score, text, std::move(tables)));
}

ProgramKind Program::kind() const {
  return ir_->kind;
}
std::string Program::text() const {
  return program::program_text(*ir_);
}
int64_t Program::node_count() const {
  return static_cast<int64_t>(ir_->nodes.size());
}

const std::vector<ProgramTable>& Program::tables() const {
  return ir_->tables;
}

// Unreachable nodes are removed at compile (ir.h), so a variable node present is one used.
namespace {
bool uses(const program::ProgramIr& ir, program::Op op) {
  for (const program::Node& node : ir.nodes) {
    if (node.op == op) return true;
  }
  return false;
}
}  // namespace

bool Program::depends_on_batch() const {
  return uses(*ir_, program::Op::var_b);
}
bool Program::depends_on_head() const {
  return uses(*ir_, program::Op::var_h);
}
bool Program::depends_on_score() const {
  return uses(*ir_, program::Op::var_s);
}

bool Program::allows(int64_t b, int64_t h, int64_t q, int64_t kv) const {
  if (ir_->kind != ProgramKind::mask) throw Error("Program::allows needs a mask program");
  return program::evaluate_scalar(*ir_, 0.0f, b, h, q, kv).i != 0;
}

float Program::score(float s, int64_t b, int64_t h, int64_t q, int64_t kv) const {
  if (ir_->kind != ProgramKind::score) throw Error("Program::score needs a score program");
  return program::evaluate_scalar(*ir_, s, b, h, q, kv).f;
}

void Program::mask_tile(int64_t b, int64_t h, int64_t q0, int64_t nq, int64_t kv0, int64_t nk,
                        uint64_t* bits) const {
  if (ir_->kind != ProgramKind::mask) throw Error("Program::mask_tile needs a mask program");
  check_tile("Program::mask_tile", nq, nk, bits);
  program::evaluate_tile(*ir_, {b, h, q0, nq, kv0, nk}, bits, nullptr);
}

void Program::score_tile(int64_t b, int64_t h, int64_t q0, int64_t nq, int64_t kv0, int64_t nk,
                         float* s) const {
  if (ir_->kind != ProgramKind::score) throw Error("Program::score_tile needs a score program");
  check_tile("Program::score_tile", nq, nk, s);
  program::evaluate_tile(*ir_, {b, h, q0, nq, kv0, nk}, nullptr, s);
}

}  // namespace maskattn
