// NpyArray: a parsed .npy array's type, shape and bytes, and its conversions to the element types
// the library computes with (reading and parsing: npy.cc; writing: npy_write.cc).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "maskattn/error.h"
#include "maskattn/npy.h"
#include "npy_internal.h"

namespace maskattn {
namespace {

using npy_detail::checked_byte_size;
using npy_detail::shape_and_type;

template <typename T>
T load(const uint8_t* bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof(T));
  return value;
}

template <typename T>
std::vector<T> load_all(const std::vector<uint8_t>& bytes) {
  std::vector<T> values(bytes.size() / sizeof(T));
  if (!values.empty()) std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  return values;
}

template <typename T>
std::vector<uint8_t> store_all(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// Checks that `values` fills `shape` before building the array, so the message counts elements.
template <typename T>
NpyArray array_from(NpyType type, const std::vector<T>& values, Dims shape, const char* what) {
  const int64_t numel = checked_numel(shape, what);
  if (static_cast<uint64_t>(numel) != values.size()) {
    throw Error(std::string(what) + ": " + std::to_string(values.size()) +
                " values do not fill shape " + shape_string(shape) + " (" + std::to_string(numel) +
                " elements)");
  }
  return NpyArray(type, std::move(shape), store_all(values));
}

template <typename T>
std::vector<int64_t> widen_to_int64(const std::vector<uint8_t>& bytes) {
  const std::vector<T> values = load_all<T>(bytes);
  return std::vector<int64_t>(values.begin(), values.end());
}

}  // namespace

NpyArray::NpyArray(NpyType type, Dims shape, std::vector<uint8_t> bytes)
    : type_(type), shape_(std::move(shape)), bytes_(std::move(bytes)) {
  const int64_t expected = checked_byte_size(type_, shape_, "NpyArray");
  if (static_cast<uint64_t>(expected) != bytes_.size()) {
    throw Error("NpyArray: " + shape_and_type(shape_, type_) + " needs " +
                std::to_string(expected) + " bytes, got " + std::to_string(bytes_.size()));
  }
}

NpyArray NpyArray::from_floats(const std::vector<float>& values, Dims shape) {
  return array_from(NpyType::f4, values, std::move(shape), "from_floats");
}

NpyArray NpyArray::from_float16(const std::vector<float16>& values, Dims shape) {
  return array_from(NpyType::f2, values, std::move(shape), "from_float16");
}

NpyArray NpyArray::from_int64(const std::vector<int64_t>& values, Dims shape) {
  return array_from(NpyType::i8, values, std::move(shape), "from_int64");
}

NpyArray NpyArray::from_bools(const std::vector<uint8_t>& values, Dims shape) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] > 1) {
      throw Error("from_bools: value " + std::to_string(values[i]) + " at index " +
                  std::to_string(i) + " is not 0 or 1");
    }
  }
  return array_from(NpyType::b1, values, std::move(shape), "from_bools");
}

int64_t NpyArray::numel() const {
  return checked_numel(shape_, "NpyArray");
}

bool NpyArray::is_float() const {
  return type_ == NpyType::f2 || type_ == NpyType::f4 || type_ == NpyType::f8;
}

namespace {

// "%.17g" trimmed by "%g" when that round-trips: 1e+300, -1.7976931348623157e+308.
std::string shortest_double(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  if (std::strtod(text, nullptr) != value) std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

}  // namespace

// The conversions size their output from bytes_, not from the shape, so even a default-constructed
// array (shape [], no bytes) cannot make them read past the data.

std::vector<float> NpyArray::to_float32(const std::string& what) const {
  switch (type_) {
    case NpyType::f2: {
      std::vector<float> out;
      for (float16 value : load_all<float16>(bytes_)) out.push_back(to_float(value));
      return out;
    }
    case NpyType::f4:
      return load_all<float>(bytes_);
    case NpyType::f8: {
      // A finite value beyond the float32 range would silently become ±inf (and −inf hides a
      // pair in an additive mask), so it is refused rather than rounded.
      std::vector<float> out;
      const std::vector<double> values = load_all<double>(bytes_);
      for (size_t i = 0; i < values.size(); ++i) {
        const float value = float_from_double(values[i]);
        if (std::isinf(value) && std::isfinite(values[i])) {
          throw Error(what + " value " + shortest_double(values[i]) + " at flat index " +
                      std::to_string(i) + " is outside the float32 range (±3.4e38)");
        }
        out.push_back(value);
      }
      return out;
    }
    default:
      throw Error(what + " has dtype " + npy_type_name(type_) +
                  "; expected float16, float32 or float64");
  }
}

std::vector<float16> NpyArray::to_float16(const std::string& what) const {
  if (type_ != NpyType::f2) {
    throw Error(what + " has dtype " + npy_type_name(type_) + "; expected float16");
  }
  return load_all<float16>(bytes_);
}

std::vector<int64_t> NpyArray::to_int64(const std::string& what) const {
  switch (type_) {
    case NpyType::b1:
    case NpyType::u1:
      return widen_to_int64<uint8_t>(bytes_);
    case NpyType::i1:
      return widen_to_int64<int8_t>(bytes_);
    case NpyType::i2:
      return widen_to_int64<int16_t>(bytes_);
    case NpyType::u2:
      return widen_to_int64<uint16_t>(bytes_);
    case NpyType::i4:
      return widen_to_int64<int32_t>(bytes_);
    case NpyType::u4:
      return widen_to_int64<uint32_t>(bytes_);
    case NpyType::i8:
      return load_all<int64_t>(bytes_);
    case NpyType::u8: {
      const std::vector<uint64_t> values = load_all<uint64_t>(bytes_);
      for (size_t i = 0; i < values.size(); ++i) {
        if (values[i] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          throw Error(what + " value " + std::to_string(values[i]) + " at index " +
                      std::to_string(i) + " does not fit in int64");
        }
      }
      return std::vector<int64_t>(values.begin(), values.end());
    }
    default:
      throw Error(what + " has dtype " + npy_type_name(type_) +
                  "; expected bool or an integer type");
  }
}

}  // namespace maskattn
