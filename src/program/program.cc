// maskattn::Program: compiling (table validation, then parse.cc through the builder of
// compile.cc), the domain check (interval arithmetic over the IR, interval.h), and the public
// entry points, which check their arguments and hand the shared immutable IR to an evaluator. A
// Program is a shared_ptr to const IR: copies are cheap and evaluation is thread-safe (the tile
// evaluator's workspace is thread-local).
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "maskattn/error.h"
#include "maskattn/program.h"
#include "program/build.h"
#include "program/interval.h"
#include "program/ops.h"

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

void check_layout(const char* what, const ProgramTile& tile, const void* out) {
  check_tile(what, tile.nq, tile.nk, out);
  const int64_t row = tile.query_rows ? tile.nk : tile.nq;
  if (tile.row_stride != 0 && tile.row_stride < row) {
    throw Error(std::string(what) + ": row_stride=" + std::to_string(tile.row_stride) +
                " is shorter than a row of the tile (" + (tile.query_rows ? "nk=" : "nq=") +
                std::to_string(row) + (tile.query_rows ? " with query rows" : " with key rows") +
                "); 0 means packed");
  }
}

}  // namespace

// ---- Program::check: the ranges of every node over the domain --------------------------------
//
// One pass over the nodes in order (arguments first), an IntRange for bool and int64 nodes and an
// F32Range for f32 ones (interval.h), then every table index and every // or % divisor is held
// against what the evaluators accept. The ranges describe the whole domain, both sides of every
// where included: evaluation is eager, so a hidden pair or an untaken branch still reads.
namespace program {
namespace {

struct Ranges {
  std::vector<IntRange> ints;
  std::vector<F32Range> floats;
  bool f32_matters = false;  // only through floor can an f32 reach an index or a divisor
};

// Calls visit(offset) for every element of a table (strides as given).
template <class Visit>
void for_each_element(const ProgramTable& table, Visit visit) {
  int64_t sizes[3] = {1, 1, 1};
  for (size_t k = 0; k < table.sizes.size(); ++k) sizes[k] = table.sizes[k];
  for (int64_t i0 = 0; i0 < sizes[0]; ++i0) {
    for (int64_t i1 = 0; i1 < sizes[1]; ++i1) {
      for (int64_t i2 = 0; i2 < sizes[2]; ++i2) {
        const int64_t index[3] = {i0, i1, i2};
        visit(table_offset(table, index));
      }
    }
  }
}

// A table read's values: the smallest and largest element (scanned now: the memory is borrowed).
void table_range(const ProgramTable& table, const Node& node, Ranges& ranges, size_t n) {
  if (node.type == Type::f32 && !ranges.f32_matters) {
    ranges.floats[n] = whole_f32();  // a large bias table is not scanned for nothing
    return;
  }
  if (node.type == Type::f32) {
    F32Range r{kInf, -kInf, false};
    for_each_element(table, [&](int64_t offset) {
      const float x = table_f32(table, offset);
      r.nan = r.nan || std::isnan(x);
      if (!std::isnan(x)) r = {std::min(r.lo, x), std::max(r.hi, x), r.nan};
    });
    ranges.floats[n] = r.lo <= r.hi ? r : F32Range{0, 0, r.nan};
    return;
  }
  IntRange r{kInt64Max, kInt64Min};
  for_each_element(table, [&](int64_t offset) {
    const int64_t x = table_int(table, offset);
    r = {std::min(r.lo, x), std::max(r.hi, x)};
  });
  ranges.ints[n] = r.lo <= r.hi ? r : IntRange{0, 0};  // an empty table is never read
}

std::string range_text(const IntRange& r) {
  std::string text = "[";  // appended, not "[" + ...: GCC 12 warns falsely (-Wrestrict) on that
  text += std::to_string(r.lo) + ", " + std::to_string(r.hi) + "]";
  return text;
}

std::string domain_text(const ProgramDomain& d) {
  return "on the problem (b < " + std::to_string(d.batch) + ", h < " + std::to_string(d.heads) +
         ", q < " + std::to_string(d.q_len) + ", kv < " + std::to_string(d.k_len) + ")";
}

void check_index(const ProgramIr& ir, const Node& node, const Ranges& ranges,
                 const ProgramDomain& domain) {
  const ProgramTable& table = ir.tables[node.table];
  for (size_t k = 0; k < table.sizes.size(); ++k) {
    const IntRange& r = ranges.ints[node.args[k]];
    const int64_t size = table.sizes[k];
    if (r.lo >= 0 && r.hi < size) continue;
    const std::string bound = std::to_string(size);
    const std::string advice =
        size == 0
            ? "dimension " + std::to_string(k) + " of the table is empty"
            : "clamp it (e.g. min(max(x, 0), " + std::to_string(size - 1) + ")) or size the table";
    fail(ir, node.column,
         "index " + std::to_string(k) + " of table " + table.name + shape_text(table.sizes) +
             " ranges over " + range_text(r) + " " + domain_text(domain) +
             "; it must stay inside [0, " + bound + "): " + advice);
  }
}

void check_divisor(const ProgramIr& ir, const Node& node, const Ranges& ranges,
                   const ProgramDomain& domain) {
  const IntRange& r = ranges.ints[node.args[1]];
  if (!contains(r, 0)) return;
  fail(ir, node.column,
       std::string("the divisor of ") + (node.op == Op::mod ? "%" : "//") + " ranges over " +
           range_text(r) + " " + domain_text(domain) +
           ", which includes 0: keep it away from 0 (e.g. max(x, 1))");
}

// The range of an int64 or bool node whose operands are int64 or bool.
IntRange int_range(const Node& node, const IntRange& a, const IntRange& b) {
  switch (node.op) {
    case Op::neg:
      return neg_range(a);
    case Op::abs:
      return abs_range(a);
    case Op::add:
      return add_range(a, b);
    case Op::sub:
      return sub_range(a, b);
    case Op::mul:
      return mul_range(a, b);
    case Op::floordiv:
      return floordiv_range(a, b);
    case Op::mod:
      return mod_range(a, b);
    case Op::min:
      return {std::min(a.lo, b.lo), std::min(a.hi, b.hi)};
    case Op::max:
      return {std::max(a.lo, b.lo), std::max(a.hi, b.hi)};
    default:  // comparisons and logic
      return {0, 1};
  }
}

// The range of an f32 node whose operands are f32.
F32Range f32_range(const Node& node, const F32Range& a, const F32Range& b) {
  switch (node.op) {
    case Op::neg:
      return f32_neg_range(a);
    case Op::abs:
      return f32_abs_range(a);
    case Op::exp:
      return f32_monotone(
          a, [](float x) { return math_f32(Op::exp, x); }, 0, kInf);
    case Op::log:
      return f32_log_range(a);
    case Op::tanh:
      return f32_monotone(
          a, [](float x) { return math_f32(Op::tanh, x); }, -1, 1);
    case Op::sigmoid:
      return f32_monotone(
          a, [](float x) { return math_f32(Op::sigmoid, x); }, 0, 1);
    case Op::add:
      return f32_add_range(a, b);
    case Op::sub:
      return f32_sub_range(a, b);
    case Op::mul:
      return f32_mul_range(a, b);
    case Op::div:
      return f32_div_range(a, b);
    case Op::min:
      return f32_min_range(a, b);
    default:  // max
      return f32_max_range(a, b);
  }
}

void node_range(const ProgramIr& ir, size_t n, const ProgramDomain& d, Ranges& ranges);

// Narrows `ranges` by the assumption that bool node `cond` is `truth`: a comparison of int64s
// bounds each side by the other (q - kv < 8 true: q - kv ≤ 7), ~ flips, & true and | false hold
// both sides. Marks the narrowed nodes; false when the assumption can hold nowhere (the branch is
// never taken).
bool assume(const ProgramIr& ir, int32_t cond, bool truth, Ranges& ranges,
            std::vector<bool>& narrowed) {
  const Node& node = ir.nodes[cond];
  if (node.op == Op::logical_not) return assume(ir, node.args[0], !truth, ranges, narrowed);
  if ((node.op == Op::logical_and && truth) || (node.op == Op::logical_or && !truth)) {
    return assume(ir, node.args[0], truth, ranges, narrowed) &&
           assume(ir, node.args[1], truth, ranges, narrowed);
  }
  if (!is_comparison(node.op) || ir.nodes[node.args[0]].type != Type::int64) return true;
  static constexpr Op kNegation[] = {Op::ne, Op::eq, Op::ge, Op::gt, Op::le, Op::lt};
  const Op op = truth ? node.op : kNegation[static_cast<int>(node.op) - static_cast<int>(Op::eq)];
  IntRange& a = ranges.ints[node.args[0]];
  IntRange& b = ranges.ints[node.args[1]];
  const IntRange a0 = a, b0 = b;
  // a < b ⟺ a ≤ b - 1, computed without overflow: a.hi ≤ b.hi - 1 and b.lo ≥ a.lo + 1.
  const auto below = [](int64_t x, int64_t step) { return x == kInt64Min ? x : x - step; };
  const auto above = [](int64_t x, int64_t step) { return x == kInt64Max ? x : x + step; };
  if (op == Op::lt || op == Op::le || op == Op::eq) {
    const int64_t step = op == Op::lt ? 1 : 0;
    if (op == Op::lt && (b0.hi == kInt64Min || a0.lo == kInt64Max)) return false;
    a.hi = std::min(a0.hi, below(b0.hi, step));
    b.lo = std::max(b0.lo, above(a0.lo, step));
  }
  if (op == Op::gt || op == Op::ge || op == Op::eq) {
    const int64_t step = op == Op::gt ? 1 : 0;
    if (op == Op::gt && (a0.hi == kInt64Min || b0.lo == kInt64Max)) return false;
    a.lo = std::max(a.lo, above(b0.lo, step));
    b.hi = std::min(b.hi, below(a0.hi, step));
  }
  narrowed[node.args[0]] = narrowed[node.args[1]] = true;
  return a.lo <= a.hi && b.lo <= b.hi;
}

// The range of where's branch `branch` (1 or 2) on the pairs that take it: the nodes after the
// narrowed ones are ranged again from the narrowed ranges (those that do not depend on them keep
// theirs; a table keeps its values). False when the branch is never taken.
bool branch_range(const ProgramIr& ir, size_t n, int branch, const ProgramDomain& d,
                  const Ranges& ranges, IntRange& out, F32Range& fout) {
  const Node& node = ir.nodes[n];
  Ranges taken = ranges;
  std::vector<bool> touched(ir.nodes.size(), false);
  if (!assume(ir, node.args[0], branch == 1, taken, touched)) return false;
  const std::vector<bool> narrowed = touched;
  const int32_t last = node.args[branch];
  for (int32_t m = 0; m <= last; ++m) {
    const Node& inner = ir.nodes[m];
    bool depends = false;
    for (int k = 0; k < 3; ++k) depends = depends || (inner.args[k] >= 0 && touched[inner.args[k]]);
    if (!depends || narrowed[m]) continue;
    touched[m] = true;
    if (inner.op != Op::table) node_range(ir, m, d, taken);
  }
  out = taken.ints[last];
  fout = taken.floats[last];
  return true;
}

// where(c, x, y): the hull of x's range where c holds and y's range where it does not. Both sides
// are evaluated everywhere (eager), but only the taken one is the value.
void where_range(const ProgramIr& ir, size_t n, const ProgramDomain& d, Ranges& ranges) {
  const Node& node = ir.nodes[n];
  IntRange x = ranges.ints[node.args[1]], y = ranges.ints[node.args[2]];
  F32Range fx = ranges.floats[node.args[1]], fy = ranges.floats[node.args[2]];
  const bool x_taken = branch_range(ir, n, 1, d, ranges, x, fx);
  const bool y_taken = branch_range(ir, n, 2, d, ranges, y, fy);
  ranges.ints[n] = !y_taken ? x : !x_taken ? y : hull(x, y);
  ranges.floats[n] = !y_taken ? fx : !x_taken ? fy : hull(fx, fy);
}

// The range of node n from its arguments' ranges.
void node_range(const ProgramIr& ir, size_t n, const ProgramDomain& d, Ranges& ranges) {
  const Node& node = ir.nodes[n];
  const auto in = [&](int k) { return ranges.ints[node.args[k]]; };
  const auto fl = [&](int k) { return ranges.floats[node.args[k]]; };
  IntRange& out = ranges.ints[n];
  F32Range& fout = ranges.floats[n];
  switch (node.op) {
    case Op::constant:
      out = {node.int_value, node.int_value};
      fout = std::isnan(node.float_value) ? whole_f32()
                                          : F32Range{node.float_value, node.float_value, false};
      return;
    case Op::var_b:
      out = {0, d.batch - 1};
      return;
    case Op::var_h:
      out = {0, d.heads - 1};
      return;
    case Op::var_q:
      out = {0, d.q_len - 1};
      return;
    case Op::var_kv:
      out = {0, d.k_len - 1};
      return;
    case Op::var_s:
      fout = whole_f32();
      return;
    case Op::table:
      return table_range(ir.tables[node.table], node, ranges, n);
    case Op::to_f32:
      fout = {f32_of_int(in(0).lo), f32_of_int(in(0).hi), false};
      return;
    case Op::floor:
      out = floor_range(fl(0));
      return;
    case Op::where:
      return where_range(ir, n, d, ranges);
    default:
      break;
  }
  const bool f32_operands = ir.nodes[node.args[0]].type == Type::f32;
  if (f32_operands && node.type == Type::f32) {
    fout = f32_range(node, fl(0), arity(node.op) == 2 ? fl(1) : F32Range{});
  } else if (f32_operands) {
    out = {0, 1};  // a comparison
  } else {
    out = int_range(node, in(0), arity(node.op) == 2 ? in(1) : IntRange{});
  }
}

}  // namespace

void check_program(const ProgramIr& ir, const ProgramDomain& domain) {
  if (domain.batch < 0 || domain.heads < 0 || domain.q_len < 0 || domain.k_len < 0) {
    throw Error(
        "program `" + ir.source + "`: Program::check needs a domain of sizes >= 0, got " +
        "batch=" + std::to_string(domain.batch) + ", heads=" + std::to_string(domain.heads) +
        ", q_len=" + std::to_string(domain.q_len) + ", k_len=" + std::to_string(domain.k_len));
  }
  if (domain.batch == 0 || domain.heads == 0 || domain.q_len == 0 || domain.k_len == 0) return;
  Ranges ranges{std::vector<IntRange>(ir.nodes.size()), std::vector<F32Range>(ir.nodes.size())};
  for (const Node& node : ir.nodes) ranges.f32_matters = ranges.f32_matters || node.op == Op::floor;
  for (size_t n = 0; n < ir.nodes.size(); ++n) {
    const Node& node = ir.nodes[n];
    if (node.op == Op::table) check_index(ir, node, ranges, domain);
    if (node.op == Op::floordiv || node.op == Op::mod) check_divisor(ir, node, ranges, domain);
    node_range(ir, n, domain, ranges);
  }
}

}  // namespace program

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

void Program::check(const ProgramDomain& domain) const {
  program::check_program(*ir_, domain);
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
  program::evaluate_tile(*ir_, ProgramTile{b, h, q0, nq, kv0, nk}, bits, nullptr);
}

void Program::score_tile(int64_t b, int64_t h, int64_t q0, int64_t nq, int64_t kv0, int64_t nk,
                         float* s) const {
  if (ir_->kind != ProgramKind::score) throw Error("Program::score_tile needs a score program");
  check_tile("Program::score_tile", nq, nk, s);
  program::evaluate_tile(*ir_, ProgramTile{b, h, q0, nq, kv0, nk}, nullptr, s);
}

void Program::score_tile(const ProgramTile& tile, float* s) const {
  if (ir_->kind != ProgramKind::score) throw Error("Program::score_tile needs a score program");
  check_layout("Program::score_tile", tile, s);
  program::evaluate_tile(*ir_, tile, nullptr, s);
}

void Program::score_tile_backward(const ProgramTile& tile, const float* s, float* ds,
                                  double* const* table_grads) const {
  const char* what = "Program::score_tile_backward";
  if (ir_->kind != ProgramKind::score) throw Error(std::string(what) + " needs a score program");
  check_layout(what, tile, ds);
  if (s == nullptr) throw Error(std::string(what) + ": the scores pointer is null");
  program::evaluate_tile_backward(*ir_, tile, s, ds, table_grads);
}

}  // namespace maskattn
