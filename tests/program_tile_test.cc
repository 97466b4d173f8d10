// The tile evaluator against the scalar one (maskattn/program.h; src/program/eval_tile.cc): random
// programs over every kind of node (affine index arithmetic, bit-row logic, vector comparisons of
// int64 and f32, where, int64 / int32 / bool / float tables read along runs, reversed runs, strided
// and gathered, division, the f32 functions) on random tiles in both layouts, with a row stride
// or packed; each pair's value must be the scalar evaluator's to the bit, and a tile must raise
// exactly when one of its pairs does. Then the catalogue in the ProgramTile layouts, and the
// promise that evaluating a tile allocates nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "maskattn/error.h"
#include "maskattn/program.h"

namespace maskattn {
namespace {

uint32_t bits_of(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

// Random programs: bool, int64 and f32 expressions over the variables and four tables.
class Generator {
 public:
  explicit Generator(uint64_t seed) : random_(seed) {}
  int pick(int n) { return static_cast<int>(random_() % n); }

  std::string boolean(int depth) {
    switch (pick(depth <= 0 ? 2 : 9)) {
      case 0:
        return integer(depth - 1) + comparison() + integer(depth - 1);
      case 1:
        return "bt[" + index(depth - 1) + "]";
      case 2:
        return "(" + boolean(depth - 1) + ") & (" + boolean(depth - 1) + ")";
      case 3:
        return "(" + boolean(depth - 1) + ") | (" + boolean(depth - 1) + ")";
      case 4:
        return "~(" + boolean(depth - 1) + ")";
      case 5:
        return "where(" + boolean(depth - 1) + ", " + boolean(depth - 1) + ", " +
               boolean(depth - 1) + ")";
      case 6:
        return "(" + boolean(depth - 1) + ") == (" + boolean(depth - 1) + ")";
      case 7:
        return real(depth - 1) + comparison() + real(depth - 1);
      default:
        return "q - kv" + comparison() + std::to_string(pick(9) - 4);
    }
  }

  std::string integer(int depth) {
    static const char* const kLeaves[] = {"q",      "kv",     "h",           "b",
                                          "q - kv", "t64[q]", "t32[kv + 1]", "kv - q + 3"};
    if (depth <= 0) {
      return pick(3) == 0 ? std::to_string(pick(13) - 6) : std::string(kLeaves[pick(8)]);
    }
    const std::string a = integer(depth - 1), c = integer(depth - 1);
    switch (pick(15)) {
      case 0:
        return "(" + a + " + " + c + ")";
      case 1:
        return "(" + a + " - " + c + ")";
      case 2:
        return "(" + a + " * " + c + ")";
      case 3:
        return "(" + a + " // " + c + ")";
      case 4:
        return "(" + a + " % " + c + ")";
      case 5:
        return "abs(" + a + ")";
      case 6:
        return "min(" + a + ", " + c + ")";
      case 7:
        return "max(" + a + ", " + c + ")";
      case 8:
        return "(-" + a + ")";
      case 9:
        return "where(" + boolean(depth - 1) + ", " + a + ", " + c + ")";
      case 10:
        return "t64[" + index(depth - 1) + "]";
      case 11:
        return "t32[" + index(depth - 1) + "]";
      case 12:
        return "floor(" + real(depth - 1) + ")";
      case 13:
        return "(" + a + " * 3 - 2 * kv + 7)";
      default:
        return "(" + a + " + 9223372036854775800)";  // wraps
    }
  }

  std::string real(int depth) {
    if (depth <= 0) return leaf();
    const std::string a = real(depth - 1), c = real(depth - 1);
    switch (pick(14)) {
      case 0:
        return "(" + a + " + " + c + ")";
      case 1:
        return "(" + a + " - " + c + ")";
      case 2:
        return "(" + a + " * " + c + ")";
      case 3:
        return "(" + a + " / " + c + ")";
      case 4:
        return "exp(" + a + ")";
      case 5:
        return "log(" + a + ")";
      case 6:
        return "tanh(" + a + ")";
      case 7:
        return "sigmoid(" + a + ")";
      case 8:
        return "min(" + a + ", " + c + ")";
      case 9:
        return "max(" + a + ", " + c + ")";
      case 10:
        return "abs(-" + a + ")";
      case 11:
        return "where(" + boolean(depth - 1) + ", " + a + ", " + c + ")";
      case 12:
        return "ft[h, " + index(depth - 1) + "]";
      default:
        return integer(depth - 1);
    }
  }

  void set_score(bool score) { score_ = score; }

 private:
  std::string leaf() {
    static const char* const kLeaves[] = {
        "s",        "0.5",      "q", "-2.25", "ft[h, q - kv + 70]", "ft[h, kv - q + 70]",
        "ft[h, q]", "ft[2, kv]"};
    const std::string chosen = kLeaves[pick(8)];
    return chosen == "s" && !score_ ? "1.5" : chosen;
  }
  std::string comparison() {
    static const char* const kComparisons[] = {" == ", " != ", " < ", " <= ", " > ", " >= "};
    return kComparisons[pick(6)];
  }
  // Mostly in range for the tables' 200 (t64, t32, bt) or 141 (ft) elements, sometimes not.
  std::string index(int depth) {
    switch (pick(7)) {
      case 0:
        return integer(depth);
      case 1:
        return "min(max(" + integer(depth) + ", 0), 140)";
      case 2:
        return "q - kv + 70";
      case 3:
        return "q";
      case 4:
        return "kv + h";
      default:
        return "(" + integer(depth) + ") % 141";
    }
  }

  std::mt19937_64 random_;
  bool score_ = false;
};

struct Tables {
  std::vector<int64_t> t64 = std::vector<int64_t>(141);
  std::vector<int32_t> t32 = std::vector<int32_t>(141);
  std::vector<uint8_t> bt = std::vector<uint8_t>(141);
  std::vector<float> ft = std::vector<float>(3 * 141);
  std::vector<ProgramTable> list;

  explicit Tables(std::mt19937_64& random) {
    for (int k = 0; k < 141; ++k) {
      t64[k] = static_cast<int64_t>(random() % 20) - 4;
      t32[k] = static_cast<int32_t>(random() % 16) - 2;
      bt[k] = static_cast<uint8_t>(random() % 3);  // 2 is true too
    }
    for (float& x : ft) x = static_cast<float>(static_cast<int>(random() % 2001) - 1000) / 64.0f;
    ft[7] = -0.0f;
    t64[5] = int64_t{1} << 40;  // beyond int32: no narrowing for comparisons that read it
    list = {ProgramTable::borrow("t64", t64.data(), {141}),
            ProgramTable::borrow("t32", t32.data(), {141}),
            ProgramTable::borrow("bt", bt.data(), {141}),
            // ft is [3, 141] stored offset-major (transposed) when the seed says so
            ProgramTable{"ft",
                         ft.data(),
                         ProgramTableType::float32,
                         {3, 141},
                         random() % 2 == 0 ? std::vector<int64_t>{} : std::vector<int64_t>{1, 3},
                         {}}};
  }
};

float raw_score(int64_t b, int64_t h, int64_t q, int64_t kv) {
  const int64_t k = (b * 7 + h * 13 + q * 31 + kv * 17) % 203;
  if (k == 5) return INFINITY;
  if (k == 6) return -INFINITY;
  if (k == 7) return 0.0f;
  return static_cast<float>(k - 100) * 0.37f;
}

// One tile of a mask program: the bits against allows(), or both raise.
void expect_mask_tile(const Program& program, int64_t b, int64_t h, int64_t q0, int64_t nq,
                      int64_t kv0, int64_t nk) {
  bool scalar_raises = false;
  std::vector<int> want(nq * nk);
  for (int64_t j = 0; j < nk; ++j) {
    for (int64_t i = 0; i < nq; ++i) {
      try {
        want[j * nq + i] = program.allows(b, h, q0 + i, kv0 + j);
      } catch (const Error&) {
        scalar_raises = true;
      }
    }
  }
  uint64_t bits[64];
  try {
    program.mask_tile(b, h, q0, nq, kv0, nk, bits);
  } catch (const Error& error) {
    ASSERT_TRUE(scalar_raises) << "the tile raised, no pair does: " << error.what();
    return;
  }
  ASSERT_FALSE(scalar_raises) << "a pair raises, the tile did not";
  for (int64_t j = 0; j < nk; ++j) {
    ASSERT_EQ(bits[j] >> 1 >> (nq - 1), 0u) << "bits beyond the tile's queries";
    for (int64_t i = 0; i < nq; ++i) {
      ASSERT_EQ(static_cast<int>((bits[j] >> i) & 1), want[j * nq + i])
          << "q=" << q0 + i << " kv=" << kv0 + j;
    }
  }
}

// One tile of a score program in a layout: the values against score(), or both raise.
void expect_score_tile(const Program& program, const ProgramTile& tile) {
  const int64_t rows = tile.query_rows ? tile.nq : tile.nk;
  const int64_t cols = tile.query_rows ? tile.nk : tile.nq;
  const int64_t stride = tile.row_stride != 0 ? tile.row_stride : cols;
  std::vector<float> s(rows * stride, 12345.0f);
  const auto at = [&](int64_t i, int64_t j) -> float& {
    return tile.query_rows ? s[i * stride + j] : s[j * stride + i];
  };
  bool scalar_raises = false;
  std::vector<float> want(tile.nq * tile.nk);
  for (int64_t j = 0; j < tile.nk; ++j) {
    for (int64_t i = 0; i < tile.nq; ++i) {
      const float raw = raw_score(tile.b, tile.h, tile.q0 + i, tile.kv0 + j);
      at(i, j) = raw;
      try {
        want[j * tile.nq + i] = program.score(raw, tile.b, tile.h, tile.q0 + i, tile.kv0 + j);
      } catch (const Error&) {
        scalar_raises = true;
      }
    }
  }
  try {
    program.score_tile(tile, s.data());
  } catch (const Error& error) {
    ASSERT_TRUE(scalar_raises) << "the tile raised, no pair does: " << error.what();
    return;
  }
  ASSERT_FALSE(scalar_raises) << "a pair raises, the tile did not";
  for (int64_t j = 0; j < tile.nk; ++j) {
    for (int64_t i = 0; i < tile.nq; ++i) {
      const float got = at(i, j), expected = want[j * tile.nq + i];
      ASSERT_TRUE(bits_of(got) == bits_of(expected) || (std::isnan(got) && std::isnan(expected)))
          << "q=" << tile.q0 + i << " kv=" << tile.kv0 + j << ": tile " << got << ", scalar "
          << expected << (tile.query_rows ? " (query rows)" : " (key rows)");
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = cols; c < stride; ++c) ASSERT_EQ(s[r * stride + c], 12345.0f) << "padding";
  }
}

TEST(ProgramTiles, RandomProgramsAgreeWithTheScalarEvaluator) {
  std::mt19937_64 random(99);
  int compiled = 0;
  for (int round = 0; round < 700; ++round) {
    Generator generator(random());
    const bool score = round % 2 == 1;
    generator.set_score(score);
    Tables tables(random);
    const std::string text =
        score ? generator.real(1 + generator.pick(3)) : generator.boolean(1 + generator.pick(3));
    SCOPED_TRACE(text);
    Program program = Program::mask("q >= 0");
    try {
      program = score ? Program::score(text, tables.list) : Program::mask(text, tables.list);
    } catch (const Error&) {
      continue;  // a folded division by zero
    }
    ++compiled;
    for (int k = 0; k < 4; ++k) {
      const int64_t nq = 1 + random() % 64, nk = 1 + random() % 64;
      const int64_t b = random() % 2, h = random() % 3;
      const int64_t q0 = random() % 70, kv0 = random() % 70;
      if (!score) {
        ASSERT_NO_FATAL_FAILURE(expect_mask_tile(program, b, h, q0, nq, kv0, nk));
        continue;
      }
      const bool query_rows = random() % 2 == 0;
      const int64_t stride = random() % 2 == 0 ? 0 : (query_rows ? nk : nq) + random() % 5;
      ASSERT_NO_FATAL_FAILURE(
          expect_score_tile(program, ProgramTile{b, h, q0, nq, kv0, nk, query_rows, stride}));
    }
  }
  EXPECT_GT(compiled, 600);
}

// Every representation the tile evaluator has, named: each program on every tile of a problem,
// tile sizes that leave partial tiles, both layouts, packed and with a row stride.
TEST(ProgramTiles, EachFastPathAgreesInEveryLayout) {
  std::mt19937_64 random(7);
  Tables tables(random);
  const char* const masks[] = {
      "q >= kv",                                    // affine threshold, slope 1
      "(q - kv >= 0) & (q - kv < 16)",              // thresholds and word logic
      "3 * q - 2 * kv >= 5",                        // a slope of 3: division per row
      "q * 3 == kv * 2",                            // equality on a slope
      "(q - kv) * 4611686018427387904 >= 0",        // wraps: no affine form, values compared
      "q - 9223372036854775807 < kv - 100",         // affine near int64's end: 128-bit path
      "t64[q] == t64[kv]",                          // table views, int32 compares
      "t32[q] != t32[kv + 1]",                      // widened runs
      "t64[q + 5 - 5] <= t64[kv] + 1099511627776",  // a value beyond int32: int64 compares
      "bt[q - kv + 70]",                            // a bool table along a run, packed to bits
      "where(q > kv, bt[q], bt[kv])",               // where on words
      "~(q > kv) | (h == 1)",                       // a per-tile bool broadcast into words
      "(b == 0) == (q < 5)",                        // == of bools
      "t64[(q - kv) % 141] > 3",                    // a gathered read
  };
  const char* const scores[] = {
      "s + ft[h, q - kv + 70]",  // a view (key rows), a reversed run (query rows)
      "s * ft[h, q] + ft[2, kv]",
      "where(s > 0, s, s * 0.5)",
      "s + t32[q - kv + 70]",
      "min(s, ft[h, kv]) - max(s, 1.0)",
      "30.0 * tanh(s / 30.0)",
      "ft[h, q - kv + 70]",
      "where(t64[q] == t64[kv], s, -1e39)",
      "s",
      "1.5 + h"};
  for (const char* text : masks) {
    SCOPED_TRACE(text);
    const Program program = Program::mask(text, tables.list);
    for (int64_t q0 = 0; q0 < 71; q0 += 23) {
      for (int64_t kv0 = 0; kv0 < 71; kv0 += 29) {
        ASSERT_NO_FATAL_FAILURE(expect_mask_tile(program, 1, 2, q0, 64, kv0, 64));
        ASSERT_NO_FATAL_FAILURE(expect_mask_tile(program, 0, 1, q0, 1 + q0 % 64, kv0, 7));
      }
    }
  }
  for (const char* text : scores) {
    SCOPED_TRACE(text);
    const Program program = Program::score(text, tables.list);
    for (const bool query_rows : {false, true}) {
      for (const int64_t pad : {0, 3}) {
        for (int64_t q0 = 0; q0 < 71; q0 += 23) {
          for (int64_t kv0 = 0; kv0 < 71; kv0 += 29) {
            const int64_t nq = q0 == 46 ? 17 : 64, nk = kv0 == 58 ? 13 : 64;
            const int64_t stride = pad == 0 ? 0 : (query_rows ? nk : nq) + pad;
            ASSERT_NO_FATAL_FAILURE(
                expect_score_tile(program, ProgramTile{1, 2, q0, nq, kv0, nk, query_rows, stride}));
          }
        }
      }
    }
  }
}

// A tile that raises leaves the caller's tile as it was (docs/errors.md: nothing is written).
TEST(ProgramTiles, NothingIsWrittenWhenATileRaises) {
  std::vector<float> rel(2 * 10, 1.0f);
  const ProgramTable table = ProgramTable::borrow("rel", rel.data(), {2, 10});
  for (const char* text : {"rel[h, q - kv + 2]", "s + rel[h, q - kv + 2]", "s * (q // (kv - 3))"}) {
    const Program program = Program::score(text, {table});
    for (const bool query_rows : {false, true}) {
      std::vector<float> s(16 * 16, 7.0f);
      EXPECT_THROW(program.score_tile(ProgramTile{0, 1, 0, 16, 0, 16, query_rows, 0}, s.data()),
                   Error)
          << text;
      for (const float x : s) ASSERT_EQ(x, 7.0f) << text;
    }
  }
  std::vector<uint8_t> keep(10, 1);
  const Program mask = Program::mask("keep[q - kv + 2] & (q >= kv)",
                                     {ProgramTable::borrow("keep", keep.data(), {10})});
  uint64_t bits[16];
  std::fill(bits, bits + 16, 77u);
  EXPECT_THROW(mask.mask_tile(0, 0, 0, 16, 0, 16, bits), Error);
  for (const uint64_t word : bits) ASSERT_EQ(word, 77u);
}

TEST(ProgramTiles, LayoutArgumentsAreChecked) {
  const Program program = Program::score("s * 2.0");
  float s[64 * 64] = {};
  EXPECT_THROW(program.score_tile(ProgramTile{0, 0, 0, 8, 0, 4, false, 7}, s), Error);
  EXPECT_THROW(program.score_tile(ProgramTile{0, 0, 0, 8, 0, 4, true, 3}, s), Error);
  EXPECT_NO_THROW(program.score_tile(ProgramTile{0, 0, 0, 8, 0, 4, true, 4}, s));
  EXPECT_THROW(program.score_tile(ProgramTile{0, 0, 0, 65, 0, 4, true, 0}, s), Error);
  EXPECT_THROW(program.score_tile(ProgramTile{0, 0, 0, 8, 0, 4, true, 0}, nullptr), Error);
  EXPECT_THROW(Program::mask("q > kv").score_tile(ProgramTile{}, s), Error);
}

}  // namespace
}  // namespace maskattn
