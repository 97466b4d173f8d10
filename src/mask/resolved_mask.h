// A Mask checked against one problem size and made ready to answer "is (b, h, i, j) allowed?".
//
// This is the single definition of mask semantics in the code: the reference kernel calls it per
// pair, faster kernels are tested against it. It keeps pointers into the Mask it was built from,
// which must outlive it.
#pragma once

#include <cstdint>
#include <vector>

#include "mask/broadcast.h"
#include "maskattn/mask.h"

namespace maskattn::detail {

// ⌊a / b⌋ for b > 0, also for negative a (positions before the first key are negative).
inline int64_t floor_div(int64_t a, int64_t b) {
  const int64_t quotient = a / b;
  return (a % b != 0 && a < 0) ? quotient - 1 : quotient;
}

// a + b, clamped to the int64 range (unbounded window sides are INT64_MAX).
inline int64_t saturating_add(int64_t a, int64_t b) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) return b > 0 ? INT64_MAX : INT64_MIN;
  return sum;
}

// The whole problem's shape: the call's, with the frame's totals (mask.h). Throws Error (E127)
// when the frame does not contain the call.
MaskShape framed_shape(const MaskShape& call, const Frame& frame);

class ResolvedMask {
 public:
  // Throws Error when a component does not fit the shape (batch size, lengths, heads, broadcast).
  // `shape` is the call's own [B, Hq, Lq, Lk]; `frame` places it in a larger problem (mask.h),
  // against whose lengths the components are checked and positions computed.
  ResolvedMask(const Mask& mask, const MaskShape& shape, const Frame& frame = {});

  // The call's shape, and the whole problem's (equal without a frame).
  const MaskShape& shape() const { return shape_; }
  const MaskShape& global_shape() const { return global_; }
  int64_t q_origin() const { return q_origin_; }
  int64_t k_origin() const { return k_origin_; }

  // Everything below takes the call's row indices (i < Lq, j < Lk) and reads the components at
  // the global rows i + q_origin, j + k_origin.
  // Positions (docs/design.md §2): qpos = i + q_shift[b], kpos = j + k_shift[b] (global rows).
  int64_t qpos(int64_t b, int64_t i) const { return global_qpos(b, i + q_origin_); }
  int64_t kpos(int64_t b, int64_t j) const { return global_kpos(b, j + k_origin_); }

  // Every component allows the pair (additive masks hide where they hold −inf).
  bool allowed(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return allowed_global(b, h, i + q_origin_, j + k_origin_);
  }
  // The per-element components alone: segments, dense keep/blocked, additive −inf, predicates,
  // programs.
  bool allowed_elementwise(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return elementwise_global(b, h, i + q_origin_, j + k_origin_);
  }

  // The draft-tree components (mask/tree.h), which the block map and the tile masks read through
  // TreeTiles (mask/tree_tiles.h).
  const std::vector<const component::Tree*>& trees() const { return trees_; }

  // Sum of the additive masks at the pair (0 when there are none).
  double additive(int64_t b, int64_t h, int64_t i, int64_t j) const;
  bool has_additive() const { return !additive_.empty(); }

 private:
  friend class BlockMap;
  friend class TileMaskBuilder;

  struct DenseRef {
    const void* values;  // uint8_t for keep/blocked, float for additive
    bool blocked;
    BroadcastStrides index;
    size_t component;  // index in the Mask, for the scan cache
  };
  struct LayoutRef {
    const component::BlockSparse* sparse;
    BroadcastStrides index;  // into the layout, over [B, Hq, nQ, nK]
    size_t component;
    bool allows_block(int64_t b, int64_t h, int64_t q_block, int64_t k_block) const {
      return sparse->layout.data()[index.offset(b, h, q_block, k_block)] != 0;
    }
  };
  struct PredicateRef {
    const component::Predicate* predicate;
    size_t component;
  };
  struct ProgramRef {
    const Program* program;
    size_t component;
  };

  // The same questions at global rows (BlockMap and TileMaskBuilder work in global rows).
  int64_t global_qpos(int64_t b, int64_t row) const { return row + q_shift_[b]; }
  int64_t global_kpos(int64_t b, int64_t row) const { return row + k_shift_[b]; }
  bool allowed_global(int64_t b, int64_t h, int64_t i, int64_t j) const;
  bool elementwise_global(int64_t b, int64_t h, int64_t i, int64_t j) const;
  // The per-element components other than programs (which TileMaskBuilder evaluates by tiles).
  bool data_elementwise_global(int64_t b, int64_t h, int64_t i, int64_t j) const;
  bool has_data_elementwise() const {
    return !segments_.empty() || !dense_bool_.empty() || !additive_.empty() || !predicates_.empty();
  }
  // The draft trees that apply to head h allow the pair (true when there are none).
  bool trees_allow(int64_t b, int64_t h, int64_t i, int64_t j) const;
  // The block-sparse layouts allow the pair (true when there are none).
  bool layouts_allow(int64_t b, int64_t h, int64_t i, int64_t j) const;

  // The positions' shifts per batch (q_shift_, k_shift_) from the padding lengths and starts
  // given per side ([0] query, [1] key; null when absent) and the mask's alignment.
  void resolve_positions(const component::Padding* const lengths[2],
                         const component::Padding* const starts[2]);
  bool is_real(const component::Padding& padding, int64_t b, int64_t t) const;
  bool order_allows(int64_t b, int64_t h, int64_t i, int64_t j) const;
  // Spans, prefix-LM or global tokens allow again a pair the causal/window components hide.
  bool relaxed(int64_t b, int64_t h, int64_t i, int64_t j) const;
  // Head h has a span, prefix or global-token component (pairs outside the windows may be allowed).
  bool has_relaxation(int64_t h) const;
  // The row of global-token ids that sequence b reads: its own, or the one row of [1, L] ids.
  static int64_t global_row(const Array<int64_t>& ids, int64_t b) {
    return ids.dim(0) == 1 ? 0 : b;
  }
  static bool is_global(const Array<int64_t>& ids, int64_t b, int64_t t) {
    return ids.at(global_row(ids, b), t) != 0;
  }

  MaskShape shape_, global_;
  int64_t q_origin_ = 0, k_origin_ = 0;
  std::vector<int64_t> q_shift_, k_shift_;  // [B]
  std::vector<const component::Padding*> key_padding_, query_padding_;
  std::vector<const component::Window*> windows_;
  std::vector<const component::Chunk*> chunks_;
  std::vector<const component::Segments*> segments_;
  std::vector<const component::Spans*> spans_;
  std::vector<const component::Prefix*> prefixes_;
  std::vector<const component::GlobalTokens*> globals_;
  std::vector<LayoutRef> layouts_;
  std::vector<DenseRef> dense_bool_;
  std::vector<DenseRef> additive_;
  std::vector<PredicateRef> predicates_;
  std::vector<ProgramRef> programs_;
  std::vector<const component::Tree*> trees_;
  const Mask* mask_;
};

}  // namespace maskattn::detail
