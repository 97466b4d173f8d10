// Independent work items of uneven cost on OpenMP threads: the most expensive start first, so that
// no thread is left with a long item at the end while the others wait.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <utility>
#include <vector>

namespace maskattn::detail {

// The order run_longest_first deals items in: by cost, highest first, ties in index order.
inline std::vector<int64_t> longest_first_order(const std::vector<int64_t>& costs) {
  std::vector<int64_t> order(costs.size());
  for (size_t n = 0; n < order.size(); ++n) order[n] = static_cast<int64_t>(n);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return costs[a] > costs[b]; });
  return order;
}

// Items that read the same data (one kv head's K and V) share a group: group by group, lowest
// first, and by cost, highest first, within each; ties in index order. Dealt by cost alone, a
// causal mask's longest items are one block of every head, so consecutive items cycle through all
// heads' K and V; at N = 8192 with 8 heads that is 32 MiB, more than the L3 holds, and causal fell
// to 0.60–0.63 of dense where 0.52 is its share of the work. In this order each group's K and V
// stay cached while its blocks run, and the last items dealt are still short ones (the last
// group's), so the threads still finish together.
inline std::vector<int64_t> longest_first_within_groups(const std::vector<int64_t>& costs,
                                                        const std::vector<int64_t>& groups) {
  std::vector<int64_t> order(costs.size());
  for (size_t n = 0; n < order.size(); ++n) order[n] = static_cast<int64_t>(n);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return groups[a] != groups[b] ? groups[a] < groups[b] : costs[a] > costs[b];
  });
  return order;
}

// Runs body(order[n]) for every n on OpenMP threads, dealt in that order; rethrows the first
// exception (from a user predicate or score_fn) on the calling thread. Which thread runs an item
// never changes its arithmetic, so results do not depend on the thread count.
template <typename Body>
void run_in_order(const std::vector<int64_t>& order, int requested_threads, Body&& body) {
  const int threads = static_cast<int>(
      std::min<int64_t>(requested_threads > 0 ? requested_threads : omp_get_max_threads(),
                        static_cast<int64_t>(order.size())));
  std::exception_ptr failure;
  std::atomic<bool> failed{false};
#pragma omp parallel for schedule(dynamic, 1) num_threads(std::max(threads, 1))
  for (size_t n = 0; n < order.size(); ++n) {
    if (failed.load(std::memory_order_relaxed)) continue;
    try {
      body(order[n]);
    } catch (...) {
#pragma omp critical(maskattn_work_item_failure)
      if (!failure) failure = std::current_exception();
      failed = true;
    }
  }
  if (failure) std::rethrow_exception(failure);
}

// run_in_order over longest_first_order(costs): the most expensive items first.
template <typename Body>
void run_longest_first(const std::vector<int64_t>& costs, int requested_threads, Body&& body) {
  run_in_order(longest_first_order(costs), requested_threads, std::forward<Body>(body));
}

// Items of uneven cost, each of which can run on any number of threads (a call on one sequence of
// a batch): an item with more than 1/(2T) of the total cost, with T threads, runs alone on every
// thread (dealt to one thread it would leave the others idle at the end); the others are dealt
// whole to one thread each, longest first (run_longest_first). The plan depends on the costs and
// the thread count only.
struct CostPlan {
  std::vector<int64_t> alone;   // run one after another, each on every thread; index order
  std::vector<int64_t> shared;  // dealt to one thread each
  std::vector<int64_t> costs;   // of `shared`, in its order
  int threads = 1;              // the call's thread count
};

// `requested_threads`: Options::threads (0 = OpenMP's default).
inline CostPlan plan_by_cost(const std::vector<int64_t>& cost, int requested_threads) {
  CostPlan plan;
  plan.threads = requested_threads > 0 ? requested_threads : omp_get_max_threads();
  int64_t total = 0;
  for (int64_t c : cost) total += c;
  for (size_t n = 0; n < cost.size(); ++n) {
    if (plan.threads > 1 && cost[n] * 2 * plan.threads > total) {
      plan.alone.push_back(static_cast<int64_t>(n));
    } else {
      plan.shared.push_back(static_cast<int64_t>(n));
      plan.costs.push_back(cost[n]);
    }
  }
  return plan;
}

// body(n, threads) for every item n, as planned (threads: the Options::threads of its call,
// `requested_threads` for the items run alone, 1 for the others). The first exception reaches the
// caller.
template <typename Body>
void run_cost_plan(const CostPlan& plan, int requested_threads, Body&& body) {
  for (int64_t n : plan.alone) body(n, requested_threads);
  run_longest_first(plan.costs, plan.threads, [&](int64_t m) { body(plan.shared[m], 1); });
}

}  // namespace maskattn::detail
