// maskattn attend: O = attention(Q, K, V, mask) from .npy files. The flags are a fixed contract
// (docs/cli.md): scripts depend on them.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <vector>

#include "commands.h"
#include "heatmap_files.h"
#include "maskattn/attention.h"
#include "maskattn/error.h"
#include "maskattn/health.h"
#include "maskattn/heatmap.h"
#include "maskattn/mask_spec.h"
#include "npy_tensors.h"

namespace maskattn::cli {

int run_attend(const AttendArgs& args) {
  std::vector<std::pair<std::string, std::string>> outputs = {{"--out", args.out}};
  if (!args.lse.empty()) outputs.emplace_back("--lse", args.lse);
  if (!args.weights.empty()) outputs.emplace_back("--weights", args.weights);
  require_distinct_outputs(outputs);

  const InputTensor q = load_input("--q", args.q);
  const InputTensor k = load_input("--k", args.k);
  const InputTensor v = load_input("--v", args.v);
  require_same_layout({&q, &k, &v}, "q, k and v");
  const DType dtype = choose_dtype(args.dtype, {&q, &k, &v});
  const MaskSpecs specs = parse_mask_specs(args.masks, q.file_rank == 3);
  const Mask& mask = specs.mask;
  const ScoreMods& mods = specs.mods;
  const Options options = call_options(args.scale, args.threads, args.kernel);

  const TensorBuffer q_buffer = TensorBuffer::from_floats(q.values, q.shape, dtype);
  const TensorBuffer k_buffer = TensorBuffer::from_floats(k.values, k.shape, dtype);
  const TensorBuffer v_buffer = TensorBuffer::from_floats(v.values, v.shape, dtype);
  // Shapes are checked by attention(); these only size the buffers, so guard their indexing.
  const Dims out_shape = {q.shape[0], q.shape[1], q.shape[2], v.shape[3]};
  TensorBuffer out(dtype, out_shape);
  std::optional<TensorBuffer> lse;
  if (!args.lse.empty()) lse.emplace(DType::f32, Dims{q.shape[0], q.shape[1], q.shape[2]});

  // Library errors speak of the [B,H,L,D] views; add the files they came from.
  const std::string input_files = " (" + q.flag + " " + shape_string(q.file_shape) + ", " + k.flag +
                                  " " + shape_string(k.file_shape) + ", " + v.flag + " " +
                                  shape_string(v.file_shape) + ")";
  const auto compute = [&] {
    attention(q_buffer.view(), k_buffer.view(), v_buffer.view(), out.mutable_view(), mask, mods,
              options, lse ? lse->mutable_view() : MutableTensorView());
  };
  try {
    compute();  // with --repeat, this is the warm-up
  } catch (const Error& error) {
    throw Error(error.what() + input_files);
  }
  if (args.repeat > 0) {
    // Compute only: no file I/O, no conversions. Fixed format: scripts read this line.
    std::vector<double> times;
    for (int r = 0; r < args.repeat; ++r) {
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

  OutputFiles files;
  const std::vector<float> out_values = out.to_floats();
  files.add("--out", args.out, result_array(out_values, file_layout(q, out_shape), q, dtype));
  if (lse) files.add("--lse", args.lse, NpyArray::from_floats(lse->to_floats(), lse->shape()));
  if (args.report) {
    const HealthReport report =
        health_report(q_buffer.view(), k_buffer.view(), v_buffer.view(), mask, mods, options);
    fmt::print("numeric health report ({}): per head, over allowed pairs\n", dtype_name(dtype));
    fmt::print("{:>3} {:>3} {:>22} {:>10} {:>13} {:>8} {:>10} {:>5} {:>5}\n", "b", "h",
               "score min / max", "max logit", "entropy nats", "hidden", "empty rows", "NaN",
               "Inf");
    for (const HeadHealth& head : report.heads) {
      fmt::print(
          "{:>3} {:>3} {:>10.4g} / {:<9.4g} {:>10.4g} {:>13.4f} {:>7.1f}% {:>10} {:>5} {:>5}\n",
          head.b, head.h, head.score_min, head.score_max, head.max_logit, head.mean_entropy,
          100.0 * head.hidden_fraction, head.empty_rows, head.nan_count, head.inf_count);
    }
    for (const std::string& warning : report.warnings) fmt::print("warning: {}\n", warning);
    if (report.warnings.empty()) fmt::print("no warnings\n");
  }
  if (!args.heatmap.empty()) {
    // Panels of the weights, one per (b, h), at most 16; hidden pairs hatched.
    const MaskShape shape = {q.shape[0], q.shape[1], q.shape[2], k.shape[2]};
    TensorBuffer weights(DType::f32, {q.shape[0], q.shape[1], q.shape[2], k.shape[2]});
    attention_weights(q_buffer.view(), k_buffer.view(), weights.mutable_view(), mask, mods,
                      options);
    const HeatmapLabels labels =
        token_labels(args.tokens, q.shape[2], k.shape[2], mask.alignment() == Alignment::top_left);
    write_heatmap(args.heatmap, heatmap_panels(allowed_pairs(mask, shape), weights.to_floats()),
                  labels);
  }
  if (!args.weights.empty()) {
    TensorBuffer weights(DType::f32, {q.shape[0], q.shape[1], q.shape[2], k.shape[2]});
    attention_weights(q_buffer.view(), k_buffer.view(), weights.mutable_view(), mask, mods,
                      options);
    files.add("--weights", args.weights,
              NpyArray::from_floats(weights.to_floats(), weights.shape()));
  }
  files.commit();
  return 0;
}

}  // namespace maskattn::cli
