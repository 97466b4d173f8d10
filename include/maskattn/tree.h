// Speculative decoding with a draft tree (docs/semantics.md §3 "Draft trees", §13): the helpers
// around Mask::tree (maskattn/mask.h) and KVCache::accept (maskattn/kv_cache.h).
//
// One step: a draft model proposes T tokens as a tree (parents[t] ∈ [−1, t), −1 = a child of the
// tokens already cached); the target model appends their keys and values to its cache, computes
// the T queries in one call with Mask::tree(parents), each at the RoPE position
// tree_position_ids() gives; the verifier picks the longest chain of drafts the target agrees
// with; accepting it keeps that chain in the cache, in order, and rolls the other branches back.
// Parents are [T] (every sequence shares the tree) or [B, T] (one tree per sequence, the same T).
#pragma once

#include <cstdint>
#include <vector>

#include "maskattn/array.h"
#include "maskattn/tensor.h"

namespace maskattn {

// Each draft token's depth in its tree (a root is 0) plus prefix_length: the position ids of the
// draft for rotary embeddings, [T] or [B, T] like parents. A root sits right after the prefix
// (prefix_length = the cached length before the draft), a child one position after its parent,
// so siblings share a position, and each path reads the positions of a plain sequence (as in
// Medusa, EAGLE and vLLM's tree attention). Throws Error (E140) for malformed parents, and for a
// negative prefix_length.
Array<int64_t> tree_position_ids(const Array<int64_t>& parents, int64_t prefix_length);

// The chain of draft indices from a root down to `node` (inclusive) in the tree of sequence
// `batch` (any batch for [T] parents): the path to give KVCache::accept when `node` is the deepest
// accepted draft token. Throws Error (E140) for malformed parents, (E143) for a node outside
// [0, T) or a batch outside the parents' rows.
std::vector<int64_t> tree_path(const Array<int64_t>& parents, int64_t node, int64_t batch = 0);

// Keeps the accepted path of a verified draft in a KV cache held as two views, k [B, H, L, D] and
// v [B, H, L, Dv] (L ≥ length: a capacity), whose rows [length − T, length) are the draft:
// path [A] (every sequence) or [B, A] (per sequence: the same count A for every sequence, since
// a cache appends the same number of positions to every sequence) holds draft indices from a root
// down a chain of parent → child links. The accepted rows move to [length − T, length − T + A) in
// path order (rows of the prefix are untouched) and the new length, length − T + A, is returned;
// rows beyond it are left as they are (stale: roll back by not reading them). Every argument is
// checked before anything moves: malformed parents (E140), shapes that disagree (E142), a path
// that is not such a chain (E143). KVCache::accept is this on the cache's own storage.
int64_t accept_tree_path(const MutableTensorView& k, const MutableTensorView& v, int64_t length,
                         const Array<int64_t>& parents, const Array<int64_t>& path);

}  // namespace maskattn
