// The leakage audit: does the mask hide what you think it hides, and does the kernel honour it?
//
// audit_mask() runs the real kernel on random inputs, then perturbs every key and value (key j of
// every sequence and kv head at once, one attention call per key) and records which outputs
// change. From that it reports:
//   kernel leaks  — pairs that changed an output although the mask hides them (a kernel bug);
//   leaks         — pairs the mask allows but the expected mask hides (a mask-construction bug);
//   blind spots   — pairs the mask hides but the expected mask allows;
//   empty rows    — queries that see no key at all (their output is 0);
//   silent pairs  — allowed pairs whose perturbation changed nothing (a weight that underflowed).
// Typical mistakes it catches: a blocked matrix built with tril instead of triu, a keep matrix
// passed as blocked, a diagonal hidden by triu(…, 0), a causal mask aligned top-left in a
// KV-cache step.
#pragma once

#include <cstdint>
#include <vector>

#include "maskattn/array.h"
#include "maskattn/attention.h"

namespace maskattn {

struct AuditOptions {
  int64_t batch = 1, q_heads = 1, kv_heads = 0;  // kv_heads 0 = q_heads
  int64_t q_len = 0, k_len = 0, head_dim = 8;
  DType dtype = DType::f32;
  Kernel kernel = Kernel::automatic;
  uint64_t seed = 1;
};

struct AuditPair {
  int64_t b = 0, h = 0, i = 0, j = 0;
  bool operator==(const AuditPair&) const = default;
};

struct AuditReport {
  MaskShape shape;
  bool has_expected = false;
  Array<uint8_t> allowed;    // [B, Hq, Lq, Lk] the mask
  Array<uint8_t> expected;   // the expected mask, when given
  Array<uint8_t> influence;  // 1 where perturbing key/value j changed output i
  std::vector<AuditPair> kernel_leaks, leaks, blind_spots, silent_pairs;
  std::vector<AuditPair> empty_rows;  // j unused
  int64_t allowed_count = 0, hidden_count = 0;
  // No kernel leak, no leak, no blind spot.
  bool passed() const { return kernel_leaks.empty() && leaks.empty() && blind_spots.empty(); }
};

// `expected` may be null (then only kernel leaks, empty and silent rows are checked). Throws
// Error for invalid sizes (each in [1, 4096], at most 2^24 pairs) or masks that do not fit them.
AuditReport audit_mask(const Mask& mask, const ScoreMods& mods, const Mask* expected,
                       const AuditOptions& options);

}  // namespace maskattn
