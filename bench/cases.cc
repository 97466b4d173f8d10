#include "cases.h"

#include <cstring>

#include "core/splitmix64.h"
#include "maskattn/error.h"
#include "sparse_cases.h"

namespace maskattn::bench {

std::vector<int64_t> padded_lengths(const Case& c) {
  std::vector<int64_t> lengths(c.batch);
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t low = c.k_len / 4;
    lengths[b] = c.batch == 1 ? c.k_len : low + (c.k_len - low) * b / (c.batch - 1);
  }
  return lengths;
}

namespace {

// Packed documents of N tokens and causal: documents:N as Mask::segments, documents-program:N as
// the mask program FlexAttention users write.
Mask documents(const Case& c) {
  const bool program = c.mask.rfind("documents-program:", 0) == 0;
  const int64_t size = std::stoll(c.mask.substr(c.mask.find(':') + 1));
  if (c.q_len != c.k_len || size < 1) throw Error("documents:N needs Lq == Lk and N >= 1");
  std::vector<int64_t> ids(c.q_len);
  for (int64_t t = 0; t < c.q_len; ++t) ids[t] = t / size;
  if (program) {
    return Mask().program("(doc[q] == doc[kv]) & (q >= kv)",
                          {ProgramTable::own("doc", std::move(ids), {c.q_len})});
  }
  std::vector<int64_t> all;
  for (int64_t b = 0; b < c.batch; ++b) all.insert(all.end(), ids.begin(), ids.end());
  return Mask().causal().segments(Array<int64_t>({c.batch, c.q_len}, std::move(all)));
}

}  // namespace

Mask make_mask(const Case& c) {
  if (is_sparse_mask(c.mask)) return make_sparse_mask(c);
  if (c.mask == "none") return Mask();
  if (c.mask == "causal") return Mask().causal();
  if (c.mask.rfind("window:", 0) == 0) return Mask().sliding_window(std::stoll(c.mask.substr(7)));
  if (c.mask == "padded") {
    if (c.q_len != c.k_len) throw Error("padded benchmark needs Lq == Lk");
    return Mask().key_lengths(padded_lengths(c)).query_lengths(padded_lengths(c));
  }
  if (c.mask.rfind("documents", 0) == 0) return documents(c);
  throw Error("unknown benchmark mask '" + c.mask +
              "' (none, causal, window:W, padded, documents:N, documents-program:N)");
}

ScoreMods make_mods(const Case& c) {
  ScoreMods mods;
  if (c.mods == "none") return mods;
  if (c.mods != "relative-program") {
    throw Error("unknown benchmark mods '" + c.mods + "' (none, relative-program)");
  }
  const int64_t span = c.q_len + c.k_len - 1;
  std::vector<float> rel(c.heads * span);
  detail::SplitMix64 random(6);
  for (float& x : rel) x = static_cast<float>(random.uniform(-0.5, 0.5));
  mods.program = Program::score("s + rel[h, q - kv + " + std::to_string(c.k_len - 1) + "]",
                                {ProgramTable::own("rel", std::move(rel), {c.heads, span})});
  return mods;
}

// Exact for every mask, dense or sparse, and O(tiles): the library's count_allowed.
double allowed_pairs(const Case& c) {
  return static_cast<double>(count_allowed(make_mask(c), {c.batch, c.heads, c.q_len, c.k_len}));
}

double dense_pairs(const Case& c) {
  return static_cast<double>(c.batch) * c.heads * c.q_len * c.k_len;
}

double flops_per_pair(const Case& c) {
  return 2.0 * (c.dim + c.dim);
}

namespace {

std::vector<uint16_t> filled(int64_t count, DType dtype, uint64_t seed) {
  const int64_t words = dtype == DType::f32 ? 2 * count : count;
  std::vector<uint16_t> data(words);
  detail::SplitMix64 random(seed);
  for (int64_t n = 0; n < count; ++n) {
    const float x = static_cast<float>(random.uniform(-1.0, 1.0));
    if (dtype == DType::f32) {
      std::memcpy(data.data() + 2 * n, &x, 4);
    } else {
      data[n] = dtype == DType::f16 ? float16_from_float(x).bits : bfloat16_from_float(x).bits;
    }
  }
  return data;
}

}  // namespace

Tensors::Tensors(const Case& c)
    : case_(c),
      mask_(make_mask(c)),
      mods_(make_mods(c)),
      q_(filled(c.batch * c.heads * c.q_len * c.dim, c.dtype, 1)),
      k_(filled(c.batch * c.kv_heads * c.k_len * c.dim, c.dtype, 2)),
      v_(filled(c.batch * c.kv_heads * c.k_len * c.dim, c.dtype, 3)),
      out_(filled(c.batch * c.heads * c.q_len * c.dim, c.dtype, 4)) {}

void Tensors::run(const Options& options) {
  const Case& c = case_;
  attention(TensorView(q_.data(), c.dtype, {c.batch, c.heads, c.q_len, c.dim}),
            TensorView(k_.data(), c.dtype, {c.batch, c.kv_heads, c.k_len, c.dim}),
            TensorView(v_.data(), c.dtype, {c.batch, c.kv_heads, c.k_len, c.dim}),
            MutableTensorView(out_.data(), c.dtype, {c.batch, c.heads, c.q_len, c.dim}), mask_,
            mods_, options);
}

void Tensors::run_backward(const Options& options) {
  const Case& c = case_;
  const Dims q_shape = {c.batch, c.heads, c.q_len, c.dim};
  const Dims kv_shape = {c.batch, c.kv_heads, c.k_len, c.dim};
  const Dims lse_shape = {c.batch, c.heads, c.q_len};
  if (dout_.empty()) {
    lse_.resize(c.batch * c.heads * c.q_len);
    attention(TensorView(q_.data(), c.dtype, q_shape), TensorView(k_.data(), c.dtype, kv_shape),
              TensorView(v_.data(), c.dtype, kv_shape),
              MutableTensorView(out_.data(), c.dtype, q_shape), mask_, mods_, options,
              MutableTensorView(lse_.data(), lse_shape));
    dout_ = filled(q_.size() / (c.dtype == DType::f32 ? 2 : 1), c.dtype, 5);
    dq_.resize(q_.size());
    dk_.resize(k_.size());
    dv_.resize(v_.size());
  }
  Gradients grads{MutableTensorView(dq_.data(), c.dtype, q_shape),
                  MutableTensorView(dk_.data(), c.dtype, kv_shape),
                  MutableTensorView(dv_.data(), c.dtype, kv_shape),
                  {},
                  {}};
  if (mods_.program) {  // the relative-bias table's gradient, as training would ask for it
    const ProgramTable& table = mods_.program->tables()[0];
    dtable_.resize(table.sizes[0] * table.sizes[1]);
    grads.dtables = {MutableTensorView(dtable_.data(), {table.sizes[0], table.sizes[1]})};
  }
  attention_backward(TensorView(q_.data(), c.dtype, q_shape),
                     TensorView(k_.data(), c.dtype, kv_shape),
                     TensorView(v_.data(), c.dtype, kv_shape),
                     TensorView(out_.data(), c.dtype, q_shape), TensorView(lse_.data(), lse_shape),
                     TensorView(dout_.data(), c.dtype, q_shape), grads, mask_, mods_, options);
}

double Tensors::bytes() const {
  return 2.0 * (q_.size() + k_.size() + v_.size() + out_.size() + dout_.size() + dq_.size() +
                dk_.size() + dv_.size()) +
         4.0 * lse_.size() + 8.0 * dtable_.size();  // the table and its gradient
}

}  // namespace maskattn::bench
