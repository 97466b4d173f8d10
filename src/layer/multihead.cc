// MultiHeadAttention (include/maskattn/multihead.h): projections on the dense product kernel,
// attention on the masked kernels, heads split and merged by strides.
//
// Buffers: a call's f32 projections live in vectors of the calling thread kept across calls
// (LayerScratch, core/reused.h: a fresh allocation would be page faults, 11–16 µs per 4 KiB here);
// only what forward() saves for backward() and backward()'s results are allocated per call. The
// weights (construction, random, load, save) are in layer_weights.cc, the per-token arithmetic
// in projection.cc.
#include "maskattn/multihead.h"

#include <string>
#include <vector>

#include "core/reused.h"
#include "layer/projection.h"
#include "maskattn/error.h"
#include "maskattn/memory.h"
#include "validate.h"

namespace maskattn {

namespace {

using detail::finish_as;
using detail::heads_view;
using detail::linear;
using detail::LinearGradients;
using detail::load_as_f32;
using detail::mutable_heads_view;
using detail::projection_target;
using detail::Rows;
using detail::rows_as_f32;
using detail::store_as;

// The calling thread's buffers for forward() and forward_cached(), kept across calls: references
// to reused vectors (core/reused.h), so make one per call on the calling thread.
struct LayerScratch {
  // The inputs as contiguous f32 rows [B·L, E], when they are not already.
  std::vector<float>& query_rows = detail::reused<float, LayerScratch, 0>();
  std::vector<float>& key_rows = detail::reused<float, LayerScratch, 1>();
  std::vector<float>& value_rows = detail::reused<float, LayerScratch, 2>();
  // The f32 projections [B·L, H·D] when the compute dtype is not f32 (in f32 they are written
  // straight into the *_bytes buffers below). Once Q and K are stored in the compute dtype these
  // two are free: heads_f32 and out_rows below reuse them instead of holding more memory.
  std::vector<float>& q = detail::reused<float, LayerScratch, 3>();
  std::vector<float>& k = detail::reused<float, LayerScratch, 4>();
  std::vector<float>& v = detail::reused<float, LayerScratch, 5>();
  // Q, K, V and the heads' outputs in the compute dtype, [B, L, H·D] (the kernel's [B, H, L, D]).
  std::vector<uint8_t>& q_bytes = detail::reused<uint8_t, LayerScratch, 0>();
  std::vector<uint8_t>& k_bytes = detail::reused<uint8_t, LayerScratch, 1>();
  std::vector<uint8_t>& v_bytes = detail::reused<uint8_t, LayerScratch, 2>();
  std::vector<uint8_t>& heads_bytes = detail::reused<uint8_t, LayerScratch, 3>();
  // The heads' outputs as f32 (for a non-f32 dtype), read by the output projection.
  std::vector<float>& heads_f32 = q;
  // The output projection's f32 rows, when `out` is not contiguous f32.
  std::vector<float>& out_rows = k;
};

// The calling thread's buffers for backward(), kept across calls like LayerScratch's: the
// gradients' rows in the compute dtype, which attention_backward overwrites whole (fresh vectors
// were zero-filled and page-faulted on every training step), and their f32 forms.
struct BackwardScratch {
  std::vector<float>& dout_rows = detail::reused<float, BackwardScratch, 0>();
  std::vector<float>& heads_f32 = detail::reused<float, BackwardScratch, 1>();
  std::vector<float>& dq_f32 = detail::reused<float, BackwardScratch, 2>();
  std::vector<float>& dk_f32 = detail::reused<float, BackwardScratch, 3>();
  std::vector<float>& dv_f32 = detail::reused<float, BackwardScratch, 4>();
  std::vector<uint8_t>& dheads = detail::reused<uint8_t, BackwardScratch, 0>();
  std::vector<uint8_t>& dq = detail::reused<uint8_t, BackwardScratch, 1>();
  std::vector<uint8_t>& dk = detail::reused<uint8_t, BackwardScratch, 2>();
  std::vector<uint8_t>& dv = detail::reused<uint8_t, BackwardScratch, 3>();

  static std::vector<uint8_t>& sized(std::vector<uint8_t>& buffer, size_t bytes) {
    buffer.resize(bytes);  // not cleared: what it held is overwritten
    return buffer;
  }
};

// A [B, L, width] input of the layer.
void require_tokens(const TensorView& x, const char* name, int64_t width, const char* weight,
                    const Dims& weight_shape) {
  detail::require_view(x, 3, name, "[B,L,E]");
  if (x.size(2) != width) {
    throw Error(std::string(name) + " has shape " + x.shape_string() + " but the layer's " +
                weight + " " + shape_string(weight_shape) + " takes " + std::to_string(width) +
                " features per token");
  }
}

// forward()'s checks, before anything is computed: the inputs' shapes against the layer, `out`
// apart from them, and the memory the call will hold.
void require_forward_inputs(const MultiHeadAttention& layer, const TensorView& query,
                            const TensorView& key, const TensorView& value,
                            const MutableTensorView& out) {
  const LayerWeights& w = layer.weights();
  require_tokens(query, "query", layer.query_dim(), "q_weight", w.q_weight.shape());
  require_tokens(key, "key", layer.key_dim(), "k_weight", w.k_weight.shape());
  require_tokens(value, "value", layer.value_dim(), "v_weight", w.v_weight.shape());
  const int64_t batch = query.size(0), q_len = query.size(1), k_len = key.size(1);
  if (key.size(0) != batch || value.size(0) != batch || value.size(1) != k_len) {
    throw Error("query " + query.shape_string() + ", key " + key.shape_string() + " and value " +
                value.shape_string() + " must share B, and key and value their length");
  }
  detail::require_output(
      out, {batch, q_len, layer.embed_dim()}, out.dtype(), "out",
      "query " + query.shape_string() + " and out_weight " + shape_string(w.out_weight.shape()));
  detail::require_disjoint(out, "out", query, "query");
  detail::require_disjoint(out, "out", key, "key");
  detail::require_disjoint(out, "out", value, "value");
  const int64_t q_count = batch * q_len * layer.heads() * layer.head_dim();
  const int64_t k_count = batch * k_len * layer.kv_heads() * layer.head_dim();
  const int64_t v_count = batch * k_len * layer.kv_heads() * layer.head_value_dim();
  const int64_t o_count = batch * q_len * layer.heads() * layer.head_value_dim();
  require_memory(4.0 * (2.0 * (q_count + k_count + v_count + o_count) +
                        static_cast<double>(batch) * q_len * layer.embed_dim()),
                 "MultiHeadAttention::forward on query " + query.shape_string());
}

}  // namespace

void MultiHeadAttention::forward(const TensorView& query, const TensorView& key,
                                 const TensorView& value, const MutableTensorView& out,
                                 const Mask& mask, const ScoreMods& mods,
                                 const LayerOptions& options, LayerActivations* saved) const {
  require_forward_inputs(*this, query, key, value, out);
  const LayerWeights& w = weights_;
  const int64_t batch = query.size(0), q_len = query.size(1), k_len = key.size(1);
  const int64_t q_count = batch * q_len * heads_ * head_dim_;
  const int64_t k_count = batch * k_len * kv_heads_ * head_dim_;
  const int64_t v_count = batch * k_len * kv_heads_ * head_value_dim_;
  const int64_t o_count = batch * q_len * heads_ * head_value_dim_;
  const int threads = options.attention.threads;
  const DType dtype = options.dtype;

  // Projections (f32), then Q, K, V in the compute dtype.
  LayerScratch scratch;
  const float* xq = rows_as_f32(query, scratch.query_rows);
  const float* xk = rows_as_f32(key, scratch.key_rows);
  const float* xv = rows_as_f32(value, scratch.value_rows);
  linear(xq, batch * q_len, query_dim(), {w.q_weight, q_weight_t_, w.q_bias}, heads_ * head_dim_,
         projection_target(dtype, q_count, scratch.q, scratch.q_bytes), threads, Rows::batched);
  linear(xk, batch * k_len, key_dim(), {w.k_weight, k_weight_t_, w.k_bias}, kv_heads_ * head_dim_,
         projection_target(dtype, k_count, scratch.k, scratch.k_bytes), threads, Rows::batched);
  linear(xv, batch * k_len, value_dim(), {w.v_weight, v_weight_t_, w.v_bias},
         kv_heads_ * head_value_dim_, projection_target(dtype, v_count, scratch.v, scratch.v_bytes),
         threads, Rows::batched);
  finish_as(dtype, scratch.q, q_count, scratch.q_bytes);
  finish_as(dtype, scratch.k, k_count, scratch.k_bytes);
  finish_as(dtype, scratch.v, v_count, scratch.v_bytes);
  scratch.heads_bytes.resize(static_cast<size_t>(o_count) * dtype_size(dtype));

  MutableTensorView lse;
  if (saved != nullptr) {
    saved->lse.resize(static_cast<size_t>(batch * heads_ * q_len));
    lse = MutableTensorView(saved->lse.data(), {batch, heads_, q_len});
  }
  attention(
      heads_view(scratch.q_bytes.data(), dtype, batch, q_len, heads_, head_dim_),
      heads_view(scratch.k_bytes.data(), dtype, batch, k_len, kv_heads_, head_dim_),
      heads_view(scratch.v_bytes.data(), dtype, batch, k_len, kv_heads_, head_value_dim_),
      mutable_heads_view(scratch.heads_bytes.data(), dtype, batch, q_len, heads_, head_value_dim_),
      mask, mods, options.attention, lse);

  // The heads' outputs, merged by layout, through the output projection.
  detail::output_projection(load_as_f32(dtype, scratch.heads_bytes, o_count, scratch.heads_f32),
                            heads_ * head_value_dim_, {w.out_weight, out_weight_t_, w.out_bias},
                            out, scratch.out_rows, threads, Rows::batched);

  if (saved != nullptr) {
    saved->batch = batch;
    saved->query_length = q_len;
    saved->key_length = k_len;
    saved->dtype = dtype;
    saved->query.assign(xq, xq + batch * q_len * query_dim());
    saved->key.assign(xk, xk + batch * k_len * key_dim());
    saved->value.assign(xv, xv + batch * k_len * value_dim());
    // Exchanged, not copied: the scratch takes the activations' old buffers, whose contents
    // the next call overwrites (a training step's 4 copies of [B·L, H·D] saved, serially).
    saved->q.swap(scratch.q_bytes);
    saved->k.swap(scratch.k_bytes);
    saved->v.swap(scratch.v_bytes);
    saved->heads.swap(scratch.heads_bytes);
  }
}

void MultiHeadAttention::forward_cached(const TensorView& query, KVCache& cache,
                                        const MutableTensorView& out, const Mask& mask,
                                        const ScoreMods& mods, const LayerOptions& options) const {
  const LayerWeights& w = weights_;
  require_tokens(query, "query", query_dim(), "q_weight", w.q_weight.shape());
  if (key_dim() != query_dim() || value_dim() != query_dim()) {
    throw Error("forward_cached is self-attention: the layer's key and value inputs (" +
                std::to_string(key_dim()) + ", " + std::to_string(value_dim()) +
                " features) must have the query's width " + std::to_string(query_dim()));
  }
  const int64_t batch = query.size(0), steps = query.size(1);
  if (cache.batch() != batch || cache.kv_heads() != kv_heads_ || cache.head_dim() != head_dim_ ||
      cache.value_dim() != head_value_dim_) {
    throw Error("KVCache [" + std::to_string(cache.batch()) + "," +
                std::to_string(cache.kv_heads()) + ",capacity," + std::to_string(cache.head_dim()) +
                "] does not fit query " + query.shape_string() + " and this layer (kv_heads " +
                std::to_string(kv_heads_) + ", head_dim " + std::to_string(head_dim_) +
                "); make it with make_cache()");
  }
  detail::require_output(out, {batch, steps, embed_dim_}, out.dtype(), "out",
                         "query " + query.shape_string());
  detail::require_disjoint(out, "out", query, "query");
  const int threads = options.attention.threads;
  const DType dtype = cache.dtype();
  const int64_t rows = batch * steps;
  const int64_t q_count = rows * heads_ * head_dim_;
  const int64_t o_count = rows * heads_ * head_value_dim_;

  // Projections of the new tokens (f32); K and V go to the cache, Q to the compute dtype.
  LayerScratch scratch;
  const float* x = rows_as_f32(query, scratch.query_rows);
  scratch.q.resize(q_count);
  scratch.k.resize(rows * kv_heads_ * head_dim_);
  scratch.v.resize(rows * kv_heads_ * head_value_dim_);
  linear(x, rows, query_dim(), {w.q_weight, q_weight_t_, w.q_bias}, heads_ * head_dim_,
         scratch.q.data(), threads, Rows::per_row);
  linear(x, rows, query_dim(), {w.k_weight, k_weight_t_, w.k_bias}, kv_heads_ * head_dim_,
         scratch.k.data(), threads, Rows::per_row);
  linear(x, rows, query_dim(), {w.v_weight, v_weight_t_, w.v_bias}, kv_heads_ * head_value_dim_,
         scratch.v.data(), threads, Rows::per_row);
  store_as(dtype, scratch.q.data(), q_count, scratch.q_bytes);
  scratch.heads_bytes.resize(static_cast<size_t>(o_count) * dtype_size(dtype));

  const int64_t before = cache.length();
  // Refuses a step that does not fit (E89) before changing anything.
  cache.append(heads_view(scratch.k.data(), DType::f32, batch, steps, kv_heads_, head_dim_),
               heads_view(scratch.v.data(), DType::f32, batch, steps, kv_heads_, head_value_dim_));
  try {
    attention(heads_view(scratch.q_bytes.data(), dtype, batch, steps, heads_, head_dim_),
              cache.keys(), cache.values(),
              mutable_heads_view(scratch.heads_bytes.data(), dtype, batch, steps, heads_,
                                 head_value_dim_),
              cache.step_mask() & mask, mods, options.attention);
  } catch (...) {
    cache.truncate(before);  // a refused step leaves the cache as it was
    throw;
  }
  detail::output_projection(load_as_f32(dtype, scratch.heads_bytes, o_count, scratch.heads_f32),
                            heads_ * head_value_dim_, {w.out_weight, out_weight_t_, w.out_bias},
                            out, scratch.out_rows, threads, Rows::per_row);
}

LayerGradients MultiHeadAttention::backward(const LayerActivations& saved, const TensorView& dout,
                                            const Mask& mask, const ScoreMods& mods,
                                            const LayerOptions& options) const {
  const LayerWeights& w = weights_;
  const int64_t batch = saved.batch, q_len = saved.query_length, k_len = saved.key_length;
  const DType dtype = saved.dtype;
  const int64_t q_rows = batch * q_len, k_rows = batch * k_len;
  const int64_t q_width = heads_ * head_dim_, k_width = kv_heads_ * head_dim_;
  const int64_t v_width = kv_heads_ * head_value_dim_, o_width = heads_ * head_value_dim_;
  const size_t size = dtype_size(dtype);
  if (saved.query.size() != static_cast<size_t>(q_rows * query_dim()) ||
      saved.key.size() != static_cast<size_t>(k_rows * key_dim()) ||
      saved.value.size() != static_cast<size_t>(k_rows * value_dim()) ||
      saved.q.size() != q_rows * q_width * size || saved.k.size() != k_rows * k_width * size ||
      saved.v.size() != k_rows * v_width * size || saved.heads.size() != q_rows * o_width * size ||
      saved.lse.size() != static_cast<size_t>(batch * heads_ * q_len)) {
    throw Error("MultiHeadAttention::backward needs the activations this layer's forward() saved");
  }
  if (options.dtype != dtype) {
    throw Error(std::string("MultiHeadAttention::backward got options.dtype ") +
                dtype_name(options.dtype) + " but forward() ran in " + dtype_name(dtype));
  }
  detail::require_view(dout, 3, "dout", "[B,Lq,E]");
  if (dout.sizes() != Dims{batch, q_len, embed_dim_}) {
    throw Error("dout has shape " + dout.shape_string() + " but the layer's output is " +
                shape_string({batch, q_len, embed_dim_}));
  }
  const int threads = options.attention.threads;
  const bool bias = has_bias();
  BackwardScratch scratch;
  const float* dy = rows_as_f32(dout, scratch.dout_rows);

  // Output projection, then the heads' gradient in the compute dtype.
  const float* heads = load_as_f32(dtype, saved.heads, q_rows * o_width, scratch.heads_f32);
  LinearGradients out_grads = detail::linear_backward(
      heads, dy, q_rows, o_width, embed_dim_, w.out_weight, bias, {batch, q_len, o_width}, threads);
  std::vector<uint8_t>& dheads = scratch.dheads;
  std::vector<uint8_t>& dq = scratch.sized(scratch.dq, saved.q.size());
  std::vector<uint8_t>& dk = scratch.sized(scratch.dk, saved.k.size());
  std::vector<uint8_t>& dv = scratch.sized(scratch.dv, saved.v.size());
  store_as(dtype, out_grads.dx.data(), q_rows * o_width, dheads);

  Gradients grads;
  grads.dq = mutable_heads_view(dq.data(), dtype, batch, q_len, heads_, head_dim_);
  grads.dk = mutable_heads_view(dk.data(), dtype, batch, k_len, kv_heads_, head_dim_);
  grads.dv = mutable_heads_view(dv.data(), dtype, batch, k_len, kv_heads_, head_value_dim_);
  attention_backward(heads_view(saved.q.data(), dtype, batch, q_len, heads_, head_dim_),
                     heads_view(saved.k.data(), dtype, batch, k_len, kv_heads_, head_dim_),
                     heads_view(saved.v.data(), dtype, batch, k_len, kv_heads_, head_value_dim_),
                     heads_view(saved.heads.data(), dtype, batch, q_len, heads_, head_value_dim_),
                     TensorView(saved.lse.data(), {batch, heads_, q_len}),
                     heads_view(dheads.data(), dtype, batch, q_len, heads_, head_value_dim_), grads,
                     mask, mods, options.attention);

  // The input projections.
  LinearGradients q_grads = detail::linear_backward(
      saved.query.data(), load_as_f32(dtype, dq, q_rows * q_width, scratch.dq_f32), q_rows,
      query_dim(), q_width, w.q_weight, bias, {batch, q_len, query_dim()}, threads);
  LinearGradients k_grads = detail::linear_backward(
      saved.key.data(), load_as_f32(dtype, dk, k_rows * k_width, scratch.dk_f32), k_rows, key_dim(),
      k_width, w.k_weight, bias, {batch, k_len, key_dim()}, threads);
  LinearGradients v_grads = detail::linear_backward(
      saved.value.data(), load_as_f32(dtype, dv, k_rows * v_width, scratch.dv_f32), k_rows,
      value_dim(), v_width, w.v_weight, bias, {batch, k_len, value_dim()}, threads);

  LayerGradients result;
  result.dquery = std::move(q_grads.dx);
  result.dkey = std::move(k_grads.dx);
  result.dvalue = std::move(v_grads.dx);
  result.dweights.q_weight = std::move(q_grads.dweight);
  result.dweights.k_weight = std::move(k_grads.dweight);
  result.dweights.v_weight = std::move(v_grads.dweight);
  result.dweights.out_weight = std::move(out_grads.dweight);
  result.dweights.q_bias = std::move(q_grads.dbias);
  result.dweights.k_bias = std::move(k_grads.dbias);
  result.dweights.v_bias = std::move(v_grads.dbias);
  result.dweights.out_bias = std::move(out_grads.dbias);
  return result;
}

}  // namespace maskattn
