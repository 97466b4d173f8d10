// The compute entry points: attention, attention_backward, merge_partials.
//
// Each takes views of the caller's arrays (arrays.h) and runs with the GIL released, so Python
// threads compute concurrently and the library's own OpenMP threads never wait on Python (except
// for Python callbacks, callbacks.h). Outputs are allocated by the Python layer, in the caller's
// array type; here they are only written.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "call.h"
#include "maskattn/attention.h"
#include "maskattn/varlen.h"

namespace maskattn::python {
namespace {

using nb::arg;

void attention_binding(const InputArray& q, const InputArray& k, const InputArray& v,
                       const OutputArray& out, const Mask* mask, const ScoreMods* mods,
                       const std::optional<OutputArray>& lse, std::optional<double> scale,
                       int threads, const std::string& kernel, const std::string& products,
                       bool check_finite, const std::string& element,
                       const std::optional<std::vector<int64_t>>& frame, bool count_sinks,
                       double dropout_p, uint64_t dropout_seed, uint64_t dropout_offset) {
  const TensorView qv = input_view(q, "q", element), kv = input_view(k, "k", element),
                   vv = input_view(v, "v", element);
  const MutableTensorView ov = output_view(out, "out", element);
  const MutableTensorView lv = optional_output(lse, "lse", "");
  Options options = options_of(scale, threads, kernel, products, check_finite);
  options.frame = frame_of(frame);
  options.count_sinks = count_sinks;
  options.dropout = Dropout{dropout_p, dropout_seed, dropout_offset};
  compute_released(mask, mods, [&] {
    attention(qv, kv, vv, ov, mask_or_none(mask), mods_or_none(mods), options, lv);
  });
}

void backward_binding(const InputArray& q, const InputArray& k, const InputArray& v,
                      const InputArray& out, const InputArray& lse, const InputArray& dout,
                      const OutputArray& dq, const OutputArray& dk, const OutputArray& dv,
                      const std::optional<OutputArray>& dbias,
                      const std::optional<OutputArray>& dsinks, const nb::list& dtables,
                      const Mask* mask, const ScoreMods* mods, std::optional<double> scale,
                      int threads, const std::string& kernel, const std::string& products,
                      const std::string& element, const std::optional<std::vector<int64_t>>& frame,
                      double dropout_p, uint64_t dropout_seed, uint64_t dropout_offset) {
  const TensorView qv = input_view(q, "q", element), kv = input_view(k, "k", element),
                   vv = input_view(v, "v", element), ov = input_view(out, "out", element),
                   lv = input_view(lse, "lse", ""), dov = input_view(dout, "dout", element);
  Gradients grads;
  grads.dq = output_view(dq, "dq", element);
  grads.dk = output_view(dk, "dk", element);
  grads.dv = output_view(dv, "dv", element);
  grads.dbias = optional_output(dbias, "dbias", "");
  grads.dsinks = optional_output(dsinks, "dsinks", "");
  for (nb::handle table : dtables) {  // one per program table; None: not wanted
    grads.dtables.push_back(table.is_none()
                                ? MutableTensorView()
                                : output_view(nb::cast<OutputArray>(table), "dtables", ""));
  }
  Options options = options_of(scale, threads, kernel, products, false);
  options.frame = frame_of(frame);
  // The same dropout as the forward's: the backward regenerates its dropped pairs.
  options.dropout = Dropout{dropout_p, dropout_seed, dropout_offset};
  compute_released(mask, mods, [&] {
    attention_backward(qv, kv, vv, ov, lv, dov, grads, mask_or_none(mask), mods_or_none(mods),
                       options);
  });
}

// The varlen pair: the Python layer has made the offsets lists of ints (from int32 or int64
// arrays) and max_seqlen ints.
Varlen varlen_of(const std::vector<int64_t>& cu_seqlens_q, const std::vector<int64_t>& cu_seqlens_k,
                 int64_t max_seqlen_q, int64_t max_seqlen_k) {
  return Varlen{cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k};
}

void varlen_binding(const InputArray& q, const InputArray& k, const InputArray& v,
                    const OutputArray& out, const std::vector<int64_t>& cu_seqlens_q,
                    const std::vector<int64_t>& cu_seqlens_k, int64_t max_seqlen_q,
                    int64_t max_seqlen_k, const Mask* mask, const ScoreMods* mods,
                    const std::optional<OutputArray>& lse, std::optional<double> scale, int threads,
                    const std::string& kernel, const std::string& products, bool check_finite,
                    const std::string& element, double dropout_p, uint64_t dropout_seed,
                    uint64_t dropout_offset) {
  const TensorView qv = input_view(q, "q", element), kv = input_view(k, "k", element),
                   vv = input_view(v, "v", element);
  const MutableTensorView ov = output_view(out, "out", element);
  const MutableTensorView lv = optional_output(lse, "lse", "");
  Options options = options_of(scale, threads, kernel, products, check_finite);
  options.dropout = Dropout{dropout_p, dropout_seed, dropout_offset};
  const Varlen varlen = varlen_of(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  compute_released(mask, mods, [&] {
    attention_varlen(qv, kv, vv, ov, varlen, mask_or_none(mask), mods_or_none(mods), options, lv);
  });
}

void varlen_backward_binding(const InputArray& q, const InputArray& k, const InputArray& v,
                             const InputArray& out, const InputArray& lse, const InputArray& dout,
                             const std::vector<int64_t>& cu_seqlens_q,
                             const std::vector<int64_t>& cu_seqlens_k, int64_t max_seqlen_q,
                             int64_t max_seqlen_k, const OutputArray& dq, const OutputArray& dk,
                             const OutputArray& dv, const std::optional<OutputArray>& dbias,
                             const std::optional<OutputArray>& dsinks, const nb::list& dtables,
                             const Mask* mask, const ScoreMods* mods, std::optional<double> scale,
                             int threads, const std::string& kernel, const std::string& products,
                             const std::string& element, double dropout_p, uint64_t dropout_seed,
                             uint64_t dropout_offset) {
  const TensorView qv = input_view(q, "q", element), kv = input_view(k, "k", element),
                   vv = input_view(v, "v", element), ov = input_view(out, "out", element),
                   lv = input_view(lse, "lse", ""), dov = input_view(dout, "dout", element);
  Gradients grads(output_view(dq, "dq", element), output_view(dk, "dk", element),
                  output_view(dv, "dv", element), optional_output(dbias, "dbias", ""),
                  optional_output(dsinks, "dsinks", ""));
  for (nb::handle table : dtables) {  // one per program table; None: not wanted
    grads.dtables.push_back(table.is_none()
                                ? MutableTensorView()
                                : output_view(nb::cast<OutputArray>(table), "dtables", ""));
  }
  Options options = options_of(scale, threads, kernel, products, false);
  options.dropout = Dropout{dropout_p, dropout_seed, dropout_offset};
  const Varlen varlen = varlen_of(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  compute_released(mask, mods, [&] {
    attention_varlen_backward(qv, kv, vv, ov, lv, dov, varlen, grads, mask_or_none(mask),
                              mods_or_none(mods), options);
  });
}

void merge_binding(const std::vector<InputArray>& outs, const std::vector<InputArray>& lses,
                   const OutputArray& out, const std::optional<OutputArray>& lse,
                   const std::string& element) {
  if (outs.size() != lses.size()) {
    throw Error("merge_partials: " + std::to_string(outs.size()) + " outputs but " +
                std::to_string(lses.size()) + " lse arrays; each part needs both");
  }
  std::vector<PartialResult> parts;
  for (size_t n = 0; n < outs.size(); ++n) {
    const std::string part = "part " + std::to_string(n);  // as merge_partials names them
    parts.push_back({input_view(outs[n], (part + " out").c_str(), element),
                     input_view(lses[n], (part + " lse").c_str(), "")});
  }
  const MutableTensorView ov = output_view(out, "out", element);
  const MutableTensorView lv = optional_output(lse, "lse", "");
  nb::gil_scoped_release released;
  merge_partials(parts, ov, lv);
}

}  // namespace

void bind_attention(nb::module_& m) {
  m.def("attention", &attention_binding, arg("q"), arg("k"), arg("v"), arg("out"),
        arg("mask").none(), arg("mods").none(), arg("lse").none(), arg("scale").none(),
        arg("threads"), arg("kernel"), arg("products"), arg("check_finite"), arg("element"),
        arg("frame").none() = nb::none(), arg("count_sinks") = true, arg("dropout_p") = 0.0,
        arg("dropout_seed") = 0, arg("dropout_offset") = 0);
  m.def("attention_backward", &backward_binding, arg("q"), arg("k"), arg("v"), arg("out"),
        arg("lse"), arg("dout"), arg("dq"), arg("dk"), arg("dv"), arg("dbias").none(),
        arg("dsinks").none(), arg("dtables"), arg("mask").none(), arg("mods").none(),
        arg("scale").none(), arg("threads"), arg("kernel"), arg("products"), arg("element"),
        arg("frame").none() = nb::none(), arg("dropout_p") = 0.0, arg("dropout_seed") = 0,
        arg("dropout_offset") = 0);
  m.def("attention_varlen", &varlen_binding, arg("q"), arg("k"), arg("v"), arg("out"),
        arg("cu_seqlens_q"), arg("cu_seqlens_k"), arg("max_seqlen_q"), arg("max_seqlen_k"),
        arg("mask").none(), arg("mods").none(), arg("lse").none(), arg("scale").none(),
        arg("threads"), arg("kernel"), arg("products"), arg("check_finite"), arg("element"),
        arg("dropout_p") = 0.0, arg("dropout_seed") = 0, arg("dropout_offset") = 0);
  m.def("attention_varlen_backward", &varlen_backward_binding, arg("q"), arg("k"), arg("v"),
        arg("out"), arg("lse"), arg("dout"), arg("cu_seqlens_q"), arg("cu_seqlens_k"),
        arg("max_seqlen_q"), arg("max_seqlen_k"), arg("dq"), arg("dk"), arg("dv"),
        arg("dbias").none(), arg("dsinks").none(), arg("dtables"), arg("mask").none(),
        arg("mods").none(), arg("scale").none(), arg("threads"), arg("kernel"), arg("products"),
        arg("element"), arg("dropout_p") = 0.0, arg("dropout_seed") = 0, arg("dropout_offset") = 0);
  m.def("merge_partials", &merge_binding, arg("outs"), arg("lses"), arg("out"), arg("lse").none(),
        arg("element"));
}

}  // namespace maskattn::python
