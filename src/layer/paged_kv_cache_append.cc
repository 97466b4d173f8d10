// PagedKVCache's writes and reads of positions: append (encode, then copy on write, then store),
// truncate, and the decoded view the tests and the reference kernel use.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/element.h"
#include "maskattn/error.h"
#include "maskattn/paged_kv_cache.h"
#include "validate.h"

namespace maskattn {

namespace {

std::string str(int64_t value) {
  return std::to_string(value);
}

// Every row of t [Hkv, T, W] encoded, in [T][Hkv] order, or Error E145 naming the first value
// that cannot be stored.
std::vector<uint8_t> encode_rows(const TensorView& t, KVFormat format, bool keys, int64_t row_bytes,
                                 const char* name) {
  const int64_t heads = t.size(0), count = t.size(1), width = t.size(2);
  std::vector<uint8_t> rows(static_cast<size_t>(heads * count * row_bytes));
  std::vector<float> row(width);
  for (int64_t p = 0; p < count; ++p) {
    for (int64_t g = 0; g < heads; ++g) {
      for (int64_t e = 0; e < width; ++e) row[e] = detail::load_float(t, t.offset({g, p, e}));
      int64_t bad = 0;
      if (!kv_encode_row(format, keys, row.data(), width, rows.data() + (p * heads + g) * row_bytes,
                         &bad)) {
        const float x = row[bad];
        throw Error(std::string("PagedKVCache::append: ") + name + "[" + str(g) + ", " + str(p) +
                    ", " + str(bad) + "] = " + std::to_string(x) + " cannot be stored in " +
                    kv_format_name(format) +
                    (std::isfinite(x) ? ": its group's scale would exceed an f16 (65504)"
                                      : ": a KV cache holds finite values only"));
      }
    }
  }
  return rows;
}

}  // namespace

void PagedKVCache::append(int64_t id, const TensorView& k, const TensorView& v) {
  Sequence& s = sequence(id, "append");
  detail::require_view(k, 3, "PagedKVCache::append k", "[Hkv,T,D]");
  detail::require_view(v, 3, "PagedKVCache::append v", "[Hkv,T,Dv]");
  const int64_t count = k.size(1);
  const Dims k_expected = {kv_heads_, count, head_dim_},
             v_expected = {kv_heads_, count, value_dim_};
  if (k.sizes() != k_expected || v.sizes() != v_expected) {
    throw Error("PagedKVCache::append got k " + k.shape_string() + " and v " + v.shape_string() +
                "; the cache expects " + shape_string(k_expected) + " and " +
                shape_string(v_expected) + " ([Hkv, T, D] and [Hkv, T, Dv])");
  }
  if (count == 0) return;
  // Encoded first: nothing changes when a value cannot be stored or the pool is short.
  const std::vector<uint8_t> keys = encode_rows(k, format_, true, key_row_bytes_, "k");
  const std::vector<uint8_t> values = encode_rows(v, format_, false, value_row_bytes_, "v");
  const int64_t need = blocks_needed(id, count);
  if (need > free_blocks()) {
    throw Error("PagedKVCache is out of blocks: appending " + str(count) +
                " positions to sequence " + str(id) + " (length " + str(s.length) + ") needs " +
                str(need) + " more blocks of " + str(block_size_) + " positions, and " +
                str(free_blocks()) + " of " + str(blocks_) + " are free");
  }
  if (s.length % block_size_ != 0 && references_[s.blocks.back()] > 1) {
    const int32_t own = take_block();  // copy on write: the shared tail gets a private copy
    copy_block(s.blocks.back(), own);
    release_block(s.blocks.back());
    s.blocks.back() = own;
  }
  for (int64_t p = 0; p < count; ++p) {
    const int64_t position = s.length + p;
    if (position % block_size_ == 0) s.blocks.push_back(take_block());
    const int32_t block = s.blocks[position / block_size_];
    const int64_t row = position % block_size_;
    for (int64_t g = 0; g < kv_heads_; ++g) {
      std::memcpy(const_cast<uint8_t*>(key_row(block, row, g)),
                  keys.data() + (p * kv_heads_ + g) * key_row_bytes_, key_row_bytes_);
      std::memcpy(const_cast<uint8_t*>(value_row(block, row, g)),
                  values.data() + (p * kv_heads_ + g) * value_row_bytes_, value_row_bytes_);
    }
  }
  s.length += count;
}

void PagedKVCache::truncate(int64_t id, int64_t length) {
  Sequence& s = sequence(id, "truncate");
  if (length < 0 || length > s.length) {
    throw Error("PagedKVCache::truncate(" + str(id) + ", " + str(length) +
                ") needs a length in [0, " + str(s.length) + "]");
  }
  const auto keep = static_cast<size_t>((length + block_size_ - 1) / block_size_);
  while (s.blocks.size() > keep) {
    release_block(s.blocks.back());
    s.blocks.pop_back();
  }
  s.length = length;
}

std::vector<float> PagedKVCache::decoded(int64_t id, bool keys) const {
  const Sequence& s = sequence(id, keys ? "decoded_keys" : "decoded_values");
  const int64_t width = keys ? head_dim_ : value_dim_;
  std::vector<float> out(static_cast<size_t>(kv_heads_ * s.length * width));
  for (int64_t g = 0; g < kv_heads_; ++g) {
    for (int64_t p = 0; p < s.length; ++p) {
      const int32_t block = s.blocks[p / block_size_];
      const uint8_t* row =
          keys ? key_row(block, p % block_size_, g) : value_row(block, p % block_size_, g);
      kv_decode_row(format_, keys, row, width, out.data() + (g * s.length + p) * width);
    }
  }
  return out;
}

std::vector<float> PagedKVCache::decoded_keys(int64_t id) const {
  return decoded(id, true);
}
std::vector<float> PagedKVCache::decoded_values(int64_t id) const {
  return decoded(id, false);
}

}  // namespace maskattn

namespace maskattn {

void PagedKVCache::copy_row(int32_t from_block, int64_t from_row, int32_t to_block,
                            int64_t to_row) {
  for (int64_t g = 0; g < kv_heads_; ++g) {
    std::memmove(const_cast<uint8_t*>(key_row(to_block, to_row, g)),
                 key_row(from_block, from_row, g), key_row_bytes_);
    std::memmove(const_cast<uint8_t*>(value_row(to_block, to_row, g)),
                 value_row(from_block, from_row, g), value_row_bytes_);
  }
}

void PagedKVCache::accept(int64_t id, int64_t draft, const std::vector<int64_t>& path) {
  Sequence& s = sequence(id, "accept");
  if (draft < 0 || draft > s.length) {
    throw Error("PagedKVCache::accept: draft = " + str(draft) + " must be in [0, length] = [0, " +
                str(s.length) + "]");
  }
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] < 0 || path[i] >= draft || (i > 0 && path[i] <= path[i - 1])) {
      throw Error("PagedKVCache::accept: path[" + str(static_cast<int64_t>(i)) +
                  "] = " + str(path[i]) + " must be in [0, draft) = [0, " + str(draft) +
                  ") and above the previous index: the accepted draft positions, root to leaf");
    }
  }
  const int64_t prefix = s.length - draft, kept = static_cast<int64_t>(path.size());
  // The first moved position is the first i with path[i] != i; blocks from its block to the
  // kept end are written, and each one still shared needs a private copy first.
  int64_t first_moved = kept;
  for (int64_t i = 0; i < kept; ++i) {
    if (path[i] != i) {
      first_moved = i;
      break;
    }
  }
  const int64_t end = prefix + kept;
  const int64_t first_block = (prefix + first_moved) / block_size_;
  const int64_t last_block = end > prefix + first_moved ? (end - 1) / block_size_ : first_block - 1;
  int64_t copies = 0;
  for (int64_t b = first_block; b <= last_block; ++b) copies += references_[s.blocks[b]] > 1;
  if (copies > free_blocks()) {
    throw Error("PagedKVCache is out of blocks: accepting a path in sequence " + str(id) +
                " writes " + str(copies) + " blocks it shares with a fork, and " +
                str(free_blocks()) + " of " + str(blocks_) + " are free");
  }
  for (int64_t b = first_block; b <= last_block; ++b) {
    if (references_[s.blocks[b]] > 1) {
      const int32_t own = take_block();
      copy_block(s.blocks[b], own);
      release_block(s.blocks[b]);
      s.blocks[b] = own;
    }
  }
  // path[i] ≥ i, so moving in increasing i never overwrites a position still to be read.
  for (int64_t i = first_moved; i < kept; ++i) {
    const int64_t from = prefix + path[i], to = prefix + i;
    copy_row(s.blocks[from / block_size_], from % block_size_, s.blocks[to / block_size_],
             to % block_size_);
  }
  truncate(id, end);
}

}  // namespace maskattn
