// maskattn::Error — the one exception type the library throws for bad input.
#pragma once

#include <stdexcept>
#include <string>

namespace maskattn {

// Raised for every invalid argument, shape, value or file. The message names the argument and the
// shapes involved, e.g. "keep mask shape [8,256] does not broadcast to scores [8,12,256,256]".
// Catalogue: docs/errors.md.
class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& message) : std::invalid_argument(message) {}
};

}  // namespace maskattn
