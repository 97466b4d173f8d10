// The command line's programs, run as a separate process: --mask 'expr:…' is a mask program and
// --mod 'expr:…' a score program, with tables from .npy files; each is checked against the
// structured SPEC that means the same (docs/cli.md, Programs).
#include <algorithm>
#include <cmath>
#include <sstream>

#include "test_util.h"

namespace maskattn {
namespace {

using test::run_cli;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A SPEC for the shell: programs hold spaces, brackets, & and |.
std::string quoted(const std::string& spec) {
  return "'" + spec + "'";
}

// The grid of `maskattn mask`'s output: the key header and the rows, without the legend or notes.
std::string grid_lines(const std::string& out) {
  std::istringstream lines(out);
  std::string grid;
  for (std::string line; std::getline(lines, line);) {
    const bool cells = contains(line, "█") || contains(line, "·") || contains(line, "keys");
    if (cells && !contains(line, "allowed")) grid += line + "\n";
  }
  return grid;
}

std::string drawn(const std::string& specs, const std::string& sizes) {
  const test::CliResult result = run_cli("mask " + specs + " " + sizes);
  EXPECT_EQ(result.exit_code, 0) << specs << "\n" << result.err;
  return grid_lines(result.out);
}

TEST(CliExprMask, DrawsTheGridOfTheStructuredSpecItMeans) {
  for (const char* sizes : {"--lq 4 --lk 6", "--lq 6 --lk 4", "--lq 5 --lk 5"}) {
    const std::string causal = drawn("causal:top-left", sizes);
    ASSERT_FALSE(causal.empty());
    EXPECT_EQ(drawn(quoted("expr:q >= kv"), sizes), causal) << sizes;
    EXPECT_EQ(drawn(quoted("expr:(q - kv >= 0) & (q - kv < 2)"), sizes),
              drawn("causal:top-left window:1:0", sizes))
        << sizes;
  }
  test::TempDir dir;
  const std::string doc = dir.path("doc.npy");
  write_npy(doc, NpyArray::from_int64({0, 0, 0, 1, 1, 2, 2, 2}, {1, 8}));
  EXPECT_EQ(drawn(quoted("expr:(doc[0, q] == doc[0, kv]) & (q >= kv):doc=" + doc), "--lq 8 --lk 8"),
            drawn("segments:" + doc + " causal:top-left", "--lq 8 --lk 8"));
}

TEST(CliExprMask, SaysThatAProgramSeesRowIndicesAndPrintsItsCanonicalText) {
  const std::string spec = "expr:(q >= kv + 2*0) & ~(kv > 10)";
  const test::CliResult result = run_cli("mask " + quoted(spec) + " --lq 3 --lk 5");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "mask: " + spec + "\n")) << result.out;
  EXPECT_TRUE(contains(result.out, spec + ": program `(q >= kv + 0) & ~(kv > 10)` over row "
                                          "indices q, kv (top-left, whatever the alignment)\n"))
      << result.out;
  // Per head: a [Hq] table indexed by h, with --head choosing the row drawn.
  test::TempDir dir;
  write_npy(dir.path("w.npy"), NpyArray::from_int64({0, 1}, {2}));
  const std::string per_head = quoted("expr:abs(q - kv) <= w[h]:w=" + dir.path("w.npy"));
  EXPECT_EQ(drawn(per_head, "--lq 3 --lk 3 --head 0"), drawn("window:0:0", "--lq 3 --lk 3"));
  EXPECT_EQ(drawn(per_head, "--lq 3 --lk 3 --head 1"), drawn("window:1:1", "--lq 3 --lk 3"));
}

// attend and grad on [B, L, D] files: a program against the structured SPECs it spells out.
class CliExprAttend : public ::testing::Test {
 protected:
  // L crosses a 64-row tile, so the program's block map has full, partial and empty tiles.
  static constexpr int64_t B = 2, L = 70, D = 8;
  void SetUp() override {
    const auto write = [&](const char* name, uint64_t seed, float spread) {
      write_npy(path(name), NpyArray::from_floats(
                                test::random_values(B * L * D, seed, -spread, spread), {B, L, D}));
    };
    write("q.npy", 1, 1.0f);
    write("k.npy", 2, 4.0f);  // large scores, so that soft-capping changes them
    write("v.npy", 3, 1.0f);
    write("do.npy", 4, 1.0f);
    std::vector<int64_t> doc(B * L);
    for (int64_t t = 0; t < L; ++t) {
      doc[t] = t / 30;             // sequence 0: documents of 30 tokens
      doc[L + t] = t < 5 ? 0 : 1;  // sequence 1: a short one, then the rest
    }
    write_npy(path("doc.npy"), NpyArray::from_int64(doc, {B, L}));
  }
  std::string path(const std::string& name) const { return dir_.path(name); }
  // attend into `out` with the extra flags; the output's values.
  std::vector<float> attend(const std::string& flags, const std::string& out) const {
    const test::CliResult result =
        run_cli("attend --q " + path("q.npy") + " --k " + path("k.npy") + " --v " + path("v.npy") +
                " --out " + path(out) + " " + flags);
    EXPECT_EQ(result.exit_code, 0) << flags << "\n" << result.err;
    return result.exit_code == 0 ? read_npy(path(out)).to_float32(out) : std::vector<float>();
  }
  test::TempDir dir_;
};

TEST_F(CliExprAttend, PackedDocumentsEqualSegmentsAndCausal) {
  const std::string program =
      quoted("expr:(doc[b, q] == doc[b, kv]) & (q >= kv):doc=" + path("doc.npy"));
  const std::vector<float> structured =
      attend("--mask segments:" + path("doc.npy") + " --mask causal:top-left", "s.npy");
  ASSERT_FALSE(structured.empty());
  EXPECT_EQ(attend("--mask " + program, "p.npy"), structured);
  EXPECT_EQ(attend("--mask " + program + " --kernel reference", "pr.npy"),
            attend("--mask segments:" + path("doc.npy") +
                       " --mask causal:top-left --kernel "
                       "reference",
                   "sr.npy"));
}

TEST_F(CliExprAttend, GradOfAProgramMaskEqualsTheStructuredOne) {
  const auto grad = [&](const std::string& masks, const std::string& tag) {
    const test::CliResult result =
        run_cli("grad --q " + path("q.npy") + " --k " + path("k.npy") + " --v " + path("v.npy") +
                " --dout " + path("do.npy") + " --dq " + path(tag + "q.npy") + " --dk " +
                path(tag + "k.npy") + " --dv " + path(tag + "v.npy") + " " + masks);
    EXPECT_EQ(result.exit_code, 0) << masks << "\n" << result.err;
    std::vector<float> all;
    for (const char* which : {"q", "k", "v"}) {
      const std::string file = path(tag + which + ".npy");
      const std::vector<float> values = read_npy(file).to_float32(file);
      all.insert(all.end(), values.begin(), values.end());
    }
    return all;
  };
  EXPECT_EQ(
      grad("--mask " + quoted("expr:(doc[b, q] == doc[b, kv]) & (q >= kv):doc=" + path("doc.npy")),
           "p"),
      grad("--mask segments:" + path("doc.npy") + " --mask causal:top-left", "s"));
}

TEST_F(CliExprAttend, ModifiersGoToModAndStillToMask) {
  // --mod is where modifiers go; --mask has always taken them and still does, identically.
  const std::vector<float> softcap = attend("--mod softcap:3 --scale 2", "m.npy");
  ASSERT_FALSE(softcap.empty());
  EXPECT_EQ(attend("--mask softcap:3 --scale 2", "o.npy"), softcap);
  EXPECT_NE(attend("--scale 2", "n.npy"), softcap);
}

// Needs ScoreMods::program in the kernels' forward (on main as "program: score programs
// forward…"); until it is there the program is not applied and these fail.
TEST_F(CliExprAttend, ScoreProgramsEqualTheModifiersTheySpellOut) {
  const auto max_difference = [](const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size() || a.empty()) return INFINITY;
    float worst = 0;
    for (size_t n = 0; n < a.size(); ++n) worst = std::max(worst, std::fabs(a[n] - b[n]));
    return worst;
  };
  const std::vector<float> plain = attend("--scale 2", "plain.npy");
  const std::vector<float> softcap = attend("--mod softcap:3 --scale 2", "cap.npy");
  ASSERT_GT(max_difference(plain, softcap), 1e-3f);  // the cap matters for these scores
  // 3.0 * tanh(s / 3.0) is softcap:3 up to f32 rounding (the program's arithmetic is f32).
  EXPECT_LT(max_difference(attend("--mod " + quoted("expr:3.0 * tanh(s / 3.0)") + " --scale 2",
                                  "program_cap.npy"),
                           softcap),
            1e-5f);

  // ALiBi as a program over a float table of slopes, [Hq] = [1]; Lq == Lk, so row indices are
  // the positions ALiBi uses.
  write_npy(path("slopes.npy"), NpyArray::from_floats({0.5f}, {1}));
  const std::string slopes = path("slopes.npy");
  const std::vector<float> alibi = attend("--mask causal --mod alibi:" + slopes, "alibi.npy");
  EXPECT_LT(max_difference(attend("--mask causal --mod " +
                                      quoted("expr:s - slope[h] * abs(q - kv):slope=" + slopes),
                                  "program_alibi.npy"),
                           alibi),
            1e-5f);
}

TEST(CliExprAudit, AuditsAProgramAgainstTheMaskItMeans) {
  const test::CliResult passed =
      run_cli("audit --mask " + quoted("expr:q >= kv") + " --expect causal:top-left --lq 5 --lk 7");
  EXPECT_EQ(passed.exit_code, 0) << passed.err;
  EXPECT_TRUE(contains(passed.out, "audit: mask expr:q >= kv; expected causal:top-left"))
      << passed.out;
  EXPECT_TRUE(contains(passed.out, "audit: passed")) << passed.out;
  // Against bottom-right causal (Lq < Lk) the top-left program hides keys that one allows.
  const test::CliResult blind =
      run_cli("audit --mask " + quoted("expr:q >= kv") + " --expect causal --lq 5 --lk 7");
  EXPECT_EQ(blind.exit_code, 1);
  EXPECT_TRUE(contains(blind.out, "blind spots (hidden, but expected allowed):          10"))
      << blind.out;
}

TEST(CliExprGradcheck, AProgramMaskPasses) {
  const test::CliResult result = run_cli("gradcheck --mask " + quoted("expr:q >= kv"));
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "passed")) << result.out;
}

TEST(CliExprHelp, EveryCommandWithMaskTakesMod) {
  for (const char* command : {"attend", "grad", "gradcheck", "audit", "mha"}) {
    const test::CliResult help = run_cli(std::string(command) + " --help");
    EXPECT_EQ(help.exit_code, 0) << command;
    EXPECT_TRUE(contains(help.out, "--mod TEXT")) << command << "\n" << help.out;
    EXPECT_TRUE(contains(help.out, "expr:PROGRAM[:NAME=FILE]...")) << command;
  }
}

}  // namespace
}  // namespace maskattn
