// The element mask of one partial block, as bit rows: allowed[j] has bit i set iff query
// q_first + i may attend key k_first + j. Structured components become intervals of queries per
// key (O(1) per key); per-token arrays, dense masks and predicates are read per element; mask
// programs are evaluated a tile at a time.
#pragma once

#include <cstdint>

#include "mask/resolved_mask.h"

namespace maskattn::detail {

// The bits of the first `count` queries of a block (all 64 for count ≥ 64).
inline uint64_t low_bits(int64_t count) {
  return count >= 64 ? ~uint64_t{0} : (uint64_t{1} << count) - 1;
}

class TileMaskBuilder {
 public:
  static constexpr int64_t kMaxQueries = 64;  // one bit per query in a uint64_t

  explicit TileMaskBuilder(const ResolvedMask& mask);

  // allowed[0, k_count): bit rows for queries [q_first, q_first + q_count) of (b, h) against keys
  // [k_first, k_first + k_count), in the call's rows (the frame's offsets are added here).
  // q_count ≤ 64. The private helpers below take global rows.
  void build(int64_t b, int64_t h, int64_t q_first, int64_t q_count, int64_t k_first,
             int64_t k_count, uint64_t* allowed) const;

 private:
  // Bits of the queries whose index lies in [lo, hi] (inclusive), for a block starting at
  // q_first with q_count queries.
  static uint64_t interval(int64_t lo, int64_t hi, int64_t q_first, int64_t q_count);
  uint64_t real_queries(int64_t b, int64_t q_first, int64_t q_count) const;
  // The queries of the block that some global-token component of head h makes global.
  uint64_t global_queries(int64_t b, int64_t h, int64_t q_first, int64_t q_count) const;
  // order[0, count): the causal/window components, their relaxations and the chunks for `count`
  // ≤ 64 keys from global row k_first.
  void order_bits(int64_t b, int64_t h, int64_t q_first, int64_t q_count, int64_t k_first,
                  int64_t count, uint64_t global_query_bits, uint64_t* order) const;
  void relax_order_bits(int64_t b, int64_t h, int64_t q_first, int64_t q_count, int64_t k_first,
                        int64_t count, uint64_t global_query_bits, uint64_t* order) const;
  // The queries whose layout block pairs with key j's block, for every block-sparse layout.
  uint64_t layout_bits(int64_t b, int64_t h, int64_t q_first, int64_t q_count, int64_t j) const;

  // The bit rows of every mask program, ANDed into allowed[0, k_count) (global rows).
  void and_programs(int64_t b, int64_t h, int64_t q_first, int64_t q_count, int64_t k_first,
                    int64_t k_count, uint64_t* allowed) const;

  const ResolvedMask& mask_;
  bool per_element_;  // segments, spans, dense masks or predicates need a look at every pair
};

}  // namespace maskattn::detail
