#include "maskattn/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "core/element.h"
#include "maskattn/error.h"
#include "maskattn/memory.h"
#include "validate.h"

namespace maskattn {

namespace {

void require_positive(int64_t value, const char* name) {
  if (value <= 0) {
    throw Error(std::string("KVCache ") + name + " must be positive, got " + std::to_string(value));
  }
}

// [B, Hkv, capacity, width] storage seen as its first `length` positions.
TensorView filled(const std::vector<uint8_t>& bytes, DType dtype, int64_t batch, int64_t heads,
                  int64_t capacity, int64_t length, int64_t width) {
  return TensorView(bytes.data(), dtype, {batch, heads, length, width},
                    {heads * capacity * width, capacity * width, width, 1});
}

}  // namespace

KVCache::KVCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim, DType dtype,
                 int64_t value_dim)
    : batch_(batch),
      kv_heads_(kv_heads),
      capacity_(capacity),
      head_dim_(head_dim),
      value_dim_(value_dim == 0 ? head_dim : value_dim),
      dtype_(dtype) {
  require_positive(batch, "batch");
  require_positive(kv_heads, "kv_heads");
  require_positive(capacity, "capacity");
  require_positive(head_dim, "head_dim");
  require_positive(value_dim_, "value_dim");
  const double positions = static_cast<double>(batch) * kv_heads * capacity;
  require_memory(positions * (head_dim_ + value_dim_) * static_cast<double>(dtype_size(dtype)),
                 "KVCache [" + std::to_string(batch) + "," + std::to_string(kv_heads) + "," +
                     std::to_string(capacity) + "," + std::to_string(head_dim_) + "]");
  keys_.resize(static_cast<size_t>(positions * head_dim_) * dtype_size(dtype));
  values_.resize(static_cast<size_t>(positions * value_dim_) * dtype_size(dtype));
}

void KVCache::set_starts(std::vector<int64_t> starts) {
  if (static_cast<int64_t>(starts.size()) != batch_) {
    throw Error("KVCache starts has " + std::to_string(starts.size()) +
                " values but the cache holds " + std::to_string(batch_) + " sequences");
  }
  for (size_t b = 0; b < starts.size(); ++b) {
    if (starts[b] < 0 || starts[b] >= capacity_) {
      throw Error("KVCache starts[" + std::to_string(b) + "] = " + std::to_string(starts[b]) +
                  " is outside the capacity [0, " + std::to_string(capacity_) + ")");
    }
  }
  starts_ = std::move(starts);
}

void KVCache::append(const TensorView& k, const TensorView& v) {
  detail::require_view(k, 4, "KVCache::append k", "[B,Hkv,T,D]");
  detail::require_view(v, 4, "KVCache::append v", "[B,Hkv,T,Dv]");
  const int64_t count = k.size(2);
  const Dims k_expected = {batch_, kv_heads_, count, head_dim_};
  const Dims v_expected = {batch_, kv_heads_, count, value_dim_};
  if (k.sizes() != k_expected || v.sizes() != v_expected) {
    throw Error("KVCache::append got k " + k.shape_string() + " and v " + v.shape_string() +
                "; the cache expects " + shape_string(k_expected) + " and " +
                shape_string(v_expected));
  }
  if (length_ + count > capacity_) {
    throw Error("KVCache is full: appending " + std::to_string(count) + " positions to " +
                std::to_string(length_) + " exceeds the capacity " + std::to_string(capacity_));
  }
  const auto copy = [&](const TensorView& from, std::vector<uint8_t>& bytes, int64_t width) {
    const MutableTensorView to(bytes.data(), dtype_, {batch_, kv_heads_, capacity_, width});
    for (int64_t b = 0; b < batch_; ++b) {
      for (int64_t g = 0; g < kv_heads_; ++g) {
        for (int64_t t = 0; t < count; ++t) {
          const int64_t source = from.offset({b, g, t, 0});
          const int64_t target = to.offset({b, g, length_ + t, 0});
          if (from.dtype() == dtype_ && from.stride(3) == 1) {
            const size_t size = dtype_size(dtype_);
            std::memcpy(static_cast<uint8_t*>(to.mutable_data()) + target * size,
                        static_cast<const uint8_t*>(from.data()) + source * size, width * size);
            continue;
          }
          for (int64_t e = 0; e < width; ++e) {
            detail::store_float(to, target + e,
                                detail::load_float(from, source + e * from.stride(3)));
          }
        }
      }
    }
  };
  copy(k, keys_, head_dim_);
  copy(v, values_, value_dim_);
  length_ += count;
}

TensorView KVCache::keys() const {
  return filled(keys_, dtype_, batch_, kv_heads_, capacity_, length_, head_dim_);
}

TensorView KVCache::values() const {
  return filled(values_, dtype_, batch_, kv_heads_, capacity_, length_, value_dim_);
}

Mask KVCache::step_mask() const {
  Mask mask;
  mask.causal(Alignment::bottom_right);
  if (!starts_.empty()) {
    // A prompt fed token by token has cached fewer columns than its padding spans at first: its
    // start is then the end of the filled part (every cached key is padding, and so is the query).
    std::vector<int64_t> starts = starts_;
    for (int64_t& start : starts) start = std::min(start, length_);
    mask = mask & Mask().key_starts(std::move(starts));
  }
  return mask;
}

void KVCache::truncate(int64_t length) {
  if (length < 0 || length > length_) {
    throw Error("KVCache::truncate(" + std::to_string(length) + ") needs a length in [0, " +
                std::to_string(length_) + "]");
  }
  length_ = length;
}

}  // namespace maskattn
