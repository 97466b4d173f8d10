// maskattn: the command-line front end. Subcommands: attend, grad, gradcheck, audit, example, mask,
// mha, demo. Every failure is one line on stderr and a non-zero exit: 2 for bad command-line
// syntax, 1 for invalid input (maskattn::Error) or any other failure.
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

// The options of the commands that make their own random inputs (gradcheck, audit).
template <typename Args>
void add_random_input_options(CLI::App* command, Args& args, const std::string& default_heads) {
  command->add_option("--batch", args.batch, "batch (default 1)");
  command->add_option("--heads", args.heads, "query heads (default " + default_heads + ")");
  command->add_option("--kv-heads", args.kv_heads, "kv heads (default: --heads)");
  command->add_option("--dtype", args.dtype, "f32|f16|bf16 (default f32)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  command->add_option("--kernel", args.kernel, "auto|reference|fused")
      ->check(CLI::IsMember({"auto", "reference", "fused"}));
  command->add_option("--seed", args.seed, "random inputs' seed (default 1)");
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
  attend_cmd->add_flag("--report", attend.report,
                       "print a numeric health report per head (score range, max logit, weight "
                       "entropy, hidden share, empty rows, NaN/Inf) and mask warnings");
  attend_cmd->add_option("--heatmap", attend.heatmap,
                         "also draw the weights, one panel per (batch, head): FILE.png or "
                         "FILE.svg (hidden pairs hatched grey)");
  attend_cmd->add_option("--tokens", attend.tokens,
                         "heatmap labels: a text file of whitespace-separated tokens, one per key");
  attend_cmd->footer(maskattn::mask_spec_help());

  GradArgs grad;
  CLI::App* grad_cmd = app.add_subcommand(
      "grad", "dQ, dK, dV of attention for .npy inputs and dO (forward recomputed)");
  grad_cmd->add_option("--q", grad.q, "queries .npy (float32/float16)")->required();
  grad_cmd->add_option("--k", grad.k, "keys .npy")->required();
  grad_cmd->add_option("--v", grad.v, "values .npy")->required();
  grad_cmd->add_option("--dout", grad.dout, "dL/dO .npy, the output's shape")->required();
  grad_cmd->add_option("--dq", grad.dq, "dL/dQ output .npy (q's layout and dtype)")->required();
  grad_cmd->add_option("--dk", grad.dk, "dL/dK output .npy")->required();
  grad_cmd->add_option("--dv", grad.dv, "dL/dV output .npy")->required();
  grad_cmd->add_option("--mask", grad.masks, "mask or modifier SPEC; repeat to combine")
      ->take_all()
      ->allow_extra_args(false);
  grad_cmd->add_option("--scale", grad.scale, "score scale (default 1/sqrt(D))");
  grad_cmd->add_option("--dtype", grad.dtype, "compute in this dtype")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  grad_cmd->add_option("--threads", grad.threads, "threads (default: all cores)")
      ->check(CLI::Range(1, 1024));
  grad_cmd->add_option("--kernel", grad.kernel, "auto|reference|fused")
      ->check(CLI::IsMember({"auto", "reference", "fused"}));
  grad_cmd->footer(maskattn::mask_spec_help());

  GradcheckArgs check;
  CLI::App* check_cmd = app.add_subcommand(
      "gradcheck", "check the backward against finite differences on random inputs");
  check_cmd->add_option("--mask", check.masks, "mask or modifier SPEC; repeat to combine")
      ->take_all()
      ->allow_extra_args(false);
  check_cmd->add_option("--lq", check.q_len, "queries (default 8)");
  check_cmd->add_option("--lk", check.k_len, "keys (default 8)");
  check_cmd->add_option("--d", check.dim, "query/key head dim (default 4)");
  check_cmd->add_option("--dv", check.value_dim, "value head dim (default 4)");
  add_random_input_options(check_cmd, check, "2");
  check_cmd->add_option("--scale", check.scale, "score scale (default 1/sqrt(D))");
  check_cmd->add_option("--threads", check.threads, "threads (default: all cores)")
      ->check(CLI::Range(1, 1024));
  check_cmd->add_option("--step", check.step, "finite-difference step (default 1e-3)");
  check_cmd->add_option("--tolerance", check.tolerance,
                        "max relative error (default f32 1e-4, f16 1e-2, bf16 5e-2)");
  check_cmd->footer(maskattn::mask_spec_help());

  app.add_subcommand("example", "the worked example of seed 001 (\"I love dog\"), step by step");

  MaskArgs mask_args;
  CLI::App* mask_cmd =
      app.add_subcommand("mask", "draw a mask as an allowed/hidden grid in the terminal");
  mask_cmd->add_option("specs", mask_args.specs, "mask SPECs")->required();
  mask_cmd->add_option("--lq", mask_args.q_len, "number of queries")->required();
  mask_cmd->add_option("--lk", mask_args.k_len, "number of keys")->required();
  mask_cmd->add_option("--batch", mask_args.batch, "which sequence of the batch (default 0)");
  mask_cmd->add_option("--head", mask_args.head, "which query head (default 0)");
  mask_cmd->add_option("--png", mask_args.png, "also draw every head of --batch as a PNG heatmap");
  mask_cmd->add_option("--svg", mask_args.svg, "also draw every head of --batch as an SVG heatmap");
  mask_cmd->add_option("--tokens", mask_args.tokens,
                       "heatmap labels: a text file of whitespace-separated tokens, one per key");
  mask_cmd->footer(maskattn::mask_spec_help());

  AuditArgs audit;
  CLI::App* audit_cmd = app.add_subcommand(
      "audit", "leakage audit: perturb every key and value, compare what changes with the mask");
  audit_cmd->add_option("--mask", audit.masks, "the mask under test (SPECs as in attend)")
      ->take_all()
      ->allow_extra_args(false);
  audit_cmd->add_option("--expect", audit.expect, "the mask you meant (SPECs); optional")
      ->take_all()
      ->allow_extra_args(false);
  audit_cmd->add_option("--lq", audit.q_len, "queries")->required();
  audit_cmd->add_option("--lk", audit.k_len, "keys")->required();
  audit_cmd->add_option("--d", audit.dim, "head dim of the random inputs (default 8)");
  add_random_input_options(audit_cmd, audit, "1");
  audit_cmd->footer(maskattn::mask_spec_help());

  MhaArgs mha;
  CLI::App* mha_cmd = app.add_subcommand(
      "mha", "a multi-head attention layer (PyTorch-named .npy weights) over [B,L,E] inputs");
  mha_cmd->add_option("--query", mha.query, "queries .npy [B,L,E] (float32/float16)")->required();
  mha_cmd->add_option("--key", mha.key, "keys .npy [B,Lk,Ek] (cross-attention; with --value)");
  mha_cmd->add_option("--value", mha.value, "values .npy [B,Lk,Ev] (with --key)");
  mha_cmd
      ->add_option("--weights", mha.weights,
                   "directory of in_proj_weight.npy (or q/k/v_proj_weight.npy), "
                   "out_proj.weight.npy and optionally in_proj_bias.npy, out_proj.bias.npy")
      ->required();
  mha_cmd->add_option("--heads", mha.heads, "query heads")->required()->check(CLI::PositiveNumber);
  mha_cmd->add_option("--kv-heads", mha.kv_heads, "kv heads (default: --heads)")
      ->check(CLI::PositiveNumber);
  mha_cmd->add_option("--out", mha.out, "output .npy [B,L,E] (the query's dtype; f32 for bf16)")
      ->required();
  mha_cmd->add_option("--mask", mha.masks, "mask or modifier SPEC; repeat to combine")
      ->take_all()
      ->allow_extra_args(false);
  mha_cmd->add_flag("--incremental", mha.incremental,
                    "feed the queries one at a time through a KV cache (causal) and write the "
                    "concatenated outputs");
  mha_cmd->add_option("--scale", mha.scale, "score scale (default 1/sqrt(head dim))");
  mha_cmd->add_option("--dtype", mha.dtype, "compute (and cache) in this dtype")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  mha_cmd->add_option("--threads", mha.threads, "threads (default: all cores)")
      ->check(CLI::Range(1, 1024));
  mha_cmd->add_option("--kernel", mha.kernel, "auto|reference|fused")
      ->check(CLI::IsMember({"auto", "reference", "fused"}));
  mha_cmd->footer(maskattn::mask_spec_help());

  std::string demo_heatmaps = "maskattn-demo";
  CLI::App* demo_cmd = app.add_subcommand(
      "demo", "the tour: worked example, padded batch, masks as grids, heatmap files");
  demo_cmd->add_option("--heatmaps", demo_heatmaps,
                       "directory for the heatmap files (default maskattn-demo; '' = none)");

  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (const CLI::App* command : app.get_subcommands({})) known |= command->get_name() == argv[1];
    if (!known) {
      return fail(std::string("unknown command '") + argv[1] +
                      "' (commands: attend, grad, gradcheck, audit, example, mask, mha, demo; see "
                      "maskattn --help)",
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
    if (grad_cmd->parsed()) return run_grad(grad);
    if (audit_cmd->parsed()) return run_audit(audit);
    if (check_cmd->parsed()) return run_gradcheck(check);
    if (app.got_subcommand("example")) return run_example();
    if (mask_cmd->parsed()) return run_mask(mask_args);
    if (mha_cmd->parsed()) return run_mha(mha);
    if (demo_cmd->parsed()) return run_demo(demo_heatmaps);
  } catch (const maskattn::Error& error) {
    return fail(error.what(), 1);
  } catch (const std::bad_alloc&) {
    return fail("out of memory: the request needs more memory than is available", 1);
  } catch (const std::exception& error) {
    return fail(error.what(), 1);
  }
  return 1;
}
