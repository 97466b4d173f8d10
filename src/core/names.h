// One way to turn a name into an enum value, shared by every `parse_*` of the public headers
// (parse_dtype, parse_kernel, parse_products), so that the CLI, Python and the benchmarks all
// raise the one catalogued error for an unknown name (docs/errors.md E97):
//   `<what> = '<name>' is not a <kind>: use a, b or c`
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "maskattn/error.h"

namespace maskattn::detail {

// "a, b or c" from the names of `values`.
template <typename Enum, size_t N>
std::string name_choices(const std::array<Enum, N>& values, const char* (*name_of)(Enum)) {
  std::string choices;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) choices += i + 1 == N ? " or " : ", ";
    choices += name_of(values[i]);
  }
  return choices;
}

// The value of `values` whose name is `name`; an Error naming `what` (the option, argument or
// variable that held it) and every accepted name otherwise. Names are exact: case matters.
template <typename Enum, size_t N>
Enum parse_name(const std::string& name, const std::string& what, const char* kind,
                const std::array<Enum, N>& values, const char* (*name_of)(Enum)) {
  for (Enum value : values) {
    if (name == name_of(value)) return value;
  }
  throw Error(what + " = '" + name + "' is not a " + kind + ": use " +
              name_choices(values, name_of));
}

}  // namespace maskattn::detail
