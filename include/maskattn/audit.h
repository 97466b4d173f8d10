// The leakage audit: does the mask hide what you think it hides, and does the kernel honour it?
//
// audit_mask() runs the real kernel on random inputs, then perturbs every key and value (key j of
// every sequence and kv head at once, one attention call per key) and records which outputs
// change. From that it reports:
//   kernel leaks  — pairs that changed an output although the mask hides them (a kernel bug);
//   leaks         — pairs the mask allows but the expected mask hides (a mask-construction bug);
//   blind spots   — pairs the mask hides but the expected mask allows;
//   empty rows    — queries that see no key at all (their output is 0);
//   silent pairs  — allowed pairs whose perturbation changed nothing (a weight that underflowed);
//   relaxed pairs — allowed pairs that a causal or window component hides and a global-token, span
//                   or prefix-LM component allows again, with the component: with causal + global
//                   tokens these are the look-ahead pairs (an earlier query sees a later global
//                   key, a global query sees the future), legal by design but worth seeing.
// Typical mistakes it catches: a blocked matrix built with tril instead of triu, a keep matrix
// passed as blocked, a diagonal hidden by triu(…, 0), a causal mask aligned top-left in a
// KV-cache step.
#pragma once

#include <cstdint>
#include <string>
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

// Why a relaxing component allows a pair that a causal or window component hides (semantics.md §3,
// §14).
enum class Relaxation : uint8_t {
  global_query,  // the query is a global token
  global_key,    // the key is a global token
  global_both,   // both are
  span,          // query and key are in the same span
  prefix,        // both positions are in the prefix-LM range
};

struct AuditRelaxedPair {
  AuditPair pair;
  Relaxation reason = Relaxation::global_key;
  bool look_ahead = false;  // kpos > qpos: the key is later than the query
  size_t component = 0;     // the relaxing component: its index in mask.components() and labels
};

struct AuditReport {
  MaskShape shape;
  bool has_expected = false;
  Array<uint8_t> allowed;    // [B, Hq, Lq, Lk] the mask
  Array<uint8_t> expected;   // the expected mask, when given
  Array<uint8_t> influence;  // 1 where perturbing key/value j changed output i
  std::vector<AuditPair> kernel_leaks, leaks, blind_spots, silent_pairs;
  std::vector<AuditPair> empty_rows;  // j unused
  // Allowed pairs beyond a causal/window bound of their head, allowed again by a global-token, span
  // or prefix-LM component (the first such component of the mask); in (b, h, i, j) order.
  std::vector<AuditRelaxedPair> relaxed_pairs;
  std::vector<std::string> labels;  // the mask's component labels (mask.labels())
  int64_t allowed_count = 0, hidden_count = 0;
  // No kernel leak, no leak, no blind spot.
  bool passed() const { return kernel_leaks.empty() && leaks.empty() && blind_spots.empty(); }
};

// `expected` may be null (then only kernel leaks, empty and silent rows are checked). Throws
// Error for invalid sizes (each in [1, 4096], at most 2^24 pairs) or masks that do not fit them.
AuditReport audit_mask(const Mask& mask, const ScoreMods& mods, const Mask* expected,
                       const AuditOptions& options);

// One relaxed pair in words, e.g. "global_tokens: b=0 h=0 query 3 sees later key 7 (a global
// key)"; the component is named by its label in `report`.
std::string relaxed_pair_text(const AuditReport& report, const AuditRelaxedPair& relaxed);

}  // namespace maskattn
