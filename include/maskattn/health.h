// The numeric health report: per head, what the scores and weights look like, and warnings about
// additive masks whose finite values do not behave like hiding (docs/design.md §3,
// docs/semantics.md §5). A debugging tool: it materialises the [B, Hq, Lq, Lk] scores and weights.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "maskattn/attention.h"

namespace maskattn {

struct HeadHealth {
  int64_t b = 0, h = 0;
  double score_min = 0, score_max = 0;   // scale·q·k over allowed pairs (NaN when none)
  double max_logit = 0;                  // after every modifier, over allowed pairs
  double mean_entropy = 0;               // of the rows' weights, nats, over rows with keys
  double hidden_fraction = 0;            // hidden pairs / all pairs (threshold included)
  int64_t empty_rows = 0;                // rows with no key: output 0
  int64_t nan_count = 0, inf_count = 0;  // in the final scores of allowed pairs and the outputs
};

struct HealthReport {
  std::vector<HeadHealth> heads;
  std::vector<std::string> warnings;
};

// What the caller has already computed for exactly these arguments (maskattn attend --report), so
// that the report does not compute it again: the attention output O [B,H,L,Dv] (q's dtype, any
// strides) and the mask's allowed pairs [B,H,L,M] (allowed_pairs). Null: computed here.
struct HealthPrecomputed {
  TensorView out;
  const Array<uint8_t>* allowed = nullptr;
};

// q, k, v as attention() takes them. At most `max_heads` (b, h) pairs are reported.
HealthReport health_report(const TensorView& q, const TensorView& k, const TensorView& v,
                           const Mask& mask = {}, const ScoreMods& mods = {},
                           const Options& options = {}, int64_t max_heads = 64,
                           const HealthPrecomputed& given = {});

}  // namespace maskattn
