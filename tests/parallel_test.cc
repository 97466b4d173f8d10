// The work-item orders and plans of core/parallel.h: which item is dealt when decides whether a
// causal mask's threads finish together and whether a head's K and V are still cached, so the
// orders are pinned here; the runner must run every item once and hand back the first failure.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "core/parallel.h"

namespace maskattn::detail {
namespace {

using Order = std::vector<int64_t>;

TEST(Parallel, LongestFirstKeepsIndexOrderAmongTies) {
  EXPECT_EQ(longest_first_order({3, 5, 3, 7, 5}), (Order{3, 1, 4, 0, 2}));
  EXPECT_EQ(longest_first_order({}), Order{});
}

TEST(Parallel, LongestFirstWithinGroupsDealsGroupByGroup) {
  // Two heads' causal blocks (costs 1..3), planned head by head: each head's longest first, the
  // lower group first whatever the order of the items.
  const std::vector<int64_t> costs = {1, 2, 3, 1, 2, 3};
  const std::vector<int64_t> groups = {1, 1, 1, 0, 0, 0};
  EXPECT_EQ(longest_first_within_groups(costs, groups), (Order{5, 4, 3, 2, 1, 0}));
  // One group is plain longest-first.
  EXPECT_EQ(longest_first_within_groups({3, 5, 3, 7, 5}, {0, 0, 0, 0, 0}),
            longest_first_order({3, 5, 3, 7, 5}));
}

TEST(Parallel, RunInOrderRunsEveryItemOnceOnAnyThreadCount) {
  for (int threads : {1, 2, 3}) {
    std::vector<std::atomic<int>> runs(37);
    Order order(37);
    for (int64_t n = 0; n < 37; ++n) order[n] = 36 - n;
    run_in_order(order, threads, [&](int64_t n) { runs[n] += 1; });
    for (const auto& count : runs) EXPECT_EQ(count.load(), 1) << threads << " threads";
  }
}

TEST(Parallel, RunInOrderHandsBackTheFirstFailure) {
  const Order order = {0, 1, 2, 3};
  EXPECT_THROW(run_in_order(order, 2,
                            [](int64_t n) {
                              if (n == 2) throw std::invalid_argument("item 2");
                            }),
               std::invalid_argument);
}

TEST(Parallel, CostPlanRunsTheLargestItemsAloneOnEveryThread) {
  // Total 100 on 2 threads: an item above 100 / 4 runs alone; one thread keeps everything shared.
  const CostPlan plan = plan_by_cost({60, 10, 10, 20}, 2);
  EXPECT_EQ(plan.alone, Order{0});
  EXPECT_EQ(plan.shared, (Order{1, 2, 3}));
  EXPECT_EQ(plan.costs, (Order{10, 10, 20}));
  EXPECT_TRUE(plan_by_cost({60, 10, 10, 20}, 1).alone.empty());
}

}  // namespace
}  // namespace maskattn::detail
