// The bad-input catalogue's rows for the paged, quantized KV cache (docs/errors.md E144–E148),
// compiled into the errors_test binary.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "maskattn/maskattn.h"
#include "test_util.h"

namespace maskattn {
namespace {

std::vector<float> ones(size_t count) {
  return std::vector<float>(count, 1.0f);
}

TEST(Errors, E144_KVFormat) {
  EXPECT_MASKATTN_ERROR(parse_kv_format("int4", "--kv-format"),
                        "--kv-format = 'int4' is not a KV cache format: use f32, f16, bf16, int8, "
                        "fp8-e4m3, fp8-e5m2 or q4");
  EXPECT_MASKATTN_ERROR(PagedKVCache(4, 16, 1, 48, KVFormat::q4),
                        "PagedKVCache: format q4 stores groups of 32 elements; head_dim 48 and "
                        "value_dim 48 must be multiples of 32");
  EXPECT_MASKATTN_ERROR(kv_format_dtype(KVFormat::int8),
                        "KV format int8 is quantized: its rows have no element dtype");
}

TEST(Errors, E145_ValueTheCacheCannotStore) {
  PagedKVCache cache(4, 16, 1, 32, KVFormat::int8);
  const int64_t s = cache.add_sequence();
  std::vector<float> k = ones(2 * 32), v = ones(2 * 32);
  k[32 + 5] = NAN;
  EXPECT_MASKATTN_ERROR(
      cache.append(s, TensorView(k.data(), {1, 2, 32}), TensorView(v.data(), {1, 2, 32})),
      "PagedKVCache::append: k[0, 1, 5] = nan cannot be stored in int8: a KV cache holds finite "
      "values only");
  k[32 + 5] = 1.0f;
  v[3] = 1e7f;
  EXPECT_MASKATTN_ERROR(
      cache.append(s, TensorView(k.data(), {1, 2, 32}), TensorView(v.data(), {1, 2, 32})),
      "PagedKVCache::append: v[0, 0, 3] = 10000000.000000 cannot be stored in int8: its group's "
      "scale would exceed an f16 (65504)");
  EXPECT_EQ(cache.length(s), 0);
}

TEST(Errors, E146_PoolOutOfBlocks) {
  PagedKVCache cache(2, 16, 1, 8);
  const int64_t s = cache.add_sequence();
  const std::vector<float> k = ones(40 * 8);
  EXPECT_MASKATTN_ERROR(
      cache.append(s, TensorView(k.data(), {1, 40, 8}), TensorView(k.data(), {1, 40, 8})),
      "PagedKVCache is out of blocks: appending 40 positions to sequence 0 (length 0) needs 3 "
      "more blocks of 16 positions, and 2 of 2 are free");
  EXPECT_EQ(cache.free_blocks(), 2);
}

TEST(Errors, E147_PagedCacheSizes) {
  EXPECT_MASKATTN_ERROR(PagedKVCache(0, 16, 1, 8),
                        "PagedKVCache: blocks must be in [1, 2^31), got 0");
  EXPECT_MASKATTN_ERROR(PagedKVCache(4, 24, 1, 8),
                        "PagedKVCache: block_size must be a multiple of 16 in [16, 1024], got 24");
  EXPECT_MASKATTN_ERROR(PagedKVCache(4, 16, 0, 8),
                        "PagedKVCache: kv_heads must be positive, got 0");
  EXPECT_MASKATTN_ERROR(PagedKVCache(4, 16, 1, 0),
                        "PagedKVCache: head_dim and value_dim must be positive, got 0 and 0");
}

TEST(Errors, E148_PagedSequencesAndCalls) {
  PagedKVCache cache(4, 16, 2, 8);
  const int64_t s = cache.add_sequence();
  const std::vector<float> k = ones(2 * 3 * 8);
  cache.append(s, TensorView(k.data(), {2, 3, 8}), TensorView(k.data(), {2, 3, 8}));
  EXPECT_MASKATTN_ERROR(cache.length(7),
                        "PagedKVCache::length: sequence 7 is not in the cache (live sequences: 0)");
  EXPECT_MASKATTN_ERROR(cache.truncate(s, 4),
                        "PagedKVCache::truncate(0, 4) needs a length in [0, 3]");
  EXPECT_MASKATTN_ERROR(
      cache.append(s, TensorView(k.data(), {1, 6, 8}), TensorView(k.data(), {1, 6, 8})),
      "PagedKVCache::append got k [1,6,8] and v [1,6,8]; the cache expects [2,6,8] and [2,6,8]");
  std::vector<float> q = ones(2 * 4 * 2 * 8), out(q.size(), -7.0f);
  const TensorView qv(q.data(), {2, 4, 2, 8});
  const MutableTensorView ov(out.data(), {2, 4, 2, 8});
  EXPECT_MASKATTN_ERROR(attention_paged(qv, cache, {s}, ov),
                        "attention_paged: sequences has 1 ids but q [2,4,2,8] has a batch of 2");
  EXPECT_MASKATTN_ERROR(attention_paged(qv, cache, {s, 5}, ov),
                        "attention_paged: sequences[1] = 5 is not a live sequence of the cache");
  EXPECT_MASKATTN_ERROR(attention_paged(qv, cache, {s, s}, ov, {2, 3}),
                        "attention_paged: query_lengths[1] = 3 must be in [0, min(Lq, length)] = "
                        "[0, 2]");
  EXPECT_MASKATTN_ERROR(
      attention_paged(TensorView(q.data(), {2, 3, 2, 8}), cache, {s, s},
                      MutableTensorView(out.data(), {2, 3, 2, 8})),
      "attention_paged: q [2,3,2,8] does not fit the cache's 2 kv heads of dim 8");
  EXPECT_EQ(out[0], -7.0f);
}

// A draft tree is each sequence's own last T positions: a ragged batch runs (tests/
// paged_tree_test.cc), but every sequence must hold T positions, and a frame cannot slice it.
TEST(Errors, E148_PagedDraftTrees) {
  PagedKVCache cache(4, 16, 2, 8);
  const int64_t s = cache.add_sequence(), t = cache.add_sequence();
  const std::vector<float> k = ones(2 * 5 * 8);
  cache.append(s, TensorView(k.data(), {2, 5, 8}), TensorView(k.data(), {2, 5, 8}));
  cache.append(t, TensorView(k.data(), {2, 2, 8}), TensorView(k.data(), {2, 2, 8}));
  std::vector<float> q = ones(2 * 4 * 2 * 8), out(q.size(), -7.0f);
  const TensorView qv(q.data(), {2, 4, 2, 8});
  const MutableTensorView ov(out.data(), {2, 4, 2, 8});
  const Mask tree = Mask().tree(Array<int64_t>({2, 3}, {-1, 0, 1, -1, -1, 0}));
  EXPECT_MASKATTN_ERROR(
      attention_paged(qv, cache, {s, t}, ov, {2, 2}, tree),
      "attention_paged: sequences[1] = 1 holds 2 positions, fewer than the 3 draft tokens of "
      "tree[2,3]: each sequence's draft is its own last T positions, already appended");
  Options framed;
  framed.frame = Frame{0, 0, 2, 5};
  EXPECT_MASKATTN_ERROR(
      attention_paged(qv, cache, {s, t}, ov, {2, 1}, Mask().tree(std::vector<int64_t>{-1, 0}), {},
                      framed),
      "attention_paged: options.frame is set, but a tree mask over sequences of different "
      "lengths or fewer than Lq queries runs each sequence alone (its draft at its own end), and "
      "a frame slices one problem: call each sequence alone with its frame");
  EXPECT_EQ(out[0], -7.0f);
}

}  // namespace
}  // namespace maskattn
