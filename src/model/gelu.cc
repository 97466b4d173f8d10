#include "model/gelu.h"

#include <cmath>

namespace maskattn::model {

namespace {

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

}  // namespace

void gelu_forward(const float* x, int64_t count, float* y, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (threads != 1)
  for (int64_t n = 0; n < count; ++n) {
    const double v = x[n];
    y[n] = static_cast<float>(0.5 * v * (1.0 + std::erf(v * kInvSqrt2)));
  }
}

void gelu_backward(const float* x, const float* dy, int64_t count, float* dx, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (threads != 1)
  for (int64_t n = 0; n < count; ++n) {
    const double v = x[n];
    const double cdf = 0.5 * (1.0 + std::erf(v * kInvSqrt2));
    const double pdf = kInvSqrt2Pi * std::exp(-0.5 * v * v);
    dx[n] = static_cast<float>(dy[n] * (cdf + v * pdf));
  }
}

}  // namespace maskattn::model
