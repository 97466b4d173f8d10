// The bad-input catalogue's rows for the CLI's expr: SPECs (docs/errors.md E130–E134), compiled
// into errors_test so that its catalogue check sees them. Each runs the maskattn binary.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "test_util.h"

namespace maskattn {
namespace {

// Valid q/k/v [1,3,4] f32 and a [3] int64 table doc; `attend` runs the CLI on them.
struct ExprFiles {
  test::TempDir dir;
  std::string doc = dir.path("doc.npy");
  ExprFiles() {
    write_npy(dir.path("q.npy"), NpyArray::from_floats(test::random_values(12, 9), {1, 3, 4}));
    write_npy(doc, NpyArray::from_int64({0, 0, 1}, {3}));
  }
  std::string attend(const std::string& flags) const {
    const std::string q = dir.path("q.npy");
    return "attend --q " + q + " --k " + q + " --v " + q + " --out " + dir.path("out.npy") + " " +
           flags;
  }
  std::string out() const { return dir.path("out.npy"); }
};

// The command must exit 1 with one line on stderr containing every part, and leave no `out`.
void expect_cli_error(const std::string& arguments, const std::vector<std::string>& parts,
                      const std::string& out = "") {
  const test::CliResult result = test::run_cli(arguments);
  EXPECT_EQ(result.exit_code, 1) << arguments << "\n" << result.err;
  EXPECT_EQ(result.err.rfind("maskattn: error: ", 0), 0u) << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  for (const std::string& part : parts) {
    EXPECT_NE(result.err.find(part), std::string::npos) << result.err << "\nmissing: " << part;
  }
  if (!out.empty()) {
    EXPECT_FALSE(std::filesystem::exists(out)) << out;
  }
}

// A SPEC for the shell: programs hold spaces, brackets, & and |.
std::string quoted(const std::string& spec) {
  return "'" + spec + "'";
}

TEST(Errors, E130_ExprSpecMalformed) {
  ExprFiles files;
  expect_cli_error(files.attend("--mask " + quoted("expr:q >= kv:doc")),
                   {"--mask expr:q >= kv:doc: table 'doc' is not NAME=FILE; after the program "
                    "each ':' starts a table, e.g. expr:doc[q] == doc[kv]:doc=doc.npy"},
                   files.out());
  expect_cli_error(files.attend("--mask " + quoted("expr:q >= kv:=" + files.doc)),
                   {"is not NAME=FILE"}, files.out());
  expect_cli_error(files.attend("--mod " + quoted("expr::doc=" + files.doc)),
                   {"--mod expr::doc=", "expr needs a program before its tables"}, files.out());
  expect_cli_error("mask expr --lq 2 --lk 2", {"expr: 'expr' needs an argument"});
}

// A .npy file of an unsupported dtype: complex64.
std::string complex_file(const test::TempDir& dir) {
  std::string header = "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }";
  header.append(128 - 10 - header.size() - 1, ' ');  // the data starts at byte 128
  header += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
  bytes += static_cast<char>(header.size());
  bytes += '\0';
  bytes += header + std::string(8, '\0');
  std::ofstream(dir.path("c.npy"), std::ios::binary) << bytes;
  return dir.path("c.npy");
}

TEST(Errors, E131_ExprTableFile) {
  ExprFiles files;
  expect_cli_error(files.attend("--mask " + quoted("expr:doc[q] > 0:doc=/nonexistent/doc.npy")),
                   {"--mask expr:doc[q] > 0:doc=/nonexistent/doc.npy: table doc: cannot open "
                    "'/nonexistent/doc.npy'"},
                   files.out());
  const std::string complex = complex_file(files.dir);
  expect_cli_error(
      files.attend("--mod " + quoted("expr:s + c[0]:c=" + complex)),
      {"--mod expr:s + c[0]:c=" + complex + ": table c: " + complex + ": unsupported dtype '<c8'"},
      files.out());
  const std::string four = files.dir.path("four.npy");
  write_npy(four, NpyArray::from_int64({1, 2}, {1, 1, 1, 2}));
  expect_cli_error(
      "mask " + quoted("expr:t[q, kv, 0] > 0:t=" + four) + " --lq 2 --lk 2",
      {"table t: " + four + " has shape [1,1,1,2]; a program table has 1 to 3 dimensions"});
}

TEST(Errors, E132_ExprProgramOfTheWrongKind) {
  ExprFiles files;
  expect_cli_error(files.attend("--mask " + quoted("expr:30.0 * tanh(s / 30.0)")),
                   {"--mask expr:30.0 * tanh(s / 30.0): `30.0 * tanh(s / 30.0)` is a score "
                    "program (a number), not a mask program (a bool); give score programs to "
                    "--mod"},
                   files.out());
  expect_cli_error(files.attend("--mod " + quoted("expr:q >= kv")),
                   {"--mod expr:q >= kv: `q >= kv` is a mask program (a bool), not a score "
                    "program (a number); give mask programs to --mask"},
                   files.out());
  expect_cli_error("mask " + quoted("expr:s * 2") + " --lq 2 --lk 2",
                   {"expr:s * 2: `s * 2` is a score program"});
  expect_cli_error(files.attend("--mod causal"),
                   {"--mod causal: 'causal' is a mask SPEC; give it to --mask (--mod takes "
                    "alibi, softcap, sinks, threshold, bias and expr)"},
                   files.out());
  expect_cli_error(files.attend("--mod softcab:3"),
                   {"--mod softcab:3: unknown kind 'softcab'; known modifiers: alibi, softcap, "
                    "sinks, threshold, bias, expr"},
                   files.out());
  expect_cli_error(files.attend("--mod " + quoted("expr:s") + " --mod " + quoted("expr:2 * s")),
                   {"--mod expr:2 * s: a second score program; a call takes one, so write both "
                    "in one expression"},
                   files.out());
}

TEST(Errors, E133_ExprLibraryErrorsNameTheSpec) {
  ExprFiles files;
  // Compile errors (E123–E125), with the SPEC in front.
  expect_cli_error(files.attend("--mask " + quoted("expr:(q >= kv")),
                   {"--mask expr:(q >= kv: program `(q >= kv`, column 9: syntax error: expected "
                    "')', found the end"},
                   files.out());
  expect_cli_error(files.attend("--mod " + quoted("expr:s + (q > kv)")),
                   {"--mod expr:s + (q > kv): program `s + (q > kv)`, column 3: '+' needs two "
                    "numbers (int64 or f32), got f32 and bool"},
                   files.out());
  const std::string doc_spec = "expr:doc[q, kv] == 0:doc=" + files.doc;
  expect_cli_error(files.attend("--mask " + quoted(doc_spec)),
                   {"--mask " + doc_spec +
                    ": program `doc[q, kv] == 0`, column 1: table doc[3] "
                    "takes 1 indices, got 2"},
                   files.out());
  // An index out of the table's range, found when the call checks or evaluates the program
  // (E126, E128): the library names the program, the CLI the SPEC it came from.
  const std::string beyond = "expr:doc[q + 1] == 0:doc=" + files.doc;
  expect_cli_error(files.attend("--mask " + quoted(beyond)),
                   {"--mask " + beyond + ": program `doc[q + 1] == 0`", "table doc"}, files.out());
  expect_cli_error("mask " + quoted(beyond) + " --lq 3 --lk 3",
                   {beyond + ": program `doc[q + 1] == 0`", "table doc"});
  expect_cli_error("audit --mask " + quoted(beyond) + " --lq 3 --lk 3",
                   {beyond + ": program `doc[q + 1] == 0`", "table doc"});
}

TEST(Errors, E134_IncrementalRefusesPrograms) {
  ExprFiles files;
  // A one-head layer of width 4: in_proj [12,4], out_proj [4,4].
  const std::string weights = files.dir.path("w");
  std::filesystem::create_directory(weights);
  write_npy(weights + "/in_proj_weight.npy",
            NpyArray::from_floats(test::random_values(48, 1), {12, 4}));
  write_npy(weights + "/out_proj.weight.npy",
            NpyArray::from_floats(test::random_values(16, 2), {4, 4}));
  const std::string mha = "mha --query " + files.dir.path("q.npy") + " --weights " + weights +
                          " --heads 1 --out " + files.out() + " --incremental ";
  expect_cli_error(mha + "--mask " + quoted("expr:q >= kv"),
                   {"--mask expr:q >= kv: --incremental runs one call per step, where a "
                    "program's q and kv are the step's row indices (q is always 0), not the "
                    "tokens' positions; run without --incremental, or use structured SPECs"},
                   files.out());
  expect_cli_error(mha + "--mod " + quoted("expr:s - abs(q - kv)"),
                   {"--mod expr:s - abs(q - kv): --incremental runs one call per step"},
                   files.out());
}

}  // namespace
}  // namespace maskattn
