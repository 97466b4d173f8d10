// The numeric health report on small hand-made inputs, and its mask warnings.
#include <cmath>

#include "test_util.h"

namespace maskattn {
namespace {

TEST(Health, NumbersOfAHandMadeHead) {
  // D = 1, scale 1: S = q·kᵀ = [[1, -1], [2, -2]]; causal hides (0, 1).
  const std::vector<float> q = {1, 2}, k = {1, -1}, v = {1, 0};
  Options options;
  options.scale = 1.0;
  const HealthReport r =
      health_report(TensorView(q.data(), {1, 1, 2, 1}), TensorView(k.data(), {1, 1, 2, 1}),
                    TensorView(v.data(), {1, 1, 2, 1}), Mask().causal(), {}, options);
  ASSERT_EQ(r.heads.size(), 1u);
  const HeadHealth& h = r.heads[0];
  EXPECT_EQ(h.score_min, -2.0);  // allowed pairs only: 1, 2, -2
  EXPECT_EQ(h.score_max, 2.0);
  EXPECT_EQ(h.max_logit, 2.0);
  EXPECT_DOUBLE_EQ(h.hidden_fraction, 0.25);
  EXPECT_EQ(h.empty_rows, 0);
  // Row 0: one key, entropy 0. Row 1: p = softmax(2, -2).
  const double p = 1.0 / (1.0 + std::exp(-4.0));
  const double row1 = -(p * std::log(p) + (1 - p) * std::log(1 - p));
  EXPECT_NEAR(h.mean_entropy, row1 / 2, 1e-6);
  EXPECT_EQ(h.nan_count, 0);
  EXPECT_TRUE(r.warnings.empty());
}

TEST(Health, EmptyRowsNanAndModifiers) {
  const std::vector<float> q = {1, 2, NAN}, k = {1, -1, 0.5f}, v = {1, 0, 2};
  ScoreMods mods;
  mods.softcap = 1.0;  // the max logit is capped below 1
  const HealthReport r =
      health_report(TensorView(q.data(), {1, 1, 3, 1}), TensorView(k.data(), {1, 1, 3, 1}),
                    TensorView(v.data(), {1, 1, 3, 1}), Mask().causal().query_lengths({2}), mods);
  const HeadHealth& h = r.heads[0];
  EXPECT_EQ(h.empty_rows, 1);  // query 2 is padding (and its NaN never shows)
  EXPECT_LT(h.max_logit, 1.0);
  EXPECT_EQ(h.nan_count, 0);
  const std::vector<float> bad_q = {NAN, 2, 1};
  const HealthReport poisoned =
      health_report(TensorView(bad_q.data(), {1, 1, 3, 1}), TensorView(k.data(), {1, 1, 3, 1}),
                    TensorView(v.data(), {1, 1, 3, 1}), Mask().causal());
  EXPECT_GT(poisoned.heads[0].nan_count, 0);
  ASSERT_FALSE(poisoned.warnings.empty());
  EXPECT_NE(poisoned.warnings.back().find("NaN"), std::string::npos);
}

// What attend --report hands over (the output it computed, in a strided view, and the allowed
// pairs) gives the report the report computes itself; a given result of the wrong shape is an
// Error, not a wrong report.
TEST(Health, PrecomputedResultsGiveTheSameReport) {
  const std::vector<float> q = {1, 2, NAN, 0.5f}, k = {1, -1, 0.5f, 2}, v = {1, 0, 2, INFINITY};
  const TensorView qv(q.data(), {1, 1, 4, 1}), kv(k.data(), {1, 1, 4, 1}),
      vv(v.data(), {1, 1, 4, 1});
  const Mask mask = Mask().causal().query_lengths({3});
  const HealthReport own = health_report(qv, kv, vv, mask);
  std::vector<float> out(8, -7.0f);  // every other element: the view's stride is 2
  attention(qv, kv, vv, MutableTensorView(out.data(), {1, 1, 4, 1}, {8, 8, 2, 1}), mask);
  const Array<uint8_t> allowed = allowed_pairs(mask, {1, 1, 4, 4});
  const HealthPrecomputed given{TensorView(out.data(), {1, 1, 4, 1}, {8, 8, 2, 1}), &allowed};
  const HealthReport reused = health_report(qv, kv, vv, mask, {}, {}, 64, given);
  ASSERT_EQ(reused.heads.size(), own.heads.size());
  EXPECT_EQ(reused.heads[0].nan_count, own.heads[0].nan_count);
  EXPECT_EQ(reused.heads[0].inf_count, own.heads[0].inf_count);
  EXPECT_EQ(reused.heads[0].empty_rows, own.heads[0].empty_rows);
  EXPECT_EQ(reused.heads[0].hidden_fraction, own.heads[0].hidden_fraction);
  EXPECT_EQ(reused.warnings, own.warnings);
  const Array<uint8_t> wrong = allowed_pairs(mask, {1, 1, 4, 3});
  EXPECT_THROW(health_report(qv, kv, vv, mask, {}, {}, 64, {TensorView(), &wrong}), Error);
}

TEST(Health, WarnsAboutFiniteSentinels) {
  // Row 0 carries -1e9 on every key: uniform weights over pairs meant to be hidden.
  const test::RandomProblem p(1, 1, 1, 3, 3, 4, 4, 5);
  const float lowest = -3.4028235e38f;
  std::vector<float> additive = {-1e9f, -1e9f, -1e9f, 0, -1e9f, -1e9f, 0, 0, lowest};
  const HealthReport r =
      health_report(p.qv(), p.kv(), p.vv(), Mask().additive(Array<float>({3, 3}, additive)));
  auto has = [&](const std::string& part) {
    for (const std::string& w : r.warnings) {
      if (w.find(part) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(has("does not hide a pair"));
  EXPECT_TRUE(has("is below the float16 range (-65504)"));
  EXPECT_TRUE(has("near finfo(float32).min"));
  EXPECT_TRUE(has("1 rows have only finite sentinel scores"));
  // −inf hides: no warning.
  const HealthReport clean =
      health_report(p.qv(), p.kv(), p.vv(),
                    Mask().additive(Array<float>({3}, std::vector<float>{0, -INFINITY, 0})));
  EXPECT_TRUE(clean.warnings.empty());
}

TEST(Health, CliReport) {
  test::TempDir dir;
  write_npy(dir.path("q.npy"), NpyArray::from_floats(test::random_values(4 * 8, 2), {4, 8}));
  const std::string q = dir.path("q.npy");
  const test::CliResult result =
      test::run_cli("attend --q " + q + " --k " + q + " --v " + q + " --out " + dir.path("o.npy") +
                    " --mask causal --report");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("numeric health report (f32)"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("37.5%"), std::string::npos) << result.out;  // 6 of 16 hidden
  EXPECT_NE(result.out.find("no warnings"), std::string::npos);
}

}  // namespace
}  // namespace maskattn
