// Independent work items of uneven cost on OpenMP threads: the most expensive start first, so that
// no thread is left with a long item at the end while the others wait.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
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

// Runs body(n) for every n < costs.size(), highest cost first, on OpenMP threads; rethrows the
// first exception (from a user predicate or score_fn) on the calling thread. Which thread runs an
// item never changes its arithmetic, so results do not depend on the thread count.
template <typename Body>
void run_longest_first(const std::vector<int64_t>& costs, int requested_threads, Body&& body) {
  const std::vector<int64_t> order = longest_first_order(costs);
  const int threads = static_cast<int>(
      std::min<int64_t>(requested_threads > 0 ? requested_threads : omp_get_max_threads(),
                        static_cast<int64_t>(costs.size())));
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

}  // namespace maskattn::detail
