// `maskattn gpt` as a separate process: the ablation on a small run shows the look-ahead mask's
// reason to exist (direction and margins, on Debian's licence texts), training writes a checkpoint
// PyTorch-style and generation continues a prompt, saying what it did with unknown characters and
// a prompt longer than the context.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include "maskattn/model/text_data.h"
#include "test_util.h"

namespace maskattn {
namespace {

// The two numbers of the ablation table's row that starts with `row`.
std::pair<double, double> table_row(const std::string& out, const std::string& row) {
  const std::regex pattern("\\| " + row + "[^|]*\\| ([0-9.]+)[^|]*\\| ([0-9.]+)");
  std::smatch match;
  EXPECT_TRUE(std::regex_search(out, match, pattern)) << "no row '" << row << "' in\n" << out;
  if (match.empty()) return {0, 0};
  return {std::stod(match[1]), std::stod(match[2])};
}

TEST(CliGpt, AblationShowsWhyTheLookAheadMaskExists) {
  if (!std::filesystem::is_directory(model::kDefaultCorpusDirectory)) {
    GTEST_SKIP() << "NOT TESTED: no " << model::kDefaultCorpusDirectory << " on this system";
  }
  test::TempDir dir;
  // A small run (about 6 s on two cores) in which the unmasked model finds the copy. The
  // sanitizer pass repeats only 60 steps of it, for memory safety: the claim is the release
  // pass's (the same arithmetic), and 600 steps cost it 45 s.
#if defined(__SANITIZE_ADDRESS__)
  const bool claim = false;
#else
  const bool claim = true;
#endif
  const test::CliResult result =
      test::run_cli("gpt ablate --out " + dir.path("ablation") +
                    " --layers 1 --d-model 64 --heads 2 --context 32 --lr 5e-3 --threads 2" +
                    (claim ? " --steps 600" : " --steps 60"));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  for (const char* file : {"loss_curves.png", "attention_causal.png", "attention_none.png",
                           "causal/config.txt", "none/transformer.wte.weight.npy"}) {
    EXPECT_TRUE(std::filesystem::exists(dir.path("ablation/") + file)) << file;
  }
  if (!claim) return;
  const auto [causal_train, none_train] = table_row(result.out, "training loss, as trained");
  const auto [causal_valid, none_valid] = table_row(result.out, "validation loss under the causal");
  const auto [causal_copy, none_copy] = table_row(result.out, "mean weight on key i\\+1");
  // Without the mask the model copies the next token: its training loss collapses, and under
  // the causal mask (how text is generated) it does worse than the masked model by a wide margin,
  // and worse than its own training loss.
  EXPECT_LT(none_train, 0.5 * causal_train) << result.out;
  EXPECT_GT(none_valid, causal_valid + 1.0) << result.out;
  EXPECT_GT(none_valid, none_train + 2.0) << result.out;
  EXPECT_GT(none_copy, 0.5) << result.out;
  EXPECT_EQ(causal_copy, 0.0) << result.out;  // key i+1 is hidden from the masked model
}

TEST(CliGpt, TrainResumeAndGenerate) {
  test::TempDir dir;
  std::string text;
  for (int n = 0; n < 40; ++n) text += "the cat sat on the mat. the dog sat on the log.\n";
  std::ofstream(dir.path("text.txt")) << text;
  const std::string train = "gpt train --text " + dir.path("text.txt") + " --out " +
                            dir.path("model") +
                            " --layers 1 --d-model 16 --heads 2 --context 16 --batch 4 --threads 1";
  const test::CliResult trained = test::run_cli(train + " --steps 20");
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  EXPECT_NE(trained.out.find("final training loss"), std::string::npos) << trained.out;
  for (const char* file : {"transformer.wte.weight.npy", "lm_head.weight.npy",
                           "transformer.h.0.attn.c_attn.weight.npy", "loss.csv"}) {
    EXPECT_TRUE(std::filesystem::exists(dir.path("model/") + file)) << file;
  }
  // --resume continues to the checkpoint's own step count (20): nothing left to do, but the log
  // keeps its 20 steps and a header.
  const test::CliResult resumed = test::run_cli(train + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  std::ifstream log(dir.path("model/loss.csv"));
  int64_t lines = 0;
  for (std::string line; std::getline(log, line);) ++lines;
  EXPECT_EQ(lines, 21);

  const test::CliResult generated =
      test::run_cli("gpt generate --model " + dir.path("model") +
                    " --prompt 'the cat Z' --tokens 10 --temperature 0");
  ASSERT_EQ(generated.exit_code, 0) << generated.err;
  EXPECT_EQ(generated.out.rfind("the cat Z", 0), 0u) << generated.out;
  EXPECT_NE(generated.err.find("1 prompt character(s) not in the vocabulary became <unk>"),
            std::string::npos)
      << generated.err;
  EXPECT_NE(generated.err.find("through the KV cache"), std::string::npos) << generated.err;
  const test::CliResult long_prompt =
      test::run_cli("gpt generate --model " + dir.path("model") + " --prompt '" +
                    std::string(20, 't') + "' --tokens 5");
  ASSERT_EQ(long_prompt.exit_code, 0) << long_prompt.err;
  EXPECT_NE(long_prompt.err.find("the prompt is longer than the context of 16; its first 4 "
                                 "character(s) were dropped"),
            std::string::npos)
      << long_prompt.err;
}

// gpt serve: the results file holds one JSON line per request in submission order, the served
// tokens equal the request run alone (greedy and sampled), the progress line and the summary go
// to stderr; gpt eval prints the paged loss beside the training forward's and a greedy sample.
TEST(CliGpt, ServeAndEval) {
  test::TempDir dir;
  std::string text;
  for (int n = 0; n < 40; ++n) text += "the cat sat on the mat. the dog sat on the log.\n";
  std::ofstream(dir.path("text.txt")) << text;
  const test::CliResult trained = test::run_cli(
      "gpt train --text " + dir.path("text.txt") + " --out " + dir.path("model") +
      " --layers 1 --d-model 32 --heads 1 --context 48 --batch 4 --threads 1 --steps 10");
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const std::string requests[] = {
      R"({"prompt": "the cat", "max_new_tokens": 12})",
      R"({"prompt": "the dog sat on the log. the", "max_new_tokens": 20, "arrival": 3})",
      R"({"prompt": "a mat", "max_new_tokens": 9, "temperature": 0.9, "seed": 5, "ignore_eos": true})",
      R"({"prompt": "the log", "max_new_tokens": 30, "cancel_at": 4})"};
  std::ofstream all(dir.path("all.jsonl"));
  for (const std::string& line : requests) all << line << "\n";
  all.close();
  const std::string serve = "gpt serve --model " + dir.path("model") +
                            " --threads 1 --kv-format int8 " +
                            "--max-batch 2 --token-budget 24 --prefill-chunk 16 --requests ";
  const test::CliResult served =
      test::run_cli(serve + dir.path("all.jsonl") + " --out " + dir.path("results.jsonl"));
  ASSERT_EQ(served.exit_code, 0) << served.err;
  EXPECT_TRUE(served.out.empty()) << served.out;
  EXPECT_TRUE(std::regex_search(served.err, std::regex("step [0-9]+  waiting [0-9]+  running [0-9]+"
                                                       "  done 4/4  [0-9]+ tok/s  blocks 0/")))
      << served.err;
  EXPECT_NE(served.err.find("cancelled"), std::string::npos) << served.err;
  std::ifstream results(dir.path("results.jsonl"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(results, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_NE(lines[3].find("\"status\": \"cancelled\""), std::string::npos) << lines[3];
  for (int n = 0; n < 3; ++n) {
    EXPECT_EQ(lines[n].rfind("{\"id\": " + std::to_string(n) + ", \"line\": " +
                                 std::to_string(n + 1) + ", \"status\": \"finished\"",
                             0),
              0u)
        << lines[n];
    std::ofstream(dir.path("one.jsonl")) << requests[n] << "\n";
    const test::CliResult alone = test::run_cli(serve + dir.path("one.jsonl"));
    ASSERT_EQ(alone.exit_code, 0) << alone.err;
    const auto tokens = [](const std::string& line) {
      return line.substr(line.find("\"text\""),
                         line.find("\"admitted_step\"") - line.find("\"text\""));
    };
    EXPECT_EQ(tokens(alone.out), tokens(lines[n])) << alone.out << "\n" << lines[n];
  }
  const test::CliResult eval =
      test::run_cli("gpt eval --model " + dir.path("model") + " --text " + dir.path("text.txt") +
                    " --kv-format q4 --windows 3 --tokens 10 --threads 1");
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  EXPECT_TRUE(std::regex_search(
      eval.out, std::regex("validation loss [0-9.]+ through the paged KV cache \\(q4, blocks of "
                           "16, prefill chunks of 64\\), 3 windows of 48 tokens\n"
                           "validation loss [0-9.]+ through the training forward \\(f32, no "
                           "cache\\): [-+][0-9.]+ %\ngreedy: .*\\|.*\n")))
      << eval.out;
}

}  // namespace
}  // namespace maskattn
