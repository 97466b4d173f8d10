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

// Entries of more than 8 tokens share one tile-kernel call: random neighbours (longer or shorter
// pieces, longer or shorter sequences) change no bit of A's logits.
TEST(PagedDecoder, LongEntriesKeepTheirBitsBesideAnyNeighbours) {
  const TinyModel m(config(160));
  const std::vector<int32_t> a = random_tokens(150, 31);
  detail::SplitMix64 draws(32);
  for (int trial = 0; trial < 6; ++trial) {
    std::vector<int64_t> pieces;
    for (int64_t fed = 0; fed + 30 <= 150;) {
      pieces.push_back(draws.between(9, 30));
      fed += pieces.back();
    }
    PagedGptDecoder alone = m.decoder(64), batched = m.decoder(64);
    const int64_t s = alone.add_sequence();
    std::vector<int64_t> others;
    for (int n = 0; n < 3; ++n) others.push_back(batched.add_sequence());
    const int64_t t = batched.add_sequence();
    int64_t fed = 0;
    for (const int64_t piece : pieces) {
      const std::vector<float> expected = alone.forward({{s, a.data() + fed, piece}});
      std::vector<PagedEntry> entries;
      std::vector<std::vector<int32_t>> neighbour_tokens;
      for (const int64_t other : others) {
        const int64_t room = 160 - batched.length(other);
        const int64_t count = std::min<int64_t>(draws.between(9, 50), room);
        if (count < 9) continue;
        neighbour_tokens.push_back(random_tokens(count, draws.next()));
        entries.push_back({other, neighbour_tokens.back().data(), count});
      }
      entries.insert(entries.begin() + static_cast<std::ptrdiff_t>(draws.below(entries.size() + 1)),
                     {t, a.data() + fed, piece});
      const std::vector<float>& logits = batched.forward(entries);
      size_t at = 0;
      while (entries[at].sequence != t) ++at;
      EXPECT_TRUE(same_bits(logits.data() + at * 23, expected.data(), 23))
          << "trial " << trial << " at " << fed;
      fed += piece;
    }
  }
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

// Every step stays within max_batch and the token budget, the pool is never over-committed,
// requests are admitted first come first served, and the pool ends empty.
TEST(Server, StepsKeepTheirLimitsAndAdmitInArrivalOrder) {
  const TinyModel m(config());
  PagedGptDecoder decoder = m.decoder(20);
  ServeOptions options;
  options.max_batch = 3;
  options.token_budget = 20;
  options.prefill_chunk = 16;
  Server server(decoder, options);
  const std::vector<ServeRequest> requests = random_requests(25, 41, 90, 30, 40);
  for (const ServeRequest& r : requests) server.submit(r);
  int64_t steps = 0;
  while (!server.idle()) {
    const model::ServeStep step = server.step();
    EXPECT_LE(step.entries, 3);
    EXPECT_LE(step.tokens, 20);
    EXPECT_LE(step.running, 3);
    EXPECT_LE(step.blocks_in_use, 20);
    EXPECT_EQ(step.done + step.running + step.waiting, 25);
    ASSERT_LT(++steps, 10000);
  }
  EXPECT_LE(server.peak_blocks_in_use(), 20);
  EXPECT_EQ(decoder.blocks_in_use(), 0);
  EXPECT_TRUE(decoder.cache(0).live_sequences().empty());
  std::vector<int64_t> order(25);
  for (int64_t n = 0; n < 25; ++n) order[n] = n;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return requests[x].arrival < requests[y].arrival; });
  for (size_t n = 0; n < order.size(); ++n) {
    const model::ServeResult& result = server.result(order[n]);
    EXPECT_EQ(result.status, ServeStatus::finished) << order[n];
    EXPECT_GE(result.admitted_step, requests[order[n]].arrival);
    if (n > 0) {
      EXPECT_GE(result.admitted_step, server.result(order[n - 1]).admitted_step);
    }
  }
}

TEST(Server, CancelledRequestsFreeTheirBlocksAndKeepAPrefix) {
  const TinyModel m(config());
  PagedGptDecoder decoder = m.decoder(30);
  Server server(decoder, {});
  std::vector<ServeRequest> requests = random_requests(4, 51, 20, 40, 0);
  for (ServeRequest& r : requests) {
    r.max_new_tokens = 40;
    r.stop_at_eos = false;
  }
  requests[1].cancel_at = 10;  // while decoding
  requests[2].cancel_at = 0;   // before it runs
  requests[3].arrival = 50;
  requests[3].cancel_at = 20;  // before it arrives
  for (const ServeRequest& r : requests) server.submit(r);
  for (int n = 0; n < 11; ++n) server.step();
  EXPECT_EQ(server.result(1).status, ServeStatus::cancelled);
  EXPECT_EQ(server.running(), 1);
  EXPECT_EQ(decoder.blocks_in_use(), decoder.blocks_for(decoder.length(0)));
  server.run();
  EXPECT_EQ(server.result(2).status, ServeStatus::cancelled);
  EXPECT_TRUE(server.result(2).tokens.empty());
  EXPECT_EQ(server.result(3).status, ServeStatus::cancelled);
  EXPECT_EQ(server.result(0).status, ServeStatus::finished);
  EXPECT_EQ(server.result(0).tokens.size(), 40u);
  // The cancelled request's tokens are the first ones of its uncancelled run.
  PagedGptDecoder own = m.decoder(30);
  Server alone(own, {});
  requests[1].cancel_at = -1;
  alone.submit(requests[1]);
  alone.run();
  const std::vector<int32_t>& all = alone.result(0).tokens;
  const std::vector<int32_t>& some = server.result(1).tokens;
  ASSERT_FALSE(some.empty());
  ASSERT_LT(some.size(), all.size());
  EXPECT_TRUE(std::equal(some.begin(), some.end(), all.begin()));
  // Server::cancel: now, before the next step.
  Server later(own, {});
  const int64_t id = later.submit(requests[0]);
  later.step();
  later.cancel(id);
  later.step();
  EXPECT_EQ(later.result(id).status, ServeStatus::cancelled);
  EXPECT_EQ(own.blocks_in_use(), 0);
}

TEST(Server, RequestsThatCanNeverRunFailAndTheOthersFinish) {
  const TinyModel m(config(96));
  PagedGptDecoder decoder = m.decoder(4);  // 64 positions
  Server server(decoder, {});
  std::vector<ServeRequest> requests = random_requests(3, 61, 10, 10, 0);
  requests[1].prompt = random_tokens(50, 62);
  requests[1].max_new_tokens = 20;  // 69 positions: 5 blocks
  ServeRequest too_long = requests[0];
  too_long.prompt = random_tokens(97, 63);  // longer than the context
  requests.push_back(too_long);
  for (const ServeRequest& r : requests) server.submit(r);
  server.run();
  EXPECT_EQ(server.result(0).status, ServeStatus::finished);
  EXPECT_EQ(server.result(2).status, ServeStatus::finished);
  EXPECT_EQ(server.result(1).status, ServeStatus::failed);
  EXPECT_NE(server.result(1).error.find("needs 5 blocks"), std::string::npos);
  EXPECT_EQ(server.result(3).status, ServeStatus::failed);
  EXPECT_NE(server.result(3).error.find("passes the model's context of 96"), std::string::npos);
  EXPECT_EQ(decoder.blocks_in_use(), 0);
}

TEST(Server, StopsAtMaxNewTokensTheContextAndEos) {
  TinyModel m(config(40));
  PagedGptDecoder decoder = m.decoder(16);
  Server server(decoder, {});
  ServeRequest r;
  r.prompt = random_tokens(35, 71);
  r.max_new_tokens = 20;
  server.submit(r);  // 40 − 35 + 1 = 6 tokens fit the context
  r.max_new_tokens = 6;
  server.submit(r);
  r.prompt.resize(10);
  server.submit(r);
  server.run();
  EXPECT_EQ(server.result(0).tokens.size(), 6u);
  EXPECT_EQ(server.result(0).reason, model::FinishReason::context);
  EXPECT_EQ(server.result(1).tokens, server.result(0).tokens);
  EXPECT_EQ(server.result(1).reason, model::FinishReason::length);
  EXPECT_EQ(server.result(2).tokens.size(), 6u);
  // A head that always prefers <eos>: ln_f outputs its bias, the <eos> row points along it.
  const int64_t E = 64;
  for (int64_t n = 0; n < E; ++n) {
    m.values[m.parameters.ln_f_weight() + n] = 0.0f;
    m.values[m.parameters.ln_f_bias() + n] = 1.0f;
    m.values[m.parameters.wte() + kEosId * E + n] = 1.0f;
  }
  PagedGptDecoder eos_decoder = m.decoder(16);
  Server eos(eos_decoder, {});
  eos.submit(r);
  r.stop_at_eos = false;
  eos.submit(r);
  eos.run();
  EXPECT_EQ(eos.result(0).reason, model::FinishReason::eos);
  EXPECT_TRUE(eos.result(0).tokens.empty());
  EXPECT_EQ(eos.result(1).tokens.size(), 6u);
  for (const int32_t token : eos.result(1).tokens) EXPECT_GE(token, 7);
}

// The load test (also under ASan): 1,000 requests with random arrivals, prompt and generation
// lengths, some cancelled while waiting or running, some too large for the pool, through a small
// pool that keeps requests waiting. Every request ends, nothing leaks, the pool ends empty.
TEST(Server, ThousandRequestsUnderLoadLeakNoBlock) {
  const TinyModel m(config(512, 1, 32, 1));
  PagedGptDecoder decoder = m.decoder(24, KVFormat::int8);
  ServeOptions options;
  options.max_batch = 12;
  options.token_budget = 48;
  options.prefill_chunk = 16;
  Server server(decoder, options);
  std::vector<ServeRequest> requests = random_requests(1000, 81, 60, 30, 1500);
  detail::SplitMix64 draws(82);
  for (ServeRequest& r : requests) {
    if (draws.below(5) == 0) r.cancel_at = r.arrival + draws.between(0, 40);
    if (draws.below(50) == 0) r.max_new_tokens = 400;  // more than the pool's 24 blocks of 16
  }
  for (const ServeRequest& r : requests) server.submit(r);
  int64_t steps = 0, failed = 0, cancelled = 0;
  while (!server.idle()) {
    const model::ServeStep step = server.step();
    ASSERT_LE(step.blocks_in_use, 24);
    ASSERT_LE(step.tokens, 48);
    ASSERT_LT(++steps, 100000);
  }
  for (int64_t n = 0; n < 1000; ++n) {
    const model::ServeResult& result = server.result(n);
    ASSERT_NE(result.status, ServeStatus::waiting);
    ASSERT_NE(result.status, ServeStatus::running);
    failed += result.status == ServeStatus::failed;
    cancelled += result.status == ServeStatus::cancelled;
    EXPECT_LE(static_cast<int64_t>(result.tokens.size()), requests[n].max_new_tokens);
    if (result.status == ServeStatus::finished && result.reason == model::FinishReason::length) {
      EXPECT_EQ(static_cast<int64_t>(result.tokens.size()), requests[n].max_new_tokens);
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_GT(cancelled, 100);
  EXPECT_EQ(server.done(), 1000);
  EXPECT_EQ(decoder.blocks_in_use(), 0);
  EXPECT_EQ(decoder.free_blocks(), 24);
  EXPECT_TRUE(decoder.cache(0).live_sequences().empty());
  EXPECT_LE(server.peak_blocks_in_use(), 24);
  EXPECT_GT(server.peak_blocks_in_use(), 16);
}

}  // namespace
}  // namespace maskattn
