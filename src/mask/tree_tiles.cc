#include "mask/tree_tiles.h"

#include <algorithm>

#include "mask/tile_mask.h"

namespace maskattn::detail {

namespace {

TileKind kind_of_count(int64_t allowed, int64_t pairs) {
  if (allowed == 0) return TileKind::empty;
  return allowed == pairs ? TileKind::full : TileKind::partial;
}

// Bottom-right causal in rows over the block [q_first, q_end) × [k_first, k_end): key j is seen
// by query i iff j ≤ i + shift.
TileKind causal_kind(int64_t q_first, int64_t q_end, int64_t k_first, int64_t k_end,
                     int64_t shift) {
  if (q_first + shift >= k_end - 1) return TileKind::full;
  if (q_end - 1 + shift < k_first) return TileKind::empty;
  return TileKind::partial;
}

// Allowed pairs of the draft queries of rows [q_first, q_end) against draft keys [k_first, k_end)
// (global rows) in tree row `row`.
int64_t count_draft_pairs(const component::Tree& tree, const TreePlacement& at, int64_t row,
                          int64_t q_first, int64_t q_end, int64_t k_first, int64_t k_end) {
  const int64_t* enter = tree.enter.data() + row * tree.size();
  const int64_t* leave = tree.leave.data() + row * tree.size();
  int64_t allowed = 0;
  for (int64_t j = k_first; j < k_end; ++j) {
    const int64_t lo = enter[j - at.first_key], hi = leave[j - at.first_key];
    for (int64_t i = std::max(q_first, at.first_query); i < q_end; ++i) {
      const int64_t order = enter[i - at.first_query];
      allowed += lo <= order && order < hi;
    }
  }
  return allowed;
}

}  // namespace

TreeTiles::TreeTiles(const ResolvedMask& mask, int64_t tile_q, int64_t tile_k)
    : mask_(mask), tile_q_(tile_q), tile_k_(tile_k) {
  const MaskShape& whole = mask.global_shape();
  for (const component::Tree* tree : mask.trees()) {
    Entry entry{tree, TreePlacement(*tree, whole.q_len, whole.k_len), 0, 0, 0, 0, {}};
    count_draft_blocks(entry);
    entries_.push_back(std::move(entry));
  }
}

void TreeTiles::count_draft_blocks(Entry& entry) const {
  const MaskShape& call = mask_.shape();
  const int64_t q_origin = mask_.q_origin(), k_origin = mask_.k_origin();
  const int64_t q_rows_end = q_origin + call.q_len, k_rows_end = k_origin + call.k_len;
  const int64_t first_q = std::max(entry.at.first_query, q_origin);
  const int64_t first_k = std::max(entry.at.first_key, k_origin);
  entry.q_tile0 = INT64_MAX;  // no block of the call holds a draft query and a draft key
  if (first_q >= q_rows_end || first_k >= k_rows_end) return;
  entry.q_tile0 = (first_q - q_origin) / tile_q_;
  entry.k_tile0 = (first_k - k_origin) / tile_k_;
  entry.q_tiles = (call.q_len + tile_q_ - 1) / tile_q_ - entry.q_tile0;
  entry.k_tiles = (call.k_len + tile_k_ - 1) / tile_k_ - entry.k_tile0;
  const int64_t rows = entry.tree->parents.dim(0);
  entry.draft_kinds.reserve(rows * entry.q_tiles * entry.k_tiles);
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t qt = entry.q_tile0; qt < entry.q_tile0 + entry.q_tiles; ++qt) {
      const int64_t q_first = q_origin + qt * tile_q_;
      const int64_t q_end = std::min(q_rows_end, q_first + tile_q_);
      for (int64_t kt = entry.k_tile0; kt < entry.k_tile0 + entry.k_tiles; ++kt) {
        // Only the block's draft keys count: its prefix keys are classified as causal.
        const int64_t k_first = std::max(k_origin + kt * tile_k_, entry.at.first_key);
        const int64_t k_end = std::min(k_rows_end, k_origin + (kt + 1) * tile_k_);
        const int64_t allowed =
            count_draft_pairs(*entry.tree, entry.at, row, q_first, q_end, k_first, k_end);
        entry.draft_kinds.push_back(kind_of_count(allowed, (q_end - q_first) * (k_end - k_first)));
      }
    }
  }
}

TileKind TreeTiles::kind(int64_t b, int64_t h, int64_t q_tile, int64_t k_tile, int64_t q_first,
                         int64_t q_end, int64_t k_first, int64_t k_end) const {
  TileKind kind = TileKind::full;
  for (const Entry& entry : entries_) {
    if (!entry.tree->heads.contains(h)) continue;
    bool any_allowed = false, any_hidden = false;
    const auto add = [&](TileKind part) {
      any_allowed |= part != TileKind::empty;
      any_hidden |= part != TileKind::full;
    };
    // Keys before `split` are the prefix's, the others the draft's.
    const int64_t split = std::clamp(entry.at.first_key, k_first, k_end);
    if (split > k_first) add(causal_kind(q_first, q_end, k_first, split, entry.at.causal_shift));
    if (split < k_end) {
      if (q_tile < entry.q_tile0) {
        add(TileKind::empty);  // queries before the draft see no draft key
      } else {
        const int64_t row = entry.tree->row_of(b);
        add(entry.draft_kinds[(row * entry.q_tiles + q_tile - entry.q_tile0) * entry.k_tiles +
                              k_tile - entry.k_tile0]);
      }
    }
    if (!any_allowed) return TileKind::empty;
    if (any_hidden) kind = TileKind::partial;
  }
  return kind;
}

int64_t TreeTiles::last_key(int64_t h, int64_t q_last) const {
  int64_t last = INT64_MAX;
  for (const Entry& entry : entries_) {
    if (entry.tree->heads.contains(h)) last = std::min(last, q_last + entry.at.causal_shift);
  }
  return last;
}

void and_tree_bits(const ResolvedMask& mask, int64_t b, int64_t h, int64_t q_first, int64_t q_count,
                   int64_t k_first, int64_t k_count, uint64_t* allowed) {
  const MaskShape& whole = mask.global_shape();
  for (const component::Tree* tree : mask.trees()) {
    if (!tree->heads.contains(h)) continue;
    const TreePlacement at(*tree, whole.q_len, whole.k_len);
    const int64_t* enter = tree->enter.data() + tree->row_of(b) * tree->size();
    const int64_t* leave = tree->leave.data() + tree->row_of(b) * tree->size();
    // The pre-order numbers of the block's draft queries (bit i set in `draft` for those).
    int64_t order[TileMaskBuilder::kMaxQueries];
    uint64_t draft = 0;
    for (int64_t i = 0; i < q_count; ++i) {
      const int64_t s = q_first + i - at.first_query;
      order[i] = s >= 0 ? enter[s] : -1;
      if (s >= 0) draft |= uint64_t{1} << i;
    }
    for (int64_t n = 0; n < k_count; ++n) {
      if (allowed[n] == 0) continue;
      const int64_t j = k_first + n, t = j - at.first_key;
      if (t < 0) {
        // A prefix key: the queries from row j − shift on (causal in rows).
        const int64_t first = j - at.causal_shift - q_first;
        allowed[n] &= first <= 0 ? low_bits(q_count) : low_bits(q_count) & ~low_bits(first);
        continue;
      }
      uint64_t bits = 0;
      for (int64_t i = 0; i < q_count; ++i) {
        bits |= static_cast<uint64_t>(enter[t] <= order[i] && order[i] < leave[t]) << i;
      }
      allowed[n] &= bits & draft;
    }
  }
}

}  // namespace maskattn::detail
