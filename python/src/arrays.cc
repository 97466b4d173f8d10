#include "arrays.h"

#include <cstdint>
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

// numpy.ascontiguousarray(values, dtype=...), with a catalogue message when it cannot.
nb::object numpy_copy(nb::handle values, const char* dtype, const char* name) {
  nb::module_ numpy = nb::module_::import_("numpy");
  if (nb::hasattr(values, "detach")) values = values.attr("detach")();  // torch: drop autograd
  try {
    return numpy.attr("ascontiguousarray")(values, nb::arg("dtype") = numpy.attr(dtype));
  } catch (const nb::python_error& error) {
    throw Error(std::string(name) + " cannot be read as an array of " + dtype + ": " +
                error.what());
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
  return owned_array<int64_t>(values, "int64", name);
}

Array<uint8_t> bool_array(nb::handle values, const char* name) {
  // Through bool first, so that any nonzero number means "set", as numpy's and torch's own
  // bool masks do; a uint8 0/1 array stays as it is.
  nb::object as_bool = numpy_copy(values, "bool_", name);
  return owned_array<uint8_t>(as_bool, "uint8", name);
}

Array<float> float_array(nb::handle values, const char* name) {
  return owned_array<float>(values, "float32", name);
}

HeadSet head_set(nb::handle heads) {
  if (heads.is_none()) return {};
  if (nb::isinstance<nb::int_>(heads)) return HeadSet{nb::cast<int64_t>(heads)};
  nb::module_ builtins = nb::module_::import_("builtins");
  if (nb::isinstance(heads, builtins.attr("range"))) {
    const auto step = nb::cast<int64_t>(heads.attr("step"));
    const auto start = nb::cast<int64_t>(heads.attr("start"));
    const auto stop = nb::cast<int64_t>(heads.attr("stop"));
    if (step == 1) return HeadSet::range(start, stop);
  }
  std::vector<int64_t> list;
  try {
    for (nb::handle head : heads) list.push_back(nb::cast<int64_t>(head));
  } catch (const std::exception&) {
    throw Error("heads must be None, an int, a range or an iterable of ints, got " +
                nb::cast<std::string>(nb::repr(heads)));
  }
  return HeadSet(std::move(list));
}

Kernel kernel_named(const std::string& name) {
  if (name == "auto") return Kernel::automatic;
  if (name == "reference") return Kernel::reference;
  if (name == "fused") return Kernel::fused;
  throw Error("kernel must be \"auto\", \"reference\" or \"fused\", got \"" + name + "\"");
}

}  // namespace maskattn::python
