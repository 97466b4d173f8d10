// Draft trees (component::Tree, Mask::tree): the checks of a parents array, and the one definition
// of which pairs a tree allows, which the reference (through ResolvedMask), the block map and the
// tile masks (tree_tiles.h) follow.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "maskattn/mask.h"

namespace maskattn::detail {

// Parents as [rows, T] (a [T] array becomes [1, T]), checked (E140): rank 1 or 2, T ≥ 1, each
// parents[r][t] in [−1, t). `what` leads the messages ("tree", "KVCache::accept").
Array<int64_t> checked_parents(Array<int64_t> parents, const std::string& what);

// Pre-order numbers of checked parents, per row: descends() of component::Tree reads them.
void number_tree(const Array<int64_t>& parents, std::vector<int64_t>& enter,
                 std::vector<int64_t>& leave);

// The draft of a tree in a problem of q_len queries and k_len keys (the whole problem's, in rows):
// keys [first_key, k_len) and queries [first_query, q_len) are draft tokens 0 … T − 1 and
// first_query … (first_query < 0 when Lq < T: the queries are the draft's last Lq tokens).
struct TreePlacement {
  int64_t first_query, first_key, causal_shift;  // causal_shift = Lk − Lq

  TreePlacement(const component::Tree& tree, int64_t q_len, int64_t k_len)
      : first_query(q_len - tree.size()),
        first_key(k_len - tree.size()),
        causal_shift(k_len - q_len) {}
};

// Query row i may attend key row j of sequence b (global rows). Prefix keys: causal, bottom-right
// in rows (every draft query sees them all, a query before the draft those up to its own row).
// Draft keys: only from draft queries, and only the query's ancestors and itself.
inline bool tree_allows(const component::Tree& tree, const TreePlacement& at, int64_t b, int64_t i,
                        int64_t j) {
  const int64_t draft_key = j - at.first_key;
  if (draft_key < 0) return j <= i + at.causal_shift;
  const int64_t draft_query = i - at.first_query;
  return draft_query >= 0 && tree.descends(b, draft_query, draft_key);
}

}  // namespace maskattn::detail
