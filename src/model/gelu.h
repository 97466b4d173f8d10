// GELU, the exact form (PyTorch's nn.GELU() default, which nanoGPT's MLP uses):
//
//   gelu(x) = x·Φ(x) = ½·x·(1 + erf(x/√2)),   gelu'(x) = Φ(x) + x·φ(x),  φ(x) = e^(−x²/2)/√(2π)
//
// Elementwise, so any split across threads gives the same bits.
#pragma once

#include <cstdint>

namespace maskattn::model {

void gelu_forward(const float* x, int64_t count, float* y, int threads);
// dx = dy·gelu'(x) (overwritten; dx may be dy).
void gelu_backward(const float* x, const float* dy, int64_t count, float* dx, int threads);

}  // namespace maskattn::model
