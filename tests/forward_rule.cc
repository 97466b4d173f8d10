#include "forward_rule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/block_skipping.h"

namespace maskattn::test {

Result run(const RandomProblem& p, DType dtype, const Mask& mask, const ScoreMods& mods,
           Options options) {
  const DTypeBuffer q(p.q, dtype), k(p.k, dtype), v(p.v, dtype);
  DTypeBuffer out(std::vector<float>(p.B * p.Hq * p.Lq * p.Dv, -7.0f), dtype);
  Result result;
  result.lse.assign(p.B * p.Hq * p.Lq, -7.0f);
  attention(TensorView(q.words.data(), dtype, {p.B, p.Hq, p.Lq, p.D}),
            TensorView(k.words.data(), dtype, {p.B, p.Hkv, p.Lk, p.D}),
            TensorView(v.words.data(), dtype, {p.B, p.Hkv, p.Lk, p.Dv}),
            MutableTensorView(out.words.data(), dtype, {p.B, p.Hq, p.Lq, p.Dv}), mask, mods,
            options, MutableTensorView(result.lse.data(), {p.B, p.Hq, p.Lq}));
  result.out = out.floats(p.B * p.Hq * p.Lq * p.Dv);
  return result;
}

Result run_kernel(const RandomProblem& p, DType dtype, const Mask& mask, const ScoreMods& mods,
                  Kernel kernel, int threads, bool skipping, Products products) {
  Options options;
  options.products = products;
  options.kernel = kernel;
  options.threads = threads;
  const detail::ScopedBlockSkipping scoped_skipping(skipping);
  return run(p, dtype, mask, mods, options);
}

std::vector<float> naive(const RandomProblem& p, DType dtype, const Mask& mask) {
  const std::vector<float> q = DTypeBuffer(p.q, dtype).floats(p.q.size());
  const std::vector<float> k = DTypeBuffer(p.k, dtype).floats(p.k.size());
  const std::vector<float> v = DTypeBuffer(p.v, dtype).floats(p.v.size());
  const Array<uint8_t> allowed = allowed_pairs(mask, p.shape());
  const float scale = 1.0f / std::sqrt(static_cast<float>(p.D));
  std::vector<float> out(p.B * p.Hq * p.Lq * p.Dv, 0.0f), s(p.Lk);
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.Hq; ++h) {
      const int64_t g = h / (p.Hq / p.Hkv);
      for (int64_t i = 0; i < p.Lq; ++i) {
        float max = -INFINITY;
        for (int64_t j = 0; j < p.Lk; ++j) {
          s[j] = -INFINITY;
          if (!allowed.values()[((b * p.Hq + h) * p.Lq + i) * p.Lk + j]) continue;
          float dot = 0.0f;
          for (int64_t d = 0; d < p.D; ++d) {
            dot += q[((b * p.Hq + h) * p.Lq + i) * p.D + d] *
                   k[((b * p.Hkv + g) * p.Lk + j) * p.D + d];
          }
          s[j] = scale * dot;
          max = std::max(max, s[j]);
        }
        if (max == -INFINITY) continue;
        float total = 0.0f;
        for (float& x : s) total += (x = std::exp(x - max));
        float* o = out.data() + ((b * p.Hq + h) * p.Lq + i) * p.Dv;
        for (int64_t j = 0; j < p.Lk; ++j) {
          for (int64_t e = 0; e < p.Dv; ++e)
            o[e] += s[j] / total * v[((b * p.Hkv + g) * p.Lk + j) * p.Dv + e];
        }
      }
    }
  }
  return DTypeBuffer(out, dtype).floats(out.size());
}

void expect_within_rule(const RandomProblem& p, DType dtype, const Mask& mask,
                        const std::string& what, Products products) {
  const Result fused = run_kernel(p, dtype, mask, {}, Kernel::fused, 0, true, products);
  // The oracle: the f64 reference on the same (rounded) inputs, its output kept in f32.
  const RandomProblem rounded = rounded_to(p, dtype);
  const Result exact = run_kernel(rounded, DType::f32, mask, {}, Kernel::reference);
  const float naive_error = max_error(naive(p, dtype, mask), exact.out);
  const float fused_error = max_error(fused.out, exact.out);
  EXPECT_LE(fused_error, 2 * naive_error + 1e-6f)
      << what << " dtype " << dtype_name(dtype) << ": fused " << fused_error << ", naive "
      << naive_error;
  for (size_t n = 0; n < fused.lse.size(); ++n) {
    if (std::isinf(exact.lse[n])) {
      ASSERT_EQ(fused.lse[n], exact.lse[n]) << what << " row " << n;
    } else {
      ASSERT_NEAR(fused.lse[n], exact.lse[n], 1e-5 * (1 + std::fabs(exact.lse[n]))) << what;
    }
  }
}

}  // namespace maskattn::test
