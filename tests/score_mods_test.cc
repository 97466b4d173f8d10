// Score modifiers and their fixed order: scale → softcap → ALiBi + bias + additive → score_fn →
// threshold → hide → softmax (with sinks). Scores are set directly: D = 1, q = 1, scale = 1, so
// the score of key j is k[j].
#include <cmath>

#include "test_util.h"

namespace maskattn {
namespace {

struct Row {
  std::vector<float> weights;
  float lse = 0;
  std::vector<float> out;  // V = [1, 2, 4, 8, ...]: the output reveals which keys contributed
};

Row run_row(const std::vector<float>& scores, const Mask& mask, const ScoreMods& mods) {
  const int64_t keys = static_cast<int64_t>(scores.size());
  const std::vector<float> q = {1.0f};
  std::vector<float> v(keys);
  for (int64_t j = 0; j < keys; ++j) v[j] = static_cast<float>(1 << j);
  Options options;
  options.scale = 1.0;
  Row row;
  row.weights.resize(keys);
  row.out.resize(1);
  const TensorView qv(q.data(), {1, 1, 1, 1});
  const TensorView kv(scores.data(), {1, 1, keys, 1});
  attention_weights(qv, kv, MutableTensorView(row.weights.data(), {1, 1, 1, keys}), mask, mods,
                    options);
  attention(qv, kv, TensorView(v.data(), {1, 1, keys, 1}),
            MutableTensorView(row.out.data(), {1, 1, 1, 1}), mask, mods, options,
            MutableTensorView(&row.lse, {1, 1, 1}));
  return row;
}

std::vector<double> softmax(const std::vector<double>& s, double sink = -INFINITY) {
  double total = std::exp(sink);
  for (double x : s) total += std::exp(x);
  std::vector<double> p;
  for (double x : s) p.push_back(std::exp(x) / total);
  return p;
}

TEST(Softcap, AppliesCapTanh) {
  ScoreMods mods;
  mods.softcap = 2.0;
  const Row row = run_row({3.0f, -1.0f}, Mask(), mods);
  const auto p = softmax({2.0 * std::tanh(1.5), 2.0 * std::tanh(-0.5)});
  EXPECT_FLOAT_EQ(row.weights[0], p[0]);
  EXPECT_FLOAT_EQ(row.weights[1], p[1]);
}

TEST(Softcap, NeverUnhidesAMaskedPair) {
  // Softcap after masking would map -inf to -cap and leak weight (ONNX #7867).
  ScoreMods mods;
  mods.softcap = 1.0;
  const Row row = run_row({0.0f, 5.0f}, Mask().additive(Array<float>({2}, {0, -INFINITY})), mods);
  EXPECT_EQ(row.weights[1], 0.0f);
  EXPECT_EQ(row.out[0], 1.0f);
}

TEST(Alibi, SubtractsSlopeTimesDistanceBottomRight) {
  ScoreMods mods;
  mods.alibi_slopes = {0.5f};
  // One query after three keys: bottom-right puts it at position 2; distances 2, 1, 0.
  const Row row = run_row({0, 0, 0}, Mask(), mods);
  const auto p = softmax({-1.0, -0.5, 0.0});
  for (int j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(row.weights[j], p[j]) << j;
  // Top-left: the query is at position 0; distances 0, 1, 2.
  const Row top_left = run_row({0, 0, 0}, Mask().set_alignment(Alignment::top_left), mods);
  for (int j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(top_left.weights[j], p[2 - j]) << j;
}

TEST(Alibi, PerHeadSlopesAndLeftPaddedPositions) {
  // Distances are position differences, unchanged by left padding.
  std::vector<float> q = {1, 1}, k = {0, 0, 0, 0}, weights(8);
  ScoreMods mods;
  mods.alibi_slopes = {1.0f, 0.0f};
  Options options;
  options.scale = 1.0;
  attention_weights(TensorView(q.data(), {1, 2, 1, 1}), TensorView(k.data(), {1, 1, 4, 1}),
                    MutableTensorView(weights.data(), {1, 2, 1, 4}), Mask().key_starts({1}), mods,
                    options);
  const auto p = softmax({-2.0, -1.0, 0.0});
  EXPECT_EQ(weights[0], 0.0f);  // the pad key
  for (int j = 1; j < 4; ++j) EXPECT_FLOAT_EQ(weights[j], p[j - 1]);
  for (int j = 1; j < 4; ++j) EXPECT_FLOAT_EQ(weights[4 + j], 1.0f / 3.0f);  // slope 0
}

TEST(Bias, IsAddedLikeAnAdditiveMask) {
  ScoreMods mods;
  mods.bias = Array<float>({1, 3}, {0.25f, -1.0f, 2.0f});
  const Row with_bias = run_row({1, 2, 3}, Mask(), mods);
  const Row with_mask = run_row({1, 2, 3}, Mask().additive(Array<float>({3}, {0.25f, -1, 2})), {});
  EXPECT_EQ(with_bias.weights, with_mask.weights);
  const auto p = softmax({1.25, 1.0, 5.0});
  EXPECT_FLOAT_EQ(with_bias.weights[2], p[2]);
}

TEST(ScoreFunction, SeesTheModifiedScoreAndIndices) {
  ScoreMods mods;
  mods.score_fn = [](double s, int64_t, int64_t, int64_t, int64_t j) { return s * 2 + j; };
  const Row row = run_row({1, 1}, Mask(), mods);
  const auto p = softmax({2.0, 3.0});
  EXPECT_FLOAT_EQ(row.weights[1], p[1]);
  ScoreMods hide;
  hide.score_fn = [](double s, int64_t, int64_t, int64_t, int64_t j) {
    return j == 0 ? -INFINITY : s;
  };
  EXPECT_EQ(run_row({9, 1}, Mask(), hide).weights[0], 0.0f);
}

TEST(ScoreFunction, RunsAfterSoftcapAndBiasAndBeforeThreshold) {
  // score_fn records what it sees: softcap(2)=tanh(2) plus bias 0.5 for key 0.
  ScoreMods mods;
  mods.softcap = 1.0;
  mods.bias = Array<float>({2}, {0.5f, 0.0f});
  mods.score_fn = [](double s, int64_t, int64_t, int64_t, int64_t j) {
    EXPECT_NEAR(s, j == 0 ? std::tanh(2.0) + 0.5 : 0.0, 1e-12) << "key " << j;
    return j == 0 ? s : s - 10.0;  // key 1 drops below the threshold only because of score_fn
  };
  mods.threshold = -5.0;
  const Row row = run_row({2.0f, 0.0f}, Mask(), mods);
  EXPECT_EQ(row.weights, (std::vector<float>{1, 0}));
}

TEST(Threshold, HidesPairsBelowTau) {
  ScoreMods mods;
  mods.threshold = 0.75;
  const Row row = run_row({0.5f, 0.5f, 1.0f}, Mask(), mods);
  EXPECT_EQ(row.weights, (std::vector<float>{0, 0, 1}));
  EXPECT_EQ(row.out[0], 4.0f);
  mods.threshold = 0.5;  // equal to τ stays
  EXPECT_GT(run_row({0.5f, 0.5f, 1.0f}, Mask(), mods).weights[0], 0.0f);
}

TEST(Threshold, CanHideAWholeRow) {
  ScoreMods mods;
  mods.threshold = 10.0;
  const Row row = run_row({0.5f, 0.5f}, Mask(), mods);
  EXPECT_EQ(row.out[0], 0.0f);
  EXPECT_EQ(row.lse, -INFINITY);
  EXPECT_EQ(row.weights, (std::vector<float>{0, 0}));
}

TEST(Sinks, JoinTheDenominatorWithoutAValue) {
  ScoreMods mods;
  mods.sinks = {1.0f};
  const Row row = run_row({0.0f, 1.0f}, Mask(), mods);
  const auto p = softmax({0.0, 1.0}, 1.0);
  EXPECT_FLOAT_EQ(row.weights[0], p[0]);
  EXPECT_FLOAT_EQ(row.weights[1], p[1]);
  EXPECT_LT(row.weights[0] + row.weights[1], 0.99f);
  EXPECT_FLOAT_EQ(row.out[0], p[0] * 1 + p[1] * 2);
  EXPECT_FLOAT_EQ(row.lse, std::log(std::exp(0.0) + std::exp(1.0) + std::exp(1.0)));
}

TEST(Sinks, FullyHiddenRowPutsAllWeightOnTheSink) {
  ScoreMods mods;
  mods.sinks = {0.5f};
  const Row row = run_row({3.0f}, Mask().key_lengths({0}), mods);
  EXPECT_EQ(row.out[0], 0.0f);
  EXPECT_EQ(row.weights[0], 0.0f);
  EXPECT_EQ(row.lse, 0.5f);  // log(exp(sink))
}

TEST(Order, SoftcapComesBeforeBias) {
  ScoreMods mods;
  mods.softcap = 1.0;
  mods.bias = Array<float>({2}, {5.0f, 0.0f});
  const Row row = run_row({2.0f, 0.0f}, Mask(), mods);
  const auto right = softmax({5.0 + std::tanh(2.0), 0.0});
  EXPECT_FLOAT_EQ(row.weights[0], right[0]);
  const auto wrong = softmax({std::tanh(7.0), 0.0});
  EXPECT_GT(std::fabs(row.weights[0] - wrong[0]), 0.01);
}

TEST(Order, ThresholdSeesBiasAndAlibi) {
  ScoreMods mods;
  mods.bias = Array<float>({3}, {1.0f, 0.0f, 0.0f});
  mods.alibi_slopes = {0.5f};  // one query at position 2: ALiBi adds −1, −0.5, 0
  mods.threshold = 0.5;
  // Final scores 0.5 + 1 − 1 = 0.5 (kept: equal), 0.75 − 0.5 = 0.25 (hidden), 1.0 (kept).
  const Row row = run_row({0.5f, 0.75f, 1.0f}, Mask(), mods);
  EXPECT_GT(row.weights[0], 0.0f);
  EXPECT_EQ(row.weights[1], 0.0f);
  EXPECT_GT(row.weights[2], 0.0f);
  ScoreMods no_alibi = mods;
  no_alibi.alibi_slopes.clear();  // 1.5, 0.75, 1.0: all pass
  EXPECT_GT(run_row({0.5f, 0.75f, 1.0f}, Mask(), no_alibi).weights[1], 0.0f);
  ScoreMods no_bias = mods;
  no_bias.bias.reset();  // −0.5, 0.25, 1.0: only key 2 passes
  EXPECT_EQ(run_row({0.5f, 0.75f, 1.0f}, Mask(), no_bias).weights, (std::vector<float>{0, 0, 1}));
}

TEST(Order, ScaleComesFirst) {
  // scale 2 then softcap 1: tanh(2·0.5)... checked through attention_scores' two stages.
  const std::vector<float> q = {0.5f}, k = {1.0f};
  ScoreMods mods;
  mods.softcap = 1.0;
  Options options;
  options.scale = 2.0;
  float scaled = 0, final_score = 0;
  attention_scores(TensorView(q.data(), {1, 1, 1, 1}), TensorView(k.data(), {1, 1, 1, 1}),
                   MutableTensorView(&scaled, {1, 1, 1, 1}), ScoreStage::scaled, Mask(), mods,
                   options);
  attention_scores(TensorView(q.data(), {1, 1, 1, 1}), TensorView(k.data(), {1, 1, 1, 1}),
                   MutableTensorView(&final_score, {1, 1, 1, 1}), ScoreStage::final, Mask(), mods,
                   options);
  EXPECT_EQ(scaled, 1.0f);
  EXPECT_FLOAT_EQ(final_score, std::tanh(1.0));
}

}  // namespace
}  // namespace maskattn
