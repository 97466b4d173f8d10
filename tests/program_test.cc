// The expression program core (maskattn/program.h, src/program/): parsing and precedence through
// the canonical text, folding, every compile error, and attention-gym's catalogue of masks and
// score modifiers written as programs, checked pair by pair against independently written C++
// lambdas with both evaluators (scalar and tile), over random shapes with partial edge tiles.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "maskattn/error.h"
#include "maskattn/program.h"

namespace maskattn {
namespace {

using MaskFn = std::function<bool(int64_t, int64_t, int64_t, int64_t)>;
using ScoreFn = std::function<float(float, int64_t, int64_t, int64_t, int64_t)>;

struct Shape {
  int64_t batch, heads, queries, keys, tile_q, tile_k;
};

// Random problem shapes: lengths that are not multiples of the tile sizes, tile sizes 1..64.
std::vector<Shape> random_shapes(uint64_t seed, int64_t max_length = 150) {
  std::mt19937_64 random(seed);
  std::vector<Shape> shapes = {{1, 1, 64, 64, 64, 64}, {2, 3, 1, 1, 1, 1}};
  for (int k = 0; k < 4; ++k) {
    shapes.push_back(
        {1 + static_cast<int64_t>(random() % 2), 1 + static_cast<int64_t>(random() % 3),
         1 + static_cast<int64_t>(random() % max_length),
         1 + static_cast<int64_t>(random() % max_length), 1 + static_cast<int64_t>(random() % 64),
         1 + static_cast<int64_t>(random() % 64)});
  }
  return shapes;
}

uint32_t bits_of(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

void expect_mask(const Program& program, const MaskFn& want, const std::vector<Shape>& shapes) {
  for (const Shape& shape : shapes) {
    SCOPED_TRACE(program.text() + " queries=" + std::to_string(shape.queries) +
                 " keys=" + std::to_string(shape.keys) + " tile " + std::to_string(shape.tile_q) +
                 "x" + std::to_string(shape.tile_k));
    for (int64_t b = 0; b < shape.batch; ++b) {
      for (int64_t h = 0; h < shape.heads; ++h) {
        for (int64_t q0 = 0; q0 < shape.queries; q0 += shape.tile_q) {
          for (int64_t kv0 = 0; kv0 < shape.keys; kv0 += shape.tile_k) {
            const int64_t nq = std::min(shape.tile_q, shape.queries - q0);
            const int64_t nk = std::min(shape.tile_k, shape.keys - kv0);
            uint64_t bits[64];
            program.mask_tile(b, h, q0, nq, kv0, nk, bits);
            for (int64_t j = 0; j < nk; ++j) {
              ASSERT_EQ(bits[j] >> 1 >> (nq - 1), 0u) << "bits beyond the tile's queries";
              for (int64_t i = 0; i < nq; ++i) {
                const bool expected = want(b, h, q0 + i, kv0 + j);
                ASSERT_EQ(program.allows(b, h, q0 + i, kv0 + j), expected)
                    << "scalar at b=" << b << " h=" << h << " q=" << q0 + i << " kv=" << kv0 + j;
                ASSERT_EQ(((bits[j] >> i) & 1) != 0, expected)
                    << "tile at b=" << b << " h=" << h << " q=" << q0 + i << " kv=" << kv0 + j;
              }
            }
          }
        }
      }
    }
  }
}

// The score of a pair before the modifier: a fixed function of the position, of both signs.
float raw_score(int64_t b, int64_t h, int64_t q, int64_t kv) {
  return static_cast<float>(static_cast<int64_t>((b * 7 + h * 13 + q * 31 + kv * 17) % 201) - 100) *
         0.37f;
}

// ulps: how far from the lambda the program may be (exp, log, tanh and sigmoid are Highway's vector
// math, within a few ulps of the C library's); tile and scalar always agree bit for bit.
void expect_score(const Program& program, const ScoreFn& want, const std::vector<Shape>& shapes,
                  int64_t ulps = 0) {
  for (const Shape& shape : shapes) {
    SCOPED_TRACE(program.text() + " queries=" + std::to_string(shape.queries) +
                 " keys=" + std::to_string(shape.keys));
    for (int64_t b = 0; b < shape.batch; ++b) {
      for (int64_t h = 0; h < shape.heads; ++h) {
        for (int64_t q0 = 0; q0 < shape.queries; q0 += shape.tile_q) {
          for (int64_t kv0 = 0; kv0 < shape.keys; kv0 += shape.tile_k) {
            const int64_t nq = std::min(shape.tile_q, shape.queries - q0);
            const int64_t nk = std::min(shape.tile_k, shape.keys - kv0);
            std::vector<float> s(nq * nk);
            for (int64_t j = 0; j < nk; ++j) {
              for (int64_t i = 0; i < nq; ++i) s[j * nq + i] = raw_score(b, h, q0 + i, kv0 + j);
            }
            program.score_tile(b, h, q0, nq, kv0, nk, s.data());
            for (int64_t j = 0; j < nk; ++j) {
              for (int64_t i = 0; i < nq; ++i) {
                const float raw = raw_score(b, h, q0 + i, kv0 + j);
                const float scalar = program.score(raw, b, h, q0 + i, kv0 + j);
                const float expected = want(raw, b, h, q0 + i, kv0 + j);
                ASSERT_EQ(bits_of(s[j * nq + i]), bits_of(scalar))
                    << "tile vs scalar at q=" << q0 + i << " kv=" << kv0 + j;
                const int64_t apart =
                    static_cast<int64_t>(bits_of(scalar)) - static_cast<int64_t>(bits_of(expected));
                ASSERT_LE(std::llabs(apart), ulps)
                    << "scalar " << scalar << " vs lambda " << expected << " at q=" << q0 + i
                    << " kv=" << kv0 + j;
              }
            }
          }
        }
      }
    }
  }
}

ProgramTable table(std::string name, const void* data, ProgramTableType type,
                   std::vector<int64_t> sizes, std::vector<int64_t> strides = {}) {
  return ProgramTable{std::move(name), data, type, std::move(sizes), std::move(strides), {}};
}

// Every test of the catalogue: the program's canonical text compiles back to the same text.
void expect_round_trip(const Program& program, const std::vector<ProgramTable>& tables) {
  const Program again = program.kind() == ProgramKind::mask
                            ? Program::mask(program.text(), tables)
                            : Program::score(program.text(), tables);
  EXPECT_EQ(again.text(), program.text());
  EXPECT_EQ(again.node_count(), program.node_count());
}

TEST(ProgramCatalogue, Causal) {
  const Program program = Program::mask("q >= kv");
  expect_mask(
      program, [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv; }, random_shapes(1));
  expect_round_trip(program, {});
}

TEST(ProgramCatalogue, SlidingWindow) {
  const Program program = Program::mask("(q - kv >= 0) & (q - kv < 16)");
  expect_mask(
      program, [](int64_t, int64_t, int64_t q, int64_t kv) { return q - kv >= 0 && q - kv < 16; },
      random_shapes(2));
  expect_round_trip(program, {});
}

TEST(ProgramCatalogue, PrefixLmWithAPrefixLengthPerBatch) {
  const std::vector<int64_t> prefix = {3, 40};
  const std::vector<ProgramTable> tables = {
      table("prefix", prefix.data(), ProgramTableType::int64, {2})};
  const Program program = Program::mask("(kv < prefix[b]) | (q >= kv)", tables);
  expect_mask(
      program, [&](int64_t b, int64_t, int64_t q, int64_t kv) { return kv < prefix[b] || q >= kv; },
      random_shapes(3));
  expect_round_trip(program, tables);
}

TEST(ProgramCatalogue, PackedDocuments) {
  const int64_t length = 150;
  std::vector<int32_t> doc(length);
  for (int64_t i = 0; i < length; ++i) doc[i] = static_cast<int32_t>(i < 20 ? 0 : i < 97 ? 1 : 2);
  const std::vector<ProgramTable> tables = {
      table("doc", doc.data(), ProgramTableType::int32, {length})};
  const Program program = Program::mask("(doc[q] == doc[kv]) & (q >= kv)", tables);
  std::vector<Shape> shapes;
  for (const Shape& shape : random_shapes(4)) {
    shapes.push_back({shape.batch, shape.heads, std::min(shape.queries, length),
                      std::min(shape.keys, length), shape.tile_q, shape.tile_k});
  }
  expect_mask(
      program,
      [&](int64_t, int64_t, int64_t q, int64_t kv) { return doc[q] == doc[kv] && q >= kv; },
      shapes);
  expect_round_trip(program, tables);
}

TEST(ProgramCatalogue, DilatedSlidingWindow) {
  const Program program = Program::mask("((q - kv) % 2 == 0) & (abs(q - kv) <= 8)");
  expect_mask(
      program,
      [](int64_t, int64_t, int64_t q, int64_t kv) {
        const int64_t d = q - kv;
        return ((d % 2) + 2) % 2 == 0 && std::llabs(d) <= 8;
      },
      random_shapes(5));
  expect_round_trip(program, {});
}

TEST(ProgramCatalogue, NattenNeighbourhoodOnA2dGrid) {
  // Positions on a grid 7 wide: (y, x) = (p // 7, p % 7); a 3 × 3 neighbourhood.
  const Program program =
      Program::mask("(abs(q // 7 - kv // 7) <= 1) & (abs(q % 7 - kv % 7) <= 1)");
  expect_mask(
      program,
      [](int64_t, int64_t, int64_t q, int64_t kv) {
        return std::llabs(q / 7 - kv / 7) <= 1 && std::llabs(q % 7 - kv % 7) <= 1;
      },
      random_shapes(6));
  expect_round_trip(program, {});
}

TEST(ProgramCatalogue, PerHeadWindowsFromABoolAndAnIntTable) {
  const std::vector<int64_t> window = {1, 5, 1000};
  const std::vector<uint8_t> causal = {1, 0, 1};
  const std::vector<ProgramTable> tables = {
      table("win", window.data(), ProgramTableType::int64, {3}),
      table("causal", causal.data(), ProgramTableType::boolean, {3})};
  const Program program =
      Program::mask("(~causal[h] | (q >= kv)) & (abs(q - kv) < win[h])", tables);
  expect_mask(
      program,
      [&](int64_t, int64_t h, int64_t q, int64_t kv) {
        return (causal[h] == 0 || q >= kv) && std::llabs(q - kv) < window[h];
      },
      random_shapes(7));
  expect_round_trip(program, tables);
}

TEST(ProgramCatalogue, TanhSoftCapping) {
  const Program program = Program::score("30 * tanh(s / 30)");
  EXPECT_EQ(program.text(), "30.0 * tanh(s / 30.0)");
  expect_score(
      program,
      [](float s, int64_t, int64_t, int64_t, int64_t) { return 30.0f * std::tanh(s / 30.0f); },
      random_shapes(8), 4);
  expect_round_trip(program, {});
}

TEST(ProgramCatalogue, Alibi) {
  const std::vector<float> slope = {0.5f, 0.25f, 0.125f};
  const std::vector<ProgramTable> tables = {
      table("slope", slope.data(), ProgramTableType::float32, {3})};
  const Program program = Program::score("s - slope[h] * abs(q - kv)", tables);
  expect_score(
      program,
      [&](float s, int64_t, int64_t h, int64_t q, int64_t kv) {
        const float distance = static_cast<float>(std::llabs(q - kv));
        const float penalty = slope[h] * distance;
        return s - penalty;
      },
      random_shapes(9));
  expect_round_trip(program, tables);
}

TEST(ProgramCatalogue, LearnedRelativeBiasWithStrides) {
  // rel is [3 heads, 301 offsets] stored offset-major (transposed): strides {1, 3}.
  const int64_t offsets = 301;
  std::vector<float> rel(3 * offsets);
  for (size_t i = 0; i < rel.size(); ++i) rel[i] = std::sin(static_cast<float>(i));
  const std::vector<ProgramTable> tables = {
      table("rel", rel.data(), ProgramTableType::float32, {3, offsets}, {1, 3})};
  const Program program = Program::score("s + rel[h, q - kv + 150]", tables);
  expect_score(
      program,
      [&](float s, int64_t, int64_t h, int64_t q, int64_t kv) {
        return s + rel[(q - kv + 150) * 3 + h];
      },
      random_shapes(10));
  expect_round_trip(program, tables);
}

// T5's bucketed relative position: exact buckets below 8, logarithmic ones up to 15.
TEST(ProgramCatalogue, T5BucketedBias) {
  std::vector<float> t5(3 * 16);
  for (size_t i = 0; i < t5.size(); ++i) t5[i] = 0.1f * static_cast<float>(i) - 1.0f;
  const std::vector<ProgramTable> tables = {
      table("t5", t5.data(), ProgramTableType::float32, {3, 16})};
  const Program program = Program::score(
      "s + t5[h, where(abs(q - kv) < 8, abs(q - kv), "
      "min(8 + floor(log(abs(q - kv) / 8) / log(16) * 8), 15))]",
      tables);
  const auto bucket = [](int64_t q, int64_t kv) -> int64_t {
    const int64_t distance = std::llabs(q - kv);
    if (distance < 8) return distance;
    const float scaled = std::log(static_cast<float>(distance) / 8.0f) / std::log(16.0f) * 8.0f;
    return std::min<int64_t>(8 + static_cast<int64_t>(std::floor(scaled)), 15);
  };
  expect_score(
      program,
      [&](float s, int64_t, int64_t h, int64_t q, int64_t kv) {
        return s + t5[h * 16 + bucket(q, kv)];
      },
      random_shapes(11, 300));
  expect_round_trip(program, tables);
}

TEST(ProgramCatalogue, MultiplicativeGateAndScoreDependentBranch) {
  const std::vector<float> gate = {1.5f, -0.5f, 0.0f};
  const std::vector<ProgramTable> tables = {
      table("g", gate.data(), ProgramTableType::float32, {3})};
  const Program gated = Program::score("s * g[h]", tables);
  expect_score(
      gated, [&](float s, int64_t, int64_t h, int64_t, int64_t) { return s * gate[h]; },
      random_shapes(12));
  const Program leaky = Program::score("where(s > 0, s, 0.5 * s)");
  expect_score(
      leaky, [](float s, int64_t, int64_t, int64_t, int64_t) { return s > 0 ? s : 0.5f * s; },
      random_shapes(13));
  expect_round_trip(gated, tables);
  expect_round_trip(leaky, {});
}

TEST(ProgramText, PrecedenceFollowsPython) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"q - kv - 1 >= 0", "q - kv - 1 >= 0"},
      {"q - (kv - 1) >= 0", "q - (kv - 1) >= 0"},
      {"((q)) * (kv + 2) > 3", "q * (kv + 2) > 3"},
      {"q + kv * 2 // 3 % 5 == b", "q + kv * 2 // 3 % 5 == b"},
      {"(q + kv) * 2 == h", "(q + kv) * 2 == h"},
      {"(q > 1) | (kv > 2) & (h == 0)", "(q > 1) | (kv > 2) & (h == 0)"},
      {"((q > 1) | (kv > 2)) & (h == 0)", "((q > 1) | (kv > 2)) & (h == 0)"},
      {"~(q > kv) & ~~(kv >= 0)", "~(q > kv) & ~~(kv >= 0)"},
      {"-q - -kv < 0", "-q - -kv < 0"},
      {"where(q > kv, q, kv) == max(q, kv)", "where(q > kv, q, kv) == max(q, kv)"},
  };
  for (const auto& [source, canonical] : cases) {
    const Program program = Program::mask(source);
    EXPECT_EQ(program.text(), canonical) << source;
    EXPECT_EQ(Program::mask(program.text()).text(), canonical) << source;
  }
  // Python: | binds looser than &, comparisons looser than both — so this is a chain and an error.
  EXPECT_THROW(Program::mask("q > 1 | kv > 2"), Error);
}

TEST(ProgramText, PythonPrecedenceGivesTheSameValuesAsTheLambda) {
  const Program program = Program::mask("(q > 1) | (kv > 2) & (h == 0)");
  expect_mask(
      program,
      [](int64_t, int64_t h, int64_t q, int64_t kv) { return q > 1 || (kv > 2 && h == 0); },
      random_shapes(14, 8));
}

TEST(ProgramFolding, ConstantsFoldAndPromote) {
  EXPECT_EQ(Program::mask("q - kv < 2 * 64 + 1").text(), "q - kv < 129");
  EXPECT_EQ(Program::mask("q >= -7 // 2").text(), "q >= (-4)");  // Python floor division
  EXPECT_EQ(Program::mask("q >= -7 % 3").text(), "q >= 2");      // Python modulo
  EXPECT_EQ(Program::mask("q >= 7 % -3").text(), "q >= (-2)");
  EXPECT_EQ(Program::mask("q < 3 / 2").text(), "q < 1.5");
  EXPECT_EQ(Program::mask("q < floor(-2.5)").text(), "q < (-3)");
  EXPECT_EQ(Program::score("s + where(1 > 2, q, kv)").text(), "s + kv");
  EXPECT_EQ(Program::score("q").text(), "q");
  EXPECT_EQ(Program::score("s + exp(1000)").text(), "s + 1e39");
  EXPECT_EQ(Program::mask("1 < 2").text(), "(0 == 0)");
  EXPECT_EQ(Program::mask("1 < 2").node_count(), 1);
  const Program all_true = Program::mask("1 < 2");
  uint64_t bits[3];
  all_true.mask_tile(0, 0, 0, 5, 0, 3, bits);
  EXPECT_EQ(bits[0], 31u);
  EXPECT_EQ(bits[2], 31u);
  EXPECT_TRUE(all_true.allows(4, 3, 2, 1));
  // The canonical text of every folded constant compiles back to it.
  for (const char* source : {"s * (0.0 / 0.0)", "s - exp(1000)", "s + (-0.0)", "s + 1e-30"}) {
    const Program program = Program::score(source);
    EXPECT_EQ(Program::score(program.text()).text(), program.text()) << source;
  }
}

TEST(ProgramEvaluation, IntegerEdgesWrapAndFloorDivisionMatchesPython) {
  const Program program = Program::mask("(q - 5) // (kv - 3) == (q - 5) // (kv - 3 + 0) ");
  EXPECT_TRUE(program.allows(0, 0, 0, 2));
  const Program floor_div = Program::score("(q - 50) // (kv - 7) + (q - 50) % (kv - 7) * 1000");
  for (int64_t q = 0; q < 100; ++q) {
    for (int64_t kv = 0; kv < 14; ++kv) {
      if (kv == 7) continue;
      const int64_t a = q - 50;
      const int64_t d = kv - 7;
      int64_t quotient = a / d;
      if (a % d != 0 && ((a < 0) != (d < 0))) --quotient;
      const int64_t remainder = a - quotient * d;
      EXPECT_EQ(floor_div.score(0, 0, 0, q, kv), static_cast<float>(quotient + remainder * 1000))
          << q << " " << kv;
    }
  }
}

// Compile errors: the message names the column and the construct (the errors_test catalogue rows
// E123–E126 cover the same kinds with their documented messages).
void expect_error(const std::string& source, const std::string& excerpt, bool score = false,
                  const std::vector<ProgramTable>& tables = {}) {
  try {
    if (score) {
      Program::score(source, tables);
    } else {
      Program::mask(source, tables);
    }
    ADD_FAILURE() << source << " compiled";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(excerpt), std::string::npos)
        << source << ": " << error.what();
  }
}

TEST(ProgramErrors, EveryKindOfCompileError) {
  const std::vector<int64_t> doc(10, 0);
  const std::vector<ProgramTable> tables = {
      table("doc", doc.data(), ProgramTableType::int64, {10})};
  expect_error("q >= x", "column 6: unknown identifier 'x'; the variables are b, h, q, kv");
  expect_error("q >= x", "the tables are doc[10]", false, tables);
  expect_error("foo(q) > 0", "column 1: unknown function 'foo'; the functions are where, min");
  expect_error("doc[q] == lut[kv]", "column 11: unknown table 'lut'; the tables are doc[10]", false,
               tables);
  expect_error("doc == q", "table doc[10] must be indexed", false, tables);
  expect_error("doc[q, kv] == 0", "table doc[10] takes 1 indices, got 2", false, tables);
  expect_error("min(q) > 0", "min takes 2 arguments, got 1");
  expect_error("where(q > 0, 1) > 0", "where takes 3 arguments, got 2");
  expect_error("q + (kv > 2) > 0",
               "column 3: '+' needs two numbers (int64 or f32), got int64 and bool");
  expect_error("doc[q / 2] == 0", "index 0 of table doc[10] must be int64, got f32", false, tables);
  expect_error("q & kv", "'&' needs two bools (& and | combine masks), got int64 and int64");
  expect_error("q // 2.0 > 1", "'//' needs two int64, got int64 and f32");
  expect_error("~q > 0", "'~' needs a bool operand, got int64");
  expect_error("-(q > 0)", "'-' needs an int64 or f32 operand, got bool");
  expect_error("q - kv", "a mask program must be a bool");
  expect_error("q > kv", "a score program must be a number", true);
  expect_error("s > 0", "the score s exists only in a score program");
  expect_error("where(q, 1, 2) > 0", "where's condition must be a bool, got int64");
  expect_error("where(q > 0, q > 1, 2) > 0",
               "where needs two bools or two numbers, got bool and int64");
  expect_error("exp(q > 0) > 0", "exp needs int64 or f32 arguments, got bool");
  expect_error("0 < q < 5", "column 7: syntax error: comparisons do not chain");
  expect_error("(q > 0", "column 7: syntax error: expected ')', found the end");
  expect_error("q > > 0", "column 5: syntax error: expected a number, a name or '('");
  expect_error("q > 0 0", "column 7: syntax error: expected the end of the program, found '0'");
  expect_error("q >= kv $", "column 9: unexpected character '$'");
  expect_error("q > 99999999999999999999", "does not fit int64");
  expect_error("q > 1 // 0", "column 7: 1 // 0: integer division by zero");
}

TEST(ProgramErrors, TablesAndEvaluation) {
  const std::vector<int32_t> doc(10, 0);
  const ProgramTable good = table("doc", doc.data(), ProgramTableType::int32, {10});
  expect_error("q > 0", "program table 'doc' is given twice", false, {good, good});
  expect_error("q > 0", "program table '': a table name must be a non-empty identifier", false,
               {table("", doc.data(), ProgramTableType::int32, {10})});
  expect_error("q > 0", "the name is a variable or a function", false,
               {table("kv", doc.data(), ProgramTableType::int32, {10})});
  expect_error("q > 0", "of shape [] must have 1 to 3 dimensions", false,
               {table("t", doc.data(), ProgramTableType::int32, {})});
  expect_error("q > 0", "of shape [10] has a null data pointer", false,
               {table("t", nullptr, ProgramTableType::int32, {10})});
  const Program program = Program::mask("doc[q] == doc[kv]", {good});
  EXPECT_TRUE(program.allows(0, 0, 9, 0));
  try {
    program.allows(0, 0, 3, 10);
    ADD_FAILURE() << "read beyond the table";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("index [10] is outside table doc of shape [10]"),
              std::string::npos)
        << error.what();
  }
  uint64_t bits[64];
  EXPECT_THROW(program.mask_tile(0, 0, 0, 11, 0, 4, bits), Error);  // queries 0..10
  EXPECT_NO_THROW(program.mask_tile(0, 0, 0, 10, 0, 10, bits));
  EXPECT_THROW(program.mask_tile(0, 0, 0, 65, 0, 4, bits), Error);
  EXPECT_THROW(program.mask_tile(0, 0, 0, 4, 0, 0, bits), Error);
  float s[4] = {0, 0, 0, 0};
  EXPECT_THROW(program.score_tile(0, 0, 0, 2, 0, 2, s), Error);  // a mask program
  const Program divide = Program::mask("q // (kv - 2) >= 0");
  EXPECT_THROW(divide.allows(0, 0, 5, 2), Error);
  EXPECT_THROW(divide.mask_tile(0, 0, 0, 4, 0, 4, bits), Error);
}

}  // namespace
}  // namespace maskattn
