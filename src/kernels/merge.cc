#include "kernels/merge.h"

#include <cmath>

namespace maskattn::detail {

float merge_row(int64_t parts, const float* outs, int64_t out_stride, const float* lses,
                int64_t lse_stride, float sink, int64_t value_dim, float* out) {
  double top = sink;
  for (int64_t c = 0; c < parts; ++c) {
    const double lse = lses[c * lse_stride];
    if (std::isnan(lse)) {
      for (int64_t e = 0; e < value_dim; ++e) out[e] = NAN;
      return NAN;
    }
    top = std::max(top, lse);
  }
  if (top == -INFINITY) {
    for (int64_t e = 0; e < value_dim; ++e) out[e] = 0.0f;
    return -INFINITY;
  }
  // Weights relative to the largest LSE, so that no exp overflows.
  double total = std::exp(static_cast<double>(sink) - top);
  for (int64_t c = 0; c < parts; ++c) total += std::exp(lses[c * lse_stride] - top);
  for (int64_t e = 0; e < value_dim; ++e) {
    double sum = 0.0;
    for (int64_t c = 0; c < parts; ++c) {
      const double weight = std::exp(lses[c * lse_stride] - top);
      if (weight != 0.0) sum += weight * outs[c * out_stride + e];
    }
    out[e] = static_cast<float>(sum / total);
  }
  return static_cast<float>(top + std::log(total));
}

}  // namespace maskattn::detail
