#include "ring_cases.h"

#include <cstring>

#include "test_util.h"

namespace maskattn::test {
namespace {

RingCase base(std::string name, int64_t q_len, int64_t k_len) {
  RingCase c;
  c.name = std::move(name);
  c.q_len = q_len;
  c.k_len = k_len;
  return c;
}

// Ids of packed documents of the given lengths, for each batch row.
Array<int64_t> document_ids(int64_t batch, int64_t length, int64_t doc) {
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < length; ++i) ids.push_back((i + b * 3) / doc);
  }
  return Array<int64_t>({batch, length}, ids);
}

}  // namespace

std::vector<RingCase> ring_cases(bool quick) {
  std::vector<RingCase> cases;
  const int64_t n = 101;  // divisible by no rank count 2…4, nor by 2P
  {
    RingCase c = base("dense", n, n);
    cases.push_back(c);
  }
  {
    RingCase c = base("causal_bottom_right_lq_ne_lk", 45, n);
    c.mask.causal(Alignment::bottom_right);
    cases.push_back(c);
  }
  {
    RingCase c = base("causal_top_left_lq_gt_lk", n, 70);
    c.mask.causal(Alignment::top_left);
    cases.push_back(c);
  }
  {
    RingCase c = base("causal_gqa", n, n);
    c.q_heads = 4;
    c.kv_heads = 1;
    c.value_dim = 8;
    c.mask.causal();
    cases.push_back(c);
  }
  {
    RingCase c = base("window_both_sides", n, n);
    c.mask.window(9, 4);
    cases.push_back(c);
  }
  {
    RingCase c = base("sliding_window", n, n);
    c.mask.sliding_window(6);
    cases.push_back(c);
  }
  {
    RingCase c = base("chunk", n, n);
    c.mask.chunk(16).causal();
    cases.push_back(c);
  }
  {
    RingCase c = base("key_padding_right_query_padding_left", n, n);
    c.batch = 2;
    c.mask.key_lengths({n, 60}).query_starts({0, 30});
    cases.push_back(c);
  }
  {
    RingCase c = base("key_padding_left_query_padding_right_causal", n, n);
    c.batch = 2;
    c.mask.key_starts({10, 0}).query_lengths({n, 50}).causal();
    cases.push_back(c);
  }
  {
    RingCase c = base("packed_segments_causal", n, n);
    c.batch = 2;
    c.mask.segments(document_ids(2, n, 23)).causal();
    cases.push_back(c);
  }
  {
    RingCase c = base("spans", n, n);
    c.mask.spans(document_ids(1, n, 17));
    cases.push_back(c);
  }
  {
    RingCase c = base("prefix_lm", n, n);
    c.mask.prefix_lm(37);
    cases.push_back(c);
  }
  {
    RingCase c = base("alibi_causal", n, n);
    c.mask.causal();
    c.mods.alibi_slopes = {0.5f, 0.125f};
    cases.push_back(c);
  }
  {
    RingCase c = base("softcap_window", n, n);
    c.mask.window(20, 20);
    c.mods.softcap = 2.0;
    cases.push_back(c);
  }
  {
    RingCase c = base("sinks_sliding", n, n);
    c.mask.sliding_window(5);
    c.mods.sinks = {0.3f, -1.0f};
    cases.push_back(c);
  }
  {
    RingCase c = base("bias_causal", n, n);
    c.mask.causal();
    c.mods.bias = Array<float>({1, 2, 1, n}, random_values(2 * n, 99, -1.0f, 1.0f));
    cases.push_back(c);
  }
  {
    RingCase c = base("bf16_causal_gqa_sinks", n, 83);
    c.dtype = DType::bf16;
    c.q_heads = 4;
    c.kv_heads = 2;
    c.mask.causal();
    c.mods.sinks = {0.1f, 0.2f, -0.5f, 1.0f};
    cases.push_back(c);
  }
  {
    RingCase c = base("bf16_segments_alibi", n, n);
    c.dtype = DType::bf16;
    c.mask.segments(document_ids(1, n, 30)).causal();
    c.mods.alibi_slopes = {0.25f, 0.0625f};
    cases.push_back(c);
  }
  // Attention dropout: the ranks must drop exactly the pairs the single call drops (the pairs'
  // global rows key the generator), forward and backward.
  {
    RingCase c = base("dropout_causal_key_padding", n, n);
    c.batch = 2;
    c.mask.causal().key_lengths({n, 70});
    c.dropout = Dropout{0.2, 0x5eed, 3};
    cases.push_back(c);
  }
  {
    RingCase c = base("bf16_dropout_documents", n, n);
    c.dtype = DType::bf16;
    c.mask.segments(document_ids(1, n, 30)).causal();
    c.dropout = Dropout{0.5, 77, 0};
    cases.push_back(c);
  }
  if (quick) {
    // Keep one of each kind that the MPI runs need: drop the ones another case covers.
    std::erase_if(cases, [](const RingCase& c) {
      return c.name == "causal_gqa" || c.name == "spans" || c.name == "bf16_segments_alibi";
    });
  }
  return cases;
}

namespace {

std::vector<uint16_t> bf16_bits(const std::vector<float>& values) {
  std::vector<uint16_t> bits;
  for (float x : values) bits.push_back(bfloat16_from_float(x).bits);
  return bits;
}

}  // namespace

RingProblem::RingProblem(const RingCase& ring_case, uint64_t seed) : c(ring_case) {
  const auto count = [](const Dims& d) {
    int64_t n = 1;
    for (int64_t s : d) n *= s;
    return static_cast<size_t>(n);
  };
  q32 = random_values(count(q_dims()), seed, -2.0f, 2.0f);
  k32 = random_values(count(k_dims()), seed + 1, -2.0f, 2.0f);
  v32 = random_values(count(v_dims()), seed + 2);
  dout32 = random_values(count(out_dims()), seed + 3);
  if (c.dtype == DType::bf16) {
    q16 = bf16_bits(q32);
    k16 = bf16_bits(k32);
    v16 = bf16_bits(v32);
    dout16 = bf16_bits(dout32);
  }
}

TensorView RingProblem::q() const {
  return c.dtype == DType::f32 ? TensorView(q32.data(), q_dims())
                               : TensorView(q16.data(), DType::bf16, q_dims());
}
TensorView RingProblem::k() const {
  return c.dtype == DType::f32 ? TensorView(k32.data(), k_dims())
                               : TensorView(k16.data(), DType::bf16, k_dims());
}
TensorView RingProblem::v() const {
  return c.dtype == DType::f32 ? TensorView(v32.data(), v_dims())
                               : TensorView(v16.data(), DType::bf16, v_dims());
}
TensorView RingProblem::dout() const {
  return c.dtype == DType::f32 ? TensorView(dout32.data(), out_dims())
                               : TensorView(dout16.data(), DType::bf16, out_dims());
}

OutBuffer::OutBuffer(DType type, Dims sizes) : dtype(type), dims(std::move(sizes)) {
  int64_t n = 1;
  for (int64_t s : dims) n *= s;
  words.assign(static_cast<size_t>(n), 0);
}

std::vector<float> OutBuffer::floats() const {
  std::vector<float> out;
  const size_t n = words.size();
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::f32) {
      float x;
      std::memcpy(&x, reinterpret_cast<const float*>(words.data()) + i, 4);
      out.push_back(x);
    } else {
      bfloat16 x{reinterpret_cast<const uint16_t*>(words.data())[i]};
      out.push_back(to_float(x));
    }
  }
  return out;
}

bool OutBuffer::same_bits(const OutBuffer& other) const {
  const size_t bytes = words.size() * dtype_size(dtype);
  return dims == other.dims && dtype == other.dtype &&
         std::memcmp(words.data(), other.words.data(), bytes) == 0;
}

RingResults::RingResults(const RingProblem& p)
    : out(p.c.dtype, p.out_dims()),
      lse(DType::f32, {p.c.batch, p.c.q_heads, p.c.q_len}),
      dq(p.c.dtype, p.q_dims()),
      dk(p.c.dtype, p.k_dims()),
      dv(p.c.dtype, p.v_dims()),
      dsinks(DType::f32, {p.c.q_heads}),
      dbias(DType::f32, p.c.mods.bias ? p.c.mods.bias->shape() : Dims{1}) {}

Gradients RingResults::grads(const RingCase& c, OutBuffer& into_dq, OutBuffer& into_dk,
                             OutBuffer& into_dv) {
  Gradients g;
  g.dq = into_dq.view();
  g.dk = into_dk.view();
  g.dv = into_dv.view();
  if (!c.mods.sinks.empty()) g.dsinks = dsinks.view();
  if (c.mods.bias) {
    g.dbias = dbias.view();
    g.accumulate = true;
  }
  return g;
}

}  // namespace maskattn::test
