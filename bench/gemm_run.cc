// One engine's dense f32 products at the GPT model's shapes (bench/gemm_study runs it, one process
// per engine so that each library loads alone and picks its kernels from a clean environment):
//   gemm_run --engine matmul|cblas|dnnl [--library PATH] [--mode library|blocks] --threads T
//            [--rows 1024]
// The libraries are opened with dlopen, so the binary links none of them and one build measures
// every Debian variant (OpenBLAS serial, pthread and OpenMP; BLIS serial and OpenMP; oneDNN).
//
// Per linear layer (in → out) it times the training step's three products, row-major as the
// model stores them (W [out, in] as nn.Linear):
//   forward   y [rows, out] = x [rows, in] · Wᵀ
//   dx        dx [rows, in] = dy [rows, out] · W
//   dW        dW [out, in]  = dyᵀ · x            (the sum runs over the rows)
// and the decode step's forward on one row. Modes: `library` makes one call with the library's own
// threads set to T; `blocks` pins the library to one thread and runs a fixed grid of output blocks
// (--block-rows × --block-cols, 64 × 512 by default) on T OpenMP threads (the scheme whose bits do
// not depend on T). `matmul` is maskattn's own product (src/kernels/matmul.h) with T threads.
// Prints one line per product:
//   product=c_fc op=forward rows=1024 in=128 out=512 gflops=123.4 us=104.2
#include <dlfcn.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/splitmix64.h"
#include "kernels/matmul.h"

namespace {

// The entry points, declared here with the ABI the Debian packages ship (32-bit BLAS integers;
// oneDNN's 64-bit dnnl_dim_t), so that no header of a library is needed.
using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                            int, float, float*, int);
using DnnlSgemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
int64_t block_rows = 64, block_cols = 512;  // the output block per OpenMP work item (`blocks`)

// C [m, n] = op(A) · op(B) with row-major operands, as CBLAS states it.
using Product =
    std::function<void(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a,
                       int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc)>;

struct Engine {
  std::string name;
  Product product;  // whole product, library threads as set
  int threads = 1;
  bool blocks = false;
};

void* open_or_die(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::fprintf(stderr, "gemm_run: %s\n", dlerror());
    std::exit(2);
  }
  return handle;
}

// Sets the library's own thread count where it has one (OpenBLAS, BLIS); oneDNN follows OpenMP.
void set_library_threads(void* handle, int threads) {
  if (auto* set = reinterpret_cast<void (*)(int)>(dlsym(handle, "openblas_set_num_threads"))) {
    set(threads);
  }
  if (auto* set =
          reinterpret_cast<void (*)(int64_t)>(dlsym(handle, "bli_thread_set_num_threads"))) {
    set(threads);
  }
  omp_set_num_threads(threads);
}

Product library_product(const std::string& engine, void* handle) {
  if (engine == "dnnl") {
    auto* sgemm = reinterpret_cast<DnnlSgemm>(dlsym(handle, "dnnl_sgemm"));
    if (sgemm == nullptr) {
      std::fprintf(stderr, "gemm_run: no dnnl_sgemm in the library\n");
      std::exit(2);
    }
    return [sgemm](bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                   const float* b, int64_t ldb, float* c, int64_t ldc) {
      const int status =
          sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
      if (status != 0) {  // dnnl_success is 0: a timing of a failed call would mean nothing
        std::fprintf(stderr, "gemm_run: dnnl_sgemm failed with status %d\n", status);
        std::exit(2);
      }
    };
  }
  auto* sgemm = reinterpret_cast<CblasSgemm>(dlsym(handle, "cblas_sgemm"));
  if (sgemm == nullptr) {
    std::fprintf(stderr, "gemm_run: no cblas_sgemm in the library\n");
    std::exit(2);
  }
  return [sgemm](bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float* c, int64_t ldc) {
    sgemm(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, static_cast<int>(m),
          static_cast<int>(n), static_cast<int>(k), 1.0f, a, static_cast<int>(lda), b,
          static_cast<int>(ldb), 0.0f, c, static_cast<int>(ldc));
  };
}

// The product on the engine: in `blocks` mode, a fixed grid of block_rows × block_cols output
// blocks on OpenMP, one single-threaded library call each.
void run(const Engine& engine, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a,
         int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc) {
  const int64_t row_blocks = (m + block_rows - 1) / block_rows;
  const int64_t col_blocks = (n + block_cols - 1) / block_cols;
  if (!engine.blocks || row_blocks * col_blocks == 1) {
    engine.product(ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(engine.threads)
  for (int64_t block = 0; block < row_blocks * col_blocks; ++block) {
    const int64_t row = block / col_blocks * block_rows, col = block % col_blocks * block_cols;
    // Row `row` of op(A) and column `col` of op(B), whichever way each is stored.
    const float* a_block = ta ? a + row : a + row * lda;
    const float* b_block = tb ? b + col * ldb : b + col;
    engine.product(ta, tb, std::min(block_rows, m - row), std::min(block_cols, n - col), k, a_block,
                   lda, b_block, ldb, c + row * ldc + col, ldc);
  }
}

std::vector<float> random_floats(int64_t count, uint64_t seed) {
  std::vector<float> values(count);
  maskattn::detail::SplitMix64 generator(seed);
  for (float& v : values) v = static_cast<float>(generator.uniform(-1.0, 1.0));
  return values;
}

// Microseconds per call: the median of 7 batches, each of as many calls as fill ~15 ms.
double time_us(const std::function<void()>& call) {
  for (int n = 0; n < 3; ++n) call();
  const auto start = std::chrono::steady_clock::now();
  call();
  const double once =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int calls = std::max(1, static_cast<int>(0.015 / std::max(once, 1e-7)));
  std::vector<double> batches;
  for (int batch = 0; batch < 7; ++batch) {
    const auto begin = std::chrono::steady_clock::now();
    for (int n = 0; n < calls; ++n) call();
    batches.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - begin)
            .count() /
        calls);
  }
  std::sort(batches.begin(), batches.end());
  return batches[batches.size() / 2];
}

void report(const char* product, const char* op, int64_t rows, int64_t in, int64_t out, double us) {
  const double flops = 2.0 * static_cast<double>(rows) * static_cast<double>(in) * out;
  std::printf("product=%s op=%s rows=%lld in=%lld out=%lld gflops=%.2f us=%.2f\n", product, op,
              static_cast<long long>(rows), static_cast<long long>(in), static_cast<long long>(out),
              flops / us * 1e-3, us);
}

// The three training products and the decode row of one linear layer in → out.
void measure_layer(const Engine& engine, bool ours, int threads, const char* name, int64_t rows,
                   int64_t in, int64_t out) {
  namespace md = maskattn::detail;
  const std::vector<float> x = random_floats(rows * in, 1), w = random_floats(out * in, 2);
  const std::vector<float> dy = random_floats(rows * out, 3);
  std::vector<float> wt(in * out), y(rows * out), dx(rows * in), dw(out * in);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) wt[i * out + o] = w[o * in + i];
  }
  const auto forward = [&](int64_t m) {
    if (ours)
      return md::matmul(x.data(), in, 1, m, in, wt.data(), out, out, y.data(), out, false, threads);
    run(engine, false, true, m, out, in, x.data(), in, w.data(), in, y.data(), out);
  };
  report(name, "forward", rows, in, out, time_us([&] { forward(rows); }));
  report(name, "dx", rows, in, out, time_us([&] {
           if (ours)
             return md::matmul(dy.data(), out, 1, rows, out, w.data(), in, in, dx.data(), in, false,
                               threads);
           run(engine, false, false, rows, in, out, dy.data(), out, w.data(), in, dx.data(), in);
         }));
  report(name, "dW", rows, in, out, time_us([&] {
           if (ours)
             return md::matmul(dy.data(), 1, out, out, rows, x.data(), in, in, dw.data(), in, false,
                               threads);
           // dW [out, in] = dyᵀ · x: the blocks are rows of dW, i.e. columns of dy.
           run(engine, true, false, out, in, rows, dy.data(), out, x.data(), in, dw.data(), in);
         }));
  report(name, "decode", 1, in, out, time_us([&] { forward(1); }));
}

}  // namespace

int main(int argc, char** argv) {
  std::string engine_name = "matmul", library, mode = "library";
  int threads = 1;
  int64_t rows = 1024;
  CLI::App app{"time dense f32 products at the GPT model's shapes on one engine"};
  app.add_option("--engine", engine_name)->check(CLI::IsMember({"matmul", "cblas", "dnnl"}));
  app.add_option("--library", library, "shared library to dlopen (cblas, dnnl)");
  app.add_option("--mode", mode)->check(CLI::IsMember({"library", "blocks"}));
  app.add_option("--threads", threads)->check(CLI::Range(1, 256));
  app.add_option("--rows", rows)->check(CLI::Range(1, 1 << 20));
  app.add_option("--block-rows", block_rows)->check(CLI::Range(1, 1 << 20));
  app.add_option("--block-cols", block_cols)->check(CLI::Range(1, 1 << 20));
  CLI11_PARSE(app, argc, argv);
  const bool ours = engine_name == "matmul";
  Engine engine{engine_name, {}, threads, mode == "blocks"};
  if (!ours) {
    if (library.empty()) {  // dlopen("") would hand back this program, which has no sgemm
      std::fprintf(stderr, "gemm_run: --engine %s needs --library (a path or soname, e.g. %s)\n",
                   engine_name.c_str(),
                   engine_name == "dnnl" ? "libdnnl.so.2" : "libopenblas.so.0");
      return 2;
    }
    void* handle = open_or_die(library);
    set_library_threads(handle, engine.blocks ? 1 : threads);
    engine.product = library_product(engine_name, handle);
  }
  // The default model: d_model 128, MLP 512; MultiHeadAttention's q, k, v (one 128 → 384 product
  // when fused) and its output projection.
  measure_layer(engine, ours, threads, "c_fc", rows, 128, 512);
  measure_layer(engine, ours, threads, "c_proj", rows, 512, 128);
  measure_layer(engine, ours, threads, "qkv", rows, 128, 384);
  measure_layer(engine, ours, threads, "out", rows, 128, 128);
  return 0;
}
