// maskattn._core: the C++ library as a Python extension (nanobind). The Python package
// (python/maskattn/) builds the user-facing API on it: argument defaults, layouts, output
// allocation in the caller's array type. This module adds no semantics of its own.
#include <nanobind/nanobind.h>

#include "bindings.h"
#include "maskattn/error.h"

NB_MODULE(_core, m) {
  namespace nb = nanobind;
  m.doc() = "maskattn's C++ core; use the maskattn package, not this module";
  // maskattn::Error becomes maskattn.Error, a ValueError, with the catalogue's message.
  nb::exception<maskattn::Error>(m, "Error", PyExc_ValueError);
  maskattn::python::bind_programs(m);  // before Mask and ScoreMods, which take Programs
  maskattn::python::bind_masks(m);
  maskattn::python::bind_layouts(m);
  maskattn::python::bind_tree(m);
  maskattn::python::bind_attention(m);
  maskattn::python::bind_inspection(m);
  maskattn::python::bind_tools(m);
  maskattn::python::bind_gpt(m);
  maskattn::python::bind_dist(m);
  maskattn::python::bind_paged(m);
  maskattn::python::bind_paged_tensors(m);
}
