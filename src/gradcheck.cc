// gradcheck(): attention_backward() against central finite differences of the f64 reference.
#include "maskattn/gradcheck.h"

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/dropout.h"
#include "core/element.h"
#include "kernels/reference.h"
#include "mask/resolved_mask.h"
#include "mask/resolved_mods.h"
#include "maskattn/error.h"
#include "maskattn/memory.h"
#include "validate.h"

namespace maskattn {

namespace {

// A tensor's values as a contiguous f32 copy, and a view of it (perturbed in place).
struct F32Copy {
  std::vector<float> values;
  TensorView view;
  explicit F32Copy(const TensorView& t) : values(static_cast<size_t>(t.numel())) {
    std::array<int64_t, 4> index{};
    for (int64_t n = 0; n < t.numel(); ++n) {
      int64_t rest = n;
      for (int axis = t.rank() - 1; axis >= 0; --axis) {
        index[axis] = rest % t.size(axis);
        rest /= t.size(axis);
      }
      values[n] = detail::load_float(t, t.offset(index));
    }
    view = TensorView(values.data(), t.sizes());
  }
};

// A gradient tensor of `shape` in `dtype`, zero-initialised, and its values widened to double.
struct GradientBuffer {
  Dims shape;
  DType dtype;
  std::vector<uint8_t> bytes;
  GradientBuffer(Dims dims, DType type)
      : shape(std::move(dims)),
        dtype(type),
        bytes(static_cast<size_t>(checked_numel(shape, "gradient")) * dtype_size(type)) {}
  MutableTensorView view() { return MutableTensorView(bytes.data(), dtype, shape); }
  double at(int64_t n) const {
    return detail::load_float(TensorView(bytes.data(), dtype, shape), n);
  }
};

double default_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 1e-4;
    case DType::f16:
      return 1e-2;
    case DType::bf16:
      return 5e-2;
  }
  return 1e-4;
}

// What attention_backward() returns, run as the caller would run it (forward, then backward).
struct AnalyticGradients {
  GradientBuffer dq, dk, dv;
  std::optional<GradientBuffer> dbias, dsinks;
};

AnalyticGradients analytic_gradients(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& dout, const Mask& mask,
                                     const ScoreMods& mods, const Options& options) {
  detail::Problem shape = detail::make_problem(q, k, &v, options);
  // Gradients and f32 copies of the inputs (4 bytes each, about three times over), the f64 output.
  require_memory(
      12.0 * (q.numel() + k.numel() + v.numel() + 2.0 * dout.numel()) + 8.0 * dout.numel(),
      "gradcheck for q " + q.shape_string() + ", k " + k.shape_string());
  const Dims out_shape = {shape.batch, shape.q_heads, shape.q_len, shape.value_dim};
  GradientBuffer out(out_shape, q.dtype());
  std::vector<float> lse(static_cast<size_t>(shape.batch * shape.q_heads * shape.q_len));
  const MutableTensorView lse_view(lse.data(), {shape.batch, shape.q_heads, shape.q_len});
  attention(q, k, v, out.view(), mask, mods, options, lse_view);

  AnalyticGradients g{GradientBuffer(q.sizes(), q.dtype()), GradientBuffer(k.sizes(), q.dtype()),
                      GradientBuffer(v.sizes(), q.dtype()), std::nullopt, std::nullopt};
  Gradients grads{g.dq.view(), g.dk.view(), g.dv.view(), {}, {}};
  if (mods.bias) {
    g.dbias.emplace(mods.bias->shape(), DType::f32);
    grads.dbias = g.dbias->view();
  }
  if (!mods.sinks.empty()) {
    g.dsinks.emplace(Dims{static_cast<int64_t>(mods.sinks.size())}, DType::f32);
    grads.dsinks = g.dsinks->view();
  }
  attention_backward(q, k, v, out.view(), lse_view, dout, grads, mask, mods, options);
  return g;
}

// Central differences of `loss` for every value of `inputs` (each moved by ±step in place, then
// restored), compared with the analytic gradient.
GradcheckEntry compare_gradient(const std::string& name, std::vector<float>& inputs, double step,
                                const std::function<double()>& loss,
                                const std::function<double(int64_t)>& analytic) {
  GradcheckEntry entry;
  entry.tensor = name;
  entry.count = static_cast<int64_t>(inputs.size());
  double max_error = 0.0, max_fd = 0.0;
  for (size_t n = 0; n < inputs.size(); ++n) {
    const float x = inputs[n];
    const float up = static_cast<float>(x + step);
    const float down = static_cast<float>(x - step);
    inputs[n] = up;
    const double loss_up = loss();
    inputs[n] = down;
    const double loss_down = loss();
    inputs[n] = x;
    const double fd = (loss_up - loss_down) / (double{up} - double{down});
    const double error = std::fabs(analytic(static_cast<int64_t>(n)) - fd);
    max_error = std::isnan(error) ? NAN : std::max(max_error, error);
    max_fd = std::max(max_fd, std::fabs(fd));
  }
  entry.max_abs_error = max_error;
  entry.max_magnitude = max_fd;
  entry.max_relative_error = max_fd > 0 ? max_error / max_fd : max_error;
  return entry;
}

}  // namespace

GradcheckReport gradcheck(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& dout, const Mask& mask, const ScoreMods& mods,
                          const Options& options, const GradcheckOptions& check) {
  if (!options.frame.is_whole()) {
    throw Error(
        "gradcheck: options.frame must be the whole problem (finite differences perturb "
        "the call's own inputs); check the whole call instead of a slice of it");
  }
  if (!(check.step > 0) || !std::isfinite(check.step)) {
    throw Error("gradcheck: step = " + std::to_string(check.step) + " must be finite and > 0");
  }
  if (check.tolerance && !(*check.tolerance >= 0)) {
    throw Error("gradcheck: tolerance must be ≥ 0");
  }
  const AnalyticGradients analytic = analytic_gradients(q, k, v, dout, mask, mods, options);

  // ---- finite differences of L = Σ dout∘O, f64 reference forward ----
  F32Copy qc(q), kc(k), vc(v), weights(dout);
  std::vector<float> bias_values = mods.bias ? mods.bias->values() : std::vector<float>{};
  std::vector<float> sink_values = mods.sinks;
  detail::Problem p = detail::make_problem(qc.view, kc.view, &vc.view, options);
  p.threads = 1;
  const detail::ResolvedMask resolved_mask(mask, detail::mask_shape_of(p));
  detail::ResolvedMods resolved_mods(mods, detail::mask_shape_of(p));
  if (mods.bias) resolved_mods.bias = bias_values.data();
  if (!mods.sinks.empty()) resolved_mods.sinks = sink_values.data();
  p.mask = &resolved_mask;
  p.mods = &resolved_mods;
  // Dropout's pairs are a function of the seed and the positions, not of the inputs: the loss is
  // differentiable with them held fixed, which is what the backward differentiates.
  p.dropout = detail::resolve_dropout(options.dropout, detail::mask_shape_of(p));
  const Dims out_shape = {p.batch, p.q_heads, p.q_len, p.value_dim};
  std::vector<double> o(static_cast<size_t>(checked_numel(out_shape, "out")));
  const auto loss = [&] {
    detail::reference::forward_f64(p, o.data());
    double sum = 0.0;
    for (size_t n = 0; n < o.size(); ++n) sum += double{weights.values[n]} * o[n];
    return sum;
  };

  GradcheckReport report;
  report.tolerance = check.tolerance.value_or(default_tolerance(q.dtype()));
  report.passed = true;
  const auto compare = [&](const std::string& name, std::vector<float>& inputs,
                           const GradientBuffer& gradient) {
    const GradcheckEntry entry =
        compare_gradient(name, inputs, check.step, loss, [&](int64_t n) { return gradient.at(n); });
    report.passed &= entry.max_relative_error <= report.tolerance;  // false for NaN
    report.entries.push_back(entry);
  };
  compare("dq", qc.values, analytic.dq);
  compare("dk", kc.values, analytic.dk);
  compare("dv", vc.values, analytic.dv);
  if (analytic.dbias) compare("dbias", bias_values, *analytic.dbias);
  if (analytic.dsinks) compare("dsinks", sink_values, *analytic.dsinks);
  return report;
}

}  // namespace maskattn
