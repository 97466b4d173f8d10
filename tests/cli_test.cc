// The maskattn command line, run as a separate process: outputs equal the library's, files keep
// their layout and dtype, the text commands print what they promise.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "maskattn/multihead.h"
#include "maskattn/sparse_layouts.h"
#include "test_util.h"

namespace maskattn {
namespace {

using test::run_cli;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CliExample, PrintsThePublishedWeightsAndOutput) {
  const test::CliResult result = run_cli("example");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::string& out = result.out;
  EXPECT_TRUE(contains(out,
                       "  [[1.000, 0.000, 0.000],\n"
                       "   [0.269, 0.731, 0.000],\n"
                       "   [0.274, 0.274, 0.452]]"))
      << out;
  EXPECT_TRUE(contains(out,
                       "  [[1.000, 0.000, 1.000, 0.000],\n"
                       "   [0.269, 0.731, 0.269, 0.731],\n"
                       "   [0.726, 0.726, 0.274, 0.274]]"))
      << out;
  EXPECT_TRUE(contains(out, "  [[1.000, 0.000, 0.500],\n"));  // Q·Kᵀ/√d
  EXPECT_TRUE(contains(out, "  [[   0, -inf, -inf],\n"));     // the mask
  EXPECT_TRUE(contains(out, "  [[1.000,  -inf,  -inf],\n"));  // masked scores
  EXPECT_TRUE(result.err.empty());
  // Named for what it is, not for where it first appeared.
  EXPECT_TRUE(contains(out, "step by step: the 'I love dog' worked example.\n")) << out;
  EXPECT_FALSE(contains(out, "seed")) << out;
  EXPECT_TRUE(contains(run_cli("--help").out, "the 'I love dog' worked example, step by step"));
}

TEST(CliMask, DrawsTheGridWithIndicesAndCounts) {
  const test::CliResult result = run_cli("mask causal --lq 3 --lk 5");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(contains(result.out,
                       "   0 1 2 3 4   keys\n"
                       "0  █ █ █ · ·   3\n"
                       "1  █ █ █ █ ·   4\n"
                       "2  █ █ █ █ █   5\n"))
      << result.out;
  EXPECT_TRUE(contains(result.out, "bottom-right aligned"));
}

TEST(CliMask, TopLeftBatchAndHeadSelection) {
  test::TempDir dir;
  write_npy(dir.path("len.npy"), NpyArray::from_int64({3, 2}, {2}));
  write_npy(dir.path("keep.npy"), NpyArray::from_bools({1, 1, 1, 0, 1, 1}, {1, 2, 1, 3}));
  const test::CliResult result =
      run_cli("mask causal:top-left key-lengths:" + dir.path("len.npy") +
              " keep:" + dir.path("keep.npy") + " --lq 3 --lk 3 --batch 1 --head 1");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "batch 1 of B=2, head 1 of Hq=2"));
  EXPECT_TRUE(contains(result.out, "0  · · ·   0\n1  · █ ·   1\n2  · █ ·   1\n")) << result.out;
}

TEST(CliMask, WideGridsGetATensRow) {
  const test::CliResult result = run_cli("mask sliding-window:2 --lq 12 --lk 12");
  ASSERT_EQ(result.exit_code, 0);
  EXPECT_TRUE(contains(result.out, "                      1 1 \n")) << result.out;
  EXPECT_TRUE(contains(result.out, "11  · · · · · · · · · · █ █   2\n")) << result.out;
}

TEST(CliDemo, EverySequenceMatchesItsUnpaddedRun) {
  test::TempDir dir;
  const test::CliResult result = run_cli("demo --heatmaps " + dir.path("maps"));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  for (const char* file : {"mask-sequence-1.svg", "weights-sequence-1.png", "weights-batch.png"}) {
    EXPECT_TRUE(std::filesystem::exists(dir.path("maps/") + file)) << file;
  }
  size_t equal = 0;
  for (size_t at = 0; (at = result.out.find("(bitwise equal)", at)) != std::string::npos; ++at) {
    ++equal;
  }
  EXPECT_EQ(equal, 3u) << result.out;
  EXPECT_TRUE(contains(result.out, "[[1.000, 0.000, 0.000],"));  // the worked example came first
  EXPECT_TRUE(contains(result.out, "<pad>"));
  EXPECT_TRUE(contains(result.out, "Padding changed nothing"));
  // Part 3: the layer over both pad sides, and generation through the KV cache.
  EXPECT_TRUE(contains(result.out, "<pad> <pad> <bos> hello <eos>")) << result.out;
  EXPECT_TRUE(contains(result.out, "right- vs left-padded batch: max |diff| = 0")) << result.out;
  EXPECT_TRUE(contains(result.out, "step 3 (generated:")) << result.out;
  EXPECT_TRUE(contains(result.out, "each prompt generated alone: the same tokens")) << result.out;
  EXPECT_TRUE(contains(result.out, "KV-cache decoding matches the full forward")) << result.out;
}

TEST(CliHelp, ListsCommandsAndSpecs) {
  const test::CliResult help = run_cli("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_TRUE(contains(help.out, "attend"));
  const test::CliResult attend_help = run_cli("attend --help");
  EXPECT_EQ(attend_help.exit_code, 0);
  EXPECT_TRUE(contains(attend_help.out, "sliding-window:W"));
}

// attend: run the CLI on files and the library on the same arrays; the outputs must be identical.
class CliAttend : public ::testing::Test {
 protected:
  static constexpr int64_t B = 2, H = 3, L = 5, D = 4;
  void SetUp() override {
    q_ = test::random_values(B * H * L * D, 1);
    k_ = test::random_values(B * H * L * D, 2);
    v_ = test::random_values(B * H * L * D, 3);
    write_npy(path("q.npy"), NpyArray::from_floats(q_, {B, H, L, D}));
    write_npy(path("k.npy"), NpyArray::from_floats(k_, {B, H, L, D}));
    write_npy(path("v.npy"), NpyArray::from_floats(v_, {B, H, L, D}));
    write_npy(path("len.npy"), NpyArray::from_int64({5, 3}, {B}));
  }
  std::string path(const std::string& name) const { return dir_.path(name); }
  std::string files() const {
    return "attend --q " + path("q.npy") + " --k " + path("k.npy") + " --v " + path("v.npy") +
           " --out " + path("out.npy");
  }
  std::vector<float> library(const Mask& mask, DType dtype = DType::f32) const {
    std::vector<float> out(q_.size());
    if (dtype == DType::f32) {
      attention(TensorView(q_.data(), {B, H, L, D}), TensorView(k_.data(), {B, H, L, D}),
                TensorView(v_.data(), {B, H, L, D}), MutableTensorView(out.data(), {B, H, L, D}),
                mask);
      return out;
    }
    const auto narrow = [&](const std::vector<float>& x) {
      std::vector<bfloat16> y(x.size());
      for (size_t n = 0; n < x.size(); ++n) y[n] = bfloat16_from_float(x[n]);
      return y;
    };
    const auto q = narrow(q_), k = narrow(k_), v = narrow(v_);
    std::vector<bfloat16> o(q.size());
    attention(TensorView(q.data(), {B, H, L, D}), TensorView(k.data(), {B, H, L, D}),
              TensorView(v.data(), {B, H, L, D}), MutableTensorView(o.data(), {B, H, L, D}), mask);
    for (size_t n = 0; n < o.size(); ++n) out[n] = to_float(o[n]);
    return out;
  }
  test::TempDir dir_;
  std::vector<float> q_, k_, v_;
};

TEST_F(CliAttend, OutputEqualsTheLibraryWithMasksLseAndWeights) {
  const test::CliResult result =
      run_cli(files() + " --mask causal --mask key-lengths:" + path("len.npy") + " --lse " +
              path("lse.npy") + " --weights " + path("p.npy") + " --threads 2");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const NpyArray out = read_npy(path("out.npy"));
  EXPECT_EQ(out.shape(), (Dims{B, H, L, D}));
  EXPECT_EQ(out.to_float32("out"), library(Mask().causal().key_lengths({5, 3})));
  const NpyArray lse = read_npy(path("lse.npy"));
  EXPECT_EQ(lse.shape(), (Dims{B, H, L}));
  EXPECT_EQ(lse.type(), NpyType::f4);
  const NpyArray weights = read_npy(path("p.npy"));
  EXPECT_EQ(weights.shape(), (Dims{B, H, L, L}));
  const std::vector<float> p = weights.to_float32("p");
  EXPECT_EQ(p[1], 0.0f);  // a future key
  EXPECT_NEAR(p[0], 1.0f, 1e-7);
  for (const auto& entry : std::filesystem::directory_iterator(dir_.root())) {
    EXPECT_EQ(entry.path().string().find(".tmp-"), std::string::npos) << entry.path();
  }
}

// --dropout P --seed S: the library's Options::dropout, so the same seed gives the same bits
// (and --weights the dropped weights); another seed drops other pairs.
TEST_F(CliAttend, DropoutIsTheLibrarysForTheSeed) {
  const std::string dropout = " --mask causal --dropout 0.5 --weights " + path("p.npy");
  ASSERT_EQ(run_cli(files() + dropout + " --seed 7").exit_code, 0);
  const std::vector<float> seven = read_npy(path("out.npy")).to_float32("out");
  const std::vector<float> weights = read_npy(path("p.npy")).to_float32("p");
  std::vector<float> out(q_.size()), expected_weights(B * H * L * L);
  Options options;
  options.dropout = Dropout{0.5, 7, 0};
  attention(TensorView(q_.data(), {B, H, L, D}), TensorView(k_.data(), {B, H, L, D}),
            TensorView(v_.data(), {B, H, L, D}), MutableTensorView(out.data(), {B, H, L, D}),
            Mask().causal(), {}, options);
  attention_weights(TensorView(q_.data(), {B, H, L, D}), TensorView(k_.data(), {B, H, L, D}),
                    MutableTensorView(expected_weights.data(), {B, H, L, L}), Mask().causal(), {},
                    options);
  EXPECT_EQ(seven, out);
  EXPECT_EQ(weights, expected_weights);
  EXPECT_NE(seven, library(Mask().causal()));
  ASSERT_EQ(run_cli(files() + dropout + " --seed 8").exit_code, 0);
  EXPECT_NE(read_npy(path("out.npy")).to_float32("out"), seven);
  const test::CliResult grad = run_cli("gradcheck --mask causal --lk 70 --dropout 0.3");
  EXPECT_EQ(grad.exit_code, 0) << grad.out << grad.err;
  EXPECT_NE(grad.out.find("dropout 0.3"), std::string::npos) << grad.out;
}

TEST_F(CliAttend, OneHeadInputsReadThreeDimensionalMasksAsBatchMajor) {
  // [B,L,D] inputs: a [B,Lq,Lk] keep file applies per sequence (it becomes [B,1,Lq,Lk]).
  write_npy(path("q3.npy"), NpyArray::from_floats(
                                std::vector<float>(q_.begin(), q_.begin() + 2 * L * D), {2, L, D}));
  std::vector<uint8_t> keep(2 * L * L, 1);
  for (int64_t j = 1; j < L; ++j) keep[L * L + j] = 0;  // sequence 1, query 0 sees key 0 only
  write_npy(path("keep.npy"), NpyArray::from_bools(keep, {2, L, L}));
  const std::string q3 = path("q3.npy");
  const test::CliResult result =
      run_cli("attend --q " + q3 + " --k " + q3 + " --v " + q3 + " --out " + path("o.npy") +
              " --weights " + path("p.npy") + " --mask keep:" + path("keep.npy"));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::vector<float> p = read_npy(path("p.npy")).to_float32("p");
  EXPECT_EQ(p[L * L], 1.0f);  // sequence 1, query 0, key 0
  EXPECT_LT(p[0], 1.0f);      // sequence 0 is unmasked
}

TEST_F(CliAttend, GlobalTokensAndBlockSparseLayoutsEqualTheLibrary) {
  // Per-sequence global tokens, a layout per head (blocks of 2: ⌈5/2⌉ = 3 a side), and causal.
  const std::vector<int64_t> global = {0, 0, 1, 0, 0, 1, 0, 0, 0, 0};
  write_npy(path("g.npy"), NpyArray::from_int64(global, {B, L}));
  std::vector<uint8_t> layout(H * 3 * 3, 1);
  layout[0 * 9 + 2 * 3 + 0] = 0;  // head 0: the last query block does not see the first keys
  layout[1 * 9 + 1 * 3 + 1] = 0;  // head 1: block (1, 1) hidden
  layout[2 * 9 + 0 * 3 + 2] = 0;  // head 2: block (0, 2), a look-ahead block of global key 5
  write_npy(path("l.npy"), NpyArray::from_bools(layout, {H, 3, 3}));
  const Mask mask = Mask()
                        .causal()
                        .global_tokens(Array<int64_t>({B, L}, global))
                        .block_sparse(Array<uint8_t>({H, 3, 3}, layout), 2, 2);
  for (const char* kernel : {"fused", "reference"}) {
    const test::CliResult result =
        run_cli(files() + " --mask causal --mask global:" + path("g.npy") +
                " --mask block-sparse:2:2:" + path("l.npy") + " --kernel " + kernel);
    ASSERT_EQ(result.exit_code, 0) << result.err;
    std::vector<float> expected(q_.size());
    Options options;
    options.kernel = std::string(kernel) == "fused" ? Kernel::fused : Kernel::reference;
    attention(TensorView(q_.data(), {B, H, L, D}), TensorView(k_.data(), {B, H, L, D}),
              TensorView(v_.data(), {B, H, L, D}), MutableTensorView(expected.data(), {B, H, L, D}),
              mask, {}, options);
    EXPECT_EQ(read_npy(path("out.npy")).to_float32("out"), expected) << kernel;
  }
  // The global tokens change the output (sequence 1, query 0 sees the later global key 2).
  EXPECT_NE(read_npy(path("out.npy")).to_float32("out"),
            library(Mask().causal().block_sparse(Array<uint8_t>({H, 3, 3}, layout), 2, 2)));
  // A layout that does not cover the lengths is an error naming the spec and the files.
  write_npy(path("l2.npy"), NpyArray::from_bools(std::vector<uint8_t>(4, 1), {2, 2}));
  const test::CliResult short_layout =
      run_cli(files() + " --mask block-sparse:2:2:" + path("l2.npy"));
  EXPECT_EQ(short_layout.exit_code, 1);
  EXPECT_TRUE(contains(short_layout.err, "--mask block-sparse:2:2:" + path("l2.npy") +
                                             ": layout [2,2] has 2 query blocks of 2, but Lq=5 "
                                             "needs ⌈5/2⌉ = 3"))
      << short_layout.err;
}

TEST_F(CliAttend, RankTwoAndThreeInputsKeepTheirLayout) {
  write_npy(path("q2.npy"),
            NpyArray::from_floats(std::vector<float>(q_.begin(), q_.begin() + L * D), {L, D}));
  const test::CliResult two =
      run_cli("attend --q " + path("q2.npy") + " --k " + path("q2.npy") + " --v " + path("q2.npy") +
              " --out " + path("o2.npy") + " --mask causal");
  ASSERT_EQ(two.exit_code, 0) << two.err;
  EXPECT_EQ(read_npy(path("o2.npy")).shape(), (Dims{L, D}));
  write_npy(path("q3.npy"), NpyArray::from_floats(q_, {B * H, L, D}));
  const test::CliResult three =
      run_cli("attend --q " + path("q3.npy") + " --k " + path("q3.npy") + " --v " + path("q3.npy") +
              " --out " + path("o3.npy") + " --lse " + path("l3.npy"));
  ASSERT_EQ(three.exit_code, 0) << three.err;
  EXPECT_EQ(read_npy(path("o3.npy")).shape(), (Dims{B * H, L, D}));
  EXPECT_EQ(read_npy(path("l3.npy")).shape(), (Dims{B * H, 1, L}));
}

TEST_F(CliAttend, Bf16ComputesInBf16AndWritesF32) {
  const test::CliResult result = run_cli(files() + " --mask causal --dtype bf16");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const NpyArray out = read_npy(path("out.npy"));
  EXPECT_EQ(out.type(), NpyType::f4);
  EXPECT_EQ(out.to_float32("out"), library(Mask().causal(), DType::bf16));
}

TEST_F(CliAttend, F16FilesGiveAnF16Output) {
  std::vector<float16> half(q_.size());
  for (size_t n = 0; n < q_.size(); ++n) half[n] = float16_from_float(q_[n]);
  write_npy(path("h.npy"), NpyArray::from_float16(half, {B, H, L, D}));
  const std::string h = path("h.npy");
  const test::CliResult result =
      run_cli("attend --q " + h + " --k " + h + " --v " + h + " --out " + path("o.npy"));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const NpyArray out = read_npy(path("o.npy"));
  EXPECT_EQ(out.type(), NpyType::f2);
  std::vector<float16> expected(half.size());
  attention(TensorView(half.data(), {B, H, L, D}), TensorView(half.data(), {B, H, L, D}),
            TensorView(half.data(), {B, H, L, D}),
            MutableTensorView(expected.data(), {B, H, L, D}));
  const std::vector<float16> got = out.to_float16("o");
  for (size_t n = 0; n < got.size(); ++n) ASSERT_EQ(got[n].bits, expected[n].bits) << n;
  // --dtype f32 on f16 files: computed in f32, written back as f16.
  const test::CliResult widened = run_cli("attend --q " + h + " --k " + h + " --v " + h +
                                          " --out " + path("w.npy") + " --dtype f32");
  ASSERT_EQ(widened.exit_code, 0) << widened.err;
  EXPECT_EQ(read_npy(path("w.npy")).type(), NpyType::f2);
}

TEST_F(CliAttend, ScaleAndKernelFlags) {
  const test::CliResult result =
      run_cli(files() + " --scale 0.125 --kernel reference --mask window:1:1 --mask softcap:5");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::vector<float> out(q_.size());
  Options options;
  options.scale = 0.125;
  options.kernel = Kernel::reference;
  ScoreMods mods;
  mods.softcap = 5.0;
  attention(TensorView(q_.data(), {B, H, L, D}), TensorView(k_.data(), {B, H, L, D}),
            TensorView(v_.data(), {B, H, L, D}), MutableTensorView(out.data(), {B, H, L, D}),
            Mask().window(1, 1), mods, options);
  EXPECT_EQ(read_npy(path("out.npy")).to_float32("out"), out);
}

TEST_F(CliAttend, RepeatPrintsOneTimingLineAndTheFusedKernelMatchesTheLibrary) {
  const test::CliResult result =
      run_cli(files() + " --mask causal --kernel fused --repeat 3 --threads 2");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  // "time_ms median=X min=Y max=Z" with three decimals, and nothing else.
  double median = 0, low = 0, high = 0;
  char tail = 0;
  ASSERT_EQ(std::sscanf(result.err.c_str(), "time_ms median=%lf min=%lf max=%lf%c", &median, &low,
                        &high, &tail),
            4)
      << result.err;
  EXPECT_EQ(tail, '\n');
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1);
  EXPECT_LE(low, median);
  EXPECT_LE(median, high);
  std::vector<float> expected(q_.size());
  Options options;
  options.kernel = Kernel::fused;
  attention(TensorView(q_.data(), {B, H, L, D}), TensorView(k_.data(), {B, H, L, D}),
            TensorView(v_.data(), {B, H, L, D}), MutableTensorView(expected.data(), {B, H, L, D}),
            Mask().causal(), {}, options);
  EXPECT_EQ(read_npy(path("out.npy")).to_float32("out"), expected);
}

TEST_F(CliAttend, InvalidInputWritesNothing) {
  const test::CliResult result =
      run_cli(files() + " --lse " + path("lse.npy") + " --mask key-lengths:" + path("q.npy"));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_FALSE(std::filesystem::exists(path("out.npy")));
  EXPECT_FALSE(std::filesystem::exists(path("lse.npy")));
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1);
  // A failure on the second output leaves neither the first nor any temporary behind.
  const test::CliResult unwritable = run_cli(files() + " --lse /nonexistent/dir/lse.npy");
  EXPECT_EQ(unwritable.exit_code, 1);
  EXPECT_FALSE(std::filesystem::exists(path("out.npy")));
  for (const auto& entry : std::filesystem::directory_iterator(dir_.root())) {
    EXPECT_EQ(entry.path().string().find(".tmp-"), std::string::npos) << entry.path();
  }
}

// Inputs are memory-mapped and used in place when they can be; the files they cannot be (Fortran
// order, data not aligned to its element size) are converted and give the same bits.
TEST_F(CliAttend, FortranOrderAndUnalignedInputsGiveTheSameOutput) {
  ASSERT_EQ(run_cli(files() + " --mask causal").exit_code, 0);
  const std::vector<uint8_t> expected = read_npy(path("out.npy")).bytes();
  // q as [B,H,L,D] in Fortran order: the first index varies fastest.
  std::vector<float> columns(q_.size());
  for (int64_t n = 0; n < B * H * L * D; ++n) {
    const int64_t b = n / (H * L * D), h = n / (L * D) % H, i = n / D % L, d = n % D;
    columns[((d * L + i) * H + h) * B + b] = q_[n];
  }
  const std::string fortran_header =
      "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3, 5, 4), }";
  // A short header, not padded: the data starts at a byte offset that is not a multiple of 4.
  const std::string unaligned_header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 5, 4), } \n";
  ASSERT_NE((10 + unaligned_header.size()) % 4, 0u);
  const auto write_with = [&](const std::string& name, std::string header,
                              const std::vector<float>& values) {
    if (header.back() != '\n') header += std::string(63 - (10 + header.size()) % 64, ' ') + "\n";
    std::ofstream file(path(name), std::ios::binary);
    file << "\x93NUMPY\x01" << '\0' << static_cast<char>(header.size()) << '\0' << header;
    file.write(reinterpret_cast<const char*>(values.data()),
               static_cast<std::streamsize>(values.size() * 4));
  };
  write_with("qf.npy", fortran_header, columns);
  write_with("qu.npy", unaligned_header, q_);
  for (const char* q : {"qf.npy", "qu.npy"}) {
    const test::CliResult result =
        run_cli("attend --q " + path(q) + " --k " + path("k.npy") + " --v " + path("v.npy") +
                " --out " + path("o2.npy") + " --mask causal");
    ASSERT_EQ(result.exit_code, 0) << q << ": " << result.err;
    EXPECT_EQ(read_npy(path("o2.npy")).bytes(), expected) << q;
  }
}

// The mapped reader gives the catalogue's errors (docs/errors.md), and the outputs, created
// before the computation, are removed again: no file and no temporary is left behind.
TEST_F(CliAttend, BadInputFilesAreCatalogueErrorsAndLeaveNothingBehind) {
  std::vector<uint8_t> image = serialize_npy(NpyArray::from_floats(k_, {B, H, L, D}));
  const auto write_image = [&](const std::string& name, const std::vector<uint8_t>& bytes) {
    std::ofstream file(path(name), std::ios::binary);
    file.write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  };
  write_image("short.npy", std::vector<uint8_t>(image.begin(), image.end() - 1));
  image.push_back(0);
  write_image("long.npy", image);
  write_npy(path("int.npy"),
            NpyArray::from_int64(std::vector<int64_t>(B * H * L * D), {B, H, L, D}));
  write_npy(path("k2.npy"), NpyArray::from_floats(std::vector<float>(H * L * D), {1, H, L, D}));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"short.npy",
       "short.npy: truncated data: shape [2,3,5,4] of float32 needs 480 bytes, file "
       "has 479"},
      {"long.npy", "long.npy: 1 trailing bytes after the data"},
      {"int.npy", "int.npy has dtype int64; attention inputs are float32 or float16"},
      {"k2.npy", "k batch 1 does not match q batch 2"},  // after the outputs were created
  };
  for (const auto& [k, message] : cases) {
    const test::CliResult result =
        run_cli("attend --q " + path("q.npy") + " --k " + path(k) + " --v " + path("v.npy") +
                " --out " + path("o.npy") + " --lse " + path("lse.npy"));
    EXPECT_EQ(result.exit_code, 1) << k;
    EXPECT_TRUE(contains(result.err, message)) << result.err;
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
    for (const auto& entry : std::filesystem::directory_iterator(dir_.root())) {
      const std::string name = entry.path().filename().string();
      EXPECT_TRUE(name != "o.npy" && name != "lse.npy" && !contains(name, ".tmp-")) << name;
    }
  }
}

// grad: the CLI's gradients equal the library's on the same arrays, in the inputs' layout.
TEST_F(CliAttend, GradWritesTheLibrarysGradients) {
  const std::vector<float> dout = test::random_values(B * H * L * D, 4);
  write_npy(path("do.npy"), NpyArray::from_floats(dout, {B, H, L, D}));
  const test::CliResult result = run_cli(
      "grad --q " + path("q.npy") + " --k " + path("k.npy") + " --v " + path("v.npy") + " --dout " +
      path("do.npy") + " --dq " + path("dq.npy") + " --dk " + path("dk.npy") + " --dv " +
      path("dv.npy") + " --mask causal --mask key-lengths:" + path("len.npy") + " --threads 2");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(result.out.empty());
  const Mask mask = Mask().causal().key_lengths({5, 3});
  const Dims shape = {B, H, L, D};
  std::vector<float> out(q_.size()), lse(B * H * L), dq(q_.size()), dk(q_.size()), dv(q_.size());
  attention(TensorView(q_.data(), shape), TensorView(k_.data(), shape),
            TensorView(v_.data(), shape), MutableTensorView(out.data(), shape), mask, {}, {},
            MutableTensorView(lse.data(), {B, H, L}));
  attention_backward(TensorView(q_.data(), shape), TensorView(k_.data(), shape),
                     TensorView(v_.data(), shape), TensorView(out.data(), shape),
                     TensorView(lse.data(), {B, H, L}), TensorView(dout.data(), shape),
                     {MutableTensorView(dq.data(), shape),
                      MutableTensorView(dk.data(), shape),
                      MutableTensorView(dv.data(), shape),
                      {},
                      {}},
                     mask);
  for (const auto& [file, expected] :
       {std::pair{"dq.npy", &dq}, {"dk.npy", &dk}, {"dv.npy", &dv}}) {
    const NpyArray array = read_npy(path(file));
    EXPECT_EQ(array.shape(), shape) << file;
    EXPECT_EQ(array.to_float32(file), *expected) << file;
  }
  // Keys 3 and 4 of sequence 1 are padding: no gradient reaches them.
  const std::vector<float> dk_file = read_npy(path("dk.npy")).to_float32("dk");
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t j = 3; j < L; ++j) {
      for (int64_t d = 0; d < D; ++d) EXPECT_EQ(dk_file[((H + h) * L + j) * D + d], 0.0f);
    }
  }
}

TEST(CliGradcheck, PrintsOneLinePerTensorAndFailsAboveTheTolerance) {
  const test::CliResult pass = run_cli(
      "gradcheck --mask causal --mask softcap:3 --lq 6 --lk 9 --d 3 --heads 2 --kv-heads 1");
  ASSERT_EQ(pass.exit_code, 0) << pass.err;
  EXPECT_TRUE(contains(pass.out, "q [1,2,6,3], k [1,1,9,3], v [1,1,9,4]")) << pass.out;
  for (const char* tensor : {"\ndq ", "\ndk ", "\ndv "}) EXPECT_TRUE(contains(pass.out, tensor));
  EXPECT_TRUE(contains(pass.out, "tolerance 1.0e-04: passed")) << pass.out;
  test::TempDir dir;
  write_npy(dir.path("sinks.npy"), NpyArray::from_floats({0.5f, -1.0f}, {2}));
  const test::CliResult sinks =
      run_cli("gradcheck --mask sinks:" + dir.path("sinks.npy") + " --kernel reference");
  ASSERT_EQ(sinks.exit_code, 0) << sinks.err << sinks.out;
  EXPECT_TRUE(contains(sinks.out, "\ndsinks ")) << sinks.out;
  const test::CliResult fail = run_cli("gradcheck --tolerance 1e-12");
  EXPECT_EQ(fail.exit_code, 1);
  EXPECT_TRUE(contains(fail.out, "FAILED"));
  EXPECT_TRUE(contains(fail.err, "maskattn: error: gradcheck failed: dq max relative error"))
      << fail.err;
}

// `maskattn mha` against nn.MultiheadAttention: tests/data/make_pytorch_mha.py saved PyTorch
// layers under their state_dict() names, with inputs and PyTorch's outputs.
class CliMha : public ::testing::Test {
 protected:
  static std::string data(const std::string& name) {
    return std::string(MASKATTN_SOURCE_DIR) + "/tests/data/pytorch_mha/" + name;
  }
  std::string path(const std::string& name) const { return dir_.path(name); }
  // Max |ours − PyTorch's| after running `arguments` with --out y.npy.
  float difference_to(const std::string& expected, const std::string& arguments) const {
    const test::CliResult result = run_cli("mha " + arguments + " --out " + path("y.npy"));
    EXPECT_EQ(result.exit_code, 0) << result.err;
    if (result.exit_code != 0) return INFINITY;
    const NpyArray ours = read_npy(path("y.npy"));
    const NpyArray theirs = read_npy(data(expected));
    EXPECT_EQ(ours.shape(), theirs.shape());
    return test::max_error(ours.to_float32("ours"), theirs.to_float32("PyTorch's"));
  }

  test::TempDir dir_;
};

TEST_F(CliMha, PortsPyTorchLayersUnchanged) {
  const std::string self = "--query " + data("x.npy") + " --heads 4 --weights " + data("packed");
  EXPECT_LE(difference_to("self_causal_padded.npy",
                          self + " --mask causal --mask key-blocked:" + data("key_padding.npy")),
            1e-6f);
  EXPECT_LE(difference_to("self_causal.npy", self + " --mask causal"), 1e-6f);
  EXPECT_LE(difference_to("cross.npy", self + " --key " + data("memory.npy") + " --value " +
                                           data("memory.npy") +
                                           " --mask key-blocked:" + data("memory_padding.npy")),
            1e-6f);
  // kdim/vdim ≠ E: q/k/v_proj_weight files, no biases.
  EXPECT_LE(
      difference_to("cross_separate.npy",
                    "--query " + data("x.npy") + " --key " + data("keys10.npy") + " --value " +
                        data("values12.npy") + " --heads 4 --weights " + data("separate")),
      1e-6f);
}

TEST_F(CliMha, IncrementalDecodingEqualsTheCausalForward) {
  const std::string self = "--query " + data("x.npy") + " --heads 4 --weights " + data("packed");
  EXPECT_LE(difference_to("self_causal.npy", self + " --incremental"), 1e-5f);
  EXPECT_LE(difference_to("self_causal.npy", self + " --incremental --kernel reference"), 1e-5f);
  // A bf16 cache and bf16 attention: within bf16's rounding of the f32 result.
  EXPECT_LE(difference_to("self_causal.npy", self + " --incremental --dtype bf16"), 5e-2f);

  // Left padding becomes the cache's starts: key-blocked (PyTorch polarity) or key-starts.
  write_npy(path("left.npy"), NpyArray::from_bools({1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {2, 6}));
  write_npy(path("starts.npy"), NpyArray::from_int64({2, 0}, {2}));
  const test::CliResult full =
      run_cli("mha " + self + " --mask causal --mask key-starts:" + path("starts.npy") + " --out " +
              path("full.npy"));
  ASSERT_EQ(full.exit_code, 0) << full.err;
  const std::vector<float> expected = read_npy(path("full.npy")).to_float32("full");
  for (const std::string& spec :
       {"key-blocked:" + path("left.npy"), "key-starts:" + path("starts.npy")}) {
    const test::CliResult incremental =
        run_cli("mha " + self + " --incremental --mask " + spec + " --out " + path("inc.npy"));
    ASSERT_EQ(incremental.exit_code, 0) << incremental.err;
    EXPECT_LE(test::max_error(read_npy(path("inc.npy")).to_float32("inc"), expected), 1e-6f)
        << spec;
  }
  // Query padding follows the steps too: each step's query is hidden or not by its own column.
  write_npy(path("query_lengths.npy"), NpyArray::from_int64({4, 2}, {2}));
  write_npy(path("ids.npy"), NpyArray::from_int64({0, 0, 5, 6, 7, 8, 0, 9, 9, 9, 9, 9}, {2, 6}));
  for (const auto& [full_masks, incremental_masks] :
       {std::pair{"--mask causal --mask query-lengths:" + path("query_lengths.npy") +
                      " --mask key-starts:" + path("starts.npy"),
                  "--mask query-lengths:" + path("query_lengths.npy") +
                      " --mask key-starts:" + path("starts.npy")},
        std::pair{
            "--mask causal --mask pad-id:0:" + path("ids.npy") +
                " --mask query-pad-id:0:" + path("ids.npy"),
            "--mask pad-id:0:" + path("ids.npy") + " --mask query-pad-id:0:" + path("ids.npy")}}) {
    ASSERT_EQ(run_cli("mha " + self + " " + full_masks + " --out " + path("full.npy")).exit_code,
              0);
    const test::CliResult result = run_cli("mha " + self + " --incremental " + incremental_masks +
                                           " --out " + path("inc.npy"));
    ASSERT_EQ(result.exit_code, 0) << result.err;
    EXPECT_LE(test::max_error(read_npy(path("inc.npy")).to_float32("inc"),
                              read_npy(path("full.npy")).to_float32("full")),
              1e-6f)
        << incremental_masks;
  }
  write_npy(path("holes.npy"), NpyArray::from_bools({0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {2, 6}));
  const test::CliResult holes =
      run_cli("mha " + self + " --incremental --mask key-blocked:" + path("holes.npy") + " --out " +
              path("inc.npy"));
  EXPECT_EQ(holes.exit_code, 1);
  EXPECT_TRUE(contains(holes.err,
                       "sequence 0 has padding at position 1 after a real token; "
                       "--incremental takes left padding only"))
      << holes.err;
}

TEST_F(CliMha, GroupedQueryAttentionAndBadArgumentsAreClearErrors) {
  // A GQA layer (kv_heads 2) saved by the library runs from the command line.
  const MultiHeadAttention layer = MultiHeadAttention::random(16, 4, 2, 7);
  layer.save(path("gqa"));
  const std::vector<float> x = read_npy(data("x.npy")).to_float32("x");
  std::vector<float> expected(x.size());
  layer.forward(TensorView(x.data(), {2, 6, 16}), TensorView(x.data(), {2, 6, 16}),
                TensorView(x.data(), {2, 6, 16}), MutableTensorView(expected.data(), {2, 6, 16}),
                Mask().causal());
  const test::CliResult gqa =
      run_cli("mha --query " + data("x.npy") + " --weights " + path("gqa") +
              " --heads 4 --kv-heads 2 --mask causal --out " + path("y.npy"));
  ASSERT_EQ(gqa.exit_code, 0) << gqa.err;
  EXPECT_EQ(read_npy(path("y.npy")).to_float32("y"), expected);

  const std::string base = "mha --query " + data("x.npy") + " --out " + path("bad.npy");
  const auto error_of = [&](const std::string& arguments) {
    const test::CliResult result = run_cli(base + " " + arguments);
    EXPECT_EQ(result.exit_code, 1) << arguments;
    EXPECT_FALSE(std::filesystem::exists(path("bad.npy"))) << arguments;
    return result.err;
  };
  EXPECT_TRUE(contains(error_of("--weights " + data("packed") + " --heads 3"),
                       "in_proj_weight.npy has shape [48,16]; with heads 3 and kv_heads 3"));
  EXPECT_TRUE(contains(error_of("--weights " + path("nowhere") + " --heads 4"),
                       "weights directory '" + path("nowhere") + "' does not exist"));
  EXPECT_TRUE(
      contains(error_of("--weights " + data("packed") + " --heads 4 --key " + data("memory.npy")),
               "--key and --value go together"));
  EXPECT_TRUE(contains(error_of("--weights " + data("separate") + " --heads 4"),
                       "key has shape [2,6,16] but the layer's k_weight [16,10] takes 10"));
  EXPECT_TRUE(contains(error_of("--weights " + data("packed") +
                                " --heads 4 --mask key-blocked:" + data("memory_padding.npy")),
                       "memory_padding.npy has shape [2,9]; expected [B,Lk] = [2,6]"));
  EXPECT_TRUE(contains(
      error_of("--weights " + data("packed") +
               " --heads 4 --incremental --mask key-blocked:" + data("memory_padding.npy")),
      "memory_padding.npy has shape [2,9]; expected [B,L] = [2,6]"));
}

}  // namespace
}  // namespace maskattn
