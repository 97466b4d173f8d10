// The block map of a mask program: every (query tile, key tile) block classified empty, full or
// partial by evaluating the program on the block, a 64 × 64 tile at a time (Program::mask_tile),
// so that no Lq × Lk buffer exists at any point: memory is one kind per block.
#pragma once

#include <cstdint>

#include "mask/block_map.h"

namespace maskattn::detail {

// The kinds over [batch, heads, q_tiles, k_tiles] of `map`'s grid (batch or heads 1 when the
// program does not read b or h). Rows of blocks are scanned in parallel; a program that passed
// Program::check cannot fail here.
ScannedKinds scan_program(const BlockMap& map, const Program& program, int64_t batch,
                          int64_t heads);

}  // namespace maskattn::detail
