// local_ranges() and the ring's plan (src/dist/ring_schedule.h), with pair tests written out by
// hand so that they need no mask evaluation: which pairs each rank computes, which blocks travel,
// how far.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "maskattn/ring.h"
#include "ring/ring_rank.h"
#include "ring/ring_schedule.h"
#include "test_util.h"

namespace maskattn::dist {
namespace {

using detail::PairTest;
using detail::RingSchedule;

std::vector<std::pair<int64_t, int64_t>> pairs(const std::vector<RowRange>& ranges) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const RowRange& r : ranges) out.emplace_back(r.first, r.end);
  return out;
}

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

TEST(LocalRanges, ContiguousRoundsTheCutPointsDown) {
  EXPECT_EQ(pairs(local_ranges(10, Layout::contiguous, 0, 3)), (Ranges{{0, 3}}));
  EXPECT_EQ(pairs(local_ranges(10, Layout::contiguous, 1, 3)), (Ranges{{3, 6}}));
  EXPECT_EQ(pairs(local_ranges(10, Layout::contiguous, 2, 3)), (Ranges{{6, 10}}));
}

TEST(LocalRanges, ZigzagPairsAnEarlyAndALateChunk) {
  EXPECT_EQ(pairs(local_ranges(16, Layout::zigzag, 0, 4)), (Ranges{{0, 2}, {14, 16}}));
  EXPECT_EQ(pairs(local_ranges(16, Layout::zigzag, 1, 4)), (Ranges{{2, 4}, {12, 14}}));
  // Rank P−1's chunks P−1 and P touch: one block.
  EXPECT_EQ(pairs(local_ranges(16, Layout::zigzag, 3, 4)), (Ranges{{6, 10}}));
  // One rank holds everything as one block: its ring is one attention() call.
  EXPECT_EQ(pairs(local_ranges(7, Layout::zigzag, 0, 1)), (Ranges{{0, 7}}));
}

TEST(LocalRanges, EveryRowOnceForAnyLengthAndRankCount) {
  for (const Layout layout : {Layout::contiguous, Layout::zigzag}) {
    for (int world = 1; world <= 6; ++world) {
      for (int64_t n = world; n <= 40; ++n) {
        std::vector<int> owner(n, -1);
        bool refused = false;
        for (int rank = 0; rank < world && !refused; ++rank) {
          std::vector<RowRange> ranges;
          try {
            ranges = local_ranges(n, layout, rank, world);
          } catch (const Error&) {
            refused = true;  // a zigzag cut that leaves a rank empty (tested below)
            break;
          }
          ASSERT_FALSE(ranges.empty());
          for (const RowRange& r : ranges) {
            ASSERT_GT(r.size(), 0);
            // Chunk sizes differ by at most one: ⌊N/P⌋ or ⌈N/P⌉ (zigzag: per chunk of 2P).
            const int64_t chunks = layout == Layout::zigzag ? 2 * world : world;
            EXPECT_LE(r.size(), 2 * (n + chunks - 1) / chunks) << n << " " << world;
            for (int64_t i = r.first; i < r.end; ++i) {
              EXPECT_EQ(owner[i], -1) << "row " << i << " twice";
              owner[i] = rank;
            }
          }
        }
        if (refused) {
          EXPECT_EQ(layout, Layout::zigzag);
          EXPECT_LT(n, 2 * world);
          continue;
        }
        for (int64_t i = 0; i < n; ++i) EXPECT_NE(owner[i], -1) << "row " << i << " unowned";
      }
    }
  }
}

// Errors of local_ranges (docs/errors.md E113).
TEST(LocalRanges, RefusesSplitsThatLeaveARankEmpty) {
  EXPECT_MASKATTN_ERROR(local_ranges(3, Layout::contiguous, 0, 4), "3 rows cannot be split over 4",
                        "at least one row");
  EXPECT_MASKATTN_ERROR(local_ranges(5, Layout::zigzag, 0, 4), "leaves rank 2 with no rows");
  EXPECT_MASKATTN_ERROR(local_ranges(8, Layout::zigzag, 0, 0), "world = 0");
  EXPECT_MASKATTN_ERROR(local_ranges(8, Layout::zigzag, 4, 4), "rank 4 is outside [0, 4)");
}

PairTest causal() {
  return [](const RowRange& q, const RowRange& k) { return k.first <= q.end - 1; };
}

TEST(RingSchedule, CausalContiguousSendsNothingAroundTheEnd) {
  const int world = 4;
  const RingSchedule s(64, 64, Layout::contiguous, world, causal(), false);
  for (int origin = 0; origin < world; ++origin)
    EXPECT_EQ(s.last_hop(origin, 0), world - 1 - origin);
  for (int rank = 0; rank < world; ++rank) {
    int64_t calls = 0;
    for (int step = 0; step < world; ++step) calls += s.step(rank, step).calls.size();
    EXPECT_EQ(calls, rank + 1);  // the imbalance zigzag removes
  }
  EXPECT_TRUE(s.step(0, 1).held.empty());  // rank 3's block never wraps to rank 0
  EXPECT_TRUE(s.step(world - 1, 0).forwarded.empty());
}

// (Equal work is checked on allowed pairs in ring_emulation_test; calls differ because rank P−1
// holds its two chunks as one block.)
TEST(RingSchedule, CausalZigzagSkipsHalfOfEachStep) {
  const int world = 4;
  const RingSchedule s(64, 64, Layout::zigzag, world, causal(), false);
  for (int rank = 0; rank < world; ++rank) {
    int64_t calls = 0, skipped = 0;
    for (int step = 0; step < world; ++step) {
      calls += s.step(rank, step).calls.size();
      skipped += s.step(rank, step).skipped;
    }
    if (rank == world - 1) {
      EXPECT_EQ(calls, 1 + (world - 1));  // one block: its own, then one of each origin's two
    } else {
      // 3 of 4 own pairs, 2 of 4 per two-block origin, 1 of 2 against rank P−1's block.
      EXPECT_EQ(calls, 3 + 2 * (world - 2) + 1) << rank;
    }
    EXPECT_GT(skipped, 0);
  }
}

TEST(RingSchedule, ANarrowSlidingWindowIsANeighbourExchange) {
  const int world = 4;
  const int64_t window = 5;  // keys [i − 5, i]; blocks of 16 rows
  const PairTest sliding = [&](const RowRange& q, const RowRange& k) {
    return k.first <= q.end - 1 && k.end - 1 >= q.first - window;
  };
  const RingSchedule s(64, 64, Layout::contiguous, world, sliding, false);
  for (int origin = 0; origin < world; ++origin)
    EXPECT_EQ(s.last_hop(origin, 0), origin + 1 < world ? 1 : 0);
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_EQ(s.step(rank, 0).forwarded.size(), rank + 1 < world ? 1u : 0u);
    for (int step = 1; step < world; ++step) EXPECT_TRUE(s.step(rank, step).forwarded.empty());
  }
}

TEST(RingSchedule, DenseSendsEveryBlockAllTheWay) {
  const int world = 3;
  const PairTest dense = [](const RowRange&, const RowRange&) { return true; };
  const RingSchedule s(30, 20, Layout::zigzag, world, dense, false);
  for (int rank = 0; rank < world; ++rank) {
    for (int step = 0; step < world; ++step) {
      const auto& plan = s.step(rank, step);
      EXPECT_EQ(plan.origin, (rank - step + world) % world);
      EXPECT_EQ(plan.held.size(), s.k_blocks(plan.origin).size());
      EXPECT_EQ(plan.calls.size(), s.q_blocks(rank).size() * plan.held.size());
      EXPECT_EQ(plan.forwarded.size(), step + 1 < world ? plan.held.size() : 0u);
    }
  }
}

TEST(RingSchedule, SinksAreCountedInOneCallPerQueryBlock) {
  const int world = 3;
  const PairTest none = [](const RowRange&, const RowRange&) { return false; };
  const RingSchedule s(30, 30, Layout::zigzag, world, none, true);
  for (int rank = 0; rank < world; ++rank) {
    std::vector<int> sink_calls(s.q_blocks(rank).size(), 0);
    for (int step = 0; step < world; ++step) {
      for (const auto& call : s.step(rank, step).calls) {
        EXPECT_EQ(step, 0);
        EXPECT_TRUE(call.count_sinks);
        ++sink_calls[call.q_block];
      }
    }
    for (int count : sink_calls) EXPECT_EQ(count, 1);
  }
}

// The ring's in-place two-part merge is merge_partials, bit for bit, including rows with no key
// (−inf) on either side and NaN.
TEST(RingMerge, IsMergePartialsBitForBit) {
  const int64_t rows = 64, width = 8;
  detail::F32Tensor acc_out({1, 1, rows, width}, 0), acc_lse({1, 1, rows}, 0);
  detail::F32Tensor part_out({1, 1, rows, width}, 0), part_lse({1, 1, rows}, 0);
  acc_out.values = test::random_values(rows * width, 1, -3, 3);
  part_out.values = test::random_values(rows * width, 2, -3, 3);
  acc_lse.values = test::random_values(rows, 3, -20, 20);
  part_lse.values = test::random_values(rows, 4, -20, 20);
  acc_lse.values[1] = part_lse.values[2] = -INFINITY;
  acc_lse.values[3] = part_lse.values[3] = -INFINITY;
  acc_lse.values[4] = NAN;
  part_lse.values[5] = 80.0f;  // one weight underflows to 0
  detail::F32Tensor want_out({1, 1, rows, width}, 0), want_lse({1, 1, rows}, 0);
  merge_partials({{acc_out.view(), acc_lse.view()}, {part_out.view(), part_lse.view()}},
                 want_out.mutable_view(), want_lse.mutable_view());
  detail::merge_into(acc_out, acc_lse, part_out, part_lse);
  EXPECT_EQ(std::memcmp(acc_out.values.data(), want_out.values.data(), rows * width * 4), 0);
  EXPECT_EQ(std::memcmp(acc_lse.values.data(), want_lse.values.data(), rows * 4), 0);
}

}  // namespace
}  // namespace maskattn::dist
