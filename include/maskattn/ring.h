// Ring (context-parallel) attention without MPI: how a sequence is split over P ranks, and an
// emulator that runs every rank's ring schedule in one process with the distributed code's exact
// arithmetic order — the oracle maskattn::dist::ring_attention (dist/ring_mpi.h) is tested against.
//
// Rank r of P holds the query rows and the key/value rows local_ranges() gives it. At step s it
// holds the K/V rows of rank (r − s) mod P, computes attention of its queries against them in the
// global frame (Options::frame), and merges the parts in a fixed order, so the results are the
// same bits for any thread count and the same as the emulator's. Slice pairs the mask hides
// entirely (any_allowed) are neither computed nor sent.
#pragma once

#include <cstdint>
#include <vector>

#include "maskattn/attention.h"
#include "maskattn/mask.h"
#include "maskattn/score_mods.h"
#include "maskattn/tensor.h"

namespace maskattn::dist {

enum class Layout : uint8_t {
  contiguous,  // rank r holds rows [r·N/P, (r+1)·N/P) (rounded)
  zigzag,      // 2P chunks; rank r holds chunks r and 2P−1−r: equal causal work per rank
};

// Rows [first, end) of the global sequence.
struct RowRange {
  int64_t first = 0, end = 0;
  int64_t size() const { return end - first; }
};

// The global rows rank `rank` of `world` holds, in the order they are stacked locally: one range
// (contiguous) or two (zigzag; one when the two chunks touch, as for rank P−1 and for P = 1).
// Sizes differ by at most one row between chunks, whatever N is. Every rank must hold a row: a
// global_len below `world`, or a zigzag cut of fewer than 2P rows that leaves a rank empty, is an
// Error (E113). Callers use it to place RoPE positions and to cut their inputs.
std::vector<RowRange> local_ranges(int64_t global_len, Layout layout, int rank, int world);
// How many rows the ranges hold (a rank's local length).
int64_t row_count(const std::vector<RowRange>& rows);

struct RingOptions {
  Options base;  // scale, kernel, threads, products; base.frame must be the default
  Layout layout = Layout::zigzag;
  // Fill RingStats::allowed_pairs (otherwise −1), counted with count_allowed (attention.h): exact
  // and O(tiles), a small cost beside the ring's own.
  bool count_allowed_pairs = false;
};

// What one rank did in a ring run (filled when asked for): for benchmarks, docs and the tests
// that check that hidden slice pairs cost nothing.
struct RingStats {
  int64_t pairs_computed = 0;  // (query chunk, key chunk) calls made
  int64_t pairs_skipped = 0;   // calls the mask made unnecessary
  int64_t allowed_pairs = -1;  // (b, h, i, j) pairs this rank's queries attend (load balance;
                               // RingOptions::count_allowed_pairs)
  int64_t bytes_sent = 0;      // K/V (and dK/dV) bytes this rank sent
  double compute_seconds = 0;  // time in attention()/attention_backward()
  double wait_seconds = 0;     // time waiting for messages after compute finished
};

// All P ranks in one process, on the global tensors (q [B,Hq,Nq,D], k/v [B,Hkv,Nk,·], out
// [B,Hq,Nq,Dv]); `stats`, when given, receives one entry per rank.
void ring_emulation(int world, const TensorView& q, const TensorView& k, const TensorView& v,
                    const MutableTensorView& out, const Mask& mask = {}, const ScoreMods& mods = {},
                    const RingOptions& options = {}, const MutableTensorView& lse = {},
                    std::vector<RingStats>* stats = nullptr);

void ring_emulation_backward(int world, const TensorView& q, const TensorView& k,
                             const TensorView& v, const TensorView& out, const TensorView& lse,
                             const TensorView& dout, const Gradients& grads, const Mask& mask = {},
                             const ScoreMods& mods = {}, const RingOptions& options = {},
                             std::vector<RingStats>* stats = nullptr);

}  // namespace maskattn::dist
