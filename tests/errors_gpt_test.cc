// The bad-input catalogue's rows for the GPT model (docs/errors.md E109–E112), compiled into
// errors_test so that its catalogue check sees them: through the library and `maskattn gpt`.
#include <filesystem>
#include <fstream>

#include "maskattn/model/generate.h"
#include "maskattn/model/trainer.h"
#include "maskattn/npy.h"
#include "test_util.h"

namespace maskattn {
namespace {

// The command fails with exit code `exit_code` and one stderr line holding `message`.
void expect_gpt_cli_error(const std::string& arguments, const std::string& message,
                          int exit_code = 1) {
  const test::CliResult result = test::run_cli(arguments);
  EXPECT_EQ(result.exit_code, exit_code) << arguments << "\n" << result.err;
  EXPECT_EQ(result.err.rfind("maskattn: error: ", 0), 0u) << result.err;
  EXPECT_NE(result.err.find(message), std::string::npos) << result.err << "\nmissing: " << message;
}

// A tiny model trained for 2 steps into `dir`/model, on `dir`/text.txt.
std::string tiny_checkpoint(const test::TempDir& dir) {
  std::string text;
  for (int n = 0; n < 20; ++n) text += "abc abc abc\n";
  std::ofstream(dir.path("text.txt")) << text;
  const test::CliResult trained = test::run_cli(
      "gpt train --text " + dir.path("text.txt") + " --out " + dir.path("model") +
      " --layers 1 --d-model 8 --heads 2 --context 8 --batch 2 --steps 2 --threads 1");
  EXPECT_EQ(trained.exit_code, 0) << trained.err;
  return dir.path("model");
}

TEST(Errors, E109_GptText) {
  test::TempDir dir;
  std::ofstream(dir.path("empty.txt"));
  expect_gpt_cli_error("gpt train --out " + dir.path("m") + " --text " + dir.path("missing.txt"),
                       "gpt: cannot read the text file " + dir.path("missing.txt"));
  expect_gpt_cli_error("gpt train --out " + dir.path("m") + " --text " + dir.path("empty.txt"),
                       "gpt: the training text is empty");
  std::ofstream(dir.path("short.txt")) << "abc";
  expect_gpt_cli_error("gpt train --out " + dir.path("m") + " --text " + dir.path("short.txt") +
                           " --context 8 --steps 1",
                       "gpt: the text split has 2 characters, fewer than one window of context "
                       "+ 1 = 9; give more text or a smaller --context");
  std::ofstream(dir.path("long.txt")) << std::string(60, 'a');  // validation: 6 characters
  expect_gpt_cli_error("gpt train --out " + dir.path("m") + " --text " + dir.path("long.txt") +
                           " --context 8 --steps 1",
                       "gpt: the text split has 6 characters, fewer than one window");
  EXPECT_FALSE(std::filesystem::exists(dir.path("m") + "/config.txt"));
}

TEST(Errors, E110_GptModelSettings) {
  test::TempDir dir;
  std::ofstream(dir.path("text.txt")) << std::string(200, 'x');
  const std::string train = "gpt train --out " + dir.path("m") + " --text " + dir.path("text.txt");
  expect_gpt_cli_error(train + " --heads 3 --d-model 8",
                       "gpt: --heads 3 does not divide --d-model 8 (each head gets d_model / "
                       "heads dimensions)");
  expect_gpt_cli_error(train + " --layers 0", "--layers: Value 0 not in range 1 to 64", 2);
  expect_gpt_cli_error(train + " --resume", "holds no checkpoint (no config.txt)");
  model::GptConfig config;
  config.vocab = 10;
  config.layers = 0;
  EXPECT_MASKATTN_ERROR(model::GptParameters{config}, "gpt: --layers = 0 must be ≥ 1");
}

TEST(Errors, E111_GptCheckpoints) {
  test::TempDir dir;
  const std::string model = tiny_checkpoint(dir);
  const std::string generate = "gpt generate --model " + model + " --prompt abc --tokens 3";
  write_npy(model + "/transformer.h.0.ln_1.weight.npy",
            NpyArray::from_floats(std::vector<float>(4, 1.0f), {4}));
  expect_gpt_cli_error(generate,
                       "gpt: checkpoint tensor transformer.h.0.ln_1.weight has shape [4]; the "
                       "model needs [8]");
  std::filesystem::remove(model + "/transformer.h.0.ln_1.weight.npy");
  expect_gpt_cli_error(generate,
                       "gpt: checkpoint " + model + " has no transformer.h.0.ln_1.weight.npy");
  expect_gpt_cli_error("gpt generate --model " + dir.path("none") + " --prompt abc",
                       "gpt: " + dir.path("none") + " is not a checkpoint (no config.txt)");
  std::ofstream(model + "/config.txt") << "vocab ten\n";
  expect_gpt_cli_error(generate, "config.txt holds a value that is not a number");
}

TEST(Errors, E112_GptBatchesAndPrompts) {
  model::GptConfig config;
  config.vocab = 9;
  config.context = 4;
  config.layers = 1;
  config.d_model = 4;
  config.heads = 1;
  const model::GptParameters parameters(config);
  std::vector<float> values(parameters.count());
  parameters.initialise(values.data(), 1);
  model::Gpt gpt(parameters, true);
  const std::vector<int32_t> five = {7, 8, 7, 8, 7}, ignore(5, model::kIgnoreTarget);
  EXPECT_MASKATTN_ERROR(
      gpt.loss_and_gradients(values.data(), {five.data(), ignore.data(), 1, 5, -1}, nullptr, 1),
      "gpt: a batch of length 5 exceeds the model's context of 4");
  const std::vector<int32_t> outside = {7, 9};
  EXPECT_MASKATTN_ERROR(
      gpt.loss_and_gradients(values.data(), {outside.data(), ignore.data(), 1, 2, -1}, nullptr, 1),
      "gpt: token 9 at flat index 1 is outside the vocabulary [0, 9)");
  const std::vector<int32_t> bad_target = {7, 8};
  const std::vector<int32_t> targets = {8, 12};
  EXPECT_MASKATTN_ERROR(
      gpt.loss_and_gradients(values.data(), {bad_target.data(), targets.data(), 1, 2, -1}, nullptr,
                             1),
      "gpt: target 12 at flat index 1 is outside the vocabulary and not the ignore value -1");
  model::GptDecoder decoder(parameters, values.data(), 1);
  EXPECT_MASKATTN_ERROR(model::generate(decoder, {}, {}), "gpt: the prompt is empty");
  decoder.feed({7, 8, 7, 8});
  EXPECT_MASKATTN_ERROR(decoder.feed({7}),
                        "gpt: feeding 1 tokens at position 4 passes the context of 4");
  test::TempDir dir;
  const std::string model = tiny_checkpoint(dir);
  expect_gpt_cli_error("gpt generate --model " + model + " --prompt ''",
                       "gpt: the prompt is empty; give at least one character");
}

}  // namespace
}  // namespace maskattn
