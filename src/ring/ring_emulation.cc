// The ring without MPI: every rank of the schedule runs in this process, one after the other at
// each step, with the same per-rank arithmetic (ring_rank.h) as dist::ring_attention. K/V blocks
// are packed exactly as the messages are, so each attention() call sees the same memory layout
// and the results are the same bits; it is the oracle the MPI tests compare against, and a way to
// study a schedule (RingStats) without starting processes.
#include <vector>

#include "maskattn/ring.h"
#include "ring/ring_checks.h"
#include "ring/ring_rank.h"
#include "ring/ring_schedule.h"

namespace maskattn::dist {
namespace {

using detail::F32Tensor;
using detail::KvPacking;
using detail::RingSchedule;
using detail::row_slice;

std::vector<TensorView> blocks_of(const TensorView& t, const std::vector<RowRange>& ranges) {
  std::vector<TensorView> views;
  for (const RowRange& r : ranges) views.push_back(row_slice(t, r.first, r.size()));
  return views;
}

std::vector<MutableTensorView> blocks_of(const MutableTensorView& t,
                                         const std::vector<RowRange>& ranges) {
  std::vector<MutableTensorView> views;
  if (t.is_null()) return views;
  for (const RowRange& r : ranges) views.push_back(row_slice(t, r.first, r.size()));
  return views;
}

// Every origin's key/value blocks, packed as the messages carry them.
struct PackedOrigins {
  KvPacking packing;
  std::vector<std::vector<std::vector<char>>> bytes;  // [origin][block]

  PackedOrigins(const RingSchedule& schedule, const TensorView& k, const TensorView& v)
      : packing(KvPacking::of(k, v)), bytes(schedule.world()) {
    for (int origin = 0; origin < schedule.world(); ++origin) {
      for (const RowRange& r : schedule.k_blocks(origin)) {
        bytes[origin].emplace_back(packing.block_bytes(r.size()));
        packing.pack(k, v, r.first, r.size(), bytes[origin].back().data());
      }
    }
  }

  std::vector<detail::KvBlock> held(const RingSchedule& schedule, int rank, int step) const {
    const detail::RingStep& plan = schedule.step(rank, step);
    std::vector<detail::KvBlock> views;
    for (int b : plan.held) {
      views.push_back(
          packing.view(bytes[plan.origin][b].data(), schedule.k_blocks(plan.origin)[b].size()));
    }
    return views;
  }
};

void fill_stats(std::vector<RingStats>* stats, const RingSchedule& schedule, const Mask& mask,
                const TensorView& q, int64_t k_len, const std::vector<int64_t>& calls,
                const std::vector<int64_t>& skipped, const std::vector<double>& seconds,
                const std::vector<int64_t>& bytes, bool count_pairs) {
  if (stats == nullptr) return;
  stats->assign(schedule.world(), {});
  for (int r = 0; r < schedule.world(); ++r) {
    RingStats& s = (*stats)[r];
    s.pairs_computed = calls[r];
    s.pairs_skipped = skipped[r];
    s.compute_seconds = seconds[r];
    s.bytes_sent = bytes[r];
    if (!count_pairs) continue;
    s.allowed_pairs = detail::count_allowed_pairs(mask, q.size(0), q.size(1), q.size(2), k_len,
                                                  schedule.q_blocks(r));
  }
}

// Bytes rank r sends over the whole run: forwarded K/V blocks, and in the backward the dK/dV
// accumulators (forwarded, or sent home after their last hop).
std::vector<int64_t> bytes_sent(const RingSchedule& schedule, const KvPacking& packing,
                                bool backward) {
  std::vector<int64_t> bytes(schedule.world(), 0);
  for (int r = 0; r < schedule.world(); ++r) {
    for (int s = 0; s < schedule.world(); ++s) {
      const detail::RingStep& plan = schedule.step(r, s);
      const auto& ranges = schedule.k_blocks(plan.origin);
      for (int b : plan.forwarded) bytes[r] += packing.block_bytes(ranges[b].size());
      if (!backward) continue;
      for (int b : plan.held) {
        const bool travels = schedule.last_hop(plan.origin, b) > s || s > 0;
        if (travels) bytes[r] += 4 * packing.grad_block_floats(ranges[b].size());
      }
    }
  }
  return bytes;
}

}  // namespace

void ring_emulation(int world, const TensorView& q, const TensorView& k, const TensorView& v,
                    const MutableTensorView& out, const Mask& mask, const ScoreMods& mods,
                    const RingOptions& options, const MutableTensorView& lse,
                    std::vector<RingStats>* stats) {
  const char* who = "ring_emulation";
  const int64_t q_len = q.size(2), k_len = k.size(2);
  detail::check_ring_options(who, options);
  local_ranges(q_len, options.layout, 0, world);  // E113 before anything else
  local_ranges(k_len, options.layout, 0, world);
  detail::check_forward_inputs(who, {q, k, v, out, lse, {}, {}}, mask, mods, options, q_len, k_len,
                               0, 0, q_len, k_len);
  const RingSchedule schedule = detail::make_schedule(mask, q.size(0), q.size(1), q_len, k_len,
                                                      options.layout, world, !mods.sinks.empty());
  const detail::RingCallContext context{&schedule, &mask, &mods, options.base, q_len, k_len};
  const PackedOrigins packed(schedule, k, v);

  std::vector<detail::ForwardRank> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back(context, r, blocks_of(q, schedule.q_blocks(r)), v.size(3));
  for (int s = 0; s < world; ++s) {
    for (int r = 0; r < world; ++r) ranks[r].run_step(s, packed.held(schedule, r, s));
  }
  std::vector<int64_t> calls, skipped;
  std::vector<double> seconds;
  for (int r = 0; r < world; ++r) {
    ranks[r].finish(blocks_of(out, schedule.q_blocks(r)), blocks_of(lse, schedule.q_blocks(r)));
    calls.push_back(ranks[r].calls);
    skipped.push_back(ranks[r].skipped);
    seconds.push_back(ranks[r].compute_seconds);
  }
  fill_stats(stats, schedule, mask, q, k_len, calls, skipped, seconds,
             bytes_sent(schedule, packed.packing, false), options.count_allowed_pairs);
}

void ring_emulation_backward(int world, const TensorView& q, const TensorView& k,
                             const TensorView& v, const TensorView& out, const TensorView& lse,
                             const TensorView& dout, const Gradients& grads, const Mask& mask,
                             const ScoreMods& mods, const RingOptions& options,
                             std::vector<RingStats>* stats) {
  const char* who = "ring_emulation_backward";
  const int64_t q_len = q.size(2), k_len = k.size(2);
  detail::check_ring_options(who, options);
  local_ranges(q_len, options.layout, 0, world);
  local_ranges(k_len, options.layout, 0, world);
  detail::check_backward_inputs(who, {q, k, v, out, lse, dout, grads}, mask, mods, options, q_len,
                                k_len, 0, 0, q_len, k_len);
  const RingSchedule schedule = detail::make_schedule(mask, q.size(0), q.size(1), q_len, k_len,
                                                      options.layout, world, !mods.sinks.empty());
  const detail::RingCallContext context{&schedule, &mask, &mods, options.base, q_len, k_len};
  const PackedOrigins packed(schedule, k, v);
  const KvPacking& packing = packed.packing;

  std::vector<detail::BackwardRank> ranks;
  for (int r = 0; r < world; ++r) {
    const auto& rows = schedule.q_blocks(r);
    ranks.emplace_back(context, r, blocks_of(q, rows), blocks_of(out, rows), blocks_of(lse, rows),
                       blocks_of(dout, rows), !grads.dsinks.is_null(), !grads.dbias.is_null());
  }
  // acc[origin][block]: the travelling dK/dV accumulators, f32, packed as the messages are.
  std::vector<std::vector<std::vector<float>>> acc(world);
  for (int o = 0; o < world; ++o) {
    for (const RowRange& r : schedule.k_blocks(o))
      acc[o].emplace_back(packing.grad_block_floats(r.size()), 0.0f);
  }
  std::vector<float> step_grads;
  for (int s = 0; s < world; ++s) {
    for (int r = 0; r < world; ++r) {
      const detail::RingStep& plan = schedule.step(r, s);
      const auto& ranges = schedule.k_blocks(plan.origin);
      std::vector<detail::KvGradBlock> views;
      std::vector<std::vector<float>> g;
      for (int b : plan.held) {
        g.emplace_back(packing.grad_block_floats(ranges[b].size()));
        views.push_back(packing.grad_view(g.back().data(), ranges[b].size()));
      }
      ranks[r].run_step(s, packed.held(schedule, r, s), views);
      for (size_t slot = 0; slot < plan.held.size(); ++slot) {
        std::vector<float>& into = acc[plan.origin][plan.held[slot]];
        if (s == 0) {
          into = g[slot];
        } else {
          for (size_t n = 0; n < into.size(); ++n) into[n] += g[slot][n];
        }
      }
    }
  }
  F32Tensor dsinks = ranks[0].dsinks, dbias = ranks[0].dbias;
  for (int r = 1; r < world; ++r) {  // the ranks' shares summed in rank order
    for (size_t n = 0; n < dsinks.values.size(); ++n) dsinks.values[n] += ranks[r].dsinks.values[n];
    for (size_t n = 0; n < dbias.values.size(); ++n) dbias.values[n] += ranks[r].dbias.values[n];
  }
  std::vector<int64_t> calls, skipped;
  std::vector<double> seconds;
  for (int r = 0; r < world; ++r) {
    const auto& ranges = schedule.k_blocks(r);
    ranks[r].finish(blocks_of(grads.dq, schedule.q_blocks(r)), grads.accumulate);
    for (size_t b = 0; b < ranges.size(); ++b) {
      detail::KvGradBlock block = packing.grad_view(acc[r][b].data(), ranges[b].size());
      detail::store_f32(static_cast<const float*>(block.dk.data()),
                        row_slice(grads.dk, ranges[b].first, ranges[b].size()), grads.accumulate);
      detail::store_f32(static_cast<const float*>(block.dv.data()),
                        row_slice(grads.dv, ranges[b].first, ranges[b].size()), grads.accumulate);
    }
    calls.push_back(ranks[r].calls);
    skipped.push_back(ranks[r].skipped);
    seconds.push_back(ranks[r].compute_seconds);
  }
  if (!grads.dsinks.is_null()) detail::store_f32(dsinks, grads.dsinks, grads.accumulate);
  if (!grads.dbias.is_null()) detail::store_f32(dbias, grads.dbias, grads.accumulate);
  fill_stats(stats, schedule, mask, q, k_len, calls, skipped, seconds,
             bytes_sent(schedule, packing, true), options.count_allowed_pairs);
}

}  // namespace maskattn::dist
