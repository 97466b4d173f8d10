// Every mask component alone and combined, on small hand-checked grids ('1' allowed, '.' hidden;
// rows are queries i, columns keys j).
#include "test_util.h"

namespace maskattn {
namespace {

using test::grid;
using Rows = std::vector<std::string>;

TEST(Causal, SquareIsLowerTriangular) {
  EXPECT_EQ(grid(Mask().causal(), {1, 1, 4, 4}), (Rows{"1...", "11..", "111.", "1111"}));
  EXPECT_EQ(grid(Mask().causal(Alignment::top_left), {1, 1, 4, 4}),
            grid(Mask().causal(), {1, 1, 4, 4}));
}

TEST(Causal, BottomRightWithFewerQueries) {
  // FlashAttention ≥ 2.1 README example: Lq = 2, Lk = 5.
  EXPECT_EQ(grid(Mask().causal(), {1, 1, 2, 5}), (Rows{"1111.", "11111"}));
}

TEST(Causal, TopLeftWithFewerQueries) {
  EXPECT_EQ(grid(Mask().causal(Alignment::top_left), {1, 1, 2, 5}), (Rows{"1....", "11..."}));
}

TEST(Causal, BottomRightWithMoreQueriesLeavesTheTopRowsEmpty) {
  EXPECT_EQ(grid(Mask().causal(), {1, 1, 5, 2}), (Rows{"..", "..", "..", "1.", "11"}));
}

TEST(Causal, TopLeftWithMoreQueries) {
  EXPECT_EQ(grid(Mask().causal(Alignment::top_left), {1, 1, 5, 2}),
            (Rows{"1.", "11", "11", "11", "11"}));
}

TEST(Window, LeftTwoSeesThreeKeys) {
  const Rows expected = {"1.....", "11....", "111...", ".111..", "..111.", "...111"};
  EXPECT_EQ(grid(Mask().window(2, 0), {1, 1, 6, 6}), expected);
}

TEST(Window, SlidingWindowOfThreeSeesThreeKeys) {
  EXPECT_EQ(grid(Mask().sliding_window(3), {1, 1, 6, 6}), grid(Mask().window(2, 0), {1, 1, 6, 6}));
  EXPECT_EQ(grid(Mask().sliding_window(1), {1, 1, 3, 3}), (Rows{"1..", ".1.", "..1"}));
}

TEST(Window, BothSidesAreInclusive) {
  EXPECT_EQ(grid(Mask().window(1, 1), {1, 1, 5, 5}),
            (Rows{"11...", "111..", ".111.", "..111", "...11"}));
  EXPECT_EQ(grid(Mask().window(0, 2), {1, 1, 4, 4}), (Rows{"111.", ".111", "..11", "...1"}));
}

TEST(Window, UnboundedLeftWithZeroRightIsCausal) {
  EXPECT_EQ(grid(Mask().window(kUnbounded, 0), {1, 1, 3, 7}), grid(Mask().causal(), {1, 1, 3, 7}));
  EXPECT_EQ(grid(Mask().window(kUnbounded, kUnbounded), {1, 1, 3, 3}), (Rows{"111", "111", "111"}));
}

TEST(Window, IsBottomRightAlignedForDecoding) {
  // One query after 5 cached keys: sliding_window(3) sees the last three.
  EXPECT_EQ(grid(Mask().sliding_window(3), {1, 1, 1, 6}), (Rows{"...111"}));
}

TEST(Window, SeveralWindowsIntersect) {
  EXPECT_EQ(grid(Mask().window(2, 2).causal(), {1, 1, 4, 4}),
            grid(Mask().window(2, 0), {1, 1, 4, 4}));
}

TEST(Chunk, WithCausalStaysInsideEachChunk) {
  EXPECT_EQ(grid(Mask().chunk(2).causal(), {1, 1, 5, 5}),
            (Rows{"1....", "11...", "..1..", "..11.", "....1"}));
}

TEST(Chunk, AloneIsBlockDiagonal) {
  EXPECT_EQ(grid(Mask().chunk(2), {1, 1, 5, 5}),
            (Rows{"11...", "11...", "..11.", "..11.", "....1"}));
}

TEST(Chunk, UsesPositionsSoDecodingKeepsChunkBoundaries) {
  // Query at position 5 (after 5 cached keys), chunk 4: sees positions 4 and 5 only.
  EXPECT_EQ(grid(Mask().chunk(4).causal(), {1, 1, 1, 6}), (Rows{"....11"}));
}

TEST(KeyPadding, FourFormsAgree) {
  const MaskShape shape = {2, 1, 3, 5};
  const Rows row0 = {"111..", "111..", "111.."};
  const Mask lengths = Mask().key_lengths({3, 5});
  const Mask keep = Mask().key_keep(Array<int64_t>({2, 5}, {1, 1, 1, 0, 0, 1, 1, 1, 1, 1}));
  const Mask ids = Mask().key_pad_id(Array<int64_t>({2, 5}, {7, 8, 9, 0, 0, 4, 5, 6, 7, 8}), 0);
  for (const Mask* mask : {&lengths, &keep, &ids}) {
    EXPECT_EQ(grid(*mask, shape, 0), row0);
    EXPECT_EQ(grid(*mask, shape, 1), (Rows{"11111", "11111", "11111"}));
  }
  EXPECT_EQ(grid(Mask().key_starts({2, 0}), shape, 0), (Rows{"..111", "..111", "..111"}));
}

TEST(KeyPadding, RightPaddedBatchWithCausal) {
  EXPECT_EQ(grid(Mask().causal().key_lengths({2}), {1, 1, 4, 4}),
            (Rows{"1...", "11..", "11..", "11.."}));
}

TEST(KeyPadding, LeftPaddingWithCausalMatchesTheUnpaddedSequence) {
  // Two pads in front of three real tokens: pad rows see nothing, real rows see real keys only.
  EXPECT_EQ(grid(Mask().causal().key_starts({2}), {1, 1, 5, 5}),
            (Rows{".....", ".....", "..1..", "..11.", "..111"}));
  // The same with HF's keep vector (positions do not shift, but causal only needs j ≤ i).
  EXPECT_EQ(grid(Mask().causal().key_keep(Array<int64_t>({1, 5}, {0, 0, 1, 1, 1})), {1, 1, 5, 5}),
            (Rows{".....", ".....", "..1..", "..11.", "..111"}));
}

TEST(KeyPadding, LeftPaddingShiftsChunkPositions) {
  // Unpadded, chunk(2)+causal over 3 tokens is {0,1},{2}; two pads in front must not move that.
  EXPECT_EQ(grid(Mask().chunk(2).causal().key_starts({2}), {1, 1, 5, 5}),
            (Rows{".....", ".....", "..1..", "..11.", "....1"}));
}

TEST(QueryPadding, PaddedQueryRowsHideEverything) {
  const Rows expected = {"111", "111", "...", "..."};
  const MaskShape shape = {1, 1, 4, 3};
  EXPECT_EQ(grid(Mask().query_lengths({2}), shape), expected);
  EXPECT_EQ(grid(Mask().query_keep(Array<int64_t>({1, 4}, {1, 1, 0, 0})), shape), expected);
  EXPECT_EQ(grid(Mask().query_pad_id(Array<int64_t>({1, 4}, {5, 6, -1, -1}), -1), shape), expected);
  EXPECT_EQ(grid(Mask().query_starts({2}), shape), (Rows{"...", "...", "111", "111"}));
}

TEST(QueryPadding, RaggedBatchAlignsEachSequenceBottomRight) {
  // Sequence 0: 2 real queries, 3 real keys → queries at key positions 1 and 2.
  const Mask mask = Mask().causal().query_lengths({2, 3}).key_lengths({3, 5});
  EXPECT_EQ(grid(mask, {2, 1, 3, 5}, 0), (Rows{"11...", "111..", "....."}));
  EXPECT_EQ(grid(mask, {2, 1, 3, 5}, 1), (Rows{"111..", "1111.", "11111"}));
  // Without query lengths, the alignment is the padded shapes' (Lk − Lq = 2).
  EXPECT_EQ(grid(Mask().causal().key_lengths({3, 5}), {2, 1, 3, 5}, 0),
            (Rows{"111..", "111..", "111.."}));
}

TEST(Segments, PackedDocumentsWithCausal) {
  const Mask mask = Mask().causal().segments(Array<int64_t>({1, 5}, {0, 0, 1, 1, 1}));
  EXPECT_EQ(grid(mask, {1, 1, 5, 5}), (Rows{"1....", "11...", "..1..", "..11.", "..111"}));
}

TEST(Segments, SeparateQueryAndKeyIds) {
  const Mask mask =
      Mask().segments(Array<int64_t>({1, 2}, {3, 4}), Array<int64_t>({1, 4}, {3, 4, 4, 3}));
  EXPECT_EQ(grid(mask, {1, 1, 2, 4}), (Rows{"1..1", ".11."}));
}

TEST(Spans, ImageTokensAttendBothWaysTextStaysCausal) {
  // Tokens 1..3 are an image: bidirectional among themselves; text is causal.
  const Mask mask = Mask().causal().spans(Array<int64_t>({1, 6}, {0, 1, 1, 1, 0, 0}));
  EXPECT_EQ(grid(mask, {1, 1, 6, 6}),
            (Rows{"1.....", "1111..", "1111..", "1111..", "11111.", "111111"}));
}

TEST(Spans, DoNotRelaxPaddingOrSegments) {
  const Mask mask = Mask().causal().spans(Array<int64_t>({1, 4}, {1, 1, 1, 1})).key_lengths({3});
  EXPECT_EQ(grid(mask, {1, 1, 4, 4}), (Rows{"111.", "111.", "111.", "111."}));
}

TEST(Spans, WithoutCausalOrWindowChangeNothing) {
  EXPECT_EQ(grid(Mask().spans(Array<int64_t>({1, 3}, {0, 1, 1})), {1, 1, 3, 3}),
            (Rows{"111", "111", "111"}));
}

TEST(GlobalTokens, LongformerWindowWithGlobalRowsAndColumns) {
  // window(1,1) with token 0 and token 4 global: their rows and columns are full.
  const Mask mask = Mask().window(1, 1).global_tokens(Array<int64_t>({1, 6}, {1, 0, 0, 0, 1, 0}));
  EXPECT_EQ(grid(mask, {1, 1, 6, 6}),
            (Rows{"111111", "111.1.", "11111.", "1.111.", "111111", "1...11"}));
}

TEST(GlobalTokens, WithCausalEarlierQueriesSeeALaterGlobalKey) {
  const Mask mask = Mask().causal().global_tokens(Array<int64_t>({4}, {0, 0, 1, 0}));
  EXPECT_EQ(grid(mask, {1, 1, 4, 4}), (Rows{"1.1.", "111.", "1111", "1111"}));
}

TEST(GlobalTokens, DoNotRelaxPaddingChunksOrSegments) {
  const Mask mask = Mask()
                        .causal()
                        .global_tokens(Array<int64_t>({1, 6}, {1, 0, 0, 0, 0, 0}))
                        .key_lengths({5})
                        .segments(Array<int64_t>({1, 6}, {1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(grid(mask, {1, 1, 6, 6}),
            (Rows{"111...", "11....", "111...", "...1..", "...11.", "...11."}));
}

TEST(GlobalTokens, QueryAndKeySidesForADecodingStep) {
  // Two new queries after 4 cached keys (bottom-right): key 1 is global, query 0 is not.
  const Mask mask = Mask().causal().global_tokens(Array<int64_t>({1, 2}, {0, 1}),
                                                  Array<int64_t>({1, 5}, {0, 1, 0, 0, 0}));
  EXPECT_EQ(grid(mask, {1, 1, 2, 5}), (Rows{"1111.", "11111"}));
}

TEST(BlockSparse, LayoutBlocksOnIndicesAndBroadcastOverHeads) {
  // Blocks of 2 queries × 3 keys; the last block row and column are short.
  const Mask mask = Mask().block_sparse(Array<uint8_t>({3, 2}, {1, 0, 0, 1, 1, 1}), 2, 3);
  EXPECT_EQ(grid(mask, {1, 2, 5, 5}, 0, 1), (Rows{"111..", "111..", "...11", "...11", "11111"}));
}

TEST(BlockSparse, AndsWithTheOtherComponents) {
  const Mask mask =
      Mask().causal().block_sparse(Array<uint8_t>({2, 2}, {1, 0, 0, 1}), 2, 2).key_lengths({3});
  EXPECT_EQ(grid(mask, {1, 1, 4, 4}), (Rows{"1...", "11..", "..1.", "..1."}));
}

TEST(PrefixLm, PrefixIsBidirectionalRestCausal) {
  EXPECT_EQ(grid(Mask().causal().prefix_lm(3), {1, 1, 5, 5}),
            (Rows{"111..", "111..", "111..", "1111.", "11111"}));
  EXPECT_EQ(grid(Mask().causal().prefix_lm(0), {1, 1, 3, 3}), grid(Mask().causal(), {1, 1, 3, 3}));
}

TEST(PrefixLm, RelaxesWindowsOnlyInsideThePrefix) {
  EXPECT_EQ(grid(Mask().sliding_window(2).prefix_lm(3), {1, 1, 5, 5}),
            (Rows{"111..", "111..", "111..", "..11.", "...11"}));
}

TEST(Predicate, IsCalledWithIndices) {
  const Mask mask = Mask().predicate(
      [](int64_t b, int64_t h, int64_t i, int64_t j) { return (i + j + b + h) % 2 == 0; },
      "checkerboard");
  EXPECT_EQ(grid(mask, {2, 2, 3, 3}, 0, 0), (Rows{"1.1", ".1.", "1.1"}));
  EXPECT_EQ(grid(mask, {2, 2, 3, 3}, 1, 0), (Rows{".1.", "1.1", ".1."}));
  EXPECT_EQ(grid(mask, {2, 2, 3, 3}, 1, 1), (Rows{"1.1", ".1.", "1.1"}));
}

TEST(PerHead, LocalAndGlobalHeads) {
  // Heads 0-1 local (window 1 back), head 2 global causal.
  const Mask mask = Mask().window(1, 0, HeadSet::range(0, 2)).causal(HeadSet{2});
  const MaskShape shape = {1, 3, 4, 4};
  EXPECT_EQ(grid(mask, shape, 0, 0), (Rows{"1...", "11..", ".11.", "..11"}));
  EXPECT_EQ(grid(mask, shape, 0, 1), grid(mask, shape, 0, 0));
  EXPECT_EQ(grid(mask, shape, 0, 2), (Rows{"1...", "11..", "111.", "1111"}));
}

TEST(PerHead, ChunkSegmentsAndSpansCanBeRestricted) {
  const Mask mask = Mask().chunk(2, HeadSet{1});
  EXPECT_EQ(grid(mask, {1, 2, 3, 3}, 0, 0), (Rows{"111", "111", "111"}));
  EXPECT_EQ(grid(mask, {1, 2, 3, 3}, 0, 1), (Rows{"11.", "11.", "..1"}));
  const Mask spans = Mask().causal().spans(Array<int64_t>({1, 3}, {1, 1, 1}), HeadSet{0});
  EXPECT_EQ(grid(spans, {1, 2, 3, 3}, 0, 0), (Rows{"111", "111", "111"}));
  EXPECT_EQ(grid(spans, {1, 2, 3, 3}, 0, 1), (Rows{"1..", "11.", "111"}));
}

TEST(Combination, CausalPaddingWindowAndSegments) {
  const Mask mask = Mask().causal().sliding_window(3).key_lengths({6}).segments(
      Array<int64_t>({1, 7}, {1, 1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(grid(mask, {1, 1, 7, 7}),
            (Rows{"1......", "11.....", "111....", ".111...", "....1..", "....11.", "....11."}));
}

TEST(Combination, OperatorAndIntersects) {
  const Mask padding = Mask().key_lengths({3});
  const Mask combined = Mask().causal() & padding;
  EXPECT_EQ(grid(combined, {1, 1, 4, 4}), (Rows{"1...", "11..", "111.", "111."}));
  EXPECT_EQ(combined.describe(), "causal & key_lengths");
  const Mask top_left = Mask().causal(Alignment::top_left) & padding;
  EXPECT_EQ(top_left.alignment(), Alignment::top_left);
}

TEST(EmptyMask, AllowsEverythingAndZeroSizesWork) {
  EXPECT_EQ(grid(Mask(), {1, 1, 2, 3}), (Rows{"111", "111"}));
  EXPECT_EQ(allowed_pairs(Mask().causal(), {0, 1, 3, 3}).numel(), 0);
  EXPECT_EQ(allowed_pairs(Mask().causal(), {1, 1, 3, 0}).numel(), 0);
}

}  // namespace
}  // namespace maskattn
