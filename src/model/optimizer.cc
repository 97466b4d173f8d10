#include "maskattn/model/optimizer.h"

#include <cmath>

namespace maskattn::model {

namespace {

constexpr double kPi = 3.14159265358979323846;

}  // namespace

void adamw_step(const AdamW& config, double lr, int64_t step, bool decay, float* p, const float* g,
                float* m, float* v, int64_t count, int threads) {
  const float shrink = static_cast<float>(1.0 - lr * (decay ? config.weight_decay : 0.0));
  const float one_minus_beta1 = static_cast<float>(1.0 - config.beta1);
  const float beta2 = static_cast<float>(config.beta2);
  const float one_minus_beta2 = static_cast<float>(1.0 - config.beta2);
  const double correction1 = 1.0 - std::pow(config.beta1, static_cast<double>(step));
  const double correction2 = 1.0 - std::pow(config.beta2, static_cast<double>(step));
  const float step_size = static_cast<float>(lr / correction1);
  const float correction2_sqrt = static_cast<float>(std::sqrt(correction2));
  const float eps = static_cast<float>(config.eps);
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (threads != 1)
  for (int64_t n = 0; n < count; ++n) {
    float param = p[n] * shrink;
    m[n] += one_minus_beta1 * (g[n] - m[n]);  // torch.lerp
    v[n] = v[n] * beta2 + one_minus_beta2 * g[n] * g[n];
    const float denom = std::sqrt(v[n]) / correction2_sqrt + eps;
    param -= step_size * (m[n] / denom);
    p[n] = param;
  }
}

double learning_rate(int64_t it, double lr, double min_lr, int64_t warmup, int64_t decay_steps) {
  if (it < warmup) return lr * static_cast<double>(it + 1) / static_cast<double>(warmup + 1);
  if (it > decay_steps) return min_lr;
  const double ratio = decay_steps > warmup ? static_cast<double>(it - warmup) /
                                                  static_cast<double>(decay_steps - warmup)
                                            : 1.0;
  const double coefficient = 0.5 * (1.0 + std::cos(kPi * ratio));
  return min_lr + coefficient * (lr - min_lr);
}

double clip_grad_norm(float* const* tensors, const int64_t* sizes, int64_t count, double max_norm) {
  double squares = 0;
  for (int64_t t = 0; t < count; ++t) {
    for (int64_t n = 0; n < sizes[t]; ++n) squares += double{tensors[t][n]} * tensors[t][n];
  }
  const double norm = std::sqrt(squares);
  if (norm > max_norm) {
    const float scale = static_cast<float>(max_norm / (norm + 1e-6));
    for (int64_t t = 0; t < count; ++t) {
      for (int64_t n = 0; n < sizes[t]; ++n) tensors[t][n] *= scale;
    }
  }
  return norm;
}

}  // namespace maskattn::model
