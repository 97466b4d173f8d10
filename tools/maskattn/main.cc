// maskattn: the command-line front end. Subcommands: attend, example, mask, demo.
// Every failure is one line on stderr and a non-zero exit: 2 for bad command-line syntax, 1 for
// invalid input (maskattn::Error) or any other failure.
#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "commands.h"
#include "maskattn/error.h"
#include "maskattn/mask_spec.h"

namespace {

std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

int fail(const std::string& message, int code) {
  fmt::print(stderr, "maskattn: error: {}\n", one_line(message));
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace maskattn::cli;
  CLI::App app{"maskattn: masked scaled-dot-product attention, exact and explained"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "maskattn 0.1.0");

  AttendArgs attend;
  CLI::App* attend_cmd = app.add_subcommand(
      "attend", "O = softmax(scale·Q·Kᵀ + mask)·V for .npy inputs ([L,D], [B,L,D] or [B,H,L,D])");
  attend_cmd->add_option("--q", attend.q, "queries .npy (float32/float16)")->required();
  attend_cmd->add_option("--k", attend.k, "keys .npy")->required();
  attend_cmd->add_option("--v", attend.v, "values .npy")->required();
  attend_cmd->add_option("--out", attend.out, "output .npy (the input's dtype; f32 for bf16)")
      ->required();
  attend_cmd->add_option("--mask", attend.masks, "mask or modifier SPEC; repeat to combine")
      ->take_all()
      ->allow_extra_args(false);
  attend_cmd->add_option("--scale", attend.scale, "score scale (default 1/sqrt(D))");
  attend_cmd->add_option("--lse", attend.lse, "also write the log-sum-exp [B,H,Lq] (f32)");
  attend_cmd->add_option("--weights", attend.weights,
                         "also write the weights [B,H,Lq,Lk] (f32; debug, O(Lq·Lk) memory)");
  attend_cmd->add_option("--dtype", attend.dtype, "compute in this dtype")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  attend_cmd->add_option("--threads", attend.threads, "threads (default: all cores)")
      ->check(CLI::Range(1, 1024));
  attend_cmd->add_option("--kernel", attend.kernel, "auto|reference|fused")
      ->check(CLI::IsMember({"auto", "reference", "fused"}));
  attend_cmd
      ->add_option("--repeat", attend.repeat,
                   "time the computation: 1 warm-up, then R runs; prints 'time_ms median=X min=Y "
                   "max=Z' on stderr")
      ->check(CLI::Range(1, 1000000));
  attend_cmd->footer(maskattn::mask_spec_help());

  app.add_subcommand("example", "the worked example of seed 001 (\"I love dog\"), step by step");

  MaskArgs mask_args;
  CLI::App* mask_cmd =
      app.add_subcommand("mask", "draw a mask as an allowed/hidden grid in the terminal");
  mask_cmd->add_option("specs", mask_args.specs, "mask SPECs")->required();
  mask_cmd->add_option("--lq", mask_args.q_len, "number of queries")->required();
  mask_cmd->add_option("--lk", mask_args.k_len, "number of keys")->required();
  mask_cmd->add_option("--batch", mask_args.batch, "which sequence of the batch (default 0)");
  mask_cmd->add_option("--head", mask_args.head, "which query head (default 0)");
  mask_cmd->footer(maskattn::mask_spec_help());

  app.add_subcommand("demo", "the tour: worked example, padded batch, masks as grids");

  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (const CLI::App* command : app.get_subcommands({})) known |= command->get_name() == argv[1];
    if (!known) {
      return fail(std::string("unknown command '") + argv[1] +
                      "' (commands: attend, example, mask, demo; see maskattn --help)",
                  2);
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForVersion& version) {
    return app.exit(version);
  } catch (const CLI::ParseError& error) {
    return fail(std::string(error.what()) + " (see maskattn --help)", 2);
  }

  try {
    if (attend_cmd->parsed()) return run_attend(attend);
    if (app.got_subcommand("example")) return run_example();
    if (mask_cmd->parsed()) return run_mask(mask_args);
    if (app.got_subcommand("demo")) return run_demo();
  } catch (const maskattn::Error& error) {
    return fail(error.what(), 1);
  } catch (const std::bad_alloc&) {
    return fail("out of memory: the request needs more memory than is available", 1);
  } catch (const std::exception& error) {
    return fail(error.what(), 1);
  }
  return 1;
}
