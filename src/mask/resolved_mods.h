// Score modifiers checked against one problem size. Plain data: kernels apply them in the order
// docs/design.md §3 fixes (see score_mods.h). Keeps pointers into the ScoreMods it was built from.
#pragma once

#include <optional>
#include <vector>

#include "mask/broadcast.h"
#include "maskattn/mask.h"
#include "maskattn/score_mods.h"

namespace maskattn::detail {

struct ResolvedMods {
  // Throws Error for a non-positive softcap, slopes or sinks that are not [Hq] or not finite, a
  // bias that does not broadcast, or a NaN threshold.
  ResolvedMods(const ScoreMods& mods, const MaskShape& shape);

  std::optional<double> softcap;
  const float* alibi_slopes = nullptr;  // [Hq] or null
  const float* bias = nullptr;          // broadcast by bias_index, or null
  BroadcastStrides bias_index;
  const ScoreFunction* score_fn = nullptr;
  std::optional<double> threshold;
  const float* sinks = nullptr;  // [Hq] or null
};

}  // namespace maskattn::detail
