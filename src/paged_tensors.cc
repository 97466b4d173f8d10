// attention_paged() over caller-owned pages (maskattn/paged_tensors.h): the pool tensors of
// FlashAttention's paged cache or transformers' continuous batching, read in place.
//
// Design. The kernels already read K and V through a block table (kernels/kv_pages.h) for
// maskattn's own PagedKVCache; what differs here is only who owns the pool and in which order its
// axes lie. A KVPages is a pool base plus the byte strides of the block, head and position axes,
// so the caller's views translate directly: [num_blocks, block_size, Hkv, D] gives block stride
// size(1)·size(2)·D elements, position stride Hkv·D, head stride D (for contiguous pools), and
// any other strides work alike. Nothing is copied; the call costs the checks (one pass over the
// block-table entries the lengths use) and the kernel.
//
// The placed mask puts each sequence's queries at its own end: causal & key_lengths &
// query_lengths & the caller's mask; the run itself is paged_run.h's, shared with
// paged_attention.cc (the shape-only zero views, the output checks, the reference on rows
// gathered below each sequence's length, so whatever the pool holds past it — the caller's
// padding, a freed block's old rows, NaN — never reaches the oracle).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kv_pages.h"
#include "maskattn/error.h"
#include "maskattn/kv_format.h"
#include "maskattn/paged_tensors.h"
#include "paged_run.h"
#include "validate.h"

namespace maskattn {

namespace {

using detail::KVPages;

std::string str(int64_t value) {
  return std::to_string(value);
}

constexpr const char* kWho = "attention_paged(PagedTensors)";

// E154: the two pool views agree with each other and with q, rows are contiguous, blocks hold a
// multiple of 16 positions.
void check_pools(const TensorView& q, const PagedTensors& kv) {
  detail::require_view(kv.keys, 4, "keys", "[num_blocks,block_size,Hkv,D]");
  detail::require_view(kv.values, 4, "values", "[num_blocks,block_size,Hkv,Dv]");
  const TensorView &k = kv.keys, &v = kv.values;
  const std::string shapes = " (keys " + k.shape_string() + ", values " + v.shape_string() + ")";
  if (k.dtype() != v.dtype()) {
    throw Error(std::string(kWho) + ": values have dtype " + dtype_name(v.dtype()) + " but keys " +
                dtype_name(k.dtype()) + "; the two pools share one element type");
  }
  if (k.size(0) != v.size(0) || k.size(1) != v.size(1) || k.size(2) != v.size(2)) {
    throw Error(std::string(kWho) + ": keys and values differ in [num_blocks,block_size,Hkv]" +
                shapes);
  }
  if (k.size(1) < 16 || k.size(1) % 16 != 0) {
    throw Error(std::string(kWho) + ": block_size " + str(k.size(1)) +
                " must be a positive multiple of 16 (a 64-key tile is read as at most four "
                "blocks)" +
                shapes);
  }
  if ((k.size(3) > 1 && k.stride(3) != 1) || (v.size(3) > 1 && v.stride(3) != 1)) {
    throw Error(std::string(kWho) + ": the last axis must have stride 1 (one row of D keys or " +
                "Dv values contiguous); keys strides " + shape_string(k.strides()) +
                ", values strides " + shape_string(v.strides()));
  }
  if (q.size(3) != k.size(3) || k.size(2) == 0 || q.size(1) % k.size(2) != 0) {
    throw Error(std::string(kWho) + ": q " + q.shape_string() + " does not fit pools of " +
                str(k.size(2)) + " kv heads of dim " + str(k.size(3)) +
                " (Hq a multiple of Hkv, D the same)");
  }
}

// E155: one length per sequence, each held by the table's row, every entry read a pool block.
void check_table(int64_t batch, const PagedTensors& kv) {
  const int64_t blocks = kv.keys.size(0), block_size = kv.keys.size(1);
  if (static_cast<int64_t>(kv.lengths.size()) != batch) {
    throw Error(std::string(kWho) + ": lengths has " +
                str(static_cast<int64_t>(kv.lengths.size())) + " values but q has a batch of " +
                str(batch));
  }
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = kv.lengths[b];
    if (length < 0 || length > kv.table_columns * block_size) {
      throw Error(std::string(kWho) + ": lengths[" + str(b) + "] = " + str(length) +
                  " must be in [0, table_columns·block_size] = [0, " +
                  str(kv.table_columns * block_size) + "]");
    }
    if (length > 0 && kv.block_table == nullptr) {
      throw Error(std::string(kWho) + ": block_table is null but lengths[" + str(b) +
                  "] = " + str(length));
    }
    const int64_t used = (length + block_size - 1) / block_size;
    for (int64_t j = 0; j < used; ++j) {
      const int32_t block = kv.block_table[b * kv.table_columns + j];
      if (block < 0 || block >= blocks) {
        throw Error(std::string(kWho) + ": block_table[" + str(b) + "][" + str(j) +
                    "] = " + str(block) + " is not a block of the pools [0, " + str(blocks) +
                    ") but holds positions of a sequence of length " + str(length));
      }
    }
  }
}

// E156: query counts, defaulting to Lq. A count above the sequence's length is allowed: its
// first rows sit before position 0 and, under causal, see nothing (FlashAttention's rule for
// seqlen_q > seqlen_k: zero rows).
std::vector<int64_t> query_counts(const TensorView& q, const std::vector<int64_t>& query_lengths) {
  const int64_t batch = q.size(0), q_len = q.size(2);
  if (!query_lengths.empty() && static_cast<int64_t>(query_lengths.size()) != batch) {
    throw Error(std::string(kWho) + ": query_lengths has " +
                str(static_cast<int64_t>(query_lengths.size())) + " values but q " +
                q.shape_string() + " has a batch of " + str(batch) +
                " (empty: Lq for every entry)");
  }
  std::vector<int64_t> counts(static_cast<size_t>(batch), q_len);
  for (int64_t b = 0; b < batch && !query_lengths.empty(); ++b) {
    counts[b] = query_lengths[b];
    if (counts[b] < 0 || counts[b] > q_len) {
      throw Error(std::string(kWho) + ": query_lengths[" + str(b) + "] = " + str(counts[b]) +
                  " must be in [0, Lq] = [0, " + str(q_len) + "] (q " + q.shape_string() + ")");
    }
  }
  return counts;
}

// The caller's strides as the kernels' byte strides (kv_pages.h).
KVPages pages_of(const PagedTensors& kv) {
  const auto element = static_cast<int64_t>(dtype_size(kv.keys.dtype()));
  const TensorView &k = kv.keys, &v = kv.values;
  KVPages pages;
  pages.format = kv_format_of(k.dtype());
  pages.key_pool = static_cast<const uint8_t*>(k.data());
  pages.value_pool = static_cast<const uint8_t*>(v.data());
  pages.key_row_bytes = k.size(3) * element;
  pages.value_row_bytes = v.size(3) * element;
  pages.key_block_bytes = k.stride(0) * element;
  pages.key_position_bytes = k.stride(1) * element;
  pages.key_head_bytes = k.stride(2) * element;
  pages.value_block_bytes = v.stride(0) * element;
  pages.value_position_bytes = v.stride(1) * element;
  pages.value_head_bytes = v.stride(2) * element;
  pages.block_size = k.size(1);
  pages.table = kv.block_table;
  pages.table_stride = kv.table_columns;
  pages.lengths = kv.lengths.data();
  return pages;
}

}  // namespace

void attention_paged(const TensorView& q, const PagedTensors& kv, const MutableTensorView& out,
                     const std::vector<int64_t>& query_lengths, const Mask& mask,
                     const ScoreMods& mods, const Options& options, const MutableTensorView& lse) {
  detail::require_view(q, 4, "q", "[B,Hq,Lq,D]");
  check_pools(q, kv);
  check_table(q.size(0), kv);
  const std::vector<int64_t> queries = query_counts(q, query_lengths);
  detail::PagedCall call;
  call.per_sequence =
      detail::tree_per_sequence(mask, kv.lengths, queries, q.size(2), options.frame, kWho);
  call.queries = queries;
  call.pages = pages_of(kv);
  call.kv_heads = kv.keys.size(2);
  call.head_dim = kv.keys.size(3);
  call.value_dim = kv.values.size(3);
  call.values = "values " + kv.values.shape_string();
  call.inputs = {{kv.keys, "keys"}, {kv.values, "values"}};
  Mask placed = Mask().key_lengths(kv.lengths) & Mask().query_lengths(queries) & mask;
  if (kv.causal) placed = Mask().causal() & placed;
  detail::run_paged(q, std::move(call), placed, mods, options, out, lse);
}

}  // namespace maskattn
