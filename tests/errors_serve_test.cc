// The bad-input catalogue's rows for serving the GPT model (docs/errors.md E149–E153), compiled
// into errors_test so that its catalogue check sees them: the paged decoder, the serving loop,
// the requests that can never run, and `maskattn gpt serve`'s requests file.
#include <filesystem>
#include <fstream>

#include "maskattn/model/paged_decoder.h"
#include "maskattn/model/serve.h"
#include "test_util.h"

namespace maskattn {
namespace {

// The command fails with exit code 1 and one stderr line holding `message`.
void expect_serve_cli_error(const std::string& arguments, const std::string& message) {
  const test::CliResult result = test::run_cli(arguments);
  EXPECT_EQ(result.exit_code, 1) << arguments << "\n" << result.err;
  EXPECT_EQ(result.err.rfind("maskattn: error: ", 0), 0u) << result.err;
  EXPECT_NE(result.err.find(message), std::string::npos) << result.err << "\nmissing: " << message;
}

struct Model {
  model::GptParameters parameters;
  std::vector<float> values;
  Model() : parameters(config()), values(parameters.count()) {
    parameters.initialise(values.data(), 1);
  }
  static model::GptConfig config() {
    model::GptConfig c;
    c.vocab = 12;
    c.context = 40;
    c.layers = 1;
    c.d_model = 32;
    c.heads = 1;
    return c;
  }
  model::PagedGptDecoder decoder(int64_t blocks) const {
    model::PagedDecoderOptions options;
    options.blocks = blocks;
    options.threads = 1;
    return model::PagedGptDecoder(parameters, values.data(), options);
  }
};

// A tiny checkpoint and a requests file in `dir`.
std::string serve_checkpoint(const test::TempDir& dir) {
  std::string text;
  for (int n = 0; n < 20; ++n) text += "abc abc abc\n";
  std::ofstream(dir.path("text.txt")) << text;
  const test::CliResult trained = test::run_cli(
      "gpt train --text " + dir.path("text.txt") + " --out " + dir.path("model") +
      " --layers 1 --d-model 32 --heads 1 --context 16 --batch 2 --steps 1 --threads 1");
  EXPECT_EQ(trained.exit_code, 0) << trained.err;
  return dir.path("model");
}

std::string requests_file(const test::TempDir& dir, const std::string& name,
                          const std::string& text) {
  std::ofstream(dir.path(name)) << text;
  return dir.path(name);
}

// gpt eval's validation windows: E109's "a split shorter than one window" (the checkpoint's
// context against the text given).
TEST(Errors, E109_GptEvalText) {
  test::TempDir dir;
  const std::string model = serve_checkpoint(dir);
  std::ofstream(dir.path("short.txt")) << "abc abc\n";
  expect_serve_cli_error("gpt eval --model " + model + " --text " + dir.path("short.txt"),
                         "gpt eval: the validation split has 1 tokens, fewer than one window of "
                         "context + 1 = 17");
}

TEST(Errors, E149_PagedDecoderPool) {
  const Model m;
  EXPECT_MASKATTN_ERROR(m.decoder(0),
                        "PagedGptDecoder: the pool needs at least one block per layer, got 0");
  test::TempDir dir;
  const std::string model = serve_checkpoint(dir);
  const std::string requests = requests_file(dir, "r.jsonl", "{\"prompt\": \"abc\"}\n");
  expect_serve_cli_error(
      "gpt serve --model " + model + " --requests " + requests + " --pool-mib 0.001",
      "the pool needs at least one block per layer, got 0");
}

TEST(Errors, E150_PagedDecoderBatches) {
  const Model m;
  model::PagedGptDecoder decoder = m.decoder(2);
  const int64_t s = decoder.add_sequence();
  const std::vector<int32_t> tokens(40, 8);
  const std::vector<int32_t> outside = {8, 12};
  EXPECT_MASKATTN_ERROR(decoder.forward({}), "PagedGptDecoder::forward: the batch has no entries");
  EXPECT_MASKATTN_ERROR(decoder.forward({{7, tokens.data(), 1}}),
                        "entries[0] names sequence 7, which is not in the cache");
  EXPECT_MASKATTN_ERROR(decoder.forward({{s, tokens.data(), 1}, {s, tokens.data(), 1}}),
                        "entries[1] names sequence 0 again");
  EXPECT_MASKATTN_ERROR(decoder.forward({{s, tokens.data(), 0}}), "entries[0] has no tokens");
  EXPECT_MASKATTN_ERROR(decoder.forward({{s, outside.data(), 2}}),
                        "entries[0] token 1 = 12 is outside the vocabulary [0, 12)");
  EXPECT_MASKATTN_ERROR(decoder.forward({{s, tokens.data(), 33}}),
                        "the batch needs 3 more blocks but 2 of 2 are free");
  model::PagedGptDecoder roomy = m.decoder(4);
  const int64_t t = roomy.add_sequence();
  EXPECT_MASKATTN_ERROR(roomy.forward({{t, tokens.data(), 40}, {t + 1, tokens.data(), 1}}),
                        "entries[1] names sequence 1");
  roomy.forward({{t, tokens.data(), 40}});
  EXPECT_MASKATTN_ERROR(roomy.forward({{t, tokens.data(), 1}}),
                        "entries[0]: 1 tokens at position 40 pass the context of 40");
  EXPECT_MASKATTN_ERROR(roomy.free(5), "PagedGptDecoder::free: sequence 5 is not in the cache");
}

TEST(Errors, E151_ServerOptionsAndRequests) {
  const Model m;
  model::PagedGptDecoder decoder = m.decoder(4);
  model::ServeOptions options;
  options.max_batch = 0;
  EXPECT_MASKATTN_ERROR(
      model::Server(decoder, options),
      "Server: max_batch 0, token_budget 256 and prefill_chunk 64 must all be ≥ 1");
  options.max_batch = 4;
  options.token_budget = 32;
  EXPECT_MASKATTN_ERROR(model::Server(decoder, options),
                        "Server: prefill_chunk 64 exceeds token_budget 32");
  model::Server server(decoder, {});
  model::ServeRequest request;
  EXPECT_MASKATTN_ERROR(server.submit(request), "Server::submit: request 0 has an empty prompt");
  request.prompt = {8, 9};
  request.max_new_tokens = 0;
  EXPECT_MASKATTN_ERROR(server.submit(request), "max_new_tokens 0 must be ≥ 1");
  request.max_new_tokens = 4;
  request.arrival = -1;
  EXPECT_MASKATTN_ERROR(server.submit(request), "arrival -1 must be ≥ 0 (a step)");
  request.arrival = 0;
  request.temperature = -1;
  EXPECT_MASKATTN_ERROR(server.submit(request), "must be finite and ≥ 0");
  request.temperature = 0;
  request.prompt = {8, 20};
  EXPECT_MASKATTN_ERROR(server.submit(request),
                        "prompt token 1 = 20 is outside the vocabulary [0, 12)");
  EXPECT_MASKATTN_ERROR(server.cancel(3), "Server::cancel: request 3 was never submitted");
  test::TempDir dir;
  const std::string model = serve_checkpoint(dir);
  const std::string requests = requests_file(dir, "r.jsonl", "{\"prompt\": \"abc\"}\n");
  expect_serve_cli_error(
      "gpt serve --model " + model + " --requests " + requests + " --token-budget 32",
      "Server: prefill_chunk 64 exceeds token_budget 32");
}

TEST(Errors, E152_RequestsThatCanNeverRun) {
  const Model m;
  model::PagedGptDecoder decoder = m.decoder(2);
  model::Server server(decoder, {});
  model::ServeRequest request;
  request.prompt = std::vector<int32_t>(41, 8);
  server.submit(request);
  request.prompt = std::vector<int32_t>(20, 8);
  request.max_new_tokens = 20;
  server.submit(request);
  server.run();
  EXPECT_EQ(server.result(0).status, model::ServeStatus::failed);
  EXPECT_EQ(server.result(0).error,
            "request 0: its prompt of 41 tokens passes the model's context of 40");
  EXPECT_EQ(server.result(1).error,
            "request 1 needs 3 blocks of 16 positions (39 positions: prompt + max_new_tokens - 1, "
            "at most the context) but the pool has 2; it can never run");
  test::TempDir dir;
  const std::string model = serve_checkpoint(dir);
  const std::string requests = requests_file(
      dir, "r.jsonl", "{\"prompt\": \"abc abc abc abc abc\"}\n{\"prompt\": \"abc\"}\n");
  const test::CliResult result =
      test::run_cli("gpt serve --model " + model + " --requests " + requests + " --threads 1");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("\"status\": \"failed\", \"error\": \"request 0: its prompt of 19 "
                            "tokens passes the model's context of 16\""),
            std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("{\"id\": 1, \"line\": 2, \"status\": \"finished\""), std::string::npos)
      << result.out;
}

TEST(Errors, E153_ServeRequestsFile) {
  test::TempDir dir;
  const std::string model = serve_checkpoint(dir);
  const auto expect_file_error = [&](const std::string& text, const std::string& message) {
    const std::string requests = requests_file(dir, "bad.jsonl", text);
    expect_serve_cli_error("gpt serve --model " + model + " --requests " + requests, message);
  };
  expect_serve_cli_error("gpt serve --model " + model + " --requests " + dir.path("none.jsonl"),
                         "gpt serve: cannot read the requests file");
  expect_file_error("# nothing\n\n", "holds no request (one JSON object per line)");
  expect_file_error("{\"prompt\": \"abc\"}\n{\"prompt\" \"abc\"}\n",
                    "bad.jsonl line 2, column 11: expected ':'");
  expect_file_error("{\"prompt\": \"abc\", \"tokens\": 3}\n", "line 1: unknown field \"tokens\"");
  expect_file_error("{\"max_new_tokens\": 3}\n", "line 1: \"prompt\" must be a non-empty string");
  expect_file_error("{\"prompt\": \"abc\", \"max_new_tokens\": 2.5}\n",
                    "\"max_new_tokens\" must be an integer in [1, 1000000000]");
  expect_file_error("{\"prompt\": \"abc\", \"ignore_eos\": 1}\n",
                    "\"ignore_eos\" must be true or false");
  expect_file_error("{\"prompt\": \"abc\", \"prompt\": \"abd\"}\n",
                    "field \"prompt\" is given twice");
  expect_file_error("{\"prompt\": [1, 2]}\n",
                    "nested objects and arrays are not part of the format");
  expect_file_error("{\"prompt\": \"abc\"} x\n", "text after the object's closing '}'");
  expect_file_error("{\"prompt\": \"a\\qb\"}\n", "unknown escape \\q");
  const std::string requests = requests_file(dir, "r.jsonl", "{\"prompt\": \"abc\"}\n");
  expect_serve_cli_error(
      "gpt serve --model " + model + " --requests " + requests + " --pool-blocks 4 --pool-mib 1",
      "gpt serve: give --pool-blocks or --pool-mib, not both");
}

}  // namespace
}  // namespace maskattn
