// Server::step (maskattn/model/serve.h): what one step of the continuous-batching loop does —
// arrivals, cancellations, admission (serve.cc), then the batch, one forward, and sampling.
//
// The batch is built in a fixed order: decoding requests first (one token each, in admission
// order), then prompt pieces (in admission order) while the token budget lasts. Decoding first
// keeps the time between a request's tokens steady whatever arrives; a prompt piece that does not
// fit waits for the next step rather than being cut smaller, because its cut points must stay at
// multiples of prefill_chunk for its arithmetic to match a run alone (paged_decoder.h). With a
// budget of at least max_batch + prefill_chunk a prompt piece always fits beside the decoders;
// with less, prompts wait while the decoders finish (never forever: every running request's
// generation is bounded).
#include <algorithm>

#include "maskattn/model/generate.h"
#include "maskattn/model/serve.h"
#include "maskattn/tokens.h"

namespace maskattn::model {

bool Server::must_stop(const Running& running) const {
  // The next feed would go to position length(): there must be one.
  return decoder_.length(running.sequence) >= decoder_.context();
}

void Server::sample(Running& running, const float* logits) {
  const ServeRequest& request = requests_[running.id];
  ServeResult& result = results_[running.id];
  GenerateOptions options;
  options.temperature = request.temperature;
  options.top_k = request.top_k;
  const int32_t token = sample_token(logits, decoder_.parameters().config().vocab, options,
                                     running.state, request.stop_at_eos);
  if (token == kEosId) {
    result.reason = FinishReason::eos;
    return;
  }
  result.tokens.push_back(token);
  if (result.first_token_step < 0) result.first_token_step = step_;
  if (static_cast<int64_t>(result.tokens.size()) == request.max_new_tokens) {
    result.reason = FinishReason::length;
  } else if (must_stop(running)) {
    result.reason = FinishReason::context;
  }
}

ServeStep Server::step() {
  if (running_.empty() && waiting_.empty() && !pending_.empty()) {
    step_ = std::max(step_, requests_[pending_.front()].arrival);  // nothing to do until then
  }
  arrive();
  cancel_due();
  admit();
  // ---- the batch: decoding tokens, then prompt pieces ----
  std::vector<PagedEntry> entries;
  std::vector<size_t> owners;  // per entry: its index in running_
  int64_t budget = options_.token_budget;
  for (size_t n = 0; n < running_.size() && budget > 0; ++n) {
    const Running& r = running_[n];
    if (r.fed < static_cast<int64_t>(requests_[r.id].prompt.size())) continue;
    entries.push_back({r.sequence, &results_[r.id].tokens.back(), 1});
    owners.push_back(n);
    budget -= 1;
  }
  for (size_t n = 0; n < running_.size(); ++n) {
    const Running& r = running_[n];
    const std::vector<int32_t>& prompt = requests_[r.id].prompt;
    const int64_t left = static_cast<int64_t>(prompt.size()) - r.fed;
    if (left == 0) continue;
    const int64_t piece = std::min(options_.prefill_chunk, left);
    if (piece > budget) break;
    entries.push_back({r.sequence, prompt.data() + r.fed, piece});
    owners.push_back(n);
    budget -= piece;
  }
  ServeStep stats;
  stats.step = step_;
  stats.entries = static_cast<int64_t>(entries.size());
  stats.tokens = options_.token_budget - budget;
  // ---- one forward, then each request whose prompt is in samples its next token ----
  if (!entries.empty()) {
    const std::vector<float>& logits = decoder_.forward(entries);
    peak_blocks_ = std::max(peak_blocks_, decoder_.blocks_in_use());
    const int64_t vocab = decoder_.parameters().config().vocab;
    for (size_t e = 0; e < entries.size(); ++e) {
      Running& r = running_[owners[e]];
      const int64_t prompt = static_cast<int64_t>(requests_[r.id].prompt.size());
      if (r.fed < prompt) r.fed += entries[e].count;
      if (r.fed < prompt) continue;
      sample(r, logits.data() + static_cast<int64_t>(e) * vocab);
      ++stats.sampled;
    }
  }
  for (size_t n = running_.size(); n-- > 0;) {
    const FinishReason reason = results_[running_[n].id].reason;
    if (reason != FinishReason::none) finish(n, ServeStatus::finished, reason);
  }
  ++step_;
  stats.waiting = static_cast<int64_t>(waiting_.size() + pending_.size());
  stats.running = static_cast<int64_t>(running_.size());
  stats.done = done_;
  stats.blocks_in_use = decoder_.blocks_in_use();
  return stats;
}

void Server::run() {
  while (!idle()) step();
}

}  // namespace maskattn::model
