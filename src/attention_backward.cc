// attention_backward(): validate once at the boundary, then run the reference or fused backward.
// Every check here has an entry in docs/errors.md.
#include <string>
#include <utility>
#include <vector>

#include "core/block_skipping.h"
#include "core/element.h"
#include "core/reused.h"
#include "core/store_f32.h"
#include "kernels/fused_backward.h"
#include "kernels/reference.h"
#include "maskattn/attention.h"
#include "maskattn/error.h"
#include "validate.h"

namespace maskattn {

namespace {

using detail::Problem;

// An input that must have exactly the shape and dtype the forward gave it.
void require_input(const TensorView& t, const Dims& expected, DType dtype, const std::string& name,
                   const std::string& derived_from) {
  detail::require_view(t, static_cast<int>(expected.size()), name, shape_string(expected).c_str());
  if (t.sizes() != expected) {
    throw Error(name + " has shape " + t.shape_string() + " but must be " + shape_string(expected) +
                " (from " + derived_from + ")");
  }
  if (t.dtype() != dtype) {
    throw Error(name + " has dtype " + dtype_name(t.dtype()) + " but must be " + dtype_name(dtype));
  }
}

// grads.accumulate: the call's own gradients go to f32 scratch (per thread, reused: no page
// faults per call), with the same kernel and so the same bits as without accumulate; then they
// are added into the caller's views. The extra pass is O(rows·D) against the kernel's
// O(Lq·Lk·D).
template <typename RunKernel>
void run_accumulating(const Gradients& grads, RunKernel&& run) {
  struct Scratch {};
  const MutableTensorView* targets[] = {&grads.dq, &grads.dk, &grads.dv, &grads.dbias,
                                        &grads.dsinks};
  std::vector<float>* buffers[] = {
      &detail::reused<float, Scratch, 0>(), &detail::reused<float, Scratch, 1>(),
      &detail::reused<float, Scratch, 2>(), &detail::reused<float, Scratch, 3>(),
      &detail::reused<float, Scratch, 4>()};
  MutableTensorView views[5];
  for (int n = 0; n < 5; ++n) {
    if (targets[n]->is_null()) continue;
    buffers[n]->assign(static_cast<size_t>(targets[n]->numel()), 0.0f);
    views[n] = MutableTensorView(buffers[n]->data(), DType::f32, targets[n]->sizes());
  }
  Gradients own{views[0], views[1], views[2], views[3], views[4], false};
  // A score program's table gradients are added by the kernels' own final store (which reads
  // `accumulate` for nothing else).
  own.dtables = grads.dtables;
  own.accumulate = true;
  run(own);
  for (int n = 0; n < 5; ++n) {
    if (!targets[n]->is_null()) detail::store_f32(buffers[n]->data(), *targets[n], true);
  }
}

// grads.dtables: one view per table of mods.program, each null or f32 of the table's sizes, and
// only for float32 tables (E129).
void require_table_gradients(
    const Gradients& grads, const ScoreMods& mods,
    std::vector<std::pair<const MutableTensorView*, std::string>>& outputs) {
  if (grads.dtables.empty()) return;
  if (!mods.program) throw Error("grads.dtables is given but mods.program is not set");
  const std::vector<ProgramTable>& tables = mods.program->tables();
  if (grads.dtables.size() != tables.size()) {
    throw Error("grads.dtables has " + std::to_string(grads.dtables.size()) +
                " views but mods.program has " + std::to_string(tables.size()) +
                " tables: give one per table, null for those without a gradient");
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    if (grads.dtables[t].is_null()) continue;
    const std::string name = "dtables[" + std::to_string(t) + "] (table '" + tables[t].name + "')";
    if (tables[t].type != ProgramTableType::float32) {
      throw Error(name + ": only float32 tables have gradients; pass a null view for it");
    }
    detail::require_output(grads.dtables[t], Dims(tables[t].sizes.begin(), tables[t].sizes.end()),
                           DType::f32, name, "table " + tables[t].name);
    outputs.emplace_back(&grads.dtables[t], name);
  }
}

}  // namespace

void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& lse, const TensorView& dout,
                        const Gradients& grads, const Mask& mask, const ScoreMods& mods,
                        const Options& options) {
  Problem p = detail::make_problem(q, k, &v, options);
  const std::string qv = "q " + q.shape_string() + " and v " + v.shape_string();
  const Dims out_shape = {p.batch, p.q_heads, p.q_len, p.value_dim};
  require_input(out, out_shape, q.dtype(), "out", qv);
  require_input(dout, out_shape, q.dtype(), "dout", qv);
  require_input(lse, {p.batch, p.q_heads, p.q_len}, DType::f32, "lse", "q " + q.shape_string());

  std::vector<std::pair<const MutableTensorView*, std::string>> outputs = {
      {&grads.dq, "dq"}, {&grads.dk, "dk"}, {&grads.dv, "dv"}};
  detail::require_result(grads.dq, q.sizes(), q.dtype(), "dq", "q " + q.shape_string());
  detail::require_result(grads.dk, k.sizes(), q.dtype(), "dk", "k " + k.shape_string());
  detail::require_result(grads.dv, v.sizes(), q.dtype(), "dv", "v " + v.shape_string());
  if (mods.score_fn) {
    throw Error(
        "attention_backward: mods.score_fn is an opaque callable with no derivative; the backward "
        "supports softcap, alibi_slopes, bias, a score program (mods.program), threshold and "
        "sinks");
  }
  require_table_gradients(grads, mods, outputs);
  if (!grads.dbias.is_null()) {
    if (!mods.bias) throw Error("grads.dbias is given but mods.bias is not set");
    detail::require_output(grads.dbias, mods.bias->shape(), DType::f32, "dbias",
                           "bias " + shape_string(mods.bias->shape()));
    outputs.emplace_back(&grads.dbias, "dbias");
  }
  if (!grads.dsinks.is_null()) {
    if (mods.sinks.empty()) throw Error("grads.dsinks is given but mods.sinks is not set");
    detail::require_output(grads.dsinks, {p.q_heads}, DType::f32, "dsinks",
                           "q " + q.shape_string() + " heads");
    outputs.emplace_back(&grads.dsinks, "dsinks");
  }
  const std::pair<const TensorView*, const char*> inputs[] = {
      {&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}, {&lse, "lse"}, {&dout, "dout"}};
  for (size_t n = 0; n < outputs.size(); ++n) {
    const auto& [output, name] = outputs[n];
    for (const auto& [input, input_name] : inputs) {
      detail::require_disjoint(*output, name, *input, input_name);
    }
    for (size_t m = 0; m < n; ++m) {
      detail::require_disjoint(*output, name, *outputs[m].first, outputs[m].second);
    }
  }
  if (options.check_finite) detail::require_finite(dout, "dout");

  detail::resolve_and_run(p, mask, mods, options, [&](const Problem& checked) {
    const auto run = [&](const Gradients& into) {
      // Sinks another part of a split counts: this call's ∂L/∂sinks is 0.
      Gradients kernel_grads = into;
      if (!options.count_sinks) kernel_grads.dsinks = MutableTensorView();
      if (options.kernel == Kernel::reference) {
        detail::reference::backward(checked, dout, kernel_grads);
      } else {
        detail::fused::backward(checked, out, lse, dout, kernel_grads, detail::block_skipping());
      }
      if (!options.count_sinks && !into.dsinks.is_null() && !grads.accumulate) {
        for (int64_t h = 0; h < into.dsinks.size(0); ++h) {
          detail::store_float(into.dsinks, h * into.dsinks.stride(0), 0.0f);
        }
      }
    };
    if (grads.accumulate) {
      run_accumulating(grads, run);
    } else {
      run(grads);
    }
  });
}

}  // namespace maskattn
