// Why evaluate every pair: a program is arbitrary code, so the only exact classification of a
// block is its element mask. FlexAttention's create_block_mask does the same work (on a dense
// grid); here each block is evaluated in ≤ 64 × 64 tiles whose bit rows are reduced to one kind
// on the spot, so the cost is the evaluation alone and the memory one byte per block.
#include "mask/program_scan.h"

#include <algorithm>
#include <array>
#include <vector>

#include "core/parallel.h"
#include "mask/tile_mask.h"

namespace maskattn::detail {
namespace {

constexpr int64_t kTileLimit = 64;  // Program::mask_tile's largest tile

// What the pairs of queries [q_first, q_end) × keys [k_first, k_end) (global rows) show.
struct Seen {
  bool allowed = false, hidden = false;
};

void scan_block(const Program& program, int64_t b, int64_t h, int64_t q_first, int64_t q_end,
                int64_t k_first, int64_t k_end, Seen& seen) {
  std::array<uint64_t, kTileLimit> bits;
  for (int64_t q0 = q_first; q0 < q_end; q0 += kTileLimit) {
    const int64_t nq = std::min(kTileLimit, q_end - q0);
    const uint64_t all = low_bits(nq);
    for (int64_t k0 = k_first; k0 < k_end; k0 += kTileLimit) {
      const int64_t nk = std::min(kTileLimit, k_end - k0);
      program.mask_tile(b, h, q0, nq, k0, nk, bits.data());
      for (int64_t n = 0; n < nk; ++n) {
        seen.allowed |= bits[n] != 0;
        seen.hidden |= bits[n] != all;
      }
      if (seen.allowed && seen.hidden) return;  // partial: nothing more to learn
    }
  }
}

}  // namespace

ScannedKinds scan_program(const BlockMap& map, const Program& program, int64_t batch,
                          int64_t heads) {
  ScannedKinds kinds{batch, heads, map.q_tiles(), map.k_tiles(), {}};
  kinds.kinds.resize(batch * heads * kinds.q_tiles * kinds.k_tiles);
  // One work item per row of blocks (b, h, query tile): equal costs, so dynamic scheduling alone
  // balances them; each writes its own row of kinds.
  const std::vector<int64_t> costs(batch * heads * kinds.q_tiles, 1);
  run_longest_first(costs, 0, [&](int64_t row) {
    const int64_t qt = row % kinds.q_tiles;
    const int64_t h = (row / kinds.q_tiles) % heads;
    const int64_t b = row / (kinds.q_tiles * heads);
    TileKind* out = kinds.kinds.data() + row * kinds.k_tiles;
    for (int64_t kt = 0; kt < kinds.k_tiles; ++kt) {
      Seen seen;
      scan_block(program, b, h, map.q_first(qt), map.q_end(qt), map.k_first(kt), map.k_end(kt),
                 seen);
      out[kt] = !seen.allowed ? TileKind::empty : seen.hidden ? TileKind::partial : TileKind::full;
    }
  });
  return kinds;
}

}  // namespace maskattn::detail
