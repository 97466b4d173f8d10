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
  std::printf("consumer: maskattn worked example OK\n");
  return 0;
}
