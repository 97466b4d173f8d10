// attention_paged with a draft tree over a ragged batch (docs/semantics.md §18): each sequence's
// draft is its own last T positions, so the rows of sequence b are bit for bit attention_paged()
// on sequence b alone — its rows of q, its own parents, the other components built for it alone —
// and its rows past query_lengths[b] are a fully hidden row's. Tested for ragged lengths (one equal
// to T, lengths at block edges), block sizes 16 and 64, [T] and [B, T] parents, with causal, key
// padding and a sliding window beside the tree, f32 and int8 caches, the row and the tile kernel,
// 1 and 2 threads, with modifiers. Then the rule itself, sharing no code with the per-sequence
// path: the fused and reference kernels against attention() on the decoded cache with the
// documented pairs spelled out as a dense keep mask.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "maskattn/maskattn.h"
#include "test_util.h"

namespace maskattn {
namespace {

using test::max_error;
using test::random_values;

constexpr int64_t kT = 5;  // draft tokens

// A cache holding `lengths[b]` random positions per sequence (appended in two pieces, so that a
// block edge can fall inside an append), and the decoded rows as dense [B, Hkv, max length, D].
struct Sequences {
  PagedKVCache cache;
  std::vector<int64_t> ids, lengths;
  std::vector<float> k, v;
  int64_t max_length = 0;

  Sequences(int64_t block_size, int64_t heads, int64_t dim, KVFormat format,
            std::vector<int64_t> lens, uint64_t seed)
      : cache(64, block_size, heads, dim, format), lengths(std::move(lens)) {
    for (int64_t n : lengths) max_length = std::max(max_length, n);
    const auto B = static_cast<int64_t>(lengths.size());
    k.assign(B * heads * max_length * dim, 0.0f);
    v.assign(k.size(), 0.0f);
    for (int64_t b = 0; b < B; ++b) {
      ids.push_back(cache.add_sequence());
      const int64_t first = lengths[b] / 2;
      for (auto [from, count] : {std::pair{int64_t{0}, first}, {first, lengths[b] - first}}) {
        const std::vector<float> kk = random_values(heads * count * dim, seed + 10 * b + from);
        const std::vector<float> vv = random_values(heads * count * dim, seed + 10 * b + from + 5);
        cache.append(ids.back(), TensorView(kk.data(), {heads, count, dim}),
                     TensorView(vv.data(), {heads, count, dim}));
      }
      const std::vector<float> dk = cache.decoded_keys(ids.back());
      const std::vector<float> dv = cache.decoded_values(ids.back());
      for (int64_t g = 0; g < heads; ++g) {
        std::copy_n(dk.begin() + g * lengths[b] * dim, lengths[b] * dim,
                    k.begin() + (b * heads + g) * max_length * dim);
        std::copy_n(dv.begin() + g * lengths[b] * dim, lengths[b] * dim,
                    v.begin() + (b * heads + g) * max_length * dim);
      }
    }
  }
  int64_t B() const { return static_cast<int64_t>(lengths.size()); }
};

// One tree per sequence, [B, T]: token t's parent is one of the earlier tokens or −1.
std::vector<int64_t> random_parents(int64_t batch, uint64_t seed) {
  const std::vector<float> draws = random_values(batch * kT, seed, 0.0f, 0.999f);
  std::vector<int64_t> parents;
  for (int64_t n = 0; n < batch * kT; ++n) {
    const int64_t t = n % kT;
    parents.push_back(static_cast<int64_t>(draws[n] * static_cast<float>(t + 1)) - 1);
  }
  return parents;
}

// The masks beside the tree, for the batch (only < 0) or for sequence `only` alone: the tree of
// `parents` ([T] when shared, else [B, T]), with nothing, causal, key padding or a window.
Mask case_mask(int which, const Sequences& s, const std::vector<int64_t>& parents, bool shared,
               int64_t only) {
  const bool alone = only >= 0;
  Mask tree;
  if (shared) {
    tree = Mask().tree(std::vector<int64_t>(parents.begin(), parents.begin() + kT));
  } else if (alone) {
    tree = Mask().tree(
        std::vector<int64_t>(parents.begin() + only * kT, parents.begin() + (only + 1) * kT));
  } else {
    tree = Mask().tree(Array<int64_t>({s.B(), kT}, parents));
  }
  if (which == 1) return Mask().causal() & tree;
  if (which == 3) return Mask().sliding_window(12) & tree;
  if (which != 2) return tree;
  const int64_t rows = alone ? 1 : s.B(), columns = alone ? s.lengths[only] : s.max_length;
  std::vector<int64_t> keep;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = alone ? only : r;
    for (int64_t j = 0; j < columns; ++j) keep.push_back((j + 3 * b) % 11 != 4 ? 1 : 0);
  }
  return tree & Mask().key_keep(Array<int64_t>({rows, columns}, keep));
}

struct Result {
  std::vector<float> out, lse;
};

// The batch call: q [B, Hq, Lq, D].
Result run_batch(const Sequences& s, const std::vector<float>& q, int64_t Hq, int64_t Lq,
                 const std::vector<int64_t>& qlens, const Mask& mask, const ScoreMods& mods,
                 const Options& options) {
  const int64_t B = s.B(), D = s.cache.head_dim();
  Result r{std::vector<float>(B * Hq * Lq * D, -7.0f), std::vector<float>(B * Hq * Lq, -7.0f)};
  attention_paged(TensorView(q.data(), {B, Hq, Lq, D}), s.cache, s.ids,
                  MutableTensorView(r.out.data(), {B, Hq, Lq, D}), qlens, mask, mods, options,
                  MutableTensorView(r.lse.data(), {B, Hq, Lq}));
  return r;
}

// Sequence b's rows of the batch call equal attention_paged() on it alone (its q rows copied into
// a [1, Hq, n, D] tensor of their own), and its padding rows are O = 0 and LSE `padding_lse`.
void expect_rows_of_each_alone(const Sequences& s, const std::vector<float>& q, int64_t Hq,
                               int64_t Lq, const std::vector<int64_t>& qlens, const Result& batch,
                               const std::function<Mask(int64_t)>& alone_mask,
                               const std::function<ScoreMods(int64_t)>& alone_mods,
                               const Options& options, const std::string& label) {
  const int64_t D = s.cache.head_dim();
  const std::vector<float> zeros(Lq * D, 0.0f);
  for (int64_t b = 0; b < s.B(); ++b) {
    const int64_t n = qlens[b];
    const ScoreMods mods = alone_mods(b);
    std::vector<float> qb(Hq * n * D), out(Hq * n * D, -9.0f), lse(Hq * n, -9.0f);
    for (int64_t h = 0; h < Hq; ++h) {
      std::copy_n(q.begin() + ((b * Hq + h) * Lq) * D, n * D, qb.begin() + h * n * D);
    }
    attention_paged(TensorView(qb.data(), {1, Hq, n, D}), s.cache, {s.ids[b]},
                    MutableTensorView(out.data(), {1, Hq, n, D}), {}, alone_mask(b), mods, options,
                    MutableTensorView(lse.data(), {1, Hq, n}));
    for (int64_t h = 0; h < Hq; ++h) {
      const float* row = batch.out.data() + (b * Hq + h) * Lq * D;
      const float* row_lse = batch.lse.data() + (b * Hq + h) * Lq;
      if (n > 0) {  // an empty vector's data() may be null, which memcmp must not see
        ASSERT_EQ(std::memcmp(row, out.data() + h * n * D, n * D * 4), 0)
            << label << " sequence " << b << " head " << h;
        ASSERT_EQ(std::memcmp(row_lse, lse.data() + h * n, n * 4), 0)
            << label << " lse, sequence " << b << " head " << h;
      }
      const float sink = mods.sinks.empty() || !options.count_sinks ? -INFINITY : mods.sinks[h];
      for (int64_t i = n; i < Lq; ++i) {
        ASSERT_EQ(row_lse[i], sink) << label << " padding row " << i << " of sequence " << b;
      }
      ASSERT_EQ(std::memcmp(row + n * D, zeros.data(), (Lq - n) * D * 4), 0)  // +0.0 exactly
          << label << " padding rows of sequence " << b;
    }
  }
}

struct Shape {
  int64_t block_size, Lq;
  std::vector<int64_t> lengths, qlens;
};

TEST(PagedTree, RaggedBatchesEqualEachSequenceAloneBitwise) {
  // Lengths: one equal to T, others on and just past block edges; query counts above T (prefix
  // rows before the draft), equal to it, below it (the draft's last tokens) and 0. Lq = 8 runs the
  // row kernel, Lq = 70 the tile kernel.
  const std::vector<Shape> shapes = {
      {16, 8, {37, kT, 64, 16, 129}, {8, kT, 6, 3, 0}},
      {64, 70, {70, kT, 128, 64, 200}, {70, kT, 66, 6, 1}},
  };
  const int64_t Hq = 4, Hkv = 2, D = 32;
  for (const Shape& shape : shapes) {
    for (KVFormat format : {KVFormat::f32, KVFormat::int8}) {
      const Sequences s(shape.block_size, Hkv, D, format, shape.lengths, 7 + shape.Lq);
      const std::vector<float> q = random_values(s.B() * Hq * shape.Lq * D, 3 + shape.Lq);
      const std::vector<int64_t> parents = random_parents(s.B(), 17);
      for (bool shared : {true, false}) {
        for (int which = 0; which < 4; ++which) {
          for (int threads : {1, 2}) {
            Options options;
            options.threads = threads;
            const std::string label =
                std::string(kv_format_name(format)) + " block " + std::to_string(shape.block_size) +
                " Lq " + std::to_string(shape.Lq) + (shared ? " [T]" : " [B,T]") + " mask " +
                std::to_string(which) + " threads " + std::to_string(threads);
            const Result batch = run_batch(s, q, Hq, shape.Lq, shape.qlens,
                                           case_mask(which, s, parents, shared, -1), {}, options);
            expect_rows_of_each_alone(
                s, q, Hq, shape.Lq, shape.qlens, batch,
                [&](int64_t b) { return case_mask(which, s, parents, shared, b); },
                [](int64_t) { return ScoreMods(); }, options, label);
          }
        }
      }
    }
  }
}

// Modifiers (restricted to each sequence as the mask is) and the padding rows' LSE: the sink, as
// a batched call without a tree writes it, or −inf when the sinks are not counted.
TEST(PagedTree, ModifiersAndPaddingRowsAsTheBatchedCallWritesThem) {
  const int64_t Hq = 2, D = 32, Lq = 7;
  const Sequences s(16, 1, D, KVFormat::f32, {40, 9, 23}, 5);
  const std::vector<int64_t> qlens = {7, 5, 2};
  const std::vector<float> q = random_values(s.B() * Hq * Lq * D, 8);
  const std::vector<int64_t> parents = random_parents(s.B(), 4);
  for (bool count_sinks : {true, false}) {
    ScoreMods mods;
    mods.softcap = 10.0;
    mods.alibi_slopes = {0.1f, 0.02f};
    mods.sinks = {0.5f, -1.5f};
    std::vector<float> bias;
    for (int64_t n = 0; n < s.B() * Lq * s.max_length; ++n) bias.push_back(0.01f * (n % 17));
    mods.bias = Array<float>({s.B(), 1, Lq, s.max_length}, bias);
    Options options;
    options.count_sinks = count_sinks;
    const Result batch =
        run_batch(s, q, Hq, Lq, qlens, case_mask(0, s, parents, false, -1), mods, options);
    // Each sequence alone, with its own rows of the bias.
    expect_rows_of_each_alone(
        s, q, Hq, Lq, qlens, batch, [&](int64_t b) { return case_mask(0, s, parents, false, b); },
        [&](int64_t b) {
          ScoreMods own = mods;
          std::vector<float> rows;
          for (int64_t i = 0; i < qlens[b]; ++i) {
            const auto first = bias.begin() + (b * Lq + i) * s.max_length;
            rows.insert(rows.end(), first, first + s.lengths[b]);
          }
          own.bias = Array<float>({1, 1, qlens[b], s.lengths[b]}, rows);
          return own;
        },
        options, "count_sinks " + std::to_string(count_sinks));
    // The padding rows: those of the same batch without the tree (one batched call).
    const Result plain = run_batch(s, q, Hq, Lq, qlens, Mask(), mods, options);
    for (int64_t b = 0; b < s.B(); ++b) {
      for (int64_t h = 0; h < Hq; ++h) {
        for (int64_t i = qlens[b]; i < Lq; ++i) {
          const int64_t row = (b * Hq + h) * Lq + i;
          EXPECT_EQ(std::memcmp(&batch.lse[row], &plain.lse[row], 4), 0)
              << "count_sinks " << count_sinks << " sequence " << b << " row " << i;
          EXPECT_EQ(std::memcmp(&batch.out[row * D], &plain.out[row * D], D * 4), 0);
        }
      }
    }
  }
}

// Whether draft token s of `parents` (one row) is t or descends from t.
bool descends(const std::vector<int64_t>& parents, int64_t s, int64_t t) {
  for (; s >= 0; s = parents[s]) {
    if (s == t) return true;
  }
  return false;
}

// The documented rule (docs/semantics.md §3, §18) as a dense keep [B, 1, Lq, max length]: query
// row i < n of sequence b sits at position L − n + i; the draft is positions [L − T, L) and the
// query rows [n − T, n); a prefix key is seen causally, a draft key only by a draft query that is
// it or descends from it; a sliding window of W keys on top.
std::vector<uint8_t> documented_pairs(const Sequences& s, int64_t Lq,
                                      const std::vector<int64_t>& qlens,
                                      const std::vector<int64_t>& parents, int64_t window) {
  const int64_t L = s.max_length;
  std::vector<uint8_t> keep(s.B() * Lq * L, 0);
  for (int64_t b = 0; b < s.B(); ++b) {
    const std::vector<int64_t> own(parents.begin() + b * kT, parents.begin() + (b + 1) * kT);
    const int64_t n = qlens[b], length = s.lengths[b];
    for (int64_t i = 0; i < n; ++i) {
      const int64_t position = length - n + i, draft_query = i - (n - kT);
      for (int64_t j = 0; j < length; ++j) {
        const int64_t draft_key = j - (length - kT);
        bool allowed = draft_key < 0 ? j <= position
                                     : draft_query >= 0 && descends(own, draft_query, draft_key);
        allowed = allowed && j >= position - (window - 1);
        keep[(b * Lq + i) * L + j] = allowed ? 1 : 0;
      }
    }
  }
  return keep;
}

TEST(PagedTree, TheDocumentedPairsOnTheReferenceAndTheFusedKernel) {
  const int64_t Hq = 4, Hkv = 2, D = 32, Lq = 12;
  const std::vector<int64_t> qlens = {12, kT, 3, 9, 0};
  for (int64_t block_size : {16, 64}) {
    const Sequences s(block_size, Hkv, D, KVFormat::int8, {80, kT, 64, 17, 30}, 9 + block_size);
    const std::vector<float> q = random_values(s.B() * Hq * Lq * D, 12);
    const std::vector<int64_t> parents = random_parents(s.B(), 23);
    const Mask mask = case_mask(3, s, parents, false, -1);  // sliding window 12 & tree
    Options options;
    options.kernel = Kernel::reference;
    const Result reference = run_batch(s, q, Hq, Lq, qlens, mask, {}, options);
    options.kernel = Kernel::automatic;
    const Result fused = run_batch(s, q, Hq, Lq, qlens, mask, {}, options);
    EXPECT_LE(max_error(fused.out, reference.out), 2e-6f) << "block " << block_size;
    // attention() on the decoded cache with the pairs spelled out, on the reference kernel.
    const int64_t L = s.max_length;
    std::vector<float> out(s.B() * Hq * Lq * D, -7.0f), lse(s.B() * Hq * Lq, -7.0f);
    options.kernel = Kernel::reference;
    attention(
        TensorView(q.data(), {s.B(), Hq, Lq, D}), TensorView(s.k.data(), {s.B(), Hkv, L, D}),
        TensorView(s.v.data(), {s.B(), Hkv, L, D}),
        MutableTensorView(out.data(), {s.B(), Hq, Lq, D}),
        Mask().keep(Array<uint8_t>({s.B(), 1, Lq, L}, documented_pairs(s, Lq, qlens, parents, 12))),
        {}, options, MutableTensorView(lse.data(), {s.B(), Hq, Lq}));
    EXPECT_LE(max_error(reference.out, out), 1e-6f) << "block " << block_size;
    EXPECT_LE(max_error(reference.lse, lse), 1e-6f) << "block " << block_size;
  }
}

}  // namespace
}  // namespace maskattn
