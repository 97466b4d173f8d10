// PagedGptDecoder (maskattn/model/paged_decoder.h): the GPT's forward over a ragged batch of new
// tokens, its keys and values kept in one PagedKVCache per layer.
//
// The rows of a forward are the new tokens of every entry, packed in entry order: entry e owns
// rows [first_row_[e], first_row_[e] + count). Everything but attention is row by row (embedding,
// LayerNorm, GELU) or one product over all rows (c_attn, c_proj, c_fc, mlp.c_proj, the head), and
// those products compute each output as one sum in a fixed order, so a row's values do not depend
// on the other rows. Attention: an entry of ≤ 8 tokens runs its own call (the header says why),
// its queries read in place from the packed c_attn output and its heads written in place; the
// longer entries are copied into one zero-padded [B, Lq, E] buffer (Lq = their longest count),
// attended in one call against their sequences' pages, and their real rows copied back. Keys and
// values are appended straight from the packed c_attn output through strided views ([Hkv, T, D]
// with strides {D, 3E, 1}): the cache encodes them into its format on the way in.
//
// A failed forward changes nothing: the entries are checked (and the pool counted) before the
// first append, and if an append or an attention call still throws (a value a quantized format
// cannot store, such as an inf from a diverged model), every layer's sequences are truncated back.
#include "maskattn/model/paged_decoder.h"

#include <omp.h>

#include <algorithm>
#include <exception>
#include <set>
#include <string>

#include "kernels/matmul.h"
#include "maskattn/attention.h"
#include "maskattn/error.h"
#include "model/gelu.h"
#include "model/layer_norm.h"
#include "model/linear.h"

namespace maskattn::model {

namespace {

std::string str(int64_t value) {
  return std::to_string(value);
}

// Entries with more tokens than this run the tile kernel; the others the row kernel (fused.cc's
// kRowModeQueries). Keeping the two apart keeps each token's arithmetic its own (the header).
constexpr int64_t kRowKernelQueries = 8;

void add_into(float* into, const float* values, int64_t count) {
  for (int64_t n = 0; n < count; ++n) into[n] += values[n];
}

}  // namespace

PagedGptDecoder::PagedGptDecoder(const GptParameters& parameters, const float* params,
                                 const PagedDecoderOptions& options)
    : parameters_(parameters),
      params_(params),
      threads_(options.threads > 0 ? options.threads : omp_get_max_threads()) {
  const GptConfig& config = parameters.config();
  if (options.blocks < 1) {
    throw Error("PagedGptDecoder: the pool needs at least one block per layer, got " +
                str(options.blocks) + " (give --pool-blocks or --pool-mib)");
  }
  const int64_t E = config.d_model;
  caches_.reserve(config.layers);
  for (int64_t l = 0; l < config.layers; ++l) {
    caches_.emplace_back(options.blocks, options.block_size, config.heads, config.head_dim(),
                         options.format);
    const BlockOffsets& o = parameters.block(l);
    qkv_t_.emplace_back();
    out_t_.emplace_back();
    fc_t_.emplace_back();
    proj_t_.emplace_back();
    transpose(params + o.c_attn_weight, 3 * E, E, qkv_t_.back());
    transpose(params + o.attn_proj_weight, E, E, out_t_.back());
    transpose(params + o.c_fc_weight, config.hidden(), E, fc_t_.back());
    transpose(params + o.mlp_proj_weight, E, config.hidden(), proj_t_.back());
  }
  transpose(params + parameters.wte(), config.vocab, E, wte_t_);
}

int64_t PagedGptDecoder::bytes_per_position() const {
  int64_t bytes = 0;
  for (const PagedKVCache& cache : caches_) bytes += cache.bytes_per_position();
  return bytes;
}

int64_t PagedGptDecoder::add_sequence() {
  const int64_t id = caches_[0].add_sequence();
  for (size_t l = 1; l < caches_.size(); ++l) {
    // Every cache sees the same calls, so it hands out the same id.
    if (caches_[l].add_sequence() != id) throw Error("PagedGptDecoder: layer caches diverged");
  }
  return id;
}

void PagedGptDecoder::free(int64_t sequence) {
  if (!contains(sequence)) {
    throw Error("PagedGptDecoder::free: sequence " + str(sequence) + " is not in the cache");
  }
  for (PagedKVCache& cache : caches_) cache.free(sequence);
}

void PagedGptDecoder::check(const std::vector<PagedEntry>& entries) const {
  const GptConfig& config = parameters_.config();
  std::set<int64_t> seen;
  int64_t blocks = 0;
  for (size_t e = 0; e < entries.size(); ++e) {
    const PagedEntry& entry = entries[e];
    const std::string where = "PagedGptDecoder::forward: entries[" + str(e) + "]";
    if (!contains(entry.sequence)) {
      throw Error(where + " names sequence " + str(entry.sequence) + ", which is not in the cache");
    }
    if (!seen.insert(entry.sequence).second) {
      throw Error(where + " names sequence " + str(entry.sequence) +
                  " again; give each sequence's new tokens in one entry");
    }
    if (entry.count < 1 || entry.tokens == nullptr) {
      throw Error(where + " has no tokens (count " + str(entry.count) + ")");
    }
    for (int64_t t = 0; t < entry.count; ++t) {
      if (entry.tokens[t] < 0 || entry.tokens[t] >= config.vocab) {
        throw Error(where + " token " + str(t) + " = " + str(entry.tokens[t]) +
                    " is outside the vocabulary [0, " + str(config.vocab) + ")");
      }
    }
    const int64_t length = this->length(entry.sequence);
    if (length + entry.count > config.context) {
      throw Error(where + ": " + str(entry.count) + " tokens at position " + str(length) +
                  " pass the context of " + str(config.context));
    }
    blocks += blocks_needed(entry.sequence, entry.count);
  }
  if (blocks > free_blocks()) {
    throw Error("PagedGptDecoder::forward: the batch needs " + str(blocks) + " more blocks but " +
                str(free_blocks()) + " of " + str(this->blocks()) + " are free");
  }
}

void PagedGptDecoder::embed(const std::vector<PagedEntry>& entries) {
  const int64_t E = parameters_.config().d_model;
  first_row_.clear();
  int64_t rows = 0;
  for (const PagedEntry& entry : entries) {
    first_row_.push_back(rows);
    rows += entry.count;
  }
  x_.resize(rows * E);
  for (size_t e = 0; e < entries.size(); ++e) {
    const int64_t start = length(entries[e].sequence);
    for (int64_t t = 0; t < entries[e].count; ++t) {
      const float* token = params_ + parameters_.wte() + entries[e].tokens[t] * E;
      const float* place = params_ + parameters_.wpe() + (start + t) * E;
      float* x = x_.data() + (first_row_[e] + t) * E;
      for (int64_t n = 0; n < E; ++n) x[n] = token[n] + place[n];
    }
  }
}

const std::vector<float>& PagedGptDecoder::forward(const std::vector<PagedEntry>& entries,
                                                   bool all_rows) {
  if (entries.empty()) throw Error("PagedGptDecoder::forward: the batch has no entries");
  check(entries);
  std::vector<int64_t> lengths;
  for (const PagedEntry& entry : entries) lengths.push_back(length(entry.sequence));
  embed(entries);
  try {
    for (int64_t l = 0; l < parameters_.config().layers; ++l) layer_forward(l, entries);
  } catch (...) {
    for (PagedKVCache& cache : caches_) {
      for (size_t e = 0; e < entries.size(); ++e) {
        if (cache.length(entries[e].sequence) > lengths[e]) {
          cache.truncate(entries[e].sequence, lengths[e]);
        }
      }
    }
    throw;
  }
  head(entries, all_rows);
  return logits_;
}

void PagedGptDecoder::layer_forward(int64_t layer, const std::vector<PagedEntry>& entries) {
  const GptConfig& config = parameters_.config();
  const int64_t E = config.d_model, H4 = config.hidden(), D = config.head_dim();
  const int64_t rows = static_cast<int64_t>(x_.size()) / E;
  const BlockOffsets& o = parameters_.block(layer);
  normed_.resize(rows * E);
  mean_.resize(rows);
  rstd_.resize(rows);
  qkv_.resize(rows * 3 * E);
  attended_.resize(rows * E);
  hidden_.resize(rows * H4);
  activated_.resize(rows * H4);
  layer_norm_forward(x_.data(), rows, E, params_ + o.ln_1_weight, params_ + o.ln_1_bias,
                     config.ln_eps, normed_.data(), mean_.data(), rstd_.data(), threads_);
  linear_forward_per_row(normed_.data(), rows, E, qkv_t_[layer].data(), params_ + o.c_attn_bias,
                         3 * E, qkv_.data(), threads_);
  // Keys and values of each entry: [Hkv, T, D] views into its rows of the c_attn output.
  for (size_t e = 0; e < entries.size(); ++e) {
    const float* first = qkv_.data() + first_row_[e] * 3 * E;
    const Dims sizes = {config.heads, entries[e].count, D}, strides = {D, 3 * E, 1};
    caches_[layer].append(entries[e].sequence, TensorView(first + E, sizes, strides),
                          TensorView(first + 2 * E, sizes, strides));
  }
  attend_short(layer, entries);
  attend_long(layer, entries);
  linear_forward_per_row(attended_.data(), rows, E, out_t_[layer].data(),
                         params_ + o.attn_proj_bias, E, normed_.data(), threads_);
  add_into(x_.data(), normed_.data(), rows * E);
  layer_norm_forward(x_.data(), rows, E, params_ + o.ln_2_weight, params_ + o.ln_2_bias,
                     config.ln_eps, normed_.data(), mean_.data(), rstd_.data(), threads_);
  linear_forward_per_row(normed_.data(), rows, E, fc_t_[layer].data(), params_ + o.c_fc_bias, H4,
                         hidden_.data(), threads_);
  gelu_forward(hidden_.data(), rows * H4, activated_.data(), threads_);
  linear_forward_per_row(activated_.data(), rows, H4, proj_t_[layer].data(),
                         params_ + o.mlp_proj_bias, E, normed_.data(), threads_);
  add_into(x_.data(), normed_.data(), rows * E);
}

void PagedGptDecoder::attend_short(int64_t layer, const std::vector<PagedEntry>& entries) {
  const GptConfig& config = parameters_.config();
  const int64_t E = config.d_model, H = config.heads, D = config.head_dim();
  std::vector<size_t> members;
  for (size_t e = 0; e < entries.size(); ++e) {
    if (entries[e].count <= kRowKernelQueries) members.push_back(e);
  }
  const int64_t count = static_cast<int64_t>(members.size());
  std::exception_ptr failure;
  // One call per entry, in parallel over the entries (each call on one thread: calls from several
  // threads give the serial results, docs/semantics.md §11). Q is read in place from the packed
  // c_attn output and the heads written in place into the attention rows: no copies.
#pragma omp parallel for schedule(dynamic) num_threads(threads_) if (threads_ > 1 && count > 1)
  for (int64_t n = 0; n < count; ++n) {
    const PagedEntry& entry = entries[members[n]];
    const int64_t first = first_row_[members[n]], T = entry.count;
    Options options;
    options.threads = 1;
    try {
      attention_paged(
          TensorView(qkv_.data() + first * 3 * E, {1, H, T, D}, {T * 3 * E, D, 3 * E, 1}),
          caches_[layer], {entry.sequence},
          MutableTensorView(attended_.data() + first * E, {1, H, T, D}, {T * E, D, E, 1}), {}, {},
          {}, options);
    } catch (...) {
#pragma omp critical(maskattn_paged_decoder)
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

void PagedGptDecoder::attend_long(int64_t layer, const std::vector<PagedEntry>& entries) {
  const GptConfig& config = parameters_.config();
  const int64_t E = config.d_model, H = config.heads, D = config.head_dim();
  std::vector<size_t> members;
  int64_t q_len = 0;
  for (size_t e = 0; e < entries.size(); ++e) {
    if (entries[e].count <= kRowKernelQueries) continue;
    members.push_back(e);
    q_len = std::max(q_len, entries[e].count);
  }
  if (members.empty()) return;
  const int64_t B = static_cast<int64_t>(members.size());
  queries_.assign(B * q_len * E, 0.0f);
  heads_.resize(B * q_len * E);
  std::vector<int64_t> sequences, query_lengths;
  for (int64_t b = 0; b < B; ++b) {
    const PagedEntry& entry = entries[members[b]];
    for (int64_t t = 0; t < entry.count; ++t) {
      std::copy_n(qkv_.data() + (first_row_[members[b]] + t) * 3 * E, E,
                  queries_.data() + (b * q_len + t) * E);
    }
    sequences.push_back(entry.sequence);
    query_lengths.push_back(entry.count);
  }
  // [B, Lq, H, D] memory as [B, H, Lq, D] views (§13: heads split through strides).
  const Dims sizes = {B, H, q_len, D}, strides = {q_len * E, D, E, 1};
  Options options;
  options.threads = threads_;
  attention_paged(TensorView(queries_.data(), sizes, strides), caches_[layer], sequences,
                  MutableTensorView(heads_.data(), sizes, strides), query_lengths, {}, {}, options);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t first = first_row_[members[b]];
    std::copy_n(heads_.data() + b * q_len * E, entries[members[b]].count * E,
                attended_.data() + first * E);
  }
}

void PagedGptDecoder::head(const std::vector<PagedEntry>& entries, bool all_rows) {
  const GptConfig& config = parameters_.config();
  const int64_t E = config.d_model, V = config.vocab;
  const int64_t rows = static_cast<int64_t>(x_.size()) / E;
  // The rows that need logits, gathered: every row, or each entry's last.
  int64_t count = rows;
  if (!all_rows) {
    count = static_cast<int64_t>(entries.size());
    for (size_t e = 0; e < entries.size(); ++e) {
      const int64_t last = first_row_[e] + entries[e].count - 1;
      std::copy_n(x_.data() + last * E, E, attended_.data() + e * E);
    }
  }
  const float* selected = all_rows ? x_.data() : attended_.data();
  normed_.resize(count * E);
  mean_.resize(count);
  rstd_.resize(count);
  layer_norm_forward(selected, count, E, params_ + parameters_.ln_f_weight(),
                     params_ + parameters_.ln_f_bias(), config.ln_eps, normed_.data(), mean_.data(),
                     rstd_.data(), threads_);
  logits_.resize(count * V);
  detail::matmul(normed_.data(), E, 1, count, E, wte_t_.data(), V, V, logits_.data(), V, false,
                 threads_);
}

}  // namespace maskattn::model
