// Attention dropout's generator (core/philox.h, core/dropout.h, kernels/dropout-inl.h): Philox
// against Random123's published answers, the kernels' vector bits against the scalar definition
// on every SIMD target this machine runs, the keep rate and the independence of neighbouring pairs
// over 10⁷ pairs. The rule's errors (E135) are in errors_dropout_test.cc.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dropout.h"
#include "core/philox.h"
#include "core/splitmix64.h"
#include "kernels/fused_block.h"
#include "test_util.h"

namespace maskattn {
namespace {

using detail::DropoutRule;
using detail::resolve_dropout;

DropoutRule rule_for(double p, uint64_t seed, const MaskShape& shape = {2, 3, 4096, 4096},
                     uint64_t offset = 0) {
  return resolve_dropout(Dropout{p, seed, offset}, shape);
}

TEST(DropoutPhilox, RandomOneTwoThreeKnownAnswers) {
  // Random123's kat_vectors for philox4x32_10: counter, key, expected output.
  using detail::philox4x32_10;
  using W = detail::PhiloxWords;
  EXPECT_EQ(philox4x32_10(W{0, 0, 0, 0}, 0, 0),
            (W{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10(W{~0u, ~0u, ~0u, ~0u}, ~0u, ~0u),
            (W{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10(W{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0xa4093822u,
                          0x299f31d0u),
            (W{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(DropoutRule, ThresholdAndScaleFromP) {
  EXPECT_FALSE(rule_for(0.0, 1).on);
  const DropoutRule tenth = rule_for(0.1, 1);
  EXPECT_TRUE(tenth.on);
  EXPECT_EQ(tenth.threshold, 6554u);  // round(0.1·65536)
  EXPECT_DOUBLE_EQ(tenth.keep_scale, 65536.0 / (65536 - 6554));
  const DropoutRule all = rule_for(1.0, 1);
  EXPECT_EQ(all.threshold, 65536u);
  EXPECT_EQ(all.keep_scale, 0.0);
  EXPECT_FALSE(detail::dropout_keeps(all, 0, 0, 5, 7));
  const DropoutRule seeded = rule_for(0.5, 0x0123456789abcdefull);
  EXPECT_EQ(seeded.key0, 0x89abcdefu);
  EXPECT_EQ(seeded.key1, 0x01234567u);
}

// Every SIMD target Highway built and this CPU runs, one at a time.
template <typename Fn>
void for_each_target(Fn&& check) {
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    check(std::string(hwy::TargetName(target)));
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(DropoutBits, VectorBitsEqualTheDefinitionOnEveryTarget) {
  const DropoutRule rule = rule_for(0.3, 99, {2, 3, 4096, 4096}, 7);
  for_each_target([&](const std::string& target) {
    for (const int64_t kv : {int64_t{0}, int64_t{64}, int64_t{1000}, int64_t{4031}}) {
      for (const int64_t q : {int64_t{0}, int64_t{63}, int64_t{2049}}) {
        const uint32_t bh = 4;  // b = 1, h = 1 of Hq = 3
        const uint64_t row = detail::fused::dropout_row_bits(rule, bh, q, kv);
        uint64_t expected = 0;
        for (int64_t j = 0; j < 64; ++j) {
          expected |= uint64_t{detail::dropout_keeps(rule, 1, 1, q, kv + j)} << j;
        }
        ASSERT_EQ(row, expected) << target << " q=" << q << " kv=" << kv;
        for (const int64_t q_count : {int64_t{64}, int64_t{5}}) {
          std::vector<uint64_t> keep(128, ~uint64_t{0});
          detail::fused::dropout_column_bits(rule, bh, q, q_count, kv, keep.data());
          for (int64_t j = 0; j < 64; ++j) {
            uint64_t column = 0;
            for (int64_t i = 0; i < q_count; ++i) {
              column |= uint64_t{detail::dropout_keeps(rule, 1, 1, q + i, kv + j)} << i;
            }
            ASSERT_EQ(keep[j], column) << target << " q0=" << q << " kv=" << kv << " j=" << j;
          }
        }
      }
    }
  });
}

// The keep rate over the pairs each mask of the sweep allows, for p = 0.1 and 0.5: within 3σ of
// 1 − p', σ = √(p(1 − p)/n), n ≥ 10⁷ allowed pairs per mask (the draws do not depend on the mask,
// so a mask selects a subset of them; these check that no subset the sweep uses is biased).
TEST(DropoutStatistics, KeepRateWithinThreeSigmaForEveryMaskKind) {
  const test::RandomProblem shape(2, 4, 2, 256, 256, 1, 1, 3);
  const int64_t rows = shape.B * shape.Hq * shape.Lq, words = shape.Lk / 64;
  for (const auto& [name, mask] : test::sweep_masks(shape)) {
    const Array<uint8_t> allowed = allowed_pairs(mask, shape.shape());
    std::vector<uint64_t> allowed_bits(rows * words, 0);
    int64_t allowed_count = 0;
    for (int64_t n = 0; n < rows * shape.Lk; ++n) {
      if (allowed.values()[n] == 0) continue;
      allowed_bits[n / 64] |= uint64_t{1} << (n % 64);
      ++allowed_count;
    }
    if (allowed_count == 0) continue;
    for (const double p : {0.1, 0.5}) {
      int64_t kept = 0, pairs = 0;
      for (uint64_t seed = 1; pairs < 10'000'000; ++seed) {
        const DropoutRule rule = rule_for(p, seed * 0x9E3779B97F4A7C15ull, shape.shape());
        for (int64_t row = 0; row < rows; ++row) {
          const auto bh = static_cast<uint32_t>(row / shape.Lq);
          for (int64_t w = 0; w < words; ++w) {
            const uint64_t keep = detail::fused::dropout_row_bits(rule, bh, row % shape.Lq, 64 * w);
            kept += std::popcount(keep & allowed_bits[row * words + w]);
          }
        }
        pairs += allowed_count;
      }
      const double keep_p = 1.0 - rule_for(p, 1).threshold / 65536.0;
      const double rate = static_cast<double>(kept) / pairs;
      const double sigma = std::sqrt(keep_p * (1 - keep_p) / pairs);
      EXPECT_LE(std::fabs(rate - keep_p), 3 * sigma)
          << name << " p=" << p << ": kept " << rate << " of " << pairs << " pairs";
    }
  }
}

// Pearson correlation of the keep indicators of pairs at a fixed offset, over ≥ 10⁷ pairs: under
// independence it is ≈ N(0, 1/n), so |r| ≤ 4/√n fails by chance with probability 6·10⁻⁵ (and the
// seeds are fixed, so the test is deterministic). The offsets are the neighbours a counter-based
// scheme could correlate: the next key (the same Philox word, other half), key + 2 (the same
// instance's next word), + 4 (the next instance), + 32 (the same instance's other words), + 64
// (the next counter group), the next query, the next head, the next seed and the next offset.
TEST(DropoutStatistics, NeighbouringPairsAreUncorrelated) {
  const MaskShape shape{1, 2, 4096, 4096};
  const DropoutRule rule = rule_for(0.5, 12345, shape);
  struct Pairing {
    const char* name;
    DropoutRule other;
    int64_t dh, dq, dkv;
  };
  const std::vector<Pairing> pairings = {
      {"next key (same word)", rule, 0, 0, 1},
      {"key + 2 (same instance)", rule, 0, 0, 2},
      {"key + 4 (next instance)", rule, 0, 0, 4},
      {"key + 32 (same instance, words x2 x3)", rule, 0, 0, 32},
      {"key + 64 (next counter group)", rule, 0, 0, 64},
      {"next query", rule, 0, 1, 0},
      {"next head", rule, 1, 0, 0},
      {"next seed", rule_for(0.5, 12346, shape), 0, 0, 0},
      {"next offset", rule_for(0.5, 12345, shape, 1), 0, 0, 0},
  };
  const int64_t rows = 2048, keys = 4096 - 128;  // 8·10⁶ pairs per pairing
  for (const Pairing& pairing : pairings) {
    double n = 0, sum_a = 0, sum_b = 0, sum_ab = 0;
    for (int64_t q = 0; q < rows; ++q) {
      for (int64_t kv = 0; kv < keys + 64; kv += 64) {
        const uint64_t a = detail::fused::dropout_row_bits(rule, 0, q, kv);
        const uint64_t b = detail::fused::dropout_row_bits(
            pairing.other, static_cast<uint32_t>(pairing.dh), q + pairing.dq, kv + pairing.dkv);
        n += 64;
        sum_a += std::popcount(a);
        sum_b += std::popcount(b);
        sum_ab += std::popcount(a & b);
      }
    }
    const double mean_a = sum_a / n, mean_b = sum_b / n;
    const double r =
        (sum_ab / n - mean_a * mean_b) / std::sqrt(mean_a * (1 - mean_a) * mean_b * (1 - mean_b));
    EXPECT_LE(std::fabs(r), 4 / std::sqrt(n)) << pairing.name << ": r = " << r << " over " << n;
  }
}

}  // namespace
}  // namespace maskattn
