// Program::check (maskattn/program.h; interval arithmetic in src/program/interval.h): the catalogue
// passes on the domains it fits and is refused one row beyond; the refusal names the index, the
// range and the domain; and, over random programs and domains, a program that passes never fails
// at evaluation (soundness), while an affine index is refused only when some pair really reads out
// of range (exactness).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "maskattn/error.h"
#include "maskattn/program.h"

namespace maskattn {
namespace {

std::string check_message(const Program& program, const ProgramDomain& domain) {
  try {
    program.check(domain);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(ProgramCheck, TheCatalogueFitsItsDomainAndNotOneRowMore) {
  const int64_t heads = 4, length = 64;
  std::vector<float> rel(heads * (2 * length - 1), 0.5f);
  const Program bias = Program::score("s + rel[h, q - kv + 63]",
                                      {ProgramTable::borrow("rel", rel.data(), {heads, 127})});
  EXPECT_NO_THROW(bias.check({1, heads, length, length}));
  EXPECT_NO_THROW(bias.check({3, heads, 10, 64}));
  EXPECT_THROW(bias.check({1, heads, 65, 64}), Error);  // q - kv + 63 reaches 127
  EXPECT_THROW(bias.check({1, heads, 64, 65}), Error);  // reaches -1
  EXPECT_THROW(bias.check({1, heads + 1, 64, 64}), Error);

  std::vector<int64_t> doc(100, 0);
  const Program documents = Program::mask("(doc[q] == doc[kv]) & (q >= kv)",
                                          {ProgramTable::borrow("doc", doc.data(), {100})});
  EXPECT_NO_THROW(documents.check({2, 8, 100, 100}));
  EXPECT_THROW(documents.check({1, 1, 100, 101}), Error);

  // Table values bound the index they feed: bias[h, bucket[q - kv + 7]] needs bucket's values
  // inside bias's second dimension.
  std::vector<int64_t> bucket(15);
  for (int64_t k = 0; k < 15; ++k) bucket[k] = k / 2;
  std::vector<float> table(2 * 8, 1.0f);
  const std::vector<ProgramTable> tables = {ProgramTable::borrow("bucket", bucket.data(), {15}),
                                            ProgramTable::borrow("bias", table.data(), {2, 8})};
  const Program bucketed = Program::score("s + bias[h, bucket[q - kv + 7]]", tables);
  EXPECT_NO_THROW(bucketed.check({1, 2, 8, 8}));
  bucket[3] = 8;
  EXPECT_THROW(bucketed.check({1, 2, 8, 8}), Error);
  bucket[3] = -1;
  EXPECT_THROW(bucketed.check({1, 2, 8, 8}), Error);
}

TEST(ProgramCheck, MessagesNameTheIndexItsRangeAndTheDomain) {
  std::vector<float> rel(4 * 1024);
  const Program program =
      Program::score("rel[h, q - kv] * s", {ProgramTable::borrow("rel", rel.data(), {4, 1024})});
  EXPECT_EQ(check_message(program, {1, 4, 1024, 1024}),
            "program `rel[h, q - kv] * s`, column 1: index 1 of table rel[4,1024] ranges over "
            "[-1023, 1023] on the problem (b < 1, h < 4, q < 1024, kv < 1024); it must stay "
            "inside [0, 1024): clamp it (e.g. min(max(x, 0), 1023)) or size the table");
  const Program clamped = Program::score("rel[h, min(max(q - kv, 0), 1023)] * s",
                                         {ProgramTable::borrow("rel", rel.data(), {4, 1024})});
  EXPECT_NO_THROW(clamped.check({1, 4, 5000, 5000}));
  EXPECT_EQ(check_message(Program::mask("q // (kv - 2) >= 0"), {1, 1, 8, 8}),
            "program `q // (kv - 2) >= 0`, column 3: the divisor of // ranges over [-2, 5] on the "
            "problem (b < 1, h < 1, q < 8, kv < 8), which includes 0: keep it away from 0 (e.g. "
            "max(x, 1))");
  EXPECT_NO_THROW(Program::mask("q // (kv - 2) >= 0").check({1, 1, 8, 2}));
  EXPECT_NO_THROW(Program::mask("q % (kv + 1) >= 0").check({1, 1, 8, 8}));
  EXPECT_THROW(Program::mask("q % (kv - 7) >= 0").check({1, 1, 8, 8}), Error);
}

// A where's branch is ranged on the pairs that take it (the condition narrows the expression it
// shares with the branch), so T5's bucket needs no clamp: the logarithmic branch is only the value
// where abs(q - kv) >= 8. Equal subexpressions are one node (compile.cc), which is what lets the
// condition speak about the branch.
TEST(ProgramCheck, WhereBranchesAreRangedUnderTheirCondition) {
  std::vector<float> t5(3 * 16, 0.0f);
  const std::vector<ProgramTable> tables = {ProgramTable::borrow("t5", t5.data(), {3, 16})};
  const Program program = Program::score(
      "s + t5[h, where(abs(q - kv) < 8, abs(q - kv), "
      "min(8 + floor(log(abs(q - kv) / 8) / log(16) * 8), 15))]",
      tables);
  EXPECT_NO_THROW(program.check({2, 3, 5000, 300}));
  EXPECT_THROW(program.check({2, 4, 5000, 300}), Error);
  std::vector<int64_t> doc(10, 0);
  const std::vector<ProgramTable> docs = {ProgramTable::borrow("doc", doc.data(), {10})};
  const Program guarded =
      Program::mask("doc[where((q - kv >= 0) & (q - kv < 10), q - kv, 0)] == 0", docs);
  EXPECT_NO_THROW(guarded.check({1, 1, 100, 100}));
  const Program unguarded = Program::mask("doc[where(q - kv < 10, q - kv, 0)] == 0", docs);
  EXPECT_THROW(unguarded.check({1, 1, 100, 100}), Error);  // q - kv < 0 is taken too
  // Eager: a read inside a branch happens for every pair, whichever branch is taken.
  const Program eager = Program::mask("where(q < 10, doc[q], 0) == 0", docs);
  EXPECT_THROW(eager.check({1, 1, 11, 1}), Error);
  EXPECT_EQ(Program::mask("(q - kv >= 0) & (q - kv < 256)").node_count(), 8);  // q - kv once
}

TEST(ProgramCheck, EmptyDomainsHaveNothingToCheckAndNegativeOnesAreRefused) {
  std::vector<int64_t> doc(4, 0);
  const Program program =
      Program::mask("doc[q + 100] == doc[kv]", {ProgramTable::borrow("doc", doc.data(), {4})});
  EXPECT_NO_THROW(program.check({1, 1, 0, 10}));
  EXPECT_NO_THROW(program.check({0, 1, 10, 10}));
  EXPECT_THROW(program.check({1, 1, 1, 1}), Error);
  EXPECT_THROW(program.check({1, -1, 1, 1}), Error);
}

TEST(ProgramCheck, WrappingArithmeticGivesTheWholeRange) {
  std::vector<int64_t> doc(8, 0);
  const std::vector<ProgramTable> tables = {ProgramTable::borrow("doc", doc.data(), {8})};
  // q * 2^62 wraps for q ≥ 2 (so q * 2^62 // 2^62 is not q): refused even though q < 8 fits.
  EXPECT_THROW(Program::mask("doc[q * 4611686018427387904 // 4611686018427387904] == 0", tables)
                   .check({1, 1, 4, 4}),
               Error);
  EXPECT_NO_THROW(Program::mask("doc[q * 4611686018427387904 // 4611686018427387904] == 0", tables)
                      .check({1, 1, 2, 2}));
  // abs(INT64_MIN) wraps to INT64_MIN (the whole range), but % 8 is in [0, 8) whatever it is.
  EXPECT_NO_THROW(
      Program::mask("doc[abs(q - 9223372036854775807 - 1) % 8] == 0", tables).check({1, 1, 1, 1}));
  EXPECT_THROW(
      Program::mask("doc[abs(q - 9223372036854775807 - 1) // 8] == 0", tables).check({1, 1, 1, 1}),
      Error);
  // floor of an f32 is bounded by the f32's range.
  EXPECT_NO_THROW(Program::mask("doc[floor(q / 2)] == 0", tables).check({1, 1, 16, 1}));
  EXPECT_THROW(Program::mask("doc[floor(q / 2)] == 0", tables).check({1, 1, 17, 1}), Error);
  EXPECT_NO_THROW(
      Program::mask("doc[floor(sigmoid(q - 1000.5) * 7.9)] == 0", tables).check({1, 1, 5000, 1}));
  EXPECT_THROW(Program::mask("doc[floor(exp(q))] == 0", tables).check({1, 1, 5, 1}), Error);
  // A float32 table's values bound an index through floor (NaN floors to 0).
  std::vector<float> w = {0.5f, 6.9f, 2.0f};
  const Program by_weight =
      Program::mask("doc[floor(w[h])] == 0", {tables[0], ProgramTable::borrow("w", w.data(), {3})});
  EXPECT_NO_THROW(by_weight.check({1, 3, 4, 4}));
  w[1] = 8.0f;
  EXPECT_THROW(by_weight.check({1, 3, 4, 4}), Error);
  w[1] = std::nanf("");
  EXPECT_NO_THROW(by_weight.check({1, 3, 4, 4}));
  w[1] = -0.5f;
  EXPECT_THROW(by_weight.check({1, 3, 4, 4}), Error);
  EXPECT_THROW(Program::mask("doc[floor(log(q - 1))] == 0", tables).check({1, 1, 5, 1}), Error);
}

// ---- random programs ---------------------------------------------------------------------------

// Random int64 expressions over b, h, q, kv, small constants, a table t and floor of f32s.
class Generator {
 public:
  explicit Generator(uint64_t seed) : random_(seed) {}

  std::string int_expression(int depth) {
    const int choice = pick(depth <= 0 ? 5 : 19);
    switch (choice) {
      case 0:
        return "q";
      case 1:
        return "kv";
      case 2:
        return "h";
      case 3:
        return "b";
      case 4:
        return std::to_string(pick(11) - 5);
      case 5:
        return "(" + int_expression(depth - 1) + " + " + int_expression(depth - 1) + ")";
      case 6:
        return "(" + int_expression(depth - 1) + " - " + int_expression(depth - 1) + ")";
      case 7:
        return "(" + int_expression(depth - 1) + " * " + int_expression(depth - 1) + ")";
      case 8:
        return "(" + int_expression(depth - 1) + " // " + int_expression(depth - 1) + ")";
      case 9:
        return "(" + int_expression(depth - 1) + " % " + int_expression(depth - 1) + ")";
      case 10:
        return "abs(" + int_expression(depth - 1) + ")";
      case 11:
        return "min(" + int_expression(depth - 1) + ", " + int_expression(depth - 1) + ")";
      case 12:
        return "max(" + int_expression(depth - 1) + ", " + int_expression(depth - 1) + ")";
      case 13:
        return "(-" + int_expression(depth - 1) + ")";
      case 14:
        return "where(" + int_expression(depth - 1) + " < " + int_expression(depth - 1) + ", " +
               int_expression(depth - 1) + ", " + int_expression(depth - 1) + ")";
      case 15:
        return "t[" + int_expression(depth - 1) + "]";
      case 16:
        return "floor(" + f32_expression(depth - 1) + ")";
      case 17: {  // the where idiom for a guarded index: x where 0 <= x < n, else 0
        const std::string x = int_expression(depth - 1);
        return "where((" + x + " >= 0) & (" + x + " < " + std::to_string(pick(12)) + "), " + x +
               ", 0)";
      }
      default:
        return "min(max(" + int_expression(depth - 1) + ", 0), " + std::to_string(pick(12)) + ")";
    }
  }

  std::string f32_expression(int depth) {
    switch (pick(6)) {
      case 0:
        return int_expression(depth) + " / " + std::to_string(pick(4) + 1) + ".5";
      case 1:
        return "tanh(" + int_expression(depth) + ") * 3.0";
      case 2:
        return "exp(" + int_expression(depth) + ")";
      case 3:
        return "log(" + int_expression(depth) + ")";
      case 4:
        return "sigmoid(" + int_expression(depth) + " * 0.5) * 9.0";
      default:
        return int_expression(depth) + " * 0.75";
    }
  }

  int pick(int n) { return static_cast<int>(random_() % n); }

 private:
  std::mt19937_64 random_;
};

// Whether any pair of the domain raises at evaluation.
bool any_pair_raises(const Program& program, const ProgramDomain& d) {
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) {
      for (int64_t q = 0; q < d.q_len; ++q) {
        for (int64_t kv = 0; kv < d.k_len; ++kv) {
          try {
            program.allows(b, h, q, kv);
          } catch (const Error&) {
            return true;
          }
        }
      }
    }
  }
  return false;
}

TEST(ProgramCheck, RandomProgramsThatPassNeverRaise) {
  Generator generator(2024);
  int passed = 0, refused = 0;
  for (int round = 0; round < 3000; ++round) {
    std::vector<int64_t> t(1 + generator.pick(12));
    for (int64_t& x : t) x = generator.pick(15) - 3;
    const ProgramDomain domain{1 + generator.pick(2), 1 + generator.pick(3), generator.pick(9),
                               generator.pick(9)};
    const std::string text = generator.int_expression(1 + generator.pick(4)) + " >= 0";
    SCOPED_TRACE(text);
    const ProgramTable table =
        ProgramTable::borrow("t", t.data(), {static_cast<int64_t>(t.size())});
    try {
      const Program program = Program::mask(text, {table});
      try {
        program.check(domain);
      } catch (const Error&) {
        ++refused;
        continue;
      }
      ++passed;
      ASSERT_FALSE(any_pair_raises(program, domain)) << "check passed on a program that raises";
      uint64_t bits[64];  // nor does the tile evaluator (the domain is one tile)
      for (int64_t b = 0; b < domain.batch; ++b) {
        for (int64_t h = 0; h < domain.heads && domain.q_len > 0 && domain.k_len > 0; ++h) {
          ASSERT_NO_THROW(program.mask_tile(b, h, 0, domain.q_len, 0, domain.k_len, bits));
        }
      }
    } catch (const Error&) {
      continue;  // a constant division by zero, folded at compile
    }
  }
  EXPECT_GT(passed, 500);
  EXPECT_GT(refused, 500);
}

TEST(ProgramCheck, AffineIndicesAreRefusedExactlyWhenSomePairReadsOutside) {
  std::mt19937_64 random(77);
  const auto pick = [&](int n) { return static_cast<int64_t>(random() % n); };
  int refused = 0;
  for (int round = 0; round < 2000; ++round) {
    std::vector<int64_t> t(1 + pick(30), 0);
    const ProgramDomain domain{1 + pick(2), 1 + pick(3), pick(10), pick(10)};
    const std::string index = std::to_string(pick(5) - 2) + " * q + " +
                              std::to_string(pick(5) - 2) + " * kv + " +
                              std::to_string(pick(3) - 1) + " * h + " +
                              std::to_string(pick(5) - 2) + " * b + " + std::to_string(pick(21));
    const Program program =
        Program::mask("t[" + index + "] == 0",
                      {ProgramTable::borrow("t", t.data(), {static_cast<int64_t>(t.size())})});
    bool passes = true;
    try {
      program.check(domain);
    } catch (const Error&) {
      passes = false;
      ++refused;
    }
    ASSERT_EQ(passes, !any_pair_raises(program, domain))
        << "t[" << index << "] of size " << t.size() << " on (" << domain.batch << ", "
        << domain.heads << ", " << domain.q_len << ", " << domain.k_len << ")";
  }
  EXPECT_GT(refused, 200);
}

}  // namespace
}  // namespace maskattn
