// Uses only the installed headers and library: the 'I love dog' worked example through the public
// API. Exits 0 when the output matches the example's published numbers to 3 decimals.
#include <cmath>
#include <cstdio>
#include <vector>

#include "maskattn/maskattn.h"

int main() {
  const std::vector<float> x = {1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 0, 0};
  std::vector<float> out(12);
  const maskattn::TensorView q(x.data(), {1, 1, 3, 4});
  maskattn::attention(q, q, q, maskattn::MutableTensorView(out.data(), {1, 1, 3, 4}),
                      maskattn::Mask().causal());
  const double expected[12] = {1, 0, 1, 0, 0.269, 0.731, 0.269, 0.731, 0.726, 0.726, 0.274, 0.274};
  for (int n = 0; n < 12; ++n) {
    if (std::fabs(out[n] - expected[n]) > 5e-4) {
      std::printf("consumer: output[%d] = %.6f, expected %.3f\n", n, out[n], expected[n]);
      return 1;
    }
  }
  // The backward with Gradients{dq, dk, dv}: this project builds with -Wextra -Werror, so the
  // aggregate's missing-field warning would fail it.
  std::vector<float> lse(3), dout(12, 1.0f), dq(12), dk(12), dv(12);
  maskattn::attention(q, q, q, maskattn::MutableTensorView(out.data(), {1, 1, 3, 4}),
                      maskattn::Mask().causal(), {}, {},
                      maskattn::MutableTensorView(lse.data(), {1, 1, 3}));
  maskattn::attention_backward(
      q, q, q, maskattn::TensorView(out.data(), {1, 1, 3, 4}),
      maskattn::TensorView(lse.data(), {1, 1, 3}), maskattn::TensorView(dout.data(), {1, 1, 3, 4}),
      maskattn::Gradients{maskattn::MutableTensorView(dq.data(), {1, 1, 3, 4}),
                          maskattn::MutableTensorView(dk.data(), {1, 1, 3, 4}),
                          maskattn::MutableTensorView(dv.data(), {1, 1, 3, 4})},
      maskattn::Mask().causal());
  // dV = Pᵀ·dO: key 0 gets the weights of every query on it, 1 + 0.269 + 0.274.
  if (std::fabs(dv[0] - 1.543f) > 5e-4) {
    std::printf("consumer: dv[0] = %.6f, expected 1.543\n", dv[0]);
    return 1;
  }
  std::printf("consumer: maskattn worked example OK\n");
  return 0;
}
