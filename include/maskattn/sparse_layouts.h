// Builders of the common block-sparse layouts for Mask::block_sparse (docs/semantics.md §14).
//
// Each returns a uint8 layout [blocks, blocks] (or [heads, blocks, blocks] when heads > 0), 1 = the
// block of queries may attend the block of keys. Block indices count from the first block; the
// block size is the caller's (Mask::block_sparse(layout, block, block)).
#pragma once

#include <cstdint>

#include "maskattn/array.h"

namespace maskattn {

// BigBird (Zaheer et al. 2020, ITC form; Hugging Face's block_sparse attention): every block row
// sees its `sliding_blocks` neighbours centred on itself, the global blocks see and are seen by
// every block, and each other row sees `random_blocks` more blocks drawn without repetition from
// those it does not see yet (fewer when fewer remain). Global blocks are the first
// ⌈global_blocks / 2⌉ and the last ⌊global_blocks / 2⌋ blocks, so global_blocks = 2 is Hugging
// Face's first and last block. The draw is a fixed function of `seed` (and of the head when
// heads > 0: each head draws its own blocks), the same on every machine.
struct BigBirdLayout {
  int64_t sliding_blocks = 3;  // odd: the row's own block and (sliding_blocks − 1) / 2 each side
  int64_t global_blocks = 2;
  int64_t random_blocks = 3;
  uint64_t seed = 0;
};
Array<uint8_t> bigbird_layout(int64_t blocks, const BigBirdLayout& config = {}, int64_t heads = 0);

// The Sparse Transformer's factorised patterns (Child et al. 2019), on blocks.
// Strided: row r sees the `local_blocks` blocks c with |r − c| < local_blocks, and every block c
// with (r − c) mod stride == 0 (the "column" heads); causal keeps c ≤ r.
Array<uint8_t> strided_layout(int64_t blocks, int64_t local_blocks, int64_t stride,
                              bool causal = true, int64_t heads = 0);
// Fixed: row r sees the blocks of its own chunk of `chunk_blocks` blocks, and the last
// `summary_blocks` blocks of every chunk (the summary columns); causal keeps c ≤ r.
Array<uint8_t> fixed_layout(int64_t blocks, int64_t chunk_blocks, int64_t summary_blocks,
                            bool causal = true, int64_t heads = 0);

}  // namespace maskattn
