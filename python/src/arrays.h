// Python arrays seen by maskattn: attention tensors as views (no copy), mask and modifier inputs
// as owned Arrays.
//
// Attention tensors arrive through nanobind's ndarray caster, which speaks DLPack and the buffer
// protocol, so NumPy arrays, PyTorch tensors and anything else with either interface are read in
// place with their strides (in elements; 0 and negative strides included). ml_dtypes.bfloat16
// arrays carry a dtype that neither protocol can describe: the Python layer passes them as a
// uint16 view with the element tag "bf16" (and "f16" likewise), which is exact because the bits
// are the same. Everything is checked here that the C++ API cannot see — device, element type,
// rank — and the C++ API checks the rest (shapes, strides, values) with the catalogue's messages.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>
#include <utility>
#include <vector>

#include "maskattn/array.h"
#include "maskattn/attention.h"
#include "maskattn/mask.h"
#include "maskattn/tensor.h"

namespace maskattn::python {

namespace nb = nanobind;

using InputArray = nb::ndarray<nb::ro>;  // read-only access, any dtype, device checked by us
using OutputArray = nb::ndarray<>;       // must be writable

// `element`: "" (take the array's own dtype), "bf16" or "f16" (a uint16/int16 array holds those
// bits). `name` is the argument's name in messages ("q", "out", …).
TensorView input_view(const InputArray& array, const char* name, const std::string& element);
MutableTensorView output_view(const OutputArray& array, const char* name,
                              const std::string& element);

// A Python sequence, NumPy array or tensor (anything numpy.asarray takes) copied into an owned
// row-major Array. Booleans become 0/1. Raises maskattn.Error naming `name` if it cannot be read
// as numbers, if int_array gets floats that are not integers (no silent truncation), or if
// bool_array gets numbers other than 0 and 1 (as the C++ API does, E29).
Array<int64_t> int_array(nb::handle values, const char* name);
Array<uint8_t> bool_array(nb::handle values, const char* name);
Array<float> float_array(nb::handle values, const char* name);
// Indices (a draft tree's parents, an accepted path): Python ints or an integer dtype. Bools and
// floats are refused, even whole-valued ones: an index array computed as floats or flags is a
// mistake rather than a form to convert.
Array<int64_t> index_array(nb::handle values, const char* name);

// A Python or NumPy/PyTorch integer (not a bool or a float), or maskattn.Error naming `name`.
int64_t int_value(nb::handle value, const char* name);

// None → every head; an int; a range with step 1; any iterable of ints.
HeadSet head_set(nb::handle heads);

// An owned Array returned to Python as a NumPy array (the Array's memory moves into it).
template <typename T>
nb::ndarray<nb::numpy, T> to_numpy(Array<T> array) {
  auto* owned = new Array<T>(std::move(array));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<Array<T>*>(p); });
  std::vector<size_t> shape(owned->shape().begin(), owned->shape().end());
  return nb::ndarray<nb::numpy, T>(const_cast<T*>(owned->data()), shape.size(), shape.data(),
                                   owner);
}

}  // namespace maskattn::python
