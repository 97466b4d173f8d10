// Attention over a paged KV cache the caller owns: the keys and values of one layer kept as two
// tensors [num_blocks, block_size, Hkv, D] with a block table per sequence, the layout of
// FlashAttention's flash_attn_with_kvcache(block_table=…), of vLLM's flash backend and of Hugging
// Face transformers' continuous batching (PagedAttentionCache). maskattn's own PagedKVCache
// (paged_kv_cache.h) owns its pool; this entry reads someone else's, in place: no gather copy.
//
// The kernels read pages through one description (src/kernels/kv_pages.h): a pool base and the
// byte strides of its block, position and head axes. The caller's views give those strides, so
// any axis order works, as long as one row (the D keys of a position and kv head) is contiguous.
//
// Semantics are attention_paged()'s (paged_kv_cache.h): batch entry b's queries
// q[b, :, :query_lengths[b]] are the last query_lengths[b] of the lengths[b] positions of its
// sequence (already written into the pages), aligned at that sequence's own end; rows past
// query_lengths[b] are padding and output 0. More queries than positions put the first ones
// before position 0, where causal hides every key (zero rows, as FlashAttention's
// seqlen_q > seqlen_k). With `causal` false every query sees all of its sequence's positions
// (FlashAttention's causal=False).
#pragma once

#include <cstdint>
#include <vector>

#include "maskattn/attention.h"
#include "maskattn/mask.h"
#include "maskattn/score_mods.h"
#include "maskattn/tensor.h"

namespace maskattn {

struct PagedTensors {
  // [num_blocks, block_size, Hkv, D] and [num_blocks, block_size, Hkv, Dv], f32, f16 or bf16 (the
  // same for both), any strides with a unit stride along D. block_size is a multiple of 16 (the
  // kernels read a 64-key tile as at most four runs, one per block).
  TensorView keys, values;
  // [B][table_columns], row-major: the pool blocks holding positions [j·block_size, …) of each
  // sequence. Only the first ⌈lengths[b] / block_size⌉ entries of row b are read (others, such as
  // FlashAttention's and transformers' −1 fill, are ignored); each must be in [0, num_blocks).
  const int32_t* block_table = nullptr;
  int64_t table_columns = 0;
  // [B]: the positions each sequence holds, the queries' own included.
  std::vector<int64_t> lengths;
  // Queries placed at their sequence's end (bottom-right, docs/semantics.md §2); false: none of
  // the sequence's positions is hidden by position.
  bool causal = true;
};

// Attention of q [B, Hq, Lq, D] (f32, f16, bf16) against the B sequences of `kv`; out
// [B, Hq, Lq, Dv] in q's dtype (or f32). The mask applied is (causal &) key_lengths(lengths) &
// query_lengths(query_lengths) & `mask` over [B, Hq, Lq, max length]; query_lengths empty means
// Lq for every entry. A draft tree (Mask::tree) is each sequence's own, as in the PagedKVCache
// overload. The fused kernel reads the pages in place; Kernel::reference gathers them into f32
// first (the oracle). Rows of the last block past a sequence's length are read but hidden by the
// mask, and may hold anything, even NaN. Errors: E154 (the pages), E155 (the block table and
// lengths), E156 (query_lengths), E148 (a tree longer than a sequence, or with a frame), and
// attention()'s for q, out, lse, mask and modifiers.
void attention_paged(const TensorView& q, const PagedTensors& kv, const MutableTensorView& out,
                     const std::vector<int64_t>& query_lengths = {}, const Mask& mask = {},
                     const ScoreMods& mods = {}, const Options& options = {},
                     const MutableTensorView& lse = {});

}  // namespace maskattn
