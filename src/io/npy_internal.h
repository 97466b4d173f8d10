// What npy.cc (reading) and npy_write.cc share; not part of the public API.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "maskattn/npy.h"

namespace maskattn::npy_detail {

inline constexpr std::string_view kMagic("\x93NUMPY", 6);

// Bytes needed to hold `shape` of `type`; throws Error starting with `what` if that overflows.
int64_t checked_byte_size(NpyType type, const Dims& shape, const std::string& what);

// "shape [2,3] of float32", for messages.
std::string shape_and_type(const Dims& shape, NpyType type);

// numpy's bool is one byte holding 0 or 1; anything else means the file is not what it claims.
void check_bools(const uint8_t* bytes, size_t count, const std::string& name);

// The array a parsed layout describes, from the file's bytes `data` (a C-order copy; Fortran order
// transposed); bool bytes checked.
NpyArray array_from_layout(const uint8_t* data, const NpyLayout& layout, const std::string& name);

}  // namespace maskattn::npy_detail
