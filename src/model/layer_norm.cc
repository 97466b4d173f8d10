#include "model/layer_norm.h"

#include <cmath>

#include "model/parallel_ranges.h"

namespace maskattn::model {

namespace {

// Σ f(n) over n < width in f64 as eight interleaved partial sums added in a fixed order at the end:
// a fixed order (the bits do not depend on the thread count) without one serial chain of dependent
// additions, whose latency bounded these loops.
template <class Term>
double interleaved_sum(int64_t width, const Term& term) {
  double part[8] = {};
  int64_t n = 0;
  for (; n + 8 <= width; n += 8) {
    for (int j = 0; j < 8; ++j) part[j] += term(n + j);
  }
  for (; n < width; ++n) part[n % 8] += term(n);
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

}  // namespace

void layer_norm_forward(const float* x, int64_t rows, int64_t width, const float* gamma,
                        const float* beta, float eps, float* y, float* mean, float* rstd,
                        int threads) {
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (threads != 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * width;
    const double sum = interleaved_sum(width, [&](int64_t n) { return double{row[n]}; });
    const double mu = sum / static_cast<double>(width);
    const double squares =
        interleaved_sum(width, [&](int64_t n) { return (row[n] - mu) * (row[n] - mu); });
    const double r_std = 1.0 / std::sqrt(squares / static_cast<double>(width) + eps);
    mean[r] = static_cast<float>(mu);
    rstd[r] = static_cast<float>(r_std);
    float* out = y + r * width;
    for (int64_t n = 0; n < width; ++n) {
      out[n] = static_cast<float>((row[n] - mu) * r_std) * gamma[n] + beta[n];
    }
  }
}

void layer_norm_backward(const float* x, const float* dy, int64_t rows, int64_t width,
                         const float* gamma, const float* mean, const float* rstd, float* dx,
                         float* dgamma, float* dbeta, int threads, bool accumulate_dx) {
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (threads != 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * width;
    const float* grad = dy + r * width;
    const double sum_g =
        interleaved_sum(width, [&](int64_t n) { return static_cast<double>(gamma[n]) * grad[n]; });
    const double sum_g_xhat = interleaved_sum(width, [&](int64_t n) {
      const double xhat = (row[n] - mean[r]) * static_cast<double>(rstd[r]);
      return static_cast<double>(gamma[n]) * grad[n] * xhat;
    });
    const double mean_g = sum_g / static_cast<double>(width);
    const double mean_g_xhat = sum_g_xhat / static_cast<double>(width);
    float* out = dx + r * width;
    for (int64_t n = 0; n < width; ++n) {
      const double xhat = (row[n] - mean[r]) * static_cast<double>(rstd[r]);
      const double g = static_cast<double>(gamma[n]) * grad[n];
      const auto term = static_cast<float>(rstd[r] * (g - mean_g - xhat * mean_g_xhat));
      out[n] = accumulate_dx ? out[n] + term : term;
    }
  }
  // Parameter gradients: sums over rows (model/parallel_ranges.h).
  for_column_ranges(rows, width, threads, [&](int64_t first, int64_t end) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = x + r * width;
      const float* grad = dy + r * width;
      for (int64_t n = first; n < end; ++n) {
        dgamma[n] += grad[n] * ((row[n] - mean[r]) * rstd[r]);
        dbeta[n] += grad[n];
      }
    }
  });
}

}  // namespace maskattn::model
