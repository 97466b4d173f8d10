// The GPT model over a paged KV cache (maskattn/paged_kv_cache.h): one PagedKVCache per layer, and
// one forward over a *ragged batch* — each sequence brings its own number of new tokens (a chunk
// of a prompt, or the one token a decoding sequence sampled last) — which is what a serving loop
// (maskattn/model/serve.h) runs every step.
//
// A forward packs the new tokens of every entry into one [rows, E] matrix, so the projections, the
// LayerNorms and the MLPs are single products over all rows; each entry's keys and values are
// appended to its sequence in every layer's cache; attention_paged() reads them in place, each
// entry's queries aligned at its own sequence's end.
//
// Why a token's result does not depend on the batch it ran in. The projections are one running
// sum per output in a fixed order (docs/semantics.md §13), LayerNorm and GELU are per row, so only
// attention could differ. The row kernel computes calls of ≤ 8 queries and the tile kernel longer
// ones, and the two round differently (§9), so each entry's kernel must follow from its own
// length: entries of ≤ 8 tokens (decoding steps, short prompt ends) run one attention call each
// — the row kernel also groups a sequence's last keys by fours according to the call's longest
// sequence, so sharing a call with a longer sequence would change those keys' score bits — in
// parallel over the entries; longer entries run one tile-kernel call together, where padding
// rows and longer neighbours change no bit (tested). So a sequence fed in the same pieces gets the
// same bits alone or in any batch; the serving loop cuts prompts at fixed multiples of its
// prefill chunk for that reason. (A short entry's call is the very call it makes alone, key
// splitting of long caches included.)
#pragma once

#include <cstdint>
#include <vector>

#include "maskattn/kv_format.h"
#include "maskattn/model/parameters.h"
#include "maskattn/paged_kv_cache.h"

namespace maskattn::model {

struct PagedDecoderOptions {
  KVFormat format = KVFormat::f32;  // how the caches store keys and values
  int64_t block_size = 16;          // positions per block
  int64_t blocks = 0;               // blocks per layer's pool (every layer has its own, same size)
  int threads = 0;                  // 0: OpenMP's default
};

// One entry of a ragged batch: `count` new tokens of sequence `sequence`.
struct PagedEntry {
  int64_t sequence = 0;
  const int32_t* tokens = nullptr;
  int64_t count = 0;
};

class PagedGptDecoder {
 public:
  // `params` must outlive the decoder (the embeddings and LayerNorms are read in place). Throws
  // Error E149 for a pool of < 1 block, and the cache's own errors (E144, E147, memory) for a
  // format, block size or pool the cache refuses.
  PagedGptDecoder(const GptParameters& parameters, const float* params,
                  const PagedDecoderOptions& options);

  // A new empty sequence (the same id in every layer's cache); free() gives its blocks back.
  int64_t add_sequence();
  void free(int64_t sequence);
  int64_t length(int64_t sequence) const { return caches_[0].length(sequence); }
  bool contains(int64_t sequence) const { return caches_[0].contains(sequence); }

  // Appends every entry's tokens at its sequence's next positions and returns the logits [n,
  // vocab]: with `all_rows` false one row per entry (after its last token), else one per token in
  // entry order. Throws Error E150, changing nothing, for an unknown or repeated sequence, an
  // entry without tokens, a token outside the vocabulary, a sequence passing the context, or too
  // few free blocks; a value the cache cannot store (E145) also rolls every layer back.
  const std::vector<float>& forward(const std::vector<PagedEntry>& entries, bool all_rows = false);

  // ---- the pool (every layer's is the same size and holds the same blocks) ----
  int64_t blocks() const { return caches_[0].blocks(); }
  int64_t block_size() const { return caches_[0].block_size(); }
  int64_t free_blocks() const { return caches_[0].free_blocks(); }
  int64_t blocks_in_use() const { return caches_[0].blocks_in_use(); }
  int64_t blocks_needed(int64_t sequence, int64_t count) const {
    return caches_[0].blocks_needed(sequence, count);
  }
  // Blocks a new sequence of `positions` positions takes.
  int64_t blocks_for(int64_t positions) const {
    return (positions + block_size() - 1) / block_size();
  }
  // Bytes one position takes in all layers' caches together (keys and values).
  int64_t bytes_per_position() const;
  // Bytes of all the pools.
  int64_t pool_bytes() const { return bytes_per_position() * blocks() * block_size(); }
  const PagedKVCache& cache(int64_t layer) const { return caches_[layer]; }
  const GptParameters& parameters() const { return parameters_; }
  int64_t context() const { return parameters_.config().context; }

 private:
  void check(const std::vector<PagedEntry>& entries) const;
  void embed(const std::vector<PagedEntry>& entries);
  void layer_forward(int64_t layer, const std::vector<PagedEntry>& entries);
  void attend_short(int64_t layer, const std::vector<PagedEntry>& entries);
  void attend_long(int64_t layer, const std::vector<PagedEntry>& entries);
  void head(const std::vector<PagedEntry>& entries, bool all_rows);

  const GptParameters& parameters_;
  const float* params_;
  int threads_;
  std::vector<PagedKVCache> caches_;
  // Transposed weights per layer ([in, out], what the product reads): c_attn, attn.c_proj,
  // mlp.c_fc, mlp.c_proj; and the tied head.
  std::vector<std::vector<float>> qkv_t_, out_t_, fc_t_, proj_t_;
  std::vector<float> wte_t_;
  // Buffers kept across calls: [rows, E], [rows, 3E], [rows, 4E]; the padded queries and outputs
  // of one attention call [B, Lq, E]; the logits.
  std::vector<float> x_, normed_, qkv_, attended_, hidden_, activated_, mean_, rstd_;
  std::vector<float> queries_, heads_, logits_;
  std::vector<int64_t> first_row_;  // per entry: its first row in the packed matrices
};

}  // namespace maskattn::model
