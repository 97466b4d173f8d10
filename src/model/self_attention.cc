#include "model/self_attention.h"

#include <initializer_list>

#include "kernels/gemm.h"
#include "maskattn/attention.h"
#include "model/linear.h"

namespace maskattn::model {

namespace {

using detail::gemm;
using detail::Layout;

// [B·L, width] rows, `row_stride` apart, seen as [B, H, L, width/H]: the head split by strides.
TensorView heads_of(const float* data, const SelfAttentionShape& s, int64_t row_stride) {
  const int64_t d = s.head_dim();
  return TensorView(data, DType::f32, {s.batch, s.heads, s.length, d},
                    {s.length * row_stride, d, row_stride, 1});
}
MutableTensorView mutable_heads_of(float* data, const SelfAttentionShape& s) {
  const int64_t d = s.head_dim();
  return MutableTensorView(data, DType::f32, {s.batch, s.heads, s.length, d},
                           {s.length * s.embed, d, s.embed, 1});
}

Options attention_options(int threads) {
  Options options;
  options.threads = threads;
  return options;
}

// c_attn's backward for one of Q, K, V (`part` 0, 1, 2: its row block of W_attn and b_attn):
// dx (+)= dP·W_part, dW_part += dPᵀ·x, db_part += Σ_rows dP (in row order).
void qkv_part_backward(const float* x, const float* dpart, const SelfAttentionShape& s, int part,
                       const SelfAttentionWeights<const float>& weights,
                       const SelfAttentionWeights<float>& grads, float* dx, int threads) {
  const int64_t rows = s.rows(), e = s.embed;
  const float* w = weights.attn_weight + part * e * e;
  gemm(Layout::as_stored, Layout::as_stored, rows, e, e, dpart, e, w, e, dx, e, part > 0, threads);
  gemm(Layout::transposed, Layout::as_stored, e, e, rows, dpart, e, x, e,
       grads.attn_weight + part * e * e, e, true, threads);
  float* db = grads.attn_bias + part * e;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t n = 0; n < e; ++n) db[n] += dpart[r * e + n];
  }
}

}  // namespace

QkvViews qkv_views(const SelfAttentionState& state, const SelfAttentionShape& shape) {
  const int64_t e = shape.embed;
  const float* qkv = state.qkv.data();
  return {heads_of(qkv, shape, 3 * e), heads_of(qkv + e, shape, 3 * e),
          heads_of(qkv + 2 * e, shape, 3 * e)};
}

void self_attention_forward(const float* x, const SelfAttentionShape& shape,
                            const SelfAttentionWeights<const float>& weights, const Mask& mask,
                            float* y, SelfAttentionState& state, int threads) {
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
  linear_forward(state.heads.data(), rows, e, weights.proj_weight, weights.proj_bias, e, y,
                 threads);
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
  attention_backward(qkv.q, qkv.k, qkv.v, heads_of(state.heads.data(), shape, e),
                     TensorView(state.lse.data(), {shape.batch, shape.heads, shape.length}),
                     heads_of(scratch.dheads.data(), shape, e),
                     Gradients(mutable_heads_of(scratch.dq.data(), shape),
                               mutable_heads_of(scratch.dk.data(), shape),
                               mutable_heads_of(scratch.dv.data(), shape)),
                     mask, {}, attention_options(threads));
  qkv_part_backward(x, scratch.dq.data(), shape, 0, weights, grads, dx, threads);
  qkv_part_backward(x, scratch.dk.data(), shape, 1, weights, grads, dx, threads);
  qkv_part_backward(x, scratch.dv.data(), shape, 2, weights, grads, dx, threads);
}

}  // namespace maskattn::model
