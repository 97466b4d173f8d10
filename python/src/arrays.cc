#include "arrays.h"

#include <nanobind/stl/string.h>  // nb::cast<std::string>; without it the cast throws bad_cast

#include <cmath>
#include <cstdint>
#include <sstream>
#include <vector>

#include "maskattn/error.h"

namespace maskattn::python {
namespace {

std::string dlpack_dtype_name(nb::dlpack::dtype dtype) {
  std::string kind;
  switch (static_cast<nb::dlpack::dtype_code>(dtype.code)) {
    case nb::dlpack::dtype_code::Int:
      kind = "int";
      break;
    case nb::dlpack::dtype_code::UInt:
      kind = "uint";
      break;
    case nb::dlpack::dtype_code::Float:
      kind = "float";
      break;
    case nb::dlpack::dtype_code::Bfloat:
      kind = "bfloat";
      break;
    case nb::dlpack::dtype_code::Complex:
      kind = "complex";
      break;
    case nb::dlpack::dtype_code::Bool:
      return "bool";
    default:
      kind = "dlpack-code-" + std::to_string(dtype.code) + "-bits-";
      break;  // float8, …
  }
  return kind + std::to_string(dtype.bits);
}

std::string shape_of(const nb::ndarray<nb::ro>& array) {
  Dims dims;
  for (size_t axis = 0; axis < array.ndim(); ++axis) dims.push_back(array.shape(axis));
  return shape_string(dims);
}

DType element_type(const nb::ndarray<nb::ro>& array, const char* name, const std::string& element) {
  const nb::dlpack::dtype dtype = array.dtype();
  const auto code = static_cast<nb::dlpack::dtype_code>(dtype.code);
  if (dtype.lanes == 1) {
    if (code == nb::dlpack::dtype_code::Float && dtype.bits == 32) return DType::f32;
    if (code == nb::dlpack::dtype_code::Float && dtype.bits == 16) return DType::f16;
    if (code == nb::dlpack::dtype_code::Bfloat && dtype.bits == 16) return DType::bf16;
    const bool raw16 =
        (code == nb::dlpack::dtype_code::UInt || code == nb::dlpack::dtype_code::Int) &&
        dtype.bits == 16;
    if (raw16 && element == "bf16") return DType::bf16;
    if (raw16 && element == "f16") return DType::f16;
  }
  throw Error(std::string(name) + " has dtype " + dlpack_dtype_name(dtype) + " (shape " +
              shape_of(array) +
              "); maskattn takes float32, float16 or bfloat16 (torch.bfloat16 or "
              "ml_dtypes.bfloat16)");
}

TensorView view_of(const nb::ndarray<nb::ro>& array, const char* name, const std::string& element) {
  if (array.device_type() != nb::device::cpu::value) {
    throw Error(std::string(name) + " (shape " + shape_of(array) +
                ") is not in CPU memory (DLPack device type " +
                std::to_string(array.device_type()) +
                "); maskattn computes on the CPU: move it with .cpu()");
  }
  const DType dtype = element_type(array, name, element);
  if (array.ndim() > static_cast<size_t>(TensorView::kMaxRank)) {
    throw Error(std::string(name) + " has rank " + std::to_string(array.ndim()) + " (shape " +
                shape_of(array) + "); attention tensors have at most 4 axes");
  }
  Dims sizes, strides;
  for (size_t axis = 0; axis < array.ndim(); ++axis) {
    sizes.push_back(array.shape(axis));
    strides.push_back(array.stride(axis));
  }
  return TensorView(array.data(), dtype, sizes, strides);
}

// A torch tensor as NumPy can read it: no autograd, and bfloat16 (which NumPy lacks) widened.
nb::handle numpy_readable(nb::handle values, nb::object& keep_alive) {
  if (!nb::hasattr(values, "detach")) return values;
  keep_alive = values.attr("detach")();
  if (nb::cast<std::string>(nb::str(nb::object(keep_alive.attr("dtype")))) == "torch.bfloat16")
    keep_alive = keep_alive.attr("float")();
  return keep_alive;
}

// numpy.ascontiguousarray(values, dtype=...), with a catalogue message when it cannot.
nb::object numpy_copy(nb::handle values, const char* dtype, const char* name) {
  nb::module_ numpy = nb::module_::import_("numpy");
  nb::object readable;
  values = numpy_readable(values, readable);
  try {
    return numpy.attr("ascontiguousarray")(values, nb::arg("dtype") = numpy.attr(dtype));
  } catch (const nb::python_error& error) {
    throw Error(std::string(name) + " cannot be read as an array of " + dtype + ": " +
                nb::cast<std::string>(nb::str(error.value())));
  }
}

// 2.7, 2, -inf: a value in a message, as Python would print it (std::to_string says 2.000000).
std::string number_text(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

// The NumPy dtype kind of what numpy.asarray makes of `values`: 'b' bool, 'i'/'u' integers,
// 'f' floats, 'O' objects, …
char numpy_kind(nb::handle values, const char* name) {
  nb::object readable;
  values = numpy_readable(values, readable);
  try {
    nb::object array = nb::module_::import_("numpy").attr("asarray")(values);
    return nb::cast<std::string>(array.attr("dtype").attr("kind"))[0];
  } catch (const nb::python_error& error) {
    throw Error(std::string(name) +
                " cannot be read as an array: " + nb::cast<std::string>(nb::str(error.value())));
  }
}

template <typename T>
Array<T> owned_array(nb::handle values, const char* dtype, const char* name) {
  if (values.is_none()) throw Error(std::string(name) + " is None; it needs values");
  nb::object copy = numpy_copy(values, dtype, name);
  auto array = nb::cast<nb::ndarray<nb::numpy, const T, nb::c_contig>>(copy);
  Dims shape;
  for (size_t axis = 0; axis < array.ndim(); ++axis) shape.push_back(array.shape(axis));
  const T* data = array.data();
  return Array<T>(shape, std::vector<T>(data, data + array.size()));
}

}  // namespace

TensorView input_view(const InputArray& array, const char* name, const std::string& element) {
  return view_of(array, name, element);
}

MutableTensorView output_view(const OutputArray& array, const char* name,
                              const std::string& element) {
  const TensorView view = view_of(nb::ndarray<nb::ro>(array), name, element);
  return MutableTensorView(const_cast<void*>(view.data()), view.dtype(), view.sizes(),
                           view.strides());
}

Array<int64_t> int_array(nb::handle values, const char* name) {
  if (values.is_none() || numpy_kind(values, name) != 'f') {
    return owned_array<int64_t>(values, "int64", name);
  }
  // Floats are taken only when they hold integers: numpy's cast would truncate 2.7 to 2.
  const Array<double> exact = owned_array<double>(values, "float64", name);
  std::vector<int64_t> integers;
  for (const double value : exact.values()) {
    if (!(std::isfinite(value) && value == std::floor(value))) {
      throw Error(std::string(name) + " must hold integers, found " + number_text(value) +
                  " at flat index " + std::to_string(integers.size()));
    }
    integers.push_back(static_cast<int64_t>(value));
  }
  return Array<int64_t>(exact.shape(), std::move(integers));
}

Array<uint8_t> bool_array(nb::handle values, const char* name) {
  if (values.is_none() || numpy_kind(values, name) == 'b') {
    return owned_array<uint8_t>(values, "uint8", name);
  }
  // Numbers must be 0 or 1, as in C++ (E29): a float mask given to keep()/blocked() is most
  // likely an additive mask (0 / -inf), whose truth values would mean the opposite.
  const Array<double> numbers = owned_array<double>(values, "float64", name);
  std::vector<uint8_t> flags;
  for (const double value : numbers.values()) {
    if (value != 0 && value != 1) {
      throw Error(std::string(name) + " must hold only 0 and 1 (or bools), found " +
                  number_text(value) + " at flat index " + std::to_string(flags.size()));
    }
    flags.push_back(static_cast<uint8_t>(value));
  }
  return Array<uint8_t>(numbers.shape(), std::move(flags));
}

Array<float> float_array(nb::handle values, const char* name) {
  return owned_array<float>(values, "float32", name);
}

Array<int64_t> index_array(nb::handle values, const char* name) {
  if (values.is_none()) return owned_array<int64_t>(values, "int64", name);  // "is None"
  nb::object readable;
  nb::object array;
  try {
    array = nb::module_::import_("numpy").attr("asarray")(numpy_readable(values, readable));
  } catch (const nb::python_error& error) {
    throw Error(std::string(name) +
                " cannot be read as an array: " + nb::cast<std::string>(nb::str(error.value())));
  }
  const char kind = nb::cast<std::string>(array.attr("dtype").attr("kind"))[0];
  // An empty list reads as float64: there is no index in it to be wrong.
  const nb::object size = array.attr("size");
  if (kind != 'i' && kind != 'u' && PyLong_AsSsize_t(size.ptr()) > 0) {
    throw Error(std::string(name) + " has dtype " +
                nb::cast<std::string>(nb::str(array.attr("dtype").attr("name"))) +
                "; it holds token indices: give integers (an int array or a list of ints, -1 for "
                "a root)");
  }
  return owned_array<int64_t>(array, "int64", name);
}

int64_t int_value(nb::handle value, const char* name) {
  // operator.index() accepts Python ints and NumPy/PyTorch integers; bools and floats are refused.
  if (!PyBool_Check(value.ptr()) && PyIndex_Check(value.ptr())) {
    const long long result = PyLong_AsLongLong(nb::steal(PyNumber_Index(value.ptr())).ptr());
    if (!(result == -1 && PyErr_Occurred())) return result;
    PyErr_Clear();
  }
  throw Error(std::string(name) + " must be an int, got " + nb::cast<std::string>(nb::repr(value)));
}

HeadSet head_set(nb::handle heads) {
  if (heads.is_none()) return {};
  const auto refuse = [&] {
    return Error("heads must be None, an int, a range or an iterable of ints, got " +
                 nb::cast<std::string>(nb::repr(heads)));
  };
  if (PyIndex_Check(heads.ptr()) && !PyBool_Check(heads.ptr()))
    return HeadSet{int_value(heads, "heads")};
  if (PyRange_Check(heads.ptr()) && int_value(heads.attr("step"), "heads.step") == 1) {
    return HeadSet::range(int_value(heads.attr("start"), "heads.start"),
                          int_value(heads.attr("stop"), "heads.stop"));
  }
  std::vector<int64_t> list;
  try {
    for (nb::handle head : heads) list.push_back(int_value(head, "heads"));
  } catch (const Error&) {
    throw refuse();
  } catch (const nb::python_error&) {  // not iterable
    throw refuse();
  }
  return HeadSet(std::move(list));
}

}  // namespace maskattn::python
