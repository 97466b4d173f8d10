// Score modifiers checked against one problem size. Plain data: kernels apply them in the order
// docs/design.md §3 fixes (see score_mods.h). Keeps pointers into the ScoreMods it was built from.
#pragma once

#include <optional>
#include <vector>

#include "mask/broadcast.h"
#include "mask/resolved_mask.h"
#include "maskattn/mask.h"
#include "maskattn/score_mods.h"

namespace maskattn::detail {

struct ResolvedMods {
  // Throws Error for a non-positive softcap, slopes or sinks that are not [Hq] or not finite, a
  // bias that does not broadcast, a NaN threshold, a mask program or a score_fn beside a program
  // (E129), a program that could read outside a table (E128).
  // `shape` is the call's; with a frame (mask.h) the bias is checked against the whole problem
  // and read, like score_fn's indices, at global rows. count_sinks = false drops the sinks (they
  // belong to another part of a split).
  ResolvedMods(const ScoreMods& mods, const MaskShape& shape, const Frame& frame = {},
               bool count_sinks = true);

  // The bias element of the call's pair (i, j), and score_fn called with global rows.
  int64_t bias_offset(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return bias_index.offset(b, h, i + q_origin, j + k_origin);
  }
  double call_score_fn(double s, int64_t b, int64_t h, int64_t i, int64_t j) const {
    return (*score_fn)(s, b, h, i + q_origin, j + k_origin);
  }
  // The program's tile for the call's queries [i, i + nq) × keys [j, j + nk): global rows, in the
  // layout (query or key rows, row stride) the kernel keeps its scores in.
  ProgramTile program_tile(int64_t b, int64_t h, int64_t i, int64_t nq, int64_t j, int64_t nk,
                           bool query_rows = false, int64_t row_stride = 0) const {
    ProgramTile tile;
    tile.b = b;
    tile.h = h;
    tile.q0 = i + q_origin;
    tile.nq = nq;
    tile.kv0 = j + k_origin;
    tile.nk = nk;
    tile.query_rows = query_rows;
    tile.row_stride = row_stride;
    return tile;
  }

  std::optional<double> softcap;
  const float* alibi_slopes = nullptr;  // [Hq] or null
  const float* bias = nullptr;          // broadcast by bias_index, or null
  BroadcastStrides bias_index;
  const ScoreFunction* score_fn = nullptr;
  // A score program, checked over the whole problem (Program::check); evaluated at global rows.
  const Program* program = nullptr;
  std::optional<double> threshold;
  const float* sinks = nullptr;        // [Hq] or null
  int64_t q_origin = 0, k_origin = 0;  // the frame's offsets
};

}  // namespace maskattn::detail
