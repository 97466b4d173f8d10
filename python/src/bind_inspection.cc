// Inspection from Python: the allowed pairs and block map of a mask, whether a slice of the problem
// has any allowed pair, the materialised weights and scores, gradcheck, and what this CPU offers.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>

#include "arrays.h"
#include "bindings.h"
#include "call.h"
#include "maskattn/attention.h"
#include "maskattn/cpu.h"
#include "maskattn/gradcheck.h"

namespace maskattn::python {

using nb::arg;

namespace {

nb::dict gradcheck_binding(const InputArray& q, const InputArray& k, const InputArray& v,
                           const InputArray& dout, const Mask* mask, const ScoreMods* mods,
                           std::optional<double> scale, const std::string& kernel, double step,
                           std::optional<double> tolerance, const std::string& element,
                           double dropout_p, uint64_t dropout_seed, uint64_t dropout_offset) {
  const TensorView qv = input_view(q, "q", element), kv = input_view(k, "k", element),
                   vv = input_view(v, "v", element), dv = input_view(dout, "dout", element);
  GradcheckOptions check;
  check.step = step;
  check.tolerance = tolerance;
  Options options = options_of(scale, 0, kernel, "auto", false);
  options.dropout = Dropout{dropout_p, dropout_seed, dropout_offset};  // pairs held fixed
  GradcheckReport report;
  compute_released(mask, mods, [&] {
    report = gradcheck(qv, kv, vv, dv, mask_or_none(mask), mods_or_none(mods), options, check);
  });
  nb::dict result;
  nb::list entries;
  for (const GradcheckEntry& entry : report.entries) {
    nb::dict row;
    row["tensor"] = entry.tensor;
    row["count"] = entry.count;
    row["max_abs_error"] = entry.max_abs_error;
    row["max_relative_error"] = entry.max_relative_error;
    row["max_magnitude"] = entry.max_magnitude;
    entries.append(row);
  }
  result["entries"] = entries;
  result["tolerance"] = report.tolerance;
  result["passed"] = report.passed;
  return result;
}

nb::dict cpu_info() {
  const CpuReport report = cpu_report();
  nb::dict info;
  info["model"] = report.model;
  info["simd_target"] = report.simd_target;
  info["avx512"] = report.avx512;
  info["avx512_bf16"] = report.avx512_bf16;
  info["avx512_fp16"] = report.avx512_fp16;
  info["amx_bf16"] = report.amx_bf16;
  info["amx_permitted"] = report.amx_permitted;
  info["bf16_probe"] = report.bf16_probe;
  nb::dict products;
  products["float32"] = products_name(report.f32);
  products["float16"] = products_name(report.f16);
  products["bfloat16"] = products_name(report.bf16);
  info["products"] = products;
  return info;
}

// Whether a [B, Hq, Lq, Lk] problem, or with a frame that slice of a larger one, has any pair the
// mask allows (a ring's plan skips the slices where it has none).
bool any_allowed_binding(const Mask* mask, int64_t batch, int64_t q_heads, int64_t q_len,
                         int64_t k_len, const std::optional<std::vector<int64_t>>& frame) {
  bool allowed = false;
  compute_released(mask, nullptr, [&] {
    allowed =
        any_allowed(mask_or_none(mask), MaskShape{batch, q_heads, q_len, k_len}, frame_of(frame));
  });
  return allowed;
}

}  // namespace

void bind_inspection(nb::module_& m) {
  m.def(
      "allowed_pairs",
      [](const Mask* mask, int64_t batch, int64_t q_heads, int64_t q_len, int64_t k_len,
         std::optional<int64_t> b, std::optional<int64_t> h) {
        const MaskShape shape{batch, q_heads, q_len, k_len};
        if (b.has_value() != h.has_value()) {
          throw Error("allowed_pairs: give both b and h (one panel) or neither");
        }
        Array<uint8_t> pairs;
        compute_released(mask, nullptr, [&] {  // a failing predicate raises, as in attention
          pairs = b ? allowed_pairs(mask_or_none(mask), shape, *b, *h)
                    : allowed_pairs(mask_or_none(mask), shape);
        });
        return to_numpy(std::move(pairs));
      },
      arg("mask").none(), arg("batch"), arg("q_heads"), arg("q_len"), arg("k_len"), arg("b").none(),
      arg("h").none());
  m.def(
      "block_map",
      [](const Mask* mask, int64_t batch, int64_t q_heads, int64_t q_len, int64_t k_len,
         int64_t tile_q, int64_t tile_k) {
        Array<uint8_t> blocks;
        compute_released(mask, nullptr, [&] {
          blocks = block_map(mask_or_none(mask), MaskShape{batch, q_heads, q_len, k_len}, tile_q,
                             tile_k);
        });
        return to_numpy(std::move(blocks));
      },
      arg("mask").none(), arg("batch"), arg("q_heads"), arg("q_len"), arg("k_len"), arg("tile_q"),
      arg("tile_k"));
  m.def("any_allowed", &any_allowed_binding, arg("mask").none(), arg("batch"), arg("q_heads"),
        arg("q_len"), arg("k_len"), arg("frame").none());
  m.def(
      "attention_weights",
      [](const InputArray& q, const InputArray& k, const OutputArray& weights, const Mask* mask,
         const ScoreMods* mods, std::optional<double> scale, int threads, const std::string& kernel,
         const std::string& element, double dropout_p, uint64_t dropout_seed,
         uint64_t dropout_offset) {
        const TensorView qv = input_view(q, "q", element), kv = input_view(k, "k", element);
        const MutableTensorView wv = output_view(weights, "weights", "");
        Options options = options_of(scale, threads, kernel, "auto", false);
        // With dropout: the dropped pairs 0, the kept ones scaled by 1/(1 − p').
        options.dropout = Dropout{dropout_p, dropout_seed, dropout_offset};
        compute_released(mask, mods, [&] {
          attention_weights(qv, kv, wv, mask_or_none(mask), mods_or_none(mods), options);
        });
      },
      arg("q"), arg("k"), arg("weights"), arg("mask").none(), arg("mods").none(),
      arg("scale").none(), arg("threads"), arg("kernel"), arg("element"), arg("dropout_p") = 0.0,
      arg("dropout_seed") = 0, arg("dropout_offset") = 0);
  m.def(
      "attention_scores",
      [](const InputArray& q, const InputArray& k, const OutputArray& scores, bool final,
         const Mask* mask, const ScoreMods* mods, std::optional<double> scale, int threads,
         const std::string& element) {
        const TensorView qv = input_view(q, "q", element), kv = input_view(k, "k", element);
        const MutableTensorView sv = output_view(scores, "scores", "");
        const Options options = options_of(scale, threads, "auto", "auto", false);
        compute_released(mask, mods, [&] {
          attention_scores(qv, kv, sv, final ? ScoreStage::final : ScoreStage::scaled,
                           mask_or_none(mask), mods_or_none(mods), options);
        });
      },
      arg("q"), arg("k"), arg("scores"), arg("final"), arg("mask").none(), arg("mods").none(),
      arg("scale").none(), arg("threads"), arg("element"));
  m.def("gradcheck", &gradcheck_binding, arg("q"), arg("k"), arg("v"), arg("dout"),
        arg("mask").none(), arg("mods").none(), arg("scale").none(), arg("kernel"), arg("step"),
        arg("tolerance").none(), arg("element"), arg("dropout_p") = 0.0, arg("dropout_seed") = 0,
        arg("dropout_offset") = 0);
  m.def("cpu_info", &cpu_info);
}

}  // namespace maskattn::python
