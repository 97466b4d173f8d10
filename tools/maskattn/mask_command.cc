// maskattn mask SPEC... --lq N --lk M [--batch b] [--head h] [--png F] [--svg F] [--tokens F]:
// the allowed/hidden grid of one (batch, head) in the terminal, and heatmaps of every head.
#include <fmt/core.h>

#include <algorithm>
#include <memory>
#include <variant>

#include "command_options.h"
#include "commands.h"
#include "heatmap_files.h"
#include "maskattn/attention.h"
#include "maskattn/error.h"
#include "maskattn/heatmap.h"
#include "maskattn/mask_spec.h"
#include "npy_tensors.h"
#include "print.h"

namespace maskattn::cli {

namespace {

// The batch size and head count the mask's own arrays imply (0 = not constrained).
struct Extent {
  int64_t batch = 0;
  int64_t heads = 0;
};

void widen_to(int64_t& current, int64_t size) {
  current = std::max(current, size);
}

Extent implied_extent(const Mask& mask, const ScoreMods& mods) {
  Extent extent;
  const auto dense = [&](const Dims& shape) {
    // Aligned at the right against [B, Hq, Lq, Lk]; size-1 axes broadcast.
    const int rank = static_cast<int>(shape.size());
    if (rank == 4 && shape[0] != 1) widen_to(extent.batch, shape[0]);
    if (rank >= 3 && shape[rank - 3] != 1) widen_to(extent.heads, shape[rank - 3]);
  };
  for (const Component& part : mask.components()) {
    std::visit(
        [&](const auto& c) {
          using T = std::decay_t<decltype(c)>;
          if constexpr (std::is_same_v<T, component::Padding>) {
            widen_to(extent.batch, c.values.dim(0));
          } else if constexpr (std::is_same_v<T, component::Segments> ||
                               std::is_same_v<T, component::Spans>) {
            widen_to(extent.batch, c.key_ids.dim(0));
          } else if constexpr (std::is_same_v<T, component::GlobalTokens>) {
            // [1, L] ids (an [L] file) hold for every sequence: they do not fix B.
            for (const Array<int64_t>* ids : {&c.query_ids, &c.key_ids}) {
              if (ids->dim(0) != 1) widen_to(extent.batch, ids->dim(0));
            }
          } else if constexpr (std::is_same_v<T, component::Tree>) {
            if (c.parents.dim(0) != 1) widen_to(extent.batch, c.parents.dim(0));  // [B,T]
          } else if constexpr (std::is_same_v<T, component::BlockSparse>) {
            dense(c.layout.shape());  // [.., nQ, nK] aligns at the right like a dense mask
          } else if constexpr (std::is_same_v<T, component::DenseBool> ||
                               std::is_same_v<T, component::DenseAdditive>) {
            dense(c.values.shape());
          }
          if constexpr (requires { c.heads; }) {
            widen_to(extent.heads, c.heads.max_head() + 1);
          }
        },
        part);
  }
  widen_to(extent.heads, static_cast<int64_t>(mods.alibi_slopes.size()));
  widen_to(extent.heads, static_cast<int64_t>(mods.sinks.size()));
  if (mods.bias) dense(mods.bias->shape());
  return extent;
}

// The indices t of row `row` (0 for [1, L] ids) with ids ≠ 0, as "0 6 11"; "none" when empty.
std::string global_indices(const Array<int64_t>& ids, int64_t batch) {
  const int64_t row = ids.dim(0) == 1 ? 0 : batch;
  std::string text;
  for (int64_t t = 0; t < ids.dim(1); ++t) {
    if (ids.at(row, t) != 0) text += (text.empty() ? "" : " ") + std::to_string(t);
  }
  return text.empty() ? "none" : text;
}

// A draft tree under the grid: its parents and each token's depth, so that the rows can be read
// back to the tree (rows and columns of the draft are its last T; row indices, bottom-right).
void print_tree_note(const component::Tree& tree, const std::string& label, int64_t batch) {
  std::string parents, depths;
  std::vector<int64_t> depth(tree.size());
  for (int64_t t = 0; t < tree.size(); ++t) {
    const int64_t parent = tree.parents.at(tree.row_of(batch), t);
    depth[t] = parent < 0 ? 0 : depth[parent] + 1;
    parents += (t > 0 ? " " : "") + std::to_string(parent);
    depths += (t > 0 ? " " : "") + std::to_string(depth[t]);
  }
  fmt::print(
      "{}: the last {} keys and queries are draft tokens 0-{} with parents {} (depths {}); a "
      "draft query sees the keys before the draft, its ancestors and itself\n",
      label, tree.size(), tree.size() - 1, parents, depths);
}

// Under the grid: which tokens are global and what blocks a layout has, so that the grid's
// full rows and columns and its block pattern can be read back to the files.
void print_sparse_notes(const Mask& mask, int64_t batch) {
  for (size_t n = 0; n < mask.components().size(); ++n) {
    const Component& part = mask.components()[n];
    const std::string& label = mask.labels()[n];
    if (const auto* global = std::get_if<component::GlobalTokens>(&part)) {
      fmt::print("{}: global queries {}, global keys {} (they pass causal and window bounds)\n",
                 label, global_indices(global->query_ids, batch),
                 global_indices(global->key_ids, batch));
    } else if (const auto* sparse = std::get_if<component::BlockSparse>(&part)) {
      fmt::print("{}: layout {} of blocks of {} {} × {} {} (row/column indices)\n", label,
                 shape_string(sparse->layout.shape()), sparse->block_q,
                 sparse->block_q == 1 ? "query" : "queries", sparse->block_k,
                 sparse->block_k == 1 ? "key" : "keys");
    } else if (const auto* tree = std::get_if<component::Tree>(&part)) {
      print_tree_note(*tree, label, batch);
    } else if (const auto* program = std::get_if<component::ProgramMask>(&part)) {
      // A program ignores the alignment printed above: say so, with the text it compiled to.
      fmt::print("{}: program `{}` over row indices q, kv (top-left, whatever the alignment)\n",
                 label, program->program.text());
    }
  }
}

// allowed_pairs of (batch, head), with a program's errors naming its SPEC (npy_tensors.h).
Array<uint8_t> allowed_slice(const Mask& mask, const MaskShape& shape, int64_t batch, int64_t head,
                             const std::vector<std::string>& specs) {
  try {
    return allowed_pairs(mask, shape, batch, head);
  } catch (const Error& error) {
    throw Error(naming_program_spec(error.what(), specs));
  }
}

}  // namespace

int run_mask(const MaskArgs& args) {
  Mask mask;
  ScoreMods mods;
  for (const std::string& spec : args.specs) apply_mask_spec(spec, mask, mods, spec);
  if (args.q_len < 0 || args.k_len < 0) {
    throw Error("--lq " + std::to_string(args.q_len) + " --lk " + std::to_string(args.k_len) +
                ": lengths must be ≥ 0");
  }
  if (args.batch < 0 || args.head < 0) {
    throw Error("--batch and --head must be ≥ 0 (got " + std::to_string(args.batch) + ", " +
                std::to_string(args.head) + ")");
  }
  const Extent extent = implied_extent(mask, mods);
  if (extent.batch > 0 && args.batch >= extent.batch) {
    throw Error("--batch " + std::to_string(args.batch) +
                " is out of range: the mask files have B=" + std::to_string(extent.batch));
  }
  if (extent.heads > 0 && args.head >= extent.heads) {
    throw Error("--head " + std::to_string(args.head) +
                " is out of range: the mask has Hq=" + std::to_string(extent.heads));
  }
  const MaskShape shape = {std::max(extent.batch, args.batch + 1),
                           std::max(extent.heads, args.head + 1), args.q_len, args.k_len};
  const Array<uint8_t> slice = allowed_slice(mask, shape, args.batch, args.head, args.specs);
  fmt::print("mask: {}\n", mask.describe());
  fmt::print("batch {} of B={}, head {} of Hq={}; Lq={}, Lk={}, {} aligned\n", args.batch,
             shape.batch, args.head, shape.q_heads, args.q_len, args.k_len,
             mask.alignment() == Alignment::top_left ? "top-left" : "bottom-right");
  if (!mods.empty()) {
    fmt::print(
        "score modifiers (softcap, ALiBi, bias, sinks, threshold) change weights, not this "
        "grid; a threshold can hide more pairs at run time\n");
  }
  fmt::print(
      "█ allowed   · hidden   rows: queries i, columns: keys j, right: allowed keys per "
      "row\n\n");
  print_grid(slice.values(), args.q_len, args.k_len);
  print_sparse_notes(mask, args.batch);
  if (!args.png.empty() || !args.svg.empty()) {
    // Every head of the selected batch entry, one panel each (at most 16).
    std::vector<HeatmapPanel> panels;
    for (int64_t h = 0; h < std::min<int64_t>(shape.q_heads, 16); ++h) {
      HeatmapPanel panel;
      panel.title = "b=" + std::to_string(args.batch) + " h=" + std::to_string(h);
      panel.rows = args.q_len;
      panel.cols = args.k_len;
      panel.allowed = allowed_slice(mask, shape, args.batch, h, args.specs).values();
      panels.push_back(std::move(panel));
    }
    const HeatmapLabels labels =
        token_labels(args.tokens, args.q_len, args.k_len, mask.alignment() == Alignment::top_left);
    if (args.q_len == 0 || args.k_len == 0) {
      throw Error("--png/--svg: nothing to draw for Lq=" + std::to_string(args.q_len) +
                  ", Lk=" + std::to_string(args.k_len));
    }
    for (const std::string& path : {args.png, args.svg}) {
      if (path.empty()) continue;
      write_heatmap(path, panels, labels);
      fmt::print("wrote {}\n", path);
    }
  }
  return 0;
}

Command add_mask_command(CLI::App& app) {
  auto args = std::make_shared<MaskArgs>();
  CLI::App* command =
      app.add_subcommand("mask", "draw a mask as an allowed/hidden grid in the terminal");
  command->add_option("specs", args->specs, "mask SPECs")->required();
  command->add_option("--lq", args->q_len, "number of queries")->required();
  command->add_option("--lk", args->k_len, "number of keys")->required();
  command->add_option("--batch", args->batch, "which sequence of the batch (default 0)");
  command->add_option("--head", args->head, "which query head (default 0)");
  command->add_option("--png", args->png, "also draw every head of --batch as a PNG heatmap");
  command->add_option("--svg", args->svg, "also draw every head of --batch as an SVG heatmap");
  command->add_option("--tokens", args->tokens,
                      "heatmap labels: a text file of whitespace-separated tokens, one per key");
  command->footer(mask_spec_help());
  return {command, [args] { return run_mask(*args); }};
}

}  // namespace maskattn::cli
