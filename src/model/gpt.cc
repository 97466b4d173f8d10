#include "maskattn/model/gpt.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/gemm.h"
#include "maskattn/error.h"
#include "model/gelu.h"
#include "model/layer_norm.h"
#include "model/linear.h"
#include "model/parallel_ranges.h"
#include "model/self_attention.h"

namespace maskattn::model {

namespace {

// The embedding rows of a batch: x[r] = wte[token r] + wpe[position r], the rows shared out.
void embed(const float* wte, const float* wpe, const GptBatch& batch, int64_t width, float* x,
           int threads) {
  const int64_t rows = batch.batch * batch.length;
#pragma omp parallel for schedule(static) \
    num_threads(threads > 0 ? threads : 1) if (threads != 1 && rows * width >= 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const float* token = wte + batch.tokens[r] * width;
    const float* position = wpe + (r % batch.length) * width;
    for (int64_t n = 0; n < width; ++n) x[r * width + n] = token[n] + position[n];
  }
}

// The embeddings' backward: dwte[token r] += dx[r] and dwpe[position r] += dx[r] for r in row
// order (rows sharing a token or a position add in that order: model/parallel_ranges.h).
void embed_backward(const float* dx, const GptBatch& batch, int64_t width, float* dwte, float* dwpe,
                    int threads) {
  const int64_t rows = batch.batch * batch.length;
  for_column_ranges(rows, width, threads, [&](int64_t first, int64_t end) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = dx + r * width;
      float* token = dwte + batch.tokens[r] * width;
      float* position = dwpe + (r % batch.length) * width;
      for (int64_t n = first; n < end; ++n) token[n] += row[n];
      for (int64_t n = first; n < end; ++n) position[n] += row[n];
    }
  });
}

// grads = 0 in chunks over the threads (a serial fill of the default model's 3 MB had kept the
// other thread waiting).
void zero(float* data, int64_t count, int threads) {
  for_chunks(count, threads, [&](int64_t first, int64_t size) {
    std::fill(data + first, data + first + size, 0.0f);
  });
}

// Where block `o`'s attention parameters (or their gradients) are in the flat array `base`.
template <typename T>
SelfAttentionWeights<T> attention_parameters(T* base, const BlockOffsets& o) {
  return {base + o.c_attn_weight, base + o.c_attn_bias, base + o.attn_proj_weight,
          base + o.attn_proj_bias};
}

}  // namespace

LayerWeights attention_weights(const GptParameters& parameters, const float* params,
                               int64_t layer) {
  const int64_t E = parameters.config().d_model;
  const BlockOffsets& o = parameters.block(layer);
  const float* c_attn = params + o.c_attn_weight;
  const float* c_attn_bias = params + o.c_attn_bias;
  const float* proj = params + o.attn_proj_weight;
  const float* proj_bias = params + o.attn_proj_bias;
  LayerWeights weights;
  weights.q_weight = Array<float>({E, E}, {c_attn, c_attn + E * E});
  weights.k_weight = Array<float>({E, E}, {c_attn + E * E, c_attn + 2 * E * E});
  weights.v_weight = Array<float>({E, E}, {c_attn + 2 * E * E, c_attn + 3 * E * E});
  weights.out_weight = Array<float>({E, E}, {proj, proj + E * E});
  weights.q_bias = Array<float>({E}, {c_attn_bias, c_attn_bias + E});
  weights.k_bias = Array<float>({E}, {c_attn_bias + E, c_attn_bias + 2 * E});
  weights.v_bias = Array<float>({E}, {c_attn_bias + 2 * E, c_attn_bias + 3 * E});
  weights.out_bias = Array<float>({E}, {proj_bias, proj_bias + E});
  return weights;
}

Gpt::Gpt(GptParameters parameters, bool causal)
    : parameters_(std::move(parameters)), causal_(causal) {
  blocks_.resize(parameters_.config().layers);
}

void Gpt::charge(double GptTimings::*part) {
  if (timings_ == nullptr) return;
  const auto now = std::chrono::steady_clock::now();
  timings_->*part += std::chrono::duration<double>(now - mark_).count();
  mark_ = now;
}

QkvViews Gpt::qkv(int64_t layer) const {
  const SelfAttentionShape shape{last_batch_, last_length_, parameters_.config().heads,
                                 parameters_.config().d_model};
  return qkv_views(blocks_.at(layer).attention, shape);
}

Mask Gpt::mask_for(const GptBatch& batch) const {
  Mask mask;
  if (causal_) mask.causal();
  if (batch.pad >= 0) {
    std::vector<int64_t> keep(batch.batch * batch.length);
    for (int64_t n = 0; n < batch.batch * batch.length; ++n) keep[n] = batch.tokens[n] != batch.pad;
    mask.key_keep(Array<int64_t>({batch.batch, batch.length}, std::move(keep)));
  }
  return mask;
}

CrossEntropy Gpt::loss_and_gradients(const float* params, const GptBatch& batch, float* grads,
                                     int threads) {
  const GptConfig& config = parameters_.config();
  if (batch.length > config.context) {
    throw Error("gpt: a batch of length " + std::to_string(batch.length) +
                " exceeds the model's context of " + std::to_string(config.context));
  }
  for (int64_t n = 0; n < batch.batch * batch.length; ++n) {
    if (batch.tokens[n] < 0 || batch.tokens[n] >= config.vocab) {
      throw Error("gpt: token " + std::to_string(batch.tokens[n]) + " at flat index " +
                  std::to_string(n) + " is outside the vocabulary [0, " +
                  std::to_string(config.vocab) + ")");
    }
  }
  for (int64_t n = 0; n < batch.batch * batch.length; ++n) {
    const int32_t target = batch.targets[n];
    if (target != kIgnoreTarget && (target < 0 || target >= config.vocab)) {
      throw Error("gpt: target " + std::to_string(target) + " at flat index " + std::to_string(n) +
                  " is outside the vocabulary and not the ignore value -1");
    }
  }
  if (timings_ != nullptr) mark_ = std::chrono::steady_clock::now();
  mask_ = mask_for(batch);
  forward(params, batch, threads);
  const int64_t rows = batch.batch * batch.length;
  if (grads == nullptr) {
    return cross_entropy(logits_.data(), batch.targets, rows, config.vocab, kIgnoreTarget, nullptr,
                         threads);
  }
  // dlogits overwrite the logits: the backward needs only them.
  const CrossEntropy loss = cross_entropy(logits_.data(), batch.targets, rows, config.vocab,
                                          kIgnoreTarget, logits_.data(), threads);
  charge(&GptTimings::embedding_head_loss);
  backward(params, batch, grads, threads);
  return loss;
}

void Gpt::forward(const float* params, const GptBatch& batch, int threads) {
  const GptConfig& config = parameters_.config();
  const int64_t E = config.d_model, H4 = config.hidden(), V = config.vocab;
  const int64_t rows = batch.batch * batch.length;
  const float* wte = params + parameters_.wte();
  const float* wpe = params + parameters_.wpe();
  residual_.resize(rows * E);
  embed(wte, wpe, batch, E, residual_.data(), threads);
  charge(&GptTimings::embedding_head_loss);
  // y = LayerNorm(x) with the weight and bias at these offsets, its statistics kept.
  const auto layer_norm = [&](const std::vector<float>& x, int64_t weight, int64_t bias,
                              std::vector<float>& y, std::vector<float>& mean,
                              std::vector<float>& rstd) {
    y.resize(rows * E);
    mean.resize(rows);
    rstd.resize(rows);
    layer_norm_forward(x.data(), rows, E, params + weight, params + bias, config.ln_eps, y.data(),
                       mean.data(), rstd.data(), threads);
    charge(&GptTimings::layer_norm);
  };
  const SelfAttentionShape attention_shape{batch.batch, batch.length, config.heads, E};
  last_batch_ = batch.batch;
  last_length_ = batch.length;
  for (int64_t l = 0; l < config.layers; ++l) {
    const BlockOffsets& o = parameters_.block(l);
    GptBlockState& s = blocks_[l];
    // The block's input is kept for the backward; the stream's buffer takes the block's output.
    std::swap(s.x_in, residual_);
    residual_.resize(rows * E);
    layer_norm(s.x_in, o.ln_1_weight, o.ln_1_bias, s.ln_1, s.ln_1_mean, s.ln_1_rstd);
    s.x_mid.resize(rows * E);
    self_attention_forward(s.ln_1.data(), attention_shape, attention_parameters(params, o), mask_,
                           s.x_mid.data(), s.attention, threads, s.x_in.data());
    charge(&GptTimings::attention);
    // MLP.
    layer_norm(s.x_mid, o.ln_2_weight, o.ln_2_bias, s.ln_2, s.ln_2_mean, s.ln_2_rstd);
    s.fc.resize(rows * H4);
    s.act.resize(rows * H4);
    linear_forward(s.ln_2.data(), rows, E, params + o.c_fc_weight, params + o.c_fc_bias, H4,
                   s.fc.data(), threads);
    gelu_forward(s.fc.data(), rows * H4, s.act.data(), threads);
    linear_forward(s.act.data(), rows, H4, params + o.mlp_proj_weight, params + o.mlp_proj_bias, E,
                   residual_.data(), threads, s.x_mid.data());
    charge(&GptTimings::mlp);
  }
  layer_norm(residual_, parameters_.ln_f_weight(), parameters_.ln_f_bias(), ln_f_, ln_f_mean_,
             ln_f_rstd_);
  charge(&GptTimings::layer_norm);
  logits_.resize(rows * V);
  // The tied LM head: logits = ln_f · wteᵀ.
  detail::gemm(detail::Layout::as_stored, detail::Layout::transposed, rows, V, E, ln_f_.data(), E,
               wte, E, logits_.data(), V, false, threads);
  charge(&GptTimings::embedding_head_loss);
}

void Gpt::backward(const float* params, const GptBatch& batch, float* grads, int threads) {
  const GptConfig& config = parameters_.config();
  const int64_t E = config.d_model, H4 = config.hidden(), V = config.vocab;
  const int64_t rows = batch.batch * batch.length;
  zero(grads, parameters_.count(), threads);
  const float* wte = params + parameters_.wte();
  float* dwte = grads + parameters_.wte();
  // The LM head (tied): dln_f = dlogits·wte, dwte += dlogitsᵀ·ln_f.
  const float* dlogits = logits_.data();
  scratch_a_.resize(rows * E);
  using detail::Layout;
  detail::gemm(Layout::as_stored, Layout::as_stored, rows, E, V, dlogits, V, wte, E,
               scratch_a_.data(), E, false, threads);
  detail::gemm(Layout::transposed, Layout::as_stored, V, E, rows, dlogits, V, ln_f_.data(), E, dwte,
               E, true, threads);
  charge(&GptTimings::embedding_head_loss);
  dx_.resize(rows * E);
  layer_norm_backward(residual_.data(), scratch_a_.data(), rows, E,
                      params + parameters_.ln_f_weight(), ln_f_mean_.data(), ln_f_rstd_.data(),
                      dx_.data(), grads + parameters_.ln_f_weight(),
                      grads + parameters_.ln_f_bias(), threads);
  charge(&GptTimings::layer_norm);
  const SelfAttentionShape attention_shape{batch.batch, batch.length, config.heads, E};
  scratch_h_.resize(rows * H4);
  // A block's residual branch starts with a LayerNorm of x: dx += its backward of dy.
  const auto add_layer_norm_backward =
      [&](const std::vector<float>& x, const float* dy, int64_t weight, int64_t bias,
          const std::vector<float>& mean, const std::vector<float>& rstd) {
        layer_norm_backward(x.data(), dy, rows, E, params + weight, mean.data(), rstd.data(),
                            dx_.data(), grads + weight, grads + bias, threads, true);
        charge(&GptTimings::layer_norm);
      };
  for (int64_t l = config.layers - 1; l >= 0; --l) {
    const BlockOffsets& o = parameters_.block(l);
    GptBlockState& s = blocks_[l];
    // x_out = x_mid + c_proj(gelu(c_fc(ln_2(x_mid)))): dx_ is ∂L/∂x_out.
    linear_backward(s.act.data(), dx_.data(), rows, H4, E, params + o.mlp_proj_weight,
                    scratch_h_.data(), grads + o.mlp_proj_weight, grads + o.mlp_proj_bias, threads);
    gelu_backward(s.fc.data(), scratch_h_.data(), rows * H4, scratch_h_.data(), threads);
    linear_backward(s.ln_2.data(), scratch_h_.data(), rows, E, H4, params + o.c_fc_weight,
                    scratch_a_.data(), grads + o.c_fc_weight, grads + o.c_fc_bias, threads);
    charge(&GptTimings::mlp);
    add_layer_norm_backward(s.x_mid, scratch_a_.data(), o.ln_2_weight, o.ln_2_bias, s.ln_2_mean,
                            s.ln_2_rstd);  // dx_ is now ∂L/∂x_mid
    // x_mid = x_in + attn(ln_1(x_in)).
    self_attention_backward(s.ln_1.data(), dx_.data(), attention_shape,
                            attention_parameters(params, o), attention_parameters(grads, o), mask_,
                            s.attention, attention_scratch_, scratch_a_.data(), threads);
    charge(&GptTimings::attention);
    add_layer_norm_backward(s.x_in, scratch_a_.data(), o.ln_1_weight, o.ln_1_bias, s.ln_1_mean,
                            s.ln_1_rstd);  // dx_ is now ∂L/∂x_in
  }
  // The embeddings, in row order.
  float* dwpe = grads + parameters_.wpe();
  embed_backward(dx_.data(), batch, E, dwte, dwpe, threads);
  charge(&GptTimings::embedding_head_loss);
}

}  // namespace maskattn::model
