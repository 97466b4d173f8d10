// maskattn example: the "I love dog" worked example, every step printed.
// d = 4, W_Q = W_K = W_V = I, so Q = K = V = X; causal mask; expected (3 decimals)
//   weights [[1,0,0],[0.269,0.731,0],[0.274,0.274,0.452]]
//   output  [[1,0,1,0],[0.269,0.731,0.269,0.731],[0.726,0.726,0.274,0.274]]
#include <fmt/core.h>

#include <cmath>
#include <vector>

#include "command_options.h"
#include "commands.h"
#include "maskattn/attention.h"
#include "print.h"

namespace maskattn::cli {

namespace {

std::vector<double> widen(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

}  // namespace

int run_example() {
  constexpr int64_t kTokens = 3, kDim = 4;
  // Embeddings of "I", "love", "dog".
  const std::vector<float> x = {1, 0, 1, 0,             //
                                0, 1, 0, 1,             //
                                1, 1, 0, 0};            //
  const TensorView q(x.data(), {1, 1, kTokens, kDim});  // Q = K = V = X
  const Mask mask = Mask().causal();

  std::vector<float> scaled(kTokens * kTokens), masked(kTokens * kTokens);
  std::vector<float> weights(kTokens * kTokens), output(kTokens * kDim);
  attention_scores(q, q, MutableTensorView(scaled.data(), {1, 1, kTokens, kTokens}),
                   ScoreStage::scaled, mask);
  attention_scores(q, q, MutableTensorView(masked.data(), {1, 1, kTokens, kTokens}),
                   ScoreStage::final, mask);
  attention_weights(q, q, MutableTensorView(weights.data(), {1, 1, kTokens, kTokens}), mask);
  attention(q, q, q, MutableTensorView(output.data(), {1, 1, kTokens, kDim}), mask);
  const Array<uint8_t> allowed = allowed_pairs(mask, {1, 1, kTokens, kTokens});
  std::vector<double> additive(allowed.numel());
  for (int64_t n = 0; n < allowed.numel(); ++n) additive[n] = allowed.values()[n] ? 0 : -INFINITY;

  fmt::print(
      "Masked self-attention, step by step: the 'I love dog' worked example.\n"
      "Tokens: 0 \"I\", 1 \"love\", 2 \"dog\"; d_k = 4; W_Q = W_K = W_V = identity, so "
      "Q = K = V = X.\n\n");
  print_matrix("X (token embeddings, one row per token)", widen(x), kTokens, kDim, 1);
  fmt::print("\n");
  print_matrix("Q·Kᵀ/√d_k (scaled scores)", widen(scaled), kTokens, kTokens);
  fmt::print("\n");
  print_matrix("M (causal mask: 0 = may attend, -inf = future token, hidden)", additive, kTokens,
               kTokens, 0);
  fmt::print("\n");
  print_matrix("Q·Kᵀ/√d_k + M (masked scores)", widen(masked), kTokens, kTokens);
  fmt::print("\n");
  print_matrix("attention weights = softmax(masked scores), each row sums to 1", widen(weights),
               kTokens, kTokens);
  fmt::print("\n");
  print_matrix("output = weights · V", widen(output), kTokens, kDim);
  fmt::print(
      "\n\"I\" sees only itself; \"love\" mixes \"I\" and \"love\"; \"dog\" mixes all three.\n");
  return 0;
}

Command add_example_command(CLI::App& app) {
  return {app.add_subcommand("example", "the 'I love dog' worked example, step by step"),
          [] { return run_example(); }};
}

}  // namespace maskattn::cli
