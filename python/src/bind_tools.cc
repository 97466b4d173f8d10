// Debugging tools from Python: the leakage audit, the health report and the heatmaps. The token
// and batch builders are in bind_tokens.cc.
//
// Each binding here is a raw call: python/maskattn/_tools.py checks the arguments that Python
// callers get wrong (dtype names, label counts, ranks) and wraps the results in report classes,
// so the dictionaries returned here carry plain values (NumPy arrays that own their memory,
// lists of tuples, numbers). The audit and the health report run attention many times: the GIL
// is released while they compute, and Python callbacks in the masks report their failures after.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "call.h"
#include "maskattn/audit.h"
#include "maskattn/error.h"
#include "maskattn/health.h"
#include "maskattn/heatmap.h"

namespace maskattn::python {

void bind_tokens(nb::module_& m);  // bind_tokens.cc

namespace {

using nb::arg;

nb::list pair_list(const std::vector<AuditPair>& pairs) {
  nb::list list;
  for (const AuditPair& p : pairs) list.append(nb::make_tuple(p.b, p.h, p.i, p.j));
  return list;
}

// Empty rows name a query, not a pair: (b, h, i).
nb::list row_list(const std::vector<AuditPair>& rows) {
  nb::list list;
  for (const AuditPair& p : rows) list.append(nb::make_tuple(p.b, p.h, p.i));
  return list;
}

nb::dict audit_binding(const Mask* mask, const ScoreMods* mods, const Mask* expected, int64_t batch,
                       int64_t q_heads, int64_t kv_heads, int64_t q_len, int64_t k_len,
                       int64_t head_dim, const std::string& dtype, const std::string& kernel,
                       uint64_t seed) {
  AuditOptions options;
  options.batch = batch;
  options.q_heads = q_heads;
  options.kv_heads = kv_heads;
  options.q_len = q_len;
  options.k_len = k_len;
  options.head_dim = head_dim;
  options.dtype = parse_dtype(dtype, "dtype");
  options.kernel = parse_kernel(kernel, "kernel");
  options.seed = seed;
  AuditReport report;
  // The expected mask is evaluated too, so its Python predicates report failures like the mask's.
  reset_callback_failures(expected, nullptr);
  compute_released(mask, mods, [&] {
    report = audit_mask(mask_or_none(mask), mods_or_none(mods), expected, options);
  });
  raise_callback_failures(expected, nullptr);

  nb::dict result;
  result["shape"] = nb::make_tuple(report.shape.batch, report.shape.q_heads, report.shape.q_len,
                                   report.shape.k_len);
  result["passed"] = report.passed();
  result["has_expected"] = report.has_expected;
  result["allowed"] = to_numpy(std::move(report.allowed));
  result["expected"] =
      report.has_expected ? nb::object(nb::cast(to_numpy(std::move(report.expected)))) : nb::none();
  result["influence"] = to_numpy(std::move(report.influence));
  result["kernel_leaks"] = pair_list(report.kernel_leaks);
  result["leaks"] = pair_list(report.leaks);
  result["blind_spots"] = pair_list(report.blind_spots);
  result["silent_pairs"] = pair_list(report.silent_pairs);
  result["empty_rows"] = row_list(report.empty_rows);
  result["allowed_count"] = report.allowed_count;
  result["hidden_count"] = report.hidden_count;
  return result;
}

nb::dict head_dict(const HeadHealth& head) {
  nb::dict row;
  row["b"] = head.b;
  row["h"] = head.h;
  row["score_min"] = head.score_min;
  row["score_max"] = head.score_max;
  row["max_logit"] = head.max_logit;
  row["mean_entropy"] = head.mean_entropy;
  row["hidden_fraction"] = head.hidden_fraction;
  row["empty_rows"] = head.empty_rows;
  row["nan_count"] = head.nan_count;
  row["inf_count"] = head.inf_count;
  return row;
}

nb::dict health_binding(const InputArray& q, const InputArray& k, const InputArray& v,
                        const Mask* mask, const ScoreMods* mods, std::optional<double> scale,
                        int64_t max_heads, const std::string& element) {
  const TensorView qv = input_view(q, "q", element), kv = input_view(k, "k", element),
                   vv = input_view(v, "v", element);
  const Options options = options_of(scale, 0, "auto", "auto", false);
  HealthReport report;
  compute_released(mask, mods, [&] {
    report = health_report(qv, kv, vv, mask_or_none(mask), mods_or_none(mods), options, max_heads);
  });
  nb::list heads;
  for (const HeadHealth& head : report.heads) heads.append(head_dict(head));
  nb::list warnings;
  for (const std::string& warning : report.warnings) warnings.append(nb::str(warning.c_str()));
  nb::dict result;
  result["heads"] = heads;
  result["warnings"] = warnings;
  return result;
}

// The panels of `allowed` [B, H, Lq, Lk] (any 0/1 array) and optional `weights` of the same
// shape; _tools.py has checked the shapes, heatmap_panels checks them again.
std::vector<HeatmapPanel> panels_of(nb::handle allowed, nb::handle weights, int64_t max_panels) {
  const Array<uint8_t> flags = bool_array(allowed, "allowed");
  std::vector<float> values;
  if (!weights.is_none()) values = float_array(weights, "weights").values();
  return heatmap_panels(flags, values, max_panels);
}

void bind_heatmaps(nb::module_& m) {
  m.def(
      "heatmap_svg",
      [](nb::handle allowed, nb::handle weights, std::vector<std::string> row_labels,
         std::vector<std::string> col_labels, int64_t max_panels) {
        const std::vector<HeatmapPanel> panels = panels_of(allowed, weights, max_panels);
        const HeatmapLabels labels{std::move(row_labels), std::move(col_labels)};
        nb::gil_scoped_release released;
        return heatmap_svg(panels, labels);
      },
      arg("allowed"), arg("weights").none(), arg("row_labels"), arg("col_labels"),
      arg("max_panels"));
  m.def(
      "write_heatmap",
      [](const std::string& path, nb::handle allowed, nb::handle weights,
         std::vector<std::string> row_labels, std::vector<std::string> col_labels,
         int64_t max_panels) {
        const std::vector<HeatmapPanel> panels = panels_of(allowed, weights, max_panels);
        const HeatmapLabels labels{std::move(row_labels), std::move(col_labels)};
        nb::gil_scoped_release released;
        write_heatmap(path, panels, labels);
      },
      arg("path"), arg("allowed"), arg("weights").none(), arg("row_labels"), arg("col_labels"),
      arg("max_panels"));
}

}  // namespace

void bind_tools(nb::module_& m) {
  m.def("audit_mask", &audit_binding, arg("mask").none(), arg("mods").none(),
        arg("expected").none(), arg("batch"), arg("q_heads"), arg("kv_heads"), arg("q_len"),
        arg("k_len"), arg("head_dim"), arg("dtype"), arg("kernel"), arg("seed"));
  m.def("health_report", &health_binding, arg("q"), arg("k"), arg("v"), arg("mask").none(),
        arg("mods").none(), arg("scale").none(), arg("max_heads"), arg("element"));
  bind_heatmaps(m);
  bind_tokens(m);
}

}  // namespace maskattn::python
