// How a varlen call spreads its sequences over the threads (varlen.cc's essay): a sequence with a
// large share of the work runs alone on every thread, the others are dealt whole to one thread
// each, longest first. The plan depends on the shapes and the thread count only, and since a
// sequence's bits do not depend on the threads that run it, never changes a result.
#pragma once

#include <cstdint>
#include <utility>
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

using Plan = detail::CostPlan;

// Cost of sequence i: Hq·(Lq·Lk + Lq + Lk) + 1, the pairs at most plus the rows' own work.
inline Plan plan_sequences(const Varlen& v, int64_t heads, const Options& options) {
  std::vector<int64_t> cost(v.batch());
  for (int64_t i = 0; i < v.batch(); ++i) {
    const int64_t lq = query_length(v, i), lk = key_length(v, i);
    cost[i] = heads * (lq * lk + lq + lk) + 1;
  }
  return detail::plan_by_cost(cost, options.threads);
}

// body(i, threads) for every sequence i, as planned (threads: the Options::threads of its call).
// The first exception reaches the caller.
template <typename Body>
void run_plan(const Plan& plan, const Options& options, Body&& body) {
  detail::run_cost_plan(plan, options.threads, std::forward<Body>(body));
}

}  // namespace maskattn::varlen_detail
