// Shapes as lists of sizes, and how maskattn prints them in messages: [8,12,256,256].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace maskattn {

using Dims = std::vector<int64_t>;

std::string shape_string(const Dims& dims);  // "[8,12,256,256]"; "[]" for a scalar

// Product of the sizes; throws maskattn::Error naming `what` if a size is negative or the product
// of the non-zero sizes does not fit in int64 (so strides of an empty array cannot overflow).
int64_t checked_numel(const Dims& dims, const std::string& what);

}  // namespace maskattn
