#include "core/dropout.h"

#include <cmath>
#include <string>

#include "maskattn/error.h"

namespace maskattn::detail {

namespace {

constexpr int64_t kDrawsPerUnit = 65536;  // 16-bit draws

std::string number(double value) {
  std::string text = std::to_string(value);
  while (text.size() > 1 && text.back() == '0') text.pop_back();
  if (!text.empty() && text.back() == '.') text.pop_back();
  return text;
}

// Each counter word is 32 bits: the problem's rows and heads must fit in theirs.
void require_counter_room(const MaskShape& whole, uint64_t batch_offset) {
  const auto fail = [](const std::string& what) {
    throw Error("dropout: " + what +
                " leaves the 32-bit words of the Philox counter that numbers the pairs (docs/"
                "semantics.md §17); split the problem into calls of fewer rows and give each its "
                "own dropout.offset");
  };
  if (whole.q_len > (int64_t{1} << 32)) fail("Lq = " + std::to_string(whole.q_len));
  if (whole.k_len > (int64_t{1} << 35)) fail("Lk = " + std::to_string(whole.k_len));
  if (whole.batch * whole.q_heads > (int64_t{1} << 32)) {
    fail("B·Hq = " + std::to_string(whole.batch) + "·" + std::to_string(whole.q_heads));
  }
  if (batch_offset >= (uint64_t{1} << 32) ||
      (batch_offset + static_cast<uint64_t>(whole.batch)) * static_cast<uint64_t>(whole.q_heads) >
          (uint64_t{1} << 32)) {
    fail("(batch_offset + B)·Hq = (" + std::to_string(batch_offset) + " + " +
         std::to_string(whole.batch) + ")·" + std::to_string(whole.q_heads));
  }
}

}  // namespace

DropoutRule resolve_dropout(const Dropout& dropout, const MaskShape& whole_problem) {
  if (!(dropout.p >= 0.0 && dropout.p <= 1.0)) {
    throw Error("dropout.p = " + number(dropout.p) +
                " must be in [0, 1] (the probability of dropping an allowed pair)");
  }
  if (dropout.offset >= (uint64_t{1} << 32)) {
    throw Error("dropout.offset = " + std::to_string(dropout.offset) +
                " must be below 2^32 (the fourth word of the Philox counter); number calls that "
                "share a seed 0, 1, 2, … (a layer, a step)");
  }
  DropoutRule rule;
  if (dropout.p == 0.0) return rule;
  require_counter_room(whole_problem, dropout.batch_offset);
  rule.on = true;
  rule.threshold = static_cast<uint32_t>(std::llround(dropout.p * kDrawsPerUnit));
  const int64_t kept_draws = kDrawsPerUnit - rule.threshold;
  rule.keep_scale = kept_draws == 0 ? 0.0 : static_cast<double>(kDrawsPerUnit) / kept_draws;
  rule.keep_scale_f32 = static_cast<float>(rule.keep_scale);
  rule.key0 = static_cast<uint32_t>(dropout.seed);
  rule.key1 = static_cast<uint32_t>(dropout.seed >> 32);
  rule.offset = static_cast<uint32_t>(dropout.offset);
  rule.q_heads = whole_problem.q_heads;
  rule.head_row_offset = static_cast<uint32_t>(dropout.batch_offset * whole_problem.q_heads);
  return rule;
}

}  // namespace maskattn::detail
