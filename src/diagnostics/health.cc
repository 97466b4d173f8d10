// The numeric health report, from the reference kernel's scores and weights.
#include "maskattn/health.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "core/element.h"
#include "maskattn/error.h"
#include "maskattn/memory.h"

namespace maskattn {

namespace {

std::string number(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", x);
  return text;
}

// Warnings about the finite values of additive masks (and the bias): what they do that −inf
// would not.
void additive_warnings(const Mask& mask, const ScoreMods& mods, DType dtype,
                       const Array<uint8_t>& allowed, const std::vector<float>& final_scores,
                       std::vector<std::string>& warnings) {
  std::vector<std::pair<std::string, const Array<float>*>> arrays;
  for (size_t n = 0; n < mask.components().size(); ++n) {
    if (const auto* a = std::get_if<component::DenseAdditive>(&mask.components()[n])) {
      arrays.emplace_back(mask.labels()[n], &a->values);
    }
  }
  if (mods.bias) arrays.emplace_back("bias", &*mods.bias);
  constexpr double kF16Max = 65504.0;
  for (const auto& [name, values] : arrays) {
    double lowest_finite = 0.0;
    for (float x : values->values()) {
      if (std::isfinite(x)) lowest_finite = std::min(lowest_finite, double{x});
    }
    if (lowest_finite > -1e4) continue;  // no sentinel-like values
    warnings.push_back(name + ": finite value " + number(lowest_finite) +
                       " does not hide a pair; it only makes its weight tiny while the row has a "
                       "pair without it (use -inf, or a keep/blocked mask)");
    if (lowest_finite < -kF16Max) {
      warnings.push_back(name + ": " + number(lowest_finite) +
                         " is below the float16 range (-65504): a framework that casts the mask to "
                         "f16 turns it into -inf" +
                         (dtype == DType::f16 ? " (this run computes in f16)" : ""));
    }
    if (lowest_finite <= -1e38) {
      warnings.push_back(name + ": " + number(lowest_finite) +
                         " is near finfo(float32).min: adding a negative score to it overflows "
                         "to -inf in f32 (so it hides after all, but only by overflow)");
    }
  }
  // Rows where every allowed pair carries a sentinel-sized score: they get near-uniform weights
  // over pairs that were meant to be hidden, instead of an output of 0.
  const int64_t M = allowed.dim(3), rows = allowed.numel() / std::max<int64_t>(M, 1);
  int64_t sentinel_rows = 0;
  for (int64_t row = 0; row < rows && M > 0; ++row) {
    bool any = false, all_tiny = true;
    for (int64_t j = 0; j < M; ++j) {
      const float s = final_scores[row * M + j];
      if (!allowed.values()[row * M + j] || s == -INFINITY) continue;
      any = true;
      all_tiny &= s <= -1e4f;
    }
    sentinel_rows += any && all_tiny;
  }
  if (sentinel_rows > 0) {
    warnings.push_back(std::to_string(sentinel_rows) +
                       " rows have only finite sentinel scores (≤ -1e4): their weights are "
                       "spread over pairs meant to be hidden (a fully masked row given as -inf "
                       "would output 0)");
  }
}

// One problem's values as health_report() computed them: scores and weights [B, H, L, M], the
// mask's allowed pairs, and the outputs [B, H, L, Dv].
struct Evaluated {
  int64_t heads, q_len, k_len, value_dim;
  const std::vector<float>& scaled;
  const std::vector<float>& final_scores;
  const std::vector<float>& weights;
  const Array<uint8_t>& allowed;
  TensorView out;
};

// The statistics of head h of sequence b.
HeadHealth head_health(const Evaluated& e, int64_t b, int64_t h) {
  const int64_t H = e.heads, L = e.q_len, M = e.k_len, Dv = e.value_dim;
  HeadHealth head;
  head.b = b;
  head.h = h;
  double lo = INFINITY, hi = -INFINITY, logit = -INFINITY, entropy = 0;
  int64_t hidden = 0, rows_with_keys = 0;
  for (int64_t i = 0; i < L; ++i) {
    const int64_t row = (b * H + h) * L + i;
    bool any = false;
    double row_entropy = 0;
    for (int64_t j = 0; j < M; ++j) {
      const int64_t n = row * M + j;
      const float s = e.final_scores[n];
      if (!e.allowed.values()[n] || s == -INFINITY) {
        ++hidden;
        continue;
      }
      any = true;
      if (std::isnan(s)) ++head.nan_count;
      if (std::isinf(s)) ++head.inf_count;
      lo = std::min(lo, double{e.scaled[n]});
      hi = std::max(hi, double{e.scaled[n]});
      logit = std::max(logit, double{s});
      const double p = e.weights[n];
      if (p > 0) row_entropy -= p * std::log(p);
    }
    if (any) {
      ++rows_with_keys;
      entropy += row_entropy;
    } else {
      ++head.empty_rows;
    }
    for (int64_t c = 0; c < Dv; ++c) {
      const float o = detail::load_float(e.out, e.out.offset({b, h, i, c}));
      if (std::isnan(o)) ++head.nan_count;
      if (std::isinf(o)) ++head.inf_count;
    }
  }
  head.score_min = rows_with_keys > 0 ? lo : NAN;
  head.score_max = rows_with_keys > 0 ? hi : NAN;
  head.max_logit = rows_with_keys > 0 ? logit : NAN;
  head.mean_entropy = rows_with_keys > 0 ? entropy / rows_with_keys : 0.0;
  head.hidden_fraction = L * M > 0 ? static_cast<double>(hidden) / (L * M) : 0.0;
  return head;
}

}  // namespace

HealthReport health_report(const TensorView& q, const TensorView& k, const TensorView& v,
                           const Mask& mask, const ScoreMods& mods, const Options& options,
                           int64_t max_heads, const HealthPrecomputed& given) {
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4) {
    throw Error("health_report: q, k, v must be [B,H,L,D] (got " + q.shape_string() + ", " +
                k.shape_string() + ", " + v.shape_string() + ")");
  }
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), M = k.size(2), Dv = v.size(3);
  const double pairs = static_cast<double>(B) * H * L * M;
  require_memory(12.0 * pairs + 4.0 * B * H * L * Dv,
                 "health_report for q " + q.shape_string() + ", k " + k.shape_string());
  const Dims pair_shape = {B, H, L, M};
  std::vector<float> scaled(static_cast<size_t>(pairs)), final_scores(scaled.size()),
      weights(scaled.size());
  Options reference = options;
  reference.kernel = Kernel::reference;
  attention_scores(q, k, MutableTensorView(scaled.data(), pair_shape), ScoreStage::scaled, mask,
                   mods, reference);
  attention_scores(q, k, MutableTensorView(final_scores.data(), pair_shape), ScoreStage::final,
                   mask, mods, reference);
  attention_weights(q, k, MutableTensorView(weights.data(), pair_shape), mask, mods, reference);
  std::vector<uint16_t> typed;
  TensorView out_view = given.out;
  if (out_view.is_null()) {
    typed.resize(static_cast<size_t>(B * H * L * Dv) * (q.dtype() == DType::f32 ? 2 : 1));
    const MutableTensorView computed(typed.data(), q.dtype(), {B, H, L, Dv});
    attention(q, k, v, computed, mask, mods, options);
    out_view = computed;
  } else if (out_view.sizes() != Dims{B, H, L, Dv}) {
    throw Error("health_report: the given out " + out_view.shape_string() +
                " is not [B,H,L,Dv] = " + shape_string({B, H, L, Dv}));
  }
  Array<uint8_t> computed_allowed;
  if (given.allowed == nullptr) computed_allowed = allowed_pairs(mask, {B, H, L, M});
  const Array<uint8_t>& allowed = given.allowed != nullptr ? *given.allowed : computed_allowed;
  if (allowed.shape() != pair_shape) {
    throw Error("health_report: the given allowed pairs " + shape_string(allowed.shape()) +
                " are not [B,H,L,M] = " + shape_string(pair_shape));
  }

  HealthReport report;
  const Evaluated evaluated{H, L, M, Dv, scaled, final_scores, weights, allowed, out_view};
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H && static_cast<int64_t>(report.heads.size()) < max_heads; ++h) {
      report.heads.push_back(head_health(evaluated, b, h));
    }
  }
  additive_warnings(mask, mods, q.dtype(), allowed, final_scores, report.warnings);
  for (const HeadHealth& head : report.heads) {
    if (head.nan_count + head.inf_count > 0) {
      report.warnings.push_back("b=" + std::to_string(head.b) + " h=" + std::to_string(head.h) +
                                ": " + std::to_string(head.nan_count) + " NaN and " +
                                std::to_string(head.inf_count) +
                                " Inf in the scores or outputs (check the inputs with "
                                "Options::check_finite)");
    }
  }
  return report;
}

}  // namespace maskattn
