#include "mask/scan_cache.h"

namespace maskattn {

std::shared_ptr<void> Mask::new_scan_cache() {
  return std::make_shared<detail::ScanCache>();
}

namespace detail {

std::shared_ptr<const ScannedKinds> ScanCache::get(const MaskShape& shape, int64_t tile_q,
                                                   int64_t tile_k, size_t index,
                                                   const Builder& build) {
  const std::lock_guard<std::mutex> lock(mutex_);
  for (const Entry& entry : entries_) {
    if (entry.index == index && entry.tile_q == tile_q && entry.tile_k == tile_k &&
        entry.shape.batch == shape.batch && entry.shape.q_heads == shape.q_heads &&
        entry.shape.q_len == shape.q_len && entry.shape.k_len == shape.k_len) {
      return entry.kinds;
    }
  }
  auto kinds = std::make_shared<const ScannedKinds>(build());
  if (entries_.size() == kMaxEntries) entries_.erase(entries_.begin());
  entries_.push_back({shape, tile_q, tile_k, index, kinds});
  return kinds;
}

}  // namespace detail
}  // namespace maskattn
