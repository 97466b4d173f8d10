// SPEC strings (the CLI's --mask): every form parses into the component or modifier it names.
#include <cmath>

#include "test_util.h"

namespace maskattn {
namespace {

using test::grid;
using Rows = std::vector<std::string>;

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

TEST_F(MaskSpec, HelpListsEveryKind) {
  const std::string help = mask_spec_help();
  for (const char* kind :
       {"causal",         "window:",       "sliding-window:", "chunk:",        "prefix:",
        "key-lengths:",   "key-starts:",   "key-keep:",       "key-blocked:",  "pad-id:",
        "query-lengths:", "query-starts:", "query-keep:",     "query-pad-id:", "segments:",
        "spans:",         "keep:",         "blocked:",        "additive:",     "alibi:",
        "softcap:",       "sinks:",        "threshold:",      "bias:"}) {
    EXPECT_NE(help.find(kind), std::string::npos) << kind;
  }
}

}  // namespace
}  // namespace maskattn
