// AdamW's update, one parameter tensor's values at a time, compiled once per SIMD target
// (Highway; the update is elementwise IEEE arithmetic, one vector of values at a time); the
// optimiser's blocks and the gradient clipping around it (see optimizer.h).
#include "maskattn/model/optimizer.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/optimizer.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <vector>

#ifndef MASKATTN_MODEL_OPTIMIZER_CONSTANTS_  // once, not per target
#define MASKATTN_MODEL_OPTIMIZER_CONSTANTS_
namespace maskattn::model::adamw_detail {

// One AdamW step's scalars, in f32 as the update uses them.
struct AdamWConstants {
  float shrink, one_minus_beta1, beta2, one_minus_beta2, step_size, correction2_sqrt, eps;

  AdamWConstants(const AdamW& config, double lr, int64_t step, bool decay) {
    shrink = static_cast<float>(1.0 - lr * (decay ? config.weight_decay : 0.0));
    one_minus_beta1 = static_cast<float>(1.0 - config.beta1);
    beta2 = static_cast<float>(config.beta2);
    one_minus_beta2 = static_cast<float>(1.0 - config.beta2);
    const double correction1 = 1.0 - std::pow(config.beta1, static_cast<double>(step));
    const double correction2 = 1.0 - std::pow(config.beta2, static_cast<double>(step));
    step_size = static_cast<float>(lr / correction1);
    correction2_sqrt = static_cast<float>(std::sqrt(correction2));
    eps = static_cast<float>(config.eps);
  }
};

}  // namespace maskattn::model::adamw_detail
#endif

HWY_BEFORE_NAMESPACE();
namespace maskattn::model {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using adamw_detail::AdamWConstants;

// p, m, v [begin, end) after one AdamW step with gradient g, as torch.optim.AdamW (foreach=False)
// computes it in f32: a vector of values at a time, the same operations in the same order for
// the tail. Scalar, this was 4-6 % of the tiny GPT's training step.
void AdamWRange(const AdamWConstants& c, float* HWY_RESTRICT p, const float* HWY_RESTRICT g,
                float* HWY_RESTRICT m, float* HWY_RESTRICT v, int64_t begin, int64_t end) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto shrink = hn::Set(d, c.shrink), one_minus_beta1 = hn::Set(d, c.one_minus_beta1);
  const auto beta2 = hn::Set(d, c.beta2), one_minus_beta2 = hn::Set(d, c.one_minus_beta2);
  const auto step_size = hn::Set(d, c.step_size), eps = hn::Set(d, c.eps);
  const auto correction2_sqrt = hn::Set(d, c.correction2_sqrt);
  int64_t n = begin;
  for (; n + N <= end; n += N) {
    const auto grad = hn::LoadU(d, g + n);
    auto moment = hn::LoadU(d, m + n);
    moment = hn::Add(moment, hn::Mul(one_minus_beta1, hn::Sub(grad, moment)));  // torch.lerp
    const auto second =
        hn::Add(hn::Mul(hn::LoadU(d, v + n), beta2), hn::Mul(hn::Mul(one_minus_beta2, grad), grad));
    const auto denom = hn::Add(hn::Div(hn::Sqrt(second), correction2_sqrt), eps);
    const auto param =
        hn::Sub(hn::Mul(hn::LoadU(d, p + n), shrink), hn::Mul(step_size, hn::Div(moment, denom)));
    hn::StoreU(moment, d, m + n);
    hn::StoreU(second, d, v + n);
    hn::StoreU(param, d, p + n);
  }
  for (; n < end; ++n) {
    float param = p[n] * c.shrink;
    m[n] += c.one_minus_beta1 * (g[n] - m[n]);
    v[n] = v[n] * c.beta2 + c.one_minus_beta2 * g[n] * g[n];
    const float denom = std::sqrt(v[n]) / c.correction2_sqrt + c.eps;
    param -= c.step_size * (m[n] / denom);
    p[n] = param;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::model
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace maskattn::model {

namespace {

using adamw_detail::AdamWConstants;

HWY_EXPORT(AdamWRange);

void adamw_range(const AdamWConstants& c, float* p, const float* g, float* m, float* v,
                 int64_t begin, int64_t end) {
  HWY_DYNAMIC_DISPATCH(AdamWRange)(c, p, g, m, v, begin, end);
}

constexpr double kPi = 3.14159265358979323846;

// Values per task of the optimiser's parallel loops: large enough that a task outweighs its
// scheduling, small enough that a model's few large tensors still share out evenly.
constexpr int64_t kBlock = 16384;

// A block of one tensor: values [begin, end) of tensor `tensor`.
struct Block {
  int64_t tensor, begin, end;
};

template <class Sizes>
std::vector<Block> blocks_of(int64_t count, const Sizes& size_of) {
  std::vector<Block> blocks;
  for (int64_t t = 0; t < count; ++t) {
    for (int64_t begin = 0; begin < size_of(t); begin += kBlock) {
      blocks.push_back({t, begin, std::min(begin + kBlock, size_of(t))});
    }
  }
  return blocks;
}

// Σ x² in f64 with eight interleaved partial sums (added in a fixed order at the end): a fixed
// order that is not one serial chain of dependent additions.
double sum_of_squares(const float* x, int64_t count) {
  double part[8] = {};
  int64_t n = 0;
  for (; n + 8 <= count; n += 8) {
    for (int j = 0; j < 8; ++j) part[j] += double{x[n + j]} * x[n + j];
  }
  for (; n < count; ++n) part[n % 8] += double{x[n]} * x[n];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

}  // namespace

void adamw_step(const AdamW& config, double lr, int64_t step, bool decay, float* p, const float* g,
                float* m, float* v, int64_t count, int threads) {
  const AdamWConstants c(config, lr, step, decay);
  const int64_t blocks = (count + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) \
    num_threads(threads > 0 ? threads : 1) if (threads > 1 && blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    adamw_range(c, p, g, m, v, b * kBlock, std::min(count, (b + 1) * kBlock));
  }
}

void adamw_steps(const AdamW& config, double lr, int64_t step, const AdamWTensor* tensors,
                 int64_t count, float* p, const float* g, float* m, float* v, int threads) {
  const AdamWConstants decayed(config, lr, step, true), plain(config, lr, step, false);
  const std::vector<Block> blocks = blocks_of(count, [&](int64_t t) { return tensors[t].size; });
  const int64_t block_count = static_cast<int64_t>(blocks.size());
#pragma omp parallel for schedule(static) \
    num_threads(threads > 0 ? threads : 1) if (threads > 1 && block_count > 1)
  for (int64_t b = 0; b < block_count; ++b) {
    const AdamWTensor& tensor = tensors[blocks[b].tensor];
    const int64_t at = tensor.offset;
    adamw_range(tensor.decay ? decayed : plain, p + at, g + at, m + at, v + at, blocks[b].begin,
                blocks[b].end);
  }
}

double learning_rate(int64_t it, double lr, double min_lr, int64_t warmup, int64_t decay_steps) {
  if (it < warmup) return lr * static_cast<double>(it + 1) / static_cast<double>(warmup + 1);
  if (it > decay_steps) return min_lr;
  const double ratio = decay_steps > warmup ? static_cast<double>(it - warmup) /
                                                  static_cast<double>(decay_steps - warmup)
                                            : 1.0;
  const double coefficient = 0.5 * (1.0 + std::cos(kPi * ratio));
  return min_lr + coefficient * (lr - min_lr);
}

double clip_grad_norm(float* const* tensors, const int64_t* sizes, int64_t count, double max_norm,
                      int threads) {
  const std::vector<Block> blocks = blocks_of(count, [&](int64_t t) { return sizes[t]; });
  const int64_t block_count = static_cast<int64_t>(blocks.size());
  std::vector<double> block_sums(blocks.size());
  const bool parallel = threads > 1 && block_count > 1;
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (parallel)
  for (int64_t b = 0; b < block_count; ++b) {
    const Block& block = blocks[b];
    block_sums[b] = sum_of_squares(tensors[block.tensor] + block.begin, block.end - block.begin);
  }
  double squares = 0;
  for (const double sum : block_sums) squares += sum;
  const double norm = std::sqrt(squares);
  if (norm > max_norm) {
    const float scale = static_cast<float>(max_norm / (norm + 1e-6));
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (parallel)
    for (int64_t b = 0; b < block_count; ++b) {
      float* x = tensors[blocks[b].tensor];
      for (int64_t n = blocks[b].begin; n < blocks[b].end; ++n) x[n] *= scale;
    }
  }
  return norm;
}

}  // namespace maskattn::model
#endif  // HWY_ONCE
