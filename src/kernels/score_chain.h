// The score-modifier chain: the one place its order is written (docs/design.md §3).
//
//     s  →  softcap  →  ALiBi  →  bias  →  additive masks  →  score_fn or program  →  threshold
//
// Every kernel runs this chain between its product S = scale·Q·Kᵀ and its softmax, each in its
// own arithmetic: the f64 reference and the row (decode) kernel on one f64 score at a time
// (ScalarScoreChain below), the forward and backward tile kernels on an f32 vector of scores
// (TileScoreChain in score_chain-inl.h). An arithmetic is a type with one member per step;
// ApplyScoreChain (score_chain_steps.h) calls the steps that are present, in order. A new modifier
// is one line there plus one member in each arithmetic, and the compiler names any arithmetic
// that lacks it.
//
// The chain runs on allowed pairs only as far as the user can tell: per-pair steps (bias,
// additive, score_fn) are skipped for hidden pairs, whose scores the mask turns into −inf anyway,
// so a user's score_fn never sees a hidden pair.
#pragma once

#include <cmath>
#include <cstdint>

#include "mask/resolved_mask.h"
#include "mask/resolved_mods.h"

namespace maskattn::detail {

#include "kernels/score_chain_steps.h"  // ApplyScoreChain, for scalar arithmetics

// The chain on one pair (b, h, i, j) in f64: the reference's arithmetic, which the row kernel
// shares (it computes few scores, so exactness costs it nothing measurable).
struct ScalarScoreChain {
  using Score = double;

  const ResolvedMods& mods;
  const ResolvedMask& mask;
  int64_t b, h, i, j;

  double softcap(double s) const { return *mods.softcap * std::tanh(s / *mods.softcap); }
  // score −= slope[h]·|qpos − kpos|
  double alibi(double s) const {
    const double distance = std::fabs(static_cast<double>(mask.qpos(b, i) - mask.kpos(b, j)));
    return s - static_cast<double>(mods.alibi_slopes[h]) * distance;
  }
  double bias(double s) const { return s + mods.bias[mods.bias_offset(b, h, i, j)]; }
  double additive(double s) const { return s + mask.additive(b, h, i, j); }
  double score_fn(double s) const { return mods.call_score_fn(s, b, h, i, j); }
  // A program's arithmetic is f32 (program.h): the score enters rounded to f32.
  double program(double s) const {
    return mods.program->score(static_cast<float>(s), b, h, i + mods.q_origin, j + mods.k_origin);
  }
  double threshold(double s) const { return s < *mods.threshold ? -INFINITY : s; }
};

// The final score of an allowed pair from its scaled score s; −inf when the threshold hides it.
// `additive`: whether additive masks apply here (kernels pass false for tiles the block map
// proved free of them).
inline double modified_score(const ResolvedMods& mods, const ResolvedMask& mask, bool additive,
                             int64_t b, int64_t h, int64_t i, int64_t j, double s) {
  ScalarScoreChain chain{mods, mask, b, h, i, j};
  return ApplyScoreChain(mods, additive, chain, s);
}

// The score entering the program (the chain's head, score_chain_steps.h), for its backward.
inline double program_input_score(const ResolvedMods& mods, const ResolvedMask& mask, bool additive,
                                  int64_t b, int64_t h, int64_t i, int64_t j, double s) {
  ScalarScoreChain chain{mods, mask, b, h, i, j};
  return ApplyScoreChainHead(mods, additive, chain, s);
}

}  // namespace maskattn::detail
