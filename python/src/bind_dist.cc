// Ring attention for maskattn.dist (docs/distributed.md): local_ranges always, and
// ring_attention / ring_attention_backward when the extension is built with MPI
// (MASKATTN_PYTHON_WITH_MPI; `_core.has_mpi` says which).
//
// The communicator arrives as its Fortran handle (mpi4py's comm.py2f()) and becomes an MPI_Comm
// with MPI_Comm_f2c, so neither mpi4py's headers nor its C API are needed at build time: mpi4py
// and this module only have to load the same MPI library, which they do when both link the
// system's Open MPI. The call runs with the GIL released, like attention().
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "call.h"
#include "maskattn/error.h"
#include "maskattn/ring.h"

#ifdef MASKATTN_PYTHON_WITH_MPI
#include "maskattn/dist/ring_mpi.h"
#endif

namespace maskattn::python {
namespace {

using nb::arg;

dist::Layout layout_named(const std::string& name) {
  if (name == "zigzag") return dist::Layout::zigzag;
  if (name == "contiguous") return dist::Layout::contiguous;
  throw Error("layout is '" + name + "'; use 'zigzag' or 'contiguous'");
}

std::vector<std::pair<int64_t, int64_t>> local_ranges_binding(int64_t length,
                                                              const std::string& layout, int rank,
                                                              int world) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const dist::RowRange& range :
       dist::local_ranges(length, layout_named(layout), rank, world)) {
    ranges.emplace_back(range.first, range.end);
  }
  return ranges;
}

#ifdef MASKATTN_PYTHON_WITH_MPI

// The communicator behind mpi4py's Fortran handle; MPI must already be initialised (importing
// mpi4py.MPI does it).
MPI_Comm communicator(int64_t handle) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0) {
    throw Error("ring_attention: MPI is not initialised; import mpi4py.MPI first");
  }
  return MPI_Comm_f2c(static_cast<MPI_Fint>(handle));
}

dist::RingOptions ring_options(std::optional<double> scale, int threads, const std::string& kernel,
                               const std::string& products, const std::string& layout,
                               const Dropout& dropout) {
  dist::RingOptions options;
  options.base = options_of(scale, threads, kernel, products, false);
  options.base.dropout = dropout;  // global rows key the pairs: every rank drops the whole call's
  options.layout = layout_named(layout);
  return options;
}

void ring_binding(int64_t comm, int64_t q_len, int64_t k_len, const InputArray& q,
                  const InputArray& k, const InputArray& v, const OutputArray& out,
                  const Mask* mask, const ScoreMods* mods, const std::optional<OutputArray>& lse,
                  std::optional<double> scale, int threads, const std::string& kernel,
                  const std::string& products, const std::string& layout,
                  const std::string& element, double dropout_p, uint64_t dropout_seed,
                  uint64_t dropout_offset) {
  const TensorView qv = input_view(q, "q", element), kv = input_view(k, "k", element),
                   vv = input_view(v, "v", element);
  const MutableTensorView ov = output_view(out, "out", element);
  const MutableTensorView lv = optional_output(lse, "lse", "");
  const dist::RingOptions options = ring_options(scale, threads, kernel, products, layout,
                                                 Dropout{dropout_p, dropout_seed, dropout_offset});
  const MPI_Comm communicator_ = communicator(comm);
  compute_released(mask, mods, [&] {
    dist::ring_attention(communicator_, q_len, k_len, qv, kv, vv, ov, mask_or_none(mask),
                         mods_or_none(mods), options, lv);
  });
}

void ring_backward_binding(int64_t comm, int64_t q_len, int64_t k_len, const InputArray& q,
                           const InputArray& k, const InputArray& v, const InputArray& out,
                           const InputArray& lse, const InputArray& dout, const OutputArray& dq,
                           const OutputArray& dk, const OutputArray& dv, const Mask* mask,
                           const ScoreMods* mods, std::optional<double> scale, int threads,
                           const std::string& kernel, const std::string& products,
                           const std::string& layout, const std::string& element, double dropout_p,
                           uint64_t dropout_seed, uint64_t dropout_offset) {
  const TensorView qv = input_view(q, "q", element), kv = input_view(k, "k", element),
                   vv = input_view(v, "v", element), ov = input_view(out, "out", element),
                   lv = input_view(lse, "lse", ""), dov = input_view(dout, "dout", element);
  Gradients grads;
  grads.dq = output_view(dq, "dq", element);
  grads.dk = output_view(dk, "dk", element);
  grads.dv = output_view(dv, "dv", element);
  const dist::RingOptions options = ring_options(scale, threads, kernel, products, layout,
                                                 Dropout{dropout_p, dropout_seed, dropout_offset});
  const MPI_Comm communicator_ = communicator(comm);
  compute_released(mask, mods, [&] {
    dist::ring_attention_backward(communicator_, q_len, k_len, qv, kv, vv, ov, lv, dov, grads,
                                  mask_or_none(mask), mods_or_none(mods), options);
  });
}

#endif

}  // namespace

void bind_dist(nb::module_& m) {
  m.def("local_ranges", &local_ranges_binding, arg("length"), arg("layout"), arg("rank"),
        arg("world"));
#ifdef MASKATTN_PYTHON_WITH_MPI
  m.attr("has_mpi") = true;
  m.def("ring_attention", &ring_binding, arg("comm"), arg("q_len"), arg("k_len"), arg("q"),
        arg("k"), arg("v"), arg("out"), arg("mask").none(), arg("mods").none(), arg("lse").none(),
        arg("scale").none(), arg("threads"), arg("kernel"), arg("products"), arg("layout"),
        arg("element"), arg("dropout_p") = 0.0, arg("dropout_seed") = 0, arg("dropout_offset") = 0);
  m.def("ring_attention_backward", &ring_backward_binding, arg("comm"), arg("q_len"), arg("k_len"),
        arg("q"), arg("k"), arg("v"), arg("out"), arg("lse"), arg("dout"), arg("dq"), arg("dk"),
        arg("dv"), arg("mask").none(), arg("mods").none(), arg("scale").none(), arg("threads"),
        arg("kernel"), arg("products"), arg("layout"), arg("element"), arg("dropout_p") = 0.0,
        arg("dropout_seed") = 0, arg("dropout_offset") = 0);
#else
  m.attr("has_mpi") = false;
#endif
}

}  // namespace maskattn::python
