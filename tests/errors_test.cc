// The bad-input catalogue: one test per entry of docs/errors.md (test names start with the entry's
// id), and a check that every entry of the document has its test.
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "kernels/amx.h"
#include "maskattn/cpu.h"
#include "maskattn/gradcheck.h"
#include "maskattn/heatmap.h"
#include "maskattn/multihead.h"
#include "maskattn/tokens.h"
#include "test_util.h"

namespace maskattn {
namespace {

// A small valid problem to break one piece at a time.
struct Problem {
  std::vector<float> q = test::random_values(2 * 4 * 3 * 8, 1);
  std::vector<float> k = test::random_values(2 * 2 * 5 * 8, 2);
  std::vector<float> v = test::random_values(2 * 2 * 5 * 6, 3);
  std::vector<float> out = std::vector<float>(2 * 4 * 3 * 6);
  std::vector<float> lse = std::vector<float>(2 * 4 * 3);
  TensorView qv() const { return TensorView(q.data(), {2, 4, 3, 8}); }
  TensorView kv() const { return TensorView(k.data(), {2, 2, 5, 8}); }
  TensorView vv() const { return TensorView(v.data(), {2, 2, 5, 6}); }
  MutableTensorView outv() { return MutableTensorView(out.data(), {2, 4, 3, 6}); }
  void run(const Mask& mask = {}, const ScoreMods& mods = {}, const Options& options = {}) {
    attention(qv(), kv(), vv(), outv(), mask, mods, options);
  }
};

// A block-sparse layout of ones of the given shape.
Array<uint8_t> layout_of(Dims shape) {
  int64_t count = 1;
  for (const int64_t size : shape) count *= size;
  return Array<uint8_t>(std::move(shape), std::vector<uint8_t>(count, 1));
}

// CLI: the command must fail with one line on stderr containing `message`, and create no file.
void expect_cli_error(const std::string& arguments, const std::string& message,
                      const std::string& must_not_exist = "", int exit_code = 1) {
  const test::CliResult result = test::run_cli(arguments);
  EXPECT_EQ(result.exit_code, exit_code) << result.err;
  EXPECT_EQ(result.err.rfind("maskattn: error: ", 0), 0u) << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  EXPECT_NE(result.err.find(message), std::string::npos) << result.err << "\nmissing: " << message;
  if (!must_not_exist.empty()) {
    EXPECT_FALSE(std::filesystem::exists(must_not_exist));
  }
}

// Files for CLI cases: valid q/k/v [1,3,4] f32 plus whatever a case needs.
struct CliFiles {
  test::TempDir dir;
  CliFiles() {
    const auto values = test::random_values(12, 9);
    write("q.npy", NpyArray::from_floats(values, {1, 3, 4}));
  }
  std::string write(const std::string& name, const NpyArray& array) {
    write_npy(dir.path(name), array);
    return dir.path(name);
  }
  std::string attend(const std::string& extra, const std::string& q = "q.npy",
                     const std::string& k = "q.npy") const {
    return "attend --q " + dir.path(q) + " --k " + dir.path(k) + " --v " + dir.path("q.npy") +
           " --out " + dir.path("out.npy") + " " + extra;
  }
};

// ---- tensors and shapes -------------------------------------------------------------------

TEST(Errors, E01_InputNotRank4) {
  Problem p;
  EXPECT_MASKATTN_ERROR(attention(TensorView(p.q.data(), {24, 8}), p.kv(), p.vv(), p.outv()),
                        "q has shape [24,8]; expected [B,Hq,Lq,D]");
}

TEST(Errors, E02_NullView) {
  Problem p;
  EXPECT_MASKATTN_ERROR(attention(p.qv(), p.kv(), TensorView(), p.outv()),
                        "v is a null view; expected [B,Hkv,Lk,Dv]");
}

TEST(Errors, E03_NullDataPointer) {
  Problem p;
  EXPECT_MASKATTN_ERROR(attention(TensorView(static_cast<const float*>(nullptr), {2, 4, 3, 8}),
                                  p.kv(), p.vv(), p.outv()),
                        "q of shape [2,4,3,8] has a null data pointer");
}

TEST(Errors, E04_DtypeMismatch) {
  Problem p;
  std::vector<float16> k(p.k.size());
  EXPECT_MASKATTN_ERROR(attention(p.qv(), TensorView(k.data(), {2, 2, 5, 8}), p.vv(), p.outv()),
                        "k has dtype f16 but q has f32; q, k, v and out share one element type");
}

TEST(Errors, E05_BatchMismatch) {
  Problem p;
  EXPECT_MASKATTN_ERROR(attention(p.qv(), TensorView(p.k.data(), {1, 2, 10, 8}), p.vv(), p.outv()),
                        "k batch 1 does not match q batch 2 (q [2,4,3,8], k [1,2,10,8])");
}

TEST(Errors, E06_HeadDimMismatch) {
  Problem p;
  EXPECT_MASKATTN_ERROR(attention(p.qv(), TensorView(p.k.data(), {2, 2, 10, 4}), p.vv(), p.outv()),
                        "k head dim 4 does not match q head dim 8");
}

TEST(Errors, E07_HeadsNotMultiple) {
  Problem p;
  EXPECT_MASKATTN_ERROR(attention(p.qv(), TensorView(p.k.data(), {2, 3, 2, 8}), p.vv(), p.outv()),
                        "Hq=4 is not a multiple of Hkv=3 (q [2,4,3,8], k [2,3,2,8])");
}

TEST(Errors, E08_ValuesDoNotMatchKeys) {
  Problem p;
  EXPECT_MASKATTN_ERROR(attention(p.qv(), p.kv(), TensorView(p.v.data(), {2, 2, 6, 5}), p.outv()),
                        "v shape [2,2,6,5] does not match k shape [2,2,5,8] in [B,Hkv,Lk]");
}

TEST(Errors, E09_OutputShape) {
  Problem p;
  EXPECT_MASKATTN_ERROR(
      attention(p.qv(), p.kv(), p.vv(), MutableTensorView(p.out.data(), {2, 4, 6, 3})),
      "out has shape [2,4,6,3] but must be [2,4,3,6] (from q [2,4,3,8] and v [2,2,5,6])");
}

TEST(Errors, E10_OutputDtype) {
  Problem p;
  std::vector<bfloat16> out(p.out.size());
  EXPECT_MASKATTN_ERROR(
      attention(p.qv(), p.kv(), p.vv(), MutableTensorView(out.data(), {2, 4, 3, 6})),
      "out has dtype bf16 but must be f32");
}

TEST(Errors, E11_LseShapeOrDtype) {
  Problem p;
  EXPECT_MASKATTN_ERROR(attention(p.qv(), p.kv(), p.vv(), p.outv(), {}, {}, {},
                                  MutableTensorView(p.lse.data(), {2, 4, 3, 1})),
                        "lse has shape [2,4,3,1]; expected [2,4,3]");
  std::vector<float16> lse(24);
  EXPECT_MASKATTN_ERROR(attention(p.qv(), p.kv(), p.vv(), p.outv(), {}, {}, {},
                                  MutableTensorView(lse.data(), {2, 4, 3})),
                        "lse has dtype f16 but must be f32");
}

TEST(Errors, E12_OutputElementsOverlap) {
  Problem p;
  EXPECT_MASKATTN_ERROR(attention(p.qv(), p.kv(), p.vv(),
                                  MutableTensorView(p.out.data(), {2, 4, 3, 6}, {0, 18, 6, 1})),
                        "out has overlapping elements: strides [0,18,6,1] for shape [2,4,3,6]");
}

TEST(Errors, E13_OutputAliasesInput) {
  Problem p;
  std::vector<float> shared(2 * 4 * 3 * 8);
  EXPECT_MASKATTN_ERROR(attention(TensorView(shared.data(), {2, 4, 3, 8}), p.kv(), p.vv(),
                                  MutableTensorView(shared.data() + 8, {2, 4, 3, 6})),
                        "out [2,4,3,6] shares memory with q [2,4,3,8]");
  EXPECT_MASKATTN_ERROR(attention(p.qv(), p.kv(), p.vv(), p.outv(), {}, {}, {},
                                  MutableTensorView(p.out.data(), {2, 4, 3})),
                        "lse [2,4,3] shares memory with out [2,4,3,6]");
}

TEST(Errors, E14_StridesBeyondAddressableMemory) {
  Problem p;
  EXPECT_MASKATTN_ERROR(attention(TensorView(p.q.data(), {2, 4, 3, 8}, {1ll << 62, 24, 8, 1}),
                                  p.kv(), p.vv(), p.outv()),
                        "q strides [4611686018427387904,24,8,1] for shape [2,4,3,8] reach beyond");
}

TEST(Errors, E15_ViewRankOrStrideCount) {
  float x = 0;
  EXPECT_MASKATTN_ERROR(TensorView(&x, Dims{1, 1, 1, 1, 1}),
                        "tensor view of shape [1,1,1,1,1] has rank 5; views have rank 1 to 4");
  EXPECT_MASKATTN_ERROR(TensorView(&x, Dims{1, 1}, Dims{1}),
                        "tensor view of shape [1,1] got 1 strides [1]");
}

TEST(Errors, E16_NegativeOrOverflowingShape) {
  float x = 0;
  EXPECT_MASKATTN_ERROR(TensorView(&x, Dims{2, -3}),
                        "tensor view shape [2,-3] has a negative size");
  EXPECT_MASKATTN_ERROR(TensorView(&x, Dims{1ll << 32, 1ll << 32, 4}),
                        "has more elements than int64 can count");
  // Empty, but its strides would still overflow.
  EXPECT_MASKATTN_ERROR(TensorView(&x, Dims{0, 1ll << 40, 1ll << 40}),
                        "has more elements than int64 can count");
}

TEST(Errors, E17_ArrayValueCount) {
  EXPECT_MASKATTN_ERROR(Array<float>({2, 3}, {1, 2, 3, 4, 5}),
                        "array of shape [2,3] needs 6 values, got 5");
}

// ---- options ------------------------------------------------------------------------------

TEST(Errors, E18_ScaleNotFinite) {
  Problem p;
  Options options;
  options.scale = NAN;
  EXPECT_MASKATTN_ERROR(p.run({}, {}, options), "scale = nan must be finite");
}

TEST(Errors, E19_DefaultScaleWithZeroHeadDim) {
  std::vector<float> out(3);
  const float dummy = 0;
  EXPECT_MASKATTN_ERROR(
      attention(TensorView(&dummy, {1, 1, 3, 0}), TensorView(&dummy, {1, 1, 2, 0}),
                TensorView(&dummy, {1, 1, 2, 1}), MutableTensorView(out.data(), {1, 1, 3, 1})),
      "q has head dim D=0, so the default scale 1/sqrt(D) is undefined");
}

TEST(Errors, E20_ThreadCount) {
  Problem p;
  Options options;
  options.threads = -1;
  EXPECT_MASKATTN_ERROR(p.run({}, {}, options), "threads = -1 must be in [0, 1024]");
  options.threads = 100000;  // OpenMP would try to start them all
  EXPECT_MASKATTN_ERROR(p.run({}, {}, options), "threads = 100000 must be in [0, 1024]");
}

TEST(Errors, E21_InspectionArguments) {
  EXPECT_MASKATTN_ERROR(block_map(Mask(), {1, 1, 4, 4}, 0, 64),
                        "block_map: tile sizes 0x64 must be ≥ 1");
  EXPECT_MASKATTN_ERROR(allowed_pairs(Mask(), {2, 3, 4, 4}, 2, 0),
                        "allowed_pairs: batch 2, head 0 is outside scores [2,3,4,4]");
}

TEST(Errors, E22_CheckFinite) {
  Problem p;
  p.q[1 * 4 * 3 * 8 + 2 * 3 * 8 + 1 * 8 + 5] = NAN;  // q[1,2,1,5]
  Options options;
  options.check_finite = true;
  EXPECT_MASKATTN_ERROR(p.run({}, {}, options), "check_finite: q[1,2,1,5] is nan");
}

// ---- mask builder -------------------------------------------------------------------------

TEST(Errors, E23_NegativeWindow) {
  EXPECT_MASKATTN_ERROR(Mask().window(-1, 0),
                        "window(-1,0): window sides must be ≥ 0 (use kUnbounded");
}

TEST(Errors, E24_SlidingWindowZero) {
  EXPECT_MASKATTN_ERROR(Mask().sliding_window(0),
                        "sliding_window(0): the window must hold at least 1 key");
}

TEST(Errors, E25_ChunkSize) {
  EXPECT_MASKATTN_ERROR(Mask().chunk(0), "chunk(0): chunk size must be ≥ 1");
}

TEST(Errors, E26_NegativePrefix) {
  EXPECT_MASKATTN_ERROR(Mask().prefix_lm(-2), "prefix_lm(-2): length must be ≥ 0");
}

TEST(Errors, E27_NegativeLength) {
  EXPECT_MASKATTN_ERROR(Mask().key_lengths({3, -2}), "key_lengths[1] = -2 is negative");
  EXPECT_MASKATTN_ERROR(Mask().query_starts({-1}), "query_starts[0] = -1 is negative");
}

TEST(Errors, E28_PaddingRank) {
  EXPECT_MASKATTN_ERROR(Mask().key_keep(Array<int64_t>({4}, {1, 1, 0, 0})),
                        "key_keep has shape [4]; expected [B,Lk]");
  EXPECT_MASKATTN_ERROR(Mask().segments(Array<int64_t>({4}, {1, 1, 0, 0})),
                        "segments has shape [4]; expected [B,L]");
}

TEST(Errors, E29_KeepValuesNotBinary) {
  EXPECT_MASKATTN_ERROR(Mask().key_keep(Array<int64_t>({1, 4}, {1, 1, 1, 2})),
                        "key_keep must hold only 0 and 1, found 2 at flat index 3");
  EXPECT_MASKATTN_ERROR(Mask().blocked(Array<uint8_t>({2}, {0, 7})),
                        "blocked mask must hold only 0 and 1, found 7 at flat index 1");
}

TEST(Errors, E30_DenseMaskRankOrEmpty) {
  EXPECT_MASKATTN_ERROR(Mask().keep(Array<uint8_t>({1, 1, 1, 1, 1}, {1})),
                        "keep mask shape [1,1,1,1,1] has rank > 4");
  EXPECT_MASKATTN_ERROR(Mask().additive(Array<float>()), "additive mask is an empty array");
}

TEST(Errors, E31_ConflictingAlignment) {
  EXPECT_MASKATTN_ERROR(Mask().causal(Alignment::top_left).set_alignment(Alignment::bottom_right),
                        "mask alignment set to both bottom-right and top-left");
}

TEST(Errors, E32_EmptyPredicate) {
  EXPECT_MASKATTN_ERROR(Mask().predicate(nullptr, "mine"), "predicate 'mine' is empty");
}

TEST(Errors, E33_BadHeadSet) {
  EXPECT_MASKATTN_ERROR(HeadSet({1, -1}), "contains a negative head index");
  EXPECT_MASKATTN_ERROR(HeadSet::range(3, 3), "head range [3, 3) is empty");
}

// ---- mask against the problem -------------------------------------------------------------

TEST(Errors, E34_PaddingBatchSize) {
  Problem p;
  EXPECT_MASKATTN_ERROR(p.run(Mask().key_lengths({5, 5, 5})),
                        "key_lengths has 3 entries but the batch has B=2");
}

TEST(Errors, E35_LengthBeyondSequence) {
  Problem p;
  EXPECT_MASKATTN_ERROR(p.run(Mask().key_lengths({5, 9})),
                        "key_lengths: value 9 at [1] exceeds Lk=5");
  EXPECT_MASKATTN_ERROR(p.run(Mask().query_starts({4, 0})),
                        "query_starts: value 4 at [0] exceeds Lq=3");
}

TEST(Errors, E36_PerTokenShape) {
  Problem p;
  EXPECT_MASKATTN_ERROR(p.run(Mask().key_keep(Array<int64_t>({2, 4}, std::vector<int64_t>(8, 1)))),
                        "key_keep has shape [2,4]; expected [B,Lk] = [2,5]");
}

TEST(Errors, E37_PositionsGivenTwice) {
  Problem p;
  EXPECT_MASKATTN_ERROR(p.run(Mask().key_starts({0, 0}).key_starts({1, 1})),
                        "key starts given twice");
}

TEST(Errors, E38_SharedIdsNeedSquare) {
  Problem p;
  EXPECT_MASKATTN_ERROR(p.run(Mask().segments(Array<int64_t>({2, 5}, std::vector<int64_t>(10)))),
                        "segments: one id array for queries and keys needs Lq == Lk (got Lq=3, "
                        "Lk=5)");
}

TEST(Errors, E39_IdArrayShape) {
  Problem p;
  EXPECT_MASKATTN_ERROR(p.run(Mask().spans(Array<int64_t>({2, 3}, std::vector<int64_t>(6)),
                                           Array<int64_t>({2, 4}, std::vector<int64_t>(8)))),
                        "spans key ids have shape [2,4]; expected [B,Lk] = [2,5]");
}

TEST(Errors, E40_HeadOutOfRange) {
  Problem p;
  EXPECT_MASKATTN_ERROR(p.run(Mask().window(2, 0, HeadSet{1, 9})),
                        "window(2,0) applies to head 9 but the query has Hq=4 heads");
}

TEST(Errors, E41_DenseMaskDoesNotBroadcast) {
  Problem p;
  EXPECT_MASKATTN_ERROR(p.run(Mask().blocked(Array<uint8_t>({4, 5}, std::vector<uint8_t>(20)))),
                        "blocked mask shape [4,5] does not broadcast to scores [2,4,3,5]");
}

// ---- score modifiers ----------------------------------------------------------------------

TEST(Errors, E42_Softcap) {
  Problem p;
  ScoreMods mods;
  mods.softcap = 0.0;
  EXPECT_MASKATTN_ERROR(p.run({}, mods), "softcap = 0.000000 must be a positive finite number");
}

TEST(Errors, E43_PerHeadModifierSize) {
  Problem p;
  ScoreMods mods;
  mods.alibi_slopes = {0.5f, 0.25f};
  EXPECT_MASKATTN_ERROR(p.run({}, mods),
                        "alibi slopes have 2 entries but the query has Hq=4 heads");
}

TEST(Errors, E44_PerHeadModifierNotFinite) {
  Problem p;
  ScoreMods mods;
  mods.sinks = {0, NAN, 0, 0};
  EXPECT_MASKATTN_ERROR(p.run({}, mods), "sinks[1] = nan is not finite");
}

TEST(Errors, E45_BiasDoesNotBroadcast) {
  Problem p;
  ScoreMods mods;
  mods.bias = Array<float>({4, 1, 1}, {0, 0, 0, 0});
  EXPECT_NO_THROW(p.run({}, mods));
  mods.bias = Array<float>({3, 1, 1}, {0, 0, 0});
  EXPECT_MASKATTN_ERROR(p.run({}, mods),
                        "bias shape [3,1,1] does not broadcast to scores [2,4,3,5]");
}

TEST(Errors, E46_ThresholdNan) {
  Problem p;
  ScoreMods mods;
  mods.threshold = NAN;
  EXPECT_MASKATTN_ERROR(p.run({}, mods), "threshold is NaN");
}

TEST(Errors, E47_CheckFiniteAdditive) {
  Problem p;
  Options options;
  options.check_finite = true;
  EXPECT_NO_THROW(p.run(Mask().additive(Array<float>({5}, {0, -INFINITY, 0, 0, 0})), {}, options));
  EXPECT_MASKATTN_ERROR(
      p.run(Mask().additive(Array<float>({5}, {0, INFINITY, 0, 0, 0})), {}, options),
      "check_finite: additive mask flat index 1 is +inf");
}

// ---- .npy files ---------------------------------------------------------------------------

std::vector<uint8_t> valid_npy() {
  return serialize_npy(NpyArray::from_floats({1, 2, 3}, {3}));
}

TEST(Errors, E48_CannotOpenFile) {
  EXPECT_MASKATTN_ERROR(read_npy("/nonexistent/x.npy"),
                        "cannot open '/nonexistent/x.npy': No such file or directory");
}

TEST(Errors, E49_NotNpy) {
  const std::string text = "hello, world";
  EXPECT_MASKATTN_ERROR(parse_npy(reinterpret_cast<const uint8_t*>(text.data()), text.size(), "t"),
                        "t: not a .npy file");
}

TEST(Errors, E50_TruncatedHeader) {
  const std::vector<uint8_t> bytes = valid_npy();
  EXPECT_MASKATTN_ERROR(parse_npy(bytes.data(), 40, "t.npy"), "t.npy: truncated header");
}

TEST(Errors, E51_TruncatedData) {
  const std::vector<uint8_t> bytes = valid_npy();
  EXPECT_MASKATTN_ERROR(parse_npy(bytes.data(), bytes.size() - 2, "t.npy"),
                        "t.npy: truncated data: shape [3] of float32 needs 12 bytes, file has 10");
}

std::vector<uint8_t> with_header(const std::string& header) {
  std::string text = "\x93NUMPY";
  text += '\x01';
  text += '\x00';
  std::string padded = header;
  while ((10 + padded.size() + 1) % 64 != 0) padded += ' ';
  padded += '\n';
  text += static_cast<char>(padded.size() & 0xFF);
  text += static_cast<char>(padded.size() >> 8);
  text += padded;
  return std::vector<uint8_t>(text.begin(), text.end());
}

TEST(Errors, E52_UnsupportedDtype) {
  const auto bytes = with_header("{'descr': '<U3', 'fortran_order': False, 'shape': (), }");
  EXPECT_MASKATTN_ERROR(parse_npy(bytes.data(), bytes.size(), "s.npy"), "s.npy: unsupported dtype");
}

TEST(Errors, E53_BigEndian) {
  const auto bytes = with_header("{'descr': '>f4', 'fortran_order': False, 'shape': (0,), }");
  EXPECT_MASKATTN_ERROR(parse_npy(bytes.data(), bytes.size(), "b.npy"), "b.npy: big-endian dtype",
                        "astype('<f4')");
}

TEST(Errors, E54_MalformedHeader) {
  const auto bytes = with_header("{'descr': '<f4', 'fortran_order': Nope, 'shape': (3,), }");
  EXPECT_MASKATTN_ERROR(parse_npy(bytes.data(), bytes.size(), "m.npy"),
                        "m.npy: invalid .npy header");
}

TEST(Errors, E55_AbsurdShape) {
  const auto bytes =
      with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }");
  EXPECT_MASKATTN_ERROR(parse_npy(bytes.data(), bytes.size(), "a.npy"), "a.npy");
}

TEST(Errors, E56_TrailingBytes) {
  std::vector<uint8_t> bytes = valid_npy();
  bytes.push_back(0);
  EXPECT_MASKATTN_ERROR(parse_npy(bytes.data(), bytes.size(), "t.npy"),
                        "t.npy: 1 trailing bytes after the data");
}

TEST(Errors, E57_BoolByteNotBinary) {
  auto bytes = with_header("{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }");
  bytes.push_back(1);
  bytes.push_back(2);
  EXPECT_MASKATTN_ERROR(parse_npy(bytes.data(), bytes.size(), "b.npy"),
                        "b.npy: bool element 1 has byte value 2");
}

TEST(Errors, E58_ConversionRefused) {
  EXPECT_MASKATTN_ERROR(NpyArray::from_int64({1}, {1}).to_float32("lengths.npy"),
                        "lengths.npy has dtype int64; expected float16, float32 or float64");
  EXPECT_MASKATTN_ERROR(NpyArray::from_floats({1}, {1}).to_int64("ids.npy"),
                        "ids.npy has dtype float32; expected bool or an integer type");
}

// ---- command line -------------------------------------------------------------------------

TEST(Errors, E59_UnknownMaskKind) {
  CliFiles files;
  expect_cli_error(files.attend("--mask causl"), "--mask causl: unknown kind 'causl'",
                   files.dir.path("out.npy"));
}

TEST(Errors, E60_BadSpecArgument) {
  CliFiles files;
  expect_cli_error(files.attend("--mask sliding-window:x"),
                   "--mask sliding-window:x: 'x' is not an integer", files.dir.path("out.npy"));
  expect_cli_error(files.attend("--mask window:3"), "--mask window:3: window needs LEFT:RIGHT",
                   files.dir.path("out.npy"));
  expect_cli_error(files.attend("--mask chunk"), "--mask chunk: 'chunk' needs an argument");
}

TEST(Errors, E61_BoolMaskFileIsFloat) {
  CliFiles files;
  const std::string mask = files.write("m.npy", NpyArray::from_floats({0, -INFINITY}, {1, 2}));
  expect_cli_error(files.attend("--mask keep:" + mask),
                   "has dtype float32; keep masks are bool or 0/1 integers (for a float mask use "
                   "additive:FILE)",
                   files.dir.path("out.npy"));
}

TEST(Errors, E62_InputDtype) {
  CliFiles files;
  files.write("d.npy", NpyArray(NpyType::f8, {1, 3, 4}, std::vector<uint8_t>(96)));
  expect_cli_error(files.attend("", "d.npy"),
                   "d.npy has dtype float64; attention inputs are float32 or float16",
                   files.dir.path("out.npy"));
}

TEST(Errors, E63_InputRank) {
  CliFiles files;
  files.write("r.npy", NpyArray::from_floats(std::vector<float>(12), {1, 1, 1, 3, 4}));
  expect_cli_error(files.attend("", "r.npy"),
                   "has shape [1,1,1,3,4]; expected [L,D], [B,L,D] or [B,H,L,D]");
}

TEST(Errors, E64_MixedFileDtypes) {
  CliFiles files;
  files.write("h.npy", NpyArray::from_float16(std::vector<float16>(12), {1, 3, 4}));
  expect_cli_error(files.attend("", "q.npy", "h.npy"), "h.npy is float16 but --q",
                   "pass --dtype f32|f16|bf16 to convert");
}

TEST(Errors, E65_MixedRanks) {
  CliFiles files;
  files.write("k4.npy", NpyArray::from_floats(std::vector<float>(12), {1, 1, 3, 4}));
  expect_cli_error(files.attend("", "q.npy", "k4.npy"), "k4.npy has rank 4 but --q",
                   "give q, k and v in the same layout");
}

TEST(Errors, E66_BadKernelName) {
  CliFiles files;
  expect_cli_error(files.attend("--kernel fast"),
                   "--kernel = 'fast' is not a kernel: use auto, reference or fused",
                   files.dir.path("out.npy"), 2);
}

TEST(Errors, E67_BadThreadCount) {
  CliFiles files;
  expect_cli_error(files.attend("--threads 0"), "--threads", files.dir.path("out.npy"), 2);
}

TEST(Errors, E68_GridBatchOutOfRange) {
  CliFiles files;
  const std::string lengths = files.write("len.npy", NpyArray::from_int64({2, 3}, {2}));
  expect_cli_error("mask causal key-lengths:" + lengths + " --lq 3 --lk 3 --batch 2",
                   "--batch 2 is out of range: the mask files have B=2");
}

TEST(Errors, E69_CannotWriteOutput) {
  CliFiles files;
  expect_cli_error("attend --q " + files.dir.path("q.npy") + " --k " + files.dir.path("q.npy") +
                       " --v " + files.dir.path("q.npy") + " --out /nonexistent/dir/o.npy",
                   "cannot write '/nonexistent/dir/o.npy'");
}

TEST(Errors, E70_MissingRequiredOption) {
  expect_cli_error("attend --k k.npy --v v.npy --out o.npy", "--q is required", "", 2);
}

TEST(Errors, E71_ShapeErrorThroughTheCli) {
  CliFiles files;
  const std::string lengths = files.write("len.npy", NpyArray::from_int64({3, 3}, {2}));
  expect_cli_error(files.attend("--mask key-lengths:" + lengths),
                   "--mask key-lengths:" + lengths + " has 2 entries but the batch has B=1",
                   files.dir.path("out.npy"));
  // Errors about the views name the files and their shapes as well.
  files.write("k2.npy", NpyArray::from_floats(std::vector<float>(24), {2, 3, 4}));
  expect_cli_error(files.attend("", "q.npy", "k2.npy"),
                   "k batch 2 does not match q batch 1 (q [1,1,3,4], k [2,1,3,4]) (--q " +
                       files.dir.path("q.npy") + " [1,3,4], --k " + files.dir.path("k2.npy") +
                       " [2,3,4], --v " + files.dir.path("q.npy") + " [1,3,4])");
}

TEST(Errors, E72_Float64BeyondFloat32Range) {
  CliFiles files;
  const std::string additive = files.write("a.npy", NpyArray(NpyType::f8, {3}, [] {
                                             std::vector<uint8_t> bytes(24, 0);
                                             const double lowest = -1.7976931348623157e308;
                                             std::memcpy(bytes.data() + 8, &lowest, 8);
                                             return bytes;
                                           }()));
  expect_cli_error(files.attend("--mask additive:" + additive),
                   "value -1.7976931348623157e+308 at flat index 1 is outside the float32 range",
                   files.dir.path("out.npy"));
}

TEST(Errors, E73_TwoOutputsOneFile) {
  CliFiles files;
  expect_cli_error(files.attend("--lse " + files.dir.path("out.npy")),
                   "--out and --lse name the same file", files.dir.path("out.npy"));
  const std::string q = files.dir.path("q.npy");
  expect_cli_error("grad --q " + q + " --k " + q + " --v " + q + " --dout " + q + " --dq " +
                       files.dir.path("g.npy") + " --dk " + files.dir.path("g.npy") + " --dv " +
                       files.dir.path("dv.npy"),
                   "--dq and --dk name the same file", files.dir.path("dv.npy"));
}

// ---- attention_backward, gradcheck, maskattn grad / gradcheck --------------------------------

// A forward's outputs and gradient buffers for Problem, to break one piece at a time.
struct BackwardProblem : Problem {
  std::vector<float> dout = test::random_values(2 * 4 * 3 * 6, 4);
  std::vector<float> dq = std::vector<float>(2 * 4 * 3 * 8);
  std::vector<float> dk = std::vector<float>(2 * 2 * 5 * 8);
  std::vector<float> dv = std::vector<float>(2 * 2 * 5 * 6);
  TensorView doutv() const { return TensorView(dout.data(), {2, 4, 3, 6}); }
  TensorView lsev() const { return TensorView(lse.data(), {2, 4, 3}); }
  Gradients grads() {
    return {MutableTensorView(dq.data(), {2, 4, 3, 8}),
            MutableTensorView(dk.data(), {2, 2, 5, 8}),
            MutableTensorView(dv.data(), {2, 2, 5, 6}),
            {},
            {}};
  }
  void backward(const Gradients& g, const TensorView& d, const ScoreMods& mods = {}) {
    attention_backward(qv(), kv(), vv(), TensorView(out.data(), {2, 4, 3, 6}), lsev(), d, g, {},
                       mods);
  }
};

TEST(Errors, E74_BackwardInputShape) {
  BackwardProblem p;
  EXPECT_MASKATTN_ERROR(p.backward(p.grads(), TensorView(p.dout.data(), {2, 4, 6, 3})),
                        "dout has shape [2,4,6,3] but must be [2,4,3,6] (from q [2,4,3,8] and v "
                        "[2,2,5,6])");
  EXPECT_MASKATTN_ERROR(
      attention_backward(p.qv(), p.kv(), p.vv(), TensorView(p.out.data(), {2, 4, 3, 6}),
                         TensorView(p.lse.data(), {2, 4, 3, 1}), p.doutv(), p.grads()),
      "lse has shape [2,4,3,1]; expected [2,4,3]");
}

TEST(Errors, E75_BackwardInputDtype) {
  BackwardProblem p;
  std::vector<uint16_t> halves(p.dout.size());
  EXPECT_MASKATTN_ERROR(p.backward(p.grads(), TensorView(halves.data(), DType::f16, {2, 4, 3, 6})),
                        "dout has dtype f16 but must be f32");
}

TEST(Errors, E76_GradientShapeOrDtype) {
  BackwardProblem p;
  Gradients g = p.grads();
  g.dk = MutableTensorView(p.dk.data(), {2, 2, 8, 5});
  EXPECT_MASKATTN_ERROR(p.backward(g, p.doutv()),
                        "dk has shape [2,2,8,5] but must be [2,2,5,8] (from k [2,2,5,8])");
  g = p.grads();
  g.dq = MutableTensorView();
  EXPECT_MASKATTN_ERROR(p.backward(g, p.doutv()), "dq is a null view; expected [2,4,3,8]");
}

TEST(Errors, E77_GradientSharesMemory) {
  BackwardProblem p;
  Gradients g = p.grads();
  g.dq = MutableTensorView(p.q.data(), {2, 4, 3, 8});
  EXPECT_MASKATTN_ERROR(p.backward(g, p.doutv()),
                        "dq [2,4,3,8] shares memory with q [2,4,3,8]; outputs must not overlap");
  g = p.grads();
  g.dv = MutableTensorView(p.dk.data(), {2, 2, 5, 6});
  EXPECT_MASKATTN_ERROR(p.backward(g, p.doutv()), "dv [2,2,5,6] shares memory with dk [2,2,5,8]");
}

TEST(Errors, E78_BackwardThroughScoreFunction) {
  BackwardProblem p;
  ScoreMods mods;
  mods.score_fn = [](double s, int64_t, int64_t, int64_t, int64_t) { return s; };
  EXPECT_MASKATTN_ERROR(p.backward(p.grads(), p.doutv(), mods),
                        "attention_backward: mods.score_fn is an opaque callable with no "
                        "derivative");
}

TEST(Errors, E79_BiasOrSinkGradientWithoutTheModifier) {
  BackwardProblem p;
  std::vector<float> buffer(10);
  Gradients g = p.grads();
  g.dbias = MutableTensorView(buffer.data(), {2, 5});
  EXPECT_MASKATTN_ERROR(p.backward(g, p.doutv()), "grads.dbias is given but mods.bias is not set");
  ScoreMods mods;
  mods.bias = Array<float>({5}, std::vector<float>(5));
  EXPECT_MASKATTN_ERROR(p.backward(g, p.doutv(), mods), "dbias has shape [2,5]; expected [5]");
  g = p.grads();
  g.dsinks = MutableTensorView(buffer.data(), {4});
  EXPECT_MASKATTN_ERROR(p.backward(g, p.doutv()),
                        "grads.dsinks is given but mods.sinks is not set");
}

TEST(Errors, E80_GradcheckStep) {
  const Problem p;
  const std::vector<float> dout(2 * 4 * 3 * 6);
  GradcheckOptions check;
  check.step = 0.0;
  EXPECT_MASKATTN_ERROR(
      gradcheck(p.qv(), p.kv(), p.vv(), TensorView(dout.data(), {2, 4, 3, 6}), {}, {}, {}, check),
      "gradcheck: step = 0.000000 must be finite and > 0");
}

TEST(Errors, E81_GradcheckSizes) {
  expect_cli_error("gradcheck --lq 0", "--lq = 0 must be in [1, 4096]");
  expect_cli_error("gradcheck --lq 1000 --lk 1000 --d 64 --dv 64",
                   "gradcheck: 384000 input elements, each needing two reference forwards, is too "
                   "many");
}

TEST(Errors, E82_GradFilesDisagree) {
  CliFiles files;
  const std::string grads = " --dq " + files.dir.path("dq.npy") + " --dk " +
                            files.dir.path("dk.npy") + " --dv " + files.dir.path("dv.npy");
  const std::string inputs = "grad --q " + files.dir.path("q.npy") + " --k " +
                             files.dir.path("q.npy") + " --v " + files.dir.path("q.npy");
  files.write("d2.npy", NpyArray::from_floats(std::vector<float>(12), {3, 4}));
  expect_cli_error(inputs + " --dout " + files.dir.path("d2.npy") + grads,
                   "--dout " + files.dir.path("d2.npy") + " has rank 2 but --q " +
                       files.dir.path("q.npy") + " has rank 3",
                   files.dir.path("dq.npy"));
  files.write("d3.npy", NpyArray::from_floats(std::vector<float>(15), {1, 3, 5}));
  expect_cli_error(inputs + " --dout " + files.dir.path("d3.npy") + grads,
                   "dout has shape [1,1,3,5] but must be [1,1,3,4]", files.dir.path("dq.npy"));
}

TEST(Errors, E83_MemoryCap) {
  EXPECT_MASKATTN_ERROR(allowed_pairs(Mask(), {1, 1, int64_t{1} << 22, int64_t{1} << 22}),
                        "allowed_pairs [1,1,4194304,4194304] needs 16.0 TiB of memory, more than "
                        "the memory limit of");
}

TEST(Errors, E84_MemoryLimitVariable) {
  CliFiles files;
  setenv("MASKATTN_MEMORY_LIMIT", "12 apples", 1);
  const test::CliResult result = test::run_cli(files.attend(""));
  unsetenv("MASKATTN_MEMORY_LIMIT");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("MASKATTN_MEMORY_LIMIT='12 apples' is not a size (bytes, or a number "
                            "with K, M, G or T, e.g. 512M)"),
            std::string::npos)
      << result.err;
  EXPECT_FALSE(std::filesystem::exists(files.dir.path("out.npy")));
}

TEST(Errors, E85_NegativeMemoryLimit) {
  EXPECT_MASKATTN_ERROR(set_memory_limit(-5),
                        "set_memory_limit: -5 bytes must be ≥ 0 (0 = default)");
}

TEST(Errors, E86_HeatmapFile) {
  HeatmapPanel panel;
  panel.rows = 1;
  panel.cols = 1;
  panel.allowed = {1};
  test::TempDir dir;
  EXPECT_MASKATTN_ERROR(write_heatmap(dir.path("h.jpg"), {panel}),
                        "heatmap file '" + dir.path("h.jpg") + "' must end in .png or .svg");
  EXPECT_MASKATTN_ERROR(write_heatmap(dir.path("h.png"), {}), "heatmap: no panels to draw");
  expect_cli_error("mask causal --lq 2 --lk 2 --png /nonexistent/dir/m.png",
                   "cannot write heatmap '/nonexistent/dir/m.png'");
}

TEST(Errors, E87_TokensDoNotMatchTheKeys) {
  CliFiles files;
  {
    std::ofstream tokens(files.dir.path("t.txt"));
    tokens << "I love dog\n";
  }
  expect_cli_error("mask causal --lq 3 --lk 5 --svg " + files.dir.path("m.svg") + " --tokens " +
                       files.dir.path("t.txt"),
                   "--tokens " + files.dir.path("t.txt") +
                       " has 3 tokens but there are Lk=5 keys (one token per key)",
                   files.dir.path("m.svg"));
}

TEST(Errors, E88_AuditSizes) {
  AuditOptions options;
  options.q_len = 4;
  options.k_len = 0;
  EXPECT_MASKATTN_ERROR(audit_mask(Mask(), {}, nullptr, options),
                        "audit: k_len = 0 must be in [1, 4096]");
  options.k_len = 4096;
  options.q_len = 4096;
  options.batch = 2;
  EXPECT_MASKATTN_ERROR(audit_mask(Mask(), {}, nullptr, options),
                        "audit: 33554432 pairs (B·Hq·Lq·Lk), each key needing one attention call, "
                        "is too many");
  expect_cli_error("audit --mask causal --lq 3", "--lk is required", "", 2);
}

// ---- layers, caches -------------------------------------------------------------------------

TEST(Errors, E89_KVCacheFull) {
  KVCache cache(1, 2, 3, 4);
  const std::vector<float> k(2 * 2 * 4, 0.5f);
  const TensorView step(k.data(), {1, 2, 2, 4});
  cache.append(step, step);
  EXPECT_MASKATTN_ERROR(cache.append(step, step),
                        "KVCache is full: appending 2 positions to 2 exceeds the capacity 3");
  EXPECT_EQ(cache.length(), 2);
  const MultiHeadAttention layer = MultiHeadAttention::random(8, 2, 0, 1);
  KVCache small = layer.make_cache(1, 2);
  const std::vector<float> x(3 * 8, 0.25f);
  std::vector<float> out(3 * 8);
  EXPECT_MASKATTN_ERROR(layer.forward_cached(TensorView(x.data(), {1, 3, 8}), small,
                                             MutableTensorView(out.data(), {1, 3, 8})),
                        "KVCache is full: appending 3 positions to 0 exceeds the capacity 2");
}

TEST(Errors, E90_KVCacheShapes) {
  EXPECT_MASKATTN_ERROR(KVCache(1, 0, 8, 4), "KVCache kv_heads must be positive, got 0");
  KVCache cache(2, 2, 8, 4);
  const std::vector<float> k(2 * 2 * 1 * 4, 0.5f);
  EXPECT_MASKATTN_ERROR(
      cache.append(TensorView(k.data(), {2, 2, 1, 4}), TensorView(k.data(), {2, 1, 2, 4})),
      "KVCache::append got k [2,2,1,4] and v [2,1,2,4]; the cache expects "
      "[2,2,1,4] and [2,2,1,4]");
  EXPECT_MASKATTN_ERROR(cache.set_starts({0}),
                        "KVCache starts has 1 values but the cache holds 2 sequences");
  EXPECT_MASKATTN_ERROR(cache.set_starts({0, 8}),
                        "KVCache starts[1] = 8 is outside the capacity [0, 8)");
  EXPECT_MASKATTN_ERROR(cache.truncate(1), "KVCache::truncate(1) needs a length in [0, 0]");
  const MultiHeadAttention layer = MultiHeadAttention::random(8, 2, 1, 1);
  const std::vector<float> x(2 * 8, 0.25f);
  std::vector<float> out(2 * 8);
  EXPECT_MASKATTN_ERROR(layer.forward_cached(TensorView(x.data(), {2, 1, 8}), cache,
                                             MutableTensorView(out.data(), {2, 1, 8})),
                        "KVCache [2,2,capacity,4] does not fit query [2,1,8] and this layer "
                        "(kv_heads 1, head_dim 4); make it with make_cache()");
}

TEST(Errors, E91_LayerWeightShapes) {
  const auto weights = [](int64_t q_rows, int64_t k_rows, int64_t out_cols) {
    LayerWeights w;
    w.q_weight = Array<float>({q_rows, 8}, std::vector<float>(q_rows * 8));
    w.k_weight = Array<float>({k_rows, 8}, std::vector<float>(k_rows * 8));
    w.v_weight = Array<float>({k_rows, 8}, std::vector<float>(k_rows * 8));
    w.out_weight = Array<float>({8, out_cols}, std::vector<float>(8 * out_cols));
    return w;
  };
  EXPECT_MASKATTN_ERROR(MultiHeadAttention(weights(8, 8, 8), 4, 3),
                        "MultiHeadAttention needs heads > 0 and kv_heads dividing it; got heads "
                        "4, kv_heads 3");
  EXPECT_MASKATTN_ERROR(MultiHeadAttention(weights(8, 8, 8), 3),
                        "MultiHeadAttention q_weight has 8 rows, not a multiple of heads 3");
  EXPECT_MASKATTN_ERROR(MultiHeadAttention(weights(8, 6, 8), 4, 2),
                        "MultiHeadAttention k_weight has shape [6,8]; with kv_heads 2 and "
                        "head_dim 2");
  EXPECT_MASKATTN_ERROR(MultiHeadAttention(weights(8, 8, 6), 4),
                        "MultiHeadAttention out_weight has shape [8,6]; it needs heads · head "
                        "value dim = 8 columns");
  LayerWeights one_bias = weights(8, 8, 8);
  one_bias.q_bias = Array<float>({8}, std::vector<float>(8));
  EXPECT_MASKATTN_ERROR(MultiHeadAttention(one_bias, 4),
                        "MultiHeadAttention needs all four biases or none; got 1");
}

TEST(Errors, E92_LayerInputs) {
  const MultiHeadAttention layer = MultiHeadAttention::random(8, 2, 0, 1);
  const std::vector<float> x(2 * 3 * 8, 0.25f);
  std::vector<float> out(2 * 3 * 8);
  const TensorView good(x.data(), {2, 3, 8});
  const TensorView narrow(x.data(), {2, 4, 6});
  const MutableTensorView y(out.data(), {2, 3, 8});
  EXPECT_MASKATTN_ERROR(layer.forward(good, narrow, narrow, y),
                        "key has shape [2,4,6] but the layer's k_weight [8,8] takes 8 features "
                        "per token");
  EXPECT_MASKATTN_ERROR(
      layer.forward(good, good, TensorView(x.data(), {2, 2, 8}), y),
      "query [2,3,8], key [2,3,8] and value [2,2,8] must share B, and key and value their length");
  EXPECT_MASKATTN_ERROR(layer.forward(good, good, good, MutableTensorView(out.data(), {2, 8, 3})),
                        "out has shape [2,8,3] but must be [2,3,8]");
  EXPECT_MASKATTN_ERROR(
      layer.forward(good, good, good, MutableTensorView(const_cast<float*>(x.data()), {2, 3, 8})),
      "shares memory with query");
}

TEST(Errors, E93_WeightFiles) {
  test::TempDir dir;
  EXPECT_MASKATTN_ERROR(
      MultiHeadAttention::load(dir.path("none"), 2),
      "weights directory '" + dir.path("none") + "' does not exist or is not a directory");
  EXPECT_MASKATTN_ERROR(MultiHeadAttention::load(dir.root(), 2),
                        "weights directory '" + dir.root() +
                            "' has neither in_proj_weight.npy nor q_proj_weight.npy");
  write_npy(dir.path("in_proj_weight.npy"),
            NpyArray::from_floats(std::vector<float>(24 * 8), {24, 8}));
  EXPECT_MASKATTN_ERROR(MultiHeadAttention::load(dir.root(), 2),
                        "weights directory '" + dir.root() + "' has no out_proj.weight.npy");
  EXPECT_MASKATTN_ERROR(MultiHeadAttention::load(dir.root(), 3, 1),
                        "in_proj_weight.npy has shape [24,8]; with heads 3 and kv_heads 1 its "
                        "rows must be (heads + 2·kv_heads)·head_dim");
  write_npy(dir.path("out_proj.weight.npy"),
            NpyArray::from_floats(std::vector<float>(8 * 8), {8, 8}));
  write_npy(dir.path("bias_k.npy"), NpyArray::from_floats(std::vector<float>(8), {1, 1, 8}));
  EXPECT_MASKATTN_ERROR(MultiHeadAttention::load(dir.root(), 2),
                        "holds bias_k.npy: nn.MultiheadAttention's add_bias_kv (a learned key and "
                        "value appended to every sequence) is not supported");
  std::filesystem::remove(dir.path("bias_k.npy"));
  write_npy(dir.path("in_proj_bias.npy"), NpyArray::from_floats(std::vector<float>(24), {24}));
  EXPECT_MASKATTN_ERROR(MultiHeadAttention::load(dir.root(), 2),
                        "must hold both in_proj_bias.npy and out_proj.bias.npy, or neither");
  write_npy(dir.path("out_proj.bias.npy"), NpyArray::from_floats(std::vector<float>(8), {8, 1}));
  EXPECT_MASKATTN_ERROR(MultiHeadAttention::load(dir.root(), 2),
                        "out_proj.bias.npy has shape [8,1]; expected a vector");
}

TEST(Errors, E94_LayerBackwardInputs) {
  const MultiHeadAttention layer = MultiHeadAttention::random(8, 2, 0, 1);
  const std::vector<float> x(3 * 8, 0.25f);
  std::vector<float> out(3 * 8);
  const TensorView input(x.data(), {1, 3, 8});
  LayerActivations saved;
  layer.forward(input, input, input, MutableTensorView(out.data(), {1, 3, 8}), {}, {}, {}, &saved);
  LayerActivations truncated = saved;
  truncated.lse.pop_back();
  EXPECT_MASKATTN_ERROR(layer.backward(truncated, input),
                        "MultiHeadAttention::backward needs the activations this layer's "
                        "forward() saved");
  EXPECT_MASKATTN_ERROR(layer.backward(saved, TensorView(x.data(), {1, 8, 3})),
                        "dout has shape [1,8,3] but the layer's output is [1,3,8]");
  LayerOptions bf16;
  bf16.dtype = DType::bf16;
  EXPECT_MASKATTN_ERROR(layer.backward(saved, input, {}, {}, bf16),
                        "MultiHeadAttention::backward got options.dtype bf16 but forward() ran "
                        "in f32");
}

TEST(Errors, E95_MhaCommandArguments) {
  CliFiles files;
  MultiHeadAttention::random(4, 2, 0, 1).save(files.dir.path("w"));
  const std::string base = "mha --query " + files.dir.path("q.npy") + " --weights " +
                           files.dir.path("w") + " --heads 2 --out " + files.dir.path("y.npy");
  expect_cli_error(base + " --key " + files.dir.path("q.npy"),
                   "--key and --value go together: give both (cross-attention) or neither",
                   files.dir.path("y.npy"));
  expect_cli_error(
      base + " --incremental --key " + files.dir.path("q.npy") + " --value " +
          files.dir.path("q.npy"),
      "--incremental decodes self-attention through a KV cache; it takes no --key/--value",
      files.dir.path("y.npy"));
  files.write("q4.npy", NpyArray::from_floats(std::vector<float>(12), {1, 1, 3, 4}));
  expect_cli_error("mha --query " + files.dir.path("q4.npy") + " --weights " + files.dir.path("w") +
                       " --heads 2 --out " + files.dir.path("y.npy"),
                   "has shape [1,1,3,4]; mha inputs are [B,L,E] (or [L,E])",
                   files.dir.path("y.npy"));
  const std::string holes = files.write("holes.npy", NpyArray::from_bools({0, 1, 0}, {1, 3}));
  expect_cli_error(base + " --incremental --mask key-blocked:" + holes,
                   "sequence 0 has padding at position 1 after a real token; --incremental takes "
                   "left padding only",
                   files.dir.path("y.npy"));
  const std::string all = files.write("all.npy", NpyArray::from_bools({1, 1, 1}, {1, 3}));
  expect_cli_error(base + " --incremental --mask key-blocked:" + all,
                   "sequence 0 is all padding; --incremental needs at least one real token per "
                   "sequence",
                   files.dir.path("y.npy"));
}

TEST(Errors, E96_KeyBlockedValues) {
  CliFiles files;
  const std::string blocked = files.write("b.npy", NpyArray::from_int64({0, 2, 1}, {1, 3}));
  expect_cli_error(files.attend("--mask key-blocked:" + blocked),
                   "holds 2 at flat index 1; key-blocked masks hold only 0 and 1 (1 = padding)",
                   files.dir.path("out.npy"));
}

TEST(Errors, E97_ProductUnitNames) {
  EXPECT_MASKATTN_ERROR(parse_products("tensor-cores", "--products"),
                        "--products = 'tensor-cores' is not a product unit",
                        "use auto, f32, bf16-dot or amx");
  setenv("MASKATTN_PRODUCTS", "avx", 1);
  const std::vector<uint16_t> x(64, 0x3f80);  // bf16 1.0
  std::vector<uint16_t> out(64);
  const TensorView view(x.data(), DType::bf16, {1, 1, 8, 8});
  EXPECT_MASKATTN_ERROR(
      attention(view, view, view, MutableTensorView(out.data(), DType::bf16, {1, 1, 8, 8})),
      "environment variable MASKATTN_PRODUCTS = 'avx' is not a product unit");
  unsetenv("MASKATTN_PRODUCTS");
  expect_cli_error("attend --products gpu --q a.npy --k a.npy --v a.npy --out o.npy",
                   "--products = 'gpu' is not a product unit: use auto, f32, bf16-dot or amx", "",
                   2);
}

// The one parser per name: the library's words in C++, and the same on the command line (the
// Python side: python/tests/test_core_errors.py P09).
TEST(Errors, E97_KernelAndDTypeNames) {
  EXPECT_EQ(parse_kernel("reference", "kernel"), Kernel::reference);
  EXPECT_EQ(parse_dtype("bf16", "dtype"), DType::bf16);
  for (Kernel kernel : {Kernel::automatic, Kernel::reference, Kernel::fused})
    EXPECT_EQ(parse_kernel(kernel_name(kernel), "kernel"), kernel);
  EXPECT_MASKATTN_ERROR(parse_kernel("Fused", "kernel"),
                        "kernel = 'Fused' is not a kernel: use auto, reference or fused");
  EXPECT_MASKATTN_ERROR(parse_dtype("f64", "--dtype"),
                        "--dtype = 'f64' is not a dtype: use f32, f16 or bf16");
  EXPECT_MASKATTN_ERROR(parse_dtype("", "dtype"), "dtype = '' is not a dtype");
  expect_cli_error("audit --mask causal --len 4 --dtype float64",
                   "--dtype = 'float64' is not a dtype: use f32, f16 or bf16", "", 2);
  expect_cli_error("gradcheck --mask causal --kernel fast",
                   "--kernel = 'fast' is not a kernel: use auto, reference or fused", "", 2);
}

TEST(Errors, E98_ForcedProductUnitMissing) {
  const detail::fused::ScopedAmxRefusal refused;  // as on a CPU without AMX
  const std::vector<uint16_t> x(64, 0x3f80);
  std::vector<uint16_t> out(64);
  const TensorView view(x.data(), DType::bf16, {1, 1, 8, 8});
  Options options;
  options.products = Products::amx;
  EXPECT_MASKATTN_ERROR(
      attention(view, view, view, MutableTensorView(out.data(), DType::bf16, {1, 1, 8, 8}), {}, {},
                options),
      "products = amx, but AMX-BF16 is not usable here", "maskattn info");
  if (!cpu_report().avx512_bf16) {
    options.products = Products::bf16_dot;
    EXPECT_MASKATTN_ERROR(
        attention(view, view, view, MutableTensorView(out.data(), DType::bf16, {1, 1, 8, 8}), {},
                  {}, options),
        "products = bf16-dot, but this CPU has no AVX512-BF16");
  }
}

TEST(Errors, E99_TokensAndBatches) {
  Vocabulary vocabulary;
  EXPECT_MASKATTN_ERROR(vocabulary.token(99), "vocabulary: id 99 is outside [0, 7)");
  EXPECT_MASKATTN_ERROR(vocabulary.add("two words"), "vocabulary: token 'two words' is empty");
  EXPECT_MASKATTN_ERROR(collate({}, PadSide::right), "collate: no sequences");
  EXPECT_MASKATTN_ERROR(collate({{2}}, PadSide::right, -1), "collate: min_length = -1 must be ≥ 0");
  EXPECT_MASKATTN_ERROR(collate({{2, -1}}, PadSide::right), "negative token id -1 at 1");
  EXPECT_MASKATTN_ERROR(
      cross_attention(collate({{2}, {3}}, PadSide::right), collate({{2}}, PadSide::right)),
      "cross_attention: the decoder batch has B=2");
  EXPECT_MASKATTN_ERROR(image_text({0, 1}, {1}, 4), "image_text: 2 image starts and 1");
  EXPECT_MASKATTN_ERROR(image_text({4}, {3}, 6), "image tokens [4, 7) outside [0, 6)");
  EXPECT_MASKATTN_ERROR(mae_patch_masking(10, 1.0, 1), "mae_patch_masking: 10 patches");
  EXPECT_MASKATTN_ERROR(mlm_masking(Array<int64_t>({3}, {2, 7, 3}), 10, 1),
                        "mlm_masking: ids have shape [3]; expected [B,L]");
  EXPECT_MASKATTN_ERROR(mlm_masking(Array<int64_t>({1, 3}, {2, 7, 3}), 10, 1, 1.5),
                        "mlm_masking: vocabulary size 10 and rate");
}

TEST(Errors, E100_MergePartialsParts) {
  std::vector<float> a(12), l(3), out(12);
  const MutableTensorView out_view(out.data(), {1, 1, 3, 4});
  EXPECT_MASKATTN_ERROR(merge_partials({}, out_view), "merge_partials: no parts to merge");
  EXPECT_MASKATTN_ERROR(
      merge_partials({{TensorView(a.data(), {1, 1, 4, 3}), TensorView(l.data(), {1, 1, 3})}},
                     out_view),
      "part 0 out has shape [1,1,4,3] but out is [1,1,3,4]");
  EXPECT_MASKATTN_ERROR(
      merge_partials({{TensorView(a.data(), {1, 1, 3, 4}), TensorView(l.data(), {1, 3, 1})}},
                     out_view),
      "part 0 lse must be f32 [1,1,3], got f32 [1,3,1]");
}

TEST(Errors, E101_BlockSparseBuilder) {
  const Array<uint8_t> layout({2, 2}, {1, 0, 0, 1});
  EXPECT_MASKATTN_ERROR(Mask().block_sparse(layout, 0, 64), "block_sparse(0,64)",
                        "block sizes must be ≥ 1");
  EXPECT_MASKATTN_ERROR(Mask().block_sparse(Array<uint8_t>({4}, {1, 0, 0, 1}), 2, 2),
                        "layout has shape [4]; expected [nQ,nK], [H,nQ,nK] or [B,H,nQ,nK]");
  EXPECT_MASKATTN_ERROR(Mask().block_sparse(Array<uint8_t>({2, 2}, {1, 2, 0, 1}), 2, 2),
                        "block_sparse(2,2) layout must hold only 0 and 1, found 2 at flat index 1");
}

TEST(Errors, E102_BlockSparseLayoutDoesNotCoverTheLengths) {
  Problem p;  // B=2, Hq=4, Lq=3, Lk=5
  EXPECT_MASKATTN_ERROR(p.run(Mask().block_sparse(layout_of({2, 2}), 2, 2)),
                        "block_sparse(2,2): layout [2,2] has 2 key blocks of 2, but Lk=5 needs "
                        "⌈5/2⌉ = 3");
  EXPECT_MASKATTN_ERROR(p.run(Mask().block_sparse(layout_of({2, 3}), 1, 2)),
                        "block_sparse(1,2): layout [2,3] has 2 query blocks of 1, but Lq=3 needs "
                        "⌈3/1⌉ = 3");
  EXPECT_MASKATTN_ERROR(
      p.run(Mask().block_sparse(layout_of({3, 2, 3}), 2, 2)),
      "block_sparse(2,2): layout shape [3,2,3] does not broadcast to [B,Hq,nQ,nK] = [2,4,2,3]");
  EXPECT_NO_THROW(p.run(Mask().block_sparse(layout_of({1, 3}), 1, 2)));  // one row broadcasts
}

TEST(Errors, E103_GlobalTokenIds) {
  Problem p;  // B=2, Hq=4, Lq=3, Lk=5
  EXPECT_MASKATTN_ERROR(Mask().global_tokens(Array<int64_t>({1, 1, 3}, {1, 0, 0})),
                        "global_tokens has shape [1,1,3]; expected [B,L] or [L]");
  const Array<int64_t> five({5}, {1, 0, 0, 0, 0});
  EXPECT_MASKATTN_ERROR(p.run(Mask().global_tokens(five)),
                        "global_tokens: one id array for queries and keys needs Lq == Lk (got "
                        "Lq=3, Lk=5); give query and key ids separately");
  EXPECT_MASKATTN_ERROR(
      p.run(Mask().global_tokens(Array<int64_t>({3, 3}, std::vector<int64_t>(9)), five)),
      "global_tokens query ids have shape [3,3]; expected [B,Lq] = [2,3] (or "
      "[3] for every sequence)");
  EXPECT_MASKATTN_ERROR(p.run(Mask().global_tokens(Array<int64_t>({3}, {0, 0, 1}),
                                                   Array<int64_t>({4}, {1, 0, 0, 0}))),
                        "global_tokens key ids have shape [1,4]; expected [B,Lk] = [2,5]");
  EXPECT_MASKATTN_ERROR(
      p.run(Mask().global_tokens(Array<int64_t>({3}, {0, 0, 1}), five, HeadSet{4})),
      "global_tokens applies to head 4 but the query has Hq=4 heads");
}

TEST(Errors, E104_SparseLayoutBuilders) {
  EXPECT_MASKATTN_ERROR(bigbird_layout(0), "bigbird_layout: blocks = 0 must be ≥ 1");
  EXPECT_MASKATTN_ERROR(bigbird_layout(8, {2, 2, 3, 0}),
                        "bigbird_layout: sliding_blocks = 2 must be odd");
  EXPECT_MASKATTN_ERROR(bigbird_layout(8, {3, -1, 3, 0}),
                        "bigbird_layout: global_blocks = -1 must be ≥ 0");
  EXPECT_MASKATTN_ERROR(strided_layout(8, 0, 2), "strided_layout: local_blocks = 0 must be ≥ 1");
  EXPECT_MASKATTN_ERROR(strided_layout(8, 2, 2, true, -1),
                        "strided_layout: heads = -1 must be ≥ 0");
  EXPECT_MASKATTN_ERROR(fixed_layout(8, 2, 3),
                        "fixed_layout: summary_blocks = 3 exceeds chunk_blocks = 2");
}

// ---- sparse attention through the CLI (global:, block-sparse:, maskattn layout) -------------

TEST(Errors, E105_GlobalIdsFileRank) {
  CliFiles files;
  const std::string cube = files.write("c.npy", NpyArray::from_int64({1, 0, 0}, {1, 1, 3}));
  expect_cli_error(files.attend("--mask global:" + cube),
                   "--mask global:" + cube + ": " + cube +
                       " has shape [1,1,3]; global-token ids are [B,L] or [L] (≠ 0 = global)",
                   files.dir.path("out.npy"));
  const std::string ids = files.write("i.npy", NpyArray::from_int64({1, 0, 0}, {3}));
  expect_cli_error(files.attend("--mask global:" + ids + ":" + cube),
                   cube + " has shape [1,1,3]; global-token ids are [B,Lk] or [Lk]");
}

TEST(Errors, E106_BlockSparseSpecSyntax) {
  CliFiles files;
  const std::string layout = files.write("l.npy", NpyArray::from_bools({1, 1, 1, 1}, {2, 2}));
  expect_cli_error(files.attend("--mask block-sparse:0:2:" + layout),
                   "--mask block-sparse:0:2:" + layout +
                       ": block size BQ '0' is not a positive integer (block-sparse:BQ:BK:FILE)",
                   files.dir.path("out.npy"));
  expect_cli_error(files.attend("--mask block-sparse:2:x:" + layout),
                   "block size BK 'x' is not a positive integer");
  expect_cli_error(files.attend("--mask block-sparse:2:" + layout),
                   "block-sparse needs BQ:BK:FILE (block sizes in queries and keys, then the "
                   "layout), e.g. block-sparse:64:64:layout.npy");
  expect_cli_error("mask block-sparse:2:2:/nonexistent/l.npy --lq 3 --lk 3",
                   "block-sparse:2:2:/nonexistent/l.npy: cannot open '/nonexistent/l.npy'");
}

TEST(Errors, E107_BlockSparseLayoutFile) {
  CliFiles files;
  const std::string twos = files.write("t.npy", NpyArray::from_int64({1, 0, 2, 1}, {2, 2}));
  expect_cli_error(files.attend("--mask block-sparse:2:2:" + twos),
                   twos + " holds 2 at flat index 2; block-sparse layouts hold only 0 and 1",
                   files.dir.path("out.npy"));
  const std::string row = files.write("r.npy", NpyArray::from_bools({1, 1}, {2}));
  expect_cli_error(files.attend("--mask block-sparse:2:2:" + row),
                   row +
                       " has shape [2]; a block-sparse layout is [nQ,nK], [H,nQ,nK] or "
                       "[B,H,nQ,nK]");
  const std::string floats = files.write("f.npy", NpyArray::from_floats({1, 0, 1, 1}, {2, 2}));
  expect_cli_error(files.attend("--mask block-sparse:2:2:" + floats),
                   floats + " has dtype float32; block-sparse layouts are bool or 0/1 integers");
}

TEST(Errors, E108_LayoutCommand) {
  CliFiles files;
  const std::string out = files.dir.path("layout.npy");
  expect_cli_error("layout bigbird --blocks 8 --sliding 2 --out " + out,
                   "bigbird_layout: sliding_blocks = 2 must be odd", out);
  expect_cli_error("layout fixed --blocks 8 --chunk 2 --summary 3 --out " + out,
                   "fixed_layout: summary_blocks = 3 exceeds chunk_blocks = 2", out);
  // Counts out of range and a missing kind are command-line syntax (exit 2).
  expect_cli_error("layout strided --blocks 0 --local 1 --stride 2 --out " + out,
                   "--blocks: Value 0 not in range 1 to 1048576", out, 2);
  expect_cli_error("layout --blocks 8 --out " + out, "A subcommand is required", out, 2);
  // An unwritable --out (E69) leaves nothing behind.
  expect_cli_error("layout strided --blocks 4 --local 1 --stride 2 --out /nonexistent/dir/l.npy",
                   "cannot write '/nonexistent/dir/l.npy': cannot create "
                   "'/nonexistent/dir/l.npy.tmp-");
  for (const auto& entry : std::filesystem::directory_iterator(files.dir.root())) {
    EXPECT_EQ(entry.path().string().find(".tmp-"), std::string::npos) << entry.path();
  }
}

// ---- the document and the tests agree ------------------------------------------------------

TEST(Errors, CatalogueEntriesAllHaveTests) {
  std::ifstream doc(std::string(MASKATTN_SOURCE_DIR) + "/docs/errors.md");
  ASSERT_TRUE(doc) << "docs/errors.md missing";
  // An id is E and two or three digits: "| E07 | ..." in the table, "E07_…" as a test name.
  const auto id_length = [](const std::string& text, size_t first) -> size_t {
    size_t end = first + 1;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    const size_t digits = end - first - 1;
    return text.compare(first, 1, "E") == 0 && (digits == 2 || digits == 3) ? end - first : 0;
  };
  std::set<std::string> documented;
  for (std::string line; std::getline(doc, line);) {
    if (line.compare(0, 2, "| ") != 0) continue;
    const size_t length = id_length(line, 2);
    if (length > 0 && line.compare(2 + length, 2, " |") == 0) {
      documented.insert(line.substr(2, length));
    }
  }
  std::set<std::string> tested;
  const auto* suite = ::testing::UnitTest::GetInstance()->current_test_suite();
  for (int n = 0; n < suite->total_test_count(); ++n) {
    const std::string name = suite->GetTestInfo(n)->name();
    const size_t length = id_length(name, 0);
    if (length > 0 && name.size() > length && name[length] == '_') {
      tested.insert(name.substr(0, length));
    }
  }
  EXPECT_GE(documented.size(), 25u);
  EXPECT_EQ(documented, tested);
}

}  // namespace
}  // namespace maskattn
