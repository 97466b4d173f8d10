// How a sequence of N rows is cut over P ranks.
//
// contiguous: rank r holds [⌊r·N/P⌋, ⌊(r+1)·N/P⌋). Under a causal mask the last rank attends to
// every earlier key and the first to almost none: the work grows linearly with r.
// zigzag: the sequence is cut into 2P chunks [⌊c·N/2P⌋, ⌊(c+1)·N/2P⌋) and rank r holds chunks r
// and 2P−1−r, an early (cheap) and a late (expensive) one, so causal work is the same on every
// rank (Megatron-LM's context parallelism, ring-flash-attn's zigzag).
//
// Rounding down the cut points makes chunk sizes differ by at most one row whatever N is. Two
// chunks that touch (rank P−1's chunks P−1 and P) are returned as one range, and an empty chunk
// (N < 2P) is left out, so each range is a real block of rows and a single rank (P = 1) holds the
// whole sequence as one range — its ring is exactly one attention() call.
//
// Every rank must hold at least one row: a rank with nothing to compute would still have to relay
// messages and allocate zero-sized tensors, which no caller needs. N < P is an Error (E113), as is
// a zigzag cut of P ≤ N < 2P that leaves a rank empty.
#include <string>

#include "maskattn/error.h"
#include "maskattn/ring.h"

namespace maskattn::dist {
namespace {

int64_t cut_point(int64_t global_len, int64_t index, int64_t pieces) {
  // index·N overflows int64 only for N > 2^62 / pieces: far beyond any sequence.
  return index * global_len / pieces;
}

std::vector<RowRange> ranges_of(int64_t global_len, Layout layout, int rank, int world) {
  std::vector<RowRange> ranges;
  if (layout == Layout::contiguous) {
    ranges.push_back({cut_point(global_len, rank, world), cut_point(global_len, rank + 1, world)});
  } else {
    const int64_t chunks = 2 * int64_t{world};
    const int64_t early = rank, late = chunks - 1 - rank;
    ranges.push_back(
        {cut_point(global_len, early, chunks), cut_point(global_len, early + 1, chunks)});
    RowRange second{cut_point(global_len, late, chunks), cut_point(global_len, late + 1, chunks)};
    if (ranges.back().end == second.first) {
      ranges.back().end = second.end;  // adjacent chunks: one block
    } else {
      ranges.push_back(second);
    }
  }
  std::erase_if(ranges, [](const RowRange& r) { return r.size() == 0; });
  return ranges;
}

}  // namespace

std::vector<RowRange> local_ranges(int64_t global_len, Layout layout, int rank, int world) {
  if (world < 1) {
    throw Error("local_ranges: world = " + std::to_string(world) + " must be ≥ 1");
  }
  if (rank < 0 || rank >= world) {
    throw Error("local_ranges: rank " + std::to_string(rank) + " is outside [0, " +
                std::to_string(world) + ")");
  }
  if (layout != Layout::contiguous && layout != Layout::zigzag) {
    throw Error("local_ranges: unknown layout " + std::to_string(static_cast<int>(layout)));
  }
  if (global_len < world) {
    throw Error("local_ranges: a sequence of " + std::to_string(global_len) +
                " rows cannot be split over " + std::to_string(world) +
                " ranks; each rank needs at least one row");
  }
  // Check every rank, not only `rank`, so that all ranks agree on the error.
  for (int other = 0; other < world; ++other) {
    if (ranges_of(global_len, layout, other, world).empty()) {
      throw Error("local_ranges: a zigzag split of " + std::to_string(global_len) + " rows into " +
                  std::to_string(2 * world) + " chunks leaves rank " + std::to_string(other) +
                  " with no rows; use at least " + std::to_string(2 * world) +
                  " rows or the contiguous layout");
    }
  }
  return ranges_of(global_len, layout, rank, world);
}

int64_t row_count(const std::vector<RowRange>& rows) {
  int64_t count = 0;
  for (const RowRange& range : rows) count += range.size();
  return count;
}

}  // namespace maskattn::dist
