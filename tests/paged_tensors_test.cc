// attention_paged over caller-owned pages (maskattn/paged_tensors.h): bitwise equal to maskattn's
// own PagedKVCache holding the same rows and to attention() on the dense copy, for every sweep
// mask, f32/f16/bf16, the row and the tile kernel; against the f64 reference; any axis order of
// the pool (FlashAttention's, head-major, transformers' interleaved pages); whatever the pool
// holds where no sequence reads (NaN) stays out of the result.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "maskattn/maskattn.h"
#include "test_util.h"

namespace maskattn {
namespace {

using test::max_error;
using test::random_values;

// Sequences of `lengths` random positions in a pool [blocks, block_size, Hkv, D] of `dtype`
// (FlashAttention's layout) with shuffled block tables, every other element of the pool `fill`
// (0, as in a fresh PagedKVCache; or NaN, garbage); the same rows in a PagedKVCache and in dense
// f32 tensors [B, Hkv, max length, D] (zeros past each end).
struct CallerPool {
  int64_t B, blocks, block_size, Hkv, D, max_length = 0;
  DType dtype;
  std::vector<int64_t> lengths, ids;
  std::vector<int32_t> table;
  int64_t columns = 0;
  test::DTypeBuffer keys, values;  // the pool
  std::vector<float> k, v;         // dense, the values the pool holds
  PagedKVCache cache;

  CallerPool(int64_t block, int64_t heads, int64_t dim, DType type, std::vector<int64_t> lens,
             uint64_t seed, float fill = 0.0f)
      : B(static_cast<int64_t>(lens.size())),
        blocks(64),
        block_size(block),
        Hkv(heads),
        D(dim),
        dtype(type),
        lengths(std::move(lens)),
        keys(std::vector<float>(64 * block * heads * dim, fill), type),
        values(std::vector<float>(64 * block * heads * dim, fill), type),
        cache(64, block, heads, dim, kv_format_of(type)) {
    for (int64_t n : lengths) max_length = std::max(max_length, n);
    for (int64_t n : lengths) columns = std::max(columns, (n + block - 1) / block + 1);
    std::vector<int32_t> order(static_cast<size_t>(blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
    table.assign(static_cast<size_t>(B * columns), -1);  // unused entries: −1, as transformers
    k.assign(static_cast<size_t>(B * Hkv * max_length * D), 0.0f);
    v.assign(k.size(), 0.0f);
    size_t next = 0;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j * block < lengths[b]; ++j) table[b * columns + j] = order[next++];
      fill_sequence(b, seed + 7 * b);
    }
  }

  void fill_sequence(int64_t b, uint64_t seed) {
    const int64_t n = lengths[b];
    const test::DTypeBuffer kk(random_values(Hkv * n * D, seed), dtype);
    const test::DTypeBuffer vv(random_values(Hkv * n * D, seed + 3), dtype);
    const size_t element = dtype_size(dtype);
    for (int64_t g = 0; g < Hkv; ++g) {
      for (int64_t p = 0; p < n; ++p) {
        const int64_t block = table[b * columns + p / block_size], row = p % block_size;
        const size_t from = static_cast<size_t>((g * n + p) * D);
        const size_t to = static_cast<size_t>(((block * block_size + row) * Hkv + g) * D);
        auto* key_bytes = reinterpret_cast<uint8_t*>(keys.words.data());
        auto* value_bytes = reinterpret_cast<uint8_t*>(values.words.data());
        std::memcpy(key_bytes + to * element,
                    reinterpret_cast<const uint8_t*>(kk.words.data()) + from * element,
                    D * element);
        std::memcpy(value_bytes + to * element,
                    reinterpret_cast<const uint8_t*>(vv.words.data()) + from * element,
                    D * element);
        for (int64_t d = 0; d < D; ++d) {
          k[((b * Hkv + g) * max_length + p) * D + d] = kk.at(from + d);
          v[((b * Hkv + g) * max_length + p) * D + d] = vv.at(from + d);
        }
      }
    }
    ids.push_back(cache.add_sequence());
    cache.append(ids.back(), kk.view({Hkv, n, D}), vv.view({Hkv, n, D}));
  }

  PagedTensors view() const {
    PagedTensors kv;
    kv.keys = keys.view({blocks, block_size, Hkv, D});
    kv.values = values.view({blocks, block_size, Hkv, D});
    kv.block_table = table.data();
    kv.table_columns = columns;
    kv.lengths = lengths;
    return kv;
  }
};

std::vector<int64_t> query_counts(const CallerPool& f, int64_t Lq) {
  std::vector<int64_t> counts;
  for (int64_t b = 0; b < f.B; ++b) {
    counts.push_back(std::max<int64_t>(std::min(Lq, f.lengths[b]) - b % 2, 0));
  }
  return counts;
}

// The caller's pool, maskattn's PagedKVCache and the dense tensors give the same bits.
void expect_three_paths_agree(const CallerPool& f, int64_t Hq, int64_t Lq, const Mask& extra,
                              const std::string& label) {
  const int64_t B = f.B, D = f.D, L = f.max_length;
  const std::vector<int64_t> qlens = query_counts(f, Lq);
  const test::DTypeBuffer q(random_values(B * Hq * Lq * D, 99 + Lq), f.dtype);
  const test::DTypeBuffer k(f.k, f.dtype), v(f.v, f.dtype);
  std::vector<float> pool(B * Hq * Lq * D, -7.0f), cache(pool.size(), -8.0f), dense(pool.size());
  Options options;
  options.products = Products::f32;
  const Dims out_shape = {B, Hq, Lq, D};
  attention_paged(q.view(out_shape), f.view(), MutableTensorView(pool.data(), out_shape), qlens,
                  extra, {}, options);
  attention_paged(q.view(out_shape), f.cache, f.ids, MutableTensorView(cache.data(), out_shape),
                  qlens, extra, {}, options);
  const Mask placed =
      Mask().causal() & Mask().key_lengths(f.lengths) & Mask().query_lengths(qlens) & extra;
  attention(q.view(out_shape), k.view({B, f.Hkv, L, D}), v.view({B, f.Hkv, L, D}),
            MutableTensorView(dense.data(), out_shape), placed, {}, options);
  const std::string what = label + " " + dtype_name(f.dtype) + " Lq=" + std::to_string(Lq);
  ASSERT_EQ(std::memcmp(pool.data(), cache.data(), pool.size() * 4), 0)
      << what << " max error against the PagedKVCache " << max_error(pool, cache);
  ASSERT_EQ(std::memcmp(pool.data(), dense.data(), pool.size() * 4), 0)
      << what << " max error against dense " << max_error(pool, dense);
}

TEST(PagedTensors, BitwiseEqualToPagedKVCacheAndDenseForEverySweepMask) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (int64_t Lq : {1, 4, 70}) {
      const CallerPool f(16, 2, 32, dtype, {200, 37, 129}, 5 + Lq);
      const test::RandomProblem shape(3, 4, 2, Lq, f.max_length, 32, 32, 1);
      int tested = 0;
      for (const auto& [name, mask] : test::paged_sweep_masks(shape)) {
        expect_three_paths_agree(f, 4, Lq, mask, name);
        ++tested;
      }
      EXPECT_GE(tested, 12);
    }
  }
}

TEST(PagedTensors, BlockSizesAndLengthsAtBlockEdges) {
  for (int64_t block : {16, 48, 256}) {
    const CallerPool f(block, 1, 64, DType::f32, {block, 2 * block + 1, 1, 300}, 11);
    for (int64_t Lq : {1, 9, 100}) expect_three_paths_agree(f, 3, Lq, Mask(), "block");
  }
}

TEST(PagedTensors, MatchesTheReference) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t Lq : {1, 3, 80}) {
      const CallerPool f(32, 2, 64, dtype, {500, 90, 1}, 3);
      const int64_t B = 3, Hq = 4, D = 64;
      const test::DTypeBuffer q(random_values(B * Hq * Lq * D, 8), dtype);
      std::vector<float> fused(B * Hq * Lq * D), reference(fused.size());
      std::vector<float> lse(B * Hq * Lq), reference_lse(lse.size());
      const std::vector<int64_t> qlens = query_counts(f, Lq);
      const Mask window = Mask().sliding_window(40);
      Options options;
      // f32 outputs for bf16 inputs: the comparison sees the kernel's arithmetic, not a rounding.
      attention_paged(q.view({B, Hq, Lq, D}), f.view(),
                      MutableTensorView(fused.data(), {B, Hq, Lq, D}), qlens, window, {}, options,
                      MutableTensorView(lse.data(), {B, Hq, Lq}));
      options.kernel = Kernel::reference;
      attention_paged(q.view({B, Hq, Lq, D}), f.view(),
                      MutableTensorView(reference.data(), {B, Hq, Lq, D}), qlens, window, {},
                      options, MutableTensorView(reference_lse.data(), {B, Hq, Lq}));
      EXPECT_LE(max_error(fused, reference), 2e-6f) << dtype_name(dtype) << " Lq=" << Lq;
      EXPECT_LE(max_error(lse, reference_lse), 2e-6f) << dtype_name(dtype) << " Lq=" << Lq;
      // Entry 1's last row is padding (query_counts gives it one query fewer than Lq): zeros,
      // LSE −inf.
      const int64_t row = (1 * Hq) * Lq + (Lq - 1);
      for (int64_t d = 0; d < D; ++d) EXPECT_EQ(fused[row * D + d], 0.0f);
      EXPECT_EQ(lse[row], -std::numeric_limits<float>::infinity());
    }
  }
}

// A draft tree over a ragged batch of caller-owned pages: each sequence's rows are the call on
// it alone (its row of the block table, its own parents), and the PagedKVCache's (bitwise), with
// and without causal; bf16 pages, 2 threads (paged_tree_test.cc has the sweep).
TEST(PagedTensors, DraftTreesOverARaggedBatch) {
  const CallerPool f(16, 2, 32, DType::bf16, {37, 4, 64}, 6);
  const int64_t B = 3, Hq = 4, Lq = 6, D = 32;
  const test::DTypeBuffer q(random_values(B * Hq * Lq * D, 2), DType::bf16);
  const std::vector<int64_t> qlens = {6, 4, 2}, parents = {-1, 0, 1, 1, -1, -1, 0, 1, -1, 0, 0, 2};
  Options options;
  options.threads = 2;
  for (bool causal : {true, false}) {
    PagedTensors kv = f.view();
    kv.causal = causal;
    const Mask tree = Mask().tree(Array<int64_t>({B, 4}, parents));
    std::vector<float> pool(B * Hq * Lq * D, -7.0f), cache(pool.size(), -8.0f);
    attention_paged(q.view({B, Hq, Lq, D}), kv, MutableTensorView(pool.data(), {B, Hq, Lq, D}),
                    qlens, tree, {}, options);
    if (causal) {
      attention_paged(q.view({B, Hq, Lq, D}), f.cache, f.ids,
                      MutableTensorView(cache.data(), {B, Hq, Lq, D}), qlens, tree, {}, options);
      EXPECT_EQ(std::memcmp(pool.data(), cache.data(), pool.size() * 4), 0);
    }
    for (int64_t b = 0; b < B; ++b) {
      const int64_t n = qlens[b];
      PagedTensors one = kv;
      one.block_table = f.table.data() + b * f.columns;
      one.lengths = {f.lengths[b]};
      const std::vector<int64_t> own(parents.begin() + 4 * b, parents.begin() + 4 * b + 4);
      std::vector<float> out(Hq * n * D, -9.0f);
      const auto* first = reinterpret_cast<const uint16_t*>(q.words.data()) + b * Hq * Lq * D;
      attention_paged(TensorView(first, DType::bf16, {1, Hq, n, D}, {Hq * Lq * D, Lq * D, D, 1}),
                      one, MutableTensorView(out.data(), {1, Hq, n, D}), {}, Mask().tree(own), {},
                      options);
      for (int64_t h = 0; h < Hq; ++h) {
        EXPECT_EQ(
            std::memcmp(pool.data() + ((b * Hq + h) * Lq) * D, out.data() + h * n * D, n * D * 4),
            0)
            << "causal " << causal << " sequence " << b << " head " << h;
      }
    }
  }
}

// Transposed and interleaved pools: the same rows in other axis orders give the same bits.
TEST(PagedTensors, AnyAxisOrderOfThePool) {
  const CallerPool f(32, 2, 16, DType::f32, {70, 33}, 4);
  const int64_t B = 2, Hq = 4, Lq = 5, D = 16, blocks = f.blocks, P = f.block_size, H = f.Hkv;
  const std::vector<float> q = random_values(B * Hq * Lq * D, 5);
  const TensorView qv(q.data(), {B, Hq, Lq, D});
  std::vector<float> expected(B * Hq * Lq * D), got(expected.size());
  attention_paged(qv, f.view(), MutableTensorView(expected.data(), {B, Hq, Lq, D}));
  const auto* keys = reinterpret_cast<const float*>(f.keys.words.data());
  const auto* values = reinterpret_cast<const float*>(f.values.words.data());
  // Head-major blocks [blocks, Hkv, P, D] (vLLM's CPU layout), given as a permuted view.
  std::vector<float> hk(keys, keys + blocks * P * H * D), hv(values, values + hk.size());
  for (int64_t n = 0; n < blocks; ++n)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t g = 0; g < H; ++g)
        for (int64_t d = 0; d < D; ++d) {
          hk[((n * H + g) * P + p) * D + d] = keys[((n * P + p) * H + g) * D + d];
          hv[((n * H + g) * P + p) * D + d] = values[((n * P + p) * H + g) * D + d];
        }
  PagedTensors head_major = f.view();
  head_major.keys = TensorView(hk.data(), {blocks, P, H, D}, {H * P * D, D, P * D, 1});
  head_major.values = TensorView(hv.data(), {blocks, P, H, D}, {H * P * D, D, P * D, 1});
  attention_paged(qv, head_major, MutableTensorView(got.data(), {B, Hq, Lq, D}));
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * 4), 0);
  // transformers' pages: a page of keys then a page of values of each layer (two layers), one
  // tensor; a layer's keys are the view starting at its first page, every 4th page its own.
  std::vector<float> interleaved(blocks * 4 * P * H * D, NAN);
  for (int64_t n = 0; n < blocks; ++n) {
    std::copy_n(keys + n * P * H * D, P * H * D, interleaved.data() + (4 * n + 2) * P * H * D);
    std::copy_n(values + n * P * H * D, P * H * D, interleaved.data() + (4 * n + 3) * P * H * D);
  }
  PagedTensors layer1 = f.view();
  layer1.keys = TensorView(interleaved.data() + 2 * P * H * D, {blocks, P, H, D},
                           {4 * P * H * D, H * D, D, 1});
  layer1.values = TensorView(interleaved.data() + 3 * P * H * D, {blocks, P, H, D},
                             {4 * P * H * D, H * D, D, 1});
  std::fill(got.begin(), got.end(), -1.0f);
  attention_paged(qv, layer1, MutableTensorView(got.data(), {B, Hq, Lq, D}));
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * 4), 0);
}

// causal = false: every query sees its whole sequence (FlashAttention's causal=False).
TEST(PagedTensors, WithoutCausalEveryQuerySeesTheWholeSequence) {
  const CallerPool f(16, 1, 32, DType::f32, {40, 17, 64}, 6);
  const int64_t B = 3, Hq = 2, Lq = 3, D = 32, L = f.max_length;
  const std::vector<float> q = random_values(B * Hq * Lq * D, 7);
  std::vector<float> got(B * Hq * Lq * D), dense(got.size());
  PagedTensors kv = f.view();
  kv.causal = false;
  Options options;
  options.products = Products::f32;
  attention_paged(TensorView(q.data(), {B, Hq, Lq, D}), kv,
                  MutableTensorView(got.data(), {B, Hq, Lq, D}), {}, {}, {}, options);
  attention(TensorView(q.data(), {B, Hq, Lq, D}), TensorView(f.k.data(), {B, 1, L, D}),
            TensorView(f.v.data(), {B, 1, L, D}), MutableTensorView(dense.data(), {B, Hq, Lq, D}),
            Mask().key_lengths(f.lengths), {}, options);
  EXPECT_EQ(std::memcmp(got.data(), dense.data(), got.size() * 4), 0) << max_error(got, dense);
}

// NaN where no sequence reads (the tails of last blocks, unused blocks) stays out of the result:
// the kernels skip hidden keys' values (a V tile holding NaN takes the guarded products, so the
// bits may differ from a finite pool's, within the accuracy rule).
TEST(PagedTensors, GarbageInThePoolStaysOut) {
  for (int64_t Lq : {1, 70}) {
    const CallerPool clean(16, 2, 32, DType::f32, {200, 37, 129}, 3);
    const CallerPool dirty(16, 2, 32, DType::f32, {200, 37, 129}, 3, NAN);
    const int64_t B = 3, Hq = 4, D = 32;
    const std::vector<float> q = random_values(B * Hq * Lq * D, 4);
    std::vector<float> a(B * Hq * Lq * D), b(a.size());
    const std::vector<int64_t> qlens = query_counts(clean, Lq);
    attention_paged(TensorView(q.data(), {B, Hq, Lq, D}), clean.view(),
                    MutableTensorView(a.data(), {B, Hq, Lq, D}), qlens);
    attention_paged(TensorView(q.data(), {B, Hq, Lq, D}), dirty.view(),
                    MutableTensorView(b.data(), {B, Hq, Lq, D}), qlens);
    for (float x : b) ASSERT_TRUE(std::isfinite(x)) << "Lq=" << Lq;
    EXPECT_LE(max_error(a, b), 2e-6f) << "Lq=" << Lq;
  }
}

// More queries than a sequence holds: the first rows sit before position 0 and see nothing under
// causal (FlashAttention's seqlen_q > seqlen_k), as attention() places them.
TEST(PagedTensors, MoreQueriesThanPositionsGiveLeadingZeroRows) {
  const CallerPool f(16, 1, 16, DType::f32, {5, 40}, 2);
  const int64_t B = 2, Hq = 2, Lq = 12, D = 16, L = f.max_length;
  const std::vector<float> q = random_values(B * Hq * Lq * D, 3);
  std::vector<float> got(B * Hq * Lq * D), dense(got.size());
  attention_paged(TensorView(q.data(), {B, Hq, Lq, D}), f.view(),
                  MutableTensorView(got.data(), {B, Hq, Lq, D}));
  attention(TensorView(q.data(), {B, Hq, Lq, D}), TensorView(f.k.data(), {B, 1, L, D}),
            TensorView(f.v.data(), {B, 1, L, D}), MutableTensorView(dense.data(), {B, Hq, Lq, D}),
            Mask().causal() & Mask().key_lengths(f.lengths) & Mask().query_lengths({Lq, Lq}));
  EXPECT_EQ(std::memcmp(got.data(), dense.data(), got.size() * 4), 0) << max_error(got, dense);
  for (int64_t i = 0; i < Lq - 5; ++i) {  // entry 0, head 0: 7 rows before position 0
    for (int64_t d = 0; d < D; ++d) EXPECT_EQ(got[i * D + d], 0.0f) << i;
  }
  EXPECT_NE(got[(Lq - 5) * D], 0.0f);
}

// An empty batch, empty sequences (no block read: the table may be −1 throughout) and Lq = 0.
TEST(PagedTensors, EmptySequencesGiveZeros) {
  const CallerPool f(16, 1, 8, DType::f32, {0, 20}, 9);
  std::vector<float> q(2 * 1 * 1 * 8, 0.5f), out(q.size(), -3.0f), lse(2, 7.0f);
  attention_paged(TensorView(q.data(), {2, 1, 1, 8}), f.view(),
                  MutableTensorView(out.data(), {2, 1, 1, 8}), {0, 1}, {}, {}, {},
                  MutableTensorView(lse.data(), {2, 1, 1}));
  for (int64_t d = 0; d < 8; ++d) EXPECT_EQ(out[d], 0.0f);
  EXPECT_EQ(lse[0], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isfinite(lse[1]));
  PagedTensors none = f.view();
  none.lengths = {};
  attention_paged(TensorView(q.data(), {0, 1, 1, 8}), none,
                  MutableTensorView(out.data(), {0, 1, 1, 8}));
}

}  // namespace
}  // namespace maskattn
