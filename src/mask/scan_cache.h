// Tile classifications that need a scan of the data (dense masks, predicates), cached in the Mask
// so that the scan happens once per problem size, not once per call.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "maskattn/mask.h"

namespace maskattn::detail {

// What a (query tile, key tile) block needs: nothing (every pair hidden), no mask work (every pair
// allowed, nothing to add), or the element mask.
enum class TileKind : uint8_t { empty = 0, full = 1, partial = 2 };

// The kinds of one scanned component over [batch, heads, q_tiles, k_tiles]; batch or heads is 1
// when the component does not vary along that axis (a [B,1,L,S] mask is scanned once per b).
struct ScannedKinds {
  int64_t batch = 1, heads = 1, q_tiles = 0, k_tiles = 0;
  std::vector<TileKind> kinds;

  TileKind at(int64_t b, int64_t h, int64_t q_tile, int64_t k_tile) const {
    const int64_t bb = batch == 1 ? 0 : b, hh = heads == 1 ? 0 : h;
    return kinds[((bb * heads + hh) * q_tiles + q_tile) * k_tiles + k_tile];
  }
};

// The tile grid a scan covers: the call's shape, tiled from its first row, placed at
// (q_origin, k_origin) of the whole problem (a call with a frame, mask.h).
struct ScanGrid {
  MaskShape call, whole;
  int64_t q_origin = 0, k_origin = 0;
  int64_t tile_q = 0, tile_k = 0;
};

class ScanCache {
 public:
  using Builder = std::function<ScannedKinds()>;

  // The kinds of component `index` over this grid, built by `build` on first request.
  std::shared_ptr<const ScannedKinds> get(const ScanGrid& grid, size_t index, const Builder& build);

 private:
  struct Entry {
    ScanGrid grid;
    size_t index;
    std::shared_ptr<const ScannedKinds> kinds;
  };
  // A KV-cache decode changes Lk every step, a ring the frame: keep only the recent entries.
  static constexpr size_t kMaxEntries = 16;

  std::mutex mutex_;
  std::vector<Entry> entries_;
};

// The Mask's cache, which mask.h keeps opaque so that ScanCache stays out of the installed headers.
struct MaskInternals {
  static ScanCache& scan_cache(const Mask& mask) {
    return *static_cast<ScanCache*>(mask.scan_cache_.get());
  }
};

}  // namespace maskattn::detail
