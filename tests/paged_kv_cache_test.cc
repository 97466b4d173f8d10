// PagedKVCache and attention_paged: the block bookkeeping (fork, copy on write, free, truncate,
// the pool back to empty), the row formats against their definition (kv_format.h), paged attention
// bitwise equal to the same keys in a contiguous tensor for every sweep mask (f32, f16, bf16, row
// and tile kernels), and quantized caches against the f64 reference on the decoded values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "maskattn/maskattn.h"
#include "test_util.h"

namespace maskattn {
namespace {

using test::max_error;
using test::random_values;

int64_t blocks_for(const std::vector<int64_t>& lengths, int64_t block_size) {
  int64_t blocks = 4;  // and a few spare
  for (int64_t n : lengths) blocks += (n + block_size - 1) / block_size;
  return blocks;
}

// A cache holding `lengths[b]` random positions per sequence, and the same keys and values as
// dense [B, Hkv, max length, D] tensors (zeros past each sequence's end), in `dtype`.
struct PagedFixture {
  PagedKVCache cache;
  std::vector<int64_t> ids, lengths;
  std::vector<float> k, v;  // dense, decoded values
  int64_t max_length = 0;

  PagedFixture(int64_t block_size, int64_t heads, int64_t dim, KVFormat format,
               std::vector<int64_t> lens, uint64_t seed)
      : cache(blocks_for(lens, block_size), block_size, heads, dim, format),
        lengths(std::move(lens)) {
    for (int64_t n : lengths) max_length = std::max(max_length, n);
    const int64_t B = static_cast<int64_t>(lengths.size());
    k.assign(B * heads * max_length * dim, 0.0f);
    v.assign(k.size(), 0.0f);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t id = cache.add_sequence();
      ids.push_back(id);
      // Appended in two pieces, so that a block boundary can fall inside an append.
      const int64_t first = lengths[b] / 3;
      for (auto [from, count] : {std::pair{int64_t{0}, first}, {first, lengths[b] - first}}) {
        const std::vector<float> kk = random_values(heads * count * dim, seed + 10 * b + from);
        const std::vector<float> vv = random_values(heads * count * dim, seed + 10 * b + from + 5);
        cache.append(id, TensorView(kk.data(), {heads, count, dim}),
                     TensorView(vv.data(), {heads, count, dim}));
      }
      const std::vector<float> dk = cache.decoded_keys(id), dv = cache.decoded_values(id);
      for (int64_t g = 0; g < heads; ++g) {
        std::copy_n(dk.begin() + g * lengths[b] * dim, lengths[b] * dim,
                    k.begin() + (b * heads + g) * max_length * dim);
        std::copy_n(dv.begin() + g * lengths[b] * dim, lengths[b] * dim,
                    v.begin() + (b * heads + g) * max_length * dim);
      }
    }
  }
};

TEST(KVFormat, Fp8CodesRoundTripAndRoundToNearestEven) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    if ((c & 0x7F) != 0x7F) {  // e4m3's NaN codes aside
      EXPECT_EQ(fp8_e4m3_from_float(float_from_fp8_e4m3(code)), code) << c;
    }
    if ((c & 0x7C) != 0x7C) {  // e5m2's inf/NaN codes aside
      EXPECT_EQ(fp8_e5m2_from_float(float_from_fp8_e5m2(code)), code) << c;
    }
  }
  EXPECT_EQ(float_from_fp8_e4m3(0x7E), 448.0f);
  EXPECT_EQ(float_from_fp8_e4m3(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_e4m3_from_float(1000.0f), 0x7E);  // saturates
  EXPECT_EQ(fp8_e5m2_from_float(-1e6f), 0xFB);
  // 1 + 1/16 is halfway between 1 and 1 + 1/8: ties go to the even code (1).
  EXPECT_EQ(float_from_fp8_e4m3(fp8_e4m3_from_float(1.0625f)), 1.0f);
  EXPECT_EQ(float_from_fp8_e4m3(fp8_e4m3_from_float(1.1875f)), 1.25f);
}

TEST(KVFormat, DecodedRowsStayWithinTheDocumentedBounds) {
  for (KVFormat format : {KVFormat::int8, KVFormat::fp8_e4m3, KVFormat::fp8_e5m2, KVFormat::q4}) {
    for (bool keys : {true, false}) {
      const int64_t width = 96;
      std::vector<float> x = random_values(width, 7, -3.0f, 3.0f);
      x[5] = 40.0f;  // an outlier channel
      std::vector<uint8_t> row(kv_row_bytes(format, keys, width));
      int64_t bad = -1;
      ASSERT_TRUE(kv_encode_row(format, keys, x.data(), width, row.data(), &bad));
      std::vector<float> y(width);
      kv_decode_row(format, keys, row.data(), width, y.data());
      const int64_t group = kv_group_size(format, keys, width);
      for (int64_t e = 0; e < width; ++e) {
        float16 scale;
        std::memcpy(&scale, row.data() + 2 * (e / group), 2);
        const float s = std::fabs(to_float(scale));
        float bound = s / 2;
        if (format == KVFormat::q4) bound = s;
        if (format == KVFormat::fp8_e4m3) bound = std::fabs(x[e]) / 16 + s * std::ldexp(1.0f, -10);
        if (format == KVFormat::fp8_e5m2) bound = std::fabs(x[e]) / 8 + s * std::ldexp(1.0f, -17);
        EXPECT_LE(std::fabs(x[e] - y[e]), bound * 1.0001f)
            << kv_format_name(format) << (keys ? " keys" : " values") << " element " << e;
      }
    }
  }
}

TEST(KVFormat, RefusesValuesItCannotStore) {
  std::vector<float> x(32, 1.0f);
  std::vector<uint8_t> row(kv_row_bytes(KVFormat::int8, true, 32));
  int64_t bad = -1;
  x[3] = NAN;
  EXPECT_FALSE(kv_encode_row(KVFormat::int8, true, x.data(), 32, row.data(), &bad));
  EXPECT_EQ(bad, 3);
  x[3] = 1e7f;  // 1e7 / 127 > 65504: the f16 scale overflows
  EXPECT_FALSE(kv_encode_row(KVFormat::int8, true, x.data(), 32, row.data(), &bad));
  x[3] = 1e7f;
  EXPECT_TRUE(kv_encode_row(KVFormat::fp8_e5m2, true, x.data(), 32, row.data(), &bad));
}

TEST(PagedKVCache, ForkSharesBlocksAndCopiesOnWrite) {
  PagedKVCache cache(8, 16, 2, 4);
  const int64_t a = cache.add_sequence();
  std::vector<float> k = random_values(2 * 20 * 4, 1), v = random_values(2 * 20 * 4, 2);
  cache.append(a, TensorView(k.data(), {2, 20, 4}), TensorView(v.data(), {2, 20, 4}));
  EXPECT_EQ(cache.blocks_in_use(), 2);
  const int64_t b = cache.fork(a);
  EXPECT_EQ(cache.blocks_in_use(), 2);  // shared
  EXPECT_EQ(cache.block_table(a), cache.block_table(b));
  const std::vector<float> before = cache.decoded_keys(a);
  std::vector<float> k2 = random_values(2 * 3 * 4, 3), v2 = random_values(2 * 3 * 4, 4);
  EXPECT_EQ(cache.blocks_needed(b, 3), 1);  // the shared tail is copied first
  cache.append(b, TensorView(k2.data(), {2, 3, 4}), TensorView(v2.data(), {2, 3, 4}));
  EXPECT_EQ(cache.blocks_in_use(), 3);
  EXPECT_EQ(cache.block_table(a)[0], cache.block_table(b)[0]);  // the full block stays shared
  EXPECT_NE(cache.block_table(a)[1], cache.block_table(b)[1]);
  EXPECT_EQ(cache.decoded_keys(a), before);  // the parent never sees the child's writes
  const std::vector<float> child = cache.decoded_keys(b);
  for (int64_t g = 0; g < 2; ++g) {
    for (int64_t p = 0; p < 20; ++p) {
      for (int64_t e = 0; e < 4; ++e) {
        EXPECT_EQ(child[(g * 23 + p) * 4 + e], before[(g * 20 + p) * 4 + e]);
      }
    }
  }
  cache.free(a);
  EXPECT_EQ(cache.blocks_in_use(), 2);
  cache.truncate(b, 10);
  EXPECT_EQ(cache.blocks_in_use(), 1);
  cache.free(b);
  EXPECT_EQ(cache.blocks_in_use(), 0);
  EXPECT_EQ(cache.add_sequence(), 0);  // ids are reused
}

TEST(PagedKVCache, AFailedAppendChangesNothing) {
  PagedKVCache cache(2, 16, 1, 4, KVFormat::int8);
  const int64_t a = cache.add_sequence();
  std::vector<float> k = random_values(40 * 4, 1), v = random_values(40 * 4, 2);
  EXPECT_THROW(cache.append(a, TensorView(k.data(), {1, 40, 4}), TensorView(v.data(), {1, 40, 4})),
               Error);
  EXPECT_EQ(cache.length(a), 0);
  EXPECT_EQ(cache.free_blocks(), 2);
  k[7] = INFINITY;
  EXPECT_THROW(cache.append(a, TensorView(k.data(), {1, 4, 4}), TensorView(v.data(), {1, 4, 4})),
               Error);
  EXPECT_EQ(cache.length(a), 0);
  EXPECT_EQ(cache.free_blocks(), 2);
}

// attention_paged against attention() on the dense copy with the same placed mask.
void expect_paged_equals_dense(const PagedFixture& f, int64_t Hq, int64_t Lq, DType dtype,
                               const Mask& extra, const std::string& label, bool bitwise,
                               bool ragged_queries = true) {
  const int64_t B = static_cast<int64_t>(f.ids.size()), Hkv = f.cache.kv_heads();
  const int64_t D = f.cache.head_dim(), L = f.max_length;
  std::vector<int64_t> qlens;
  for (int64_t b = 0; b < B; ++b) {
    qlens.push_back(std::min(Lq, f.lengths[b]) - (ragged_queries ? b % 2 : 0));
  }
  for (int64_t& n : qlens) n = std::max<int64_t>(n, 0);
  const test::DTypeBuffer q(random_values(B * Hq * Lq * D, 99), dtype);
  const test::DTypeBuffer k(f.k, dtype), v(f.v, dtype);
  std::vector<float> paged(B * Hq * Lq * D, -7.0f), dense(paged.size(), -9.0f);
  Options options;
  options.products = Products::f32;
  attention_paged(q.view({B, Hq, Lq, D}), f.cache, f.ids,
                  MutableTensorView(paged.data(), {B, Hq, Lq, D}), qlens, extra, {}, options);
  const Mask placed =
      Mask().causal() & Mask().key_lengths(f.lengths) & Mask().query_lengths(qlens) & extra;
  attention(q.view({B, Hq, Lq, D}), k.view({B, Hkv, L, D}), v.view({B, Hkv, L, D}),
            MutableTensorView(dense.data(), {B, Hq, Lq, D}), placed, {}, options);
  if (bitwise) {
    ASSERT_EQ(std::memcmp(paged.data(), dense.data(), paged.size() * 4), 0)
        << label << " " << dtype_name(dtype) << " Lq=" << Lq << " max error "
        << max_error(paged, dense);
  } else {
    EXPECT_LE(max_error(paged, dense), 2e-6f) << label;
  }
}

TEST(PagedAttention, BitwiseEqualToTheContiguousCacheForEverySweepMask) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (int64_t Lq : {1, 4, 70}) {
      const KVFormat format = kv_format_of(dtype);
      PagedFixture f(16, 2, 32, format, {200, 37, 129}, 5 + Lq);
      const test::RandomProblem shape(3, 4, 2, Lq, f.max_length, 32, 32, 1);
      int tested = 0;
      for (const auto& [name, mask] : test::paged_sweep_masks(shape)) {
        expect_paged_equals_dense(f, 4, Lq, dtype, mask, name, true);
        ++tested;
      }
      EXPECT_GE(tested, 12);
    }
  }
}

TEST(PagedAttention, BlockSizesFrom16To256) {
  for (int64_t block : {16, 48, 64, 256}) {
    PagedFixture f(block, 1, 64, KVFormat::f32, {300, 5}, 11);
    expect_paged_equals_dense(f, 2, 1, DType::f32, Mask(), "block " + std::to_string(block), true);
    expect_paged_equals_dense(f, 2, 100, DType::f32, Mask(), "block " + std::to_string(block),
                              true);
  }
}

TEST(PagedAttention, QuantizedCachesMatchTheReferenceOnTheirDecodedValues) {
  for (KVFormat format : {KVFormat::int8, KVFormat::fp8_e4m3, KVFormat::fp8_e5m2, KVFormat::q4}) {
    for (int64_t Lq : {1, 3, 80}) {
      PagedFixture f(32, 2, 64, format, {500, 90, 1}, 3);
      const int64_t B = 3, Hq = 4, D = 64;
      const std::vector<float> q = random_values(B * Hq * Lq * D, 8);
      std::vector<float> fused(B * Hq * Lq * D), reference(fused.size());
      std::vector<int64_t> qlens;
      for (int64_t n : f.lengths) qlens.push_back(std::min(n, Lq));
      Options options;
      attention_paged(TensorView(q.data(), {B, Hq, Lq, D}), f.cache, f.ids,
                      MutableTensorView(fused.data(), {B, Hq, Lq, D}), qlens, {}, {}, options);
      options.kernel = Kernel::reference;
      attention_paged(TensorView(q.data(), {B, Hq, Lq, D}), f.cache, f.ids,
                      MutableTensorView(reference.data(), {B, Hq, Lq, D}), qlens, {}, {}, options);
      EXPECT_LE(max_error(fused, reference), 2e-6f) << kv_format_name(format) << " Lq=" << Lq;
      // The same values in a dense f32 tensor, through the library's usual path: the tile kernel
      // decodes rows exactly as kv_decode_row does, so its results are the same bits; the row
      // kernel folds the scales into its sums (another rounding order).
      expect_paged_equals_dense(f, Hq, Lq, DType::f32, Mask(), kv_format_name(format), Lq > 8);
    }
  }
}

}  // namespace
}  // namespace maskattn

namespace maskattn {
namespace {

TEST(PagedKVCache, AcceptKeepsTheVerifiedPathAfterThePrefix) {
  for (bool forked : {false, true}) {
    PagedKVCache cache(16, 16, 2, 8, KVFormat::int8);
    const int64_t s = cache.add_sequence();
    const std::vector<float> k = test::random_values(2 * 30 * 8, 1);
    cache.append(s, TensorView(k.data(), {2, 30, 8}), TensorView(k.data(), {2, 30, 8}));
    const int64_t other = forked ? cache.fork(s) : -1;
    const std::vector<float> before = cache.decoded_keys(s);
    const std::vector<int64_t> path = {0, 2, 5, 9};  // draft = the last 12 positions
    cache.accept(s, 12, path);
    ASSERT_EQ(cache.length(s), 18 + 4);
    const std::vector<float> after = cache.decoded_keys(s);
    for (int64_t g = 0; g < 2; ++g) {
      for (int64_t p = 0; p < 22; ++p) {
        const int64_t source = p < 18 ? p : 18 + path[p - 18];
        for (int64_t e = 0; e < 8; ++e) {
          ASSERT_EQ(after[(g * 22 + p) * 8 + e], before[(g * 30 + source) * 8 + e]) << p;
        }
      }
    }
    if (forked) {
      EXPECT_EQ(cache.decoded_keys(other), before);  // the fork's rows are untouched
      cache.free(other);
    }
    cache.free(s);
    EXPECT_EQ(cache.blocks_in_use(), 0);
  }
  PagedKVCache cache(4, 16, 1, 8);
  const int64_t s = cache.add_sequence();
  const std::vector<float> k(5 * 8, 1.0f);
  cache.append(s, TensorView(k.data(), {1, 5, 8}), TensorView(k.data(), {1, 5, 8}));
  EXPECT_MASKATTN_ERROR(cache.accept(s, 3, {1, 1}), "PagedKVCache::accept: path[1] = 1 must be");
  EXPECT_MASKATTN_ERROR(cache.accept(s, 6, {}), "PagedKVCache::accept: draft = 6 must be in");
  EXPECT_EQ(cache.length(s), 5);
}

}  // namespace
}  // namespace maskattn

namespace maskattn {
namespace {

// A long cache (the row kernel splits its keys into chunks and merges them) with modifiers,
// the same bits for 1 and 2 threads and as the contiguous tensor.
TEST(PagedAttention, LongCachesWithModifiersAndAnyThreadCount) {
  PagedFixture f(16, 1, 64, KVFormat::bf16, {10000}, 21);
  const int64_t D = 64, L = f.max_length;
  const std::vector<float> q = test::random_values(2 * D, 4);
  ScoreMods mods;
  mods.softcap = 20.0;
  mods.alibi_slopes = {0.01f, 0.02f};
  mods.sinks = {0.5f, -1.0f};
  std::vector<float> one(2 * D), two(2 * D), dense(2 * D);
  const test::DTypeBuffer qb(q, DType::bf16), k(f.k, DType::bf16), v(f.v, DType::bf16);
  for (int threads : {1, 2}) {
    Options options;
    options.threads = threads;
    attention_paged(qb.view({1, 2, 1, D}), f.cache, f.ids,
                    MutableTensorView(threads == 1 ? one.data() : two.data(), {1, 2, 1, D}), {},
                    Mask().sliding_window(3000), mods, options);
  }
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * 4), 0);
  const Mask placed = Mask().causal() & Mask().key_lengths(f.lengths) & Mask().query_lengths({1}) &
                      Mask().sliding_window(3000);
  attention(qb.view({1, 2, 1, D}), k.view({1, 1, L, D}), v.view({1, 1, L, D}),
            MutableTensorView(dense.data(), {1, 2, 1, D}), placed, mods);
  EXPECT_EQ(std::memcmp(one.data(), dense.data(), one.size() * 4), 0) << max_error(one, dense);
}

}  // namespace
}  // namespace maskattn

namespace maskattn {
namespace {

// Speculative decoding over the paged cache: a draft tree verified in one call equals the dense
// call with the same tree mask (ragged batches: paged_tree_test.cc).
TEST(PagedAttention, DraftTreesOfSequencesOfEqualLength) {
  PagedFixture f(16, 2, 32, KVFormat::f32, {40, 40}, 31);
  const std::vector<int64_t> parents = {-1, 0, 0, 1, 2, 2};
  const Mask tree = Mask().tree(parents);
  expect_paged_equals_dense(f, 4, 6, DType::f32, tree, "tree", true, false);
}

}  // namespace
}  // namespace maskattn
