// One allocation carved into the f32 pieces of a kernel's per-thread scratch, each starting on a
// 64-byte boundary (a cache line, and a whole AVX-512 vector: the kernels' aligned loads and the
// products' row strides rely on it). Each piece is followed by one spare cache line, so that
// pieces whose sizes are multiples of 4 KiB still start at different offsets modulo 4 KiB: loads
// from one piece that look like stores to another in their low 12 address bits wait for them
// ("4K aliasing"; it cost AMX products up to 60 %, docs/benchmarks.md). Kept across calls by its
// owner, because the first touch of a fresh page costs 11–16 µs on the project's VM.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

namespace maskattn::detail::fused {

struct ScratchPiece {
  float** pointer;  // receives the piece's start
  int64_t floats;   // its size, rounded up to 16 floats here
};

inline void carve_scratch(std::vector<float>& storage, std::initializer_list<ScratchPiece> pieces) {
  const auto padded = [](int64_t floats) { return (floats + 15) / 16 * 16 + 16; };
  int64_t total = 16;  // room to align the start
  for (const ScratchPiece& piece : pieces) total += padded(piece.floats);
  storage.assign(total, 0.0f);
  float* next = storage.data();
  next += (16 - (reinterpret_cast<uintptr_t>(next) / sizeof(float)) % 16) % 16;
  for (const ScratchPiece& piece : pieces) {
    *piece.pointer = next;
    next += padded(piece.floats);
  }
}

}  // namespace maskattn::detail::fused
