// Program::score_tile_backward (maskattn/program.h; src/program/tile_backward-inl.h): ∂L/∂s and the
// float32 tables' gradients of the catalogue's score programs against derivatives written by hand
// in f64, in both tile layouts; PyTorch's conventions where derivatives are a choice (abs at 0,
// ties of min and max); hidden pairs (∂L/∂output = 0) contributing exactly nothing; the tables'
// sums identical whatever the layout; and central finite differences of the forward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "maskattn/error.h"
#include "maskattn/program.h"

namespace maskattn {
namespace {

// A pair of the tile, as the reference sees it.
struct Pair {
  int64_t b, h, q, kv;
  double s, g;  // the input score and ∂L/∂output
};

// The reference: ∂L/∂s of one pair, and its additions to the tables' gradients.
using Reference = std::function<double(const Pair&, std::vector<std::vector<double>>& tables)>;

struct Case {
  std::string text;
  std::vector<ProgramTable> tables;
  Reference reference;
};

float score_of(int64_t b, int64_t h, int64_t q, int64_t kv, std::mt19937_64& random) {
  const int64_t k = static_cast<int64_t>(random() % 1000);
  if (k < 30) return 0.0f;  // ties with 0 and where's boundary
  if (k < 40) return 1.0f;  // ties with min(s, 1.0)
  return static_cast<float>(static_cast<int64_t>((b * 7 + h * 13 + q * 31 + kv * 17 + k) % 401) -
                            200) *
         0.043f;
}

// Runs the backward on tiles of a problem in one layout; checks ds against the reference and
// returns the tables' gradients.
std::vector<std::vector<double>> run_and_check(const Case& c, bool query_rows, uint64_t seed,
                                               int64_t heads = 3, int64_t length = 130) {
  const Program program = Program::score(c.text, c.tables);
  std::vector<std::vector<double>> grads(c.tables.size()), want(c.tables.size());
  std::vector<double*> grad_pointers(c.tables.size(), nullptr);
  for (size_t t = 0; t < c.tables.size(); ++t) {
    int64_t count = 1;
    for (const int64_t size : c.tables[t].sizes) count *= size;
    grads[t].assign(count, 0.0);
    want[t].assign(count, 0.0);
    if (c.tables[t].type == ProgramTableType::float32) grad_pointers[t] = grads[t].data();
  }
  std::mt19937_64 random(seed);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t q0 = 0; q0 < length; q0 += 64) {
      for (int64_t kv0 = 0; kv0 < length; kv0 += 64) {
        ProgramTile tile{1,          h,
                         q0,         std::min<int64_t>(64, length - q0),
                         kv0,        std::min<int64_t>(64, length - kv0),
                         query_rows, 0};
        const int64_t rows = query_rows ? tile.nq : tile.nk, cols = query_rows ? tile.nk : tile.nq;
        tile.row_stride = cols + static_cast<int64_t>(random() % 3);
        std::vector<float> s(rows * tile.row_stride), ds(rows * tile.row_stride);
        std::vector<Pair> pairs;
        for (int64_t j = 0; j < tile.nk; ++j) {
          for (int64_t i = 0; i < tile.nq; ++i) {
            const int64_t at = query_rows ? i * tile.row_stride + j : j * tile.row_stride + i;
            s[at] = score_of(1, h, q0 + i, kv0 + j, random);
            ds[at] = random() % 5 == 0 ? 0.0f : static_cast<float>(random() % 200) / 64 - 1.5f;
            pairs.push_back({1, h, q0 + i, kv0 + j, s[at], ds[at]});
          }
        }
        program.score_tile_backward(tile, s.data(), ds.data(), grad_pointers.data());
        size_t k = 0;
        for (int64_t j = 0; j < tile.nk; ++j) {
          for (int64_t i = 0; i < tile.nq; ++i, ++k) {
            const int64_t at = query_rows ? i * tile.row_stride + j : j * tile.row_stride + i;
            const double expected = pairs[k].g == 0 ? 0.0 : c.reference(pairs[k], want);
            EXPECT_NEAR(ds[at], expected, 2e-6 * std::abs(expected) + 1e-7)
                << c.text << " at q=" << q0 + i << " kv=" << kv0 + j << " s=" << pairs[k].s
                << (query_rows ? " (query rows)" : " (key rows)");
          }
        }
      }
    }
  }
  for (size_t t = 0; t < c.tables.size(); ++t) {
    if (grad_pointers[t] == nullptr) continue;
    for (size_t e = 0; e < want[t].size(); ++e) {
      // per-pair terms are products of f32 values (the forward's), summed over ~5000 pairs
      EXPECT_NEAR(grads[t][e], want[t][e], 1e-5 * std::abs(want[t][e]) + 1e-3)
          << c.text << ": table " << c.tables[t].name << " element " << e;
    }
  }
  return grads;
}

int sign(double x) {
  return (x > 0) - (x < 0);
}

TEST(ProgramBackward, TheCatalogueAgainstDerivativesByHand) {
  std::vector<float> slope = {0.5f, 0.25f, 0.125f};
  std::vector<float> rel(3 * 259);
  for (size_t k = 0; k < rel.size(); ++k) rel[k] = std::sin(static_cast<float>(k));
  std::vector<float> gate = {1.5f, -0.5f, 0.0f};
  std::vector<int64_t> bucket(259);
  for (int64_t k = 0; k < 259; ++k) bucket[k] = std::min<int64_t>(std::abs(k - 129) / 9, 15);
  std::vector<float> bias(3 * 16);
  for (size_t k = 0; k < bias.size(); ++k) bias[k] = 0.1f * static_cast<float>(k);
  std::vector<float> cap = {1.0f, 0.3f, -2.0f};
  const auto t_slope = ProgramTable::borrow("slope", slope.data(), {3});
  const auto t_rel = ProgramTable::borrow("rel", rel.data(), {3, 259});
  const auto t_gate = ProgramTable::borrow("g", gate.data(), {3});
  const auto t_bucket = ProgramTable::borrow("bucket", bucket.data(), {259});
  const auto t_bias = ProgramTable::borrow("bias", bias.data(), {3, 16});
  const auto t_cap = ProgramTable::borrow("cap", cap.data(), {3});
  using Tables = std::vector<std::vector<double>>;
  const std::vector<Case> cases = {
      {"30 * tanh(s / 30)",
       {},
       [](const Pair& p, Tables&) {
         const double t = std::tanh(p.s / 30);
         return p.g * (1 - t * t);
       }},
      {"s - slope[h] * abs(q - kv)",
       {t_slope},
       [](const Pair& p, Tables& grads) {
         grads[0][p.h] += -p.g * std::abs(p.q - p.kv);
         return p.g;
       }},
      {"s + rel[h, q - kv + 129]",
       {t_rel},
       [](const Pair& p, Tables& grads) {
         grads[0][p.h * 259 + p.q - p.kv + 129] += p.g;
         return p.g;
       }},
      {"s * g[h]",
       {t_gate},
       [&](const Pair& p, Tables& grads) {
         grads[0][p.h] += p.g * p.s;
         return p.g * gate[p.h];
       }},
      {"where(s > 0, s, s * 0.5)",
       {},
       [](const Pair& p, Tables&) { return p.s > 0 ? p.g : 0.5 * p.g; }},
      {"s + bias[h, bucket[q - kv + 129]]",
       {t_bucket, t_bias},
       [&](const Pair& p, Tables& grads) {
         grads[1][p.h * 16 + bucket[p.q - p.kv + 129]] += p.g;
         return p.g;
       }},
      {"exp(s / 4.0) + log(abs(s) + 1.0) - sigmoid(s) * cap[h]",
       {t_cap},
       [&](const Pair& p, Tables& grads) {
         const double sig = 1 / (1 + std::exp(-p.s));
         grads[0][p.h] += -p.g * sig;
         return p.g * (std::exp(p.s / 4) / 4 + sign(p.s) / (std::abs(p.s) + 1) -
                       cap[p.h] * sig * (1 - sig));
       }},
      {"min(s, 1.0) + max(s * 2.0, cap[h])",
       {t_cap},
       [&](const Pair& p, Tables& grads) {  // ties: half to each side (torch.minimum/maximum)
         const double m = p.s == 1.0 ? 0.5 : (p.s < 1.0 ? 1 : 0);
         const double x = 2 * p.s, c = cap[p.h];
         const double to_x = x == c ? 0.5 : (x > c ? 1 : 0);
         grads[0][p.h] += p.g * (x == c ? 0.5 : (x < c ? 1 : 0));
         return p.g * (m + 2 * to_x);
       }},
      {"s / cap[h] - s / (abs(q - kv) + 1)",
       {t_cap},
       [&](const Pair& p, Tables& grads) {
         grads[0][p.h] += -p.g * p.s / (double{cap[p.h]} * cap[p.h]);
         return p.g * (1 / double{cap[p.h]} - 1.0 / (std::abs(p.q - p.kv) + 1));
       }},
      // max(s, s) is one node with s on both sides: two halves make a whole. min(-s, s) gives
      // its adjoint to -s where s > 0, to s where s < 0, half to each at s = 0 (-0.0 == 0.0).
      {"max(s, s) - min(-s, s)",
       {},
       [](const Pair& p, Tables&) {
         const double d_min = p.s > 0 ? -1 : p.s < 0 ? 1 : 0;
         return p.g * (1 - d_min);
       }},
  };
  for (const Case& c : cases) {
    const auto key_rows = run_and_check(c, false, 11);
    const auto query_rows = run_and_check(c, true, 11);
    for (size_t t = 0; t < key_rows.size(); ++t) {
      for (size_t e = 0; e < key_rows[t].size(); ++e) {
        ASSERT_EQ(key_rows[t][e], query_rows[t][e])
            << c.text << ": the tables' sums must not depend on the layout";
      }
    }
  }
}

// A hidden pair (∂L/∂output = 0, or -0) gets exactly 0 and adds nothing, even where the
// derivative is infinite; an untaken branch adds nothing either (PyTorch's where would give
// 0 · inf = NaN there); abs'(0) = 0 and a tie of max gives half, as in PyTorch.
TEST(ProgramBackward, ZeroAdjointsPropagateNothing) {
  std::vector<float> w = {2.0f};
  std::vector<double> grad = {10.0};  // gradients accumulate into what the buffer holds
  double* grads[1] = {grad.data()};
  const Program scaled_log =
      Program::score("log(s) * w[0]", {ProgramTable::borrow("w", w.data(), {1})});
  float s[3] = {0.0f, 2.0f, 0.0f}, ds[3] = {0.0f, 1.0f, -0.0f};
  scaled_log.score_tile_backward(ProgramTile{0, 0, 0, 3, 0, 1}, s, ds, grads);
  EXPECT_EQ(std::signbit(ds[0]), false);
  EXPECT_EQ(ds[0], 0.0f);
  EXPECT_EQ(ds[1], 1.0f);  // w / s
  EXPECT_EQ(ds[2], 0.0f);
  EXPECT_DOUBLE_EQ(grad[0], 10.0 + std::log(2.0f));

  const Program guarded = Program::score("where(s > 0, log(s), s) + abs(s) + max(s, 0.0)");
  float s2[3] = {0.0f, -1.0f, 2.0f}, ds2[3] = {1.0f, 1.0f, 1.0f};
  guarded.score_tile_backward(ProgramTile{0, 0, 0, 1, 0, 3}, s2, ds2, nullptr);
  EXPECT_EQ(ds2[0], 1.5f);         // s branch 1, abs'(0) = 0, the tie of max 0.5
  EXPECT_EQ(ds2[1], 1.0f - 1.0f);  // s branch 1, abs' -1, max 0
  EXPECT_EQ(ds2[2], 0.5f + 2.0f);  // 1/s, abs' 1, max 1

  const Program constant = Program::score("q - kv + 0.5");  // no s: ∂L/∂s = 0
  float s3[2] = {1.0f, 2.0f}, ds3[2] = {3.0f, 4.0f};
  constant.score_tile_backward(ProgramTile{0, 0, 0, 2, 0, 1}, s3, ds3, nullptr);
  EXPECT_EQ(ds3[0], 0.0f);
  EXPECT_EQ(ds3[1], 0.0f);
  EXPECT_THROW(Program::mask("q > kv").score_tile_backward(ProgramTile{}, s3, ds3, nullptr), Error);
  EXPECT_THROW(constant.score_tile_backward(ProgramTile{}, nullptr, ds3, nullptr), Error);
  EXPECT_THROW(constant.score_tile_backward(ProgramTile{0, 0, 0, 0, 0, 1}, s3, ds3, nullptr),
               Error);
}

// ∂L/∂s against central differences of the forward (the scalar evaluator), away from kinks.
TEST(ProgramBackward, FiniteDifferencesOfTheForward) {
  std::vector<float> cap = {1.0f, 0.3f, -2.0f};
  const std::vector<ProgramTable> tables = {ProgramTable::borrow("cap", cap.data(), {3})};
  for (const char* text :
       {"30 * tanh(s / 30)", "exp(s / 4.0) + log(s * s + 1.0) - sigmoid(s) * cap[h]",
        "s / cap[h] + tanh(s) * s", "where(s > 0, s * s, exp(s)) - min(s, 1.0)"}) {
    const Program program = Program::score(text, tables);
    for (int64_t h = 0; h < 3; ++h) {
      for (const float s0 : {-3.1f, -0.7f, 0.4f, 1.9f, 6.2f}) {
        float s = s0, ds = 1.0f;
        program.score_tile_backward(ProgramTile{0, h, 5, 1, 2, 1}, &s, &ds, nullptr);
        const float e = 1e-2f;
        const double difference =
            (double{program.score(s0 + e, 0, h, 5, 2)} - program.score(s0 - e, 0, h, 5, 2)) /
            (double{s0 + e} - double{s0 - e});
        EXPECT_NEAR(ds, difference, 2e-3 * (std::abs(difference) + 1)) << text << " at s=" << s0;
      }
    }
  }
}

}  // namespace
}  // namespace maskattn
