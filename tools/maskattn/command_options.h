// Registering the commands' options with CLI11. The options several commands share are
// registered here once, each with its one validator and help text, so that they cannot drift
// apart. --help lists options in the order they are registered: that order is part of the
// contract (docs/cli.md), hence the hooks below.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "maskattn/attention.h"
#include "maskattn/cpu.h"
#include "maskattn/dtype.h"
#include "maskattn/error.h"

namespace maskattn::cli {

// A validator that runs one of the library's name parsers (parse_dtype, parse_kernel,
// parse_products) on the option's text, so an unknown name is the library's catalogued error
// (errors.md E97) here as in C++ and Python. The parser's Error leaves CLI11's parse; main.cc
// reports it as a syntax error (exit 2).
template <typename Parse>
CLI::Validator library_names(const std::string& description, const std::string& option,
                             Parse parse) {
  return CLI::Validator(
      [option, parse](std::string& text) {
        parse(text, option);
        return std::string();
      },
      description);
}

inline CLI::Option* add_mask_option(CLI::App* command, std::vector<std::string>& masks,
                                    const std::string& help) {
  return command->add_option("--mask", masks, help)->take_all()->allow_extra_args(false);
}

// --mod: the score modifiers, apart from the mask (--mask still takes their older forms).
inline CLI::Option* add_mod_option(CLI::App* command, std::vector<std::string>& mods) {
  return command
      ->add_option("--mod", mods,
                   "score modifier SPEC: softcap:X, alibi:FILE, bias:FILE, sinks:FILE, "
                   "threshold:X or a score program expr:PROGRAM[:NAME=FILE]...; repeat to combine")
      ->take_all()
      ->allow_extra_args(false);
}

inline CLI::Option* add_dtype_option(CLI::App* command, std::string& dtype,
                                     const std::string& help) {
  return command->add_option("--dtype", dtype, help)
      ->check(library_names("f32|f16|bf16", "--dtype", parse_dtype));
}

inline CLI::Option* add_threads_option(CLI::App* command, int& threads) {
  return command->add_option("--threads", threads, "threads (default: all cores)")
      ->check(CLI::Range(1, 1024));
}

inline CLI::Option* add_kernel_option(CLI::App* command, std::string& kernel) {
  return command->add_option("--kernel", kernel, "auto|reference|fused")
      ->check(library_names("auto|reference|fused", "--kernel", parse_kernel));
}

inline CLI::Option* add_products_option(CLI::App* command, std::string& products) {
  return command
      ->add_option("--products", products,
                   "product unit for bf16: auto|f32|bf16-dot|amx (default: this CPU's fastest, "
                   "see maskattn info)")
      ->check(library_names("auto|f32|bf16-dot|amx", "--products", parse_products));
}

// --ring [zigzag|contiguous] of attend and grad: run as one rank of a ring under mpirun
// (docs/distributed.md). Without a value: zigzag. --ring-stats [basic|pairs]: each rank's
// RingStats on stderr (pairs: also count its allowed pairs, O(tiles): count_allowed).
inline void add_ring_options(CLI::App* command, std::string& ring, std::string& ring_stats) {
  command
      ->add_option("--ring", ring,
                   "run as one rank of ring attention under mpirun -np P: zigzag (default) or "
                   "contiguous layout; each rank reads and writes only its rows "
                   "(docs/distributed.md; needs a build with MPI)")
      ->expected(0, 1)
      ->default_str("zigzag")
      ->check(CLI::IsMember({"zigzag", "contiguous"}));
  command
      ->add_option("--ring-stats", ring_stats,
                   "with --ring: print one 'ring_stats' line per rank on stderr (calls, bytes "
                   "sent, compute and wait seconds); 'pairs' also counts allowed pairs")
      ->expected(0, 1)
      ->default_str("basic")
      ->check(CLI::IsMember({"basic", "pairs"}));
}

// --ring-stats describes a ring: without --ring it is an error (errors.md E122).
inline void require_ring_for_stats(const std::string& ring, const std::string& ring_stats) {
  if (!ring_stats.empty() && ring.empty()) {
    throw Error("--ring-stats needs --ring: it reports the ranks of a ring run under mpirun");
  }
}

// --mask's help where the command computes attention (modifiers are --mod's, but --mask has
// always taken them and still does).
inline const char* const kMaskHelp = "mask SPEC (or a modifier SPEC, as --mod); repeat to combine";

// What the shared compute options say in --help where a command words them its own way.
struct ComputeOptionHelp {
  std::string scale = "score scale (default 1/sqrt(D))";
  std::string dtype = "compute in this dtype";
};

// The options of the commands that compute attention from files (attend, grad, mha): --mask,
// --mod, --scale, --dtype, --threads and --kernel. A command's own options that --help has always
// listed among them are registered by `after_mask` (before --scale) and `after_scale`.
template <typename Args>
void add_compute_options(CLI::App* command, Args& args, const ComputeOptionHelp& help = {},
                         const std::function<void()>& after_mask = {},
                         const std::function<void()>& after_scale = {}) {
  add_mask_option(command, args.masks, kMaskHelp);
  add_mod_option(command, args.mods);
  if (after_mask) after_mask();
  command->add_option("--scale", args.scale, help.scale);
  if (after_scale) after_scale();
  add_dtype_option(command, args.dtype, help.dtype);
  add_threads_option(command, args.threads);
  add_kernel_option(command, args.kernel);
  add_products_option(command, args.products);
}

// --dropout P [--seed S] of attend and grad: attention dropout (Options::dropout, docs/cli.md).
// The same P and S drop the same pairs in every command, kernel and ring run.
template <typename Args>
void add_dropout_options(CLI::App* command, Args& args) {
  command
      ->add_option("--dropout", args.dropout,
                   "attention dropout: drop each allowed pair with probability P, scale the kept "
                   "weights by 1/(1-P) (default 0: none)")
      ->check(CLI::Range(0.0, 1.0));
  command->add_option("--seed", args.seed,
                      "dropout's seed (default 0): the same seed drops the same pairs");
}

// The options of the commands that make their own random inputs (gradcheck, audit).
template <typename Args>
void add_random_input_options(CLI::App* command, Args& args, const std::string& default_heads) {
  command->add_option("--batch", args.batch, "batch (default 1)");
  command->add_option("--heads", args.heads, "query heads (default " + default_heads + ")");
  command->add_option("--kv-heads", args.kv_heads, "kv heads (default: --heads)");
  add_dtype_option(command, args.dtype, "f32|f16|bf16 (default f32)");
  add_kernel_option(command, args.kernel);
  command->add_option("--seed", args.seed, "random inputs' seed (default 1)");
}

}  // namespace maskattn::cli
