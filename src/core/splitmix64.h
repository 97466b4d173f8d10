// splitmix64 (Steele, Lea, Flood 2014): a full-period 64-bit generator, one addition and two
// multiplications per draw, and the one source of every seeded draw in maskattn: BigBird's random
// blocks, MLM and MAE masking, the layer's and the GPT's initial weights, the audit's random
// inputs, batches and sampling, the CLI's and the benchmarks' random tensors.
//
// Why not <random>: std::mt19937_64's bits are fixed by the standard, but the distributions on
// top of it (uniform_int_distribution, uniform_real_distribution, normal_distribution, shuffle)
// are not: libstdc++ and libc++ turn the same bits into different values, so one seed gave other
// masks and weights on another platform. Every transformation below is written out here, so a
// seed names the same values everywhere (tests/random_test.cc pins some). The whole state is one
// integer, so a checkpoint can save it.
#pragma once

#include <cmath>
#include <cstdint>
#include <iterator>
#include <utility>

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
  // Uniform in [0, bound) by rejection, so that no value is favoured. bound ≥ 1.
  uint64_t below(uint64_t bound) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t draw = next();
    while (draw >= limit) draw = next();
    return draw % bound;
  }
  // Uniform integer in [low, high], both included; low ≤ high.
  int64_t between(int64_t low, int64_t high) {
    const uint64_t span = static_cast<uint64_t>(high) - static_cast<uint64_t>(low) + 1;
    if (span == 0) return static_cast<int64_t>(next());  // the whole int64 range
    return static_cast<int64_t>(static_cast<uint64_t>(low) + below(span));
  }
  // Uniform in [0, 1), on a grid of 2^-53.
  double unit() { return static_cast<double>(next() >> 11) * 0x1p-53; }
  // Uniform in [low, high): an affine map of unit(), computed in double.
  double uniform(double low, double high) { return low + (high - low) * unit(); }
  // Fisher–Yates (Knuth's algorithm P): every permutation equally likely.
  template <typename RandomIt>
  void shuffle(RandomIt first, RandomIt last) {
    const auto count = static_cast<uint64_t>(std::distance(first, last));
    for (uint64_t n = count; n > 1; --n) {
      std::swap(first[static_cast<std::ptrdiff_t>(n - 1)],
                first[static_cast<std::ptrdiff_t>(below(n))]);
    }
  }

  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
};

// Standard normal draws: Box–Muller on two uniform draws, which gives two independent normals;
// the second is kept for the next call.
class NormalDraws {
 public:
  explicit NormalDraws(uint64_t seed) : uniform_(seed) {}
  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = uniform_.unit() + 0x1p-54;  // in (0, 1): log(u1) is finite
    const double u2 = uniform_.unit();
    const double radius = std::sqrt(-2.0 * std::log(u1));
    spare_ = radius * std::sin(2.0 * M_PI * u2);
    has_spare_ = true;
    return radius * std::cos(2.0 * M_PI * u2);
  }

 private:
  SplitMix64 uniform_;
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace maskattn::detail
