// One allocation carved into the pieces of a kernel's per-thread scratch (f32, or bf16 and bf16
// pairs), each starting on a 64-byte boundary (a cache line, and a whole AVX-512 vector: the
// kernels' aligned loads and the products' row strides rely on it). Each piece is followed by one
// spare cache line, so that pieces whose sizes are multiples of 4 KiB still start at different
// offsets modulo 4 KiB: loads from one piece that look like stores to another in their low 12
// address bits wait for them ("4K aliasing": a measurement of AMX products saw it cost up to
// 60 %). Kept across calls by its owner, because the first touch of a fresh page costs 11–16 µs
// on the project's VM.
//
// A product unit's per-thread operands (ProductUnit::thread_bytes) are the last piece of its
// driver's arena, one untyped workspace; the unit carves its own buffers from it with a
// `ScratchCarver`, by the same rules (64-byte aligned, a spare line after each), from the call's
// head dims, so the unit's layout lives in the unit's file and nowhere else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <vector>

namespace maskattn::detail::fused {

template <typename T>
struct ScratchPiece {
  T** pointer;    // receives the piece's start
  int64_t count;  // its size in elements, rounded up to a cache line here
};

template <typename T>
inline void carve_scratch(std::vector<T>& storage,
                          std::initializer_list<ScratchPiece<std::type_identity_t<T>>> pieces) {
  constexpr int64_t kLine = 64 / sizeof(T);  // elements per cache line
  const auto padded = [](int64_t count) { return (count + kLine - 1) / kLine * kLine + kLine; };
  int64_t total = kLine;  // room to align the start
  for (const auto& piece : pieces) total += padded(piece.count);
  storage.assign(total, T{});
  T* next = storage.data();
  next += (kLine - (reinterpret_cast<uintptr_t>(next) / sizeof(T)) % kLine) % kLine;
  for (const auto& piece : pieces) {
    *piece.pointer = next;
    next += padded(piece.count);
  }
}

// Pieces taken one after another from a 64-byte-aligned workspace, each rounded up to a cache
// line and followed by a spare one, as carve_scratch lays them out. With a null base it hands out
// null pointers and only counts: a unit's thread_bytes runs the same layout function that carves.
class ScratchCarver {
 public:
  explicit ScratchCarver(void* base) : base_(static_cast<std::byte*>(base)) {}

  template <typename T>
  T* take(int64_t count) {
    T* piece = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + bytes_);
    bytes_ += (count * static_cast<int64_t>(sizeof(T)) + 63) / 64 * 64 + 64;
    return piece;
  }
  int64_t bytes() const { return bytes_; }  // taken so far, padding included

 private:
  std::byte* base_;
  int64_t bytes_ = 0;
};

}  // namespace maskattn::detail::fused
