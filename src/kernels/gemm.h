// Dense f32 matrix products of the layers on many rows: the GPT model's linears and LM head, and
// MultiHeadAttention's projections, forward and backward. This header is maskattn's own interface;
// the library behind it (oneDNN) appears only in gemm.cc and never in a public header.
//
// Why oneDNN. bench/gemm_study measured the candidates Debian 12 packages at the default model's
// shapes (docs/benchmarks.md, "Dense products of the layers"): oneDNN 2.6.3's sgemm is the fastest
// there, and it picks its kernels from the CPU's instruction sets (AVX-512 on Zen 5 and on Xeon),
// where OpenBLAS 0.3.21 picks them from its CPU model table, or from OPENBLAS_CORETYPE when set
// (set to Haswell it halves the vector width), and BLIS 0.9.0 does not know Zen 5 and falls back to
// its generic kernels. oneDNN also runs on the same OpenMP runtime as maskattn (Debian builds it
// with GNU OpenMP), so it brings no thread pool of its own to compete with ours.
//
// Threads and determinism. The library is never asked to split a product across threads: C is cut
// into a fixed grid of kBlockRows × kBlockCols blocks, whose edges depend on the shape only, and
// each block is one single-threaded library call, the blocks shared out by OpenMP. Every element is
// therefore computed by the same code in the same order whatever the thread count: the bits do not
// depend on `threads`. Unlike kernels/matmul.h, a row's bits MAY depend on the other rows of the
// call (the library chooses its kernels and blockings by shape), and across machines or oneDNN
// versions (and under DNNL_MAX_CPU_ISA) the bits may differ. Paths that need a row to come out the
// same alone and in a batch (the KV cache, serving) keep kernels/matmul.h.
#pragma once

#include <cstdint>

namespace maskattn::detail {

// Whether an operand is used as stored or transposed.
enum class Layout : uint8_t { as_stored, transposed };

// What is added to each element of the product once it is complete, in this order:
// C[r][n] = (C[r][n] + bias[n]) + residual[r·ld_residual + n]; a null pointer adds nothing. It
// runs on the block of C just computed, by the thread that computed it, while the block is in its
// cache: a layer's bias and residual adds, run afterwards over the whole output on one thread, had
// cost the GPT's training step about 1 ms with the other thread idle. The sums and their order are
// those of adding afterwards, so are the bits.
struct GemmEpilogue {
  const float* bias = nullptr;      // [cols]
  const float* residual = nullptr;  // [rows, ld_residual]
  int64_t ld_residual = 0;
};

// C [rows, cols] (+)= op(A) [rows, inner] · op(B) [inner, cols], all row-major with leading
// dimensions lda, ldb, ldc (elements between consecutive stored rows). op(A) = A, or Aᵀ for
// Layout::transposed (then A is stored [inner, rows]); likewise B. With `accumulate` false C is
// overwritten; with it true the product is added to C. `threads` = 0 uses OpenMP's default. The
// epilogue's adds follow (on C as a whole when accumulating: its old value plus the product).
void gemm(Layout a_layout, Layout b_layout, int64_t rows, int64_t cols, int64_t inner,
          const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
          bool accumulate, int threads, const GemmEpilogue& epilogue = {});

}  // namespace maskattn::detail
