// The GPT model (src/model/gpt.h): gradients of the whole model against central differences, a
// padded batch against its sequences one by one, thread-count determinism, the look-ahead mask's
// effect on earlier positions, and the model's errors.
#include <cmath>

#include "maskattn/attention.h"
#include "maskattn/model/generate.h"
#include "maskattn/model/gpt.h"
#include "test_util.h"

namespace maskattn {
namespace {

using model::Gpt;
using model::GptBatch;
using model::GptConfig;
using model::GptParameters;

GptConfig tiny_config() {
  GptConfig config;
  config.vocab = 11;
  config.context = 6;
  config.layers = 2;
  config.d_model = 8;
  config.heads = 2;
  return config;
}

// nanoGPT's initialisation plus noise, so that every tensor (biases and LayerNorm included)
// matters to the loss and the gradients are not tiny.
std::vector<float> noisy_parameters(const GptParameters& parameters, uint64_t seed) {
  std::vector<float> values(parameters.count());
  parameters.initialise(values.data(), seed);
  const std::vector<float> noise = test::random_values(values.size(), seed + 1);
  for (size_t n = 0; n < values.size(); ++n) values[n] += 0.3f * noise[n];
  return values;
}

struct TinyBatch {
  std::vector<int32_t> tokens, targets;
  GptBatch view(int64_t batch, int64_t length, int32_t pad = -1) const {
    return {tokens.data(), targets.data(), batch, length, pad};
  }
};

TinyBatch next_token_batch(const std::vector<std::vector<int32_t>>& sequences, int64_t length,
                           int32_t pad) {
  TinyBatch batch;
  for (const auto& sequence : sequences) {
    for (int64_t t = 0; t < length; ++t) {
      const bool real = t < static_cast<int64_t>(sequence.size());
      batch.tokens.push_back(real ? sequence[t] : pad);
      const bool has_next = t + 1 < static_cast<int64_t>(sequence.size());
      batch.targets.push_back(has_next ? sequence[t + 1] : model::kIgnoreTarget);
    }
  }
  return batch;
}

TEST(Gpt, GradientsMatchCentralDifferencesForEveryTensor) {
  const GptParameters parameters(tiny_config());
  Gpt gpt(parameters, true);
  const TinyBatch data = next_token_batch({{1, 4, 2, 9, 7, 3}, {5, 5, 8, 0, 2, 6}}, 6, -1);
  const GptBatch batch = data.view(2, 6);
  std::vector<float> params = noisy_parameters(parameters, 3), grads(parameters.count());
  gpt.loss_and_gradients(params.data(), batch, grads.data(), 1);
  // One random unit direction per tensor: (L(p + h·u) − L(p − h·u)) / 2h against g·u. f32 losses
  // of ~2.4 carry ~2e-7 of rounding, 1e-5 after dividing by 2h = 0.02; the O(h²) term is smaller.
  const double h = 1e-2;
  for (const model::NamedTensor& tensor : parameters.tensors()) {
    std::vector<float> u = test::random_values(tensor.size, tensor.offset + 17);
    double norm = 0;
    for (const float x : u) norm += double{x} * x;
    for (float& x : u) x = static_cast<float>(x / std::sqrt(norm));  // a unit step direction
    double directional = 0;
    for (int64_t n = 0; n < tensor.size; ++n)
      directional += double{grads[tensor.offset + n]} * u[n];
    const auto loss_at = [&](double step) {
      std::vector<float> shifted = params;
      for (int64_t n = 0; n < tensor.size; ++n) shifted[tensor.offset + n] += step * u[n];
      return gpt.loss_and_gradients(shifted.data(), batch, nullptr, 1).loss;
    };
    const double fd = (loss_at(h) - loss_at(-h)) / (2 * h);
    EXPECT_NEAR(directional, fd, 2e-4 + 3e-3 * std::fabs(fd)) << tensor.name;
  }
}

TEST(Gpt, APaddedBatchEqualsItsSequencesOneByOne) {
  const GptParameters parameters(tiny_config());
  Gpt gpt(parameters, true);
  const std::vector<float> params = noisy_parameters(parameters, 5);
  const std::vector<std::vector<int32_t>> sequences = {{3, 1, 4, 1, 5, 9}, {2, 7, 1}, {8, 2, 8, 1}};
  const int32_t pad = 0;
  const TinyBatch padded = next_token_batch(sequences, 6, pad);
  std::vector<float> batch_grads(parameters.count());
  const model::CrossEntropy together =
      gpt.loss_and_gradients(params.data(), padded.view(3, 6, pad), batch_grads.data(), 2);
  double loss_sum = 0;
  int64_t real = 0;
  std::vector<double> grad_sum(parameters.count(), 0.0);
  std::vector<float> grads(parameters.count());
  for (const auto& sequence : sequences) {
    const int64_t length = sequence.size();
    const TinyBatch alone = next_token_batch({sequence}, length, pad);
    const model::CrossEntropy one =
        gpt.loss_and_gradients(params.data(), alone.view(1, length), grads.data(), 2);
    loss_sum += one.loss * one.real_rows;
    real += one.real_rows;
    for (size_t n = 0; n < grads.size(); ++n) grad_sum[n] += double{grads[n]} * one.real_rows;
  }
  EXPECT_EQ(together.real_rows, real);
  EXPECT_NEAR(together.loss, loss_sum / real, 1e-6);
  double largest = 0;
  for (const double g : grad_sum) largest = std::max(largest, std::fabs(g / real));
  for (size_t n = 0; n < grads.size(); ++n) {
    EXPECT_NEAR(batch_grads[n], grad_sum[n] / real, 1e-5 * largest) << n;
  }
}

TEST(Gpt, SameBitsForAnyThreadCount) {
  const GptParameters parameters(tiny_config());
  Gpt gpt(parameters, true);
  const std::vector<float> params = noisy_parameters(parameters, 7);
  const TinyBatch data = next_token_batch({{1, 2, 3, 4, 5, 6}, {6, 5, 4, 3}}, 6, 0);
  std::vector<float> one(parameters.count()), two(parameters.count());
  const double loss_one =
      gpt.loss_and_gradients(params.data(), data.view(2, 6, 0), one.data(), 1).loss;
  const double loss_two =
      gpt.loss_and_gradients(params.data(), data.view(2, 6, 0), two.data(), 2).loss;
  EXPECT_EQ(loss_one, loss_two);
  EXPECT_EQ(one, two);
}

// Gpt::qkv's views are each block's Q, K and V, [B, H, L, D]: c_attn's row blocks applied to
// ln_1 (checked in double), and attention() on them gives the heads' outputs the block kept.
TEST(Gpt, QkvViewsAreEachBlocksQueriesKeysAndValues) {
  const GptParameters parameters(tiny_config());
  const GptConfig& config = parameters.config();
  Gpt gpt(parameters, true);
  const std::vector<float> params = noisy_parameters(parameters, 5);
  const TinyBatch data = next_token_batch({{1, 2, 3, 4, 5, 6}, {6, 5, 4, 3}}, 5, 0);
  gpt.loss_and_gradients(params.data(), data.view(2, 5, 0), nullptr, 1);
  const int64_t B = 2, L = 5, H = config.heads, E = config.d_model, D = E / H;
  for (int64_t l = 0; l < config.layers; ++l) {
    const model::QkvViews qkv = gpt.qkv(l);
    const model::GptBlockState& state = gpt.block_state(l);
    const float* weight = params.data() + parameters.block(l).c_attn_weight;
    const float* bias = params.data() + parameters.block(l).c_attn_bias;
    const TensorView* parts[3] = {&qkv.q, &qkv.k, &qkv.v};
    for (int part = 0; part < 3; ++part) {
      ASSERT_EQ(parts[part]->sizes(), (Dims{B, H, L, D}));
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t t = 0; t < L; ++t) {
            for (int64_t d = 0; d < D; ++d) {
              const int64_t out = part * E + h * D + d;  // c_attn's output feature
              double expected = bias[out];
              for (int64_t e = 0; e < E; ++e) {
                expected +=
                    static_cast<double>(state.ln_1[(b * L + t) * E + e]) * weight[out * E + e];
              }
              const float got =
                  static_cast<const float*>(parts[part]->data())[parts[part]->offset({b, h, t, d})];
              EXPECT_NEAR(got, expected, 1e-5 * (1 + std::fabs(expected)))
                  << "layer " << l << " part " << part;
            }
          }
        }
      }
    }
    std::vector<float> heads(B * L * E);
    attention(qkv.q, qkv.k, qkv.v,
              MutableTensorView(heads.data(), DType::f32, {B, H, L, D}, {L * E, D, E, 1}),
              gpt.last_mask());
    EXPECT_EQ(heads, state.attention.heads) << "layer " << l;
  }
}

TEST(Gpt, TheLookAheadMaskKeepsLaterTokensOutOfEarlierLogits) {
  const GptParameters parameters(tiny_config());
  const std::vector<float> params = noisy_parameters(parameters, 9);
  TinyBatch a = next_token_batch({{1, 2, 3, 4, 5, 6}}, 6, -1);
  TinyBatch b = a;
  b.tokens[4] = 10;  // a later token changes
  for (const bool causal : {true, false}) {
    Gpt gpt(parameters, causal);
    gpt.loss_and_gradients(params.data(), a.view(1, 6), nullptr, 1);
    const std::vector<float> before = gpt.logits();
    gpt.loss_and_gradients(params.data(), b.view(1, 6), nullptr, 1);
    const std::vector<float> after = gpt.logits();
    const int64_t V = parameters.config().vocab;
    bool earlier_changed = false;
    for (int64_t n = 0; n < 4 * V; ++n) earlier_changed |= before[n] != after[n];
    EXPECT_EQ(earlier_changed, !causal) << (causal ? "causal" : "no mask");
  }
}

// The logits after the last token of `tokens`, recomputing the whole forward (no cache).
std::vector<float> full_forward_logits(Gpt& gpt, const std::vector<float>& params,
                                       const std::vector<int32_t>& tokens) {
  const std::vector<int32_t> targets(tokens.size(), model::kIgnoreTarget);
  const int64_t length = static_cast<int64_t>(tokens.size());
  gpt.loss_and_gradients(params.data(), {tokens.data(), targets.data(), 1, length, -1}, nullptr, 1);
  const int64_t V = gpt.parameters().config().vocab;
  return {gpt.logits().end() - V, gpt.logits().end()};
}

TEST(GptDecoder, KvCacheGivesTheFullForwardsLogitsAndTokens) {
  const GptParameters parameters(tiny_config());
  Gpt gpt(parameters, true);
  const std::vector<float> params = noisy_parameters(parameters, 11);
  model::GptDecoder decoder(parameters, params.data(), 1);
  std::vector<int32_t> text = {2, 7, 9};
  std::vector<float> cached = decoder.feed(text);  // prefill
  while (static_cast<int64_t>(text.size()) < parameters.config().context) {
    const std::vector<float> full = full_forward_logits(gpt, params, text);
    ASSERT_EQ(cached.size(), full.size());
    for (size_t n = 0; n < full.size(); ++n) {
      EXPECT_NEAR(cached[n], full[n], 1e-5 * (1 + std::fabs(full[n]))) << text.size();
    }
    const int32_t next = static_cast<int32_t>(std::max_element(full.begin(), full.end()) -
                                              full.begin());  // greedy, all tokens
    text.push_back(next);
    cached = decoder.feed({next});
  }
  EXPECT_MASKATTN_ERROR(decoder.feed({1}), "passes the context of 6");
}

TEST(GptDecoder, GreedyGenerationEqualsRecomputingAndLongPromptsKeepTheirEnd) {
  const GptParameters parameters(tiny_config());
  Gpt gpt(parameters, true);
  const std::vector<float> params = noisy_parameters(parameters, 13);
  model::GptDecoder decoder(parameters, params.data(), 1);
  model::GenerateOptions options;
  options.temperature = 0;
  options.tokens = 3;
  const model::Generated generated = model::generate(decoder, {2, 8}, options);
  std::vector<int32_t> text = {2, 8};
  for (const int32_t token : generated.tokens) {
    std::vector<float> full = full_forward_logits(gpt, params, text);
    for (int32_t id = 0; id < 7; ++id) {
      if (id != 3) full[id] = -INFINITY;  // special tokens other than <eos> are never sampled
    }
    EXPECT_EQ(token, std::max_element(full.begin(), full.end()) - full.begin());
    text.push_back(token);
  }
  // A prompt of 9 tokens with a context of 6: its last 6 are kept, 3 dropped; generation goes on
  // past the context by restarting the cache on the last half.
  options.tokens = 10;
  const model::Generated long_prompt =
      model::generate(decoder, {7, 8, 9, 10, 7, 8, 9, 10, 7}, options);
  EXPECT_EQ(long_prompt.prompt_dropped, 3);
  EXPECT_LE(long_prompt.tokens.size(), 10u);
  EXPECT_MASKATTN_ERROR(model::generate(decoder, {}, options), "gpt: the prompt is empty");
}

TEST(Gpt, BadSettingsAndBatchesAreClearErrors) {
  GptConfig config = tiny_config();
  config.heads = 3;
  EXPECT_MASKATTN_ERROR(GptParameters{config}, "gpt: --heads 3 does not divide --d-model 8");
  config = tiny_config();
  config.layers = 0;
  EXPECT_MASKATTN_ERROR(GptParameters{config}, "gpt: --layers = 0 must be ≥ 1");
  const GptParameters parameters(tiny_config());
  Gpt gpt(parameters, true);
  const std::vector<float> params = noisy_parameters(parameters, 1);
  const TinyBatch too_long = next_token_batch({{1, 2, 3, 4, 5, 6, 7}}, 7, -1);
  EXPECT_MASKATTN_ERROR(gpt.loss_and_gradients(params.data(), too_long.view(1, 7), nullptr, 1),
                        "gpt: a batch of length 7 exceeds the model's context of 6");
  const TinyBatch outside = next_token_batch({{1, 11, 3}}, 3, -1);
  EXPECT_MASKATTN_ERROR(gpt.loss_and_gradients(params.data(), outside.view(1, 3), nullptr, 1),
                        "gpt: token 11 at flat index 1 is outside the vocabulary [0, 11)");
}

}  // namespace
}  // namespace maskattn
