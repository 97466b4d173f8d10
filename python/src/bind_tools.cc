// Debugging and data tools from Python: the leakage audit, the health report, heatmaps, the
// vocabulary and batch builders. (Filled in by the tools binding work.)
#include <nanobind/nanobind.h>

#include "bindings.h"

namespace maskattn::python {

void bind_tools(nb::module_&) {}

}  // namespace maskattn::python
