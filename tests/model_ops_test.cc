// The GPT model's building blocks (src/model/): LayerNorm, GELU, the linear layers on the dense
// library product (kernels/gemm.h), cross-entropy and the optimiser, against f64 formulas written
// out here, central finite differences, and thread-count determinism.
#include <omp.h>

#include <cmath>
#include <functional>

#include "kernels/gemm.h"
#include "maskattn/model/cross_entropy.h"
#include "maskattn/model/optimizer.h"
#include "model/gelu.h"
#include "model/layer_norm.h"
#include "model/linear.h"
#include "test_util.h"

namespace maskattn {
namespace {

using test::random_values;

// Central differences of a scalar function of x, in f64.
std::vector<double> central_differences(const std::vector<double>& x,
                                        const std::function<double(const std::vector<double>&)>& f,
                                        double h) {
  std::vector<double> grad(x.size());
  std::vector<double> shifted = x;
  for (size_t n = 0; n < x.size(); ++n) {
    shifted[n] = x[n] + h;
    const double up = f(shifted);
    shifted[n] = x[n] - h;
    const double down = f(shifted);
    shifted[n] = x[n];
    grad[n] = (up - down) / (2 * h);
  }
  return grad;
}

// y = γ·(x − μ)/√(σ² + ε) + β per row, in f64.
std::vector<double> layer_norm_f64(const std::vector<double>& x, int64_t rows, int64_t width,
                                   const std::vector<float>& gamma, const std::vector<float>& beta,
                                   double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t n = 0; n < width; ++n) mu += x[r * width + n] / width;
    for (int64_t n = 0; n < width; ++n) var += std::pow(x[r * width + n] - mu, 2) / width;
    for (int64_t n = 0; n < width; ++n) {
      y[r * width + n] = gamma[n] * (x[r * width + n] - mu) / std::sqrt(var + eps) + beta[n];
    }
  }
  return y;
}

TEST(LayerNorm, ForwardMatchesTheFormulaAndBackwardTheFiniteDifferences) {
  const int64_t rows = 5, width = 24;
  std::vector<float> x = random_values(rows * width, 1), gamma = random_values(width, 2),
                     beta = random_values(width, 3), dy = random_values(rows * width, 4);
  for (float& v : x) v = 3.0f * v + 7.0f;  // an offset: the statistics must not care
  std::vector<float> y(rows * width), mean(rows), rstd(rows);
  model::layer_norm_forward(x.data(), rows, width, gamma.data(), beta.data(), 1e-5f, y.data(),
                            mean.data(), rstd.data(), 1);
  const std::vector<double> x64(x.begin(), x.end());
  const std::vector<double> expected = layer_norm_f64(x64, rows, width, gamma, beta, 1e-5);
  for (size_t n = 0; n < y.size(); ++n) EXPECT_NEAR(y[n], expected[n], 2e-6) << n;

  std::vector<float> dx(rows * width), dgamma(width, 0.5f), dbeta(width, 0.25f);
  model::layer_norm_backward(x.data(), dy.data(), rows, width, gamma.data(), mean.data(),
                             rstd.data(), dx.data(), dgamma.data(), dbeta.data(), 1);
  const auto loss = [&](const std::vector<double>& input) {
    const std::vector<double> out = layer_norm_f64(input, rows, width, gamma, beta, 1e-5);
    double sum = 0;
    for (size_t n = 0; n < out.size(); ++n) sum += out[n] * dy[n];
    return sum;
  };
  const std::vector<double> fd = central_differences(x64, loss, 1e-5);
  for (size_t n = 0; n < dx.size(); ++n) EXPECT_NEAR(dx[n], fd[n], 1e-4) << n;
  for (int64_t n = 0; n < width; ++n) {
    double expect_gamma = 0.5, expect_beta = 0.25;  // accumulated into
    for (int64_t r = 0; r < rows; ++r) {
      expect_gamma += dy[r * width + n] * (expected[r * width + n] - beta[n]) / gamma[n];
      expect_beta += dy[r * width + n];
    }
    EXPECT_NEAR(dgamma[n], expect_gamma, 1e-4) << n;
    EXPECT_NEAR(dbeta[n], expect_beta, 1e-5) << n;
  }
}

TEST(LayerNorm, SameBitsForAnyThreadCount) {
  const int64_t rows = 37, width = 48;
  const std::vector<float> x = random_values(rows * width, 5), gamma = random_values(width, 6),
                           beta = random_values(width, 7), dy = random_values(rows * width, 8);
  std::vector<std::vector<float>> results;
  for (const int threads : {1, 2, 3}) {
    std::vector<float> y(rows * width), mean(rows), rstd(rows), dx(rows * width),
        dgamma(width, 0.0f), dbeta(width, 0.0f);
    model::layer_norm_forward(x.data(), rows, width, gamma.data(), beta.data(), 1e-5f, y.data(),
                              mean.data(), rstd.data(), threads);
    model::layer_norm_backward(x.data(), dy.data(), rows, width, gamma.data(), mean.data(),
                               rstd.data(), dx.data(), dgamma.data(), dbeta.data(), threads);
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dgamma.begin(), dgamma.end());
    results.push_back(y);
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

// Shapes that cut the outputs into several of gemm's 64 × 512 blocks (and partial ones): 200 rows,
// 96 → 600 features, so y and dx have 4 row blocks and y and dW 2 column blocks.
TEST(Linear, ForwardAndBackwardMatchF64AndGiveTheSameBitsForAnyThreadCount) {
  const int64_t rows = 200, in = 96, out = 600;
  const std::vector<float> x = random_values(rows * in, 31), w = random_values(out * in, 32);
  const std::vector<float> b = random_values(out, 33), dy = random_values(rows * out, 34);
  const std::vector<float> dw_start = random_values(out * in, 35);
  const std::vector<float> residual = random_values(rows * out, 36);
  std::vector<std::vector<float>> ys, dxs, dws, dbs;
  const int caller_threads = omp_get_max_threads();
  for (const int threads : {1, 2, 3}) {
    std::vector<float> y(rows * out), dx(rows * in), dw = dw_start, db(out, 0.0f);
    model::linear_forward(x.data(), rows, in, w.data(), b.data(), out, y.data(), threads);
    model::linear_backward(x.data(), dy.data(), rows, in, out, w.data(), dx.data(), dw.data(),
                           db.data(), threads);
    // oneDNN is pinned to one thread per block inside gemm's own region, not in the caller's.
    EXPECT_EQ(omp_get_max_threads(), caller_threads) << threads;
    // A residual is added to the finished y + b: the same bits as adding it afterwards.
    std::vector<float> with_residual(rows * out);
    model::linear_forward(x.data(), rows, in, w.data(), b.data(), out, with_residual.data(),
                          threads, residual.data());
    for (int64_t n = 0; n < rows * out; ++n) {
      ASSERT_EQ(with_residual[n], y[n] + residual[n]) << "threads " << threads << ", " << n;
    }
    ys.push_back(y);
    dxs.push_back(dx);
    dws.push_back(dw);
    dbs.push_back(db);
  }
  for (size_t t = 1; t < ys.size(); ++t) {
    EXPECT_EQ(ys[t], ys[0]) << "forward, thread count #" << t;
    EXPECT_EQ(dxs[t], dxs[0]) << "dx, thread count #" << t;
    EXPECT_EQ(dws[t], dws[0]) << "dW (accumulated), thread count #" << t;
    EXPECT_EQ(dbs[t], dbs[0]) << "db, thread count #" << t;
  }
  for (int64_t o = 0; o < out; ++o) {  // db: each column of dy summed in row order
    float expect = 0.0f;
    for (int64_t r = 0; r < rows; ++r) expect += dy[r * out + o];
    ASSERT_EQ(dbs[0][o], expect) << o;
  }
  for (int64_t r = 0; r < rows; r += 7) {
    for (int64_t o = 0; o < out; o += 5) {
      double sum = b[o];
      for (int64_t i = 0; i < in; ++i) sum += double{x[r * in + i]} * w[o * in + i];
      EXPECT_NEAR(ys[0][r * out + o], sum, 1e-5 * (1 + std::fabs(sum))) << r << " " << o;
    }
    for (int64_t i = 0; i < in; i += 5) {
      double sum = 0;
      for (int64_t o = 0; o < out; ++o) sum += double{dy[r * out + o]} * w[o * in + i];
      EXPECT_NEAR(dxs[0][r * in + i], sum, 1e-5 * (1 + std::fabs(sum))) << r << " " << i;
    }
  }
  for (int64_t o = 0; o < out; o += 11) {
    for (int64_t i = 0; i < in; i += 5) {
      double sum = dw_start[o * in + i];
      for (int64_t r = 0; r < rows; ++r) sum += double{dy[r * out + o]} * x[r * in + i];
      EXPECT_NEAR(dws[0][o * in + i], sum, 1e-5 * (1 + std::fabs(sum))) << o << " " << i;
    }
  }
}

// The shapes of the default model's backward (1024 rows of width 128 and 512) are where the
// parameter sums and the epilogue split across threads; these are large enough to split too.
TEST(LayerNorm, ParameterSumsAndAccumulatedDxGiveTheSameBitsForAnyThreadCount) {
  const int64_t rows = 300, width = 256;  // 8 column ranges, over the parallel threshold
  const std::vector<float> x = random_values(rows * width, 51), gamma = random_values(width, 52),
                           dy = random_values(rows * width, 53),
                           dx_start = random_values(rows * width, 54);
  std::vector<float> mean(rows), rstd(rows), y(rows * width);
  model::layer_norm_forward(x.data(), rows, width, gamma.data(), gamma.data(), 1e-5f, y.data(),
                            mean.data(), rstd.data(), 1);
  std::vector<std::vector<float>> results;
  for (const int threads : {1, 2, 3}) {
    std::vector<float> dx(rows * width), added = dx_start, dgamma(width, 0.5f), dbeta(width, 0.25f);
    model::layer_norm_backward(x.data(), dy.data(), rows, width, gamma.data(), mean.data(),
                               rstd.data(), dx.data(), dgamma.data(), dbeta.data(), threads);
    std::vector<float> ignored(width, 0.0f);
    model::layer_norm_backward(x.data(), dy.data(), rows, width, gamma.data(), mean.data(),
                               rstd.data(), added.data(), ignored.data(), ignored.data(), threads,
                               true);
    // Accumulating is adding the overwritten result, element by element: the same bits.
    for (int64_t n = 0; n < rows * width; ++n) {
      ASSERT_EQ(added[n], dx_start[n] + dx[n]) << "threads " << threads << ", element " << n;
    }
    for (int64_t n = 0; n < width; ++n) {  // dβ: the column sum of dy, in row order
      float expect = 0.25f;
      for (int64_t r = 0; r < rows; ++r) expect += dy[r * width + n];
      ASSERT_EQ(dbeta[n], expect) << "threads " << threads << ", column " << n;
    }
    dx.insert(dx.end(), dgamma.begin(), dgamma.end());
    results.push_back(dx);
  }
  EXPECT_EQ(results[1], results[0]);
  EXPECT_EQ(results[2], results[0]);
}

// The epilogue adds the bias, then the residual, to each finished element: exactly the adds run
// afterwards over the whole output, whatever the thread count, the blocks, or `accumulate`.
TEST(Gemm, EpilogueIsTheBiasThenTheResidualAddedAfterwards) {
  using detail::Layout;
  const int64_t rows = 200, inner = 40, cols = 600;  // 4 × 2 blocks, partial ones at both edges
  const std::vector<float> a = random_values(rows * inner, 61), b = random_values(inner * cols, 62);
  const std::vector<float> bias = random_values(cols, 63),
                           residual = random_values(rows * cols, 64);
  const std::vector<float> c_start = random_values(rows * cols, 65);
  for (const bool accumulate : {false, true}) {
    std::vector<float> expected = c_start;
    detail::gemm(Layout::as_stored, Layout::as_stored, rows, cols, inner, a.data(), inner, b.data(),
                 cols, expected.data(), cols, accumulate, 1);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t n = 0; n < cols; ++n) {
        expected[r * cols + n] += bias[n];
        expected[r * cols + n] += residual[r * cols + n];
      }
    }
    for (const int threads : {1, 2, 3}) {
      std::vector<float> c = c_start;
      detail::gemm(Layout::as_stored, Layout::as_stored, rows, cols, inner, a.data(), inner,
                   b.data(), cols, c.data(), cols, accumulate, threads,
                   {bias.data(), residual.data(), cols});
      EXPECT_EQ(c, expected) << "accumulate " << accumulate << ", threads " << threads;
    }
  }
  // An empty inner dimension: C = 0 (or C as it was), then the epilogue all the same.
  std::vector<float> c = c_start;
  detail::gemm(Layout::as_stored, Layout::as_stored, rows, cols, 0, a.data(), 1, b.data(), cols,
               c.data(), cols, false, 2, {bias.data(), nullptr, 0});
  for (int64_t r = 0; r < rows; r += 13) {
    for (int64_t n = 0; n < cols; n += 7) ASSERT_EQ(c[r * cols + n], bias[n]) << r << " " << n;
  }
}

TEST(Gelu, ExactFormAndItsDerivative) {
  const std::vector<float> x = {-6.0f, -2.5f, -1.0f, -0.1f, 0.0f, 0.3f, 1.0f, 2.0f, 5.0f};
  std::vector<float> y(x.size()), dx(x.size()), ones(x.size(), 1.0f);
  model::gelu_forward(x.data(), x.size(), y.data(), 1);
  model::gelu_backward(x.data(), ones.data(), x.size(), dx.data(), 1);
  const auto gelu = [](double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); };
  EXPECT_NEAR(y[6], 0.8413447460685429, 1e-7);  // gelu(1) = Φ(1)
  EXPECT_EQ(y[4], 0.0f);
  for (size_t n = 0; n < x.size(); ++n) {
    EXPECT_NEAR(y[n], gelu(x[n]), 1e-7 + 1e-7 * std::fabs(y[n])) << x[n];
    const double h = 1e-5;
    EXPECT_NEAR(dx[n], (gelu(x[n] + h) - gelu(x[n] - h)) / (2 * h), 1e-6) << x[n];
  }
}

TEST(CrossEntropy, MeanOverRealRowsAndItsGradient) {
  const int64_t rows = 4, vocab = 7;
  const std::vector<float> logits = random_values(rows * vocab, 9);
  const std::vector<int32_t> targets = {3, -100, 0, 6};  // row 1 is padding
  std::vector<float> dlogits(rows * vocab, 9.0f);
  const model::CrossEntropy ce =
      model::cross_entropy(logits.data(), targets.data(), rows, vocab, -100, dlogits.data(), 1);
  EXPECT_EQ(ce.real_rows, 3);
  const auto loss = [&](const std::vector<double>& z) {
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) {
      if (targets[r] == -100) continue;
      double total = 0;
      for (int64_t n = 0; n < vocab; ++n) total += std::exp(z[r * vocab + n]);
      sum += std::log(total) - z[r * vocab + targets[r]];
    }
    return sum / 3;
  };
  const std::vector<double> z(logits.begin(), logits.end());
  EXPECT_NEAR(ce.loss, loss(z), 1e-12);
  const std::vector<double> fd = central_differences(z, loss, 1e-6);
  for (size_t n = 0; n < dlogits.size(); ++n) EXPECT_NEAR(dlogits[n], fd[n], 1e-7) << n;
  for (int64_t n = 0; n < vocab; ++n) EXPECT_EQ(dlogits[vocab + n], 0.0f);  // the padding row

  const std::vector<int32_t> all_padding(rows, -100);
  const model::CrossEntropy none =
      model::cross_entropy(logits.data(), all_padding.data(), rows, vocab, -100, dlogits.data(), 1);
  EXPECT_EQ(none.real_rows, 0);
  EXPECT_EQ(none.loss, 0.0);
  for (const float g : dlogits) EXPECT_EQ(g, 0.0f);
}

TEST(CrossEntropy, LargeLogitsStayFinite) {
  const std::vector<float> logits = {1e4f, -1e4f, 0.0f};
  const std::vector<int32_t> targets = {1};
  std::vector<float> dlogits(3);
  const model::CrossEntropy ce =
      model::cross_entropy(logits.data(), targets.data(), 1, 3, -100, dlogits.data(), 1);
  EXPECT_DOUBLE_EQ(ce.loss, 2e4);
  EXPECT_FLOAT_EQ(dlogits[0], 1.0f);
  EXPECT_FLOAT_EQ(dlogits[1], -1.0f);
}

TEST(AdamW, FollowsPyTorchsUpdateStepByStep) {
  const model::AdamW config;  // β = (0.9, 0.95), ε = 1e-8, λ = 0.1
  std::vector<float> p = {0.5f, -1.0f, 2.0f}, m(3, 0.0f), v(3, 0.0f);
  std::vector<double> p64(p.begin(), p.end()), m64(3, 0.0), v64(3, 0.0);
  const std::vector<std::vector<float>> grads = {
      {0.1f, -0.2f, 0.0f}, {0.3f, 0.1f, -1.0f}, {-0.05f, 0.2f, 0.5f}};
  for (int64_t step = 1; step <= 3; ++step) {
    const double lr = 1e-2 * step;
    const std::vector<float>& g = grads[step - 1];
    model::adamw_step(config, lr, step, true, p.data(), g.data(), m.data(), v.data(), 3, 1);
    for (int n = 0; n < 3; ++n) {
      p64[n] *= 1 - lr * 0.1;
      m64[n] = 0.9 * m64[n] + 0.1 * g[n];
      v64[n] = 0.95 * v64[n] + 0.05 * double{g[n]} * g[n];
      const double m_hat = m64[n] / (1 - std::pow(0.9, step));
      const double v_hat = v64[n] / (1 - std::pow(0.95, step));
      p64[n] -= lr * m_hat / (std::sqrt(v_hat) + 1e-8);
      EXPECT_NEAR(p[n], p64[n], 2e-6) << "step " << step << " element " << n;
    }
  }
  // Without decay (biases, LayerNorm), a zero gradient leaves the parameter as it is.
  std::vector<float> q = {1.5f}, mq = {0.0f}, vq = {0.0f};
  const std::vector<float> zero = {0.0f};
  model::adamw_step(config, 0.5, 1, false, q.data(), zero.data(), mq.data(), vq.data(), 1, 1);
  EXPECT_EQ(q[0], 1.5f);
}

TEST(LearningRate, WarmUpThenCosineToTheFloor) {
  const double lr = 1e-3, floor = 1e-4;
  EXPECT_DOUBLE_EQ(model::learning_rate(0, lr, floor, 9, 109), lr * 1 / 10);
  EXPECT_DOUBLE_EQ(model::learning_rate(8, lr, floor, 9, 109), lr * 9 / 10);
  EXPECT_DOUBLE_EQ(model::learning_rate(9, lr, floor, 9, 109), lr);
  EXPECT_NEAR(model::learning_rate(59, lr, floor, 9, 109), (lr + floor) / 2, 1e-15);
  EXPECT_NEAR(model::learning_rate(109, lr, floor, 9, 109), floor, 1e-15);
  EXPECT_DOUBLE_EQ(model::learning_rate(500, lr, floor, 9, 109), floor);
}

TEST(ClipGradNorm, ScalesOnlyAboveTheLimit) {
  std::vector<float> a = {3.0f, 0.0f}, b = {4.0f};
  float* tensors[] = {a.data(), b.data()};
  const int64_t sizes[] = {2, 1};
  EXPECT_DOUBLE_EQ(model::clip_grad_norm(tensors, sizes, 2, 10.0), 5.0);
  EXPECT_EQ(a[0], 3.0f);
  EXPECT_DOUBLE_EQ(model::clip_grad_norm(tensors, sizes, 2, 1.0), 5.0);
  EXPECT_NEAR(a[0], 3.0 / (5.0 + 1e-6), 1e-7);
  EXPECT_NEAR(b[0], 4.0 / (5.0 + 1e-6), 1e-7);
}

// The trainer's batched optimiser: one region over all tensors gives adamw_step's bits, and the
// clipped norm and gradients do not depend on the thread count (tensors of several blocks).
TEST(AdamW, StepsOverManyTensorsEqualOneStepPerTensorForAnyThreadCount) {
  const std::vector<model::AdamWTensor> spans = {
      {0, 40000, true}, {40000, 7, false}, {40007, 33000, true}, {73007, 1, false}};
  const int64_t count = 73008;
  const std::vector<float> p0 = random_values(count, 21), g0 = random_values(count, 22);
  const std::vector<float> m0 = random_values(count, 23), v0 = random_values(count, 24, 0.0f, 1.0f);
  model::AdamW config;
  std::vector<float> p1 = p0, m1 = m0, v1 = v0;
  for (const model::AdamWTensor& t : spans) {
    model::adamw_step(config, 1e-3, 7, t.decay, p1.data() + t.offset, g0.data() + t.offset,
                      m1.data() + t.offset, v1.data() + t.offset, t.size, 1);
  }
  for (const int threads : {1, 2, 3}) {
    std::vector<float> p = p0, m = m0, v = v0;
    model::adamw_steps(config, 1e-3, 7, spans.data(), 4, p.data(), g0.data(), m.data(), v.data(),
                       threads);
    EXPECT_EQ(p, p1) << threads;
    EXPECT_EQ(m, m1) << threads;
    EXPECT_EQ(v, v1) << threads;
    std::vector<float> g = g0;
    std::vector<float*> tensors;
    std::vector<int64_t> sizes;
    for (const model::AdamWTensor& t : spans) {
      tensors.push_back(g.data() + t.offset);
      sizes.push_back(t.size);
    }
    const double norm = model::clip_grad_norm(tensors.data(), sizes.data(), 4, 1.0, threads);
    double squares = 0;
    for (const float x : g0) squares += double{x} * x;
    EXPECT_NEAR(norm, std::sqrt(squares), 1e-12 * std::sqrt(squares));
    std::vector<float> g_one = g0;
    for (size_t t = 0; t < tensors.size(); ++t) tensors[t] = g_one.data() + spans[t].offset;
    EXPECT_EQ(model::clip_grad_norm(tensors.data(), sizes.data(), 4, 1.0, 1), norm) << threads;
    EXPECT_EQ(g, g_one) << threads;
  }
}

}  // namespace
}  // namespace maskattn
