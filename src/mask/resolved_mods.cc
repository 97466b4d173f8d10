#include "mask/resolved_mods.h"

#include <cmath>
#include <string>

#include "maskattn/error.h"

namespace maskattn::detail {

namespace {

const float* per_head(const std::vector<float>& values, const MaskShape& shape, const char* what) {
  if (values.empty()) return nullptr;
  if (static_cast<int64_t>(values.size()) != shape.q_heads) {
    throw Error(std::string(what) + " have " + std::to_string(values.size()) +
                " entries but the query has Hq=" + std::to_string(shape.q_heads) + " heads");
  }
  for (size_t h = 0; h < values.size(); ++h) {
    if (!std::isfinite(values[h])) {
      throw Error(std::string(what) + "[" + std::to_string(h) + "] = " + std::to_string(values[h]) +
                  " is not finite");
    }
  }
  return values.data();
}

}  // namespace

ResolvedMods::ResolvedMods(const ScoreMods& mods, const MaskShape& call_shape, const Frame& frame,
                           bool count_sinks)
    : q_origin(frame.q_offset), k_origin(frame.k_offset) {
  const MaskShape shape = framed_shape(call_shape, frame);
  if (mods.softcap) {
    if (!(*mods.softcap > 0.0) || !std::isfinite(*mods.softcap)) {
      throw Error("softcap = " + std::to_string(*mods.softcap) +
                  " must be a positive finite number (the cap of cap·tanh(s/cap))");
    }
    softcap = mods.softcap;
  }
  alibi_slopes = per_head(mods.alibi_slopes, shape, "alibi slopes");
  sinks = per_head(mods.sinks, shape, "sinks");
  if (!count_sinks) sinks = nullptr;
  if (mods.bias) {
    if (mods.bias->empty()) throw Error("bias is an empty array (no shape, no values)");
    bias_index = broadcast_to_scores(mods.bias->shape(), shape, "bias");
    bias = mods.bias->data();
  }
  if (mods.score_fn) score_fn = &mods.score_fn;
  if (mods.program) {
    if (mods.program->kind() != ProgramKind::score) {
      throw Error("ScoreMods::program: `" + mods.program->text() +
                  "` is a mask program (a bool); a score modifier needs a score program (a "
                  "number): give it to Mask::program instead");
    }
    if (mods.score_fn) {
      throw Error(
          "ScoreMods: score_fn and program are both set; they take the same place in the "
          "chain, give one (the program has a backward)");
    }
    mods.program->check({shape.batch, shape.q_heads, shape.q_len, shape.k_len});
    program = &*mods.program;
  }
  if (mods.threshold) {
    if (std::isnan(*mods.threshold)) throw Error("threshold is NaN");
    threshold = mods.threshold;
  }
}

}  // namespace maskattn::detail
