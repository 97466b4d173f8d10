// Continuous batching for the GPT model (`maskattn gpt serve`): requests arrive and leave while
// others decode, all of them sharing one PagedGptDecoder (maskattn/model/paged_decoder.h), and
// every step runs one ragged forward over whatever is running. docs/design.md §8 describes the
// loop.
//
// A step, in order:
//   1. arrivals: requests whose arrival step has come join the waiting queue (first come, first
//      served; equal arrivals in submission order);
//   2. cancellations: a request whose cancel step has come leaves, its blocks back in the pool;
//   3. admission: while fewer than max_batch requests run, the queue's head is admitted if the
//      pool's unreserved blocks hold every position it can ever need (prompt + max_new_tokens − 1,
//      at most the context): a running request never waits for a block, so nothing is ever
//      preempted. A request that cannot fit even an empty pool (or whose prompt passes the
//      context) finishes at once with an error (E152); the others go on;
//   4. the batch: every decoding request feeds its last token (1 each), then prefilling requests
//      feed their next prompt chunk while the step's token budget lasts. Prompts are cut at fixed
//      multiples of prefill_chunk, so a request is fed in the same pieces whatever else runs, and
//      its tokens come out bitwise as they would alone (paged_decoder.h says why);
//   5. one forward; each request whose prompt is complete samples its next token from its own
//      seeded state; a request that reached max_new_tokens, <eos> or the context finishes and
//      frees its blocks.
// Steps are the clock: arrival and cancel_at count steps, so a run is reproducible. A step with
// nothing to run jumps to the next arrival.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "maskattn/model/paged_decoder.h"

namespace maskattn::model {

struct ServeRequest {
  std::vector<int32_t> prompt;  // at least one token
  int64_t max_new_tokens = 64;  // ≥ 1
  int64_t arrival = 0;          // the step it arrives at
  int64_t cancel_at = -1;       // the step it is cancelled at (−1: never)
  double temperature = 0;       // 0: greedy
  int64_t top_k = 0;            // 0: every token
  uint64_t seed = 1;            // its own sampling state
  bool stop_at_eos = true;      // false: <eos> is never sampled (fixed lengths, benchmarks)
};

enum class ServeStatus : uint8_t { waiting, running, finished, cancelled, failed };
// Why a finished request stopped.
enum class FinishReason : uint8_t { none, length, eos, context };

const char* serve_status_name(ServeStatus status);    // "waiting", …, "failed"
const char* finish_reason_name(FinishReason reason);  // "", "length", "eos", "context"

struct ServeResult {
  ServeStatus status = ServeStatus::waiting;
  FinishReason reason = FinishReason::none;
  std::vector<int32_t> tokens;  // the new tokens (without <eos>)
  std::string error;            // failed: why (docs/errors.md E152)
  int64_t admitted_step = -1, first_token_step = -1, done_step = -1;
};

struct ServeOptions {
  int64_t max_batch = 32;      // requests running at once
  int64_t token_budget = 256;  // new tokens per step (decoding tokens count 1 each)
  int64_t prefill_chunk = 64;  // prompt tokens per piece; ≤ token_budget
};

// What one step did, and the state after it.
struct ServeStep {
  int64_t step = 0;
  int64_t tokens = 0;   // tokens fed (prompt pieces and decoding tokens)
  int64_t sampled = 0;  // tokens generated
  int64_t entries = 0;  // sequences in the forward
  int64_t waiting = 0, running = 0, done = 0;
  int64_t blocks_in_use = 0;
};

class Server {
 public:
  // Throws Error E151 for options out of range (max_batch, token_budget, prefill_chunk < 1, or a
  // prefill chunk above the budget).
  Server(PagedGptDecoder& decoder, const ServeOptions& options);

  // Queues a request; returns its id (0, 1, … in submission order). Throws Error E151 for an
  // empty prompt, max_new_tokens < 1, a negative arrival, a token outside the vocabulary, or a
  // temperature that is negative or not finite.
  int64_t submit(const ServeRequest& request);
  // Cancels a request now (before the next step); a finished one is left as it is.
  void cancel(int64_t id);

  // One step (above). Returns what it did.
  ServeStep step();
  // Steps until every submitted request is done.
  void run();
  bool idle() const { return pending_.empty() && waiting_.empty() && running_.empty(); }

  const ServeResult& result(int64_t id) const { return results_.at(id); }
  int64_t requests() const { return static_cast<int64_t>(requests_.size()); }
  int64_t steps() const { return step_; }
  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  int64_t done() const { return done_; }
  // The most blocks (per layer) that were in use after any step.
  int64_t peak_blocks_in_use() const { return peak_blocks_; }
  const ServeOptions& options() const { return options_; }

 private:
  struct Running {
    int64_t id = 0, sequence = 0;
    int64_t fed = 0;        // prompt tokens fed so far
    int64_t positions = 0;  // positions it may ever hold (its reservation)
    uint64_t state = 0;     // its sampler's state
  };
  int64_t positions_needed(const ServeRequest& request) const;
  int64_t reserved_blocks() const;
  void arrive();
  void cancel_due();
  void admit();
  void sample(Running& running, const float* logits);
  void finish(size_t index, ServeStatus status, FinishReason reason);
  bool must_stop(const Running& running) const;

  PagedGptDecoder& decoder_;
  ServeOptions options_;
  std::vector<ServeRequest> requests_;
  std::vector<ServeResult> results_;
  std::vector<int64_t> pending_;  // not yet arrived, in (arrival, id) order
  std::vector<int64_t> waiting_;  // arrived, not admitted, first come first served
  std::vector<Running> running_;  // in admission order
  int64_t step_ = 0, done_ = 0, peak_blocks_ = 0;
};

}  // namespace maskattn::model
