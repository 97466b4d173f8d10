// The forward kernels' accuracy rule (docs/design.md §5) and the calls the forward tests share:
// fused_test.cc (the kernels) and products_test.cc (every product unit of the tile kernel).
#pragma once

#include <string>
#include <vector>

#include "maskattn/attention.h"
#include "test_util.h"

namespace maskattn::test {

struct Result {
  std::vector<float> out, lse;
};

// attention() on p's inputs rounded to `dtype`, the output read back as f32; out and LSE start
// as −7 so that a row the kernel forgets shows.
Result run(const RandomProblem& p, DType dtype, const Mask& mask, const ScoreMods& mods,
           Options options);

// The same with the kernel, thread count, block skipping and product unit chosen.
Result run_kernel(const RandomProblem& p, DType dtype, const Mask& mask, const ScoreMods& mods,
                  Kernel kernel, int threads = 0, bool skipping = true,
                  Products products = Products::automatic);

// The naive implementation in the dtype under test: inputs rounded to the dtype, then plain f32
// arithmetic (S, softmax with std::exp, P·V) over the mask's allowed pairs, output rounded once.
std::vector<float> naive(const RandomProblem& p, DType dtype, const Mask& mask);

// The rule: the fused kernel's max error against the f64 reference (on the same rounded inputs)
// is at most 2× the naive implementation's + 1e-6, on outputs; LSE within 1e-5 relative.
void expect_within_rule(const RandomProblem& p, DType dtype, const Mask& mask,
                        const std::string& what, Products products = Products::automatic);

}  // namespace maskattn::test
