// KVCache: the keys and values of one attention layer kept across decoding steps (docs/semantics.md
// §13). Storage is [B, Hkv, capacity, D] (and Dv for values) in f32, f16 or bf16, allocated once;
// appends fill it left to right, the same number of positions for every sequence, so that a batch
// of prompts of different lengths is left padded: sequence b's first real token sits at column
// starts[b], and the mask hides the columns before it and counts positions from it. A step's
// queries are the last positions appended, aligned bottom-right (docs/design.md §2): no offset
// argument can go stale.
#pragma once

#include <cstdint>
#include <vector>

#include "maskattn/dtype.h"
#include "maskattn/mask.h"
#include "maskattn/tensor.h"

namespace maskattn {

class KVCache {
 public:
  // value_dim 0 means head_dim. Throws Error for non-positive sizes or when the two buffers would
  // exceed the memory limit (maskattn/memory.h).
  KVCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim,
          DType dtype = DType::f32, int64_t value_dim = 0);

  int64_t batch() const { return batch_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t capacity() const { return capacity_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t value_dim() const { return value_dim_; }
  DType dtype() const { return dtype_; }
  int64_t length() const { return length_; }  // positions filled, per sequence

  // Left padding: the first real column of each sequence (size B, each in [0, capacity)). Columns
  // before it are padding, wherever they are appended from; with no starts every column is real.
  void set_starts(std::vector<int64_t> starts);
  const std::vector<int64_t>& starts() const { return starts_; }

  // Appends T positions to every sequence: k [B, Hkv, T, D] and v [B, Hkv, T, Dv] of any element
  // type and strides (rounded to nearest even into the cache's type). Throws Error, changing
  // nothing, when length() + T exceeds the capacity or a shape disagrees.
  void append(const TensorView& k, const TensorView& v);

  // The filled part, [B, Hkv, length(), D] and [B, Hkv, length(), Dv], viewed in place.
  TensorView keys() const;
  TensorView values() const;

  // The mask of a decoding step over this cache: causal (bottom-right: the queries are the last
  // positions appended) and, with starts, the left padding hidden and positions counted from each
  // sequence's first real token. Pad columns' own query rows see nothing (output 0).
  Mask step_mask() const;

  // Tree speculative decoding (maskattn/tree.h): the last T positions appended are a verified
  // draft tree, parents [T] or [B, T] as Mask::tree takes them. Keeps the accepted path, draft
  // indices from a root down the tree ([A], or [B, A]: the same count A for every sequence, since
  // the cache appends the same number of positions to every sequence), right after the prefix in
  // path order, and rolls the rest back: length() becomes length() − T + A. Checks everything
  // first and changes nothing on error (E140 parents, E142 shapes, E143 not a chain).
  void accept(const Array<int64_t>& parents, const Array<int64_t>& path);

  // Drops positions from the end (speculative decoding's rollback); clear() is truncate(0).
  void truncate(int64_t length);
  void clear() { truncate(0); }

 private:
  int64_t batch_, kv_heads_, capacity_, head_dim_, value_dim_;
  DType dtype_;
  int64_t length_ = 0;
  std::vector<int64_t> starts_;
  std::vector<uint8_t> keys_, values_;
};

}  // namespace maskattn
