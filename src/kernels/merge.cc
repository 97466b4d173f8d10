#include "kernels/merge.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace maskattn::detail {

float merge_row(int64_t parts, const float* const* rows, const float* lses, float sink,
                int64_t value_dim, double* weights, float* out) {
  double top = sink;
  for (int64_t c = 0; c < parts; ++c) {
    if (std::isnan(lses[c])) {
      std::fill_n(out, value_dim, NAN);
      return NAN;
    }
    top = std::max(top, static_cast<double>(lses[c]));
  }
  if (top == -INFINITY) {
    std::fill_n(out, value_dim, 0.0f);
    return -INFINITY;
  }
  double total = std::exp(static_cast<double>(sink) - top);
  for (int64_t c = 0; c < parts; ++c) {
    weights[c] = std::exp(lses[c] - top);
    total += weights[c];
  }
  for (int64_t e = 0; e < value_dim; ++e) {
    double sum = 0.0;
    // A part of weight 0 is skipped, not multiplied: its row may hold inf or NaN it never had a
    // key for (an empty part's output is 0, but a caller's buffer need not be).
    for (int64_t c = 0; c < parts; ++c) {
      if (weights[c] != 0.0) sum += weights[c] * rows[c][e];
    }
    out[e] = static_cast<float>(sum / total);
  }
  return static_cast<float>(top + std::log(total));
}

float merge_row(int64_t parts, const float* outs, int64_t out_stride, const float* lses,
                int64_t lse_stride, float sink, int64_t value_dim, float* out) {
  // Row pointers, contiguous LSEs and the weights' scratch: on the stack for the usual few parts.
  constexpr int64_t kOnStack = 32;
  const float* stack_rows[kOnStack];
  float stack_lses[kOnStack];
  double stack_weights[kOnStack];
  std::vector<const float*> heap_rows;
  std::vector<float> heap_lses;
  std::vector<double> heap_weights;
  const float** row_of = stack_rows;
  float* lse_of = stack_lses;
  double* weights = stack_weights;
  if (parts > kOnStack) {
    heap_rows.resize(parts);
    heap_lses.resize(parts);
    heap_weights.resize(parts);
    row_of = heap_rows.data();
    lse_of = heap_lses.data();
    weights = heap_weights.data();
  }
  for (int64_t c = 0; c < parts; ++c) {
    row_of[c] = outs + c * out_stride;
    lse_of[c] = lses[c * lse_stride];
  }
  return merge_row(parts, row_of, lse_of, sink, value_dim, weights, out);
}

}  // namespace maskattn::detail
