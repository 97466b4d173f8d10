// The Mask builder: labels, descriptions, head sets, alignment, combination.
#include "test_util.h"

namespace maskattn {
namespace {

TEST(MaskBuilder, DescribeListsComponentsInOrder) {
  EXPECT_EQ(Mask().describe(), "none");
  EXPECT_EQ(Mask().causal().sliding_window(4).chunk(8).describe(),
            "causal & sliding_window(4) & chunk(8)");
  EXPECT_EQ(Mask().window(kUnbounded, 3).describe(), "window(inf,3)");
  EXPECT_EQ(Mask().causal(HeadSet{0, 2}).describe(), "causal@heads=0,2");
  EXPECT_EQ(Mask().causal(Alignment::top_left).describe(), "causal (top-left)");
  EXPECT_EQ(Mask().prefix_lm(3).key_lengths({2}).describe(), "prefix_lm(3) & key_lengths");
}

TEST(MaskBuilder, DescribeNamesSparseComponents) {
  const Mask mask = Mask()
                        .sliding_window(4)
                        .global_tokens(Array<int64_t>({6}, {1, 0, 0, 0, 0, 0}), HeadSet{0, 1})
                        .block_sparse(Array<uint8_t>({2, 2}, {1, 1, 0, 1}), 64, 32);
  EXPECT_EQ(mask.describe(), "sliding_window(4) & global_tokens@heads=0,1 & block_sparse(64,32)");
}

TEST(MaskBuilder, LabelLastRenamesTheNewestComponent) {
  Mask mask = Mask().causal().key_lengths({1});
  mask.label_last("--mask key-lengths:len.npy");
  EXPECT_EQ(mask.labels().back(), "--mask key-lengths:len.npy");
  EXPECT_EQ(mask.components().size(), 2u);
}

TEST(MaskBuilder, SlidingWindowIsWindowOfWMinusOne) {
  const Mask mask = Mask().sliding_window(5);
  const auto& window = std::get<component::Window>(mask.components()[0]);
  EXPECT_EQ(window.left, 4);
  EXPECT_EQ(window.right, 0);
}

TEST(HeadSet, SortsDeduplicatesAndRanges) {
  const HeadSet set{3, 1, 3, 4, 0};
  EXPECT_EQ(set.to_string(), "@heads=0,1,3,4");
  EXPECT_TRUE(set.contains(3));
  EXPECT_FALSE(set.contains(2));
  EXPECT_FALSE(set.contains(5));
  EXPECT_EQ(set.max_head(), 4);
  EXPECT_EQ(HeadSet{7}.to_string(), "@heads=7");
  EXPECT_TRUE(HeadSet().is_all());
  EXPECT_TRUE(HeadSet().contains(1000));
  EXPECT_EQ(HeadSet().max_head(), -1);
  EXPECT_EQ(HeadSet::range(2, 5).to_string(), "@heads=2-4");
  EXPECT_EQ(HeadSet({5, 6, 7, 8, 1}).to_string(), "@heads=1,5-8");
  // Huge ranges cost nothing and are checked against Hq when the mask is used.
  const HeadSet huge = HeadSet::range(0, int64_t{1} << 40);
  EXPECT_TRUE(huge.contains((int64_t{1} << 40) - 1));
  EXPECT_MASKATTN_ERROR(allowed_pairs(Mask().causal(huge), {1, 8, 2, 2}),
                        "causal applies to head 1099511627775 but the query has Hq=8 heads");
}

TEST(MaskBuilder, AlignmentDefaultsToBottomRightAndConflictsAreErrors) {
  EXPECT_EQ(Mask().alignment(), Alignment::bottom_right);
  EXPECT_FALSE(Mask().causal().alignment_is_set());
  Mask mask = Mask().causal(Alignment::top_left);
  EXPECT_TRUE(mask.alignment_is_set());
  mask.set_alignment(Alignment::top_left);  // the same again is fine
  EXPECT_MASKATTN_ERROR(mask.set_alignment(Alignment::bottom_right), "alignment");
  EXPECT_MASKATTN_ERROR(Mask().causal(Alignment::bottom_right) & Mask().causal(Alignment::top_left),
                        "one alignment");
}

TEST(MaskBuilder, CombinationKeepsBothSidesComponentsAndLabels) {
  Mask a = Mask().causal();
  a.label_last("first");
  Mask b = Mask().chunk(2);
  b.label_last("second");
  const Mask both = a & b;
  EXPECT_EQ(both.labels(), (std::vector<std::string>{"first", "second"}));
  EXPECT_EQ(a.components().size(), 1u);  // operands unchanged
}

}  // namespace
}  // namespace maskattn
