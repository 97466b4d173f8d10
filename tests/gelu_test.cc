// The f32 SIMD GELU (src/model/gelu.cc) against the exact form in double precision: its error in
// ulps over a dense sample of every f32 exponent in range, its special values, and the same bits
// whatever the thread count, the chunking or a value's position in the array.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "model/gelu.h"
#include "test_util.h"

namespace maskattn {
namespace {

// The spacing of f32 values at |v| (subnormal spacing below the normal range).
double ulp_at(double v) {
  const float f = static_cast<float>(std::fabs(v));
  return static_cast<double>(std::nextafter(f, std::numeric_limits<float>::infinity())) - f;
}

// Φ(x) in double: erfc keeps its relative accuracy in the lower tail, where 1 + erf would not.
double normal_cdf(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0));
}

// f32 values with |x| from 2⁻³⁰ to 16 (both signs), every `stride`-th bit pattern: a sample of
// every exponent the activations reach and of the tail, where gelu goes subnormal near x = −13.3.
std::vector<float> sample_grid(uint32_t stride) {
  uint32_t low, high;
  const float from = std::ldexp(1.0f, -30), to = 16.0f;
  std::memcpy(&low, &from, sizeof low);
  std::memcpy(&high, &to, sizeof high);
  std::vector<float> x(2 * ((high - low) / stride + 1));
  for (size_t n = 0; n < x.size(); n += 2) {
    const uint32_t bits = low + static_cast<uint32_t>(n / 2) * stride;
    std::memcpy(&x[n], &bits, sizeof(float));
    x[n + 1] = -x[n];
  }
  return x;
}

TEST(Gelu, ForwardAndDerivativeWithinFewUlpsOfTheExactForm) {
  const std::vector<float> x = sample_grid(101);
  std::vector<float> y(x.size()), dx(x.size()), ones(x.size(), 1.0f);
  model::gelu_forward(x.data(), static_cast<int64_t>(x.size()), y.data(), 2);
  model::gelu_backward(x.data(), ones.data(), static_cast<int64_t>(x.size()), dx.data(), 2);
  const double kFloatMin = std::numeric_limits<float>::min();
  double worst_forward = 0, worst_backward = 0;
  float worst_forward_x = 0, worst_backward_x = 0;
  for (size_t n = 0; n < x.size(); ++n) {
    const double v = x[n];
    const double cdf = normal_cdf(v);
    const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
    // gelu' = Φ + x·φ cancels near x ≈ −0.75: measured against the scale of its two terms.
    const double forward_scale = std::fabs(v * cdf), backward_scale = cdf + std::fabs(v * pdf);
    const double forward_error = std::fabs(y[n] - v * cdf);
    const double backward_error = std::fabs(dx[n] - (cdf + v * pdf));
    // Results below f32's normal range (x < −13.2) keep an absolute bound: gelu.cc sets the
    // tail to 0 past |x| = 14, where the exact values are a few hundred subnormal ulps at most.
    if (forward_scale < kFloatMin || backward_scale < kFloatMin) {
      EXPECT_LE(forward_error, kFloatMin) << x[n];
      EXPECT_LE(backward_error, kFloatMin) << x[n];
      continue;
    }
    const double forward = forward_error / ulp_at(forward_scale);
    const double backward = backward_error / ulp_at(backward_scale);
    if (forward > worst_forward) worst_forward = forward, worst_forward_x = x[n];
    if (backward > worst_backward) worst_backward = backward, worst_backward_x = x[n];
  }
  // gelu.cc's error budget is about 5 ulps; a denser sample measured 5.4 and 3.9 (its comment).
  EXPECT_LE(worst_forward, 6.0) << "at x = " << worst_forward_x;
  EXPECT_LE(worst_backward, 6.0) << "at x = " << worst_backward_x;
  RecordProperty("worst_forward_ulps", std::to_string(worst_forward));
  RecordProperty("worst_backward_ulps", std::to_string(worst_backward));
  std::printf("gelu: worst %.2f ulps at x = %.9g; gelu': worst %.2f ulps at x = %.9g\n",
              worst_forward, worst_forward_x, worst_backward, worst_backward_x);
}

TEST(Gelu, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {0.0f, -0.0f, inf, -inf, nan, -20.0f, 20.0f, -1e30f, 1e30f};
  std::vector<float> y(x.size()), dx(x.size()), ones(x.size(), 1.0f);
  model::gelu_forward(x.data(), static_cast<int64_t>(x.size()), y.data(), 1);
  model::gelu_backward(x.data(), ones.data(), static_cast<int64_t>(x.size()), dx.data(), 1);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], inf);
  EXPECT_TRUE(std::isnan(y[3]));  // −inf·Φ(−inf) = −inf·0, as ½·x·(1 + erf) gives
  EXPECT_TRUE(std::isnan(y[4]));
  EXPECT_EQ(y[5], 0.0f);
  EXPECT_EQ(y[6], 20.0f);
  EXPECT_EQ(y[7], 0.0f);
  EXPECT_EQ(y[8], 1e30f);
  EXPECT_EQ(dx[0], 0.5f);
  EXPECT_TRUE(std::isnan(dx[2]));  // Φ + inf·0, as PyTorch's backward
  EXPECT_TRUE(std::isnan(dx[3]));
  EXPECT_TRUE(std::isnan(dx[4]));
  EXPECT_EQ(dx[5], 0.0f);
  EXPECT_EQ(dx[6], 1.0f);
}

TEST(Gelu, SameBitsForAnyThreadCountChunkingAndPosition) {
  const int64_t count = 100003;  // several chunks and a ragged vector tail
  const std::vector<float> x = test::random_values(count, 5, -6.0f, 6.0f);
  const std::vector<float> dy = test::random_values(count, 6);
  std::vector<float> y1(count), y3(count), dx1(count), dx3(count);
  model::gelu_forward(x.data(), count, y1.data(), 1);
  model::gelu_forward(x.data(), count, y3.data(), 3);
  model::gelu_backward(x.data(), dy.data(), count, dx1.data(), 1);
  model::gelu_backward(x.data(), dy.data(), count, dx3.data(), 3);
  EXPECT_EQ(std::memcmp(y1.data(), y3.data(), count * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(dx1.data(), dx3.data(), count * sizeof(float)), 0);
  // Each value alone (as a decoding step's short row) and shifted against the vector lanes.
  for (int64_t n = 0; n < count; n += 997) {
    float alone, alone_dx;
    model::gelu_forward(&x[n], 1, &alone, 2);
    model::gelu_backward(&x[n], &dy[n], 1, &alone_dx, 2);
    EXPECT_EQ(std::memcmp(&alone, &y1[n], sizeof alone), 0) << n;
    EXPECT_EQ(std::memcmp(&alone_dx, &dx1[n], sizeof alone_dx), 0) << n;
  }
  std::vector<float> shifted(count - 3);
  model::gelu_forward(x.data() + 3, count - 3, shifted.data(), 2);
  EXPECT_EQ(std::memcmp(shifted.data(), y1.data() + 3, shifted.size() * sizeof(float)), 0);
  // In place, as Gpt::backward calls it (dx = dy).
  std::vector<float> in_place = dy;
  model::gelu_backward(x.data(), in_place.data(), count, in_place.data(), 2);
  EXPECT_EQ(std::memcmp(in_place.data(), dx1.data(), count * sizeof(float)), 0);
}

}  // namespace
}  // namespace maskattn
