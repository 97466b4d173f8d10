// The bad-input catalogue's rows for `attend --ring` / `grad --ring` (docs/errors.md E120–E122),
// compiled into errors_test so that its catalogue check sees them. The ring's own errors
// (E113–E119) are the library's; these are the command line's.
#include <filesystem>

#include "maskattn/npy.h"
#include "test_util.h"

namespace maskattn {
namespace {

// The command fails with exit code 1, one stderr line holding `message`, and no --out file.
void expect_ring_cli_error(const test::TempDir& dir, const std::string& extra,
                           const std::string& message) {
  const std::string q = dir.path("q.npy");
  const test::CliResult result = test::run_cli("attend --q " + q + " --k " + q + " --v " + q +
                                               " --out " + dir.path("out.npy") + " " + extra);
  EXPECT_EQ(result.exit_code, 1) << extra << "\n" << result.err;
  EXPECT_EQ(result.err.rfind("maskattn: error: ", 0), 0u) << result.err;
  EXPECT_NE(result.err.find(message), std::string::npos) << result.err << "\nmissing: " << message;
  EXPECT_FALSE(std::filesystem::exists(dir.path("out.npy")));
}

TEST(Errors, E120_RingWithoutMpi) {
#ifdef MASKATTN_CLI_HAS_MPI
  GTEST_SKIP() << "this maskattn has MPI; E120 is the error of builds without it";
#else
  test::TempDir dir;
  write_npy(dir.path("q.npy"), NpyArray::from_floats(test::random_values(12, 9), {1, 3, 4}));
  expect_ring_cli_error(dir, "--ring zigzag", "--ring needs a maskattn built with MPI");
  const std::string q = dir.path("q.npy");
  const test::CliResult grad = test::run_cli(
      "grad --q " + q + " --k " + q + " --v " + q + " --dout " + q + " --dq " + dir.path("dq.npy") +
      " --dk " + dir.path("dk.npy") + " --dv " + dir.path("dv.npy") + " --ring");
  EXPECT_EQ(grad.exit_code, 1) << grad.err;
  EXPECT_NE(grad.err.find("--ring needs a maskattn built with MPI"), std::string::npos);
#endif
}

TEST(Errors, E121_RingWithWholeProblemOptions) {
  test::TempDir dir;
  write_npy(dir.path("q.npy"), NpyArray::from_floats(test::random_values(12, 9), {1, 3, 4}));
  expect_ring_cli_error(dir, "--ring --report",
                        "--report cannot be combined with --ring: it needs the whole problem in "
                        "one process");
  expect_ring_cli_error(dir, "--ring contiguous --weights " + dir.path("w.npy"),
                        "--weights cannot be combined with --ring");
  expect_ring_cli_error(dir, "--ring --repeat 3", "--repeat cannot be combined with --ring");
  expect_ring_cli_error(dir, "--ring --heatmap " + dir.path("h.svg"),
                        "--heatmap cannot be combined with --ring");
  EXPECT_FALSE(std::filesystem::exists(dir.path("w.npy")));
}

TEST(Errors, E122_RingStatsWithoutRing) {
  test::TempDir dir;
  write_npy(dir.path("q.npy"), NpyArray::from_floats(test::random_values(12, 9), {1, 3, 4}));
  expect_ring_cli_error(dir, "--ring-stats", "--ring-stats needs --ring");
  expect_ring_cli_error(dir, "--ring-stats pairs", "--ring-stats needs --ring");
}

}  // namespace
}  // namespace maskattn
