// bench/ring_projection (the scaling model bench/ring_model prints, docs/distributed.md): the
// closed-form pair counts against counting, and the projections' known limits — a dense or
// zigzag ring above the overlap threshold is 100 % efficient, a contiguous causal ring about
// half, a narrow window needs two steps, and the threshold is the formula's when latency is 0.
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "bench/ring_projection.h"

namespace maskattn::bench {
namespace {

double counted_pairs(int64_t q0, int64_t q1, int64_t k0, int64_t k1, int64_t window) {
  double pairs = 0;
  for (int64_t i = q0; i < q1; ++i) {
    for (int64_t j = k0; j < k1; ++j) pairs += (j <= i && i - j <= window) ? 1 : 0;
  }
  return pairs;
}

TEST(RingProjection, BandedPairsMatchCounting) {
  for (const int64_t window : {0, 1, 3, 7, 100}) {
    for (const auto& [q0, q1, k0, k1] : std::vector<std::array<int64_t, 4>>{
             {0, 10, 0, 10}, {10, 20, 0, 10}, {0, 10, 10, 20}, {5, 17, 3, 9}, {12, 13, 0, 40}}) {
      EXPECT_EQ(banded_pairs(q0, q1, k0, k1, window), counted_pairs(q0, q1, k0, k1, window))
          << q0 << " " << q1 << " " << k0 << " " << k1 << " W=" << window;
    }
  }
}

TEST(RingProjection, EfficiencyAndBalanceOfTheLayouts) {
  const ModelShape shape;  // Hq 32, Hkv 8, D 128, f32, W 4096
  const Cluster cluster;   // 10 TF/s, 12.5 GB/s, 5 us
  const PairCosts costs;   // partial pairs cost what full ones do
  const Projection dense = project(RingMask::dense, 131072, 8, shape, cluster, costs);
  EXPECT_NEAR(dense.efficiency, 1.0, 1e-9);
  EXPECT_EQ(dense.steps, 8);
  // One step's compute: 4·Hq·n²·D / F with n = 16384.
  EXPECT_NEAR(dense.mean_step_seconds, 4.0 * 32 * 16384.0 * 16384 * 128 / 10e12, 1e-9);
  EXPECT_NEAR(dense.message_bytes, 2.0 * 8 * 16384 * 128 * 4, 0.5);

  const Projection zigzag = project(RingMask::causal_zigzag, 131072, 8, shape, cluster, costs);
  EXPECT_NEAR(zigzag.efficiency, 1.0, 1e-3);
  EXPECT_LT(zigzag.compute_imbalance, 1e-3);
  const Projection contiguous =
      project(RingMask::causal_contiguous, 131072, 8, shape, cluster, costs);
  EXPECT_GT(contiguous.efficiency, 0.5);
  EXPECT_LT(contiguous.efficiency, 0.6);
  EXPECT_GT(contiguous.compute_imbalance, 0.5);

  const Projection window = project(RingMask::sliding_window, 131072, 8, shape, cluster, costs);
  EXPECT_EQ(window.steps, 2);  // W = 4096 < n = 16384: own keys and the neighbour's
}

TEST(RingProjection, OverlapThresholdIsTheFormulaWithoutLatency) {
  const ModelShape shape;
  Cluster cluster;
  cluster.latency = 0;
  const PairCosts costs;
  // n ≥ (Hkv/Hq)·bytes·F/(2β) = (8/32)·4·10e12/(2·12.5e9) = 400.
  EXPECT_NEAR(static_cast<double>(overlap_threshold(RingMask::dense, 8, shape, cluster, costs)),
              400, 2);
  EXPECT_NEAR(
      static_cast<double>(overlap_threshold(RingMask::causal_zigzag, 8, shape, cluster, costs)),
      800, 4);
  ModelShape narrow = shape;
  narrow.window = 16;  // below the break-even window of 400: never hidden
  EXPECT_NEAR(window_break_even(narrow, cluster, costs), 400, 1e-9);
  EXPECT_EQ(overlap_threshold(RingMask::sliding_window, 8, narrow, cluster, costs), -1);
}

}  // namespace
}  // namespace maskattn::bench
