// Tree speculative decoding (maskattn/tree.h, KVCache::accept): position ids and paths of a tree,
// accepting a path in a KVCache and in caller-held views, and one speculative step end to end
// through MultiHeadAttention — the draft appended, verified by one call with Mask::tree, the
// accepted path kept, the next step — against decoding the same tokens one by one.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "maskattn/kv_cache.h"
#include "maskattn/multihead.h"
#include "maskattn/tree.h"
#include "test_util.h"

namespace maskattn {
namespace {

using test::random_values;

TEST(TreeHelpers, PositionIdsAreDepthAfterThePrefix) {
  const Array<int64_t> parents({2, 6}, {-1, 0, 0, 1, 2, -1, /**/ -1, 0, 1, 2, 3, 4});
  const Array<int64_t> positions = tree_position_ids(parents, 10);
  EXPECT_EQ(positions.shape(), (Dims{2, 6}));
  EXPECT_EQ(positions.values(),
            (std::vector<int64_t>{10, 11, 11, 12, 12, 10, /**/ 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(tree_position_ids(Array<int64_t>({3}, {-1, -1, 1}), 0).values(),
            (std::vector<int64_t>{0, 0, 1}));
}

TEST(TreeHelpers, PathGoesFromARootToTheNode) {
  const Array<int64_t> parents({2, 6}, {-1, 0, 0, 1, 2, -1, /**/ -1, 0, 1, 2, 3, 4});
  EXPECT_EQ(tree_path(parents, 4, 0), (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(tree_path(parents, 5, 0), (std::vector<int64_t>{5}));
  EXPECT_EQ(tree_path(parents, 4, 1), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  // [T] parents serve every sequence.
  EXPECT_EQ(tree_path(Array<int64_t>({3}, {-1, 0, 1}), 2, 7), (std::vector<int64_t>{0, 1, 2}));
}

// A cache of B = 2, Hkv = 2 whose row r of (b, g) holds keys 100·b + 10·g + r (and values the
// negatives; exact in bf16), so that every moved row can be recognised.
KVCache numbered_cache(int64_t length, DType dtype) {
  KVCache cache(2, 2, 16, 3, dtype, 2);
  std::vector<float> k, v;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t g = 0; g < 2; ++g) {
      for (int64_t r = 0; r < length; ++r) {
        for (int e = 0; e < 3; ++e) k.push_back(static_cast<float>(100 * b + 10 * g + r));
        for (int e = 0; e < 2; ++e) v.push_back(-static_cast<float>(100 * b + 10 * g + r));
      }
    }
  }
  cache.append(TensorView(k.data(), {2, 2, length, 3}), TensorView(v.data(), {2, 2, length, 2}));
  return cache;
}

// Row r of (b, g) of the cache, read back as the number numbered_cache wrote there.
float key_at(const KVCache& cache, int64_t b, int64_t g, int64_t r) {
  const TensorView keys = cache.keys();
  const size_t size = dtype_size(keys.dtype());
  test::DTypeBuffer copy(std::vector<float>(1), keys.dtype());
  std::memcpy(copy.words.data(),
              static_cast<const uint8_t*>(keys.data()) + keys.offset({b, g, r, 2}) * size, size);
  return copy.at(0);
}

TEST(KVCacheAccept, KeepsThePathAfterThePrefixAndRollsTheRestBack) {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    // A prefix of 4 and a draft of 6: per sequence trees, paths of 3 (the same count for both).
    KVCache cache = numbered_cache(10, dtype);
    const Array<int64_t> parents({2, 6}, {-1, 0, 0, 1, 2, -1, /**/ -1, -1, 1, 0, 2, 4});
    cache.accept(parents, Array<int64_t>({2, 3}, {0, 2, 4, /**/ 1, 2, 4}));
    ASSERT_EQ(cache.length(), 7);
    const int64_t kept[2][7] = {{0, 1, 2, 3, 4, 6, 8}, {0, 1, 2, 3, 5, 6, 8}};
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t g = 0; g < 2; ++g) {
        for (int64_t r = 0; r < 7; ++r) {
          EXPECT_EQ(key_at(cache, b, g, r), 100 * b + 10 * g + kept[b][r])
              << dtype_name(dtype) << " b=" << b << " g=" << g << " row " << r;
        }
      }
    }
    // Values moved with their keys.
    const TensorView values = cache.values();
    if (dtype == DType::f32) {
      EXPECT_EQ(static_cast<const float*>(values.data())[values.offset({1, 1, 4, 1})], -115.0f);
    }
    // The next append lands after the accepted path.
    std::vector<float> k(2 * 2 * 3, 7.0f), v(2 * 2 * 2, 7.0f);
    cache.append(TensorView(k.data(), {2, 2, 1, 3}), TensorView(v.data(), {2, 2, 1, 2}));
    EXPECT_EQ(cache.length(), 8);
    EXPECT_EQ(key_at(cache, 1, 0, 7), 7.0f);
  }
}

TEST(KVCacheAccept, OneTreeForEverySequenceAndRejectingEverything) {
  KVCache cache = numbered_cache(9, DType::f32);
  // [T] parents and an [A] path: the same for both sequences.
  cache.accept(Array<int64_t>({5}, {-1, 0, 0, 1, -1}), Array<int64_t>({2}, {0, 2}));
  EXPECT_EQ(cache.length(), 6);
  EXPECT_EQ(key_at(cache, 1, 1, 4), 114.0f);
  EXPECT_EQ(key_at(cache, 1, 1, 5), 116.0f);
  // An empty path keeps the prefix only: a plain rollback of the draft.
  cache.accept(Array<int64_t>({2}, {-1, -1}), Array<int64_t>({0}, {}));
  EXPECT_EQ(cache.length(), 4);
  EXPECT_EQ(key_at(cache, 0, 1, 3), 13.0f);
}

TEST(KVCacheAccept, CallerHeldViewsWithACapacityAndStrides) {
  // k [B=1, H=2, capacity 8, D=2] in [B, L, H, D] memory (a strided view), v contiguous f16: the
  // first `length` = 6 rows are filled, the last 4 a draft.
  std::vector<float> k(8 * 2 * 2);
  for (int64_t l = 0; l < 8; ++l) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t e = 0; e < 2; ++e) k[(l * 2 + h) * 2 + e] = static_cast<float>(10 * h + l);
    }
  }
  test::DTypeBuffer v(random_values(2 * 8 * 3, 5), DType::f16);
  const std::vector<float> v_before = v.floats(2 * 8 * 3);
  const MutableTensorView kv(k.data(), {1, 2, 8, 2}, {32, 2, 4, 1});
  const int64_t length =
      accept_tree_path(kv, v.mutable_view({1, 2, 8, 3}), 6, Array<int64_t>({4}, {-1, 0, 0, 2}),
                       Array<int64_t>({3}, {0, 2, 3}));
  EXPECT_EQ(length, 5);
  for (int64_t h = 0; h < 2; ++h) {
    const int64_t expected[5] = {0, 1, 2, 4, 5};
    for (int64_t l = 0; l < 5; ++l) {
      EXPECT_EQ(k[(l * 2 + h) * 2 + 1], static_cast<float>(10 * h + expected[l])) << h << " " << l;
    }
    EXPECT_EQ(v.at((h * 8 + 3) * 3 + 2), v_before[(h * 8 + 4) * 3 + 2]);
  }
}

// ---- one speculative step end to end ----

// The output for draft token `node` of sequence b when the tokens of its path are decoded one
// at a time after the prompt (a cache of batch 1 per sequence): the oracle of a tree call.
std::vector<float> decoded_one_by_one(const MultiHeadAttention& layer, const std::vector<float>& x,
                                      int64_t batch_rows, int64_t length, int64_t b,
                                      const std::vector<int64_t>& rows, const LayerOptions& options,
                                      DType dtype) {
  const int64_t E = layer.embed_dim();
  KVCache cache = layer.make_cache(1, length, dtype);
  std::vector<float> out(E);
  for (const int64_t row : rows) {
    layer.forward_cached(TensorView(x.data() + (b * batch_rows + row) * E, {1, 1, E}), cache,
                         MutableTensorView(out.data(), {1, 1, E}), {}, {}, options);
  }
  return out;
}

// A prompt of P tokens, a draft tree of T, verification, accept, a second tree: every draft
// output equals decoding its path token by token (bitwise with the f64 reference kernel, whose
// sums run over the same allowed keys in the same order; to f32 rounding with the fused kernel,
// whose tiles cut the keys at other places when rejected branches sit between them), and the
// cache after accept holds exactly the bits of a cache that decoded the accepted tokens.
void run_speculative_step(Kernel kernel, DType dtype, float tolerance) {
  const int64_t B = 2, P = 20, T = 7, T2 = 4, E = 32;
  const auto layer = MultiHeadAttention::random(E, 4, 2, 91);
  LayerOptions options;
  options.attention.kernel = kernel;
  // Rows of x per sequence: the prompt, the first draft, the second draft.
  const int64_t rows = P + T + T2;
  const std::vector<float> x = random_values(B * rows * E, 92);
  const auto view = [&](int64_t first, int64_t count) {
    return TensorView(x.data() + first * E, {B, count, E}, {rows * E, E, 1});
  };
  const Array<int64_t> parents({B, T}, {-1, 0, 0, 1, 2, 3, -1, /**/ -1, -1, 1, 0, 2, 4, 5});
  KVCache cache = layer.make_cache(B, rows, dtype);
  std::vector<float> prompt_out(B * P * E), draft_out(B * T * E);
  layer.forward_cached(view(0, P), cache, MutableTensorView(prompt_out.data(), {B, P, E}), {}, {},
                       options);
  layer.forward_cached(view(P, T), cache, MutableTensorView(draft_out.data(), {B, T, E}),
                       Mask().tree(parents), {}, options);
  std::vector<int64_t> prompt_rows(P);
  for (int64_t n = 0; n < P; ++n) prompt_rows[n] = n;
  const std::string what =
      std::string(dtype_name(dtype)) + (kernel == Kernel::fused ? " fused" : " reference");
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t node = 0; node < T; ++node) {
      std::vector<int64_t> path_rows = prompt_rows;
      for (const int64_t t : tree_path(parents, node, b)) path_rows.push_back(P + t);
      const std::vector<float> expected =
          decoded_one_by_one(layer, x, rows, rows, b, path_rows, options, dtype);
      const std::vector<float> got(draft_out.begin() + (b * T + node) * E,
                                   draft_out.begin() + (b * T + node + 1) * E);
      EXPECT_LE(test::max_error(got, expected), tolerance)
          << what << " b=" << b << " node " << node;
    }
  }
  // Accept the path to node 5 in both sequences (0 1 3 5 and 1 2 4 5: four tokens each).
  const std::vector<int64_t> path0 = tree_path(parents, 5, 0), path1 = tree_path(parents, 5, 1);
  std::vector<int64_t> paths = path0;
  paths.insert(paths.end(), path1.begin(), path1.end());
  cache.accept(parents, Array<int64_t>({B, 4}, paths));
  ASSERT_EQ(cache.length(), P + 4);
  // The same tokens decoded one by one into a fresh cache: the same bits in both caches.
  KVCache plain = layer.make_cache(B, rows, dtype);
  std::vector<float> token(B * E), scratch(B * P * E);
  layer.forward_cached(view(0, P), plain, MutableTensorView(scratch.data(), {B, P, E}), {}, {},
                       options);
  for (int64_t a = 0; a < 4; ++a) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t t = (b == 0 ? path0 : path1)[a];
      std::copy_n(x.begin() + (b * rows + P + t) * E, E, token.begin() + b * E);
    }
    layer.forward_cached(TensorView(token.data(), {B, 1, E}), plain,
                         MutableTensorView(scratch.data(), {B, 1, E}), {}, {}, options);
  }
  ASSERT_EQ(plain.length(), cache.length());
  const size_t bytes = dtype_size(dtype);
  for (const auto& [a, b] :
       {std::pair{cache.keys(), plain.keys()}, {cache.values(), plain.values()}}) {
    for (int64_t n = 0; n < B * layer.kv_heads() * (P + 4); ++n) {
      const int64_t s = n / (P + 4), r = n % (P + 4);
      const int64_t off = a.offset({s / layer.kv_heads(), s % layer.kv_heads(), r, 0});
      EXPECT_EQ(std::memcmp(static_cast<const uint8_t*>(a.data()) + off * bytes,
                            static_cast<const uint8_t*>(b.data()) + off * bytes, a.size(3) * bytes),
                0)
          << what << " cache row " << r;
    }
  }
  // The next step: a second tree (its first token the target's own next token, then drafts) on
  // both caches gives the same bits: the rejected branches left no trace.
  const Array<int64_t> next({T2}, {-1, 0, 0, 1});
  std::vector<float> after_accept(B * T2 * E), after_plain(B * T2 * E);
  layer.forward_cached(view(P + T, T2), cache, MutableTensorView(after_accept.data(), {B, T2, E}),
                       Mask().tree(next), {}, options);
  layer.forward_cached(view(P + T, T2), plain, MutableTensorView(after_plain.data(), {B, T2, E}),
                       Mask().tree(next), {}, options);
  EXPECT_EQ(after_accept, after_plain) << what;
}

TEST(SpeculativeStep, TreeVerificationEqualsDecodingEachPathBitwiseWithTheReference) {
  run_speculative_step(Kernel::reference, DType::f32, 0.0f);
  run_speculative_step(Kernel::reference, DType::bf16, 0.0f);
}

TEST(SpeculativeStep, TreeVerificationEqualsDecodingEachPathToRoundingWithTheFusedKernel) {
  run_speculative_step(Kernel::fused, DType::f32, 1e-6f);
}

}  // namespace
}  // namespace maskattn
