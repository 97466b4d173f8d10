// The block-sparse layout builders (maskattn/sparse_layouts.h): each pattern's defining rule, the
// BigBird draw (counts, determinism, per-head variation), and the shapes.
#include "test_util.h"

namespace maskattn {
namespace {

int64_t ones_in_row(const Array<uint8_t>& layout, int64_t head, int64_t row) {
  const int64_t blocks = layout.dim(layout.rank() - 1);
  int64_t count = 0;
  for (int64_t c = 0; c < blocks; ++c) count += layout.values()[(head * blocks + row) * blocks + c];
  return count;
}

TEST(BigBirdLayout, SlidingGlobalAndRandomBlocks) {
  const int64_t n = 16;
  const Array<uint8_t> layout = bigbird_layout(n, {3, 2, 3, 42});
  ASSERT_EQ(layout.shape(), (Dims{n, n}));
  for (int64_t r = 0; r < n; ++r) {
    const bool global_row = r == 0 || r == n - 1;  // global_blocks = 2: the first and the last
    for (int64_t c = 0; c < n; ++c) {
      const bool must = global_row || c == 0 || c == n - 1 || std::abs(r - c) <= 1;
      if (must) {
        EXPECT_EQ(layout.at(r, c), 1) << r << "," << c;
      }
    }
    if (global_row) continue;
    // The window (3, fewer at the edges next to a global block) plus 2 global columns plus 3
    // random blocks, none of them repeated.
    const int64_t window = 3 - (r == 1 ? 1 : 0) - (r == n - 2 ? 1 : 0);
    EXPECT_EQ(ones_in_row(layout, 0, r), window + 2 + 3) << "row " << r;
  }
}

TEST(BigBirdLayout, SameSeedSameLayoutOtherSeedOrHeadDiffers) {
  const Array<uint8_t> a = bigbird_layout(32, {3, 2, 3, 7});
  EXPECT_EQ(a.values(), bigbird_layout(32, {3, 2, 3, 7}).values());
  EXPECT_NE(a.values(), bigbird_layout(32, {3, 2, 3, 8}).values());
  const Array<uint8_t> heads = bigbird_layout(32, {3, 2, 3, 7}, 4);
  ASSERT_EQ(heads.shape(), (Dims{4, 32, 32}));
  for (int64_t h = 1; h < 4; ++h) {
    bool differs = false;  // from head 0
    for (int64_t n = 0; n < 1024; ++n) differs |= heads.values()[h * 1024 + n] != heads.values()[n];
    EXPECT_TRUE(differs) << "head " << h << " drew the same blocks as head 0";
  }
}

TEST(BigBirdLayout, FewBlocksLeaveFewerRandomChoices) {
  // 4 blocks: the window and the global blocks already cover every row, nothing left to draw.
  const Array<uint8_t> layout = bigbird_layout(4, {3, 2, 3, 0});
  for (const uint8_t on : layout.values()) EXPECT_EQ(on, 1);
  EXPECT_EQ(bigbird_layout(1).shape(), (Dims{1, 1}));
}

TEST(StridedLayout, LocalAndStrideColumnsCausal) {
  const Array<uint8_t> layout = strided_layout(12, 2, 4);
  for (int64_t r = 0; r < 12; ++r) {
    for (int64_t c = 0; c < 12; ++c) {
      const bool expected = c <= r && (r - c < 2 || (r - c) % 4 == 0);
      EXPECT_EQ(layout.at(r, c), expected) << r << "," << c;
    }
  }
  const Array<uint8_t> both = strided_layout(12, 2, 4, false);
  EXPECT_EQ(both.at(0, 8), 1);
  EXPECT_EQ(both.at(0, 1), 1);
  EXPECT_EQ(both.at(0, 2), 0);
}

TEST(FixedLayout, OwnChunkAndSummaryColumns) {
  const Array<uint8_t> layout = fixed_layout(9, 3, 1);
  for (int64_t r = 0; r < 9; ++r) {
    for (int64_t c = 0; c < 9; ++c) {
      const bool expected = c <= r && (r / 3 == c / 3 || c % 3 == 2);
      EXPECT_EQ(layout.at(r, c), expected) << r << "," << c;
    }
  }
  EXPECT_EQ(fixed_layout(9, 3, 1, false).at(0, 8), 1);
  EXPECT_EQ(fixed_layout(9, 3, 1, false, 2).shape(), (Dims{2, 9, 9}));
}

TEST(Layouts, DriveBlockSparseAtAnyBlockSize) {
  // A strided layout over blocks of 16 allows exactly its blocks' pairs.
  const Array<uint8_t> layout = strided_layout(4, 1, 2);
  const Array<uint8_t> pairs = allowed_pairs(Mask().block_sparse(layout, 16, 16), {1, 1, 64, 64});
  for (int64_t i = 0; i < 64; ++i) {
    for (int64_t j = 0; j < 64; ++j) {
      EXPECT_EQ(pairs.values()[i * 64 + j], layout.at(i / 16, j / 16)) << i << "," << j;
    }
  }
}

}  // namespace
}  // namespace maskattn
