// LayerNorm over the last axis, forward and backward (the pre-LayerNorm blocks of the GPT model).
//
//   x̂ = (x − μ)·r,  r = 1/√(σ² + ε),  y = γ·x̂ + β
//
// with μ and σ² the row's mean and biased variance (PyTorch's nn.LayerNorm). The backward follows
// from ∂y/∂x through x̂ (a row of width n, g = γ·dy):
//
//   dx = r·(g − mean(g) − x̂·mean(g·x̂)),   dγ = Σ_rows dy·x̂,   dβ = Σ_rows dy
//
// Row statistics are summed in f64 (one pass for μ, one for σ² around it), so that the result does
// not depend on how large the row's offset is, each as eight interleaved partial sums added in a
// fixed order (not one chain of dependent additions). Rows run in parallel; dγ and dβ are summed
// over the rows in row order, so every result is the same bits for any thread count.
#pragma once

#include <cstdint>

namespace maskattn::model {

// y [rows, width]; mean and rstd [rows] are kept for the backward.
void layer_norm_forward(const float* x, int64_t rows, int64_t width, const float* gamma,
                        const float* beta, float eps, float* y, float* mean, float* rstd,
                        int threads);

// dx [rows, width] (overwritten, or added to with `accumulate_dx`: a residual branch's gradient
// joining the stream's); dgamma and dbeta [width] are accumulated into (+=).
void layer_norm_backward(const float* x, const float* dy, int64_t rows, int64_t width,
                         const float* gamma, const float* mean, const float* rstd, float* dx,
                         float* dgamma, float* dbeta, int threads, bool accumulate_dx = false);

}  // namespace maskattn::model
