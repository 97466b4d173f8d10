// The one seeded generator (core/splitmix64.h) and the seeded outputs built on it, pinned to fixed
// values: a change of platform, standard library or compiler must not drift a seed's masks or
// weights silently. When a change of these values is intended, the new values go here with the
// reason in the commit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/splitmix64.h"
#include "diagnostics/audit_sample.h"
#include "maskattn/multihead.h"
#include "maskattn/tokens.h"

namespace maskattn {
namespace {

using detail::NormalDraws;
using detail::SplitMix64;

TEST(Random, SplitMix64MatchesThePublishedSequence) {
  // The reference implementation's first outputs from state 0 (Vigna's splitmix64.c).
  SplitMix64 random(0);
  EXPECT_EQ(random.next(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(random.next(), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(random.next(), 0x06C45D188009454Full);
}

TEST(Random, DrawsArePinned) {
  SplitMix64 random(2026);
  std::vector<uint64_t> below;
  for (int n = 0; n < 6; ++n) below.push_back(random.below(10));
  EXPECT_EQ(below, (std::vector<uint64_t>{1, 1, 4, 6, 1, 9}));
  std::vector<int64_t> between;
  for (int n = 0; n < 6; ++n) between.push_back(random.between(-3, 3));
  EXPECT_EQ(between, (std::vector<int64_t>{-3, 1, 2, 3, -1, 3}));
  EXPECT_EQ(random.unit(), 0x1.46558a106299ep-2);
  EXPECT_EQ(random.uniform(-1.0, 1.0), -0x1.c1244d5fb8cb8p-2);
  std::vector<int> order(8);
  std::iota(order.begin(), order.end(), 0);
  random.shuffle(order.begin(), order.end());
  EXPECT_EQ(order, (std::vector<int>{4, 0, 5, 3, 2, 6, 7, 1}));
  NormalDraws normal(7);  // libm's log, sin and cos: equal within an ulp or so
  EXPECT_NEAR(normal.next(), 1.3649922974572284, 1e-12);
  EXPECT_NEAR(normal.next(), 0.14452122126941497, 1e-12);
}

TEST(Random, DrawsHaveTheirDistributions) {
  SplitMix64 random(1);
  constexpr int kDraws = 100000;
  std::vector<int> counts(7, 0);
  double sum = 0, low = 1, high = -1;
  for (int n = 0; n < kDraws; ++n) {
    ++counts[random.between(-3, 3) + 3];
    const double x = random.uniform(-1.0, 1.0);
    sum += x;
    low = std::min(low, x);
    high = std::max(high, x);
  }
  for (int count : counts) EXPECT_NEAR(count, kDraws / 7.0, 5 * std::sqrt(kDraws / 7.0));
  EXPECT_NEAR(sum / kDraws, 0.0, 5 * std::sqrt(1.0 / 3.0 / kDraws));  // uniform(-1,1): var 1/3
  EXPECT_GE(low, -1.0);
  EXPECT_LT(high, 1.0);
  // Every position of a shuffled 4-element list takes every value about equally often.
  std::vector<int> first(4, 0);
  for (int n = 0; n < 40000; ++n) {
    std::vector<int> order = {0, 1, 2, 3};
    random.shuffle(order.begin(), order.end());
    ++first[order[0]];
  }
  for (int count : first) EXPECT_NEAR(count, 10000, 5 * std::sqrt(10000.0 * 0.75));
  NormalDraws normal(3);
  double mean = 0, square = 0;
  for (int n = 0; n < kDraws; ++n) {
    const double x = normal.next();
    mean += x;
    square += x * x;
  }
  EXPECT_NEAR(mean / kDraws, 0.0, 5 / std::sqrt(kDraws));
  EXPECT_NEAR(square / kDraws, 1.0, 5 * std::sqrt(2.0 / kDraws));
}

TEST(Random, MlmMaskingIsPinned) {
  std::vector<int64_t> ids(24);
  std::iota(ids.begin(), ids.end(), 10);  // real words (ids beyond the special tokens)
  const MlmExample example = mlm_masking(Array<int64_t>({2, 12}, ids), 50, 11, 0.5);
  EXPECT_EQ(example.inputs.values(),
            (std::vector<int64_t>{6,  11, 12, 6, 6,  15, 6,  17, 18, 19, 6,  21,
                                  22, 23, 48, 6, 26, 27, 28, 29, 30, 6,  32, 33}));
  EXPECT_EQ(
      example.labels.values(),
      (std::vector<int64_t>{10,   -100, -100, 13, 14,   15,   16,   -100, -100, -100, 20,   -100,
                            -100, -100, 24,   25, -100, -100, -100, 29,   -100, 31,   -100, 33}));
}

TEST(Random, MaePatchMaskingIsPinned) {
  EXPECT_EQ(mae_patch_masking(16, 0.75, 5).kept, (std::vector<int64_t>{2, 7, 12, 15}));
}

TEST(Random, AuditSampleIsPinned) {
  const std::vector<float> sample = detail::audit_sample(1, 4);
  EXPECT_EQ(sample,
            (std::vector<float>{0x1.10a2dep-3f, 0x1.f75c6ep-2f, 0x1.e24e8cp-1f, -0x1.c7cf2ep-4f}));
}

TEST(Random, LayerWeightsArePinned) {
  const MultiHeadAttention layer = MultiHeadAttention::random(8, 2, 0, 2026);
  const std::vector<float>& q = layer.weights().q_weight.values();
  EXPECT_EQ(std::vector<float>(q.begin(), q.begin() + 4),
            (std::vector<float>{0x1.031d38p-2f, -0x1.48b418p-6f, 0x1.e4aecap-4f, -0x1.4dba9cp-4f}));
  EXPECT_EQ(layer.weights().out_bias.values().back(), 0x1.03eff6p-2f);
}

}  // namespace
}  // namespace maskattn
