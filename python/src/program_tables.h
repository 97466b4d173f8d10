// Program tables from Python objects (bind_program.cc), shared by Program, Mask.program and
// ScoreMods(program=).
#pragma once

#include <nanobind/nanobind.h>

#include <string>
#include <vector>

#include "maskattn/program.h"

namespace maskattn::python {

namespace nb = nanobind;

// One table read in place: a NumPy array or a CPU tensor of int64, int32, float32 or bool (a
// tensor that requires grad through .detach()); anything else NumPy reads (a list) converted once.
// Raises maskattn.Error naming the table otherwise.
ProgramTable program_table(const std::string& name, nb::handle value);
// {name: array} → tables, in the dict's order.
std::vector<ProgramTable> program_tables(const nb::dict& tables);
// A compiled maskattn.Program (then `tables` must be empty), or its text compiled as `kind`.
Program program_of(nb::handle program, const nb::dict& tables, ProgramKind kind);

}  // namespace maskattn::python
