// Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3", SC'11),
// the counter-based generator of attention dropout: four 32-bit words out, a pure function of a
// 128-bit counter and a 64-bit key. Nothing is carried from one draw to the next, so any pair's
// draw can be computed by any thread in any order — which is what lets the forward and the
// backward, every tiling and every rank of a ring drop the same pairs without storing them.
//
// Why Philox: it is the generator PyTorch's and JAX's GPU dropout use (so its statistics are the
// field's reference), it passes TestU01's BigCrush with margin at 10 rounds (7 suffice), and its
// round is two 32×32→64 multiplications and XORs, which SIMD units do well (kernels/dropout-inl.h
// runs eight instances per AVX-512 vector). This scalar form is the definition the vector code is
// tested against bit for bit; tests/dropout_test.cc pins it to Random123's known-answer vectors.
#pragma once

#include <array>
#include <cstdint>

namespace maskattn::detail {

using PhiloxWords = std::array<uint32_t, 4>;

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;  // the round multipliers
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // the key schedule's increments (golden ratio,
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // √3 − 1)
inline constexpr int kPhiloxRounds = 10;

// One round: (c0, c1, c2, c3) → (hi(M1·c2) ^ c1 ^ k0, lo(M1·c2), hi(M0·c0) ^ c3 ^ k1, lo(M0·c0)).
constexpr PhiloxWords philox_round(const PhiloxWords& c, uint32_t k0, uint32_t k1) {
  const uint64_t p0 = uint64_t{kPhiloxM0} * c[0];
  const uint64_t p1 = uint64_t{kPhiloxM1} * c[2];
  return {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0, static_cast<uint32_t>(p1),
          static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1, static_cast<uint32_t>(p0)};
}

constexpr PhiloxWords philox4x32_10(PhiloxWords counter, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    counter = philox_round(counter, k0, k1);
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return counter;
}

}  // namespace maskattn::detail
