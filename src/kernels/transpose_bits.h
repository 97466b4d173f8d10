// A 64 × 64 bit matrix transposed in place: word r's bit c becomes word c's bit r. The tile masks
// come per key and the backward wants them per query; dropout's bits come per query and the
// forward wants them per key.
#pragma once

#include <cstdint>

namespace maskattn::detail::fused {

// Recursive block swap (Hacker's Delight §7-3, bit c of a word = column c): swap the off-diagonal
// 32 × 32 blocks, then the 16 × 16 blocks inside each quadrant, and so on down to single bits.
inline void transpose_bits(uint64_t* bits) {
  uint64_t mask = 0x00000000FFFFFFFFull;
  for (int width = 32; width != 0; width >>= 1, mask ^= mask << width) {
    for (int row = 0; row < 64; row = ((row | width) + 1) & ~width) {
      const uint64_t swap = ((bits[row] >> width) ^ bits[row | width]) & mask;
      bits[row] ^= swap << width;
      bits[row | width] ^= swap;
    }
  }
}

}  // namespace maskattn::detail::fused
