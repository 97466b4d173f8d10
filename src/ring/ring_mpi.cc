// Ring (context-parallel) attention over MPI.
//
// The algorithm. P ranks each hold a shard of the query rows and of the key/value rows
// (local_ranges: contiguous, or zigzag — chunks r and 2P−1−r of 2P, which gives every rank the
// same causal work). Attention over all keys is the merge of attention over disjoint key sets
// (merge_partials: LSE-weighted), so rank r computes its queries against each rank's keys in
// turn: at step s = 0 … P−1 it holds the key/value blocks of origin (r − s) mod P and passes them
// on to r + 1 for the next step. Every call runs in the global frame (Options::frame), so every
// mask and modifier sees global positions; the f32 parts are merged in a fixed order (step, then
// key block) and rounded once, so the result is the same bits on every run and equal to the
// emulator's (ring_emulation, same per-rank code in ring_rank.cc). The plan (ring_schedule.h) is
// computed by every rank from the global mask: a (query block, key block) pair the mask hides is
// not computed, and a key block no later rank on its path needs is not sent — under a causal mask
// with the contiguous layout nothing wraps around, and a sliding window narrower than a block is a
// neighbour exchange. Sinks count in one part per row: each query block's call against its own
// first key block at step 0.
//
// The backward walks the same ring. dQ accumulates locally over every call (f32). The dK/dV of a
// key block accumulate in an f32 buffer that travels with the block one step behind it: at step s
// a rank computes the step's dK/dV into scratch while the accumulator of the same block, sent by
// the previous rank when that rank finished step s − 1, is in flight; it adds the two and sends
// the sum on (or home, to the block's origin, after the block's last hop). P is recomputed from
// the merged forward LSE, so each call's gradients are exact parts of the whole.
//
// The overlap. Each step posts its receives (the next step's blocks) and sends (the blocks going
// on) with MPI_Irecv/MPI_Isend into double buffers, then computes on the current buffer. Open MPI
// has no asynchronous progress thread: a large message (beyond the eager limit, a rendezvous)
// moves only while some MPI call runs. So the calling thread hands the step's attention() calls to
// a worker std::thread (which runs its own OpenMP team) and polls MPI_Testall every 50 µs until
// the messages are done, then joins the worker; only the calling thread ever calls MPI, which is
// what MPI_THREAD_FUNNELED allows. When MPI was initialised below FUNNELED the ring computes on
// the calling thread and then waits (MPI_Waitall): correct, with no overlap (stats show the wait).
//
// Errors. Every rank checks its inputs (shapes against local_ranges, a 1 × 1 probe call that runs
// the library's own checks, and the global parameters against rank 0's) before the first
// message, and the ranks agree (MPI_Allreduce of the lowest failing rank, then its message by
// MPI_Bcast): every rank throws the same Error. An Error raised later in a call (check_finite)
// does not stop the exchange — message sizes depend only on the plan — and is agreed on before
// anything is written. So bad input never leaves a rank waiting.
#include "maskattn/dist/ring_mpi.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <limits>
#include <optional>
#include <thread>
#include <tuple>

#include "ring/agreement_mpi.h"
#include "ring/ring_checks.h"
#include "ring/ring_rank.h"
#include "ring/ring_schedule.h"

namespace maskattn::dist {
namespace {

using Clock = std::chrono::steady_clock;
using detail::KvPacking;
using detail::RingSchedule;
using detail::RingStep;
using detail::row_slice;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Message tags: a key block's K/V, its travelling dK/dV, and its dK/dV going home.
int kv_tag(int block) {
  return block;
}
int grad_tag(int block) {
  return 2 + block;
}
int home_tag(int block) {
  return 4 + block;
}

// The non-blocking requests in flight. Messages above 1 GiB go as several (same tag: MPI keeps
// their order), so counts fit MPI's int.
class Exchange {
 public:
  explicit Exchange(MPI_Comm comm) : comm_(comm) {}
  void send(const void* data, int64_t bytes, int dest, int tag) {
    bytes_sent += bytes;
    post(const_cast<void*>(data), bytes, dest, tag, true);
  }
  void receive(void* data, int64_t bytes, int source, int tag) {
    post(data, bytes, source, tag, false);
  }
  bool test() {
    int done = 1;
    if (!requests_.empty())
      MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE);
    return done != 0;
  }
  void wait() {
    if (!requests_.empty())
      MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
    requests_.clear();
  }
  int64_t bytes_sent = 0;

 private:
  void post(void* data, int64_t bytes, int peer, int tag, bool is_send) {
    constexpr int64_t kPiece = int64_t{1} << 30;
    auto* base = static_cast<char*>(data);
    for (int64_t done = 0; done < bytes || (bytes == 0 && done == 0); done += kPiece) {
      const int count = static_cast<int>(std::min(kPiece, bytes - done));
      requests_.emplace_back();
      if (is_send) {
        MPI_Isend(base + done, count, MPI_BYTE, peer, tag, comm_, &requests_.back());
      } else {
        MPI_Irecv(base + done, count, MPI_BYTE, peer, tag, comm_, &requests_.back());
      }
      if (bytes == 0) break;
    }
  }
  MPI_Comm comm_;
  std::vector<MPI_Request> requests_;
};

// One ring run's communication context: a duplicate of the caller's communicator, so that the
// ring's messages (tags 0–6) can never match a message of the caller's own.
class Ring {
 public:
  Ring(MPI_Comm caller, const char* who) {
    std::tie(rank, world) = detail::rank_and_world(caller, who);
    MPI_Comm_dup(caller, &comm);
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    threaded = provided >= MPI_THREAD_FUNNELED;
  }
  ~Ring() { MPI_Comm_free(&comm); }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, world = 1;
  bool threaded = false;  // MPI_THREAD_FUNNELED or better: compute on a worker, poll here
  int left() const { return (rank - 1 + world) % world; }
  int right() const { return (rank + 1) % world; }
};

// Runs `compute` while the exchange progresses (see the essay); records the first error instead
// of throwing, and the time spent waiting for messages after the compute finished.
void overlap(const Ring& ring, Exchange& exchange, const std::function<void()>& compute,
             std::string& error, RingStats& stats) {
  const auto guarded = [&] {
    if (!error.empty()) return;  // after an error, only the messages go on
    std::string failure = detail::error_of(compute);
    if (!failure.empty()) error = failure;
  };
  if (ring.threaded) {
    std::atomic<bool> finished{false};
    std::thread worker([&] {
      guarded();
      finished.store(true, std::memory_order_release);
    });
    bool delivered = false;
    while (!finished.load(std::memory_order_acquire) && !delivered) {
      delivered = exchange.test();
      if (!delivered) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    worker.join();
  } else {
    guarded();
  }
  const auto start = Clock::now();
  exchange.wait();
  stats.wait_seconds += seconds_since(start);
}

// The parameters every rank must agree on, with their names for the message.
std::vector<std::pair<const char*, int64_t>> global_parameters(int64_t q_len, int64_t k_len,
                                                               const detail::RingInputs& in,
                                                               const ScoreMods& mods,
                                                               const RingOptions& options) {
  return {{"global_q_len", q_len},
          {"global_k_len", k_len},
          {"layout", static_cast<int64_t>(options.layout)},
          {"batch", in.q.size(0)},
          {"q heads", in.q.size(1)},
          {"kv heads", in.k.size(1)},
          {"head dim", in.q.size(3)},
          {"value dim", in.v.size(3)},
          {"dtype", static_cast<int64_t>(in.q.dtype())},
          {"lse given", in.lse.is_null() ? 0 : 1},
          {"sinks", static_cast<int64_t>(mods.sinks.size())},
          {"bias given", mods.bias ? 1 : 0},
          {"grads.dsinks given", in.grads.dsinks.is_null() ? 0 : 1},
          {"grads.dbias given", in.grads.dbias.is_null() ? 0 : 1}};
}

// Checks everything before the first message and builds the plan; all ranks agree on failure.
RingSchedule checked_schedule(const Ring& ring, const char* who, bool backward, int64_t q_len,
                              int64_t k_len, const detail::RingInputs& in, const Mask& mask,
                              const ScoreMods& mods, const RingOptions& options) {
  std::string error = detail::error_of([&] {
    detail::check_ring_options(who, options);
    const auto q_rows = local_ranges(q_len, options.layout, ring.rank, ring.world);
    const auto k_rows = local_ranges(k_len, options.layout, ring.rank, ring.world);
    const int64_t nq = row_count(q_rows), nk = row_count(k_rows);
    if (backward) {
      detail::check_backward_inputs(who, in, mask, mods, options, nq, nk, q_rows[0].first,
                                    k_rows[0].first, q_len, k_len);
    } else {
      detail::check_forward_inputs(who, in, mask, mods, options, nq, nk, q_rows[0].first,
                                   k_rows[0].first, q_len, k_len);
    }
  });
  const std::string differs =
      detail::compare_with_rank0(ring.comm, global_parameters(q_len, k_len, in, mods, options));
  if (error.empty()) error = differs;
  detail::agree_or_throw(ring.comm, who, error);
  std::optional<RingSchedule> schedule;
  error = detail::error_of([&] {
    schedule.emplace(detail::make_schedule(mask, in.q.size(0), in.q.size(1), q_len, k_len,
                                           options.layout, ring.world, !mods.sinks.empty()));
  });
  detail::agree_or_throw(ring.comm, who, error);
  return std::move(*schedule);
}

// The rank's local rows, cut into its blocks.
template <typename View>
std::vector<View> local_blocks(const View& t, const std::vector<RowRange>& ranges) {
  std::vector<View> views;
  if (t.is_null()) return views;
  int64_t first = 0;
  for (const RowRange& r : ranges) {
    views.push_back(row_slice(t, first, r.size()));
    first += r.size();
  }
  return views;
}

// Byte offsets of the held blocks in a packed K/V buffer (the step's held order), and its size.
struct HeldLayout {
  std::vector<int64_t> offsets;  // per held slot
  int64_t total = 0;
};
HeldLayout held_layout(const RingSchedule& schedule, const RingStep& plan, int64_t unit_per_row) {
  HeldLayout layout;
  for (int b : plan.held) {
    layout.offsets.push_back(layout.total);
    layout.total += schedule.k_blocks(plan.origin)[b].size() * unit_per_row;
  }
  return layout;
}

size_t slot_of(const RingStep& plan, int block) {
  return static_cast<size_t>(std::find(plan.held.begin(), plan.held.end(), block) -
                             plan.held.begin());
}

// The K/V half of a step: receive the next step's blocks from the left, send the forwarded ones
// to the right, and return views of the held ones in `current`.
std::vector<detail::KvBlock> post_kv(const Ring& ring, const RingSchedule& schedule,
                                     const KvPacking& packing, int step,
                                     const std::vector<char>& current, std::vector<char>& next,
                                     Exchange& exchange) {
  const int64_t per_row = packing.block_bytes(1);
  const RingStep& plan = schedule.step(ring.rank, step);
  const HeldLayout here = held_layout(schedule, plan, per_row);
  if (step + 1 < ring.world) {
    const RingStep& coming = schedule.step(ring.rank, step + 1);
    const HeldLayout there = held_layout(schedule, coming, per_row);
    next.resize(static_cast<size_t>(there.total));
    for (size_t slot = 0; slot < coming.held.size(); ++slot) {
      const int b = coming.held[slot];
      exchange.receive(next.data() + there.offsets[slot],
                       schedule.k_blocks(coming.origin)[b].size() * per_row, ring.left(),
                       kv_tag(b));
    }
  }
  for (int b : plan.forwarded) {
    exchange.send(current.data() + here.offsets[slot_of(plan, b)],
                  schedule.k_blocks(plan.origin)[b].size() * per_row, ring.right(), kv_tag(b));
  }
  std::vector<detail::KvBlock> held;
  for (size_t slot = 0; slot < plan.held.size(); ++slot) {
    held.push_back(packing.view(current.data() + here.offsets[slot],
                                schedule.k_blocks(plan.origin)[plan.held[slot]].size()));
  }
  return held;
}

// The rank's own key/value blocks packed for step 0.
std::vector<char> pack_own(const Ring& ring, const RingSchedule& schedule, const KvPacking& packing,
                           const TensorView& k, const TensorView& v) {
  const auto& ranges = schedule.k_blocks(ring.rank);
  std::vector<char> bytes(static_cast<size_t>(packing.block_bytes(schedule.k_rows(ring.rank))));
  int64_t local_first = 0, offset = 0;
  for (const RowRange& r : ranges) {
    packing.pack(k, v, local_first, r.size(), bytes.data() + offset);
    local_first += r.size();
    offset += packing.block_bytes(r.size());
  }
  return bytes;
}

void fill_stats(RingStats* stats, const RingStats& counted, int64_t calls, int64_t skipped,
                double compute_seconds, const Mask& mask, const TensorView& q, int64_t q_len,
                int64_t k_len, const std::vector<RowRange>& q_rows, bool count_pairs) {
  if (stats == nullptr) return;
  *stats = counted;
  stats->pairs_computed = calls;
  stats->pairs_skipped = skipped;
  stats->compute_seconds = compute_seconds;
  if (!count_pairs) return;
  stats->allowed_pairs =
      detail::count_allowed_pairs(mask, q.size(0), q.size(1), q_len, k_len, q_rows);
}

}  // namespace

void ring_attention(MPI_Comm comm, int64_t global_q_len, int64_t global_k_len, const TensorView& q,
                    const TensorView& k, const TensorView& v, const MutableTensorView& out,
                    const Mask& mask, const ScoreMods& mods, const RingOptions& options,
                    const MutableTensorView& lse, RingStats* stats) {
  const char* who = "ring_attention";
  const Ring ring(comm, who);
  const detail::RingInputs in{q, k, v, out, lse, {}, {}};
  const RingSchedule schedule =
      checked_schedule(ring, who, false, global_q_len, global_k_len, in, mask, mods, options);
  const detail::RingCallContext context{&schedule,    &mask,        &mods,
                                        options.base, global_q_len, global_k_len};
  const KvPacking packing = KvPacking::of(k, v);
  const auto& q_rows = schedule.q_blocks(ring.rank);
  detail::ForwardRank state(context, ring.rank, local_blocks(q, q_rows), v.size(3));

  std::vector<char> current = pack_own(ring, schedule, packing, k, v), next;
  std::string error;
  RingStats counted;
  for (int s = 0; s < ring.world; ++s) {
    Exchange exchange(ring.comm);
    const auto held = post_kv(ring, schedule, packing, s, current, next, exchange);
    overlap(
        ring, exchange, [&] { state.run_step(s, held); }, error, counted);
    counted.bytes_sent += exchange.bytes_sent;
    std::swap(current, next);
  }
  detail::agree_or_throw(ring.comm, who, error);
  state.finish(local_blocks(out, q_rows), local_blocks(lse, q_rows));
  fill_stats(stats, counted, state.calls, state.skipped, state.compute_seconds, mask, q,
             global_q_len, global_k_len, q_rows, options.count_allowed_pairs);
}

namespace {

// Sums each rank's share of a small gradient (dsinks, dbias) in rank order — rank 0's, plus rank
// 1's, … — by a chain of blocking messages, then gives every rank the sum: the same order as the
// emulator, so the same bits (MPI_Allreduce fixes no order).
void sum_in_rank_order(const Ring& ring, std::vector<float>& values) {
  const int count = static_cast<int>(values.size());
  if (ring.rank > 0) {
    std::vector<float> before(values.size());
    MPI_Recv(before.data(), count, MPI_FLOAT, ring.left(), 6, ring.comm, MPI_STATUS_IGNORE);
    for (size_t n = 0; n < values.size(); ++n) values[n] = before[n] + values[n];
  }
  if (ring.rank + 1 < ring.world)
    MPI_Send(values.data(), count, MPI_FLOAT, ring.right(), 6, ring.comm);
  MPI_Bcast(values.data(), count, MPI_FLOAT, ring.world - 1, ring.comm);
}

// The travelling dK/dV accumulators of one backward run (f32, packed like the K/V blocks): each
// step adds the rank's share to what came from the left and sends the sum on, or home after the
// block's last hop; the own blocks' final sums come home (receives posted first, waited last).
class GradTravel {
 public:
  GradTravel(const Ring& ring, const RingSchedule& schedule, const KvPacking& packing)
      : ring_(ring), schedule_(schedule), packing_(packing), home_(ring.comm) {
    const auto& own = schedule.k_blocks(ring.rank);
    for (size_t b = 0; b < own.size(); ++b) {
      own_.emplace_back(floats(own[b]));
      const int hops = schedule.last_hop(ring.rank, static_cast<int>(b));
      if (hops > 0) {
        home_.receive(own_[b].data(), bytes(own[b]), (ring.rank + hops) % ring.world,
                      home_tag(static_cast<int>(b)));
      }
    }
  }

  // Posts the receive of the held blocks' accumulators (sent by the left rank after its step
  // s − 1) and returns zeroed buffers for this step's share.
  std::vector<detail::KvGradBlock> begin_step(int step, Exchange& exchange) {
    const RingStep& plan = schedule_.step(ring_.rank, step);
    layout_ = held_layout(schedule_, plan, packing_.grad_block_floats(1));
    if (step > 0) {
      incoming_.resize(static_cast<size_t>(layout_.total));
      for (size_t slot = 0; slot < plan.held.size(); ++slot) {
        const RowRange& rows = schedule_.k_blocks(plan.origin)[plan.held[slot]];
        exchange.receive(incoming_.data() + layout_.offsets[slot], bytes(rows), ring_.left(),
                         grad_tag(plan.held[slot]));
      }
    }
    share_.assign(static_cast<size_t>(layout_.total), 0.0f);
    std::vector<detail::KvGradBlock> views;
    for (size_t slot = 0; slot < plan.held.size(); ++slot) {
      const RowRange& rows = schedule_.k_blocks(plan.origin)[plan.held[slot]];
      views.push_back(packing_.grad_view(share_.data() + layout_.offsets[slot], rows.size()));
    }
    return views;
  }

  // After the step's messages: accumulator = incoming + share, then on, home, or kept.
  void end_step(int step, Exchange& exchange) {
    const RingStep& plan = schedule_.step(ring_.rank, step);
    if (step > 0) {
      for (size_t n = 0; n < share_.size(); ++n) incoming_[n] += share_[n];
      std::swap(incoming_, outgoing_);
    } else {
      std::swap(share_, outgoing_);
    }
    for (size_t slot = 0; slot < plan.held.size(); ++slot) {
      const int b = plan.held[slot];
      const RowRange& rows = schedule_.k_blocks(plan.origin)[b];
      float* sum = outgoing_.data() + layout_.offsets[slot];
      if (schedule_.last_hop(plan.origin, b) > step) {
        exchange.send(sum, bytes(rows), ring_.right(), grad_tag(b));
      } else if (step > 0) {
        exchange.send(sum, bytes(rows), plan.origin, home_tag(b));
      } else {
        std::copy_n(sum, floats(rows), own_[b].begin());
      }
    }
  }

  void wait_home() { home_.wait(); }

  // The own blocks' sums into the rank's dk/dv rows.
  void store(const Gradients& grads) const {
    int64_t local_first = 0;
    const auto& own = schedule_.k_blocks(ring_.rank);
    for (size_t b = 0; b < own.size(); ++b) {
      const detail::KvGradBlock sum =
          packing_.grad_view(const_cast<float*>(own_[b].data()), own[b].size());
      detail::store_f32(static_cast<const float*>(sum.dk.data()),
                        row_slice(grads.dk, local_first, own[b].size()), grads.accumulate);
      detail::store_f32(static_cast<const float*>(sum.dv.data()),
                        row_slice(grads.dv, local_first, own[b].size()), grads.accumulate);
      local_first += own[b].size();
    }
  }

 private:
  int64_t floats(const RowRange& rows) const { return packing_.grad_block_floats(rows.size()); }
  int64_t bytes(const RowRange& rows) const { return floats(rows) * 4; }

  const Ring& ring_;
  const RingSchedule& schedule_;
  const KvPacking& packing_;
  Exchange home_;
  HeldLayout layout_;
  std::vector<float> incoming_, outgoing_, share_;
  std::vector<std::vector<float>> own_;
};

}  // namespace

void ring_attention_backward(MPI_Comm comm, int64_t global_q_len, int64_t global_k_len,
                             const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const TensorView& lse, const TensorView& dout,
                             const Gradients& grads, const Mask& mask, const ScoreMods& mods,
                             const RingOptions& options, RingStats* stats) {
  const char* who = "ring_attention_backward";
  const Ring ring(comm, who);
  const detail::RingInputs in{q, k, v, out, lse, dout, grads};
  const RingSchedule schedule =
      checked_schedule(ring, who, true, global_q_len, global_k_len, in, mask, mods, options);
  const detail::RingCallContext context{&schedule,    &mask,        &mods,
                                        options.base, global_q_len, global_k_len};
  const KvPacking packing = KvPacking::of(k, v);
  const auto& q_rows = schedule.q_blocks(ring.rank);
  detail::BackwardRank state(context, ring.rank, local_blocks(q, q_rows), local_blocks(out, q_rows),
                             local_blocks(lse, q_rows), local_blocks(dout, q_rows),
                             !grads.dsinks.is_null(), !grads.dbias.is_null());

  GradTravel travel(ring, schedule, packing);
  std::vector<char> current = pack_own(ring, schedule, packing, k, v), next;
  std::string error;
  RingStats counted;
  Exchange exchange(ring.comm);  // carries the accumulator sends of one step into the next
  for (int s = 0; s < ring.world; ++s) {
    const auto held = post_kv(ring, schedule, packing, s, current, next, exchange);
    const auto share = travel.begin_step(s, exchange);
    overlap(
        ring, exchange, [&] { state.run_step(s, held, share); }, error, counted);
    counted.bytes_sent += exchange.bytes_sent;
    exchange = Exchange(ring.comm);
    std::swap(current, next);
    travel.end_step(s, exchange);
  }
  counted.bytes_sent += exchange.bytes_sent;  // the last step's sums, on their way home
  const auto start = Clock::now();
  exchange.wait();
  travel.wait_home();
  counted.wait_seconds += seconds_since(start);
  detail::agree_or_throw(ring.comm, who, error);

  std::vector<float> dsinks = state.dsinks.values, dbias = state.dbias.values;
  if (!grads.dsinks.is_null()) sum_in_rank_order(ring, dsinks);
  if (!grads.dbias.is_null()) sum_in_rank_order(ring, dbias);
  state.finish(local_blocks(grads.dq, q_rows), grads.accumulate);
  travel.store(grads);
  if (!grads.dsinks.is_null()) detail::store_f32(dsinks.data(), grads.dsinks, grads.accumulate);
  if (!grads.dbias.is_null()) detail::store_f32(dbias.data(), grads.dbias, grads.accumulate);
  fill_stats(stats, counted, state.calls, state.skipped, state.compute_seconds, mask, q,
             global_q_len, global_k_len, q_rows, options.count_allowed_pairs);
}

}  // namespace maskattn::dist
