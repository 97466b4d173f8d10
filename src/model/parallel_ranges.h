// The model's loops split over threads with bits that do not depend on the thread count:
// - for_chunks: elementwise work (GELU, zeroing) in fixed chunks of kChunk values, where every
//   element's arithmetic is its own;
// - for_column_ranges: sums over the rows of a [rows, width] matrix into one value per column (a
//   bias's gradient, LayerNorm's parameter gradients, the embeddings' backward): the threads take
//   ranges of columns, never of rows, so each column is still summed over the rows in row order.
//   Run on one thread, with the other waiting, these sums had cost the GPT's training step about a
//   millisecond.
#pragma once

#include <algorithm>
#include <cstdint>

namespace maskattn::model {

// Elements per task. A chunk takes a few microseconds, so a call below two chunks (a decoding
// step's one row) runs on the calling thread rather than wake the team for it.
inline constexpr int64_t kChunk = 16384;

// Calls body(first, size) for chunks [first, first + size) covering [0, count), shared out over
// `threads` (≤ 1: the calling thread alone).
template <class Body>
void for_chunks(int64_t count, int threads, const Body& body) {
  const int64_t chunks = (count + kChunk - 1) / kChunk;
  if (chunks < 2 || threads <= 1) {
    body(0, count);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t c = 0; c < chunks; ++c) body(c * kChunk, std::min(kChunk, count - c * kChunk));
}

// Calls body(first, end) for column ranges [first, end) covering [0, width), kColumns wide (whole
// cache lines of every row), shared out over `threads` (0: one) when the work is worth a region.
template <class Body>
void for_column_ranges(int64_t rows, int64_t width, int threads, const Body& body) {
  constexpr int64_t kColumns = 32;
  const int64_t ranges = (width + kColumns - 1) / kColumns;
#pragma omp parallel for schedule(static) num_threads( \
    threads > 0 ? threads : 1) if (threads != 1 && ranges > 1 && rows * width >= 65536)
  for (int64_t range = 0; range < ranges; ++range) {
    body(range * kColumns, std::min(width, (range + 1) * kColumns));
  }
}

}  // namespace maskattn::model
