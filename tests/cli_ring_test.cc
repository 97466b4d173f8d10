// maskattn attend --ring / grad --ring under mpirun (docs/distributed.md): P processes reading
// and writing their own rows of the same .npy files must produce the files the single-process
// command writes, within its tolerance, for both layouts, every file layout, float16 files, and
// a rank count that does not divide the sequence. Bad input fails every rank with one error and
// leaves no file. Built only with MASKATTN_WITH_MPI; each case starts mpirun once (≈ 0.5 s).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "maskattn/npy.h"
#include "test_util.h"

namespace maskattn {
namespace {

// mpirun with what this machine needs: root in containers, more ranks than cores, shared memory
// without single-copy (ptrace is refused in containers), one thread per rank.
test::CliResult run_ring(int ranks, const std::string& arguments) {
  test::TempDir dir;
  const std::string command =
      std::string("OMPI_MCA_btl_vader_single_copy_mechanism=none '") + MASKATTN_MPIEXEC +
      "' --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader -x "
      "OMP_NUM_THREADS=1 -np " +
      std::to_string(ranks) + " '" + MASKATTN_CLI + "' " + arguments + " --threads 1 >'" +
      dir.path("out") + "' 2>'" + dir.path("err") + "'";
  const int status = std::system(command.c_str());
  test::CliResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream err(dir.path("err"));
  std::stringstream text;
  text << err.rdbuf();
  result.err = text.str();
  return result;
}

// Random q, k, v (and dout) files of one shape in `dir`.
struct RingFiles {
  test::TempDir dir;
  RingFiles(const Dims& q_shape, const Dims& kv_shape, bool half_precision = false) {
    const auto write = [&](const std::string& name, const Dims& shape, uint64_t seed) {
      int64_t count = 1;
      for (const int64_t size : shape) count *= size;
      const std::vector<float> values = test::random_values(static_cast<size_t>(count), seed);
      if (half_precision) {
        std::vector<float16> halves;
        for (const float x : values) halves.push_back(float16_from_float(x));
        write_npy(dir.path(name), NpyArray::from_float16(halves, shape));
      } else {
        write_npy(dir.path(name), NpyArray::from_floats(values, shape));
      }
    };
    write("q.npy", q_shape, 1);
    write("k.npy", kv_shape, 2);
    write("v.npy", kv_shape, 3);
    write("dout.npy", q_shape, 4);
  }
  std::string inputs() const {
    return "--q " + dir.path("q.npy") + " --k " + dir.path("k.npy") + " --v " + dir.path("v.npy");
  }
  std::string attend(const std::string& tag, const std::string& flags) const {
    return "attend " + inputs() + " --out " + dir.path(tag + "_out.npy") + " --lse " +
           dir.path(tag + "_lse.npy") + " " + flags;
  }
  std::string grad(const std::string& tag, const std::string& flags) const {
    return "grad " + inputs() + " --dout " + dir.path("dout.npy") + " --dq " +
           dir.path(tag + "_dq.npy") + " --dk " + dir.path(tag + "_dk.npy") + " --dv " +
           dir.path(tag + "_dv.npy") + " " + flags;
  }
  // The ring's file `name` against the single-process one: same type and shape, values within
  // `tolerance`.
  void expect_same(const std::string& name, float tolerance) const {
    const NpyArray single = read_npy(dir.path("single_" + name + ".npy"));
    const NpyArray ring = read_npy(dir.path("ring_" + name + ".npy"));
    EXPECT_EQ(ring.type(), single.type()) << name;
    EXPECT_EQ(ring.shape(), single.shape()) << name;
    const float error = test::max_error(ring.to_float32(name), single.to_float32(name));
    EXPECT_LE(error, tolerance) << name;
  }
};

// The `ring_stats` line of `text` that holds `part` ("" when none does).
std::string stats_line(const std::string& text, const std::string& part) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("ring_stats ", 0) == 0 && line.find(part) != std::string::npos) return line;
  }
  return "";
}

void expect_success(const test::CliResult& result) {
  ASSERT_EQ(result.exit_code, 0) << result.err;
}

TEST(CliRing, AttendZigzagCausalGqaMatchesSingleProcess) {
  const RingFiles files({2, 4, 37, 8}, {2, 2, 37, 8});  // 37 rows: 4 chunks of 9 or 10
  expect_success(test::run_cli(files.attend("single", "--mask causal")));
  expect_success(run_ring(2, files.attend("ring", "--mask causal --ring zigzag")));
  files.expect_same("out", 1e-5f);
  files.expect_same("lse", 1e-5f);
}

TEST(CliRing, AttendContiguousWindowOneHeadFilesThreeRanks) {
  const RingFiles files({40, 8}, {40, 8});  // [L, D] files
  expect_success(test::run_cli(files.attend("single", "--mask sliding-window:6")));
  const test::CliResult ring =
      run_ring(3, files.attend("ring", "--mask sliding-window:6 --ring contiguous --ring-stats"));
  expect_success(ring);
  files.expect_same("out", 1e-5f);
  files.expect_same("lse", 1e-5f);
  // --ring-stats: one line per rank; a window of 6 < 13 rows per rank: no rank sends further
  // than its neighbour, and the last rank sends nothing (no later rank needs its keys).
  for (const char* rank :
       {"rank=0 world=3 rows=13", "rank=1 world=3 rows=13", "rank=2 world=3 rows=14"}) {
    EXPECT_NE(stats_line(ring.err, std::string("pass=forward ") + rank), "") << ring.err;
  }
  const std::string last = stats_line(ring.err, "pass=forward rank=2 ");
  EXPECT_NE(last.find(" calls=2 "), std::string::npos) << last;
  EXPECT_NE(last.find(" bytes_sent=0 "), std::string::npos) << last;
}

TEST(CliRing, AttendFloat16FilesDefaultLayoutCrossAttention) {
  const RingFiles files({1, 2, 24, 16}, {1, 2, 40, 16}, true);  // Lq ≠ Lk, bottom-right causal
  expect_success(test::run_cli(files.attend("single", "--mask causal")));
  expect_success(run_ring(2, files.attend("ring", "--mask causal --ring")));
  files.expect_same("out", 2e-3f);  // float16 files: one rounding of the output either way
  files.expect_same("lse", 1e-4f);
}

TEST(CliRing, GradZigzagCausalMatchesSingleProcess) {
  const RingFiles files({1, 4, 33, 8}, {1, 2, 33, 8});
  expect_success(test::run_cli(files.grad("single", "--mask causal")));
  const test::CliResult ring =
      run_ring(2, files.grad("ring", "--mask causal --ring zigzag --ring-stats pairs"));
  expect_success(ring);
  for (const char* name : {"dq", "dk", "dv"}) files.expect_same(name, 1e-5f);
  // Zigzag cuts 33 rows into chunks [0,8) [8,16) [16,24) [24,33): rank 0 holds 0–7 and 24–32,
  // rank 1 holds 8–23; with 4 heads they attend 4·(1+…+8 + 25+…+33) = 1188 and
  // 4·(9+…+24) = 1056 pairs (the odd row is the difference).
  EXPECT_NE(stats_line(ring.err, "pass=forward rank=0 world=2 rows=17").find("allowed_pairs=1188 "),
            std::string::npos)
      << ring.err;
  EXPECT_NE(stats_line(ring.err, "pass=forward rank=1 world=2 rows=16").find("allowed_pairs=1056 "),
            std::string::npos)
      << ring.err;
  EXPECT_NE(stats_line(ring.err, "pass=backward rank=0 ").find("bytes_sent="), std::string::npos);
  EXPECT_NE(stats_line(ring.err, "pass=backward rank=1 ").find("bytes_sent="), std::string::npos);
  EXPECT_EQ(std::count(ring.err.begin(), ring.err.end(), '\n'), 4) << ring.err;
}

// A program mask sees the rows of the whole problem on every rank (the ring's frame), so each
// rank's slice of packed documents is the single process's.
TEST(CliRing, ProgramMaskSeesGlobalRows) {
  const RingFiles files({2, 2, 37, 8}, {2, 2, 37, 8});
  std::vector<int64_t> doc(2 * 37);
  for (int64_t t = 0; t < 37; ++t) doc[t] = t / 10, doc[37 + t] = t / 25;
  write_npy(files.dir.path("doc.npy"), NpyArray::from_int64(doc, {2, 37}));
  const std::string program =
      "--mask 'expr:(doc[b, q] == doc[b, kv]) & (q >= kv):doc=" + files.dir.path("doc.npy") + "'";
  expect_success(test::run_cli(files.attend("single", program)));
  expect_success(run_ring(2, files.attend("ring", program + " --ring zigzag")));
  files.expect_same("out", 1e-5f);
  files.expect_same("lse", 1e-5f);
  expect_success(test::run_cli(files.grad("single", program)));
  expect_success(run_ring(2, files.grad("ring", program + " --ring contiguous")));
  for (const char* name : {"dq", "dk", "dv"}) files.expect_same(name, 1e-5f);
}

TEST(CliRing, BadInputFailsEveryRankAndWritesNothing) {
  const RingFiles files({1, 2, 16, 8}, {1, 2, 16, 4});  // k's head dim differs from q's
  const test::CliResult result = run_ring(2, files.attend("ring", "--mask causal --ring zigzag"));
  EXPECT_NE(result.exit_code, 0);
  // Every rank prints the same one-line error, the library's message naming the files.
  EXPECT_NE(result.err.find("maskattn: error: "), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("k head dim 4 does not match q head dim 8"), std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("--k " + files.dir.path("k.npy")), std::string::npos) << result.err;
  EXPECT_FALSE(std::filesystem::exists(files.dir.path("ring_out.npy")));
  for (const auto& entry : std::filesystem::directory_iterator(files.dir.root())) {
    EXPECT_EQ(entry.path().string().find(".tmp-"), std::string::npos) << entry.path();
  }
}

}  // namespace
}  // namespace maskattn
