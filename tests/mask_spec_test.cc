// SPEC strings (the CLI's --mask and --mod): every form parses into the component or modifier it
// names.
#include <cmath>
#include <cstring>

#include "test_util.h"

namespace maskattn {
namespace {

using test::grid;
using Rows = std::vector<std::string>;

// Integers stored as int32 or uint8 (the CLI takes any integer dtype).
NpyArray int32_array(const std::vector<int32_t>& values, Dims shape) {
  std::vector<uint8_t> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return NpyArray(NpyType::i4, std::move(shape), std::move(bytes));
}
NpyArray uint8_array(const std::vector<uint8_t>& values, Dims shape) {
  return NpyArray(NpyType::u1, std::move(shape), values);
}

class MaskSpec : public ::testing::Test {
 protected:
  std::string file(const std::string& name, const NpyArray& array) {
    write_npy(dir_.path(name), array);
    return dir_.path(name);
  }
  Mask mask_of(std::initializer_list<std::string> specs) {
    Mask mask;
    for (const std::string& spec : specs) apply_mask_spec(spec, mask, mods_);
    return mask;
  }
  test::TempDir dir_;
  ScoreMods mods_;
};

TEST_F(MaskSpec, CausalAndItsAlignments) {
  EXPECT_EQ(grid(mask_of({"causal"}), {1, 1, 2, 4}), (Rows{"111.", "1111"}));
  EXPECT_EQ(grid(mask_of({"causal:bottom-right"}), {1, 1, 2, 4}), (Rows{"111.", "1111"}));
  const Mask top_left = mask_of({"causal:top-left"});
  EXPECT_EQ(grid(top_left, {1, 1, 2, 4}), (Rows{"1...", "11.."}));
  EXPECT_EQ(top_left.labels()[0], "mask spec 'causal:top-left'");
}

TEST_F(MaskSpec, WindowsAndChunks) {
  EXPECT_EQ(grid(mask_of({"window:2:0"}), {1, 1, 4, 4}), grid(Mask().window(2, 0), {1, 1, 4, 4}));
  EXPECT_EQ(grid(mask_of({"window:inf:1"}), {1, 1, 4, 4}),
            grid(Mask().window(kUnbounded, 1), {1, 1, 4, 4}));
  EXPECT_EQ(grid(mask_of({"sliding-window:3"}), {1, 1, 5, 5}),
            grid(Mask().sliding_window(3), {1, 1, 5, 5}));
  EXPECT_EQ(grid(mask_of({"chunk:2", "causal"}), {1, 1, 4, 4}),
            grid(Mask().chunk(2).causal(), {1, 1, 4, 4}));
  EXPECT_EQ(grid(mask_of({"causal", "prefix:2"}), {1, 1, 4, 4}),
            grid(Mask().causal().prefix_lm(2), {1, 1, 4, 4}));
}

TEST_F(MaskSpec, PaddingFiles) {
  const std::string lengths = file("len.npy", NpyArray::from_int64({2, 3}, {2}));
  const std::string starts = file("start.npy", NpyArray::from_int64({1, 0}, {2}));
  const std::string keep = file("keep.npy", NpyArray::from_bools({1, 1, 0, 1, 1, 1}, {2, 3}));
  const std::string ids = file("ids.npy", NpyArray::from_int64({5, 6, 0, 7, 8, 9}, {2, 3}));
  const MaskShape shape = {2, 1, 3, 3};
  EXPECT_EQ(grid(mask_of({"key-lengths:" + lengths}), shape),
            grid(Mask().key_lengths({2, 3}), shape));
  EXPECT_EQ(grid(mask_of({"key-starts:" + starts}), shape), grid(Mask().key_starts({1, 0}), shape));
  EXPECT_EQ(grid(mask_of({"key-keep:" + keep}), shape), grid(Mask().key_lengths({2, 3}), shape));
  // PyTorch's key_padding_mask polarity: 1 = padding.
  const std::string blocked = file("blocked.npy", NpyArray::from_bools({0, 0, 1, 0, 0, 0}, {2, 3}));
  EXPECT_EQ(grid(mask_of({"key-blocked:" + blocked}), shape),
            grid(Mask().key_lengths({2, 3}), shape));
  EXPECT_EQ(grid(mask_of({"pad-id:0:" + ids}), shape), grid(Mask().key_lengths({2, 3}), shape));
  EXPECT_EQ(grid(mask_of({"query-lengths:" + lengths}), shape),
            grid(Mask().query_lengths({2, 3}), shape));
  EXPECT_EQ(grid(mask_of({"query-starts:" + starts}), shape),
            grid(Mask().query_starts({1, 0}), shape));
  EXPECT_EQ(grid(mask_of({"query-keep:" + keep}), shape),
            grid(Mask().query_lengths({2, 3}), shape));
  EXPECT_EQ(grid(mask_of({"query-pad-id:0:" + ids}), shape),
            grid(Mask().query_lengths({2, 3}), shape));
}

TEST_F(MaskSpec, SegmentsAndSpans) {
  const std::string seg = file("seg.npy", NpyArray::from_int64({0, 0, 1}, {1, 3}));
  const std::string qseg = file("qseg.npy", NpyArray::from_int64({1}, {1, 1}));
  EXPECT_EQ(grid(mask_of({"segments:" + seg}), {1, 1, 3, 3}), (Rows{"11.", "11.", "..1"}));
  EXPECT_EQ(grid(mask_of({"segments:" + qseg + ":" + seg}), {1, 1, 1, 3}), (Rows{"..1"}));
  const std::string spans = file("spans.npy", NpyArray::from_int64({1, 1, 0}, {1, 3}));
  EXPECT_EQ(grid(mask_of({"causal", "spans:" + spans}), {1, 1, 3, 3}), (Rows{"11.", "11.", "111"}));
  EXPECT_EQ(grid(mask_of({"causal", "spans:" + qseg + ":" + seg}), {1, 1, 1, 3}), (Rows{"111"}));
}

TEST_F(MaskSpec, GlobalTokensFromAnIdVectorOrMatrixOfAnyIntegerType) {
  // Longformer: window(1,1) with global tokens 0 and 3 of L = 5.
  const std::vector<int64_t> flags = {1, 0, 0, 1, 0};
  const Mask expected = Mask().window(1, 1).global_tokens(Array<int64_t>({5}, flags));
  // Rows 0 and 3 see everything; every row sees keys 0 and 3.
  const Rows rows = {"11111", "1111.", "1111.", "11111", "1..11"};
  ASSERT_EQ(grid(expected, {1, 1, 5, 5}), rows);
  for (const NpyArray& ids : {NpyArray::from_int64(flags, {5}),                   // [L] int64
                              int32_array({1, 0, 0, 1, 0}, {5}),                  // [L] int32
                              NpyArray::from_bools({1, 0, 0, 1, 0}, {5}),         // [L] bool
                              NpyArray::from_int64({7, 0, 0, -2, 0}, {1, 5})}) {  // ≠ 0 is global
    const Mask mask = mask_of({"window:1:1", "global:" + file("g.npy", ids)});
    EXPECT_EQ(grid(mask, {1, 1, 5, 5}), rows);
    // An [L] file holds for every sequence of the batch.
    EXPECT_EQ(grid(mask, {3, 1, 5, 5}, 2), rows);
  }
  // [B,L]: each sequence its own global tokens.
  const std::string per_sequence =
      file("gb.npy", uint8_array({1, 0, 0, 0, 0, 0, 0, 0, 0, 1}, {2, 5}));
  const Mask batch = mask_of({"causal", "global:" + per_sequence});
  EXPECT_EQ(grid(batch, {2, 1, 5, 5}, 0), (Rows{"11111", "11...", "111..", "1111.", "11111"}));
  EXPECT_EQ(grid(batch, {2, 1, 5, 5}, 1), (Rows{"1...1", "11..1", "111.1", "11111", "11111"}));
  EXPECT_EQ(batch.labels()[1], "mask spec 'global:" + per_sequence + "'");
}

TEST_F(MaskSpec, GlobalTokensForQueriesAndKeysSeparately) {
  // Two new queries (positions 3 and 4) after three cached keys: causal hides key 4 from query 0.
  ASSERT_EQ(grid(Mask().causal(), {1, 1, 2, 5}), (Rows{"1111.", "11111"}));
  const std::string no_query = file("q0.npy", NpyArray::from_int64({0, 0}, {2}));
  const std::string key_4 = file("k4.npy", NpyArray::from_bools({0, 0, 0, 0, 1}, {5}));
  const Mask global_key = mask_of({"causal", "global:" + no_query + ":" + key_4});
  EXPECT_EQ(grid(global_key, {1, 1, 2, 5}), (Rows{"11111", "11111"}));
  EXPECT_EQ(grid(global_key, {1, 1, 2, 5}),
            grid(Mask().causal().global_tokens(Array<int64_t>({2}, {0, 0}),
                                               Array<int64_t>({5}, {0, 0, 0, 0, 1})),
                 {1, 1, 2, 5}));
  const std::string query_0 = file("q1.npy", NpyArray::from_int64({1, 0}, {1, 2}));
  const std::string no_key = file("k0.npy", int32_array({0, 0, 0, 0, 0}, {1, 5}));
  EXPECT_EQ(grid(mask_of({"causal", "global:" + query_0 + ":" + no_key}), {1, 1, 2, 5}),
            (Rows{"11111", "11111"}));
  EXPECT_EQ(grid(mask_of({"causal", "global:" + no_query + ":" + no_key}), {1, 1, 2, 5}),
            (Rows{"1111.", "11111"}));
}

TEST_F(MaskSpec, BlockSparseLayoutsOfEveryRankFromBoolsOrIntegers) {
  // [nQ,nK] = [2,3] blocks of 2 queries × 2 keys over Lq = 4, Lk = 5 (the last key block is short).
  const std::vector<uint8_t> layout = {1, 0, 1, 0, 1, 1};
  const Rows rows = {"11..1", "11..1", "..111", "..111"};
  const Mask expected = Mask().block_sparse(Array<uint8_t>({2, 3}, layout), 2, 2);
  ASSERT_EQ(grid(expected, {1, 1, 4, 5}), rows);
  for (const NpyArray& array :
       {uint8_array(layout, {2, 3}), NpyArray::from_bools(layout, {2, 3}),
        int32_array({1, 0, 1, 0, 1, 1}, {2, 3}), NpyArray::from_int64({1, 0, 1, 0, 1, 1}, {2, 3}),
        uint8_array(layout, {1, 2, 3}), uint8_array(layout, {1, 1, 2, 3})}) {
    const Mask mask = mask_of({"block-sparse:2:2:" + file("l.npy", array)});
    EXPECT_EQ(grid(mask, {1, 1, 4, 5}), rows) << shape_string(array.shape());
  }
  // Block sizes of their own per side, and a layout per head ([H,nQ,nK]).
  const std::string heads = file("h.npy", uint8_array({1, 0, 1, 1, 0, 1, 1, 1}, {2, 2, 2}));
  const Mask per_head = mask_of({"block-sparse:1:3:" + heads});
  EXPECT_EQ(grid(per_head, {1, 2, 2, 6}, 0, 0), (Rows{"111...", "111111"}));
  EXPECT_EQ(grid(per_head, {1, 2, 2, 6}, 0, 1), (Rows{"...111", "111111"}));
  EXPECT_EQ(per_head.labels()[0], "mask spec 'block-sparse:1:3:" + heads + "'");
  // It ANDs with the other components.
  const std::string short_keys = file("l2.npy", uint8_array(layout, {2, 3}));
  EXPECT_EQ(grid(mask_of({"causal", "block-sparse:2:2:" + short_keys}), {1, 1, 4, 5}),
            (Rows{"11...", "11...", "..11.", "..111"}));
}

TEST_F(MaskSpec, AThreeDimensionalLayoutIsPerSequenceForOneHeadInputs) {
  // As for dense files: with [B,L,D] inputs a 3-D layout is [B,nQ,nK], not [H,nQ,nK].
  const std::string path = file("b.npy", uint8_array({1, 0, 0, 1, 0, 1, 1, 0}, {2, 2, 2}));
  Mask mask;
  SpecOptions one_head;
  one_head.one_head_layout = true;
  apply_mask_spec("block-sparse:1:1:" + path, mask, mods_, "", one_head);
  EXPECT_EQ(std::get<component::BlockSparse>(mask.components()[0]).layout.shape(),
            (Dims{2, 1, 2, 2}));
  EXPECT_EQ(grid(mask, {2, 1, 2, 2}, 1), (Rows{".1", "1."}));
  EXPECT_EQ(std::get<component::BlockSparse>(mask_of({"block-sparse:1:1:" + path}).components()[0])
                .layout.shape(),
            (Dims{2, 2, 2}));
}

TEST_F(MaskSpec, GlobalAndBlockSparseErrorsNameTheSpec) {
  const std::string layout = file("l.npy", uint8_array({1, 1, 1, 1}, {2, 2}));
  for (const char* sizes : {"0:2", "2:0", "x:2", "2:-1", "2.5:2", ":2"}) {
    const std::string spec = std::string("block-sparse:") + sizes + ":" + layout;
    EXPECT_MASKATTN_ERROR(mask_of({spec}), "mask spec '" + spec + "': block size B",
                          "is not a positive integer (block-sparse:BQ:BK:FILE)");
  }
  EXPECT_MASKATTN_ERROR(mask_of({"block-sparse:2:2"}),
                        "mask spec 'block-sparse:2:2': block-sparse needs BQ:BK:FILE");
  EXPECT_MASKATTN_ERROR(mask_of({"block-sparse:" + layout}), "block-sparse needs BQ:BK:FILE");
  EXPECT_MASKATTN_ERROR(mask_of({"block-sparse:2:2:"}), "block-sparse needs BQ:BK:FILE");
  EXPECT_MASKATTN_ERROR(mask_of({"block-sparse:2:2:/nonexistent/l.npy"}),
                        "mask spec 'block-sparse:2:2:/nonexistent/l.npy': cannot open "
                        "'/nonexistent/l.npy'");
  const std::string twos = file("t.npy", NpyArray::from_int64({1, 0, 2, 1}, {2, 2}));
  EXPECT_MASKATTN_ERROR(mask_of({"block-sparse:2:2:" + twos}),
                        "mask spec 'block-sparse:2:2:" + twos + "': " + twos +
                            " holds 2 at flat index 2; block-sparse layouts hold only 0 and 1");
  const std::string vector = file("v.npy", uint8_array({1, 1}, {2}));
  EXPECT_MASKATTN_ERROR(mask_of({"block-sparse:2:2:" + vector}),
                        vector +
                            " has shape [2]; a block-sparse layout is [nQ,nK], [H,nQ,nK] or "
                            "[B,H,nQ,nK]");
  const std::string five = file("5.npy", uint8_array({1}, {1, 1, 1, 1, 1}));
  EXPECT_MASKATTN_ERROR(mask_of({"block-sparse:2:2:" + five}), "has shape [1,1,1,1,1]; a block");
  const std::string floats = file("f.npy", NpyArray::from_floats({1, 0, 1, 1}, {2, 2}));
  EXPECT_MASKATTN_ERROR(mask_of({"block-sparse:2:2:" + floats}),
                        floats +
                            " has dtype float32; block-sparse layouts are bool or 0/1 "
                            "integers");
  // Block counts that do not cover the lengths: at the call, naming the spec.
  EXPECT_MASKATTN_ERROR(allowed_pairs(mask_of({"block-sparse:2:2:" + layout}), {1, 1, 6, 4}),
                        "mask spec 'block-sparse:2:2:" + layout +
                            "': layout [2,2] has 2 query "
                            "blocks of 2, but Lq=6 needs");

  const std::string cube = file("c.npy", NpyArray::from_int64({1, 0}, {1, 1, 2}));
  EXPECT_MASKATTN_ERROR(mask_of({"global:" + cube}),
                        "mask spec 'global:" + cube + "': " + cube +
                            " has shape [1,1,2]; global-token ids are [B,L] or [L] (≠ 0 = global)");
  EXPECT_MASKATTN_ERROR(mask_of({"global:" + cube + ":" + cube}),
                        "global-token ids are [B,Lq] or [Lq]");
  const std::string ids = file("i.npy", NpyArray::from_int64({1, 0}, {2}));
  EXPECT_MASKATTN_ERROR(mask_of({"global:" + ids + ":" + cube}),
                        "global-token ids are [B,Lk] or [Lk]");
  EXPECT_MASKATTN_ERROR(mask_of({"global:" + floats}), "has dtype float32");
  EXPECT_MASKATTN_ERROR(mask_of({"global"}), "'global' needs an argument");
  // Ids that do not fit the problem: at the call, naming the spec.
  EXPECT_MASKATTN_ERROR(allowed_pairs(mask_of({"global:" + ids}), {1, 1, 3, 3}),
                        "mask spec 'global:" + ids + "'", "ids have shape [1,2]");
}

TEST_F(MaskSpec, DenseFilesAcceptBoolAndIntegers) {
  const std::string bools = file("b.npy", NpyArray::from_bools({1, 0, 1, 1}, {2, 2}));
  const std::string ints = file("i.npy", NpyArray::from_int64({1, 0, 1, 1}, {2, 2}));
  const std::string floats = file("f.npy", NpyArray::from_floats({0, -INFINITY, 0, 0}, {2, 2}));
  EXPECT_EQ(grid(mask_of({"keep:" + bools}), {1, 1, 2, 2}), (Rows{"1.", "11"}));
  EXPECT_EQ(grid(mask_of({"keep:" + ints}), {1, 1, 2, 2}), (Rows{"1.", "11"}));
  EXPECT_EQ(grid(mask_of({"blocked:" + bools}), {1, 1, 2, 2}), (Rows{".1", ".."}));
  EXPECT_EQ(grid(mask_of({"additive:" + floats}), {1, 1, 2, 2}), (Rows{"1.", "11"}));
  EXPECT_MASKATTN_ERROR(mask_of({"keep:" + floats}), "keep masks are bool or 0/1 integers");
  const std::string twos = file("two.npy", NpyArray::from_int64({1, 2}, {2}));
  EXPECT_MASKATTN_ERROR(mask_of({"blocked:" + twos}), "holds 2 at flat index 1");
}

TEST_F(MaskSpec, ModifiersFillScoreMods) {
  const std::string slopes = file("slopes.npy", NpyArray::from_floats({0.5f, 0.25f}, {2}));
  const std::string sinks = file("sinks.npy", NpyArray::from_floats({1.0f, -1.0f}, {2}));
  const std::string bias = file("bias.npy", NpyArray::from_floats({1, 2}, {1, 2}));
  const Mask mask = mask_of(
      {"alibi:" + slopes, "sinks:" + sinks, "softcap:30", "threshold:-2.5", "bias:" + bias});
  EXPECT_TRUE(mask.components().empty());
  EXPECT_EQ(mods_.alibi_slopes, (std::vector<float>{0.5f, 0.25f}));
  EXPECT_EQ(mods_.sinks, (std::vector<float>{1.0f, -1.0f}));
  EXPECT_EQ(mods_.softcap, 30.0);
  EXPECT_EQ(mods_.threshold, -2.5);
  ASSERT_TRUE(mods_.bias.has_value());
  EXPECT_EQ(mods_.bias->shape(), (Dims{1, 2}));
  EXPECT_MASKATTN_ERROR(mask_of({"softcap:1"}), "softcap given twice");
  EXPECT_MASKATTN_ERROR(mask_of({"alibi:" + slopes}), "alibi given twice");
}

TEST_F(MaskSpec, ErrorsNameTheSpec) {
  EXPECT_MASKATTN_ERROR(mask_of({"causal:sideways"}),
                        "mask spec 'causal:sideways': causal alignment 'sideways'");
  EXPECT_MASKATTN_ERROR(mask_of({"window:1:2:3"}), "window needs LEFT:RIGHT");
  EXPECT_MASKATTN_ERROR(mask_of({"window:-1:0"}), "window sides must be ≥ 0");
  EXPECT_MASKATTN_ERROR(mask_of({"sliding-window:0"}),
                        "mask spec 'sliding-window:0': sliding_window(0)");
  EXPECT_MASKATTN_ERROR(mask_of({"pad-id:x:f.npy"}), "'x' is not an integer");
  EXPECT_MASKATTN_ERROR(mask_of({"pad-id:3"}), "pad-id needs ID:FILE");
  EXPECT_MASKATTN_ERROR(mask_of({"softcap:abc"}), "'abc' is not a number");
  EXPECT_MASKATTN_ERROR(mask_of({"key-lengths:/nonexistent.npy"}),
                        "mask spec 'key-lengths:/nonexistent.npy': cannot open '/nonexistent.npy'");
  const std::string matrix = file("m.npy", NpyArray::from_int64({1, 2}, {1, 2}));
  EXPECT_MASKATTN_ERROR(mask_of({"key-lengths:" + matrix}), "has shape [1,2]; expected [B]");
  EXPECT_MASKATTN_ERROR(mask_of({"alibi:" + matrix}), "alibi file has shape [1,2]; expected [Hq]");
  const std::string integers = file("n.npy", NpyArray::from_int64({1, 2}, {2}));
  EXPECT_MASKATTN_ERROR(mask_of({"sinks:" + integers}), "has dtype int64");
  Mask labelled;
  EXPECT_MASKATTN_ERROR(apply_mask_spec("chunk:0", labelled, mods_, "--mask chunk:0"),
                        "--mask chunk:0: chunk(0)");
}

// expr:PROGRAM[:NAME=FILE]...: a mask program under --mask, a score program under --mod, its
// tables from .npy files of any dtype the other SPECs read.
TEST_F(MaskSpec, ExprIsAMaskProgramWithTablesFromFiles) {
  EXPECT_EQ(grid(mask_of({"expr:q >= kv"}), {1, 1, 3, 5}),
            grid(Mask().causal(Alignment::top_left), {1, 1, 3, 5}));
  const std::vector<int64_t> ids = {0, 0, 1, 1, 1};
  const Rows documents = grid(Mask().segments(Array<int64_t>({1, 5}, ids)).causal(), {1, 1, 5, 5});
  for (const NpyArray& doc :
       {NpyArray::from_int64(ids, {5}), int32_array({0, 0, 1, 1, 1}, {5}),
        uint8_array({0, 0, 1, 1, 1}, {5}), NpyArray::from_floats({0, 0, 1, 1, 1}, {5})}) {
    const std::string path = file("doc.npy", doc);
    // A float table compares as f32 (exact for these ids); an integer one as int64.
    const Mask mask = mask_of({"expr:(doc[q] == doc[kv]) & (q >= kv):doc=" + path});
    EXPECT_EQ(grid(mask, {1, 1, 5, 5}), documents) << npy_type_name(doc.type());
    EXPECT_EQ(mask.labels()[0],
              "mask spec 'expr:(doc[q] == doc[kv]) & (q >= kv):doc=" + path + "'");
  }
  // Bool tables, 2-D tables, several tables, and an expr: combined with other SPECs.
  const std::string keep = file("keep.npy", NpyArray::from_bools({1, 0, 1, 1, 0}, {5}));
  const std::string heads = file("heads.npy", NpyArray::from_int64({0, 2}, {2, 1}));
  const Mask mask = mask_of(
      {"causal:top-left", "expr:keep[kv] & (kv >= heads[h, 0]):keep=" + keep + ":heads=" + heads});
  EXPECT_EQ(grid(mask, {1, 2, 3, 5}, 0, 0), (Rows{"1....", "1....", "1.1.."}));
  EXPECT_EQ(grid(mask, {1, 2, 3, 5}, 0, 1), (Rows{".....", ".....", "..1.."}));
  EXPECT_FALSE(mods_.program.has_value());
}

TEST_F(MaskSpec, ModSpecsFillScoreModsAndRefuseMasks) {
  ScoreMods mods;
  const std::string slopes = file("slopes.npy", NpyArray::from_floats({0.5f, 0.25f}, {2}));
  const std::vector<std::string> specs = {"softcap:30", "threshold:-1", "alibi:" + slopes,
                                          "expr:s - slope[h] * abs(q - kv):slope=" + slopes};
  for (const std::string& spec : specs) {
    apply_mod_spec(spec, mods);
  }
  EXPECT_EQ(mods.softcap, 30.0);
  EXPECT_EQ(mods.threshold, -1.0);
  EXPECT_EQ(mods.alibi_slopes.size(), 2u);
  ASSERT_TRUE(mods.program.has_value());
  EXPECT_EQ(mods.program->kind(), ProgramKind::score);
  EXPECT_FLOAT_EQ(mods.program->score(1.0f, 0, 1, 4, 0), 1.0f - 0.25f * 4);
  EXPECT_MASKATTN_ERROR(apply_mod_spec("expr:s * 2", mods),
                        "modifier spec 'expr:s * 2': a second score program");
  EXPECT_MASKATTN_ERROR(apply_mod_spec("causal", mods),
                        "modifier spec 'causal': 'causal' is a mask SPEC; give it to --mask");
  EXPECT_MASKATTN_ERROR(apply_mod_spec("softcab:3", mods),
                        "unknown kind 'softcab'; known modifiers");
  EXPECT_MASKATTN_ERROR(apply_mod_spec("expr:q >= kv", mods, "--mod expr:q >= kv"),
                        "--mod expr:q >= kv: `q >= kv` is a mask program (a bool), not a score "
                        "program (a number); give mask programs to --mask");
  EXPECT_MASKATTN_ERROR(mask_of({"expr:s * 2"}),
                        "mask spec 'expr:s * 2': `s * 2` is a score program (a number), not a mask "
                        "program (a bool); give score programs to --mod");
  // A program that is no good either way keeps the compiler's own error.
  EXPECT_MASKATTN_ERROR(
      mask_of({"expr:q >= pos"}),
      "mask spec 'expr:q >= pos': program `q >= pos`, column 6: unknown identifier "
      "'pos'");
}

TEST_F(MaskSpec, ExprErrorsNameTheSpecAndTheTable) {
  EXPECT_MASKATTN_ERROR(mask_of({"expr"}), "'expr' needs an argument");
  EXPECT_MASKATTN_ERROR(mask_of({"expr::doc=d.npy"}), "expr needs a program before its tables");
  for (const char* field : {"doc", "=d.npy", "doc="}) {
    EXPECT_MASKATTN_ERROR(mask_of({std::string("expr:q >= kv:") + field}),
                          std::string("table '") + field + "' is not NAME=FILE");
  }
  EXPECT_MASKATTN_ERROR(mask_of({"expr:doc[q] > 0:doc=/nonexistent.npy"}),
                        "mask spec 'expr:doc[q] > 0:doc=/nonexistent.npy': table doc: cannot open "
                        "'/nonexistent.npy'");
  const std::string four = file("4.npy", NpyArray::from_int64({1, 2}, {1, 1, 1, 2}));
  EXPECT_MASKATTN_ERROR(mask_of({"expr:t[q, kv, 0] > 0:t=" + four}),
                        "table t: " + four +
                            " has shape [1,1,1,2]; a program table has 1 to 3 "
                            "dimensions");
  const std::string doc = file("doc.npy", NpyArray::from_int64({0, 1}, {2}));
  EXPECT_MASKATTN_ERROR(mask_of({"expr:doc[q] > 0:doc=" + doc + ":doc=" + doc}),
                        "program table 'doc' is given twice");
  EXPECT_MASKATTN_ERROR(mask_of({"expr:doc[q] > 0:my-doc=" + doc}),
                        "a table name must be a non-empty identifier");
}

TEST_F(MaskSpec, TreeInlineOrFromAFileOfAnyIntegerDtype) {
  // A prefix of 2 keys, then the draft -1 0 0 1: the same pairs inline, as [T] int32 and as a
  // [B,T] file whose second row is another tree.
  const Rows expected = {"111...", "1111..", "111.1.", "1111.1"};
  EXPECT_EQ(grid(mask_of({"tree:-1,0,0,1"}), {1, 1, 4, 6}), expected);
  EXPECT_EQ(grid(mask_of({"tree:" + file("p.npy", int32_array({-1, 0, 0, 1}, {4}))}), {1, 1, 4, 6}),
            expected);
  const Mask batched = mask_of(
      {"tree:" + file("b.npy", NpyArray::from_int64({-1, 0, 0, 1, -1, -1, -1, 2}, {2, 4}))});
  EXPECT_EQ(grid(batched, {2, 1, 4, 6}, 0), expected);
  EXPECT_EQ(grid(batched, {2, 1, 4, 6}, 1), (Rows{"111...", "11.1..", "11..1.", "11..11"}));
  EXPECT_EQ(mask_of({"tree:-1,0"}).labels()[0], "mask spec 'tree:-1,0'");
  EXPECT_MASKATTN_ERROR(mask_of({"tree:"}), "'tree' needs an argument");
  EXPECT_MASKATTN_ERROR(mask_of({"tree:-1,x"}), "cannot open '-1,x'");  // not a list: a file
}

TEST_F(MaskSpec, HelpListsEveryKind) {
  const std::string help = mask_spec_help();
  for (const char* kind :
       {"causal",         "window:",       "sliding-window:", "chunk:",        "prefix:",
        "key-lengths:",   "key-starts:",   "key-keep:",       "key-blocked:",  "pad-id:",
        "query-lengths:", "query-starts:", "query-keep:",     "query-pad-id:", "segments:",
        "spans:",         "global:",       "block-sparse:",   "keep:",         "blocked:",
        "additive:",      "alibi:",        "softcap:",        "sinks:",        "threshold:",
        "bias:",          "expr:",         "tree:",           "--mod"}) {
    EXPECT_NE(help.find(kind), std::string::npos) << kind;
  }
}

}  // namespace
}  // namespace maskattn
