// The ring's plan, computed identically on every rank from the global problem (so no rank ever
// waits for a message that is not coming): each rank's query and key blocks, and for each
// (rank, step) the key blocks it holds, the (query block, key block) calls it makes, and the key
// blocks it passes on. The emulator and the MPI code both walk this plan.
//
// Rank r holds at step s the key blocks of origin o = (r − s) mod P. Block b of origin o is useful
// to rank o + t when one of that rank's query blocks has an allowed pair with it (any_allowed on
// the global frame). It travels o → o+1 → … up to its last hop, the largest such t, and no
// further: a chunk no later rank needs is not sent. Under a causal mask with the contiguous layout
// nothing travels past the last rank; under a sliding window narrower than a block, every block
// makes one hop (a neighbour exchange).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "maskattn/ring.h"

namespace maskattn::dist::detail {

struct PairCall {
  int q_block = 0;           // index into the rank's query blocks
  int k_block = 0;           // index into the origin's key blocks
  bool count_sinks = false;  // the one part per query row whose softmax counts mods.sinks
};

struct RingStep {
  int origin = 0;               // whose key/value blocks the rank holds
  std::vector<int> held;        // the origin's blocks held, ascending (step 0: all of them)
  std::vector<PairCall> calls;  // in the fixed order the parts are merged in
  std::vector<int> forwarded;   // held blocks sent on to rank + 1 for the next step
  int64_t skipped = 0;          // (query block, origin's block) pairs the mask hides
};

// Whether the mask allows any pair of query rows `q` and key rows `k` (global rows).
using PairTest = std::function<bool(const RowRange& q, const RowRange& k)>;

class RingSchedule {
 public:
  // `with_sinks`: every query block also calls its own first key block at step 0 (even if the mask
  // hides it) with count_sinks, so each row counts the sinks exactly once.
  RingSchedule(int64_t q_len, int64_t k_len, Layout layout, int world, const PairTest& allowed,
               bool with_sinks);

  int world() const { return world_; }
  const std::vector<RowRange>& q_blocks(int rank) const { return q_blocks_[rank]; }
  const std::vector<RowRange>& k_blocks(int rank) const { return k_blocks_[rank]; }
  // Where a block starts in the rank's stacked local rows.
  int64_t q_local_first(int rank, int block) const;
  int64_t k_local_first(int rank, int block) const;
  int64_t q_rows(int rank) const;
  int64_t k_rows(int rank) const;
  const RingStep& step(int rank, int step) const { return steps_[rank * world_ + step]; }
  // The last step at which block `block` of `origin` is held (0: it never leaves home).
  int last_hop(int origin, int block) const { return last_hop_[origin][block]; }

 private:
  int world_;
  std::vector<std::vector<RowRange>> q_blocks_, k_blocks_;
  std::vector<std::vector<int>> last_hop_;
  std::vector<RingStep> steps_;  // [rank][step]
};

// The schedule of a problem with this mask: pairs tested with any_allowed on the global frame.
RingSchedule make_schedule(const Mask& mask, int64_t batch, int64_t q_heads, int64_t q_len,
                           int64_t k_len, Layout layout, int world, bool with_sinks);

}  // namespace maskattn::dist::detail
