#include "ring/ring_rank.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "kernels/merge.h"

namespace maskattn::dist::detail {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Dims with_length(const TensorView& t, int64_t length) {
  Dims sizes = t.sizes();
  sizes[2] = length;
  return sizes;
}

Options frame_options(const RingCallContext& context, const RowRange& q, const RowRange& k,
                      bool count_sinks) {
  Options options = context.base;
  options.frame = Frame{q.first, k.first, context.q_len, context.k_len};
  options.count_sinks = count_sinks;
  return options;
}

}  // namespace

TensorView row_slice(const TensorView& t, int64_t first, int64_t count) {
  const auto* base = static_cast<const char*>(t.data());
  const int64_t bytes = first * t.stride(2) * static_cast<int64_t>(dtype_size(t.dtype()));
  return TensorView(base + bytes, t.dtype(), with_length(t, count), t.strides());
}

MutableTensorView row_slice(const MutableTensorView& t, int64_t first, int64_t count) {
  auto* base = static_cast<char*>(t.mutable_data());
  const int64_t bytes = first * t.stride(2) * static_cast<int64_t>(dtype_size(t.dtype()));
  return MutableTensorView(base + bytes, t.dtype(), with_length(t, count), t.strides());
}

F32Tensor::F32Tensor(Dims sizes, float fill) : dims(std::move(sizes)) {
  int64_t count = 1;
  for (int64_t size : dims) count *= size;
  values.assign(static_cast<size_t>(count), fill);
}

// ---- packing ---------------------------------------------------------------------------------

KvPacking KvPacking::of(const TensorView& k, const TensorView& v) {
  return {k.size(0), k.size(1), k.size(3), v.size(3), k.dtype()};
}

int64_t KvPacking::block_bytes(int64_t rows) const {
  return batch * kv_heads * rows * (head_dim + value_dim) * static_cast<int64_t>(dtype_size(dtype));
}

int64_t KvPacking::grad_block_floats(int64_t rows) const {
  return batch * kv_heads * rows * (head_dim + value_dim);
}

namespace {

// The rows of a [B,H,L,X] view into a contiguous [B,H,rows,X] buffer, byte for byte.
char* copy_rows(const TensorView& src, int64_t first, int64_t rows, char* dst) {
  const size_t element = dtype_size(src.dtype());
  const auto* base = static_cast<const char*>(src.data());
  for (int64_t b = 0; b < src.size(0); ++b) {
    for (int64_t h = 0; h < src.size(1); ++h) {
      for (int64_t i = first; i < first + rows; ++i) {
        const int64_t row = b * src.stride(0) + h * src.stride(1) + i * src.stride(2);
        if (src.stride(3) == 1) {
          std::memcpy(dst, base + row * static_cast<int64_t>(element), src.size(3) * element);
          dst += src.size(3) * element;
          continue;
        }
        for (int64_t e = 0; e < src.size(3); ++e, dst += element) {
          std::memcpy(dst, base + (row + e * src.stride(3)) * static_cast<int64_t>(element),
                      element);
        }
      }
    }
  }
  return dst;
}

}  // namespace

void KvPacking::pack(const TensorView& k, const TensorView& v, int64_t first, int64_t rows,
                     char* dst) const {
  copy_rows(v, first, rows, copy_rows(k, first, rows, dst));
}

KvBlock KvPacking::view(const char* block, int64_t rows) const {
  const int64_t k_bytes =
      batch * kv_heads * rows * head_dim * static_cast<int64_t>(dtype_size(dtype));
  return {TensorView(block, dtype, {batch, kv_heads, rows, head_dim}),
          TensorView(block + k_bytes, dtype, {batch, kv_heads, rows, value_dim})};
}

KvGradBlock KvPacking::grad_view(float* block, int64_t rows) const {
  const int64_t k_floats = batch * kv_heads * rows * head_dim;
  return {MutableTensorView(block, {batch, kv_heads, rows, head_dim}),
          MutableTensorView(block + k_floats, {batch, kv_heads, rows, value_dim})};
}

// ---- merging
// -------------------------------------------------------------------------------------

// acc ← the merge of acc and part, row by row, in place: the one merge (kernels/merge.h), the
// same bits as merge_partials({acc, part}).
void merge_into(F32Tensor& acc_out, F32Tensor& acc_lse, const F32Tensor& part_out,
                const F32Tensor& part_lse) {
  const size_t rows = acc_lse.values.size();
  const size_t width = rows == 0 ? 0 : acc_out.values.size() / rows;
  double weights[2];
  for (size_t r = 0; r < rows; ++r) {
    float* out = acc_out.values.data() + r * width;
    const float* parts[2] = {out, part_out.values.data() + r * width};
    const float lses[2] = {acc_lse.values[r], part_lse.values[r]};
    acc_lse.values[r] = maskattn::detail::merge_row(2, parts, lses, -INFINITY,
                                                    static_cast<int64_t>(width), weights, out);
  }
}

// ---- forward ------------------------------------------------------------------------------------

ForwardRank::ForwardRank(const RingCallContext& context, int rank, std::vector<TensorView> q_blocks,
                         int64_t value_dim)
    : context_(context), rank_(rank), q_blocks_(std::move(q_blocks)) {
  for (const TensorView& q : q_blocks_) {
    const Dims out_dims = {q.size(0), q.size(1), q.size(2), value_dim};
    const Dims lse_dims = {q.size(0), q.size(1), q.size(2)};
    out_acc_.emplace_back(out_dims, 0.0f);
    lse_acc_.emplace_back(lse_dims, -INFINITY);
    out_part_.emplace_back(out_dims, 0.0f);
    lse_part_.emplace_back(lse_dims, 0.0f);
  }
  has_part_.assign(q_blocks_.size(), false);
}

void ForwardRank::run_step(int step, const std::vector<KvBlock>& held) {
  const RingStep& plan = context_.schedule->step(rank_, step);
  const auto& k_ranges = context_.schedule->k_blocks(plan.origin);
  const auto& q_ranges = context_.schedule->q_blocks(rank_);
  const auto start = Clock::now();
  for (const PairCall& call : plan.calls) {
    size_t slot = 0;
    while (plan.held[slot] != call.k_block) ++slot;
    const int a = call.q_block;
    attention(q_blocks_[a], held[slot].k, held[slot].v, out_part_[a].mutable_view(), *context_.mask,
              *context_.mods,
              frame_options(context_, q_ranges[a], k_ranges[call.k_block], call.count_sinks),
              lse_part_[a].mutable_view());
    if (!has_part_[a]) {  // the first part is the accumulator as it stands
      std::swap(out_acc_[a], out_part_[a]);
      std::swap(lse_acc_[a], lse_part_[a]);
      has_part_[a] = true;
      continue;
    }
    merge_into(out_acc_[a], lse_acc_[a], out_part_[a], lse_part_[a]);
  }
  compute_seconds += seconds_since(start);
  calls += static_cast<int64_t>(plan.calls.size());
  skipped += plan.skipped;
}

void ForwardRank::finish(const std::vector<MutableTensorView>& out_blocks,
                         const std::vector<MutableTensorView>& lse_blocks) {
  for (size_t a = 0; a < q_blocks_.size(); ++a) {
    if (!has_part_[a]) {  // no key of any rank is allowed: O = 0, LSE = −inf (as attention())
      std::fill(out_acc_[a].values.begin(), out_acc_[a].values.end(), 0.0f);
      std::fill(lse_acc_[a].values.begin(), lse_acc_[a].values.end(), -INFINITY);
    }
    store_f32(out_acc_[a], out_blocks[a], false);
    if (!lse_blocks.empty()) store_f32(lse_acc_[a], lse_blocks[a], false);
  }
}

// ---- backward -----------------------------------------------------------------------------------

BackwardRank::BackwardRank(const RingCallContext& context, int rank,
                           std::vector<TensorView> q_blocks, std::vector<TensorView> out_blocks,
                           std::vector<TensorView> lse_blocks, std::vector<TensorView> dout_blocks,
                           bool want_dsinks, bool want_dbias)
    : context_(context),
      rank_(rank),
      q_blocks_(std::move(q_blocks)),
      out_blocks_(std::move(out_blocks)),
      lse_blocks_(std::move(lse_blocks)),
      dout_blocks_(std::move(dout_blocks)),
      want_dsinks_(want_dsinks),
      want_dbias_(want_dbias) {
  for (const TensorView& q : q_blocks_) dq_acc_.emplace_back(q.sizes(), 0.0f);
  if (want_dsinks_) dsinks = F32Tensor({static_cast<int64_t>(context_.mods->sinks.size())}, 0.0f);
  if (want_dbias_) dbias = F32Tensor(context_.mods->bias->shape(), 0.0f);
}

void BackwardRank::run_step(int step, const std::vector<KvBlock>& held,
                            const std::vector<KvGradBlock>& grads) {
  const RingStep& plan = context_.schedule->step(rank_, step);
  const auto& k_ranges = context_.schedule->k_blocks(plan.origin);
  const auto& q_ranges = context_.schedule->q_blocks(rank_);
  for (const KvGradBlock& g : grads) {
    std::fill_n(static_cast<float*>(g.dk.mutable_data()), g.dk.numel(), 0.0f);
    std::fill_n(static_cast<float*>(g.dv.mutable_data()), g.dv.numel(), 0.0f);
  }
  const auto start = Clock::now();
  for (const PairCall& call : plan.calls) {
    size_t slot = 0;
    while (plan.held[slot] != call.k_block) ++slot;
    const int a = call.q_block;
    Gradients part;
    part.dq = dq_acc_[a].mutable_view();
    part.dk = grads[slot].dk;
    part.dv = grads[slot].dv;
    // The sinks' gradient is a per-row term: only the part that counts them carries it.
    if (want_dsinks_ && call.count_sinks) part.dsinks = dsinks.mutable_view();
    if (want_dbias_) part.dbias = dbias.mutable_view();
    part.accumulate = true;
    attention_backward(
        q_blocks_[a], held[slot].k, held[slot].v, out_blocks_[a], lse_blocks_[a], dout_blocks_[a],
        part, *context_.mask, *context_.mods,
        frame_options(context_, q_ranges[a], k_ranges[call.k_block], call.count_sinks));
  }
  compute_seconds += seconds_since(start);
  calls += static_cast<int64_t>(plan.calls.size());
  skipped += plan.skipped;
}

void BackwardRank::finish(const std::vector<MutableTensorView>& dq_blocks, bool accumulate) const {
  for (size_t a = 0; a < q_blocks_.size(); ++a) store_f32(dq_acc_[a], dq_blocks[a], accumulate);
}

int64_t count_allowed_pairs(const Mask& mask, int64_t batch, int64_t q_heads, int64_t q_len,
                            int64_t k_len, const std::vector<RowRange>& q_rows) {
  int64_t count = 0;
  for (const RowRange& rows : q_rows) {
    if (rows.end <= rows.first) continue;
    const MaskShape slice{batch, q_heads, rows.end - rows.first, k_len};
    count += count_allowed(mask, slice, Frame{rows.first, 0, q_len, k_len});
  }
  return count;
}

}  // namespace maskattn::dist::detail
