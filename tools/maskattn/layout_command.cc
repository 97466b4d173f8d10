// maskattn layout bigbird|strided|fixed --blocks N ... --out FILE.npy: writes one of the common
// block-sparse layouts (include/maskattn/sparse_layouts.h builds it; this command only parses,
// writes and draws) as a uint8 .npy, the FILE of `--mask block-sparse:BQ:BK:FILE`. The file is
// written under a temporary name and renamed, so a failed run leaves no file behind.
#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include <unistd.h>

#include "command_options.h"
#include "commands.h"
#include "maskattn/error.h"
#include "maskattn/memory.h"
#include "maskattn/npy.h"
#include "maskattn/sparse_layouts.h"
#include "print.h"

namespace maskattn::cli {

namespace {

// Layouts up to this many blocks a side are drawn in the terminal.
constexpr int64_t kMaxDrawnBlocks = 64;

Array<uint8_t> build_layout(const LayoutArgs& args) {
  require_memory(2.0 * std::max<int64_t>(args.heads, 1) * static_cast<double>(args.blocks) *
                     static_cast<double>(args.blocks),
                 "layout " + args.kind + " with " + std::to_string(args.blocks) + " blocks");
  if (args.kind == "bigbird") {
    BigBirdLayout config;
    config.sliding_blocks = args.sliding;
    config.global_blocks = args.global;
    config.random_blocks = args.random;
    config.seed = args.seed;
    return bigbird_layout(args.blocks, config, args.heads);
  }
  if (args.kind == "strided") {
    return strided_layout(args.blocks, args.local, args.stride, !args.bidirectional, args.heads);
  }
  return fixed_layout(args.blocks, args.chunk, args.summary, !args.bidirectional, args.heads);
}

// What the layout was built from, as the options that rebuild it.
std::string recipe(const LayoutArgs& args) {
  std::string text = args.kind + " --blocks " + std::to_string(args.blocks);
  if (args.kind == "bigbird") {
    text += fmt::format(" --sliding {} --global {} --random {} --seed {}", args.sliding,
                        args.global, args.random, args.seed);
  } else if (args.kind == "strided") {
    text += fmt::format(" --local {} --stride {}", args.local, args.stride);
  } else {
    text += fmt::format(" --chunk {} --summary {}", args.chunk, args.summary);
  }
  if (args.kind != "bigbird" && args.bidirectional) text += " --bidirectional";
  if (args.heads > 0) text += " --heads " + std::to_string(args.heads);
  return text;
}

// Written next to `path` and renamed onto it: either the whole file appears or none.
void write_layout(const std::string& path, const Array<uint8_t>& layout) {
  const std::string temporary = path + ".tmp-" + std::to_string(getpid());
  try {
    write_npy(temporary, NpyArray(NpyType::u1, layout.shape(), layout.values()));
  } catch (const Error& error) {
    std::remove(temporary.c_str());
    throw Error("cannot write '" + path + "': " + error.what());
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::remove(temporary.c_str());
    throw Error("cannot write '" + path + "': " + error.message());
  }
}

void print_layout(const LayoutArgs& args, const Array<uint8_t>& layout) {
  const int64_t blocks = args.blocks, heads = std::max<int64_t>(args.heads, 1);
  const int64_t per_head = blocks * blocks;
  fmt::print("wrote {}: uint8 {}, 1 = query block r may attend key block c ({})\n", args.out,
             shape_string(layout.shape()), recipe(args));
  for (int64_t h = 0; h < heads; ++h) {
    const auto first = layout.values().begin() + h * per_head;
    const int64_t allowed = std::count(first, first + per_head, uint8_t{1});
    fmt::print("{}{} of {} blocks allowed ({:.1f}%)\n",
               args.heads > 0 ? fmt::format("head {}: ", h) : std::string(), allowed, per_head,
               100.0 * static_cast<double>(allowed) / static_cast<double>(per_head));
  }
  fmt::print(
      "use it as --mask block-sparse:BQ:BK:{} with Lq in ({}·BQ, {}·BQ], Lk in ({}·BK, "
      "{}·BK]\n",
      args.out, blocks - 1, blocks, blocks - 1, blocks);
  if (blocks > kMaxDrawnBlocks) return;
  fmt::print("\n{}rows: query blocks r, columns: key blocks c, right: allowed blocks per row\n",
             args.heads > 1 ? "head 0: " : "");
  const std::vector<uint8_t> head0(layout.values().begin(), layout.values().begin() + per_head);
  print_grid(head0, blocks, blocks, {}, "key blocks");
}

CLI::App* add_layout_kind(CLI::App* layout, LayoutArgs& args, const std::string& kind,
                          const std::string& help) {
  CLI::App* command = layout->add_subcommand(kind, help);
  command->add_option("--blocks", args.blocks, "blocks per side: ceil(L / block size)")
      ->required()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  command->parse_complete_callback([&args, kind] { args.kind = kind; });
  return command;
}

void add_common_tail(CLI::App* command, LayoutArgs& args) {
  command
      ->add_option("--heads", args.heads,
                   "write [H,N,N], one layout per head (default 0: one [N,N] layout)")
      ->check(CLI::Range(0, 4096));
  command->add_option("--out", args.out, "the layout .npy to write (uint8 0/1)")->required();
}

}  // namespace

int run_layout(const LayoutArgs& args) {
  const Array<uint8_t> layout = build_layout(args);
  write_layout(args.out, layout);
  print_layout(args, layout);
  return 0;
}

Command add_layout_command(CLI::App& app) {
  auto args = std::make_shared<LayoutArgs>();
  CLI::App* layout = app.add_subcommand(
      "layout", "write a block-sparse layout .npy (BigBird, strided, fixed) for block-sparse:");
  layout->require_subcommand(1);

  CLI::App* bigbird = add_layout_kind(
      layout, *args, "bigbird",
      "BigBird: sliding blocks around the diagonal, global first/last blocks, random blocks");
  bigbird->add_option("--sliding", args->sliding, "sliding blocks, odd, centred (default 3)")
      ->check(CLI::Range(1, 1 << 20));
  bigbird
      ->add_option("--global", args->global,
                   "global blocks: the first ceil(G/2) and the last floor(G/2) (default 2)")
      ->check(CLI::Range(0, 1 << 20));
  bigbird->add_option("--random", args->random, "random blocks per other row (default 3)")
      ->check(CLI::Range(0, 1 << 20));
  bigbird->add_option("--seed", args->seed, "the random blocks' seed (default 0)");
  add_common_tail(bigbird, *args);

  CLI::App* strided = add_layout_kind(
      layout, *args, "strided",
      "Sparse Transformer strided: the --local nearest blocks and every --stride-th block");
  strided->add_option("--local", args->local, "blocks c with |r - c| < L")
      ->required()
      ->check(CLI::Range(1, 1 << 20));
  strided->add_option("--stride", args->stride, "blocks c with (r - c) mod S == 0")
      ->required()
      ->check(CLI::Range(1, 1 << 20));
  strided->add_flag("--bidirectional", args->bidirectional,
                    "also blocks after the row's own (default: causal, c <= r)");
  add_common_tail(strided, *args);

  CLI::App* fixed = add_layout_kind(
      layout, *args, "fixed",
      "Sparse Transformer fixed: the row's chunk of --chunk blocks, and the last --summary "
      "blocks of every chunk");
  fixed->add_option("--chunk", args->chunk, "blocks per chunk")
      ->required()
      ->check(CLI::Range(1, 1 << 20));
  fixed->add_option("--summary", args->summary, "summary blocks at the end of each chunk (<= C)")
      ->required()
      ->check(CLI::Range(0, 1 << 20));
  fixed->add_flag("--bidirectional", args->bidirectional,
                  "also blocks after the row's own (default: causal, c <= r)");
  add_common_tail(fixed, *args);

  return {layout, [args] { return run_layout(*args); }};
}

}  // namespace maskattn::cli
