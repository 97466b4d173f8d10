// Helpers shared by the test files: deterministic random data, mask grids as strings, error
// assertions, and running the CLI.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "maskattn/maskattn.h"

namespace maskattn::test {

// Uniform values in [lo, hi), reproducible from the seed.
std::vector<float> random_values(size_t count, uint64_t seed, float lo = -1.0f, float hi = 1.0f);

// Q [B,Hq,Lq,D], K [B,Hkv,Lk,D], V [B,Hkv,Lk,Dv] as contiguous f32, reproducible from the seed;
// Q and K uniform in [-spread, spread), V in [-1, 1).
struct RandomProblem {
  int64_t B, Hq, Hkv, Lq, Lk, D, Dv;
  std::vector<float> q, k, v;
  RandomProblem(int64_t b, int64_t hq, int64_t hkv, int64_t lq, int64_t lk, int64_t d, int64_t dv,
                uint64_t seed, float spread = 1.0f)
      : B(b),
        Hq(hq),
        Hkv(hkv),
        Lq(lq),
        Lk(lk),
        D(d),
        Dv(dv),
        q(random_values(b * hq * lq * d, seed, -spread, spread)),
        k(random_values(b * hkv * lk * d, seed + 1, -spread, spread)),
        v(random_values(b * hkv * lk * dv, seed + 2)) {}
  TensorView qv() const { return TensorView(q.data(), {B, Hq, Lq, D}); }
  TensorView kv() const { return TensorView(k.data(), {B, Hkv, Lk, D}); }
  TensorView vv() const { return TensorView(v.data(), {B, Hkv, Lk, Dv}); }
  MaskShape shape() const { return {B, Hq, Lq, Lk}; }
};

// Values rounded to `dtype` and stored in that dtype's bits (16-bit types) or as f32.
struct DTypeBuffer {
  DType dtype;
  std::vector<uint32_t> words;  // enough room for either width
  DTypeBuffer(const std::vector<float>& values, DType type);
  float at(size_t n) const;
  std::vector<float> floats(size_t count) const;
  TensorView view(const Dims& shape) const { return TensorView(words.data(), dtype, shape); }
  MutableTensorView mutable_view(const Dims& shape) {
    return MutableTensorView(words.data(), dtype, shape);
  }
};

// p with Q, K and V rounded to `dtype` and back (the inputs a kernel in that dtype sees).
RandomProblem rounded_to(const RandomProblem& p, DType dtype);

// Max |a − b|; infinite when only one side is NaN or the sizes differ (NaN must not hide).
float max_error(const std::vector<float>& a, const std::vector<float>& b);

// Every mask component alone and in the usual combinations, sized for p (the kernel sweeps).
std::vector<std::pair<std::string, Mask>> sweep_masks(const RandomProblem& p);
// The sweep masks a paged call takes on top of its own placement (attention_paged): not those
// setting an alignment, lengths or starts (the call places each sequence's queries itself), nor
// draft trees (they need sequences of one length).
std::vector<std::pair<std::string, Mask>> paged_sweep_masks(const RandomProblem& p);
// The sweep masks holding global tokens or a block-sparse layout.
std::vector<std::pair<std::string, Mask>> sparse_sweep_masks(const RandomProblem& p);

// The docs/design.md §5 sweep, f32: sizes 1, 2, 3, 17, 63, 64, 65, 127, 129 with Lq ≠ Lk both ways,
// D and GQA varying with the case, every sweep mask; problems seeded from `seed` + 1 on.
void for_each_edge_case(
    uint64_t seed,
    const std::function<void(const RandomProblem&, const Mask&, const std::string&)>& check);
// Three shapes across the tile edges for each 16-bit dtype, every sweep mask.
void for_each_half_precision_case(
    const std::function<void(const RandomProblem&, DType, const Mask&, const std::string&)>& check);

// The allowed grid of one (batch, head) as rows of '1' (allowed) and '.' (hidden), e.g.
// {"1...", "11..", "111.", "1111"} for causal with Lq = Lk = 4.
std::vector<std::string> grid(const Mask& mask, const MaskShape& shape, int64_t b = 0,
                              int64_t h = 0);

// Runs `statement`, expects maskattn::Error whose message contains every substring.
#define EXPECT_MASKATTN_ERROR(statement, ...)                                  \
  do {                                                                         \
    try {                                                                      \
      statement;                                                               \
      ADD_FAILURE() << "expected maskattn::Error from: " #statement;           \
    } catch (const ::maskattn::Error& error_) {                                \
      for (const std::string& part_ : std::vector<std::string>{__VA_ARGS__}) { \
        EXPECT_NE(std::string(error_.what()).find(part_), std::string::npos)   \
            << "message: " << error_.what() << "\nmissing: " << part_;         \
      }                                                                        \
    }                                                                          \
  } while (0)

// A fresh directory under /tmp, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path(const std::string& name) const { return root_ + "/" + name; }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};
// Runs the maskattn binary with `arguments` (already shell-quoted where needed).
CliResult run_cli(const std::string& arguments);

}  // namespace maskattn::test
