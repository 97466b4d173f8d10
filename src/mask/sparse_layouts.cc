// Block-sparse layout builders (maskattn/sparse_layouts.h). Each fills a [blocks, blocks] grid per
// head from a rule on the block indices; only BigBird draws, from a generator of our own so that
// the same seed gives the same layout on every platform (core/splitmix64.h).
#include "maskattn/sparse_layouts.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/splitmix64.h"
#include "maskattn/error.h"

namespace maskattn {

namespace {

void require_positive(int64_t value, const char* builder, const char* name) {
  if (value < 1) {
    throw Error(std::string(builder) + ": " + name + " = " + std::to_string(value) +
                " must be ≥ 1");
  }
}

void require_non_negative(int64_t value, const char* builder, const char* name) {
  if (value < 0) {
    throw Error(std::string(builder) + ": " + name + " = " + std::to_string(value) +
                " must be ≥ 0");
  }
}

// A [heads, blocks, blocks] array (or [blocks, blocks] when heads == 0) whose head h is filled by
// fill(h, grid) on a zeroed row-major grid.
template <typename Fill>
Array<uint8_t> per_head(int64_t blocks, int64_t heads, const char* builder, Fill&& fill) {
  require_positive(blocks, builder, "blocks");
  require_non_negative(heads, builder, "heads");
  const int64_t count = std::max<int64_t>(heads, 1);
  std::vector<uint8_t> values(count * blocks * blocks, 0);
  for (int64_t h = 0; h < count; ++h) fill(h, values.data() + h * blocks * blocks);
  Dims shape = heads > 0 ? Dims{heads, blocks, blocks} : Dims{blocks, blocks};
  return Array<uint8_t>(std::move(shape), std::move(values));
}

}  // namespace

Array<uint8_t> bigbird_layout(int64_t blocks, const BigBirdLayout& config, int64_t heads) {
  const char* builder = "bigbird_layout";
  require_positive(config.sliding_blocks, builder, "sliding_blocks");
  if (config.sliding_blocks % 2 == 0) {
    throw Error("bigbird_layout: sliding_blocks = " + std::to_string(config.sliding_blocks) +
                " must be odd (the row's own block and as many on each side)");
  }
  require_non_negative(config.global_blocks, builder, "global_blocks");
  require_non_negative(config.random_blocks, builder, "random_blocks");
  const int64_t leading = (config.global_blocks + 1) / 2, trailing = config.global_blocks / 2;
  const auto is_global = [&](int64_t r) { return r < leading || r >= blocks - trailing; };
  const int64_t reach = (config.sliding_blocks - 1) / 2;
  return per_head(blocks, heads, builder, [&](int64_t h, uint8_t* grid) {
    detail::SplitMix64 draws(config.seed ^ (0x5851F42D4C957F2Dull * static_cast<uint64_t>(h + 1)));
    std::vector<int64_t> unseen;
    for (int64_t r = 0; r < blocks; ++r) {
      uint8_t* row = grid + r * blocks;
      for (int64_t c = 0; c < blocks; ++c) {
        row[c] = is_global(r) || is_global(c) || (c >= r - reach && c <= r + reach);
      }
      if (is_global(r)) continue;
      // Random blocks: a partial Fisher–Yates shuffle of the blocks the row does not see yet.
      unseen.clear();
      for (int64_t c = 0; c < blocks; ++c) {
        if (!row[c]) unseen.push_back(c);
      }
      const int64_t picks = std::min<int64_t>(config.random_blocks, unseen.size());
      for (int64_t n = 0; n < picks; ++n) {
        const int64_t pick = n + static_cast<int64_t>(draws.below(unseen.size() - n));
        std::swap(unseen[n], unseen[pick]);
        row[unseen[n]] = 1;
      }
    }
  });
}

Array<uint8_t> strided_layout(int64_t blocks, int64_t local_blocks, int64_t stride, bool causal,
                              int64_t heads) {
  require_positive(local_blocks, "strided_layout", "local_blocks");
  require_positive(stride, "strided_layout", "stride");
  return per_head(blocks, heads, "strided_layout", [&](int64_t, uint8_t* grid) {
    for (int64_t r = 0; r < blocks; ++r) {
      for (int64_t c = 0; c < blocks; ++c) {
        const int64_t distance = r - c;
        const bool local = distance < local_blocks && -distance < local_blocks;
        const bool column = distance % stride == 0;
        grid[r * blocks + c] = (local || column) && !(causal && c > r);
      }
    }
  });
}

Array<uint8_t> fixed_layout(int64_t blocks, int64_t chunk_blocks, int64_t summary_blocks,
                            bool causal, int64_t heads) {
  require_positive(chunk_blocks, "fixed_layout", "chunk_blocks");
  require_non_negative(summary_blocks, "fixed_layout", "summary_blocks");
  if (summary_blocks > chunk_blocks) {
    throw Error("fixed_layout: summary_blocks = " + std::to_string(summary_blocks) +
                " exceeds chunk_blocks = " + std::to_string(chunk_blocks));
  }
  return per_head(blocks, heads, "fixed_layout", [&](int64_t, uint8_t* grid) {
    for (int64_t r = 0; r < blocks; ++r) {
      for (int64_t c = 0; c < blocks; ++c) {
        const bool same_chunk = r / chunk_blocks == c / chunk_blocks;
        const bool summary = c % chunk_blocks >= chunk_blocks - summary_blocks;
        grid[r * blocks + c] = (same_chunk || summary) && !(causal && c > r);
      }
    }
  });
}

}  // namespace maskattn
