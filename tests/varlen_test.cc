// attention_varlen and its backward (maskattn/varlen.h; docs/semantics.md §19).
//
// The contract: the rows of sequence i are bit for bit attention() (attention_backward()) on
// sequence i alone, with the mask restricted to batch entry i. The masks here are built twice
// from the same formulas: once for the padded batch the varlen call takes, once for the sequence
// alone (b = i, its own lengths), independently of the library's restriction (restrict.cc). Then
// the semantics is checked against something that shares no code with the varlen layer: the f64
// reference on the padded batch with query and key lengths, on the real rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "maskattn/varlen.h"
#include "test_util.h"

namespace maskattn {
namespace {

using test::DTypeBuffer;
using test::random_values;

// B packed sequences of lengths lq[i], lk[i]: q [total_q, Hq, D], k and v [total_k, Hkv, D|Dv].
struct Packed {
  int64_t Hq, Hkv, D, Dv;
  std::vector<int64_t> lq, lk;
  Varlen varlen;
  std::vector<float> q, k, v;

  Packed(std::vector<int64_t> q_lengths, std::vector<int64_t> k_lengths, int64_t hq, int64_t hkv,
         int64_t d, int64_t dv, uint64_t seed)
      : Hq(hq), Hkv(hkv), D(d), Dv(dv), lq(std::move(q_lengths)), lk(std::move(k_lengths)) {
    varlen.cu_seqlens_q = {0};
    varlen.cu_seqlens_k = {0};
    for (size_t i = 0; i < lq.size(); ++i) {
      varlen.cu_seqlens_q.push_back(varlen.cu_seqlens_q.back() + lq[i]);
      varlen.cu_seqlens_k.push_back(varlen.cu_seqlens_k.back() + lk[i]);
      varlen.max_seqlen_q = std::max(varlen.max_seqlen_q, lq[i]);
      varlen.max_seqlen_k = std::max(varlen.max_seqlen_k, lk[i]);
    }
    q = random_values(total_q() * Hq * D, seed, -2.0f, 2.0f);
    k = random_values(total_k() * Hkv * D, seed + 1, -2.0f, 2.0f);
    v = random_values(total_k() * Hkv * Dv, seed + 2);
  }
  int64_t B() const { return static_cast<int64_t>(lq.size()); }
  int64_t total_q() const { return varlen.cu_seqlens_q.back(); }
  int64_t total_k() const { return varlen.cu_seqlens_k.back(); }
};

// A random mix of lengths, empty sequences included.
Packed random_mix(uint64_t seed, bool self_attention, int64_t hq = 4, int64_t hkv = 2) {
  static const int64_t kLengths[] = {0, 1, 3, 9, 17, 40, 64, 65, 100, 130};
  const std::vector<float> draws = random_values(16, seed * 31, 0.0f, 9.999f);
  const int64_t batch = 1 + static_cast<int64_t>(draws[0]) % 5;
  std::vector<int64_t> lq, lk;
  for (int64_t i = 0; i < batch; ++i) {
    lq.push_back(kLengths[static_cast<int>(draws[1 + 2 * i])]);
    lk.push_back(self_attention ? lq.back() : kLengths[static_cast<int>(draws[2 + 2 * i])]);
  }
  return Packed(lq, lk, hq, hkv, 16, 8, seed);
}

// Unsigned arithmetic: the products wrap by definition (int64_t would overflow, UB).
uint32_t hash(int64_t a, int64_t b, int64_t c = 0) {
  const uint64_t mixed = (static_cast<uint64_t>(a) * 73856093u) ^
                         (static_cast<uint64_t>(b) * 19349663u) ^
                         (static_cast<uint64_t>(c) * 83492791u);
  return static_cast<uint32_t>(mixed * 2654435761u >> 7);
}

// The sweep's masks, for the padded batch (only < 0) or for sequence `only` alone. `lengths`
// says which masks hold lengths or starts (the padded-batch comparison adds its own).
struct MaskCase {
  std::string name;
  Mask mask;
  bool lengths = false;
};

std::vector<MaskCase> varlen_masks(const Packed& p, int64_t only = -1) {
  const bool alone = only >= 0;
  const int64_t batch = alone ? 1 : p.B();
  const int64_t rows_q = alone ? p.lq[only] : p.varlen.max_seqlen_q;
  const int64_t rows_k = alone ? p.lk[only] : p.varlen.max_seqlen_k;
  const auto entry = [&](int64_t b) { return alone ? only : b; };  // the sequence of row b
  std::vector<int64_t> seg_q, seg_k, span_q, span_k, ids, global_q, global_k, docs, key_len,
      query_len, key_start;
  std::vector<uint8_t> per_batch;
  const int64_t rows = std::max(rows_q, rows_k);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t s = entry(b), lq = p.lq[s], lk = p.lk[s];
    for (int64_t i = 0; i < rows_q; ++i) {
      seg_q.push_back((i + lk - lq + s * 7) / 23);
      span_q.push_back((i + lk - lq) % 50 < 20 ? 1 : 0);
      global_q.push_back((i + lk - lq + s) % 41 == 3);
    }
    for (int64_t j = 0; j < rows_k; ++j) {
      seg_k.push_back((j + s * 7) / 23);
      span_k.push_back(j % 50 < 20 ? 1 : 0);
      ids.push_back(j % 13 == 12 ? 0 : 1);
      global_k.push_back((j + s) % 41 == 3);
    }
    for (int64_t t = 0; t < rows; ++t) docs.push_back((t + s * 7) / 29);
    for (int64_t i = 0; i < rows_q; ++i) {
      for (int64_t j = 0; j < rows_k; ++j) per_batch.push_back(hash(s, i, j) % 4 != 0);
    }
    key_len.push_back(lk * 2 / 3);
    query_len.push_back(std::max<int64_t>(lq - 5, 0));
    key_start.push_back(lk / 4);
  }
  std::vector<uint8_t> dense(rows_q * rows_k);
  for (int64_t i = 0; i < rows_q; ++i) {
    for (int64_t j = 0; j < rows_k; ++j) dense[i * rows_k + j] = hash(i, j) % 5 != 0;
  }
  const int64_t n_q16 = (rows_q + 15) / 16, n_k48 = (rows_k + 47) / 48;
  std::vector<uint8_t> layout(p.Hq * n_q16 * n_k48);
  for (int64_t h = 0; h < p.Hq; ++h) {
    for (int64_t r = 0; r < n_q16; ++r) {
      for (int64_t c = 0; c < n_k48; ++c)
        layout[(h * n_q16 + r) * n_k48 + c] = hash(h, r, c) % 3 != 0;
    }
  }
  std::vector<float> additive(rows_k);
  for (int64_t j = 0; j < rows_k; ++j) additive[j] = j % 9 == 0 ? -INFINITY : 0.1f * (j % 4);
  const int64_t shift = alone ? only : 0;
  const Array<int64_t> gq({batch, rows_q}, global_q), gk({batch, rows_k}, global_k);
  const Array<int64_t> sq({batch, rows_q}, seg_q), sk({batch, rows_k}, seg_k);
  return {
      {"none", Mask()},
      {"causal", Mask().causal()},
      {"causal top-left", Mask().causal(Alignment::top_left)},
      {"sliding window 20", Mask().sliding_window(20)},
      {"window(30,10) & chunk(24)", Mask().window(30, 10).chunk(24)},
      {"padding", Mask().causal().key_lengths(key_len).query_lengths(query_len), true},
      {"left padding", Mask().causal().key_starts(key_start), true},
      {"token ids", Mask().key_pad_id(Array<int64_t>({batch, rows_k}, ids), 0)},
      {"segments", Mask().causal().segments(sq, sk)},
      {"spans & prefix",
       Mask()
           .causal()
           .spans(Array<int64_t>({batch, rows_q}, span_q), Array<int64_t>({batch, rows_k}, span_k))
           .prefix_lm(9)},
      {"dense keep", Mask().keep(Array<uint8_t>({rows_q, rows_k}, dense))},
      {"dense blocked per batch",
       Mask().blocked(Array<uint8_t>({batch, 1, rows_q, rows_k}, per_batch))},
      {"additive", Mask().additive(Array<float>({rows_k}, additive))},
      {"per head", Mask().causal(HeadSet{0}).sliding_window(12, HeadSet::range(1, p.Hq))},
      {"predicate", Mask().predicate([shift](int64_t b, int64_t h, int64_t i, int64_t j) {
         return (i + 2 * j + h + 3 * (b + shift)) % 7 != 3;
       })},
      {"program documents", Mask().program("(doc[b, q] == doc[b, kv]) & (kv <= q + 3)",
                                           {ProgramTable::own("doc", docs, {batch, rows})})},
      {"program per head & padding",
       Mask().key_lengths(key_len).program("((h % 2 == 0) & (kv <= q + 5)) | ((h % 2 == 1) & "
                                           "((q + 2 * kv + h) % 7 != 3))"),
       true},
      {"global & window(6,2)", Mask().window(6, 2).global_tokens(gq, gk)},
      {"causal & global@0 & segments",
       Mask().causal().global_tokens(gq, gk, HeadSet{0}).segments(sq, sk)},
      {"block-sparse [Hq] 16x48",
       Mask().block_sparse(Array<uint8_t>({p.Hq, n_q16, n_k48}, layout), 16, 48)},
  };
}

// Score modifiers with every kind of data: per head, a bias with a batch axis, a score program
// that reads b.
ScoreMods varlen_mods(const Packed& p, int64_t only = -1) {
  const bool alone = only >= 0;
  const int64_t batch = alone ? 1 : p.B();
  const int64_t rows_q = alone ? p.lq[only] : p.varlen.max_seqlen_q;
  const int64_t rows_k = alone ? p.lk[only] : p.varlen.max_seqlen_k;
  ScoreMods mods;
  mods.softcap = 20.0;
  for (int64_t h = 0; h < p.Hq; ++h) {
    mods.alibi_slopes.push_back(0.05f * static_cast<float>(h + 1));
    mods.sinks.push_back(0.3f * static_cast<float>(h) - 0.5f);
  }
  std::vector<float> bias;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < rows_q; ++i) {
      for (int64_t j = 0; j < rows_k; ++j) {
        bias.push_back(static_cast<float>(hash(alone ? only : b, i, j) % 100) * 0.01f - 0.5f);
      }
    }
  }
  mods.bias = Array<float>({batch, 1, rows_q, rows_k}, bias);
  std::vector<float> scale;
  for (int64_t b = 0; b < batch; ++b)
    scale.push_back(1.0f + 0.25f * static_cast<float>(alone ? only : b));
  mods.program = Program::score("s * t[b]", {ProgramTable::own("t", scale, {batch})});
  return mods;
}

// The packed inputs in one dtype, and the outputs the calls write.
struct Buffers {
  DTypeBuffer q, k, v;
  Buffers(const Packed& p, DType dtype) : q(p.q, dtype), k(p.k, dtype), v(p.v, dtype) {}
};

TensorView packed(const DTypeBuffer& b, int64_t total, int64_t heads, int64_t dim) {
  return b.view({total, heads, dim});
}

// Rows [first, first + count) of a packed [total, H, D] buffer as [1, H, count, D]: what a user
// passes to attention() for one sequence.
TensorView rows_of(const void* data, DType dtype, int64_t first, int64_t count, int64_t heads,
                   int64_t dim) {
  const char* base = static_cast<const char*>(data) + first * heads * dim * dtype_size(dtype);
  return TensorView(base, dtype, {1, heads, count, dim},
                    {count * heads * dim, dim, heads * dim, 1});
}
MutableTensorView mutable_rows_of(void* data, DType dtype, int64_t first, int64_t count,
                                  int64_t heads, int64_t dim) {
  const TensorView view = rows_of(data, dtype, first, count, heads, dim);
  return MutableTensorView(data == nullptr ? nullptr : const_cast<void*>(view.data()), dtype,
                           view.sizes(), view.strides());
}

struct Forward {
  std::vector<uint32_t> out;  // room for any dtype
  std::vector<float> lse;
};

Forward run_varlen(const Packed& p, const Buffers& in, DType dtype, const Mask& mask,
                   const ScoreMods& mods, Options options) {
  Forward f{std::vector<uint32_t>(p.total_q() * p.Hq * p.Dv, 0x7F7F7F7Fu),
            std::vector<float>(p.Hq * p.total_q(), -7.0f)};
  attention_varlen(packed(in.q, p.total_q(), p.Hq, p.D), packed(in.k, p.total_k(), p.Hkv, p.D),
                   packed(in.v, p.total_k(), p.Hkv, p.Dv),
                   MutableTensorView(f.out.data(), dtype, {p.total_q(), p.Hq, p.Dv}), p.varlen,
                   mask, mods, options, MutableTensorView(f.lse.data(), {p.Hq, p.total_q()}));
  return f;
}

// attention() on each sequence alone, with the masks and modifiers built for it.
Forward run_each_alone(const Packed& p, const Buffers& in, DType dtype, size_t mask_index,
                       bool with_mods, Options options) {
  Forward f{std::vector<uint32_t>(p.total_q() * p.Hq * p.Dv, 0x7F7F7F7Fu),
            std::vector<float>(p.Hq * p.total_q(), -7.0f)};
  for (int64_t i = 0; i < p.B(); ++i) {
    const int64_t q0 = p.varlen.cu_seqlens_q[i], k0 = p.varlen.cu_seqlens_k[i];
    if (p.lq[i] == 0) continue;
    Options own = options;
    own.dropout.batch_offset = static_cast<uint64_t>(i);
    attention(rows_of(in.q.words.data(), dtype, q0, p.lq[i], p.Hq, p.D),
              rows_of(in.k.words.data(), dtype, k0, p.lk[i], p.Hkv, p.D),
              rows_of(in.v.words.data(), dtype, k0, p.lk[i], p.Hkv, p.Dv),
              mutable_rows_of(f.out.data(), dtype, q0, p.lq[i], p.Hq, p.Dv),
              varlen_masks(p, i)[mask_index].mask, with_mods ? varlen_mods(p, i) : ScoreMods{}, own,
              MutableTensorView(f.lse.data() + q0, {1, p.Hq, p.lq[i]}, {0, p.total_q(), 1}));
  }
  return f;
}

// `count` elements of `dtype` stored in `words`, read as f32.
std::vector<float> as_floats(const std::vector<uint32_t>& words, DType dtype, int64_t count) {
  DTypeBuffer buffer(std::vector<float>(count, 0.0f), dtype);
  std::memcpy(buffer.words.data(), words.data(), count * dtype_size(dtype));
  return buffer.floats(count);
}

bool same_bits(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b, size_t bytes) {
  return std::memcmp(a.data(), b.data(), bytes) == 0;
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(VarlenForward, BitwiseEqualsEachSequenceAloneEveryMaskDtypeAndThreadCount) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    const Packed p = random_mix(seed, seed % 2 == 1);
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      const Buffers in(p, dtype);
      const size_t bytes = p.total_q() * p.Hq * p.Dv * dtype_size(dtype);
      const std::vector<MaskCase> masks = varlen_masks(p);
      for (size_t m = 0; m < masks.size(); ++m) {
        for (int threads : {1, 2}) {
          Options options;
          options.threads = threads;
          const Forward varlen = run_varlen(p, in, dtype, masks[m].mask, {}, options);
          const Forward alone = run_each_alone(p, in, dtype, m, false, options);
          EXPECT_TRUE(same_bits(varlen.out, alone.out, bytes))
              << masks[m].name << " " << dtype_name(dtype) << " seed " << seed << " threads "
              << threads;
          EXPECT_TRUE(same_bits(varlen.lse, alone.lse)) << masks[m].name << " lse";
        }
      }
    }
  }
}

TEST(VarlenForward, ModifiersAndDropoutEqualEachSequenceAlone) {
  for (uint64_t seed = 11; seed <= 13; ++seed) {
    const Packed p = random_mix(seed, seed != 12);
    for (DType dtype : {DType::f32, DType::bf16}) {
      const Buffers in(p, dtype);
      const size_t bytes = p.total_q() * p.Hq * p.Dv * dtype_size(dtype);
      Options options;
      options.dropout = Dropout{0.2, 99, 3};
      for (size_t m : {size_t{1}, size_t{8}}) {  // causal, segments
        const Forward varlen =
            run_varlen(p, in, dtype, varlen_masks(p)[m].mask, varlen_mods(p), options);
        const Forward alone = run_each_alone(p, in, dtype, m, true, options);
        EXPECT_TRUE(same_bits(varlen.out, alone.out, bytes)) << dtype_name(dtype) << " " << m;
        EXPECT_TRUE(same_bits(varlen.lse, alone.lse));
      }
    }
  }
}

// A draft tree restricted to sequence i is that sequence's own draft, its last T keys and queries
// (its row of [B, T] parents, or the one [T] tree): the varlen rows equal attention() on each
// sequence alone with Mask::tree of its parents, with causal and a window beside it.
TEST(VarlenForward, DraftTreesAreEachSequencesOwn) {
  const Packed p({3, 6, 1, 9}, {10, 6, 40, 12}, 4, 2, 16, 8, 41);
  const std::vector<int64_t> one = {-1, 0, 0, 1, 2, -1};
  const std::vector<int64_t> rows = {-1, 0, 1, 2, 3, 4, -1, -1, 0, 1, 0, 3,
                                     -1, 0, 0, 0, 0, 0, -1, 0,  1, 1, 2, -1};
  for (bool per_sequence : {false, true}) {
    for (bool window : {false, true}) {
      const Mask tree = per_sequence ? Mask().tree(Array<int64_t>({4, 6}, rows)) : Mask().tree(one);
      const Mask extra = window ? Mask().causal().sliding_window(5) : Mask();
      for (int threads : {1, 2}) {
        Options options;
        options.threads = threads;
        const Buffers in(p, DType::f32);
        const Forward varlen = run_varlen(p, in, DType::f32, extra & tree, {}, options);
        for (int64_t i = 0; i < p.B(); ++i) {
          const std::vector<int64_t> own =
              per_sequence ? std::vector<int64_t>(rows.begin() + 6 * i, rows.begin() + 6 * i + 6)
                           : one;
          const int64_t q0 = p.varlen.cu_seqlens_q[i], k0 = p.varlen.cu_seqlens_k[i];
          std::vector<float> out(p.lq[i] * p.Hq * p.Dv, -7.0f), lse(p.Hq * p.lq[i], -7.0f);
          attention(rows_of(p.q.data(), DType::f32, q0, p.lq[i], p.Hq, p.D),
                    rows_of(p.k.data(), DType::f32, k0, p.lk[i], p.Hkv, p.D),
                    rows_of(p.v.data(), DType::f32, k0, p.lk[i], p.Hkv, p.Dv),
                    mutable_rows_of(out.data(), DType::f32, 0, p.lq[i], p.Hq, p.Dv),
                    extra & Mask().tree(own), {}, options,
                    MutableTensorView(lse.data(), {1, p.Hq, p.lq[i]}));
          EXPECT_EQ(std::memcmp(out.data(), varlen.out.data() + q0 * p.Hq * p.Dv, out.size() * 4),
                    0)
              << "sequence " << i << " per_sequence " << per_sequence << " window " << window;
          for (int64_t h = 0; h < p.Hq; ++h) {
            EXPECT_EQ(std::memcmp(lse.data() + h * p.lq[i],
                                  varlen.lse.data() + h * p.total_q() + q0, p.lq[i] * 4),
                      0)
                << "sequence " << i << " head " << h;
          }
        }
      }
    }
  }
}

// The padded batch [B, Hq, max_q, max_k] with query and key lengths, through the f64 reference:
// its real rows are the varlen call's (bottom-right aligned per sequence, b = i everywhere,
// dropout included), up to the reference's own rounding.
TEST(VarlenForward, EqualsThePaddedBatchOnTheReference) {
  for (uint64_t seed = 21; seed <= 24; ++seed) {
    const Packed p = random_mix(seed, seed % 2 == 0);
    const int64_t B = p.B(), Lq = p.varlen.max_seqlen_q, Lk = p.varlen.max_seqlen_k;
    std::vector<float> q(B * Lq * p.Hq * p.D, 0.0f), k(B * Lk * p.Hkv * p.D, 0.0f),
        v(B * Lk * p.Hkv * p.Dv, 0.0f);
    for (int64_t i = 0; i < B; ++i) {
      std::copy_n(p.q.begin() + p.varlen.cu_seqlens_q[i] * p.Hq * p.D, p.lq[i] * p.Hq * p.D,
                  q.begin() + i * Lq * p.Hq * p.D);
      std::copy_n(p.k.begin() + p.varlen.cu_seqlens_k[i] * p.Hkv * p.D, p.lk[i] * p.Hkv * p.D,
                  k.begin() + i * Lk * p.Hkv * p.D);
      std::copy_n(p.v.begin() + p.varlen.cu_seqlens_k[i] * p.Hkv * p.Dv, p.lk[i] * p.Hkv * p.Dv,
                  v.begin() + i * Lk * p.Hkv * p.Dv);
    }
    const Buffers in(p, DType::f32);
    Options options;
    options.kernel = Kernel::reference;
    options.dropout = Dropout{seed == 24 ? 0.3 : 0.0, 5, 0};
    for (const MaskCase& c : varlen_masks(p)) {
      if (c.lengths) continue;  // the padded call gives its own
      const Forward varlen = run_varlen(p, in, DType::f32, c.mask, varlen_mods(p), options);
      std::vector<float> out(B * Lq * p.Hq * p.Dv, -7.0f), lse(B * p.Hq * Lq, -7.0f);
      attention(TensorView::from_blhd(q.data(), B, Lq, p.Hq, p.D),
                TensorView::from_blhd(k.data(), B, Lk, p.Hkv, p.D),
                TensorView::from_blhd(v.data(), B, Lk, p.Hkv, p.Dv),
                MutableTensorView::from_blhd(out.data(), B, Lq, p.Hq, p.Dv),
                Mask(c.mask).query_lengths(p.lq).key_lengths(p.lk), varlen_mods(p), options,
                MutableTensorView(lse.data(), {B, p.Hq, Lq}));
      const auto* packed_out = reinterpret_cast<const float*>(varlen.out.data());
      float worst = 0.0f;
      for (int64_t i = 0; i < B; ++i) {
        for (int64_t t = 0; t < p.lq[i]; ++t) {
          const int64_t row = p.varlen.cu_seqlens_q[i] + t;
          for (int64_t e = 0; e < p.Hq * p.Dv; ++e) {
            worst = std::max(worst, std::abs(packed_out[row * p.Hq * p.Dv + e] -
                                             out[(i * Lq + t) * p.Hq * p.Dv + e]));
          }
          for (int64_t h = 0; h < p.Hq; ++h) {
            const float a = varlen.lse[h * p.total_q() + row], b = lse[(i * p.Hq + h) * Lq + t];
            EXPECT_TRUE(a == b || std::abs(a - b) <= 1e-6f * std::abs(b)) << c.name << " lse";
          }
        }
      }
      EXPECT_LE(worst, 1e-6f) << c.name << " seed " << seed;
    }
  }
}

// The fused kernel against the f64 reference, per dtype.
TEST(VarlenForward, FusedWithinTheDtypeToleranceOfTheReference) {
  for (uint64_t seed = 31; seed <= 33; ++seed) {
    const Packed p = random_mix(seed, true);
    for (const auto& [dtype, tolerance] :
         {std::pair{DType::f32, 2e-5f}, {DType::f16, 4e-3f}, {DType::bf16, 3e-2f}}) {
      const Buffers in(p, dtype);
      for (const MaskCase& c : varlen_masks(p)) {
        Options reference;
        reference.kernel = Kernel::reference;
        const Forward fused = run_varlen(p, in, dtype, c.mask, varlen_mods(p), {});
        const Forward exact = run_varlen(p, in, dtype, c.mask, varlen_mods(p), reference);
        const std::vector<float> got = as_floats(fused.out, dtype, p.total_q() * p.Hq * p.Dv);
        const std::vector<float> want = as_floats(exact.out, dtype, p.total_q() * p.Hq * p.Dv);
        const float worst = test::max_error(got, want);
        EXPECT_LE(worst, tolerance) << c.name << " " << dtype_name(dtype);
      }
    }
  }
}

// ---- backward ----------------------------------------------------------------------------------

struct Backward {
  std::vector<uint32_t> dq, dk, dv;  // in the inputs' dtype
  std::vector<float> dsinks, dbias, dtable;
};

Backward empty_backward(const Packed& p) {
  return {std::vector<uint32_t>(p.total_q() * p.Hq * p.D, 0x7F7F7F7Fu),
          std::vector<uint32_t>(p.total_k() * p.Hkv * p.D, 0x7F7F7F7Fu),
          std::vector<uint32_t>(p.total_k() * p.Hkv * p.Dv, 0x7F7F7F7Fu),
          {},
          {},
          {}};
}

// The forward, then the backward of L = Σ dout∘O, through the varlen calls.
Backward run_varlen_backward(const Packed& p, const Buffers& in, const DTypeBuffer& dout,
                             DType dtype, const Mask& mask, const ScoreMods& mods,
                             const Options& options, const Forward& f) {
  Backward g = empty_backward(p);
  Gradients grads(MutableTensorView(g.dq.data(), dtype, {p.total_q(), p.Hq, p.D}),
                  MutableTensorView(g.dk.data(), dtype, {p.total_k(), p.Hkv, p.D}),
                  MutableTensorView(g.dv.data(), dtype, {p.total_k(), p.Hkv, p.Dv}));
  if (!mods.sinks.empty()) {
    g.dsinks.assign(p.Hq, -7.0f);
    grads.dsinks = MutableTensorView(g.dsinks.data(), {p.Hq});
    g.dbias.assign(mods.bias->numel(), -7.0f);
    grads.dbias = MutableTensorView(g.dbias.data(), mods.bias->shape());
    g.dtable.assign(p.B(), -7.0f);
    grads.dtables = {MutableTensorView(g.dtable.data(), {p.B()})};
  }
  attention_varlen_backward(
      packed(in.q, p.total_q(), p.Hq, p.D), packed(in.k, p.total_k(), p.Hkv, p.D),
      packed(in.v, p.total_k(), p.Hkv, p.Dv),
      TensorView(f.out.data(), dtype, {p.total_q(), p.Hq, p.Dv}),
      TensorView(f.lse.data(), {p.Hq, p.total_q()}), dout.view({p.total_q(), p.Hq, p.Dv}), p.varlen,
      grads, mask, mods, options);
  return g;
}

// attention_backward() on each sequence alone, from the same out and lse.
Backward run_backward_alone(const Packed& p, const Buffers& in, const DTypeBuffer& dout,
                            DType dtype, size_t mask_index, const Options& options,
                            const Forward& f) {
  Backward g = empty_backward(p);
  for (int64_t i = 0; i < p.B(); ++i) {
    const int64_t q0 = p.varlen.cu_seqlens_q[i], k0 = p.varlen.cu_seqlens_k[i];
    const int64_t lq = p.lq[i], lk = p.lk[i];
    Options own = options;
    own.dropout.batch_offset = static_cast<uint64_t>(i);
    attention_backward(rows_of(in.q.words.data(), dtype, q0, lq, p.Hq, p.D),
                       rows_of(in.k.words.data(), dtype, k0, lk, p.Hkv, p.D),
                       rows_of(in.v.words.data(), dtype, k0, lk, p.Hkv, p.Dv),
                       rows_of(f.out.data(), dtype, q0, lq, p.Hq, p.Dv),
                       TensorView(f.lse.data() + q0, {1, p.Hq, lq}, {0, p.total_q(), 1}),
                       rows_of(dout.words.data(), dtype, q0, lq, p.Hq, p.Dv),
                       Gradients(mutable_rows_of(g.dq.data(), dtype, q0, lq, p.Hq, p.D),
                                 mutable_rows_of(g.dk.data(), dtype, k0, lk, p.Hkv, p.D),
                                 mutable_rows_of(g.dv.data(), dtype, k0, lk, p.Hkv, p.Dv)),
                       varlen_masks(p, i)[mask_index].mask, {}, own);
  }
  return g;
}

TEST(VarlenBackward, BitwiseEqualsEachSequenceAloneEveryMaskDtypeAndThreadCount) {
  for (uint64_t seed = 41; seed <= 44; ++seed) {
    const Packed p = random_mix(seed, seed % 2 == 0);
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      const Buffers in(p, dtype);
      const DTypeBuffer dout(random_values(p.total_q() * p.Hq * p.Dv, seed + 9), dtype);
      const std::vector<MaskCase> masks = varlen_masks(p);
      for (size_t m = 0; m < masks.size(); ++m) {
        for (int threads : {1, 2}) {
          Options options;
          options.threads = threads;
          options.dropout = Dropout{m % 3 == 0 ? 0.25 : 0.0, 7, 1};
          const Forward f = run_varlen(p, in, dtype, masks[m].mask, {}, options);
          const Backward varlen =
              run_varlen_backward(p, in, dout, dtype, masks[m].mask, {}, options, f);
          const Backward alone = run_backward_alone(p, in, dout, dtype, m, options, f);
          const std::string what = masks[m].name + " " + dtype_name(dtype) + " seed " +
                                   std::to_string(seed) + " threads " + std::to_string(threads);
          const size_t size = dtype_size(dtype);
          EXPECT_TRUE(same_bits(varlen.dq, alone.dq, p.total_q() * p.Hq * p.D * size)) << what;
          EXPECT_TRUE(same_bits(varlen.dk, alone.dk, p.total_k() * p.Hkv * p.D * size)) << what;
          EXPECT_TRUE(same_bits(varlen.dv, alone.dv, p.total_k() * p.Hkv * p.Dv * size)) << what;
        }
      }
    }
  }
}

// The reference backward of the varlen call against the reference backward of the padded batch
// (an independent path): dq, dk, dv on the real rows, and the shared gradients (sinks, the bias,
// the score program's table), which the varlen call sums over its sequences.
TEST(VarlenBackward, EqualsThePaddedBatchOnTheReference) {
  for (uint64_t seed = 51; seed <= 53; ++seed) {
    const Packed p = random_mix(seed, seed != 52);
    const int64_t B = p.B(), Lq = p.varlen.max_seqlen_q, Lk = p.varlen.max_seqlen_k;
    const Buffers in(p, DType::f32);
    const DTypeBuffer dout(random_values(p.total_q() * p.Hq * p.Dv, seed + 9), DType::f32);
    Options options;
    options.kernel = Kernel::reference;
    const Mask mask = varlen_masks(p)[8].mask;  // causal & segments
    const ScoreMods mods = varlen_mods(p);
    const Forward f = run_varlen(p, in, DType::f32, mask, mods, options);
    const Backward varlen = run_varlen_backward(p, in, dout, DType::f32, mask, mods, options, f);
    // The padded batch: inputs scattered into [B, L, H, D] rows, zeros elsewhere.
    const auto pad = [&](const std::vector<float>& packed_values, const std::vector<int64_t>& cu,
                         int64_t L, int64_t width) {
      std::vector<float> padded(B * L * width, 0.0f);
      for (int64_t i = 0; i < B; ++i) {
        std::copy(packed_values.begin() + cu[i] * width, packed_values.begin() + cu[i + 1] * width,
                  padded.begin() + i * L * width);
      }
      return padded;
    };
    const std::vector<float> q = pad(p.q, p.varlen.cu_seqlens_q, Lq, p.Hq * p.D),
                             k = pad(p.k, p.varlen.cu_seqlens_k, Lk, p.Hkv * p.D),
                             v = pad(p.v, p.varlen.cu_seqlens_k, Lk, p.Hkv * p.Dv),
                             dO = pad(dout.floats(p.total_q() * p.Hq * p.Dv), p.varlen.cu_seqlens_q,
                                      Lq, p.Hq * p.Dv);
    const Mask padded_mask = Mask(mask).query_lengths(p.lq).key_lengths(p.lk);
    std::vector<float> out(B * Lq * p.Hq * p.Dv), lse(B * p.Hq * Lq), dq(q.size()), dk(k.size()),
        dv(v.size()), dsinks(p.Hq), dbias(mods.bias->numel()), dtable(B);
    const auto blhd = [&](const std::vector<float>& t, int64_t L, int64_t H, int64_t D) {
      return TensorView::from_blhd(t.data(), B, L, H, D);
    };
    const auto mblhd = [&](std::vector<float>& t, int64_t L, int64_t H, int64_t D) {
      return MutableTensorView::from_blhd(t.data(), B, L, H, D);
    };
    attention(blhd(q, Lq, p.Hq, p.D), blhd(k, Lk, p.Hkv, p.D), blhd(v, Lk, p.Hkv, p.Dv),
              mblhd(out, Lq, p.Hq, p.Dv), padded_mask, mods, options,
              MutableTensorView(lse.data(), {B, p.Hq, Lq}));
    Gradients grads(mblhd(dq, Lq, p.Hq, p.D), mblhd(dk, Lk, p.Hkv, p.D), mblhd(dv, Lk, p.Hkv, p.Dv),
                    MutableTensorView(dbias.data(), mods.bias->shape()),
                    MutableTensorView(dsinks.data(), {p.Hq}));
    grads.dtables = {MutableTensorView(dtable.data(), {B})};
    attention_backward(blhd(q, Lq, p.Hq, p.D), blhd(k, Lk, p.Hkv, p.D), blhd(v, Lk, p.Hkv, p.Dv),
                       blhd(out, Lq, p.Hq, p.Dv), TensorView(lse.data(), {B, p.Hq, Lq}),
                       blhd(dO, Lq, p.Hq, p.Dv), grads, padded_mask, mods, options);
    const auto close = [](const std::vector<float>& a, const std::vector<float>& b) {
      float worst = 0.0f;
      for (size_t n = 0; n < a.size(); ++n) worst = std::max(worst, std::abs(a[n] - b[n]));
      return worst;
    };
    const auto packed_floats = [](const std::vector<uint32_t>& words) {
      std::vector<float> values(words.size());
      std::memcpy(values.data(), words.data(), words.size() * 4);
      return values;
    };
    EXPECT_LE(close(pad(packed_floats(varlen.dq), p.varlen.cu_seqlens_q, Lq, p.Hq * p.D), dq),
              1e-5f);
    EXPECT_LE(close(pad(packed_floats(varlen.dk), p.varlen.cu_seqlens_k, Lk, p.Hkv * p.D), dk),
              1e-5f);
    EXPECT_LE(close(pad(packed_floats(varlen.dv), p.varlen.cu_seqlens_k, Lk, p.Hkv * p.Dv), dv),
              1e-5f);
    EXPECT_LE(close(varlen.dsinks, dsinks), 1e-5f);
    EXPECT_LE(close(varlen.dbias, dbias), 1e-5f);
    EXPECT_LE(close(varlen.dtable, dtable), 1e-5f);
  }
}

TEST(VarlenBackward, FusedWithinTheDtypeToleranceOfTheReference) {
  const Packed p = random_mix(61, true);
  for (const auto& [dtype, tolerance] :
       {std::pair{DType::f32, 5e-5f}, {DType::f16, 2e-2f}, {DType::bf16, 1e-1f}}) {
    const Buffers in(p, dtype);
    const DTypeBuffer dout(random_values(p.total_q() * p.Hq * p.Dv, 70), dtype);
    for (const MaskCase& c : varlen_masks(p)) {
      Options reference;
      reference.kernel = Kernel::reference;
      const ScoreMods mods = varlen_mods(p);
      const Forward f = run_varlen(p, in, dtype, c.mask, mods, reference);
      const Backward exact = run_varlen_backward(p, in, dout, dtype, c.mask, mods, reference, f);
      const Backward fused = run_varlen_backward(p, in, dout, dtype, c.mask, mods, {}, f);
      const auto worst = [&](const std::vector<uint32_t>& a, const std::vector<uint32_t>& b,
                             int64_t count) {
        return test::max_error(as_floats(a, dtype, count), as_floats(b, dtype, count));
      };
      EXPECT_LE(worst(fused.dq, exact.dq, p.total_q() * p.Hq * p.D), tolerance) << c.name;
      EXPECT_LE(worst(fused.dk, exact.dk, p.total_k() * p.Hkv * p.D), tolerance) << c.name;
      EXPECT_LE(worst(fused.dv, exact.dv, p.total_k() * p.Hkv * p.Dv), tolerance) << c.name;
      EXPECT_LE(test::max_error(fused.dsinks, exact.dsinks), tolerance) << c.name;
      EXPECT_LE(test::max_error(fused.dbias, exact.dbias), tolerance) << c.name;
    }
  }
}

}  // namespace
}  // namespace maskattn
