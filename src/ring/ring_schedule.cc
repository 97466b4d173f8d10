#include "ring/ring_schedule.h"

namespace maskattn::dist::detail {
namespace {

int64_t stacked_first(const std::vector<RowRange>& blocks, int block) {
  int64_t first = 0;
  for (int b = 0; b < block; ++b) first += blocks[b].size();
  return first;
}

}  // namespace

RingSchedule::RingSchedule(int64_t q_len, int64_t k_len, Layout layout, int world,
                           const PairTest& allowed, bool with_sinks)
    : world_(world) {
  for (int rank = 0; rank < world; ++rank) {
    q_blocks_.push_back(local_ranges(q_len, layout, rank, world));
    k_blocks_.push_back(local_ranges(k_len, layout, rank, world));
  }
  // needed[r][o][b]: one of rank r's query blocks has an allowed pair with block b of origin o.
  // allowed_pair[r][a][o][b] is kept for the calls. The tests are O(P²) any_allowed calls, each
  // O(tiles): small next to one step's compute.
  std::vector<std::vector<std::vector<std::vector<char>>>> allowed_pair(world);
  last_hop_.assign(world, {});
  for (int origin = 0; origin < world; ++origin)
    last_hop_[origin].assign(k_blocks_[origin].size(), 0);
  for (int rank = 0; rank < world; ++rank) {
    allowed_pair[rank].resize(q_blocks_[rank].size());
    for (size_t a = 0; a < q_blocks_[rank].size(); ++a) {
      allowed_pair[rank][a].resize(world);
      for (int origin = 0; origin < world; ++origin) {
        const int hop = (rank - origin + world) % world;
        for (size_t b = 0; b < k_blocks_[origin].size(); ++b) {
          const bool yes = allowed(q_blocks_[rank][a], k_blocks_[origin][b]);
          allowed_pair[rank][a][origin].push_back(yes);
          if (yes && hop > last_hop_[origin][b]) last_hop_[origin][b] = hop;
        }
      }
    }
  }
  steps_.resize(static_cast<size_t>(world) * world);
  for (int rank = 0; rank < world; ++rank) {
    for (int s = 0; s < world; ++s) {
      RingStep& plan = steps_[rank * world + s];
      plan.origin = (rank - s + world) % world;
      const int blocks = static_cast<int>(k_blocks_[plan.origin].size());
      for (int b = 0; b < blocks; ++b) {
        if (s == 0 || last_hop_[plan.origin][b] >= s) plan.held.push_back(b);
        if (last_hop_[plan.origin][b] > s) plan.forwarded.push_back(b);
      }
      for (int a = 0; a < static_cast<int>(q_blocks_[rank].size()); ++a) {
        for (int b = 0; b < blocks; ++b) {
          const bool allowed_here = allowed_pair[rank][a][plan.origin][b];
          if (!allowed_here) ++plan.skipped;  // held or not: the mask hides the pair
          const bool sink_part = with_sinks && s == 0 && b == 0;
          if (allowed_here || sink_part) plan.calls.push_back({a, b, sink_part});
        }
      }
    }
  }
}

int64_t RingSchedule::q_local_first(int rank, int block) const {
  return stacked_first(q_blocks_[rank], block);
}
int64_t RingSchedule::k_local_first(int rank, int block) const {
  return stacked_first(k_blocks_[rank], block);
}
int64_t RingSchedule::q_rows(int rank) const {
  return row_count(q_blocks_[rank]);
}
int64_t RingSchedule::k_rows(int rank) const {
  return row_count(k_blocks_[rank]);
}

RingSchedule make_schedule(const Mask& mask, int64_t batch, int64_t q_heads, int64_t q_len,
                           int64_t k_len, Layout layout, int world, bool with_sinks) {
  const PairTest test = [&](const RowRange& q, const RowRange& k) {
    const MaskShape shape{batch, q_heads, q.size(), k.size()};
    return any_allowed(mask, shape, Frame{q.first, k.first, q_len, k_len});
  };
  return RingSchedule(q_len, k_len, layout, world, test, with_sinks);
}

}  // namespace maskattn::dist::detail
