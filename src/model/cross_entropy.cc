#include "maskattn/model/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace maskattn::model {

CrossEntropy cross_entropy(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                           int32_t ignore, float* dlogits, int threads) {
  CrossEntropy result;
  for (int64_t r = 0; r < rows; ++r) result.real_rows += targets[r] != ignore;
  std::vector<double> row_loss(rows, 0.0);
  const double scale = result.real_rows > 0 ? 1.0 / static_cast<double>(result.real_rows) : 0.0;
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (threads != 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * vocab;
    const int32_t target = targets[r];
    if (target == ignore) {
      if (dlogits != nullptr) std::fill(dlogits + r * vocab, dlogits + (r + 1) * vocab, 0.0f);
      continue;
    }
    const double top = *std::max_element(z, z + vocab);
    double total = 0;
    for (int64_t n = 0; n < vocab; ++n) total += std::exp(z[n] - top);
    const double log_total = std::log(total);
    row_loss[r] = top + log_total - z[target];
    if (dlogits != nullptr) {
      float* dz = dlogits + r * vocab;
      for (int64_t n = 0; n < vocab; ++n) {
        const double p = std::exp(z[n] - top - log_total);
        dz[n] = static_cast<float>((p - (n == target ? 1.0 : 0.0)) * scale);
      }
    }
  }
  double sum = 0;
  for (const double x : row_loss) sum += x;
  result.loss = sum * scale;
  return result;
}

}  // namespace maskattn::model
