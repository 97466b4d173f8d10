// maskattn::Mask — which (query, key) pairs may attend. docs/semantics.md is the full definition.
//
// A Mask is a set of components; a pair (b, h, i, j) is allowed iff every component allows it.
// Positions (docs/design.md §2): key j of sequence b sits at kpos = j − key_start[b]; query i sits
// at
//   bottom-right (default): qpos = i + (Lk − Lq) − key_start[b]
//                           (with query AND key lengths: i + key_len[b] − query_len[b] −
//                           key_start[b])
//   top-left:               qpos = i − query_start[b]   (query starts; else key starts when
//                                                         Lq == Lk; else 0)
// so a KV-cache step (Lq new queries after Lk − Lq cached keys) lines up without an offset
// argument.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "maskattn/array.h"
#include "maskattn/program.h"

namespace maskattn {

namespace detail {
struct MaskInternals;  // the library's access to what a Mask caches (src/mask/scan_cache.h)
}  // namespace detail

// An unbounded side of a window: window(kUnbounded, 0) is causal.
inline constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();

enum class Alignment : uint8_t { bottom_right, top_left };

// The query heads a component applies to (heads outside the set are not restricted by it).
// Default: every head. Stored as sorted, merged ranges, so HeadSet::range(0, 1 << 40) is cheap.
class HeadSet {
 public:
  HeadSet() = default;
  HeadSet(std::initializer_list<int64_t> heads);
  explicit HeadSet(std::vector<int64_t> heads);      // any order, duplicates allowed; not empty
  static HeadSet range(int64_t first, int64_t end);  // heads first, …, end − 1

  bool is_all() const { return all_; }
  bool contains(int64_t head) const;
  int64_t max_head() const;       // the largest head in the set; −1 for "every head"
  std::string to_string() const;  // "" for all heads, else "@heads=0,2-4"

 private:
  bool all_ = true;
  std::vector<std::pair<int64_t, int64_t>> ranges_;  // [first, end), sorted, disjoint, merged
};

enum class Side : uint8_t { query, key };

namespace component {

// qpos − left ≤ kpos ≤ qpos + right, inclusive. causal = Window{kUnbounded, 0}.
struct Window {
  int64_t left = kUnbounded;
  int64_t right = 0;
  HeadSet heads;
};

// ⌊qpos / size⌋ == ⌊kpos / size⌋ (Llama-4 chunked attention).
struct Chunk {
  int64_t size = 1;
  HeadSet heads;
};

// Which tokens of each sequence are real. A padded key is hidden from every query; a padded query
// row hides everything (its output is zero).
struct Padding {
  enum class Form : uint8_t {
    lengths,    // values [B]: real tokens are [0, len[b])          (right padding)
    starts,     // values [B]: real tokens are [start[b], L)        (left padding; moves positions)
    keep,       // values [B, L]: 1 = real token, 0 = padding       (HF attention_mask)
    token_ids,  // values [B, L]: real iff values[b][t] != pad_id
  };
  Side side = Side::key;
  Form form = Form::lengths;
  Array<int64_t> values;
  int64_t pad_id = 0;
};

// seg_q[b][i] == seg_k[b][j] (packed documents). `shared`: one array for queries and keys.
struct Segments {
  Array<int64_t> query_ids;  // [B, Lq]
  Array<int64_t> key_ids;    // [B, Lk]
  bool shared = false;
  HeadSet heads;
};

// Bidirectional spans: a pair hidden by causal/window components is allowed again when
// span_q == span_k != 0 (image tokens, prefix-LM). Other components still apply.
struct Spans {
  Array<int64_t> query_ids;  // [B, Lq], 0 = in no span
  Array<int64_t> key_ids;    // [B, Lk]
  bool shared = false;
  HeadSet heads;
};

// Global tokens (Longformer): a pair hidden by causal/window components is allowed again when its
// query or its key is global (ids ≠ 0), exactly where spans relax. Padding, chunks, segments,
// block-sparse layouts, dense masks and predicates still apply. Ids are [B, L] or [1, L] (the same
// tokens in every sequence).
struct GlobalTokens {
  Array<int64_t> query_ids;  // [B or 1, Lq], ≠ 0 = global
  Array<int64_t> key_ids;    // [B or 1, Lk]
  bool shared = false;
  HeadSet heads;
};

// Block-sparse layout (BigBird, Sparse Transformer, DeepSpeed/Triton block-sparse): query i may
// attend key j iff layout[b, h, ⌊i / block_q⌋, ⌊j / block_k⌋] ≠ 0, on row and column indices like
// the dense masks. The layout (rank 2–4) broadcasts to [B, Hq, ⌈Lq / block_q⌉, ⌈Lk / block_k⌉].
struct BlockSparse {
  Array<uint8_t> layout;  // 0 or 1
  int64_t block_q = 1;
  int64_t block_k = 1;
};

// Prefix-LM: one bidirectional span over positions [0, length).
struct Prefix {
  int64_t length = 0;
  HeadSet heads;
};

// A boolean matrix broadcasting (NumPy rules) to [B, Hq, Lq, Lk].
struct DenseBool {
  enum class Polarity : uint8_t {
    keep,     // 1 = may attend (PyTorch SDPA bool attn_mask)
    blocked,  // 1 = hidden (masked_fill, nn.MultiheadAttention, tutorials' triu(ones, 1) masks)
  };
  Polarity polarity = Polarity::keep;
  Array<uint8_t> values;  // 0 or 1
};

// A float matrix broadcasting to [B, Hq, Lq, Lk], added to the scores. Only −inf hides; finite
// values (−1e4, −1e9, finfo.min) are added exactly as given.
struct DenseAdditive {
  Array<float> values;
};

// A callable (b, h, i, j) → allowed, on row/column indices (FlexAttention's mask_mod). It is called
// from several threads at once and must be safe for that.
using PairPredicate = std::function<bool(int64_t b, int64_t h, int64_t i, int64_t j)>;
struct Predicate {
  PairPredicate allows;
  std::string name = "predicate";
};

// A mask program (maskattn/program.h): FlexAttention's mask_mod as an expression over b, h and the
// row indices q, kv (global rows, as predicates get), with captured tables. Evaluated a 64 × 64
// tile at a time: the block map from one scan of the program (no Lq × Lk buffer), the element
// mask of partial tiles inside the kernels.
struct ProgramMask {
  Program program;
};

// A draft tree of speculative decoding (docs/semantics.md §3, "Draft trees"): the last T keys
// of the problem are T draft tokens appended after the cached prefix, and the last T queries are
// the same tokens (row indices, bottom-right, whatever the mask's alignment). parents[r][t] is the
// draft index of token t's parent, in [0, t), or −1 for a root (a child of the prefix): parents
// come before their children. A draft query sees every prefix key and, in the draft, exactly its
// ancestors and itself; a query before the draft (Lq > T) sees the keys up to its own row,
// causally. So the component is never wider than bottom-right causal.
struct Tree {
  Array<int64_t> parents;  // [rows, T]: rows = B (one tree per sequence) or 1 (every sequence)
  // Each token's number in a pre-order walk of the forest (children in index order) and the end of
  // its subtree, per row: s is t or a descendant of t iff enter[t] ≤ enter[s] < leave[t].
  // Computed by Mask::tree from the parents.
  std::vector<int64_t> enter, leave;
  HeadSet heads;

  int64_t size() const { return parents.dim(1); }  // T
  int64_t row_of(int64_t b) const { return parents.dim(0) == 1 ? 0 : b; }
  // Draft token s (of sequence b) is t or one of t's descendants.
  bool descends(int64_t b, int64_t s, int64_t t) const {
    const int64_t base = row_of(b) * size();
    const int64_t order = enter[base + s];
    return enter[base + t] <= order && order < leave[base + t];
  }
};

}  // namespace component

// The problem size a mask is evaluated for: [B, Hq, Lq, Lk] (allowed_pairs(), block_map(), the
// audit).
struct MaskShape {
  int64_t batch = 1;
  int64_t q_heads = 1;
  int64_t q_len = 0;
  int64_t k_len = 0;
};

// One slice of a larger problem (split-query / split-key calls, ring attention). The call's Lq
// queries are rows [q_offset, q_offset + Lq) of a problem with q_total queries, its Lk keys rows
// [k_offset, k_offset + Lk) of k_total keys. The mask and the score modifiers describe the whole
// problem: positions and alignment follow q_total/k_total; per-token arrays, dense masks, layouts
// and the bias are read at the global rows; predicates and score_fn receive global indices. So
// calls over the slices of a split, merged with merge_partials, equal one call over the whole.
// The default frame (totals −1) is the call itself.
struct Frame {
  int64_t q_offset = 0;
  int64_t k_offset = 0;
  int64_t q_total = -1;  // −1: the call's own Lq (then q_offset must be 0)
  int64_t k_total = -1;  // −1: the call's own Lk (then k_offset must be 0)

  bool is_whole() const { return q_total < 0 && k_total < 0 && q_offset == 0 && k_offset == 0; }
};

using Component =
    std::variant<component::Window, component::Chunk, component::Padding, component::Segments,
                 component::Spans, component::Prefix, component::GlobalTokens,
                 component::BlockSparse, component::DenseBool, component::DenseAdditive,
                 component::Predicate, component::ProgramMask, component::Tree>;

class Mask {
 public:
  Mask() = default;  // allows every pair

  // Causal (look-ahead) mask: kpos ≤ qpos. The overload with an Alignment also sets the mask's
  // alignment (see set_alignment).
  Mask& causal(HeadSet heads = {});
  Mask& causal(Alignment alignment, HeadSet heads = {});
  // qpos − left ≤ kpos ≤ qpos + right; window(W, 0) sees W + 1 keys (FlashAttention convention).
  Mask& window(int64_t left, int64_t right, HeadSet heads = {});
  // W keys including the query's own position (HF / llama.cpp convention) = window(W − 1, 0).
  Mask& sliding_window(int64_t keys, HeadSet heads = {});
  Mask& chunk(int64_t size, HeadSet heads = {});

  // Key padding (four forms) and query padding (the same four).
  Mask& key_lengths(std::vector<int64_t> lengths);
  Mask& key_starts(std::vector<int64_t> starts);
  Mask& key_keep(Array<int64_t> keep);  // [B, Lk], 1 = real token
  Mask& key_pad_id(Array<int64_t> token_ids, int64_t pad_id);
  Mask& query_lengths(std::vector<int64_t> lengths);
  Mask& query_starts(std::vector<int64_t> starts);
  Mask& query_keep(Array<int64_t> keep);  // [B, Lq]
  Mask& query_pad_id(Array<int64_t> token_ids, int64_t pad_id);

  // Packed documents: one id array for both sides (needs Lq == Lk), or one per side.
  Mask& segments(Array<int64_t> ids, HeadSet heads = {});
  Mask& segments(Array<int64_t> query_ids, Array<int64_t> key_ids, HeadSet heads = {});
  // Bidirectional spans (id 0 = no span), and prefix-LM over positions [0, length).
  Mask& spans(Array<int64_t> ids, HeadSet heads = {});
  Mask& spans(Array<int64_t> query_ids, Array<int64_t> key_ids, HeadSet heads = {});
  Mask& prefix_lm(int64_t length, HeadSet heads = {});
  // Global tokens (Longformer): ids [B, L] or [L] (every sequence), ≠ 0 = global; the one-array
  // form is self-attention (Lq == Lk). A global query sees, and a global key is seen by, every
  // position that causal and window components would hide from it.
  Mask& global_tokens(Array<int64_t> ids, HeadSet heads = {});
  Mask& global_tokens(Array<int64_t> query_ids, Array<int64_t> key_ids, HeadSet heads = {});

  // Block-sparse layout [nQ, nK], [H, nQ, nK] or [B, H, nQ, nK] (1 = the block of block_q queries
  // may attend the block of block_k keys); nQ = ⌈Lq / block_q⌉ and nK = ⌈Lk / block_k⌉ (or 1,
  // broadcast). Builders of the common layouts are in maskattn/sparse_layouts.h.
  Mask& block_sparse(Array<uint8_t> layout, int64_t block_q, int64_t block_k);

  // Dense masks of rank ≤ 4 that broadcast to [B, Hq, Lq, Lk].
  Mask& keep(Array<uint8_t> keep);        // 1 = may attend
  Mask& blocked(Array<uint8_t> blocked);  // 1 = hidden
  Mask& additive(Array<float> values);    // added to the scores; −inf hides

  Mask& predicate(component::PairPredicate allows, std::string name = "predicate");
  // A mask program: Program::mask(text, tables), or a compiled one (Error if it is a score
  // program). Its q and kv are row indices (top-left, as FlexAttention's q_idx and kv_idx).
  Mask& program(Program program);
  Mask& program(std::string_view text, std::vector<ProgramTable> tables = {});

  // A draft tree of speculative decoding: parents [T] (every sequence) or [B, T] (one tree per
  // sequence), parents[t] ∈ [−1, t), −1 for a root. The last T keys (and queries) are the draft;
  // a draft query sees the prefix and its ancestors and itself (component::Tree). Helpers for the
  // position ids and the accepted path: maskattn/tree.h.
  Mask& tree(Array<int64_t> parents, HeadSet heads = {});
  Mask& tree(std::vector<int64_t> parents, HeadSet heads = {});

  // Query alignment when Lq ≠ Lk; applies to every position-dependent component. Setting two
  // different alignments on one mask (or combining masks that did) is an error.
  Mask& set_alignment(Alignment alignment);
  Alignment alignment() const { return alignment_; }
  bool alignment_is_set() const { return alignment_is_set_; }

  // Intersection: a pair is allowed by a & b iff both allow it.
  friend Mask operator&(Mask a, const Mask& b);

  // The components in the order they were added, and a label for each used in error messages
  // (the builder's name, or the CLI's "--mask SPEC").
  const std::vector<Component>& components() const { return components_; }
  const std::vector<std::string>& labels() const { return labels_; }
  // Label the most recently added component (e.g. with the CLI argument it came from).
  Mask& label_last(std::string label);

  std::string describe() const;  // "causal & key_lengths[3]"; "none" for an empty mask

 private:
  friend struct detail::MaskInternals;

  Mask& add(Component component, std::string label);
  Mask& add_padding(Side side, component::Padding::Form form, Array<int64_t> values, int64_t pad_id,
                    const char* name);
  static std::shared_ptr<void> new_scan_cache();

  std::vector<Component> components_;
  std::vector<std::string> labels_;
  // Tile classifications of dense and predicate components, computed by one scan the first time
  // a problem size needs them and reused by later calls (and by copies of this mask), so that
  // repeated calls do not rescan the mask's data. Adding a component starts a new cache. Its type
  // is internal (src/mask/scan_cache.h); the library reaches it through detail::MaskInternals.
  std::shared_ptr<void> scan_cache_ = new_scan_cache();
  Alignment alignment_ = Alignment::bottom_right;
  bool alignment_is_set_ = false;  // set explicitly (conflicts are errors), not by default
};

}  // namespace maskattn
