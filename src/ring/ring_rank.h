// One rank's arithmetic in the ring, shared by the emulator and the MPI code so that both do the
// same operations in the same order (bitwise equal results). The callers only differ in where the
// held key/value blocks come from: slices of the global tensors (emulator) or message buffers
// (MPI).
//
// Forward: each call of a step writes an f32 part (out, lse) of one query block against one key
// block in the global frame; parts are merged into the block's f32 accumulator (merge_into:
// merge_partials's arithmetic) in the schedule's order (step, then key block), and rounded to the
// output dtype once, in finish().
//
// Backward: dQ accumulates (Gradients::accumulate, f32) over every call of every step; the dK/dV
// of a held block are this step's contributions alone, in f32 buffers the caller provides and
// then adds to the block's travelling accumulator (an f32 add; a + b = b + a, so where the add
// happens does not matter, only which terms). dsinks and dbias accumulate per rank and are summed
// over ranks in rank order.
#pragma once

#include <cstdint>
#include <vector>

#include "core/store_f32.h"
#include "maskattn/attention.h"
#include "ring/ring_schedule.h"

namespace maskattn::dist::detail {

// Rows [first, first + count) along axis 2 of a [B, H, L, …] view.
TensorView row_slice(const TensorView& t, int64_t first, int64_t count);
MutableTensorView row_slice(const MutableTensorView& t, int64_t first, int64_t count);

// An owned, contiguous f32 tensor.
struct F32Tensor {
  Dims dims;
  std::vector<float> values;
  F32Tensor() = default;
  F32Tensor(Dims sizes, float fill);
  TensorView view() const { return TensorView(values.data(), dims); }
  MutableTensorView mutable_view() { return MutableTensorView(values.data(), dims); }
};

// dst = src, or dst + src when `add`, rounded once to dst's dtype (core/store_f32.h).
using maskattn::detail::store_f32;
inline void store_f32(const F32Tensor& src, const MutableTensorView& dst, bool add) {
  store_f32(src.values.data(), dst, add);
}

// acc ← merge_partials({acc, part}), bit for bit, in place; out [.., rows, Dv], lse [.., rows].
void merge_into(F32Tensor& acc_out, F32Tensor& acc_lse, const F32Tensor& part_out,
                const F32Tensor& part_lse);

struct KvBlock {
  TensorView k, v;
};
struct KvGradBlock {
  MutableTensorView dk, dv;  // f32
};

// How key/value blocks are laid out in a message (and in the emulator's copies, so that both feed
// attention() the same memory layout): per block, K [B,Hkv,rows,D] then V [B,Hkv,rows,Dv],
// contiguous, in the input dtype. The travelling dK/dV accumulators are laid out the same way in
// f32.
struct KvPacking {
  int64_t batch = 0, kv_heads = 0, head_dim = 0, value_dim = 0;
  DType dtype = DType::f32;

  static KvPacking of(const TensorView& k, const TensorView& v);
  int64_t block_bytes(int64_t rows) const;        // K and V of one block
  int64_t grad_block_floats(int64_t rows) const;  // dK and dV of one block
  // Copies rows [first, first + rows) of k and v into `dst` (block_bytes(rows) bytes).
  void pack(const TensorView& k, const TensorView& v, int64_t first, int64_t rows, char* dst) const;
  KvBlock view(const char* block, int64_t rows) const;
  KvGradBlock grad_view(float* block, int64_t rows) const;
};

// What stays the same for every call of a ring run.
struct RingCallContext {
  const RingSchedule* schedule = nullptr;
  const Mask* mask = nullptr;
  const ScoreMods* mods = nullptr;
  Options base;
  int64_t q_len = 0, k_len = 0;  // global
};

class ForwardRank {
 public:
  ForwardRank(const RingCallContext& context, int rank, std::vector<TensorView> q_blocks,
              int64_t value_dim);
  // The calls of step `step`; `held` follows the step's held list.
  void run_step(int step, const std::vector<KvBlock>& held);
  // Rounds the accumulators into the rank's output (and lse) blocks.
  void finish(const std::vector<MutableTensorView>& out_blocks,
              const std::vector<MutableTensorView>& lse_blocks);

  int64_t calls = 0, skipped = 0;
  double compute_seconds = 0;

 private:
  RingCallContext context_;
  int rank_;
  std::vector<TensorView> q_blocks_;
  std::vector<F32Tensor> out_acc_, lse_acc_, out_part_, lse_part_;
  std::vector<bool> has_part_;
};

class BackwardRank {
 public:
  // out/lse are the merged forward results of the rank's query rows; dsinks/dbias are accumulated
  // when the caller wants them.
  BackwardRank(const RingCallContext& context, int rank, std::vector<TensorView> q_blocks,
               std::vector<TensorView> out_blocks, std::vector<TensorView> lse_blocks,
               std::vector<TensorView> dout_blocks, bool want_dsinks, bool want_dbias);
  // Zeroes `grads` (one per held block) and adds this step's dK/dV to them.
  void run_step(int step, const std::vector<KvBlock>& held, const std::vector<KvGradBlock>& grads);
  // Writes dQ into the rank's blocks (added to them when `accumulate`).
  void finish(const std::vector<MutableTensorView>& dq_blocks, bool accumulate) const;

  F32Tensor dsinks, dbias;  // this rank's part of the sums (when wanted)
  int64_t calls = 0, skipped = 0;
  double compute_seconds = 0;

 private:
  RingCallContext context_;
  int rank_;
  std::vector<TensorView> q_blocks_, out_blocks_, lse_blocks_, dout_blocks_;
  std::vector<F32Tensor> dq_acc_;
  bool want_dsinks_, want_dbias_;
};

// Pairs (b, h, i, j) the mask allows for the rank's query rows against every key (RingStats).
// count_allowed per row range: O(tiles), computed only when stats are asked for.
int64_t count_allowed_pairs(const Mask& mask, int64_t batch, int64_t q_heads, int64_t q_len,
                            int64_t k_len, const std::vector<RowRange>& q_rows);

}  // namespace maskattn::dist::detail
