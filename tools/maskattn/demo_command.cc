// maskattn demo: the newcomer's tour. Part 1 is the worked example; part 2 turns three sentences
// into tokens with special tokens, pads them into a batch (right and left), shows the masks as
// grids and checks that every sequence's output in the batch equals its output alone; part 3 runs
// a multi-head attention layer over the batch and generates with a KV cache, printing the max
// difference to the full forward; part 4 writes the mask and the weights as heatmaps.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "command_options.h"
#include "commands.h"
#include "core/splitmix64.h"
#include "maskattn/attention.h"
#include "maskattn/heatmap.h"
#include "maskattn/multihead.h"
#include "maskattn/tokens.h"
#include "print.h"

namespace maskattn::cli {

namespace {

constexpr int64_t kDim = 8;        // part 2: one head, Q = K = V = embeddings
constexpr int64_t kModel = 16;     // part 3: the layer's width
constexpr int64_t kGenerated = 3;  // part 3: tokens generated through the cache
constexpr double kCacheTolerance = 1e-5;

// A fixed pseudo-random embedding per token id (splitmix64), values in [-1, 1] on a 1/64 grid so
// that they are exact in every dtype.
std::vector<float> embedding(int64_t id, int64_t dim) {
  std::vector<float> vector(dim);
  detail::SplitMix64 random(0x9E3779B97F4A7C15ull * static_cast<uint64_t>(id + 1));
  for (float& value : vector) value = static_cast<float>(random.between(-64, 64)) / 64.0f;
  return vector;
}

// [B, L, dim] embeddings of a batch's ids (<pad> gets one too: the masks must make it irrelevant).
std::vector<float> embed(const Array<int64_t>& ids, int64_t dim) {
  std::vector<float> x;
  for (const int64_t id : ids.values()) {
    const std::vector<float> e = embedding(id, dim);
    x.insert(x.end(), e.begin(), e.end());
  }
  return x;
}

std::vector<std::string> row_tokens(const Vocabulary& vocabulary, const TokenBatch& batch,
                                    int64_t b) {
  const int64_t length = batch.ids.dim(1);
  return vocabulary.decode(
      std::vector<int64_t>(batch.ids.data() + b * length, batch.ids.data() + (b + 1) * length));
}

void show_batch(const Vocabulary& vocabulary, const TokenBatch& batch) {
  const int64_t length = batch.ids.dim(1);
  for (int64_t b = 0; b < batch.ids.dim(0); ++b) {
    std::string ids, words;
    for (int64_t t = 0; t < length; ++t) ids += fmt::format("{:>3}", batch.ids.at(b, t));
    for (const std::string& token : row_tokens(vocabulary, batch, b)) words += token + " ";
    fmt::print("  {}: ids [{} ]   {}\n", b, ids, words);
  }
}

void show_grid(const std::string& title, const Mask& mask, const Vocabulary& vocabulary,
               const TokenBatch& batch, int64_t b) {
  const int64_t length = batch.ids.dim(1);
  const Array<uint8_t> slice = allowed_pairs(mask, {batch.ids.dim(0), 1, length, length}, b, 0);
  fmt::print("{}\n", title);
  print_grid(slice.values(), length, length, row_tokens(vocabulary, batch, b));
  fmt::print("\n");
}

double max_abs_difference(const float* a, const float* b, int64_t count) {
  double result = 0.0;
  for (int64_t n = 0; n < count; ++n) result = std::max(result, std::fabs(double{a[n]} - b[n]));
  return result;
}

// Part 2: one head of attention over the right-padded batch against each sequence alone.
bool check_padded_batch(const TokenBatch& batch) {
  const int64_t batch_size = batch.ids.dim(0), length = batch.ids.dim(1);
  const std::vector<float> x = embed(batch.ids, kDim);
  std::vector<float> batched(x.size());
  const TensorView x_view(x.data(), {batch_size, 1, length, kDim});
  attention(x_view, x_view, x_view,
            MutableTensorView(batched.data(), {batch_size, 1, length, kDim}),
            batch.decoder_self_attention());
  fmt::print(
      "Attention output (d={}, Q = K = V = token embeddings): batched vs each sequence alone\n",
      kDim);
  bool all_equal = true;
  for (int64_t b = 0; b < batch_size; ++b) {
    const int64_t real = batch.lengths[b];
    const float* row = batched.data() + b * length * kDim;
    const std::vector<float> x_alone(x.begin() + b * length * kDim,
                                     x.begin() + (b * length + real) * kDim);
    std::vector<float> alone(x_alone.size());
    const TensorView alone_view(x_alone.data(), {1, 1, real, kDim});
    attention(alone_view, alone_view, alone_view,
              MutableTensorView(alone.data(), {1, 1, real, kDim}), Mask().causal());
    double pad_max = 0.0;
    for (int64_t n = real * kDim; n < length * kDim; ++n) {
      pad_max = std::max(pad_max, std::fabs(double{row[n]}));
    }
    const bool equal = std::equal(alone.begin(), alone.end(), row);
    all_equal = all_equal && equal && pad_max == 0.0;
    const std::string pad_note =
        real < length ? fmt::format("its {} <pad> rows have max |O| = {:g}", length - real, pad_max)
                      : "no <pad> rows";
    fmt::print("  sequence {}: {} real tokens, max |batched - alone| = {:g} ({}); {}\n", b, real,
               max_abs_difference(alone.data(), row, real * kDim),
               equal ? "bitwise equal" : "DIFFERENT", pad_note);
  }
  const int64_t last = batch_size - 1;
  fmt::print("\n");
  print_matrix(
      fmt::format("Output of sequence {} in the batch (rows {}-{} are <pad> queries: zero)", last,
                  batch.lengths[last], length - 1),
      std::vector<double>(batched.begin() + last * length * kDim, batched.end()), length, kDim);
  return all_equal;
}

// Greedy next token after `last`: the word whose embedding has the largest dot product with the
// residual stream, embedding(last) + layer output (tied embeddings). The layer is untrained, so
// the words are arbitrary; what the demo shows is that cached decoding reproduces the full forward.
int64_t next_token(int64_t last, const float* y, const Vocabulary& vocabulary) {
  const std::vector<float> residual = embedding(last, kModel);
  int64_t best = kMaskId + 1;
  double best_score = -INFINITY;
  for (int64_t id = kMaskId + 1; id < vocabulary.size(); ++id) {
    const std::vector<float> e = embedding(id, kModel);
    double score = 0.0;
    for (int64_t n = 0; n < kModel; ++n) score += (double{y[n]} + residual[n]) * e[n];
    if (score > best_score) best_score = score, best = id;
  }
  return best;
}

// Prefill the prompts (left padded, one chunk) into a cache, then generate kGenerated tokens one
// at a time. Returns every output row, [B, L + kGenerated, E], and appends the tokens to `ids`.
std::vector<float> generate(const MultiHeadAttention& layer, const TokenBatch& prompts,
                            const Vocabulary& vocabulary, DType cache_dtype,
                            std::vector<std::vector<int64_t>>& ids) {
  const int64_t batch_size = prompts.ids.dim(0), length = prompts.ids.dim(1);
  const int64_t total = length + kGenerated;
  KVCache cache = layer.make_cache(batch_size, total, cache_dtype);
  cache.set_starts(prompts.starts);
  std::vector<float> y(batch_size * total * kModel);
  const std::vector<float> x = embed(prompts.ids, kModel);
  layer.forward_cached(
      TensorView(x.data(), {batch_size, length, kModel}), cache,
      MutableTensorView(y.data(), {batch_size, length, kModel}, {total * kModel, kModel, 1}));
  for (int64_t t = length; t < total; ++t) {
    std::vector<float> step;
    for (int64_t b = 0; b < batch_size; ++b) {
      const int64_t token =
          next_token(ids[b].back(), y.data() + (b * total + t - 1) * kModel, vocabulary);
      ids[b].push_back(token);
      const std::vector<float> e = embedding(token, kModel);
      step.insert(step.end(), e.begin(), e.end());
    }
    layer.forward_cached(TensorView(step.data(), {batch_size, 1, kModel}), cache,
                         MutableTensorView(y.data() + t * kModel, {batch_size, 1, kModel},
                                           {total * kModel, kModel, 1}));
  }
  return y;
}

// The layer over a batch of token embeddings (Q = K = V), with the batch's decoder mask.
std::vector<float> layer_forward(const MultiHeadAttention& layer, const TokenBatch& batch) {
  const std::vector<float> x = embed(batch.ids, kModel);
  const int64_t batch_size = batch.ids.dim(0), width = batch.ids.dim(1);
  std::vector<float> y(x.size());
  const TensorView view(x.data(), {batch_size, width, kModel});
  layer.forward(view, view, view, MutableTensorView(y.data(), {batch_size, width, kModel}),
                batch.decoder_self_attention());
  return y;
}

// The real tokens' outputs of the right- and left-padded batches must agree.
void compare_pad_sides(const MultiHeadAttention& layer, const TokenBatch& right,
                       const TokenBatch& left) {
  const int64_t batch_size = right.ids.dim(0), length = right.ids.dim(1);
  const std::vector<float> y_right = layer_forward(layer, right);
  const std::vector<float> y_left = layer_forward(layer, left);
  double side_diff = 0.0;
  for (int64_t b = 0; b < batch_size; ++b) {
    side_diff = std::max(side_diff,
                         max_abs_difference(y_right.data() + b * length * kModel,
                                            y_left.data() + (b * length + left.starts[b]) * kModel,
                                            right.lengths[b] * kModel));
  }
  fmt::print("Layer output of the real tokens, right- vs left-padded batch: max |diff| = {:g}\n\n",
             side_diff);
}

// Prints the max difference of the cached outputs to the full forward's, for the prefill and each
// generated step; true if all are within kCacheTolerance.
bool compare_cache_to_full(const std::vector<float>& cached, const std::vector<float>& full,
                           const Vocabulary& vocabulary,
                           const std::vector<std::vector<int64_t>>& sequences,
                           const std::vector<std::vector<int64_t>>& extended, int64_t length) {
  const int64_t batch_size = static_cast<int64_t>(sequences.size());
  const int64_t total = length + kGenerated;
  double prefill_diff = 0.0;
  std::vector<double> step_diff(kGenerated, 0.0);
  for (int64_t b = 0; b < batch_size; ++b) {
    const float* c = cached.data() + b * total * kModel;
    const float* f = full.data() + b * total * kModel;
    prefill_diff = std::max(prefill_diff, max_abs_difference(c, f, length * kModel));
    for (int64_t s = 0; s < kGenerated; ++s) {
      step_diff[s] = std::max(step_diff[s], max_abs_difference(c + (length + s) * kModel,
                                                               f + (length + s) * kModel, kModel));
    }
  }
  fmt::print("  prefill ({} positions)   max |cached - full forward| = {:.3g}\n", length,
             prefill_diff);
  bool ok = prefill_diff <= kCacheTolerance;
  for (int64_t s = 0; s < kGenerated; ++s) {
    std::string words;
    for (int64_t b = 0; b < batch_size; ++b) {
      words += (b ? ", " : "") + vocabulary.token(extended[b][sequences[b].size() + s]);
    }
    fmt::print("  step {} (generated: {:<24}) max |cached - full forward| = {:.3g}\n", s + 1, words,
               step_diff[s]);
    ok = ok && step_diff[s] <= kCacheTolerance;
  }
  return ok;
}

// The same generation for each prompt alone: batching and left padding change nothing. True if
// the tokens are the same and the outputs within kCacheTolerance.
bool compare_alone_to_batched(const MultiHeadAttention& layer, const Vocabulary& vocabulary,
                              const std::vector<std::vector<int64_t>>& sequences,
                              const TokenBatch& left,
                              const std::vector<std::vector<int64_t>>& extended,
                              const std::vector<float>& cached) {
  const int64_t total = left.ids.dim(1) + kGenerated;
  double alone_diff = 0.0;
  bool same_tokens = true;
  for (int64_t b = 0; b < left.ids.dim(0); ++b) {
    std::vector<std::vector<int64_t>> one = {sequences[b]};
    const TokenBatch prompt = collate(one, PadSide::left);
    const std::vector<float> y = generate(layer, prompt, vocabulary, DType::f32, one);
    same_tokens = same_tokens && one[0] == extended[b];
    const int64_t offset = left.starts[b];
    alone_diff = std::max(
        alone_diff, max_abs_difference(y.data(), cached.data() + (b * total + offset) * kModel,
                                       (total - offset) * kModel));
  }
  fmt::print("  each prompt generated alone: {} tokens, max |alone - batched| = {:.3g}\n",
             same_tokens ? "the same" : "DIFFERENT", alone_diff);
  return same_tokens && alone_diff <= kCacheTolerance;
}

// Part 3: a GQA layer over the left- and right-padded batches, then generation with a KV cache.
bool run_layer_and_cache(const Vocabulary& vocabulary,
                         const std::vector<std::vector<int64_t>>& sequences) {
  const MultiHeadAttention layer = MultiHeadAttention::random(kModel, 4, 2, 2026);
  fmt::print(
      "A multi-head attention layer: E={}, {} query heads sharing {} kv heads (GQA), head dim {},\n"
      "W_q, W_k, W_v, W_o with biases (seeded like nn.Linear). Inputs are [B, L, E] token "
      "embeddings.\n\n",
      kModel, layer.heads(), layer.kv_heads(), layer.head_dim());
  const TokenBatch left = collate(sequences, PadSide::left);
  compare_pad_sides(layer, collate(sequences, PadSide::right), left);
  const int64_t batch_size = left.ids.dim(0), length = left.ids.dim(1);

  fmt::print(
      "Generation with a KV cache [B={}, Hkv={}, capacity={}, D={}]: the left-padded prompts are\n"
      "prefilled in one chunk, then {} tokens are generated one step at a time; each step's query\n"
      "is aligned bottom-right with the cached keys, and cache.set_starts() hides the <pad> "
      "columns.\n",
      batch_size, layer.kv_heads(), length + kGenerated, layer.head_dim(), kGenerated);
  std::vector<std::vector<int64_t>> extended = sequences;
  const std::vector<float> cached = generate(layer, left, vocabulary, DType::f32, extended);
  // The full forward over prompts + generated tokens, left padded the same way.
  const std::vector<float> full = layer_forward(layer, collate(extended, PadSide::left));
  bool ok = compare_cache_to_full(cached, full, vocabulary, sequences, extended, length);
  ok = compare_alone_to_batched(layer, vocabulary, sequences, left, extended, cached) && ok;

  std::vector<std::vector<int64_t>> bf16_ids = sequences;
  const std::vector<float> bf16 = generate(layer, left, vocabulary, DType::bf16, bf16_ids);
  fmt::print(
      "  with a bf16 cache: max |bf16 cached - f32 full forward| = {:.3g} (bf16 keeps 8 "
      "significant bits)\n",
      max_abs_difference(bf16.data(), full.data(), batch_size * (length + kGenerated) * kModel));
  fmt::print("\n{}\n", ok ? fmt::format("KV-cache decoding matches the full forward (max diff "
                                        "<= {:g}) and each prompt run alone.",
                                        kCacheTolerance)
                          : "MISMATCH: KV-cache decoding differs from the full forward.");
  return ok;
}

// Part 4: the combined mask and the weights as heatmap files in `directory`.
void write_demo_heatmaps(const std::string& directory, const Vocabulary& vocabulary,
                         const TokenBatch& batch) {
  std::filesystem::create_directories(directory);
  const int64_t batch_size = batch.ids.dim(0), length = batch.ids.dim(1);
  const Mask combined = batch.decoder_self_attention();
  const MaskShape shape = {batch_size, 1, length, length};
  const std::vector<float> x = embed(batch.ids, kDim);
  const TensorView x_view(x.data(), {batch_size, 1, length, kDim});
  std::vector<float> weights(batch_size * length * length);
  attention_weights(x_view, x_view,
                    MutableTensorView(weights.data(), {batch_size, 1, length, length}), combined);
  const std::vector<HeatmapPanel> panels = heatmap_panels(allowed_pairs(combined, shape), weights);
  fmt::print("\n=== Part 4: heatmaps ===\n\n");
  const auto write = [&](const std::string& name, const std::vector<HeatmapPanel>& chosen,
                         const HeatmapLabels& labels, const std::string& what) {
    const std::string path = directory + "/" + name;
    write_heatmap(path, chosen, labels);
    fmt::print("  {:<36} {}\n", path, what);
  };
  const std::vector<std::string> tokens = row_tokens(vocabulary, batch, 1);
  HeatmapPanel mask_only = panels[1];
  mask_only.weights.clear();
  write("mask-sequence-1.svg", {mask_only}, {tokens, tokens},
        "the combined mask of sequence 1, token labels (SVG)");
  write("weights-sequence-1.png", {panels[1]}, {tokens, tokens},
        "its attention weights; hidden pairs hatched grey");
  write("weights-batch.png", panels, {}, "the weights of all three sequences, one panel each");
}

}  // namespace

int run_demo(const std::string& heatmap_directory) {
  fmt::print("=== Part 1: the worked example ===\n\n");
  run_example();

  fmt::print("\n=== Part 2: tokens and a padded batch ===\n\n");
  const std::vector<std::string> sentences = {"I love my dog", "the cat sat", "hello"};
  Vocabulary vocabulary;
  std::vector<std::vector<int64_t>> sequences;
  for (const std::string& sentence : sentences) {
    std::istringstream words(sentence);
    for (std::string word; words >> word;) vocabulary.add(word);
    sequences.push_back(vocabulary.encode(sentence));
  }
  fmt::print("Special tokens have fixed ids:");
  for (int64_t id = 0; id <= kMaskId; ++id) fmt::print(" {}={}", vocabulary.token(id), id);
  fmt::print(
      "\nwords are numbered after them; an unknown word becomes <unk>: \"my cat flew\" -> [");
  const std::vector<int64_t> unknown = vocabulary.encode("my cat flew", false, false);
  for (size_t n = 0; n < unknown.size(); ++n) fmt::print("{}{}", n ? " " : "", unknown[n]);
  fmt::print("]\n\n");
  const TokenBatch right = collate(sequences, PadSide::right);
  const TokenBatch left = collate(sequences, PadSide::left);
  fmt::print("The sentences with <bos>/<eos>, right-padded with <pad> to L={} (training):\n",
             right.ids.dim(1));
  show_batch(vocabulary, right);
  fmt::print("\nand left-padded (batched generation: every prompt ends in the last column):\n");
  show_batch(vocabulary, left);
  fmt::print("\nRows are queries, columns keys; █ = may attend, · = hidden.\n\n");
  show_grid("Padding mask of sequence 2 (--mask pad-id:0:ids.npy): no query looks at a <pad> key",
            right.key_padding(), vocabulary, right, 2);
  show_grid("Causal (look-ahead) mask (--mask causal): no query looks at a later key",
            Mask().causal(), vocabulary, right, 2);
  show_grid("Combined, sequence 1: causal & key padding & query padding (pad rows see nothing)",
            right.decoder_self_attention(), vocabulary, right, 1);
  show_grid(
      "Combined, sequence 2, left padded: positions count from <bos>, so the causal part "
      "moves with it",
      left.decoder_self_attention(), vocabulary, left, 2);
  const bool batch_ok = check_padded_batch(right);
  fmt::print("\n{}\n", batch_ok ? "Padding changed nothing: every sequence's real tokens get "
                                  "exactly the output they get alone."
                                : "MISMATCH: padding changed a real token's output.");

  fmt::print("\n=== Part 3: a multi-head attention layer and a KV cache ===\n\n");
  // Prompts end where generation continues: <bos> and the words, no <eos>.
  std::vector<std::vector<int64_t>> prompts;
  for (const std::string& sentence : sentences) {
    prompts.push_back(vocabulary.encode(sentence, true, false));
  }
  const bool cache_ok = run_layer_and_cache(vocabulary, prompts);
  if (!heatmap_directory.empty()) write_demo_heatmaps(heatmap_directory, vocabulary, right);
  fmt::print(
      "\n=== Next: why the look-ahead mask exists ===\n\n"
      "The layer above is untrained. `maskattn gpt ablate` trains a small character-level GPT "
      "on this\nsystem's licence texts twice, with the causal mask and with none, and compares "
      "them: without\nthe mask the model learns to copy the next character it can see, its "
      "training loss collapses,\nand it fails at generation (about 75 s on two cores; "
      "docs/gpt.md).\n");
  return batch_ok && cache_ok ? 0 : 1;
}

Command add_demo_command(CLI::App& app) {
  auto heatmaps = std::make_shared<std::string>("maskattn-demo");
  CLI::App* command = app.add_subcommand(
      "demo", "the tour: worked example, padded batch, masks as grids, heatmap files");
  command->add_option("--heatmaps", *heatmaps,
                      "directory for the heatmap files (default maskattn-demo; '' = none)");
  return {command, [heatmaps] { return run_demo(*heatmaps); }};
}

}  // namespace maskattn::cli
