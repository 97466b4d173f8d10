// maskattn attend: O = attention(Q, K, V, mask) from .npy files. The flags are a fixed contract
// (docs/cli.md): scripts depend on them.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "command_options.h"
#include "commands.h"
#include "heatmap_files.h"
#include "maskattn/attention.h"
#include "maskattn/error.h"
#include "maskattn/health.h"
#include "maskattn/heatmap.h"
#include "maskattn/mask_spec.h"
#include "npy_tensors.h"
#include "output_files.h"

namespace maskattn::cli {

namespace {

// What the steps below share: the views the computation reads and how it is called.
struct Computation {
  TensorView q, k, v;  // [B,H,L,D] in the compute dtype
  const MaskSpecs& specs;
  const Options& options;
  DType dtype;
};

// --repeat: `repeat` more runs of `compute`, timed. Compute only: no file I/O, no conversions.
// Fixed format: scripts read this line.
void print_timing(const std::function<void()>& compute, int repeat) {
  std::vector<double> times;
  for (int r = 0; r < repeat; ++r) {
    const auto start = std::chrono::steady_clock::now();
    compute();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  const double median = n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
  std::fprintf(stderr, "time_ms median=%.3f min=%.3f max=%.3f\n", median, times.front(),
               times.back());
}

// --report: the numeric health report, one line per (batch, head), then the warnings. It reads
// the output and the allowed pairs attend already has instead of computing them again.
void print_health_report(const Computation& c, const HealthPrecomputed& given) {
  const HealthReport report =
      health_report(c.q, c.k, c.v, c.specs.mask, c.specs.mods, c.options, 64, given);
  fmt::print("numeric health report ({}): per head, over allowed pairs\n", dtype_name(c.dtype));
  fmt::print("{:>3} {:>3} {:>22} {:>10} {:>13} {:>8} {:>10} {:>5} {:>5}\n", "b", "h",
             "score min / max", "max logit", "entropy nats", "hidden", "empty rows", "NaN", "Inf");
  for (const HeadHealth& head : report.heads) {
    fmt::print(
        "{:>3} {:>3} {:>10.4g} / {:<9.4g} {:>10.4g} {:>13.4f} {:>7.1f}% {:>10} {:>5} {:>5}\n",
        head.b, head.h, head.score_min, head.score_max, head.max_logit, head.mean_entropy,
        100.0 * head.hidden_fraction, head.empty_rows, head.nan_count, head.inf_count);
  }
  for (const std::string& warning : report.warnings) fmt::print("warning: {}\n", warning);
  if (report.warnings.empty()) fmt::print("no warnings\n");
}

// --heatmap: panels of `weights` (attention_weights of the computation, f32 [B,H,Lq,Lk]), one
// per (b, h), at most 16; hidden pairs (`allowed`: allowed_pairs of the mask) hatched.
void write_weights_heatmap(const Computation& c, const TensorView& weights,
                           const Array<uint8_t>& allowed, const std::string& path,
                           const std::string& tokens) {
  const int64_t q_len = c.q.size(2), k_len = c.k.size(2);
  const HeatmapLabels labels =
      token_labels(tokens, q_len, k_len, c.specs.mask.alignment() == Alignment::top_left);
  const auto* first = static_cast<const float*>(weights.data());
  write_heatmap(path, heatmap_panels(allowed, std::vector<float>(first, first + weights.numel())),
                labels);
}

}  // namespace

int run_attend(const AttendArgs& args) {
  require_ring_for_stats(args.ring, args.ring_stats);
  if (!args.ring.empty()) {
    // These need the whole problem in one process; a rank holds only its rows.
    for (const auto& [given, flag] : {std::pair{!args.weights.empty(), "--weights"},
                                      {!args.heatmap.empty(), "--heatmap"},
                                      {args.report, "--report"},
                                      {args.repeat > 0, "--repeat"}}) {
      if (given) {
        throw Error(std::string(flag) + " cannot be combined with --ring: it needs the whole " +
                    "problem in one process, and a ring rank holds only its rows");
      }
    }
    return run_attend_ring(args);
  }
  std::vector<std::pair<std::string, std::string>> outputs = {{"--out", args.out}};
  if (!args.lse.empty()) outputs.emplace_back("--lse", args.lse);
  if (!args.weights.empty()) outputs.emplace_back("--weights", args.weights);
  require_distinct_outputs(outputs);

  const InputTensor q = load_input("--q", args.q);
  const InputTensor k = load_input("--k", args.k);
  const InputTensor v = load_input("--v", args.v);
  require_same_layout({&q, &k, &v}, "q, k and v");
  const DType dtype = choose_dtype(args.dtype, {&q, &k, &v});
  const MaskSpecs specs = parse_mask_specs(args.masks, args.mods, q.file_rank == 3);
  const Options options = call_options(args.scale, args.threads, args.kernel, args.products,
                                       Dropout{args.dropout, args.seed, 0});
  const ComputeInput q_in(q, dtype), k_in(k, dtype), v_in(v, dtype);
  const Computation c{q_in.view(), k_in.view(), v_in.view(), specs, options, dtype};

  // The results go straight into their (temporary) files. Shapes are checked by attention();
  // these only size the files, so guard their indexing.
  OutputFiles files;
  const Dims out_shape = {q.shape[0], q.shape[1], q.shape[2], v.shape[3]};
  const MutableTensorView out = files.add("--out", args.out, result_type(q, dtype),
                                          file_layout(q, out_shape), dtype, out_shape);
  const Dims lse_shape = {q.shape[0], q.shape[1], q.shape[2]};
  const MutableTensorView lse = args.lse.empty() ? MutableTensorView()
                                                 : files.add("--lse", args.lse, NpyType::f4,
                                                             lse_shape, DType::f32, lse_shape);
  const auto compute = [&] { attention(c.q, c.k, c.v, out, specs.mask, specs.mods, options, lse); };
  try {
    compute();  // with --repeat, this is the warm-up
  } catch (const Error& error) {
    throw Error(naming_program_spec(error.what(), specs.programs) + input_files({&q, &k, &v}));
  }
  if (args.repeat > 0) print_timing(compute, args.repeat);

  // Each derived result once: the mask's allowed pairs serve the report and the heatmap, the
  // output the report, the weights the file and the heatmap.
  Array<uint8_t> allowed;
  if (args.report || !args.heatmap.empty()) {
    allowed = allowed_pairs(specs.mask, {q.shape[0], q.shape[1], q.shape[2], k.shape[2]});
  }
  if (args.report) print_health_report(c, HealthPrecomputed{out, &allowed});
  if (!args.weights.empty() || !args.heatmap.empty()) {
    // The weights once, for the file and the heatmap alike: into the --weights file when there
    // is one, else into memory.
    const Dims shape = {q.shape[0], q.shape[1], q.shape[2], k.shape[2]};
    std::optional<TensorBuffer> in_memory;
    const MutableTensorView weights =
        !args.weights.empty()
            ? files.add("--weights", args.weights, NpyType::f4, shape, DType::f32, shape)
            : in_memory.emplace(DType::f32, shape).mutable_view();
    attention_weights(c.q, c.k, weights, specs.mask, specs.mods, options);
    if (!args.heatmap.empty()) {
      write_weights_heatmap(c, weights, allowed, args.heatmap, args.tokens);
    }
  }
  files.commit();
  return 0;
}

Command add_attend_command(CLI::App& app) {
  auto args = std::make_shared<AttendArgs>();
  CLI::App* command = app.add_subcommand(
      "attend", "O = softmax(scale·Q·Kᵀ + mask)·V for .npy inputs ([L,D], [B,L,D] or [B,H,L,D])");
  command->add_option("--q", args->q, "queries .npy (float32/float16)")->required();
  command->add_option("--k", args->k, "keys .npy")->required();
  command->add_option("--v", args->v, "values .npy")->required();
  command->add_option("--out", args->out, "output .npy (the input's dtype; f32 for bf16)")
      ->required();
  add_compute_options(command, *args, {}, {}, [&] {
    command->add_option("--lse", args->lse, "also write the log-sum-exp [B,H,Lq] (f32)");
    command->add_option("--weights", args->weights,
                        "also write the weights [B,H,Lq,Lk] (f32; debug, O(Lq·Lk) memory)");
  });
  command
      ->add_option("--repeat", args->repeat,
                   "time the computation: 1 warm-up, then R runs; prints 'time_ms median=X min=Y "
                   "max=Z' on stderr")
      ->check(CLI::Range(1, 1000000));
  command->add_flag("--report", args->report,
                    "print a numeric health report per head (score range, max logit, weight "
                    "entropy, hidden share, empty rows, NaN/Inf) and mask warnings");
  command->add_option("--heatmap", args->heatmap,
                      "also draw the weights, one panel per (batch, head): FILE.png or "
                      "FILE.svg (hidden pairs hatched grey)");
  command->add_option("--tokens", args->tokens,
                      "heatmap labels: a text file of whitespace-separated tokens, one per key");
  add_dropout_options(command, *args);
  add_ring_options(command, args->ring, args->ring_stats);
  command->footer(mask_spec_help());
  return {command, [args] { return run_attend(*args); }};
}

}  // namespace maskattn::cli
