// Server (maskattn/model/serve.h): the continuous-batching loop over a PagedGptDecoder.
//
// The bookkeeping is four lists of request ids: pending (submitted, not yet arrived, sorted by
// arrival), waiting (arrived: first come, first served), running (admitted: a sequence in the
// decoder and a reservation), and done (a result that no longer changes). The reservation is what
// makes the loop simple: a request is admitted only when the pool's blocks not yet promised to
// running requests hold every position it can ever need, so the blocks a running request will
// append are always there — no step can run out of blocks, and no request is ever preempted and
// recomputed (which would also change the arithmetic of its tokens). The price is that the pool
// holds room for tokens not yet generated; the admission counts with the cache's own
// blocks_needed, so what is reserved is exactly what the appends will take.
#include "maskattn/model/serve.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "maskattn/error.h"
#include "maskattn/model/generate.h"
#include "maskattn/tokens.h"

namespace maskattn::model {

namespace {

std::string str(int64_t value) {
  return std::to_string(value);
}

}  // namespace

const char* serve_status_name(ServeStatus status) {
  switch (status) {
    case ServeStatus::waiting:
      return "waiting";
    case ServeStatus::running:
      return "running";
    case ServeStatus::finished:
      return "finished";
    case ServeStatus::cancelled:
      return "cancelled";
    case ServeStatus::failed:
      return "failed";
  }
  return "?";
}

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::none:
      return "";
    case FinishReason::length:
      return "length";
    case FinishReason::eos:
      return "eos";
    case FinishReason::context:
      return "context";
  }
  return "?";
}

Server::Server(PagedGptDecoder& decoder, const ServeOptions& options)
    : decoder_(decoder), options_(options) {
  if (options.max_batch < 1 || options.token_budget < 1 || options.prefill_chunk < 1) {
    throw Error("Server: max_batch " + str(options.max_batch) + ", token_budget " +
                str(options.token_budget) + " and prefill_chunk " + str(options.prefill_chunk) +
                " must all be ≥ 1");
  }
  if (options.prefill_chunk > options.token_budget) {
    throw Error("Server: prefill_chunk " + str(options.prefill_chunk) + " exceeds token_budget " +
                str(options.token_budget) + "; a step must be able to hold one prompt chunk");
  }
}

int64_t Server::submit(const ServeRequest& request) {
  const int64_t id = static_cast<int64_t>(requests_.size());
  const std::string where = "Server::submit: request " + str(id);
  if (request.prompt.empty()) {
    throw Error(where + " has an empty prompt; give at least one token");
  }
  if (request.max_new_tokens < 1) {
    throw Error(where + ": max_new_tokens " + str(request.max_new_tokens) + " must be ≥ 1");
  }
  if (request.arrival < 0) {
    throw Error(where + ": arrival " + str(request.arrival) + " must be ≥ 0 (a step)");
  }
  if (!(std::isfinite(request.temperature) && request.temperature >= 0) || request.top_k < 0) {
    throw Error(where + ": temperature " + std::to_string(request.temperature) + " and top_k " +
                str(request.top_k) + " must be finite and ≥ 0");
  }
  const int64_t vocab = decoder_.parameters().config().vocab;
  for (size_t t = 0; t < request.prompt.size(); ++t) {
    if (request.prompt[t] < 0 || request.prompt[t] >= vocab) {
      throw Error(where + ": prompt token " + str(static_cast<int64_t>(t)) + " = " +
                  str(request.prompt[t]) + " is outside the vocabulary [0, " + str(vocab) + ")");
    }
  }
  requests_.push_back(request);
  results_.emplace_back();
  const auto later = std::upper_bound(
      pending_.begin(), pending_.end(), id,
      [&](int64_t a, int64_t b) { return requests_[a].arrival < requests_[b].arrival; });
  pending_.insert(later, id);
  return id;
}

void Server::cancel(int64_t id) {
  if (id < 0 || id >= requests()) {
    throw Error("Server::cancel: request " + str(id) + " was never submitted (" + str(requests()) +
                " were)");
  }
  if (results_[id].status == ServeStatus::waiting || results_[id].status == ServeStatus::running) {
    requests_[id].cancel_at = step_;
  }
}

int64_t Server::positions_needed(const ServeRequest& request) const {
  // The last token sampled is never fed, so it takes no position.
  const int64_t prompt = static_cast<int64_t>(request.prompt.size());
  return std::min(prompt + request.max_new_tokens - 1, decoder_.context());
}

int64_t Server::reserved_blocks() const {
  int64_t blocks = 0;
  for (const Running& r : running_) {
    blocks += decoder_.blocks_needed(r.sequence, r.positions - decoder_.length(r.sequence));
  }
  return blocks;
}

void Server::arrive() {
  size_t arrived = 0;
  while (arrived < pending_.size() && requests_[pending_[arrived]].arrival <= step_) ++arrived;
  waiting_.insert(waiting_.end(), pending_.begin(), pending_.begin() + arrived);
  pending_.erase(pending_.begin(), pending_.begin() + arrived);
}

void Server::cancel_due() {
  const auto due = [&](int64_t id) {
    const int64_t at = requests_[id].cancel_at;
    return at >= 0 && at <= step_;
  };
  for (auto* list : {&pending_, &waiting_}) {
    for (const int64_t id : *list) {
      if (!due(id)) continue;
      results_[id].status = ServeStatus::cancelled;
      results_[id].done_step = step_;
      ++done_;
    }
    list->erase(std::remove_if(list->begin(), list->end(), due), list->end());
  }
  for (size_t n = running_.size(); n-- > 0;) {
    if (due(running_[n].id)) finish(n, ServeStatus::cancelled, FinishReason::none);
  }
}

void Server::admit() {
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < options_.max_batch) {
    const int64_t id = waiting_.front();
    const ServeRequest& request = requests_[id];
    ServeResult& result = results_[id];
    const int64_t prompt = static_cast<int64_t>(request.prompt.size());
    const int64_t positions = positions_needed(request);
    const int64_t blocks = decoder_.blocks_for(positions);
    const int64_t available = decoder_.free_blocks() - reserved_blocks();
    std::string error;
    if (prompt > decoder_.context()) {
      error = "request " + str(id) + ": its prompt of " + str(prompt) +
              " tokens passes the model's context of " + str(decoder_.context());
    } else if (blocks > decoder_.blocks() || (running_.empty() && blocks > available)) {
      error = "request " + str(id) + " needs " + str(blocks) + " blocks of " +
              str(decoder_.block_size()) + " positions (" + str(positions) +
              " positions: prompt + max_new_tokens - 1, at most the context) but the pool " +
              (blocks > decoder_.blocks() ? "has " + str(decoder_.blocks())
                                          : "has only " + str(available) + " free") +
              "; it can never run";
    } else if (blocks > available) {
      return;  // first come, first served: wait for blocks to come back
    }
    waiting_.erase(waiting_.begin());
    if (!error.empty()) {
      result.status = ServeStatus::failed;
      result.error = error;
      result.done_step = step_;
      ++done_;
      continue;
    }
    running_.push_back({id, decoder_.add_sequence(), 0, positions, request.seed});
    result.status = ServeStatus::running;
    result.admitted_step = step_;
  }
}

void Server::finish(size_t index, ServeStatus status, FinishReason reason) {
  const Running running = running_[index];
  decoder_.free(running.sequence);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
  ServeResult& result = results_[running.id];
  result.status = status;
  result.reason = reason;
  result.done_step = step_;
  ++done_;
}

}  // namespace maskattn::model
