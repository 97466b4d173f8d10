#include "ring_projection.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace maskattn::bench {

const char* ring_mask_name(RingMask mask) {
  switch (mask) {
    case RingMask::dense:
      return "dense";
    case RingMask::causal_zigzag:
      return "causal-zigzag";
    case RingMask::causal_contiguous:
      return "causal-contiguous";
    case RingMask::sliding_window:
      return "sliding-window";
  }
  return "?";
}

namespace {

struct Rows {
  int64_t first = 0, end = 0;
};

// Allowed pairs of queries [q.first, q.end) against keys [k.first, k.end) under
// kpos ≤ qpos ∧ qpos − kpos ≤ window (window = N or more: causal). Row i sees
// [max(k.first, i − W), min(k.end − 1, i)]: at least one key iff k.first ≤ i ≤ k.end − 1 + W, and
// between the breakpoints below its count is linear in i, so each piece sums in closed form —
// the threshold search evaluates sequences of 2^30 tokens per rank.
double banded_rows(Rows q, Rows k, int64_t window) {
  if (k.end <= k.first) return 0;
  std::vector<int64_t> cuts = {q.first, q.end, k.first, k.end, k.first + window, k.end + window};
  for (int64_t& cut : cuts) cut = std::clamp(cut, q.first, q.end);
  std::sort(cuts.begin(), cuts.end());
  const auto count = [&](int64_t i) {
    return static_cast<double>(std::min(k.end - 1, i) - std::max(k.first, i - window) + 1);
  };
  double pairs = 0;
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    const int64_t a = cuts[c], b = cuts[c + 1];
    if (b <= a || a < k.first || a > k.end - 1 + window) continue;
    pairs += (count(a) + count(b - 1)) * static_cast<double>(b - a) / 2;
  }
  return pairs;
}

// The rows a rank holds, as local_ranges() cuts them: contiguous ranks get ⌊r·N/P⌋ boundaries,
// zigzag ranks chunks r and 2P−1−r of 2P.
std::vector<Rows> rank_rows(RingMask mask, int64_t tokens, int rank, int ranks) {
  const auto bound = [&](int64_t part, int64_t parts) { return part * tokens / parts; };
  if (mask != RingMask::causal_zigzag) return {{bound(rank, ranks), bound(rank + 1, ranks)}};
  const int64_t parts = 2 * int64_t{ranks}, mirror = parts - 1 - rank;
  return {{bound(rank, parts), bound(rank + 1, parts)},
          {bound(mirror, parts), bound(mirror + 1, parts)}};
}

// Seconds rank `rank` computes at `step`: its queries against the K/V of rank (rank − step) mod P.
double step_compute(RingMask mask, int64_t tokens, int rank, int step, int ranks,
                    const ModelShape& shape, const Cluster& cluster, const PairCosts& costs) {
  const int source = ((rank - step) % ranks + ranks) % ranks;
  const double seconds_per_pair =
      4.0 * static_cast<double>(shape.dim * shape.q_heads) / cluster.flops;
  double seconds = 0;
  for (const Rows& q : rank_rows(mask, tokens, rank, ranks)) {
    for (const Rows& k : rank_rows(mask, tokens, source, ranks)) {
      const double area =
          static_cast<double>(q.end - q.first) * static_cast<double>(k.end - k.first);
      double pairs = area, weight = 1.0;
      if (mask != RingMask::dense) {
        const bool window = mask == RingMask::sliding_window;
        pairs = banded_rows(q, k, window ? shape.window : tokens);
        if (pairs < area) weight = window ? costs.window_edge : costs.causal_diagonal;
      }
      seconds += pairs * weight * seconds_per_pair;
    }
  }
  return seconds;
}

double message_bytes(int64_t tokens_per_rank, const ModelShape& shape) {
  return 2.0 * static_cast<double>(shape.kv_heads * shape.dim * shape.element_bytes) *
         static_cast<double>(tokens_per_rank);
}

// Per step: the slowest rank's compute (a step no rank computes in is not run).
std::vector<double> step_computes(RingMask mask, int64_t tokens, int ranks, const ModelShape& shape,
                                  const Cluster& cluster, const PairCosts& costs,
                                  double* total_compute, double* slowest_rank) {
  std::vector<double> steps(static_cast<size_t>(ranks), 0.0), per_rank(ranks, 0.0);
  for (int step = 0; step < ranks; ++step) {
    for (int rank = 0; rank < ranks; ++rank) {
      const double seconds = step_compute(mask, tokens, rank, step, ranks, shape, cluster, costs);
      steps[step] = std::max(steps[step], seconds);
      per_rank[rank] += seconds;
    }
  }
  while (steps.size() > 1 && steps.back() == 0) steps.pop_back();
  double total = 0;
  for (double seconds : per_rank) total += seconds;
  *total_compute = total;
  *slowest_rank = *std::max_element(per_rank.begin(), per_rank.end());
  return steps;
}

}  // namespace

double banded_pairs(int64_t q_first, int64_t q_end, int64_t k_first, int64_t k_end,
                    int64_t window) {
  return banded_rows({q_first, q_end}, {k_first, k_end}, window);
}

Projection project(RingMask mask, int64_t tokens, int ranks, const ModelShape& shape,
                   const Cluster& cluster, const PairCosts& costs) {
  Projection p;
  double total_compute = 0, slowest_rank = 0;
  const std::vector<double> steps =
      step_computes(mask, tokens, ranks, shape, cluster, costs, &total_compute, &slowest_rank);
  p.message_bytes = message_bytes((tokens + ranks - 1) / ranks, shape);
  p.message_seconds = cluster.latency + p.message_bytes / cluster.bytes_per_second;
  for (size_t s = 0; s < steps.size(); ++s) {
    const bool sends = s + 1 < steps.size() && ranks > 1;
    p.ring_seconds += sends ? std::max(steps[s], p.message_seconds) : steps[s];
  }
  p.steps = static_cast<int64_t>(steps.size());
  p.mean_step_seconds = p.ring_seconds / static_cast<double>(p.steps);
  p.one_node_seconds = total_compute;
  p.efficiency = p.ring_seconds > 0 ? total_compute / (ranks * p.ring_seconds) : 1.0;
  p.compute_imbalance = total_compute > 0 ? slowest_rank / (total_compute / ranks) - 1 : 0;
  return p;
}

int64_t overlap_threshold(RingMask mask, int ranks, const ModelShape& shape, const Cluster& cluster,
                          const PairCosts& costs) {
  const auto hidden = [&](int64_t per_rank) {
    double total = 0, slowest = 0;
    const std::vector<double> steps =
        step_computes(mask, per_rank * ranks, ranks, shape, cluster, costs, &total, &slowest);
    const double message =
        cluster.latency + message_bytes(per_rank, shape) / cluster.bytes_per_second;
    for (size_t s = 0; s + 1 < steps.size(); ++s) {
      if (steps[s] < message) return false;
    }
    return true;
  };
  int64_t low = 1, high = int64_t{1} << 30;  // hidden(high) decides whether any n is
  if (!hidden(high)) return -1;
  while (low < high) {  // the step compute grows at least as fast as the message with n
    const int64_t middle = low + (high - low) / 2;
    if (hidden(middle)) {
      high = middle;
    } else {
      low = middle + 1;
    }
  }
  return low;
}

double window_break_even(const ModelShape& shape, const Cluster& cluster, const PairCosts& costs) {
  return static_cast<double>(shape.kv_heads * shape.element_bytes) * cluster.flops /
         (2.0 * static_cast<double>(shape.q_heads) * cluster.bytes_per_second * costs.window_edge);
}

}  // namespace maskattn::bench
