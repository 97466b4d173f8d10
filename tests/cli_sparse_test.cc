// The command line's sparse masks, run as a separate process: global:FILE and block-sparse SPECs
// drawn by `maskattn mask`, `maskattn layout` writing what sparse_layouts.h builds, a decode step's
// layout rows, and the Hugging Face Longformer and BigBird correspondences (docs/semantics.md §14).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "maskattn/sparse_layouts.h"
#include "test_util.h"

namespace maskattn {
namespace {

using test::run_cli;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Longformer (window 2 each side, global tokens 0 and 6) and a block-sparse layout, drawn.
TEST(CliMask, DrawsGlobalTokensAndBlockSparseLayouts) {
  test::TempDir dir;
  std::vector<int64_t> global(12, 0);
  global[0] = global[6] = 1;
  write_npy(dir.path("g.npy"), NpyArray::from_int64(global, {12}));
  const test::CliResult longformer =
      run_cli("mask window:2:2 global:" + dir.path("g.npy") + " --lq 12 --lk 12");
  ASSERT_EQ(longformer.exit_code, 0) << longformer.err;
  EXPECT_TRUE(contains(longformer.out,
                       " 0  █ █ █ █ █ █ █ █ █ █ █ █   12\n"
                       " 1  █ █ █ █ · · █ · · · · ·   5\n"
                       " 2  █ █ █ █ █ · █ · · · · ·   6\n"
                       " 3  █ █ █ █ █ █ █ · · · · ·   7\n"
                       " 4  █ · █ █ █ █ █ · · · · ·   6\n"
                       " 5  █ · · █ █ █ █ █ · · · ·   6\n"
                       " 6  █ █ █ █ █ █ █ █ █ █ █ █   12\n"
                       " 7  █ · · · · █ █ █ █ █ · ·   6\n"
                       " 8  █ · · · · · █ █ █ █ █ ·   6\n"
                       " 9  █ · · · · · █ █ █ █ █ █   7\n"
                       "10  █ · · · · · █ · █ █ █ █   6\n"
                       "11  █ · · · · · █ · · █ █ █   5\n"))
      << longformer.out;
  EXPECT_TRUE(contains(longformer.out, "global:" + dir.path("g.npy") +
                                           ": global queries 0 6, global keys 0 6 (they pass "
                                           "causal and window bounds)\n"))
      << longformer.out;

  // Blocks of 2 queries × 3 keys, one layout per head: --head picks it, Hq comes from the file.
  write_npy(dir.path("l.npy"),
            NpyArray::from_bools({1, 0, 1, 1, 0, 1, 0, 1, 1, 1, 1, 0}, {2, 3, 2}));
  const std::string spec = "block-sparse:2:3:" + dir.path("l.npy");
  const test::CliResult blocks = run_cli("mask " + spec + " --lq 6 --lk 6 --head 1");
  ASSERT_EQ(blocks.exit_code, 0) << blocks.err;
  EXPECT_TRUE(contains(blocks.out, "batch 0 of B=1, head 1 of Hq=2")) << blocks.out;
  EXPECT_TRUE(contains(blocks.out,
                       "0  · · · █ █ █   3\n1  · · · █ █ █   3\n2  █ █ █ █ █ █   6\n"
                       "3  █ █ █ █ █ █   6\n4  █ █ █ · · ·   3\n5  █ █ █ · · ·   3\n"))
      << blocks.out;
  EXPECT_TRUE(contains(blocks.out, spec + ": layout [2,3,2] of blocks of 2 queries × 3 keys"));
  const test::CliResult no_head = run_cli("mask " + spec + " --lq 6 --lk 6 --head 2");
  EXPECT_EQ(no_head.exit_code, 1);
  EXPECT_TRUE(contains(no_head.err, "--head 2 is out of range: the mask has Hq=2")) << no_head.err;

  // [B,L] global ids fix B; [L] ids do not.
  write_npy(dir.path("gb.npy"), NpyArray::from_bools({0, 0, 0, 0, 0, 1}, {2, 3}));
  const test::CliResult batch =
      run_cli("mask causal global:" + dir.path("gb.npy") + " --lq 3 --lk 3 --batch 1");
  ASSERT_EQ(batch.exit_code, 0) << batch.err;
  EXPECT_TRUE(contains(batch.out, "batch 1 of B=2")) << batch.out;
  EXPECT_TRUE(contains(batch.out, "0  █ · █   2\n1  █ █ █   3\n2  █ █ █   3\n")) << batch.out;
  EXPECT_EQ(
      run_cli("mask causal global:" + dir.path("gb.npy") + " --lq 3 --lk 3 --batch 2").exit_code,
      1);
  write_npy(dir.path("g3.npy"), NpyArray::from_bools({0, 0, 1}, {3}));
  const test::CliResult any_batch =
      run_cli("mask causal global:" + dir.path("g3.npy") + " --lq 3 --lk 3 --batch 4");
  ASSERT_EQ(any_batch.exit_code, 0) << any_batch.err;
  EXPECT_TRUE(contains(any_batch.out, "0  █ · █   2\n")) << any_batch.out;
}

// maskattn layout writes exactly what sparse_layouts.h builds, as uint8, and draws it.
// A draft tree after a prefix of 3 (docs/cli.md's tree: SPEC), drawn with its note; audited
// against the same pairs as a dense keep file (no leak, no blind spot) and against causal (the
// tree hides the other branches: blind spots, never a leak); attend runs it.
TEST(CliMask, DrawsAndAuditsADraftTree) {
  const test::CliResult drawn = run_cli("mask tree:-1,0,0,1,2,-1 --lq 6 --lk 9");
  ASSERT_EQ(drawn.exit_code, 0) << drawn.err;
  EXPECT_TRUE(contains(drawn.out,
                       "0  █ █ █ █ · · · · ·   4\n"
                       "1  █ █ █ █ █ · · · ·   5\n"
                       "2  █ █ █ █ · █ · · ·   5\n"
                       "3  █ █ █ █ █ · █ · ·   6\n"
                       "4  █ █ █ █ · █ · █ ·   6\n"
                       "5  █ █ █ · · · · · █   4\n"))
      << drawn.out;
  EXPECT_TRUE(contains(drawn.out,
                       "tree:-1,0,0,1,2,-1: the last 6 keys and queries are draft tokens 0-5 with "
                       "parents -1 0 0 1 2 -1 (depths 0 1 1 2 2 0)"))
      << drawn.out;
  test::TempDir dir;
  const Array<uint8_t> pairs = allowed_pairs(Mask().tree({-1, 0, 0, 1, 2, -1}), {1, 1, 6, 9});
  write_npy(dir.path("keep.npy"), NpyArray(NpyType::b1, {6, 9}, pairs.values()));
  const test::CliResult same = run_cli(
      "audit --mask tree:-1,0,0,1,2,-1 --lq 6 --lk 9 --expect keep:" + dir.path("keep.npy"));
  EXPECT_EQ(same.exit_code, 0) << same.out << same.err;
  EXPECT_TRUE(contains(same.out, "audit: passed")) << same.out;
  const test::CliResult causal =
      run_cli("audit --mask tree:-1,0,0,1,2,-1 --lq 6 --lk 9 --expect causal");
  EXPECT_TRUE(contains(causal.out, "leaks (allowed, but expected hidden):                0"))
      << causal.out;
  write_npy(dir.path("q.npy"), NpyArray::from_floats(test::random_values(6 * 4, 3), {6, 4}));
  write_npy(dir.path("k.npy"), NpyArray::from_floats(test::random_values(9 * 4, 4), {9, 4}));
  const test::CliResult attend =
      run_cli("attend --q " + dir.path("q.npy") + " --k " + dir.path("k.npy") + " --v " +
              dir.path("k.npy") + " --out " + dir.path("o.npy") + " --mask tree:-1,0,0,1,2,-1");
  EXPECT_EQ(attend.exit_code, 0) << attend.err;
}

TEST(CliLayout, WritesWhatTheBuildersBuild) {
  test::TempDir dir;
  const auto written = [&](const std::string& arguments, const Array<uint8_t>& expected) {
    const std::string path = dir.path("layout.npy");
    const test::CliResult result = run_cli("layout " + arguments + " --out " + path);
    EXPECT_EQ(result.exit_code, 0) << arguments << ": " << result.err;
    const NpyArray file = read_npy(path);
    EXPECT_EQ(file.type(), NpyType::u1) << arguments;
    EXPECT_EQ(file.shape(), expected.shape()) << arguments;
    EXPECT_EQ(file.bytes(), expected.values()) << arguments;
    EXPECT_TRUE(contains(result.out, "wrote " + path + ": uint8 " + shape_string(expected.shape()) +
                                         ", 1 = query block r may attend key block c"))
        << result.out;
    return result.out;
  };
  BigBirdLayout bigbird;
  const std::string out = written("bigbird --blocks 9", bigbird_layout(9, bigbird));
  EXPECT_TRUE(contains(out, "(bigbird --blocks 9 --sliding 3 --global 2 --random 3 --seed 0)"));
  int64_t allowed = 0;
  const Array<uint8_t> nine = bigbird_layout(9, bigbird);
  for (uint8_t value : nine.values()) allowed += value;
  EXPECT_TRUE(contains(out, std::to_string(allowed) + " of 81 blocks allowed")) << out;
  EXPECT_TRUE(contains(out, "   0 1 2 3 4 5 6 7 8   key blocks\n0  █ █ █ █ █ █ █ █ █   9\n"))
      << out;
  bigbird = {5, 2, 1, 7};
  written("bigbird --blocks 12 --sliding 5 --global 2 --random 1 --seed 7 --heads 3",
          bigbird_layout(12, bigbird, 3));
  bigbird = {1, 0, 2, 0};
  written("bigbird --blocks 6 --sliding 1 --global 0 --random 2", bigbird_layout(6, bigbird));
  written("strided --blocks 8 --local 2 --stride 3", strided_layout(8, 2, 3));
  written("strided --blocks 8 --local 2 --stride 3 --bidirectional",
          strided_layout(8, 2, 3, false));
  written("fixed --blocks 8 --chunk 4 --summary 1", fixed_layout(8, 4, 1));
  const std::string fixed =
      written("fixed --blocks 8 --chunk 4 --summary 2 --bidirectional --heads 2",
              fixed_layout(8, 4, 2, false, 2));
  EXPECT_TRUE(contains(fixed, "head 1: 48 of 64 blocks allowed (75.0%)")) << fixed;
  EXPECT_TRUE(contains(run_cli("--help").out, "write a block-sparse layout .npy"));
  // Large layouts are written, not drawn.
  const std::string large =
      written("strided --blocks 65 --local 1 --stride 8", strided_layout(65, 1, 8));
  EXPECT_FALSE(contains(large, "key blocks\n"));
}

// semantics.md §14's decode note: a KV-cache step of T = 2 queries at positions 6 and 7 over the
// 8 cached keys, given the layout rows (6 + t) / 2 with block_q = 1, the key columns ⌈8/2⌉ so far
// and the two-array global flags, allows exactly the full forward's rows 6 and 7 (causal, so no
// row looks past the cache; the global key 0 is in the past).
TEST(CliMask, ADecodeStepGetsTheFullForwardsRows) {
  test::TempDir dir;
  const Array<uint8_t> layout = bigbird_layout(8, {3, 2, 1, 0});  // 16 tokens in blocks of 2
  std::vector<int64_t> global(16, 0);
  global[0] = 1;
  const Mask full =
      Mask().causal().global_tokens(Array<int64_t>({16}, global)).block_sparse(layout, 2, 2);
  const Array<uint8_t> pairs = allowed_pairs(full, {1, 1, 16, 16});
  std::vector<uint8_t> rows;
  for (int64_t position : {6, 7}) {
    for (int64_t c = 0; c < 4; ++c) rows.push_back(layout.values()[(position / 2) * 8 + c]);
  }
  write_npy(dir.path("rows.npy"), NpyArray::from_bools(rows, {2, 4}));
  write_npy(dir.path("q.npy"), NpyArray::from_int64({0, 0}, {2}));
  write_npy(dir.path("k.npy"), NpyArray::from_int64({1, 0, 0, 0, 0, 0, 0, 0}, {8}));
  const test::CliResult step =
      run_cli("mask causal global:" + dir.path("q.npy") + ":" + dir.path("k.npy") +
              " block-sparse:1:2:" + dir.path("rows.npy") + " --lq 2 --lk 8");
  ASSERT_EQ(step.exit_code, 0) << step.err;
  for (int64_t t = 0; t < 2; ++t) {
    std::string row = std::to_string(t) + "  ";
    for (int64_t j = 0; j < 8; ++j) row += pairs.values()[(6 + t) * 16 + j] ? "█ " : "· ";
    EXPECT_TRUE(contains(step.out, row)) << row << "\n" << step.out;
  }
  EXPECT_TRUE(contains(step.out, "layout [2,4] of blocks of 1 query × 2 keys")) << step.out;
}

// A layout from the command feeds block-sparse: and the mask is the one the library builds.
TEST(CliLayout, FeedsTheBlockSparseSpec) {
  test::TempDir dir;
  const std::string path = dir.path("bigbird.npy");
  ASSERT_EQ(run_cli("layout bigbird --blocks 6 --random 1 --seed 3 --out " + path).exit_code, 0);
  const test::CliResult drawn =
      run_cli("mask block-sparse:2:2:" + path + " causal --lq 12 --lk 12");
  ASSERT_EQ(drawn.exit_code, 0) << drawn.err;
  const Mask expected = Mask().block_sparse(bigbird_layout(6, {3, 2, 1, 3}), 2, 2).causal();
  const Array<uint8_t> pairs = allowed_pairs(expected, {1, 1, 12, 12});
  for (int64_t i = 0; i < 12; ++i) {
    std::string row(i < 10 ? 1 : 0, ' ');
    row += std::to_string(i);
    row += "  ";
    for (int64_t j = 0; j < 12; ++j) row += pairs.values()[i * 12 + j] ? "█ " : "· ";
    EXPECT_TRUE(contains(drawn.out, row)) << row << "\n" << drawn.out;
  }
}

// docs/semantics.md §14's correspondences, against Hugging Face's own outputs (saved by
// tests/data/make_hf_sparse.py): Longformer is window(w/2, w/2) & global tokens & padding, its
// global rows computed from the *_global projections; BigBird in eval mode is its layout without
// random blocks plus ln(1 + r) on key block 0 in the rows that have random slots.
TEST(CliSparse, MatchesHuggingFaceLongformerAndBigBird) {
  const auto data = [](const std::string& name) {
    return std::string(MASKATTN_SOURCE_DIR) + "/tests/data/hf_sparse/" + name + ".npy";
  };
  const auto max_difference = [](const std::vector<float>& a, const std::vector<float>& b) {
    float largest = a.size() == b.size() ? 0.0f : INFINITY;
    for (size_t n = 0; n < a.size() && n < b.size(); ++n) {
      largest = std::max(largest, std::fabs(a[n] - b[n]));
    }
    return largest;
  };
  test::TempDir dir;
  // maskattn attend on saved projections: `model` + "query" / "key" / "value" + `suffix`.
  const auto attend = [&](const std::string& model, const std::string& masks,
                          const std::string& suffix = "") {
    const test::CliResult result = run_cli(
        "attend --q " + data(model + "query" + suffix) + " --k " + data(model + "key" + suffix) +
        " --v " + data(model + "value" + suffix) + " --out " + dir.path("o.npy") + " " + masks);
    EXPECT_EQ(result.exit_code, 0) << result.err;
    return read_npy(dir.path("o.npy")).to_float32("o");
  };

  const std::string padding = data("longformer_attention_mask");
  const std::string longformer = "--mask window:2:2 --mask global:" + data("longformer_global") +
                                 " --mask key-keep:" + padding + " --mask query-keep:" + padding;
  const std::vector<float> local = attend("longformer_", longformer);
  const std::vector<float> global = attend("longformer_", longformer, "_global");
  // The global tokens' rows (0 and 6, 8 features each) from the global projections.
  std::vector<float> ours = local;
  const std::vector<int64_t> is_global = read_npy(data("longformer_global")).to_int64("global");
  for (size_t i = 0; i < is_global.size(); ++i) {
    if (is_global[i] != 0) std::copy_n(global.begin() + i * 8, 8, ours.begin() + i * 8);
  }
  const std::vector<float> hf_longformer = read_npy(data("longformer_out")).to_float32("hf");
  EXPECT_LE(max_difference(ours, hf_longformer), 2e-7f);
  EXPECT_GT(max_difference(local, hf_longformer), 1e-2f);  // HF's global rows are its own
  EXPECT_GT(max_difference(attend("longformer_", "--mask window:2:2 --mask key-keep:" + padding),
                           hf_longformer),
            1e-2f);  // and the global tokens matter

  // BigBird: 16 blocks of 4, r = 2.
  const std::string layout = dir.path("bigbird.npy");
  ASSERT_EQ(run_cli("layout bigbird --blocks 16 --random 0 --out " + layout).exit_code, 0);
  std::vector<float> bias(64 * 64, 0.0f);
  for (int64_t i = 4; i < 60; ++i) {
    for (int64_t j = 0; j < 4; ++j) bias[i * 64 + j] = std::log(3.0f);
  }
  write_npy(dir.path("bias.npy"), NpyArray::from_floats(bias, {64, 64}));
  const std::vector<float> hf_bigbird = read_npy(data("bigbird_out")).to_float32("hf");
  const std::vector<float> bigbird = attend(
      "bigbird_", "--mask block-sparse:4:4:" + layout + " --mask bias:" + dir.path("bias.npy"));
  EXPECT_LE(max_difference(bigbird, hf_bigbird), 5e-7f);
  EXPECT_GT(max_difference(attend("bigbird_", "--mask block-sparse:4:4:" + layout), hf_bigbird),
            1e-2f);
}

}  // namespace
}  // namespace maskattn
