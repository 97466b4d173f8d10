// The leakage audit catches each of the common mask mistakes of attention tutorials (wrong
// triangle, keep/blocked polarity, hidden diagonal, top-left causal in a KV-cache step, a 0/1 mask
// added as scores) and passes correct masks, with the measured influence equal to the mask in both
// kernels.
#include "test_util.h"

namespace maskattn {
namespace {

// [L, L] 0/1 matrix with 1 where `rule(i, j)`.
Array<uint8_t> matrix(int64_t L, bool (*rule)(int64_t, int64_t)) {
  std::vector<uint8_t> values(L * L);
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t j = 0; j < L; ++j) values[i * L + j] = rule(i, j);
  }
  return Array<uint8_t>({L, L}, values);
}

AuditReport audit(const Mask& mask, const Mask& expected, int64_t lq = 6, int64_t lk = 6,
                  Kernel kernel = Kernel::automatic) {
  AuditOptions options;
  options.batch = 2;
  options.q_heads = 2;
  options.kv_heads = 1;
  options.q_len = lq;
  options.k_len = lk;
  options.kernel = kernel;
  return audit_mask(mask, {}, &expected, options);
}

TEST(Audit, CorrectMasksPassAndInfluenceEqualsTheMask) {
  const Mask causal = Mask().causal();
  for (Kernel kernel : {Kernel::fused, Kernel::reference}) {
    // The look-ahead mask written three ways: the component, blocked = triu(1), keep = tril(0).
    const Mask blocked = Mask().blocked(matrix(6, [](int64_t i, int64_t j) { return j > i; }));
    const Mask keep = Mask().keep(matrix(6, [](int64_t i, int64_t j) { return j <= i; }));
    for (const Mask& mask : {causal, blocked, keep}) {
      const AuditReport r = audit(mask, causal, 6, 6, kernel);
      EXPECT_TRUE(r.passed()) << mask.describe();
      EXPECT_TRUE(r.kernel_leaks.empty());
      EXPECT_TRUE(r.silent_pairs.empty());
      EXPECT_EQ(r.influence.values(), r.allowed.values()) << mask.describe();
      EXPECT_EQ(r.allowed_count, 2 * 2 * 21);
    }
    // Padding given as lengths or as a keep vector.
    const Mask lengths = Mask().causal().key_lengths({6, 4});
    const Mask keep_vector = Mask().causal().key_keep(
        Array<int64_t>({2, 6}, std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}));
    EXPECT_TRUE(audit(lengths, keep_vector, 6, 6, kernel).passed());
  }
}

TEST(Audit, CatchesTheWrongTriangle) {
  // blocked = tril(ones, -1): hides the past instead of the future.
  const Mask wrong = Mask().blocked(matrix(6, [](int64_t i, int64_t j) { return j < i; }));
  const AuditReport r = audit(wrong, Mask().causal());
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.leaks.size(), 2u * 2 * 15);        // every future key, each (b, h)
  EXPECT_EQ(r.blind_spots.size(), 2u * 2 * 15);  // every past key
  EXPECT_EQ(r.leaks.front(), (AuditPair{0, 0, 0, 1}));
  EXPECT_TRUE(r.kernel_leaks.empty());
}

TEST(Audit, CatchesAKeepMatrixPassedAsBlocked) {
  // The causal keep matrix (tril) given to blocked: polarity flipped; the last row sees nothing.
  const Mask flipped = Mask().blocked(matrix(6, [](int64_t i, int64_t j) { return j <= i; }));
  const AuditReport r = audit(flipped, Mask().causal());
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.blind_spots.size(), 2u * 2 * 21);
  EXPECT_EQ(r.leaks.size(), 2u * 2 * 15);
  ASSERT_EQ(r.empty_rows.size(), 4u);
  EXPECT_EQ(r.empty_rows.front().i, 5);
}

TEST(Audit, CatchesAHiddenDiagonal) {
  // blocked = triu(ones, 0): the diagonal is hidden too; query 0 sees nothing.
  const Mask diagonal = Mask().blocked(matrix(6, [](int64_t i, int64_t j) { return j >= i; }));
  const AuditReport r = audit(diagonal, Mask().causal());
  EXPECT_FALSE(r.passed());
  EXPECT_TRUE(r.leaks.empty());
  EXPECT_EQ(r.blind_spots.size(), 2u * 2 * 6);
  for (const AuditPair& p : r.blind_spots) EXPECT_EQ(p.i, p.j);
  ASSERT_EQ(r.empty_rows.size(), 4u);
  EXPECT_EQ(r.empty_rows.front().i, 0);
}

TEST(Audit, CatchesTopLeftCausalInAKvCacheStep) {
  // One new query against 5 cached keys: bottom-right lets it see all 5, top-left only key 0.
  const AuditReport r = audit(Mask().causal(Alignment::top_left), Mask().causal(), 1, 5);
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.blind_spots.size(), 2u * 2 * 4);
  EXPECT_TRUE(r.leaks.empty());
}

TEST(Audit, CatchesABoolMaskAddedAsScores) {
  // A 0/1 "blocked" matrix added as additive values shifts scores by 1 but hides nothing.
  std::vector<float> added(36);
  for (int64_t i = 0; i < 6; ++i) {
    for (int64_t j = 0; j < 6; ++j) added[i * 6 + j] = j > i ? 1.0f : 0.0f;
  }
  const AuditReport r = audit(Mask().additive(Array<float>({6, 6}, added)), Mask().causal());
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.leaks.size(), 2u * 2 * 15);
}

TEST(Audit, WithoutAnExpectationOnlyTheKernelIsChecked) {
  AuditOptions options;
  options.q_len = 70;  // two query tiles and the row kernel's split: the fused kernel's paths
  options.k_len = 130;
  options.q_heads = 2;
  const AuditReport r =
      audit_mask(Mask().sliding_window(20).key_lengths({100}), {}, nullptr, options);
  EXPECT_TRUE(r.passed());
  EXPECT_FALSE(r.has_expected);
  EXPECT_EQ(r.influence.values(), r.allowed.values());
  EXPECT_MASKATTN_ERROR(audit_mask(Mask(), {}, nullptr, AuditOptions{}), "audit: q_len = 0");
}

TEST(CliAudit, ExitCodeAndGrid) {
  const test::CliResult pass = test::run_cli("audit --mask causal --expect causal --lq 4 --lk 4");
  EXPECT_EQ(pass.exit_code, 0) << pass.err;
  EXPECT_NE(pass.out.find("audit: passed"), std::string::npos);
  const test::CliResult fail =
      test::run_cli("audit --mask causal:top-left --expect causal --lq 1 --lk 5");
  EXPECT_EQ(fail.exit_code, 1);
  EXPECT_NE(fail.out.find("    0 █BBBB"), std::string::npos) << fail.out;
  EXPECT_NE(fail.err.find("maskattn: error: audit failed: 0 kernel leaks, 0 leaks, 4 blind spots"),
            std::string::npos)
      << fail.err;
}

}  // namespace
}  // namespace maskattn
