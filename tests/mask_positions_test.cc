// Positions (docs/design.md §2): how each query lines up with the keys, per alignment and padding
// form.
#include "mask/resolved_mask.h"
#include "test_util.h"

namespace maskattn {
namespace {

using detail::ResolvedMask;

TEST(Positions, BottomRightPutsTheLastQueryAtTheLastKey) {
  const ResolvedMask mask(Mask(), {1, 1, 2, 5});
  EXPECT_EQ(mask.qpos(0, 0), 3);
  EXPECT_EQ(mask.qpos(0, 1), 4);
  EXPECT_EQ(mask.kpos(0, 4), 4);
}

TEST(Positions, BottomRightWithMoreQueriesThanKeysGoesNegative) {
  const ResolvedMask mask(Mask(), {1, 1, 5, 2});
  EXPECT_EQ(mask.qpos(0, 0), -3);
  EXPECT_EQ(mask.qpos(0, 4), 1);
}

TEST(Positions, TopLeftStartsEveryQueryAtZero) {
  const ResolvedMask mask(Mask().set_alignment(Alignment::top_left), {1, 1, 2, 5});
  EXPECT_EQ(mask.qpos(0, 0), 0);
  EXPECT_EQ(mask.qpos(0, 1), 1);
}

TEST(Positions, QueryAndKeyLengthsTogetherAlignEachSequenceAlone) {
  // Sequence 0: 2 real queries after 3 real keys; sequence 1: 3 queries, 5 keys.
  const ResolvedMask mask(Mask().query_lengths({2, 3}).key_lengths({3, 5}), {2, 1, 3, 5});
  EXPECT_EQ(mask.qpos(0, 1), 2);  // its last real query sits at its last real key (index 2)
  EXPECT_EQ(mask.qpos(1, 2), 4);
}

TEST(Positions, KeyLengthsAloneDoNotMoveTheAlignment) {
  const ResolvedMask mask(Mask().key_lengths({2}), {1, 1, 4, 4});
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(mask.qpos(0, i), i);
}

TEST(Positions, KeyStartsCountFromTheFirstRealToken) {
  const ResolvedMask bottom_right(Mask().key_starts({2, 0}), {2, 1, 5, 5});
  EXPECT_EQ(bottom_right.kpos(0, 2), 0);
  EXPECT_EQ(bottom_right.qpos(0, 2), 0);
  EXPECT_EQ(bottom_right.qpos(0, 4), 2);
  EXPECT_EQ(bottom_right.qpos(1, 4), 4);
  // A decode step: 1 new query after a left-padded cache of 5 (3 real tokens).
  const ResolvedMask decode(Mask().key_starts({2}), {1, 1, 1, 6});
  EXPECT_EQ(decode.qpos(0, 0), 3);
  EXPECT_EQ(decode.kpos(0, 5), 3);
  const ResolvedMask top_left(Mask().key_starts({2}).set_alignment(Alignment::top_left),
                              {1, 1, 5, 5});
  EXPECT_EQ(top_left.qpos(0, 2), 0);
}

TEST(Positions, TopLeftCrossAttentionQueriesStartAtZero) {
  // Lq != Lk: the queries are other tokens, so the keys' left padding does not shift them.
  const ResolvedMask mask(Mask().key_starts({2}).set_alignment(Alignment::top_left), {1, 1, 2, 5});
  EXPECT_EQ(mask.qpos(0, 0), 0);
  EXPECT_EQ(mask.kpos(0, 2), 0);
  EXPECT_EQ(test::grid(Mask().causal(Alignment::top_left).key_starts({2}), {1, 1, 2, 5}),
            (std::vector<std::string>{"..1..", "..11."}));
}

TEST(Positions, TopLeftUsesQueryStartsWhenGiven) {
  const ResolvedMask mask(
      Mask().key_starts({1}).query_starts({3}).set_alignment(Alignment::top_left), {1, 1, 5, 5});
  EXPECT_EQ(mask.qpos(0, 3), 0);
  EXPECT_EQ(mask.kpos(0, 1), 0);
}

}  // namespace
}  // namespace maskattn
