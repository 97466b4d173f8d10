// The bad-input catalogue's rows for expression programs (maskattn/program.h; docs/errors.md
// E123–E126, E128), compiled into errors_test so that its catalogue check sees them.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "maskattn/program.h"
#include "test_util.h"

namespace maskattn {
namespace {

std::string message_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(Errors, E123_ProgramSyntaxAndUnknownNames) {
  EXPECT_EQ(message_of([] { Program::mask("(q >= kv"); }),
            "program `(q >= kv`, column 9: syntax error: expected ')', found the end");
  EXPECT_EQ(message_of([] { Program::mask("0 < q < 5"); }),
            "program `0 < q < 5`, column 7: syntax error: comparisons do not chain; write (a < b) "
            "& (b < c), found '<'");
  EXPECT_EQ(
      message_of([] { Program::mask("q >= pos"); }),
      "program `q >= pos`, column 6: unknown identifier 'pos'; the variables are b, h, q, kv; "
      "no tables were given");
  EXPECT_EQ(message_of([] { Program::score("s + bias(h)"); }),
            "program `s + bias(h)`, column 5: unknown function 'bias'; the functions are where, "
            "min, max, abs, exp, log, tanh, sigmoid, floor");
  EXPECT_EQ(message_of([] { Program::mask("min(q) > 0"); }),
            "program `min(q) > 0`, column 1: min takes 2 arguments, got 1");
}

TEST(Errors, E124_ProgramTypeMismatch) {
  EXPECT_EQ(message_of([] { Program::mask("q + (kv > 2) > 0"); }),
            "program `q + (kv > 2) > 0`, column 3: '+' needs two numbers (int64 or f32), got "
            "int64 and bool");
  EXPECT_EQ(message_of([] { Program::mask("q - kv"); }),
            "program `q - kv`, column 3: a mask program must be a bool (a comparison, &, |, ~), "
            "got int64");
  EXPECT_EQ(message_of([] { Program::mask("s > 0"); }),
            "program `s > 0`, column 1: the score s exists only in a score program; a mask "
            "program sees b, h, q, kv");
}

TEST(Errors, E125_ProgramTableDefinition) {
  const std::vector<int64_t> doc(8, 0);
  const ProgramTable table{"doc", doc.data(), ProgramTableType::int64, {8}, {}, {}};
  EXPECT_EQ(message_of([&] {
              Program::mask("q > 0", {table, table});
            }),
            "program table 'doc' is given twice");
  EXPECT_EQ(message_of([&] {
              Program::mask("q > 0",
                            {ProgramTable{"", doc.data(), ProgramTableType::int64, {8}, {}, {}}});
            }),
            "program table '': a table name must be a non-empty identifier (letters, digits, _)");
  EXPECT_EQ(message_of([&] { Program::mask("doc[q, kv] == 0", {table}); }),
            "program `doc[q, kv] == 0`, column 1: table doc[8] takes 1 indices, got 2");
  EXPECT_EQ(message_of([&] { Program::mask("doc[q / 2] == 0", {table}); }),
            "program `doc[q / 2] == 0`, column 1: index 0 of table doc[8] must be int64, got f32 "
            "(floor(x) makes an f32 an int64)");
}

TEST(Errors, E126_ProgramEvaluation) {
  const std::vector<int64_t> doc(8, 0);
  const Program program = Program::mask(
      "doc[q] == doc[kv]", {ProgramTable{"doc", doc.data(), ProgramTableType::int64, {8}, {}, {}}});
  EXPECT_EQ(message_of([&] { program.allows(0, 0, 2, 8); }),
            "program `doc[q] == doc[kv]`, column 11: index [8] is outside table doc of shape [8]");
  uint64_t bits[64];
  EXPECT_EQ(message_of([&] { program.mask_tile(0, 0, 4, 5, 0, 1, bits); }),
            "program `doc[q] == doc[kv]`, column 1: index [8] is outside table doc of shape [8]");
  EXPECT_EQ(message_of([&] { Program::mask("q // (kv - 2) >= 0").allows(0, 0, 5, 2); }),
            "program `q // (kv - 2) >= 0`, column 3: 5 // 0: integer division by zero");
  EXPECT_EQ(message_of([&] { program.mask_tile(0, 0, 0, 65, 0, 1, bits); }),
            "Program::mask_tile: a tile has 1 to 64 queries and keys, got nq=65, nk=1");
  float s[64] = {};
  const Program score = Program::score("s * 2.0");
  EXPECT_EQ(message_of([&] {
              score.score_tile(ProgramTile{0, 0, 0, 8, 0, 4, false, 7}, s);
            }),
            "Program::score_tile: row_stride=7 is shorter than a row of the tile (nq=8 with key "
            "rows); 0 means packed");
  EXPECT_EQ(message_of([&] { score.score_tile_backward(ProgramTile{}, nullptr, s, nullptr); }),
            "Program::score_tile_backward: the scores pointer is null");
}

TEST(Errors, E128_ProgramCheck) {
  std::vector<float> rel(4 * 1024);
  const Program bias =
      Program::score("rel[h, q - kv] * s", {ProgramTable::borrow("rel", rel.data(), {4, 1024})});
  EXPECT_EQ(message_of([&] {
              bias.check({1, 4, 1024, 1024});
            }),
            "program `rel[h, q - kv] * s`, column 1: index 1 of table rel[4,1024] ranges over "
            "[-1023, 1023] on the problem (b < 1, h < 4, q < 1024, kv < 1024); it must stay "
            "inside [0, 1024): clamp it (e.g. min(max(x, 0), 1023)) or size the table");
  EXPECT_EQ(message_of([&] {
              Program::mask("q // (kv - 2) >= 0").check({1, 1, 8, 8});
            }),
            "program `q // (kv - 2) >= 0`, column 3: the divisor of // ranges over [-2, 5] on the "
            "problem (b < 1, h < 1, q < 8, kv < 8), which includes 0: keep it away from 0 (e.g. "
            "max(x, 1))");
  EXPECT_EQ(message_of([&] {
              bias.check({1, -4, 1024, 1024});
            }),
            "program `rel[h, q - kv] * s`: Program::check needs a domain of sizes >= 0, got "
            "batch=1, heads=-4, q_len=1024, k_len=1024");
}

}  // namespace
}  // namespace maskattn
