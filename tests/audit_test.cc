// The leakage audit catches each of the common mask mistakes of attention tutorials (wrong
// triangle, keep/blocked polarity, hidden diagonal, top-left causal in a KV-cache step, a 0/1 mask
// added as scores) and passes correct masks, with the measured influence equal to the mask in both
// kernels.
#include <algorithm>

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

// Global tokens 5 and 7 of L = 8: with causal, every earlier query sees keys 5 and 7, and queries 5
// and 7 see the whole sequence.
const std::vector<int64_t> kGlobal = {0, 0, 0, 0, 0, 1, 0, 1};

std::vector<std::pair<int64_t, int64_t>> relaxed_of(const AuditReport& r, int64_t b, int64_t h) {
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (const AuditRelaxedPair& p : r.relaxed_pairs) {
    if (p.pair.b == b && p.pair.h == h) pairs.emplace_back(p.pair.i, p.pair.j);
  }
  return pairs;
}

TEST(Audit, CausalWithGlobalTokensShowsTheLookAheadPairsAndTheirComponent) {
  const Mask mask = Mask().causal().global_tokens(Array<int64_t>({8}, kGlobal));
  const AuditReport r = audit(mask, Mask().causal(), 8, 8);
  // The look-ahead pairs: key later than the query, the query or the key global.
  std::vector<std::pair<int64_t, int64_t>> expected;
  for (int64_t i = 0; i < 8; ++i) {
    for (int64_t j = i + 1; j < 8; ++j) {
      if (kGlobal[i] || kGlobal[j]) expected.emplace_back(i, j);
    }
  }
  ASSERT_EQ(expected.size(), 13u);  // queries 0–4 → key 5, queries 0–6 → key 7, query 5 → key 6
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t h = 0; h < 2; ++h) EXPECT_EQ(relaxed_of(r, b, h), expected);
  }
  for (const AuditRelaxedPair& p : r.relaxed_pairs) {
    EXPECT_TRUE(p.look_ahead);
    EXPECT_EQ(p.component, 1u);
    EXPECT_EQ(p.reason, kGlobal[p.pair.i] && kGlobal[p.pair.j] ? Relaxation::global_both
                        : kGlobal[p.pair.i]                    ? Relaxation::global_query
                                                               : Relaxation::global_key);
  }
  const auto text = [&](int64_t i, int64_t j) {
    for (const AuditRelaxedPair& p : r.relaxed_pairs) {
      if (p.pair == AuditPair{0, 0, i, j}) return relaxed_pair_text(r, p);
    }
    return std::string("(not relaxed)");
  };
  EXPECT_EQ(text(3, 7), "global_tokens: b=0 h=0 query 3 sees later key 7 (a global key)");
  EXPECT_EQ(text(5, 6), "global_tokens: b=0 h=0 query 5 sees later key 6 (a global query)");
  EXPECT_EQ(text(5, 7), "global_tokens: b=0 h=0 query 5 sees later key 7 (a global query and key)");
  EXPECT_EQ(text(3, 6), "(not relaxed)");  // hidden: neither is global
  // Against plain causal these are exactly the leaks, and the kernel honours the mask.
  ASSERT_EQ(r.leaks.size(), r.relaxed_pairs.size());
  for (size_t n = 0; n < r.leaks.size(); ++n) EXPECT_EQ(r.leaks[n], r.relaxed_pairs[n].pair);
  EXPECT_TRUE(r.blind_spots.empty());
  EXPECT_TRUE(r.kernel_leaks.empty());
  EXPECT_EQ(r.influence.values(), r.allowed.values());
  EXPECT_TRUE(audit(mask, mask, 8, 8, Kernel::reference).passed());
}

TEST(Audit, RelaxedPairsBeyondAWindowPerHeadAndForSpansAndPrefixes) {
  // window(1, 0), global tokens for head 1 only: in head 1, query 0 sees every later key and
  // queries 2.. see key 0 beyond the window.
  const std::vector<int64_t> first = {1, 0, 0, 0, 0};
  const Mask windowed = Mask().window(1, 0).global_tokens(Array<int64_t>({5}, first), HeadSet{1});
  const AuditReport r = audit(windowed, windowed, 5, 5);
  EXPECT_TRUE(r.passed());
  EXPECT_TRUE(relaxed_of(r, 0, 0).empty());
  using Pairs = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(relaxed_of(r, 1, 1), (Pairs{{0, 1}, {0, 2}, {0, 3}, {0, 4}, {2, 0}, {3, 0}, {4, 0}}));
  const auto earlier =
      *std::find_if(r.relaxed_pairs.begin(), r.relaxed_pairs.end(), [](const AuditRelaxedPair& p) {
        return p.pair == AuditPair{0, 1, 2, 0};
      });
  EXPECT_FALSE(earlier.look_ahead);
  EXPECT_EQ(relaxed_pair_text(r, earlier),
            "global_tokens: b=0 h=1 query 2 sees earlier key 0 beyond its window (a global key)");

  // Spans and prefix-LM are attributed to themselves; the first relaxing component in the mask's
  // order is named when several apply.
  const Array<int64_t> span({2, 4}, {0, 1, 1, 0, 0, 1, 1, 0});
  const AuditReport spans = audit(Mask().causal().spans(span), Mask(), 4, 4);
  ASSERT_EQ(spans.relaxed_pairs.size(), 4u);  // (1, 2) in each (b, h)
  EXPECT_EQ(spans.relaxed_pairs[0].reason, Relaxation::span);
  EXPECT_EQ(relaxed_pair_text(spans, spans.relaxed_pairs[0]),
            "spans: b=0 h=0 query 1 sees later key 2 (the same span)");
  const AuditReport prefix = audit(Mask().causal().prefix_lm(2), Mask(), 4, 4);
  ASSERT_EQ(prefix.relaxed_pairs.size(), 4u);
  EXPECT_EQ(relaxed_pair_text(prefix, prefix.relaxed_pairs[0]),
            "prefix_lm(2): b=0 h=0 query 0 sees later key 1 (both in the prefix)");
  const Mask both = Mask().causal().spans(span).global_tokens(Array<int64_t>({4}, {0, 0, 1, 0}));
  const AuditReport first_named = audit(both, both, 4, 4);
  EXPECT_EQ(first_named.relaxed_pairs[0].pair, (AuditPair{0, 0, 0, 2}));
  EXPECT_EQ(first_named.relaxed_pairs[0].component, 2u);  // only the global key relaxes it
  EXPECT_EQ(first_named.relaxed_pairs[1].pair, (AuditPair{0, 0, 1, 2}));
  EXPECT_EQ(first_named.relaxed_pairs[1].component, 1u);  // spans come first in the mask

  // Without a causal or window component nothing is relaxed, whatever else hides.
  const Mask unordered = Mask()
                             .global_tokens(Array<int64_t>({5}, first))
                             .block_sparse(Array<uint8_t>({2, 2}, {1, 0, 1, 1}), 3, 3);
  EXPECT_TRUE(audit(unordered, unordered, 5, 5).relaxed_pairs.empty());
  EXPECT_TRUE(audit(Mask().causal(), Mask().causal()).relaxed_pairs.empty());
}

// Global tokens in every query tile and a BigBird layout at a block size that is not the kernel's:
// the fused kernel's measured influence is exactly the mask, across tile edges and with Lq ≠ Lk.
TEST(Audit, TheFusedKernelHonoursGlobalTokensAndBlockSparseLayouts) {
  std::vector<int64_t> global(130, 0);
  global[0] = global[64] = global[129] = 1;
  const Array<uint8_t> layout = bigbird_layout(9, {3, 2, 2, 5});  // ⌈130/16⌉ = 9 blocks
  AuditOptions options;
  options.q_heads = 2;
  options.q_len = options.k_len = 130;
  options.kernel = Kernel::fused;
  const Array<int64_t> ids({130}, global);
  std::vector<int64_t> document(130, 0);
  for (size_t t = 70; t < document.size(); ++t) document[t] = 1;
  const std::vector<Mask> masks = {
      Mask().causal().global_tokens(ids),
      Mask().sliding_window(20).global_tokens(ids),
      Mask().block_sparse(layout, 16, 16),
      Mask().causal().global_tokens(ids).block_sparse(layout, 16, 16),
      // Per head, and with padding, chunks and segments, which global tokens do not relax.
      Mask().causal().global_tokens(ids, HeadSet{1}).key_lengths({100}),
      Mask().window(8, 8).chunk(50).global_tokens(ids),
      Mask().causal().segments(Array<int64_t>({1, 130}, document)).global_tokens(ids),
  };
  for (const Mask& mask : masks) {
    const AuditReport r = audit_mask(mask, {}, nullptr, options);
    EXPECT_TRUE(r.passed()) << mask.describe();
    EXPECT_EQ(r.influence.values(), r.allowed.values()) << mask.describe();
  }
  // A decode-like step: 3 queries after 127 cached keys, the key side's global flags.
  options.q_len = 3;
  const Mask step =
      Mask().causal().global_tokens(Array<int64_t>({3}, {0, 1, 0}), Array<int64_t>({130}, global));
  const AuditReport r = audit_mask(step, {}, nullptr, options);
  EXPECT_EQ(r.influence.values(), r.allowed.values());
  // Query 0 (position 127) sees the later global key 129; query 1 is global.
  EXPECT_EQ(relaxed_of(r, 0, 0), (std::vector<std::pair<int64_t, int64_t>>{{0, 129}, {1, 129}}));
}

TEST(CliAudit, ShowsTheLookAheadPairsOfGlobalTokens) {
  test::TempDir dir;
  write_npy(dir.path("g.npy"), NpyArray::from_int64(kGlobal, {8}));
  const std::string global = "global:" + dir.path("g.npy");
  const test::CliResult shown =
      test::run_cli("audit --mask causal --mask " + global + " --lq 8 --lk 8");
  EXPECT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_NE(shown.out.find("look-ahead pairs allowed by global/span/prefix:      13   e.g. " +
                           global + ": b=0 h=0 query 0 sees later key 5 (a global key); "),
            std::string::npos)
      << shown.out;
  EXPECT_NE(shown.out.find("pairs beyond a window allowed by global/span/prefix: 0\n"),
            std::string::npos);
  EXPECT_NE(shown.out.find("    0 █····G·G\n"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find("    5 ██████GG\n    6 ███████G\n    7 ████████\n"), std::string::npos)
      << shown.out;
  // Expecting plain causal: the same pairs are leaks, and the audit says where they come from.
  const test::CliResult leaks =
      test::run_cli("audit --mask causal --mask " + global + " --expect causal --lq 8 --lk 8");
  EXPECT_EQ(leaks.exit_code, 1);
  EXPECT_NE(leaks.out.find("  of which allowed past causal/window by global/span/prefix: 13 "
                           "(listed below)"),
            std::string::npos)
      << leaks.out;
  EXPECT_NE(leaks.out.find("    0 █····L·L\n"), std::string::npos) << leaks.out;
  EXPECT_NE(leaks.err.find("audit failed: 0 kernel leaks, 13 leaks, 0 blind spots"),
            std::string::npos);
  // --expect takes the new SPECs.
  EXPECT_EQ(test::run_cli("audit --mask causal --mask " + global + " --expect causal --expect " +
                          global + " --lq 8 --lk 8")
                .exit_code,
            0);
  // Masks without a relaxing component print no such lines.
  EXPECT_EQ(test::run_cli("audit --mask causal --lq 3 --lk 3").out.find("look-ahead"),
            std::string::npos);
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
