// PagedKVCache: the keys and values of one attention layer for many sequences of their own lengths,
// in a pool of fixed-size blocks (docs/semantics.md §18), the way vLLM and FlashAttention ≥ 2.5
// keep them: each sequence owns a list of blocks (its block table), grows a block at a time, can
// share its blocks with a fork (copy on write: prefix sharing), and gives them back when freed. The
// pool is allocated once and is the cache's whole memory; requests that do not fit are refused with
// an error, never by growing.
//
// Layout: position p of a sequence is row p mod block_size of block table[p / block_size]; a block
// is [Hkv, block_size, row] (vLLM's CPU layout, head-major: decoding streams one kv head's
// positions, and FlashAttention's [block_size, Hkv, D] would put them Hkv rows apart, a new 4 KiB
// page every row at Hkv = 8, D = 128 in f32 — measured 3× slower here); a row holds one kv head's
// D keys (Dv values) in the cache's format (maskattn/kv_format.h: f32, f16, bf16, or quantized on
// append). attention_paged() reads the rows in place through the block tables: no gather copy.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "maskattn/attention.h"
#include "maskattn/kv_format.h"
#include "maskattn/mask.h"
#include "maskattn/score_mods.h"
#include "maskattn/tensor.h"

namespace maskattn {

class PagedKVCache {
 public:
  // block_size: positions per block, a multiple of 16 in [16, 1024]; value_dim 0 means head_dim.
  // Throws Error E147 for bad sizes, E144 for a q4 head dim that is not a multiple of 32, and the
  // memory error when the pool would exceed the cap (maskattn/memory.h).
  PagedKVCache(int64_t blocks, int64_t block_size, int64_t kv_heads, int64_t head_dim,
               KVFormat format = KVFormat::f32, int64_t value_dim = 0);

  int64_t blocks() const { return blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t value_dim() const { return value_dim_; }
  KVFormat format() const { return format_; }
  int64_t key_row_bytes() const { return key_row_bytes_; }
  int64_t value_row_bytes() const { return value_row_bytes_; }
  // Bytes one position of one sequence takes (every kv head, keys and values).
  int64_t bytes_per_position() const { return kv_heads_ * (key_row_bytes_ + value_row_bytes_); }

  // ---- sequences ----
  // A new empty sequence; returns its id (the smallest free id: ids of freed sequences are reused).
  int64_t add_sequence();
  // A new sequence holding the same positions as `parent`, sharing its blocks until either writes
  // into a shared one (which then gets its own copy first). Takes no block.
  int64_t fork(int64_t parent);
  // Gives the sequence's blocks back (those no fork still shares) and retires its id.
  void free(int64_t sequence);
  bool contains(int64_t sequence) const;
  int64_t length(int64_t sequence) const;
  std::vector<int64_t> live_sequences() const;  // in id order

  // Appends T positions: k [Hkv, T, D], v [Hkv, T, Dv], any element type and strides, encoded
  // into the cache's format. Throws, changing nothing, when the pool has too few free blocks
  // (E146), a value cannot be stored (E145: not finite, or too large for a quantized format's
  // f16 scale), or a shape disagrees (E148).
  void append(int64_t sequence, const TensorView& k, const TensorView& v);
  // Drops positions from the end (speculative decoding's rollback), returning emptied blocks.
  void truncate(int64_t sequence, int64_t length);
  // Speculative decoding's verification: the sequence's last `draft` positions are a draft (a
  // chain or a tree, Mask::tree); keeps the draft positions `path` (indices into the draft,
  // strictly increasing: the accepted tokens root to leaf), moved to follow the prefix, and drops
  // the rest. Blocks shared with a fork are copied before they are written. Throws E148 for a
  // path outside [0, draft) or not increasing, E146 when the copies find no free block; either
  // way nothing changes.
  void accept(int64_t sequence, int64_t draft, const std::vector<int64_t>& path);
  // Blocks an append of `count` more positions would take (copy-on-write included).
  int64_t blocks_needed(int64_t sequence, int64_t count) const;

  // ---- the pool ----
  int64_t free_blocks() const { return static_cast<int64_t>(free_list_.size()); }
  int64_t blocks_in_use() const { return blocks_ - free_blocks(); }
  // The sequence's block table (pool block per block of positions).
  const std::vector<int32_t>& block_table(int64_t sequence) const;
  // Row bytes of one position and kv head, in place (for the kernels and tests).
  const uint8_t* key_row(int32_t block, int64_t row, int64_t kv_head) const;
  const uint8_t* value_row(int32_t block, int64_t row, int64_t kv_head) const;
  const uint8_t* key_pool() const { return keys_.get(); }
  const uint8_t* value_pool() const { return values_.get(); }

  // The sequence's keys and values decoded to f32: [Hkv, length, D] and [Hkv, length, Dv]
  // (exactly the values attention reads; for tests and inspection).
  std::vector<float> decoded_keys(int64_t sequence) const;
  std::vector<float> decoded_values(int64_t sequence) const;

 private:
  struct Sequence {
    bool live = false;
    int64_t length = 0;
    std::vector<int32_t> blocks;
  };
  const Sequence& sequence(int64_t id, const char* who) const;
  Sequence& sequence(int64_t id, const char* who);
  int32_t take_block();
  void release_block(int32_t block);
  void copy_block(int32_t from, int32_t to);
  void copy_row(int32_t from_block, int64_t from_row, int32_t to_block, int64_t to_row);
  std::vector<float> decoded(int64_t sequence, bool keys) const;

  int64_t blocks_, block_size_, kv_heads_, head_dim_, value_dim_;
  KVFormat format_;
  int64_t key_row_bytes_, value_row_bytes_;
  // [blocks, Hkv, block_size, row bytes], from calloc: the system hands out zero pages as they
  // are first written, so the process's memory follows the blocks in use, not the pool's size
  // (a fresh pool reads as zeros either way).
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> keys_, values_;
  std::vector<int32_t> references_;  // per block: sequences holding it
  std::vector<int32_t> free_list_;   // free blocks, taken from the back
  std::vector<Sequence> sequences_;
};

// Attention of B query batches against B sequences of a paged cache: batch entry b's queries
// q[b, :, :query_lengths[b], :] are the last query_lengths[b] positions of sequence
// sequences[b] (already appended), aligned bottom-right in that sequence alone (its own length:
// docs/semantics.md §2's ragged batches); rows past query_lengths[b] are padding and output 0.
// q [B, Hq, Lq, D] (f32, f16, bf16); out [B, Hq, Lq, Dv] in q's dtype (or f32). The mask applied
// is causal & key_lengths(lengths) & query_lengths(query_lengths) & `mask`, over
// [B, Hq, Lq, max length]; query_lengths empty means Lq for every entry. A draft tree
// (Mask::tree) is each sequence's own, its draft the sequence's last T positions: when the
// sequences differ in length or have fewer than Lq queries, sequence b is computed as this call on
// it alone (its rows, `mask` and `mods` restricted to entry b), bit for bit. The fused kernel reads
// the cache in place; Kernel::reference decodes it first (the oracle). Errors: E148.
void attention_paged(const TensorView& q, const PagedKVCache& cache,
                     const std::vector<int64_t>& sequences, const MutableTensorView& out,
                     const std::vector<int64_t>& query_lengths = {}, const Mask& mask = {},
                     const ScoreMods& mods = {}, const Options& options = {},
                     const MutableTensorView& lse = {});

}  // namespace maskattn
