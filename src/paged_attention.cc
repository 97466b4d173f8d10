// attention_paged(): attention of a batch of queries against sequences of a PagedKVCache, read in
// place through their block tables (kernels/kv_pages.h). The boundary checks live here; the mask
// that places each sequence's queries at its own end is built here (docs/semantics.md §18).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kv_pages.h"
#include "maskattn/error.h"
#include "maskattn/paged_kv_cache.h"
#include "paged_run.h"
#include "validate.h"

namespace maskattn {

namespace {

using detail::KVPages;

std::string str(int64_t value) {
  return std::to_string(value);
}

// Sequence lengths and query counts per batch entry, checked against q and the cache.
struct PagedBatch {
  std::vector<int64_t> lengths, query_lengths;
  std::vector<int32_t> table;  // [B][max_blocks]
  int64_t max_blocks = 0;
};

PagedBatch batch_of(const TensorView& q, const PagedKVCache& cache,
                    const std::vector<int64_t>& sequences,
                    const std::vector<int64_t>& query_lengths) {
  const int64_t batch = q.size(0), q_len = q.size(2);
  if (static_cast<int64_t>(sequences.size()) != batch) {
    throw Error("attention_paged: sequences has " + str(static_cast<int64_t>(sequences.size())) +
                " ids but q " + q.shape_string() + " has a batch of " + str(batch));
  }
  if (!query_lengths.empty() && static_cast<int64_t>(query_lengths.size()) != batch) {
    throw Error("attention_paged: query_lengths has " +
                str(static_cast<int64_t>(query_lengths.size())) + " values but q " +
                q.shape_string() + " has a batch of " + str(batch) +
                " (empty: Lq for every entry)");
  }
  if (q.size(3) != cache.head_dim() || q.size(1) % cache.kv_heads() != 0) {
    throw Error("attention_paged: q " + q.shape_string() + " does not fit the cache's " +
                str(cache.kv_heads()) + " kv heads of dim " + str(cache.head_dim()) +
                " (Hq a multiple of Hkv, D = head_dim)");
  }
  PagedBatch out;
  for (int64_t b = 0; b < batch; ++b) {
    if (!cache.contains(sequences[b])) {
      throw Error("attention_paged: sequences[" + str(b) + "] = " + str(sequences[b]) +
                  " is not a live sequence of the cache");
    }
    const int64_t length = cache.length(sequences[b]);
    const int64_t queries = query_lengths.empty() ? q_len : query_lengths[b];
    if (queries < 0 || queries > std::min(q_len, length)) {
      throw Error("attention_paged: query_lengths[" + str(b) + "] = " + str(queries) +
                  " must be in [0, min(Lq, length)] = [0, " + str(std::min(q_len, length)) +
                  "]: the queries are the sequence's last positions, already appended");
    }
    out.lengths.push_back(length);
    out.query_lengths.push_back(queries);
    out.max_blocks = std::max<int64_t>(out.max_blocks, cache.block_table(sequences[b]).size());
  }
  out.table.assign(static_cast<size_t>(std::max<int64_t>(batch * out.max_blocks, 1)), 0);
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<int32_t>& blocks = cache.block_table(sequences[b]);
    std::copy(blocks.begin(), blocks.end(), out.table.begin() + b * out.max_blocks);
  }
  return out;
}

}  // namespace

void attention_paged(const TensorView& q, const PagedKVCache& cache,
                     const std::vector<int64_t>& sequences, const MutableTensorView& out,
                     const std::vector<int64_t>& query_lengths, const Mask& mask,
                     const ScoreMods& mods, const Options& options, const MutableTensorView& lse) {
  detail::require_view(q, 4, "q", "[B,Hq,Lq,D]");
  const PagedBatch batch = batch_of(q, cache, sequences, query_lengths);
  detail::PagedCall call;
  call.per_sequence = detail::tree_per_sequence(mask, batch.lengths, batch.query_lengths, q.size(2),
                                                options.frame, "attention_paged", &sequences);
  call.queries = batch.query_lengths;
  KVPages& pages = call.pages;
  pages.format = cache.format();
  pages.key_pool = cache.key_pool();
  pages.value_pool = cache.value_pool();
  pages.key_row_bytes = cache.key_row_bytes();
  pages.value_row_bytes = cache.value_row_bytes();
  // The cache's blocks are [Hkv, block_size, row]: one head's positions are contiguous.
  pages.key_position_bytes = cache.key_row_bytes();
  pages.key_head_bytes = cache.block_size() * cache.key_row_bytes();
  pages.key_block_bytes = cache.kv_heads() * pages.key_head_bytes;
  pages.value_position_bytes = cache.value_row_bytes();
  pages.value_head_bytes = cache.block_size() * cache.value_row_bytes();
  pages.value_block_bytes = cache.kv_heads() * pages.value_head_bytes;
  pages.block_size = cache.block_size();
  pages.table = batch.table.data();
  pages.table_stride = batch.max_blocks;
  pages.lengths = batch.lengths.data();
  call.kv_heads = cache.kv_heads();
  call.head_dim = cache.head_dim();
  call.value_dim = cache.value_dim();
  call.values = "the cache's value_dim " + str(cache.value_dim());
  // Each sequence's queries at its own end: ragged bottom-right alignment (§2).
  const Mask placed = Mask().causal() & Mask().key_lengths(batch.lengths) &
                      Mask().query_lengths(batch.query_lengths) & mask;
  detail::run_paged(q, std::move(call), placed, mods, options, out, lse);
}

}  // namespace maskattn
