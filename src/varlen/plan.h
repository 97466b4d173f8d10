// How a varlen call spreads its sequences over the threads (varlen.cc's essay): a sequence with a
// large share of the work runs alone on every thread, the others are dealt whole to one thread
// each, longest first. The plan depends on the shapes and the thread count only, and since a
// sequence's bits do not depend on the threads that run it, never changes a result.
#pragma once

#include <omp.h>

#include <cstdint>
#include <vector>

#include "core/parallel.h"
#include "maskattn/varlen.h"

namespace maskattn::varlen_detail {

inline int64_t query_length(const Varlen& v, int64_t i) {
  return v.cu_seqlens_q[i + 1] - v.cu_seqlens_q[i];
}
inline int64_t key_length(const Varlen& v, int64_t i) {
  return v.cu_seqlens_k[i + 1] - v.cu_seqlens_k[i];
}

struct Plan {
  std::vector<int64_t> alone;   // run one after another, each on every thread; sequence order
  std::vector<int64_t> shared;  // dealt to one thread each
  std::vector<int64_t> costs;   // of `shared`, in its order
  int threads = 1;              // the call's thread count
};

// Cost of sequence i: Hq·(Lq·Lk + Lq + Lk) + 1, the pairs at most plus the rows' own work.
inline Plan plan_sequences(const Varlen& v, int64_t heads, const Options& options) {
  Plan plan;
  plan.threads = options.threads > 0 ? options.threads : omp_get_max_threads();
  std::vector<int64_t> cost(v.batch());
  int64_t total = 0;
  for (int64_t i = 0; i < v.batch(); ++i) {
    const int64_t lq = query_length(v, i), lk = key_length(v, i);
    cost[i] = heads * (lq * lk + lq + lk) + 1;
    total += cost[i];
  }
  for (int64_t i = 0; i < v.batch(); ++i) {
    // More than 1/(2T) of the work: dealt to one thread it would leave the others idle at the end.
    if (plan.threads > 1 && cost[i] * 2 * plan.threads > total) {
      plan.alone.push_back(i);
    } else {
      plan.shared.push_back(i);
      plan.costs.push_back(cost[i]);
    }
  }
  return plan;
}

// body(i, threads) for every sequence i, as planned (threads: the Options::threads of its call).
// The first exception reaches the caller.
template <typename Body>
void run_plan(const Plan& plan, const Options& options, Body&& body) {
  for (int64_t i : plan.alone) body(i, options.threads);
  detail::run_longest_first(plan.costs, plan.threads, [&](int64_t n) { body(plan.shared[n], 1); });
}

}  // namespace maskattn::varlen_detail
