// The leakage audit's random inputs, apart so that a test can pin them (tests/random_test.cc): a
// seed names the same q, k and v on every platform (core/splitmix64.h).
#pragma once

#include <cstdint>
#include <vector>

#include "core/splitmix64.h"

namespace maskattn::detail {

// `count` values uniform in [-1, 1), drawn in order from `seed`: the audit fills q, then k, then
// v with them, element by element. Moderate values keep the scores moderate, so that no allowed
// weight underflows and every allowed key shows its influence.
inline std::vector<float> audit_sample(uint64_t seed, int64_t count) {
  SplitMix64 random(seed);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& value : values) value = static_cast<float>(random.uniform(-1.0, 1.0));
  return values;
}

}  // namespace maskattn::detail
