// maskattn audit: the leakage audit (include/maskattn/audit.h) from the command line. Exit 0 when
// the mask hides exactly what --expect hides and the kernel honours it; 1 otherwise.
#include <fmt/core.h>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "command_options.h"
#include "commands.h"
#include "maskattn/audit.h"
#include "maskattn/error.h"
#include "maskattn/mask_spec.h"
#include "npy_tensors.h"

namespace maskattn::cli {

namespace {

std::string pair_text(const AuditPair& p, bool with_key = true) {
  std::string text = fmt::format("b={} h={} query {}", p.b, p.h, p.i);
  if (with_key) text += fmt::format(" → key {}", p.j);
  return text;
}

void print_findings(const std::string& title, const std::vector<AuditPair>& pairs,
                    bool with_key = true) {
  fmt::print("{:<52} {}", title + ":", pairs.size());
  for (size_t n = 0; n < std::min<size_t>(pairs.size(), 3); ++n) {
    fmt::print("{}{}", n == 0 ? "   e.g. " : "; ", pair_text(pairs[n], with_key));
  }
  fmt::print("{}\n", pairs.size() > 3 ? "; …" : "");
}

// How many of `pairs` are relaxed pairs; both lists are in (b, h, i, j) order.
size_t count_relaxed(const std::vector<AuditPair>& pairs,
                     const std::vector<AuditRelaxedPair>& relaxed) {
  const auto order = [](const AuditPair& p) { return std::tie(p.b, p.h, p.i, p.j); };
  size_t count = 0;
  auto next = relaxed.begin();
  for (const AuditPair& pair : pairs) {
    while (next != relaxed.end() && order(next->pair) < order(pair)) ++next;
    if (next != relaxed.end() && next->pair == pair) ++count;
  }
  return count;
}

bool has_relaxing_component(const Mask& mask) {
  for (const Component& part : mask.components()) {
    if (std::holds_alternative<component::GlobalTokens>(part) ||
        std::holds_alternative<component::Spans>(part) ||
        std::holds_alternative<component::Prefix>(part)) {
      return true;
    }
  }
  return false;
}

// The relaxed pairs (audit.h): look-ahead ones, then earlier keys beyond a window, each line with
// up to three examples that name the component.
void print_relaxed(const AuditReport& r) {
  for (const bool look_ahead : {true, false}) {
    std::vector<const AuditRelaxedPair*> pairs;
    for (const AuditRelaxedPair& relaxed : r.relaxed_pairs) {
      if (relaxed.look_ahead == look_ahead) pairs.push_back(&relaxed);
    }
    fmt::print("{:<52} {}",
               look_ahead ? "look-ahead pairs allowed by global/span/prefix:"
                          : "pairs beyond a window allowed by global/span/prefix:",
               pairs.size());
    for (size_t n = 0; n < std::min<size_t>(pairs.size(), 3); ++n) {
      fmt::print("{}{}", n == 0 ? "   e.g. " : "; ", relaxed_pair_text(r, *pairs[n]));
    }
    fmt::print("{}\n", pairs.size() > 3 ? "; …" : "");
  }
}

// One (b, h) as a grid: █ allowed (as expected), · hidden (as expected), L leak, B blind spot,
// ! kernel leak; G and S mark allowed pairs that global tokens, or spans/prefix-LM, allow past a
// causal or window bound.
void print_audit_grid(const AuditReport& r, int64_t b, int64_t h) {
  const int64_t Lq = r.shape.q_len, Lk = r.shape.k_len, H = r.shape.q_heads;
  std::vector<char> relaxed(static_cast<size_t>(Lq * Lk), 0);
  for (const AuditRelaxedPair& pair : r.relaxed_pairs) {
    if (pair.pair.b != b || pair.pair.h != h) continue;
    const bool global = pair.reason != Relaxation::span && pair.reason != Relaxation::prefix;
    relaxed[static_cast<size_t>(pair.pair.i * Lk + pair.pair.j)] = global ? 'G' : 'S';
  }
  fmt::print(
      "\nb={} h={}: █ allowed   · hidden   L leak (allowed, expected hidden)   B blind spot "
      "(hidden, expected allowed)   ! hidden but influenced (kernel){}\n",
      b, h,
      r.relaxed_pairs.empty()
          ? ""
          : "   G/S allowed past causal/window by global tokens / a span or prefix");
  for (int64_t i = 0; i < Lq; ++i) {
    std::string line = fmt::format("{:>5} ", i);
    for (int64_t j = 0; j < Lk; ++j) {
      const size_t n = static_cast<size_t>(((b * H + h) * Lq + i) * Lk + j);
      const bool allowed = r.allowed.values()[n] != 0;
      const bool expected = r.has_expected ? r.expected.values()[n] != 0 : allowed;
      if (!allowed && r.influence.values()[n]) {
        line += "!";
      } else if (allowed && !expected) {
        line += "L";
      } else if (!allowed && expected) {
        line += "B";
      } else if (relaxed[static_cast<size_t>(i * Lk + j)] != 0) {
        line += relaxed[static_cast<size_t>(i * Lk + j)];
      } else {
        line += allowed ? "█" : "·";
      }
    }
    fmt::print("{}\n", line);
  }
}

}  // namespace

int run_audit(const AuditArgs& args) {
  Mask mask, expected;
  ScoreMods mods, expected_mods;
  for (const std::string& spec : args.masks) apply_mask_spec(spec, mask, mods, spec);
  for (const std::string& spec : args.mods) apply_mod_spec(spec, mods, spec);
  for (const std::string& spec : args.expect) {
    apply_mask_spec(spec, expected, expected_mods, spec);
  }
  AuditOptions options;
  options.batch = args.batch;
  options.q_heads = args.heads;
  options.kv_heads = args.kv_heads;
  options.q_len = args.q_len;
  options.k_len = args.k_len;
  options.head_dim = args.dim;
  options.dtype = parse_dtype(args.dtype, "--dtype");
  options.kernel = parse_kernel(args.kernel, "--kernel");
  options.seed = args.seed;
  AuditReport r;
  try {
    r = audit_mask(mask, mods, args.expect.empty() ? nullptr : &expected, options);
  } catch (const Error& error) {
    std::vector<std::string> specs = args.masks;
    specs.insert(specs.end(), args.mods.begin(), args.mods.end());
    specs.insert(specs.end(), args.expect.begin(), args.expect.end());
    throw Error(naming_program_spec(error.what(), specs));
  }

  fmt::print("audit: mask {}; expected {}\n", mask.describe(),
             args.expect.empty() ? "(not given: only the kernel is checked)" : expected.describe());
  fmt::print("B={} Hq={} Lq={} Lk={} D={}, kernel {}, {}, seed {}: {} allowed pairs, {} hidden\n",
             r.shape.batch, r.shape.q_heads, r.shape.q_len, r.shape.k_len, args.dim, args.kernel,
             args.dtype, args.seed, r.allowed_count, r.hidden_count);
  fmt::print("Each key and value was perturbed in turn and the outputs it changed recorded.\n\n");
  print_findings("kernel leaks (hidden pairs that changed an output)", r.kernel_leaks);
  if (r.has_expected) {
    print_findings("leaks (allowed, but expected hidden)", r.leaks);
    const size_t relaxed_leaks = count_relaxed(r.leaks, r.relaxed_pairs);
    if (relaxed_leaks > 0) {
      fmt::print("{:<52} {} (listed below)\n",
                 "  of which allowed past causal/window by global/span/prefix:", relaxed_leaks);
    }
    print_findings("blind spots (hidden, but expected allowed)", r.blind_spots);
  }
  print_findings("rows that see no key (their output is 0)", r.empty_rows, false);
  print_findings("silent pairs (allowed, no measurable influence)", r.silent_pairs);
  if (has_relaxing_component(mask)) print_relaxed(r);

  // The grid of the first (b, h) with a finding, else of (0, 0).
  const std::vector<AuditPair>* lists[] = {&r.kernel_leaks, &r.leaks, &r.blind_spots};
  AuditPair first{};
  for (const auto* list : lists) {
    if (!list->empty()) {
      first = list->front();
      break;
    }
  }
  if (r.shape.q_len <= 64 && r.shape.k_len <= 120) print_audit_grid(r, first.b, first.h);

  if (r.passed()) {
    fmt::print("\naudit: passed\n");
    return 0;
  }
  fmt::print("\naudit: FAILED\n");
  fmt::print(stderr, "maskattn: error: audit failed: {} kernel leaks, {} leaks, {} blind spots\n",
             r.kernel_leaks.size(), r.leaks.size(), r.blind_spots.size());
  return 1;
}

Command add_audit_command(CLI::App& app) {
  auto args = std::make_shared<AuditArgs>();
  CLI::App* command = app.add_subcommand(
      "audit", "leakage audit: perturb every key and value, compare what changes with the mask");
  add_mask_option(command, args->masks, "the mask under test (SPECs as in attend)");
  add_mod_option(command, args->mods);
  command->add_option("--expect", args->expect, "the mask you meant (SPECs); optional")
      ->take_all()
      ->allow_extra_args(false);
  command->add_option("--lq", args->q_len, "queries")->required();
  command->add_option("--lk", args->k_len, "keys")->required();
  command->add_option("--d", args->dim, "head dim of the random inputs (default 8)");
  add_random_input_options(command, *args, "1");
  command->footer(mask_spec_help());
  return {command, [args] { return run_audit(*args); }};
}

}  // namespace maskattn::cli
