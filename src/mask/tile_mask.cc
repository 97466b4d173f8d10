#include "mask/tile_mask.h"

#include "mask/tree_tiles.h"

#include <algorithm>
#include <cmath>

namespace maskattn::detail {

namespace {

using Form = component::Padding::Form;

// Bits of the block's queries whose index relative to the block lies in [lo, hi] (any int64; the
// tile loops below keep theirs within ±2⁶², so that adding a key offset cannot overflow).
inline uint64_t relative_interval(int64_t lo, int64_t hi, int64_t q_count) {
  lo = std::max(lo, int64_t{0});
  hi = std::min(hi, q_count - 1);
  if (hi < lo) return 0;
  return low_bits(hi + 1) & ~low_bits(lo);
}

}  // namespace

TileMaskBuilder::TileMaskBuilder(const ResolvedMask& mask)
    : mask_(mask), per_element_(mask.has_data_elementwise() || !mask.spans_.empty()) {}

uint64_t TileMaskBuilder::interval(int64_t lo, int64_t hi, int64_t q_first, int64_t q_count) {
  // lo and hi may be saturated (an unbounded window side): subtracting must saturate too.
  return relative_interval(saturating_add(lo, -q_first), saturating_add(hi, -q_first), q_count);
}

uint64_t TileMaskBuilder::real_queries(int64_t b, int64_t q_first, int64_t q_count) const {
  uint64_t bits = low_bits(q_count);
  for (const component::Padding* padding : mask_.query_padding_) {
    switch (padding->form) {
      case Form::lengths:
        bits &= interval(0, padding->values.values()[b] - 1, q_first, q_count);
        break;
      case Form::starts:
        bits &= interval(padding->values.values()[b], INT64_MAX, q_first, q_count);
        break;
      case Form::keep:
      case Form::token_ids:
        for (int64_t i = 0; i < q_count; ++i) {
          if (!mask_.is_real(*padding, b, q_first + i)) bits &= ~(uint64_t{1} << i);
        }
        break;
    }
  }
  return bits;
}

uint64_t TileMaskBuilder::global_queries(int64_t b, int64_t h, int64_t q_first,
                                         int64_t q_count) const {
  uint64_t bits = 0;
  for (const component::GlobalTokens* global : mask_.globals_) {
    if (!global->heads.contains(h)) continue;
    for (int64_t i = 0; i < q_count; ++i) {
      if (ResolvedMask::is_global(global->query_ids, b, q_first + i)) bits |= uint64_t{1} << i;
    }
  }
  return bits;
}

// Causal/window components as an interval of query positions per key, relaxed by spans,
// prefix-LM and global tokens; chunks as the interval of positions in the key's chunk.
namespace {

// A bound computed exactly in 128 bits (an unbounded window side is INT64_MAX) brought within
// ±2⁶²: every bound beyond the block's 64 queries selects the same bits, and adding a key offset
// can then no longer overflow. Saturating each step instead is not exact: a bound saturated at
// one step can be pulled back into range by the next (a left-padding key with an unbounded right
// side in a frame of 2⁶³ queries).
inline int64_t clamp_bound(__int128 bound) {
  constexpr __int128 kFar = __int128{1} << 62;
  return static_cast<int64_t>(std::clamp(bound, -kFar, kFar));
}

}  // namespace

// The causal and window components, then what relaxes them (global tokens, prefix-LM, spans), then
// the chunks, over `count` ≤ 64 keys from global row k_first. Each component is asked for its heads
// once per tile, and a window's interval of queries moves by one query per key: the bound of key
// k_first + n is the first key's plus n.
void TileMaskBuilder::order_bits(int64_t b, int64_t h, int64_t q_first, int64_t q_count,
                                 int64_t k_first, int64_t count, uint64_t global_query_bits,
                                 uint64_t* order) const {
  const int64_t kpos_first = mask_.global_kpos(b, k_first);
  const int64_t to_index = -mask_.global_qpos(b, 0);  // query row = qpos + to_index
  const auto relative = [&](__int128 position) {      // a position's query index in the block
    return clamp_bound(position + to_index - q_first);
  };
  const uint64_t all = low_bits(q_count);
  std::fill(order, order + count, all);
  for (const component::Window* window : mask_.windows_) {
    // kpos − right ≤ qpos ≤ kpos + left, in 128 bits: unbounded sides cannot overflow.
    if (!window->heads.contains(h)) continue;
    const int64_t lo = relative(__int128{kpos_first} - window->right);
    const int64_t hi = relative(__int128{kpos_first} + window->left);
    for (int64_t n = 0; n < count; ++n) order[n] &= relative_interval(lo + n, hi + n, q_count);
  }
  relax_order_bits(b, h, q_first, q_count, k_first, count, global_query_bits, order);
  for (const component::Chunk* chunk : mask_.chunks_) {
    if (!chunk->heads.contains(h)) continue;
    for (int64_t n = 0; n < count; ++n) {
      const int64_t first = floor_div(kpos_first + n, chunk->size) * chunk->size;
      order[n] &=
          relative_interval(relative(first), relative(__int128{first} + chunk->size - 1), q_count);
    }
  }
}

// Pairs the windows hide that a global query or key, a prefix-LM prefix or a shared span allows
// again (ORed in: a key the windows leave whole stays whole).
void TileMaskBuilder::relax_order_bits(int64_t b, int64_t h, int64_t q_first, int64_t q_count,
                                       int64_t k_first, int64_t count, uint64_t global_query_bits,
                                       uint64_t* order) const {
  const uint64_t all = low_bits(q_count);
  if (global_query_bits != 0) {
    for (int64_t n = 0; n < count; ++n) order[n] |= global_query_bits;
  }
  for (const component::GlobalTokens* global : mask_.globals_) {
    if (!global->heads.contains(h)) continue;
    const int64_t* ids = &global->key_ids.at(ResolvedMask::global_row(global->key_ids, b), 0);
    for (int64_t n = 0; n < count; ++n) {
      if (ids[k_first + n] != 0) order[n] = all;
    }
  }
  const int64_t kpos_first = mask_.global_kpos(b, k_first);
  const int64_t to_index = -mask_.global_qpos(b, 0);
  for (const component::Prefix* prefix : mask_.prefixes_) {
    if (!prefix->heads.contains(h)) continue;
    const uint64_t prefix_queries =
        interval(to_index, saturating_add(prefix->length - 1, to_index), q_first, q_count);
    for (int64_t n = 0; n < count; ++n) {
      const int64_t kpos = kpos_first + n;
      if (kpos >= 0 && kpos < prefix->length) order[n] |= prefix_queries;
    }
  }
  for (const component::Spans* spans : mask_.spans_) {
    if (!spans->heads.contains(h)) continue;
    for (int64_t n = 0; n < count; ++n) {
      const int64_t span = spans->key_ids.at(b, k_first + n);
      if (span == 0) continue;
      for (int64_t i = 0; i < q_count; ++i) {
        if (spans->query_ids.at(b, q_first + i) == span) order[n] |= uint64_t{1} << i;
      }
    }
  }
}

uint64_t TileMaskBuilder::layout_bits(int64_t b, int64_t h, int64_t q_first, int64_t q_count,
                                      int64_t j) const {
  uint64_t bits = low_bits(q_count);
  for (const ResolvedMask::LayoutRef& layout : mask_.layouts_) {
    const int64_t block_q = layout.sparse->block_q, k_block = j / layout.sparse->block_k;
    uint64_t on = 0;
    for (int64_t q_block = q_first / block_q; q_block * block_q < q_first + q_count; ++q_block) {
      if (layout.allows_block(b, h, q_block, k_block)) {
        on |= interval(q_block * block_q, (q_block + 1) * block_q - 1, q_first, q_count);
      }
    }
    bits &= on;
  }
  return bits;
}

void TileMaskBuilder::build(int64_t b, int64_t h, int64_t q_first, int64_t q_count, int64_t k_first,
                            int64_t k_count, uint64_t* allowed) const {
  // Everything below works in global rows (a call with a frame starts at its offsets).
  q_first += mask_.q_origin();
  k_first += mask_.k_origin();
  const uint64_t queries = real_queries(b, q_first, q_count);
  const uint64_t global_query_bits = global_queries(b, h, q_first, q_count);
  uint64_t order[kMaxQueries];
  for (int64_t k0 = 0; k0 < k_count; k0 += kMaxQueries) {
    const int64_t count = std::min(kMaxQueries, k_count - k0);
    order_bits(b, h, q_first, q_count, k_first + k0, count, global_query_bits, order);
    for (int64_t n = 0; n < count; ++n) allowed[k0 + n] = queries & order[n];
  }
  for (int64_t n = 0; n < k_count; ++n) {
    const int64_t j = k_first + n;
    uint64_t bits = allowed[n];
    for (const component::Padding* padding : mask_.key_padding_) {
      if (bits != 0 && !mask_.is_real(*padding, b, j)) bits = 0;
    }
    if (bits != 0 && !mask_.layouts_.empty()) bits &= layout_bits(b, h, q_first, q_count, j);
    if (bits != 0 && per_element_) {
      // Segments, dense masks, additive −inf and predicates: ask the evaluator per pair.
      for (int64_t i = 0; i < q_count; ++i) {
        const uint64_t bit = uint64_t{1} << i;
        if ((bits & bit) && !mask_.data_elementwise_global(b, h, q_first + i, j)) bits &= ~bit;
      }
    }
    allowed[n] = bits;
  }
  if (!mask_.trees().empty())
    and_tree_bits(mask_, b, h, q_first, q_count, k_first, k_count, allowed);
  if (!mask_.programs_.empty()) and_programs(b, h, q_first, q_count, k_first, k_count, allowed);
}

// Programs give whole tiles of bit rows at once (Program::mask_tile, at most 64 keys a call).
void TileMaskBuilder::and_programs(int64_t b, int64_t h, int64_t q_first, int64_t q_count,
                                   int64_t k_first, int64_t k_count, uint64_t* allowed) const {
  uint64_t bits[kMaxQueries];
  for (int64_t k0 = 0; k0 < k_count; k0 += kMaxQueries) {
    const int64_t nk = std::min(kMaxQueries, k_count - k0);
    bool any = false;
    for (int64_t n = 0; n < nk; ++n) any |= allowed[k0 + n] != 0;
    if (!any) continue;  // the other components hide every pair of these keys
    for (const ResolvedMask::ProgramRef& ref : mask_.programs_) {
      ref.program->mask_tile(b, h, q_first, q_count, k_first + k0, nk, bits);
      for (int64_t n = 0; n < nk; ++n) allowed[k0 + n] &= bits[n];
    }
  }
}

}  // namespace maskattn::detail
