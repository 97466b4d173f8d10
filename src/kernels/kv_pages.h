// K and V read through block tables (a paged KV cache, maskattn/paged_kv_cache.h) as the kernels
// see them: for batch entry b, kv head g and key j, the row of bytes in the pool, in the cache's
// format (maskattn/kv_format.h). A Problem with `pages` set has k and v views of the right shape
// whose rows are all one zero row (so that code unaware of pages reads zeros, never the pool); the
// kernels that read K and V ask `pages` instead.
//
// A tile of keys is read as runs: positions [j, run_end) inside one block are `position_bytes`
// apart; positions past the sequence's last block are the zero row (every format decodes an
// all-zero row to zeros), stride 0. The last block's rows past the sequence's length are read as
// they are (finite: append() stores nothing else, and a fresh pool is zeros) and hidden by the
// mask. Block sizes are multiples of 16, so a 64-key tile is at most 4 runs plus the zero run,
// and every run but the last is a multiple of 16 keys long: the row kernel's four-key groups
// never straddle two runs, which keeps paged results bitwise equal to contiguous ones.
#pragma once

#include <algorithm>
#include <cstdint>

#include "maskattn/kv_format.h"

namespace maskattn::detail {

struct KVPages {
  KVFormat format = KVFormat::f32;
  // Row (block, position p, kv head g) of K sits at key_pool + block·key_block_bytes +
  // g·key_head_bytes + p·key_position_bytes (likewise V): any layout of the three axes.
  const uint8_t* key_pool = nullptr;
  const uint8_t* value_pool = nullptr;
  int64_t key_row_bytes = 0, value_row_bytes = 0;
  int64_t key_block_bytes = 0, key_head_bytes = 0, key_position_bytes = 0;
  int64_t value_block_bytes = 0, value_head_bytes = 0, value_position_bytes = 0;
  int64_t block_size = 0;
  const int32_t* table = nullptr;  // [B][table_stride] pool blocks
  int64_t table_stride = 0;
  const int64_t* lengths = nullptr;   // [B] positions each sequence holds
  const uint8_t* zero_row = nullptr;  // max(row bytes) zero bytes

  int64_t row_bytes(bool keys) const { return keys ? key_row_bytes : value_row_bytes; }
  int64_t position_bytes(bool keys) const {
    return keys ? key_position_bytes : value_position_bytes;
  }

  // Positions the sequence's blocks hold (its length rounded up to whole blocks).
  int64_t held(int64_t b) const { return (lengths[b] + block_size - 1) / block_size * block_size; }

  const uint8_t* row(bool keys, int64_t b, int64_t g, int64_t j) const {
    if (j >= held(b)) return zero_row;
    const int64_t block = table[b * table_stride + j / block_size];
    return keys ? key_pool + block * key_block_bytes + g * key_head_bytes +
                      j % block_size * key_position_bytes
                : value_pool + block * value_block_bytes + g * value_head_bytes +
                      j % block_size * value_position_bytes;
  }
  // The end of the run that starts at key j (≤ end): the block's end, or end past the blocks.
  int64_t run_end(int64_t b, int64_t j, int64_t end) const {
    if (j >= held(b)) return end;
    return std::min(end, (j / block_size + 1) * block_size);
  }
  // Calls fn(first row, first key, end key, bytes between rows) for each run of [j, end): runs
  // after the first start at a block's edge, so one division finds them all (a row kernel's tile
  // over blocks of 16 is four runs, and a division per run showed in its profile).
  template <typename Fn>
  void for_each_run(bool keys, int64_t b, int64_t g, int64_t j, int64_t end, Fn&& fn) const {
    const int64_t held_end = std::min(end, held(b));
    int64_t block = j / block_size, offset = j - block * block_size;
    const uint8_t* pool = keys ? key_pool : value_pool;
    const int64_t block_bytes = keys ? key_block_bytes : value_block_bytes;
    const int64_t head = g * (keys ? key_head_bytes : value_head_bytes);
    const int64_t position = position_bytes(keys);
    while (j < held_end) {
      const int64_t run_end = std::min(held_end, (block + 1) * block_size);
      fn(pool + table[b * table_stride + block] * block_bytes + head + offset * position, j,
         run_end, position);
      j = run_end;
      ++block;
      offset = 0;
    }
    if (j < end) fn(zero_row, j, end, int64_t{0});
  }
  // Bytes between the rows of the run starting at j.
  int64_t run_stride(bool keys, int64_t b, int64_t j) const {
    return j >= held(b) ? 0 : position_bytes(keys);
  }
};

}  // namespace maskattn::detail
