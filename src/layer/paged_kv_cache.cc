// PagedKVCache (maskattn/paged_kv_cache.h): the pool, the block tables, copy on write.
//
// Every block has a reference count: the number of live sequences whose table holds it. A fork
// copies the parent's table and adds one to each of its blocks; a write into a block held by more
// than one sequence first moves the writer onto a private copy (only the last, partly filled block
// of a sequence can be written, so a fork costs at most one block copy per sequence, on its first
// append). Free blocks sit on a stack taken from the back, so which block a request gets depends
// only on the order of requests: a run is reproducible.
#include "maskattn/paged_kv_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "core/element.h"
#include "maskattn/error.h"
#include "maskattn/memory.h"

namespace maskattn {

namespace {

std::string str(int64_t value) {
  return std::to_string(value);
}

void require_size(bool ok, const std::string& message) {
  if (!ok) throw Error("PagedKVCache: " + message);
}

}  // namespace

PagedKVCache::PagedKVCache(int64_t blocks, int64_t block_size, int64_t kv_heads, int64_t head_dim,
                           KVFormat format, int64_t value_dim)
    : blocks_(blocks),
      block_size_(block_size),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      value_dim_(value_dim == 0 ? head_dim : value_dim),
      format_(format) {
  require_size(blocks > 0 && blocks <= INT32_MAX,
               "blocks must be in [1, 2^31), got " + str(blocks));
  require_size(block_size >= 16 && block_size <= 1024 && block_size % 16 == 0,
               "block_size must be a multiple of 16 in [16, 1024], got " + str(block_size));
  require_size(kv_heads > 0, "kv_heads must be positive, got " + str(kv_heads));
  require_size(head_dim > 0 && value_dim_ > 0, "head_dim and value_dim must be positive, got " +
                                                   str(head_dim) + " and " + str(value_dim_));
  if (!kv_width_fits(format, head_dim_) || !kv_width_fits(format, value_dim_)) {
    throw Error(std::string("PagedKVCache: format ") + kv_format_name(format) +
                " stores groups of 32 elements; head_dim " + str(head_dim_) + " and value_dim " +
                str(value_dim_) + " must be multiples of 32");
  }
  key_row_bytes_ = kv_row_bytes(format, true, head_dim_);
  value_row_bytes_ = kv_row_bytes(format, false, value_dim_);
  const double positions = static_cast<double>(blocks) * block_size * kv_heads;
  require_memory(positions * static_cast<double>(key_row_bytes_ + value_row_bytes_),
                 "PagedKVCache pool of " + str(blocks) + " blocks of " + str(block_size) +
                     " positions × " + str(kv_heads) + " kv heads (" + kv_format_name(format) +
                     ")");
  keys_.reset(static_cast<uint8_t*>(std::calloc(static_cast<size_t>(positions), key_row_bytes_)));
  values_.reset(
      static_cast<uint8_t*>(std::calloc(static_cast<size_t>(positions), value_row_bytes_)));
  if (keys_ == nullptr || values_ == nullptr) throw std::bad_alloc();
  references_.assign(blocks, 0);
  free_list_.resize(blocks);
  // The stack's back is block 0: blocks are handed out in increasing order from a fresh pool.
  for (int64_t b = 0; b < blocks; ++b) free_list_[b] = static_cast<int32_t>(blocks - 1 - b);
}

const PagedKVCache::Sequence& PagedKVCache::sequence(int64_t id, const char* who) const {
  if (id < 0 || id >= static_cast<int64_t>(sequences_.size()) || !sequences_[id].live) {
    std::string live;
    for (int64_t s : live_sequences()) {
      if (!live.empty()) live += ',';
      live += str(s);
    }
    throw Error(std::string("PagedKVCache::") + who + ": sequence " + str(id) +
                " is not in the cache (live sequences: " + (live.empty() ? "none" : live) + ")");
  }
  return sequences_[id];
}

PagedKVCache::Sequence& PagedKVCache::sequence(int64_t id, const char* who) {
  return const_cast<Sequence&>(static_cast<const PagedKVCache&>(*this).sequence(id, who));
}

int64_t PagedKVCache::add_sequence() {
  for (size_t id = 0; id < sequences_.size(); ++id) {
    if (!sequences_[id].live) {
      sequences_[id] = Sequence{true, 0, {}};
      return static_cast<int64_t>(id);
    }
  }
  sequences_.push_back(Sequence{true, 0, {}});
  return static_cast<int64_t>(sequences_.size()) - 1;
}

int64_t PagedKVCache::fork(int64_t parent) {
  const Sequence copy = sequence(parent, "fork");
  for (int32_t block : copy.blocks) references_[block] += 1;
  const int64_t child = add_sequence();
  sequences_[child] = copy;
  return child;
}

void PagedKVCache::free(int64_t id) {
  Sequence& s = sequence(id, "free");
  for (int32_t block : s.blocks) release_block(block);
  s = Sequence{};
}

bool PagedKVCache::contains(int64_t id) const {
  return id >= 0 && id < static_cast<int64_t>(sequences_.size()) && sequences_[id].live;
}

int64_t PagedKVCache::length(int64_t id) const {
  return sequence(id, "length").length;
}

std::vector<int64_t> PagedKVCache::live_sequences() const {
  std::vector<int64_t> ids;
  for (size_t id = 0; id < sequences_.size(); ++id) {
    if (sequences_[id].live) ids.push_back(static_cast<int64_t>(id));
  }
  return ids;
}

const std::vector<int32_t>& PagedKVCache::block_table(int64_t id) const {
  return sequence(id, "block_table").blocks;
}

int32_t PagedKVCache::take_block() {
  const int32_t block = free_list_.back();
  free_list_.pop_back();
  references_[block] = 1;
  return block;
}

void PagedKVCache::release_block(int32_t block) {
  if (--references_[block] == 0) free_list_.push_back(block);
}

void PagedKVCache::copy_block(int32_t from, int32_t to) {
  const auto copy = [&](uint8_t* pool, int64_t row_bytes) {
    const int64_t bytes = block_size_ * kv_heads_ * row_bytes;
    std::memcpy(pool + to * bytes, pool + from * bytes, bytes);
  };
  copy(keys_.get(), key_row_bytes_);
  copy(values_.get(), value_row_bytes_);
}

int64_t PagedKVCache::blocks_needed(int64_t id, int64_t count) const {
  const Sequence& s = sequence(id, "blocks_needed");
  const int64_t have = static_cast<int64_t>(s.blocks.size());
  const int64_t need = (s.length + count + block_size_ - 1) / block_size_ - have;
  // Writing into a shared last block copies it first.
  const bool shared_tail =
      count > 0 && s.length % block_size_ != 0 && references_[s.blocks.back()] > 1;
  return std::max<int64_t>(need, 0) + (shared_tail ? 1 : 0);
}

const uint8_t* PagedKVCache::key_row(int32_t block, int64_t row, int64_t kv_head) const {
  return keys_.get() + ((block * kv_heads_ + kv_head) * block_size_ + row) * key_row_bytes_;
}

const uint8_t* PagedKVCache::value_row(int32_t block, int64_t row, int64_t kv_head) const {
  return values_.get() + ((block * kv_heads_ + kv_head) * block_size_ + row) * value_row_bytes_;
}

}  // namespace maskattn
