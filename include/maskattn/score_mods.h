// Score modifiers: what happens to the scaled score of an allowed pair before the softmax.
//
// Order, fixed (docs/design.md §3):
//   s = scale·q·k → softcap → + ALiBi + bias + additive masks → score_fn → threshold
//     → hide masked pairs (and pairs whose score is −inf) → softmax (with sinks in the denominator)
// A hidden pair stays hidden whatever a modifier does.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "maskattn/array.h"
#include "maskattn/program.h"

namespace maskattn {

using ScoreFunction =
    std::function<double(double score, int64_t b, int64_t h, int64_t i, int64_t j)>;

struct ScoreMods {
  // cap > 0: s → cap·tanh(s / cap) (Gemma-2 / Grok soft-capping).
  std::optional<double> softcap;
  // [Hq] slopes: s → s − slope[h]·|qpos − kpos| (ALiBi, positions as in mask.h). Empty = none.
  std::vector<float> alibi_slopes;
  // A float tensor broadcasting to [B, Hq, Lq, Lk], added to s.
  std::optional<Array<float>> bias;
  // A callable (s, b, h, i, j) → s' (FlexAttention's score_mod), after ALiBi/bias/additive masks.
  // Called concurrently from several threads. Returning −inf hides the pair.
  ScoreFunction score_fn;
  // A score program (maskattn/program.h; FlexAttention's score_mod as an expression of s, b, h,
  // q, kv and captured tables), in score_fn's place in the order above, with a backward: ∂/∂s and
  // the gradients of its float32 tables. Not together with score_fn.
  std::optional<Program> program;
  // Content threshold: hide pairs whose final score is below τ.
  std::optional<double> threshold;
  // [Hq] attention-sink logits: each joins its head's softmax denominator with no value vector.
  std::vector<float> sinks;

  bool empty() const {
    return !softcap && alibi_slopes.empty() && !bias && !score_fn && !program && !threshold &&
           sinks.empty();
  }
};

}  // namespace maskattn
