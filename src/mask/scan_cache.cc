#include "mask/scan_cache.h"

namespace maskattn {

std::shared_ptr<void> Mask::new_scan_cache() {
  return std::make_shared<detail::ScanCache>();
}

namespace detail {

namespace {

bool same_shape(const MaskShape& a, const MaskShape& b) {
  return a.batch == b.batch && a.q_heads == b.q_heads && a.q_len == b.q_len && a.k_len == b.k_len;
}

bool same_grid(const ScanGrid& a, const ScanGrid& b) {
  return same_shape(a.call, b.call) && same_shape(a.whole, b.whole) && a.q_origin == b.q_origin &&
         a.k_origin == b.k_origin && a.tile_q == b.tile_q && a.tile_k == b.tile_k;
}

}  // namespace

std::shared_ptr<const ScannedKinds> ScanCache::get(const ScanGrid& grid, size_t index,
                                                   const Builder& build) {
  const std::lock_guard<std::mutex> lock(mutex_);
  for (const Entry& entry : entries_) {
    if (entry.index == index && same_grid(entry.grid, grid)) return entry.kinds;
  }
  auto kinds = std::make_shared<const ScannedKinds>(build());
  if (entries_.size() == kMaxEntries) entries_.erase(entries_.begin());
  entries_.push_back({grid, index, kinds});
  return kinds;
}

}  // namespace detail
}  // namespace maskattn
