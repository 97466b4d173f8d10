#include "model/self_attention.h"

#include <initializer_list>

#include "layer/projection.h"
#include "maskattn/attention.h"
#include "model/linear.h"

namespace maskattn::model {

namespace {

// [B·L, E] f32 rows seen as [B, H, L, D] (layer/projection.h's head split by strides).
TensorView heads_of(const float* data, const SelfAttentionShape& s) {
  return detail::heads_view(data, DType::f32, s.batch, s.length, s.heads, s.head_dim());
}
MutableTensorView mutable_heads_of(float* data, const SelfAttentionShape& s) {
  return detail::mutable_heads_view(data, DType::f32, s.batch, s.length, s.heads, s.head_dim());
}

Options attention_options(int threads) {
  Options options;
  options.threads = threads;
  return options;
}

}  // namespace

QkvViews qkv_views(const SelfAttentionState& state, const SelfAttentionShape& shape) {
  // Each token's row holds Q, K and V side by side: rows 3E apart, one head every D values.
  const int64_t e = shape.embed, d = shape.head_dim();
  const Dims sizes = {shape.batch, shape.heads, shape.length, d};
  const Dims strides = {shape.length * 3 * e, d, 3 * e, 1};
  const float* qkv = state.qkv.data();
  return {TensorView(qkv, DType::f32, sizes, strides),
          TensorView(qkv + e, DType::f32, sizes, strides),
          TensorView(qkv + 2 * e, DType::f32, sizes, strides)};
}

void self_attention_forward(const float* x, const SelfAttentionShape& shape,
                            const SelfAttentionWeights<const float>& weights, const Mask& mask,
                            float* y, SelfAttentionState& state, int threads,
                            const float* residual) {
  const int64_t rows = shape.rows(), e = shape.embed;
  state.qkv.resize(rows * 3 * e);
  state.heads.resize(rows * e);
  state.lse.resize(shape.batch * shape.heads * shape.length);
  linear_forward(x, rows, e, weights.attn_weight, weights.attn_bias, 3 * e, state.qkv.data(),
                 threads);
  const QkvViews qkv = qkv_views(state, shape);
  attention(qkv.q, qkv.k, qkv.v, mutable_heads_of(state.heads.data(), shape), mask, {},
            attention_options(threads),
            MutableTensorView(state.lse.data(), {shape.batch, shape.heads, shape.length}));
  linear_forward(state.heads.data(), rows, e, weights.proj_weight, weights.proj_bias, e, y, threads,
                 residual);
}

void self_attention_backward(const float* x, const float* dy, const SelfAttentionShape& shape,
                             const SelfAttentionWeights<const float>& weights,
                             const SelfAttentionWeights<float>& grads, const Mask& mask,
                             const SelfAttentionState& state, SelfAttentionScratch& scratch,
                             float* dx, int threads) {
  const int64_t rows = shape.rows(), e = shape.embed;
  for (std::vector<float>* buffer : {&scratch.dheads, &scratch.dq, &scratch.dk, &scratch.dv}) {
    buffer->resize(rows * e);  // not cleared: every value is overwritten
  }
  linear_backward(state.heads.data(), dy, rows, e, e, weights.proj_weight, scratch.dheads.data(),
                  grads.proj_weight, grads.proj_bias, threads);
  const QkvViews qkv = qkv_views(state, shape);
  attention_backward(qkv.q, qkv.k, qkv.v, heads_of(state.heads.data(), shape),
                     TensorView(state.lse.data(), {shape.batch, shape.heads, shape.length}),
                     heads_of(scratch.dheads.data(), shape),
                     Gradients(mutable_heads_of(scratch.dq.data(), shape),
                               mutable_heads_of(scratch.dk.data(), shape),
                               mutable_heads_of(scratch.dv.data(), shape)),
                     mask, {}, attention_options(threads));
  // c_attn's backward, one row block of W_attn and b_attn (Q, K, V) at a time: dx sums the three.
  const float* parts[3] = {scratch.dq.data(), scratch.dk.data(), scratch.dv.data()};
  for (int part = 0; part < 3; ++part) {
    linear_backward(x, parts[part], rows, e, e, weights.attn_weight + part * e * e, dx,
                    grads.attn_weight + part * e * e, grads.attn_bias + part * e, threads,
                    part > 0);
  }
}

}  // namespace maskattn::model
