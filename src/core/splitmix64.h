// splitmix64 (Steele, Lea, Flood 2014): a full-period 64-bit generator, one addition and two
// multiplications per draw. The library's seeded draws (BigBird's random blocks, the GPT model's
// initialisation, batches and sampling) use it because its output is fixed by the seed on every
// platform, which std::uniform_int_distribution and friends do not promise. Its whole state is one
// integer, so a checkpoint can save it.
#pragma once

#include <cstdint>

namespace maskattn::detail {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound) by rejection, so that no value is favoured.
  uint64_t below(uint64_t bound) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t draw = next();
    while (draw >= limit) draw = next();
    return draw % bound;
  }
  // Uniform in [0, 1), on a grid of 2^-53.
  double unit() { return static_cast<double>(next() >> 11) * 0x1p-53; }

  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
};

}  // namespace maskattn::detail
