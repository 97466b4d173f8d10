// Serving the GPT model (maskattn/model/paged_decoder.h, serve.h): the paged decoder against the
// contiguous decoder and the training forward; a token's bits independent of the batch it ran in
// (every cache format); the continuous-batching loop's results equal to each request run alone;
// its limits, admission order, cancellation, the requests that can never run; and 1,000 requests
// with random arrivals, lengths and cancellations that leave the pool empty.
#include <algorithm>
#include <cstring>

#include "core/splitmix64.h"
#include "maskattn/model/generate.h"
#include "maskattn/model/gpt.h"
#include "maskattn/model/paged_decoder.h"
#include "maskattn/model/serve.h"
#include "maskattn/tokens.h"
#include "test_util.h"

namespace maskattn {
namespace {

using model::GptConfig;
using model::GptParameters;
using model::PagedDecoderOptions;
using model::PagedEntry;
using model::PagedGptDecoder;
using model::ServeOptions;
using model::Server;
using model::ServeRequest;
using model::ServeStatus;

// A model with nanoGPT's initialisation plus noise, so that logits differ clearly between tokens.
struct TinyModel {
  GptParameters parameters;
  std::vector<float> values;
  explicit TinyModel(const GptConfig& config, uint64_t seed = 3) : parameters(config) {
    values.resize(parameters.count());
    parameters.initialise(values.data(), seed);
    const std::vector<float> noise = test::random_values(values.size(), seed + 1);
    for (size_t n = 0; n < values.size(); ++n) values[n] += 0.2f * noise[n];
  }
  PagedGptDecoder decoder(int64_t blocks, KVFormat format = KVFormat::f32, int threads = 1,
                          int64_t block_size = 16) const {
    PagedDecoderOptions options;
    options.blocks = blocks;
    options.block_size = block_size;
    options.format = format;
    options.threads = threads;
    return PagedGptDecoder(parameters, values.data(), options);
  }
};

GptConfig config(int64_t context = 96, int64_t layers = 2, int64_t d_model = 64,
                 int64_t heads = 2) {
  GptConfig c;
  c.vocab = 23;
  c.context = context;
  c.layers = layers;
  c.d_model = d_model;
  c.heads = heads;
  return c;
}

std::vector<int32_t> random_tokens(int64_t count, uint64_t seed, int64_t vocab = 23) {
  detail::SplitMix64 draws(seed);
  std::vector<int32_t> tokens(count);
  for (int32_t& t : tokens) t = static_cast<int32_t>(draws.between(7, vocab - 1));
  return tokens;
}

bool same_bits(const float* a, const float* b, int64_t count) {
  return std::memcmp(a, b, count * sizeof(float)) == 0;
}

// ---- the paged decoder --------------------------------------------------------------------

TEST(PagedDecoder, MatchesTheContiguousDecoder) {
  const TinyModel m(config());
  PagedGptDecoder paged = m.decoder(32);
  model::GptDecoder contiguous(m.parameters, m.values.data(), 1);
  const std::vector<int32_t> prompt = random_tokens(21, 5);
  const int64_t sequence = paged.add_sequence();
  std::vector<float> expected = contiguous.feed(prompt);
  std::vector<float> got = paged.forward({{sequence, prompt.data(), 21}});
  EXPECT_LE(test::max_error(got, expected), 1e-5f);
  for (int32_t token : random_tokens(12, 6)) {
    expected = contiguous.feed({token});
    got = paged.forward({{sequence, &token, 1}});
    EXPECT_LE(test::max_error(got, expected), 1e-5f);
  }
  EXPECT_EQ(paged.length(sequence), 33);
  EXPECT_EQ(paged.blocks_in_use(), 3);
}

TEST(PagedDecoder, AllRowLogitsMatchTheTrainingForward) {
  const TinyModel m(config(48));
  const std::vector<int32_t> tokens = random_tokens(48, 7);
  model::Gpt gpt(m.parameters, true);
  const std::vector<int32_t> ignore(48, model::kIgnoreTarget);
  gpt.loss_and_gradients(m.values.data(), {tokens.data(), ignore.data(), 1, 48, -1}, nullptr, 1);
  PagedGptDecoder paged = m.decoder(8);
  const int64_t sequence = paged.add_sequence();
  std::vector<float> got;
  for (int64_t first = 0; first < 48; first += 20) {  // pieces of 20, 20 and 8
    const int64_t count = std::min<int64_t>(20, 48 - first);
    const std::vector<float>& rows =
        paged.forward({{sequence, tokens.data() + first, count}}, true);
    got.insert(got.end(), rows.begin(), rows.end());
  }
  EXPECT_LE(test::max_error(got, gpt.logits()), 1e-5f);
}

// Sequence A fed in pieces (16, 16, 5, then one token at a time), alone and beside other
// sequences whose pieces are longer, shorter or of the other kernel class: A's logits keep every
// bit, in every cache format and for 1 and 2 threads.
TEST(PagedDecoder, ATokensBitsDoNotDependOnItsBatch) {
  const TinyModel m(config());
  const std::vector<int32_t> a = random_tokens(45, 11), b = random_tokens(80, 12);
  const std::vector<int64_t> pieces = {16, 16, 5, 1, 1, 1, 1, 1, 1, 1, 1};
  for (const KVFormat format : {KVFormat::f32, KVFormat::bf16, KVFormat::int8, KVFormat::q4}) {
    std::vector<std::vector<float>> alone;
    {
      PagedGptDecoder decoder = m.decoder(32, format);
      const int64_t s = decoder.add_sequence();
      int64_t fed = 0;
      for (const int64_t piece : pieces) {
        alone.push_back(decoder.forward({{s, a.data() + fed, piece}}));
        fed += piece;
      }
    }
    for (const int threads : {1, 2}) {
      PagedGptDecoder decoder = m.decoder(32, format, threads);
      const int64_t other = decoder.add_sequence(), s = decoder.add_sequence();
      const int64_t third = decoder.add_sequence();
      int64_t fed = 0, other_fed = 0;
      for (size_t n = 0; n < pieces.size(); ++n) {
        // The neighbours: a long piece, a short one, or both, varying from step to step.
        const int64_t other_piece = std::vector<int64_t>{40, 3, 1, 9, 2, 1, 1, 1, 1, 1, 1}[n];
        std::vector<PagedEntry> entries = {{other, b.data() + other_fed, other_piece},
                                           {s, a.data() + fed, pieces[n]}};
        if (n % 2 == 1) entries.push_back({third, b.data() + n, 1 + static_cast<int64_t>(n % 3)});
        const std::vector<float>& logits = decoder.forward(entries);
        EXPECT_TRUE(same_bits(logits.data() + 23, alone[n].data(), 23))
            << kv_format_name(format) << " threads " << threads << " piece " << n;
        fed += pieces[n];
        other_fed += other_piece;
      }
    }
  }
}

TEST(PagedDecoder, AFailedForwardChangesNothing) {
  const TinyModel m(config());
  PagedGptDecoder decoder = m.decoder(4);
  const int64_t s = decoder.add_sequence(), t = decoder.add_sequence();
  const std::vector<int32_t> tokens = random_tokens(40, 13);
  decoder.forward({{s, tokens.data(), 20}});
  std::vector<int32_t> bad = tokens;
  bad[30] = 23;
  EXPECT_THROW(decoder.forward({{t, tokens.data(), 10}, {s, bad.data() + 20, 20}}), Error);
  EXPECT_THROW(decoder.forward({{t, tokens.data(), 40}, {s, tokens.data(), 20}}), Error);
  EXPECT_EQ(decoder.length(s), 20);
  EXPECT_EQ(decoder.length(t), 0);
  EXPECT_EQ(decoder.blocks_in_use(), 2);
  // A value the cache cannot store (a diverged model) rolls every layer back.
  TinyModel broken(config());
  broken.values[broken.parameters.block(1).c_attn_bias + 64] = INFINITY;  // layer 1's k bias
  PagedGptDecoder failing = broken.decoder(4, KVFormat::int8);
  const int64_t u = failing.add_sequence();
  EXPECT_THROW(failing.forward({{u, tokens.data(), 5}}), Error);
  EXPECT_EQ(failing.length(u), 0);
  for (int64_t l = 0; l < 2; ++l) EXPECT_EQ(failing.cache(l).length(u), 0);
  EXPECT_EQ(failing.blocks_in_use(), 0);
}

// ---- the serving loop ------------------------------------------------------------------------

std::vector<ServeRequest> random_requests(int64_t count, uint64_t seed, int64_t max_prompt,
                                          int64_t max_new, int64_t last_arrival) {
  detail::SplitMix64 draws(seed);
  std::vector<ServeRequest> requests(count);
  for (int64_t n = 0; n < count; ++n) {
    ServeRequest& r = requests[n];
    r.prompt = random_tokens(draws.between(1, max_prompt), seed * 1000 + n);
    r.max_new_tokens = draws.between(1, max_new);
    r.arrival = draws.between(0, last_arrival);
    r.temperature = n % 3 == 0 ? 0.8 : 0.0;
    r.seed = 100 + n;
  }
  return requests;
}

TEST(Server, ServedRequestsEqualEachRunAlone) {
  const TinyModel m(config());
  const std::vector<ServeRequest> requests = random_requests(14, 21, 70, 40, 12);
  ServeOptions options;
  options.max_batch = 5;
  options.token_budget = 40;
  options.prefill_chunk = 16;
  for (const KVFormat format : {KVFormat::f32, KVFormat::int8}) {
    PagedGptDecoder decoder = m.decoder(40, format, 2);
    Server server(decoder, options);
    for (const ServeRequest& r : requests) server.submit(r);
    server.run();
    for (size_t n = 0; n < requests.size(); ++n) {
      PagedGptDecoder own = m.decoder(40, format);
      Server alone(own, options);
      ServeRequest r = requests[n];
      r.arrival = 0;
      alone.submit(r);
      alone.run();
      EXPECT_EQ(server.result(n).status, ServeStatus::finished);
      EXPECT_EQ(server.result(n).tokens, alone.result(0).tokens)
          << kv_format_name(format) << " request " << n;
      EXPECT_EQ(server.result(n).reason, alone.result(0).reason);
    }
    EXPECT_EQ(decoder.blocks_in_use(), 0);
  }
}

}  // namespace
}  // namespace maskattn
