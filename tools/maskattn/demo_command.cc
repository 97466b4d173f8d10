// maskattn demo: the newcomer's tour. Part 1 is the worked example; part 2 builds a padded batch
// of three sentences with <bos>/<eos>/<pad>, shows the padding, causal and combined masks, and
// checks that every sequence's output in the batch equals the output computed for it alone; part 3
// writes the mask and the weights as heatmaps.
#include <fmt/core.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "maskattn/attention.h"
#include "maskattn/heatmap.h"
#include "print.h"

namespace maskattn::cli {

namespace {

// The demo's own small vocabulary: special tokens first, words numbered as they appear.
constexpr int64_t kPad = 0, kBos = 1, kEos = 2;
constexpr int64_t kDim = 8;

struct Batch {
  std::vector<std::vector<std::string>> tokens;  // per sequence, with <bos>/<eos>, unpadded
  std::vector<int64_t> ids;                      // [B, L], right-padded with <pad>
  int64_t length = 0;
};

Batch make_batch(const std::vector<std::string>& sentences) {
  std::map<std::string, int64_t> vocabulary = {{"<pad>", kPad}, {"<bos>", kBos}, {"<eos>", kEos}};
  Batch batch;
  std::vector<std::vector<int64_t>> sequences;
  for (const std::string& sentence : sentences) {
    std::vector<std::string> tokens = {"<bos>"};
    std::istringstream words(sentence);
    for (std::string word; words >> word;) tokens.push_back(word);
    tokens.push_back("<eos>");
    std::vector<int64_t> ids;
    for (const std::string& token : tokens) {
      const auto [entry, inserted] =
          vocabulary.emplace(token, static_cast<int64_t>(vocabulary.size()));
      ids.push_back(entry->second);
    }
    batch.length = std::max<int64_t>(batch.length, static_cast<int64_t>(ids.size()));
    batch.tokens.push_back(std::move(tokens));
    sequences.push_back(std::move(ids));
  }
  for (std::vector<int64_t>& ids : sequences) {
    ids.resize(batch.length, kPad);
    batch.ids.insert(batch.ids.end(), ids.begin(), ids.end());
  }
  return batch;
}

// A fixed pseudo-random embedding per token id (splitmix64), values in [-1, 1] on a 1/64 grid so
// that they are exact in every dtype.
std::vector<float> embedding(int64_t id) {
  std::vector<float> vector(kDim);
  uint64_t state = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(id + 1);
  for (float& value : vector) {
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    value = static_cast<float>(static_cast<int64_t>(z % 129) - 64) / 64.0f;
  }
  return vector;
}

std::vector<std::string> padded_tokens(const Batch& batch, int64_t b) {
  std::vector<std::string> tokens = batch.tokens[b];
  tokens.resize(batch.length, "<pad>");
  return tokens;
}

void show_grid(const std::string& title, const Mask& mask, const Batch& batch, int64_t b) {
  const int64_t batch_size = static_cast<int64_t>(batch.tokens.size());
  const Array<uint8_t> slice =
      allowed_pairs(mask, {batch_size, 1, batch.length, batch.length}, b, 0);
  fmt::print("{}\n", title);
  print_grid(slice.values(), batch.length, batch.length, padded_tokens(batch, b));
  fmt::print("\n");
}

// Part 3: the combined mask and the weights as heatmap files in `directory`.
void write_demo_heatmaps(const std::string& directory, const Batch& batch, const Mask& combined,
                         const std::vector<float>& x) {
  std::filesystem::create_directories(directory);
  const int64_t batch_size = static_cast<int64_t>(batch.tokens.size()), length = batch.length;
  const MaskShape shape = {batch_size, 1, length, length};
  const TensorView x_view(x.data(), {batch_size, 1, length, kDim});
  std::vector<float> weights(batch_size * length * length);
  attention_weights(x_view, x_view,
                    MutableTensorView(weights.data(), {batch_size, 1, length, length}), combined);
  const std::vector<HeatmapPanel> panels = heatmap_panels(allowed_pairs(combined, shape), weights);
  fmt::print("\n=== Part 3: heatmaps ===\n\n");
  const auto write = [&](const std::string& name, const std::vector<HeatmapPanel>& chosen,
                         const HeatmapLabels& labels, const std::string& what) {
    const std::string path = directory + "/" + name;
    write_heatmap(path, chosen, labels);
    fmt::print("  {:<36} {}\n", path, what);
  };
  const std::vector<std::string> tokens = padded_tokens(batch, 1);
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

  fmt::print("\n=== Part 2: a padded batch ===\n\n");
  const Batch batch = make_batch({"I love my dog", "the cat sat", "hello"});
  const int64_t batch_size = static_cast<int64_t>(batch.tokens.size());
  const int64_t length = batch.length;
  fmt::print(
      "Three sentences become token sequences with <bos> and <eos>, right-padded with "
      "<pad> (id {}) to L={}:\n",
      kPad, length);
  for (int64_t b = 0; b < batch_size; ++b) {
    std::string line;
    for (int64_t t = 0; t < length; ++t) line += fmt::format("{:>3}", batch.ids[b * length + t]);
    std::string words;
    for (const std::string& token : padded_tokens(batch, b)) words += token + " ";
    fmt::print("  {}: ids [{} ]   {}\n", b, line, words);
  }
  fmt::print("\nRows are queries, columns keys; █ = may attend, · = hidden.\n\n");

  const Array<int64_t> ids({batch_size, length}, batch.ids);
  const Mask padding = Mask().key_pad_id(ids, kPad);
  const Mask causal = Mask().causal();
  const Mask combined = Mask().causal().key_pad_id(ids, kPad).query_pad_id(ids, kPad);
  show_grid("Padding mask of sequence 2 (--mask pad-id:0:ids.npy): no query looks at a <pad> key",
            padding, batch, 2);
  show_grid("Causal (look-ahead) mask (--mask causal): no query looks at a later key", causal,
            batch, 2);
  show_grid("Combined, sequence 1: causal & key padding & query padding (pad rows see nothing)",
            combined, batch, 1);
  show_grid("Combined, sequence 2", combined, batch, 2);

  // Attention with Q = K = V = the embeddings, batched under the combined mask...
  std::vector<float> x(batch_size * length * kDim);
  for (int64_t n = 0; n < batch_size * length; ++n) {
    const std::vector<float> e = embedding(batch.ids[n]);
    std::copy(e.begin(), e.end(), x.begin() + n * kDim);
  }
  std::vector<float> batched(x.size());
  const TensorView x_view(x.data(), {batch_size, 1, length, kDim});
  attention(x_view, x_view, x_view,
            MutableTensorView(batched.data(), {batch_size, 1, length, kDim}), combined);

  // ...and each sequence alone, unpadded, under a plain causal mask.
  fmt::print(
      "Attention output (d={}, Q = K = V = token embeddings): batched vs each sequence "
      "alone\n",
      kDim);
  bool all_equal = true;
  for (int64_t b = 0; b < batch_size; ++b) {
    const int64_t real = static_cast<int64_t>(batch.tokens[b].size());
    const std::vector<float> x_alone(x.begin() + b * length * kDim,
                                     x.begin() + (b * length + real) * kDim);
    std::vector<float> alone(x_alone.size());
    const TensorView alone_view(x_alone.data(), {1, 1, real, kDim});
    attention(alone_view, alone_view, alone_view,
              MutableTensorView(alone.data(), {1, 1, real, kDim}), causal);
    double max_diff = 0.0, pad_max = 0.0;
    for (int64_t n = 0; n < real * kDim; ++n) {
      max_diff = std::max(max_diff, std::fabs(double{batched[b * length * kDim + n]} - alone[n]));
    }
    for (int64_t n = real * kDim; n < length * kDim; ++n) {
      pad_max = std::max(pad_max, std::fabs(double{batched[b * length * kDim + n]}));
    }
    const bool equal = std::equal(alone.begin(), alone.end(), batched.begin() + b * length * kDim);
    all_equal = all_equal && equal && pad_max == 0.0;
    const std::string pad_note =
        real < length ? fmt::format("its {} <pad> rows have max |O| = {:g}", length - real, pad_max)
                      : "no <pad> rows";
    fmt::print("  sequence {}: {} real tokens, max |batched - alone| = {:g} ({}); {}\n", b, real,
               max_diff, equal ? "bitwise equal" : "DIFFERENT", pad_note);
  }
  const int64_t last = batch_size - 1;
  const int64_t last_real = static_cast<int64_t>(batch.tokens[last].size());
  fmt::print("\n");
  print_matrix(
      fmt::format("Output of sequence {} in the batch (rows {}-{} are <pad> queries: zero)", last,
                  last_real, length - 1),
      std::vector<double>(batched.begin() + last * length * kDim, batched.end()), length, kDim);
  if (!heatmap_directory.empty()) write_demo_heatmaps(heatmap_directory, batch, combined, x);
  fmt::print("\n{}\n", all_equal ? "Padding changed nothing: every sequence's real tokens get "
                                   "exactly the output they get alone."
                                 : "MISMATCH: padding changed a real token's output.");
  return all_equal ? 0 : 1;
}

}  // namespace maskattn::cli
