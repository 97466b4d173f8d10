// The scaling model of ring attention (docs/distributed.md, "Scaling model"): what one forward
// pass of a ring over P ranks costs on a cluster whose nodes compute at F flop/s and whose links
// move β bytes/s after a latency α.
//
// The ring runs in lockstep: at step s every rank computes its queries against the K/V it holds
// while the K/V for step s + 1 travel to it, so a step lasts max(compute, α + M/β) on the slowest
// rank, and the last step sends nothing. A step in which no rank has an allowed pair is not run
// and sends nothing (maskattn skips what the mask hides). The merge of partial results is O(n·Dv)
// against the step's O(n²·D) and is left out (bench/ring_model prints what it costs here).
//
// Compute is counted in allowed (query, key) pairs, 2·(D + Dv) flops each per query head, and
// weighted by what a pair costs in its kind of slice pair relative to a fully allowed one
// (`PairCosts`): bench/ring_model measures these weights on this machine, because a partially
// masked slice (the causal diagonal, a window's edge) runs its partial tiles more slowly.
#pragma once

#include <cstdint>
#include <string>

namespace maskattn::bench {

enum class RingMask : uint8_t {
  dense,              // every pair allowed
  causal_zigzag,      // causal, rank r holds chunks r and 2P−1−r of 2P
  causal_contiguous,  // causal, rank r holds rows [r·n, (r+1)·n)
  sliding_window,     // window(W, 0), contiguous layout
};
const char* ring_mask_name(RingMask mask);

// The attention shape: Hq query heads, Hkv kv heads, head dim D (= Dv), bytes per K/V element.
struct ModelShape {
  int64_t q_heads = 32, kv_heads = 8, dim = 128;
  int64_t element_bytes = 4;
  int64_t window = 4096;  // W for sliding_window: qpos − W ≤ kpos ≤ qpos
};

// The cluster: node compute rate on fully allowed slice pairs, link bandwidth and latency.
struct Cluster {
  double flops = 10e12;              // F, flop/s per node (one rank per node)
  double bytes_per_second = 12.5e9;  // β
  double latency = 5e-6;             // α, seconds per message
};

// Seconds per allowed pair in a partially allowed slice pair, relative to a fully allowed one.
struct PairCosts {
  double causal_diagonal = 1.0;
  double window_edge = 1.0;
};

struct Projection {
  double one_node_seconds = 0;  // the whole problem on one node (same pair costs)
  double ring_seconds = 0;      // Σ over steps of the slowest rank's max(compute, message)
  double mean_step_seconds = 0;
  int64_t steps = 0;             // steps that compute something
  double message_bytes = 0;      // K and V of one rank (one message)
  double message_seconds = 0;    // α + M/β
  double efficiency = 0;         // one_node_seconds / (P · ring_seconds)
  double compute_imbalance = 0;  // slowest rank's compute / mean rank's compute − 1
};

// Allowed pairs of queries [q_first, q_end) against keys [k_first, k_end) under causal with a
// window: kpos ≤ qpos and qpos − kpos ≤ window (window ≥ N: causal). Closed form, O(1).
double banded_pairs(int64_t q_first, int64_t q_end, int64_t k_first, int64_t k_end, int64_t window);

// The forward of one layer over N tokens (B = 1) on P ranks.
Projection project(RingMask mask, int64_t tokens, int ranks, const ModelShape& shape,
                   const Cluster& cluster, const PairCosts& costs);

// Smallest tokens per rank n at which every step's compute covers its message (communication
// hidden), searched over n ≤ 2^30 with P = `ranks`; −1 when no n does (sliding window: a window
// narrower than the break-even width hides nothing, however long the sequence).
int64_t overlap_threshold(RingMask mask, int ranks, const ModelShape& shape, const Cluster& cluster,
                          const PairCosts& costs);

// The sliding window's break-even width: compute of a step ≈ n·W pairs, message ∝ n, so the
// message is hidden iff W ≥ (Hkv/Hq)·bytes·F / (2·β·window_edge cost) (latency aside).
double window_break_even(const ModelShape& shape, const Cluster& cluster, const PairCosts& costs);

}  // namespace maskattn::bench
