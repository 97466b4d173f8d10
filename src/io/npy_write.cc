// NumPy .npy writing: the header exactly as numpy writes it, then the data.
#include <cerrno>
#include <cstdio>
#include <limits>
#include <memory>
#include <system_error>

#include "maskattn/error.h"
#include "maskattn/npy.h"
#include "npy_internal.h"

namespace maskattn {
namespace {

using npy_detail::checked_byte_size;
using npy_detail::kMagic;
using npy_detail::shape_and_type;

constexpr size_t kAlignment = 64;  // numpy's ARRAY_ALIGN: data starts on a 64-byte boundary
// numpy leaves room to rewrite shape[0] in place with up to this many digits (numpy >= 1.24).
constexpr size_t kGrowthAxisMaxDigits = 21;

// Python's repr of a tuple: () for a scalar, (5,) for rank 1, (2, 3) otherwise.
std::string shape_tuple(const Dims& shape) {
  std::string text = "(";
  for (size_t axis = 0; axis < shape.size(); ++axis) {
    if (axis > 0) text += ", ";
    text += std::to_string(shape[axis]);
  }
  if (shape.size() == 1) text += ",";
  return text + ")";
}

// The dict exactly as numpy's _write_array_header prints it (keys sorted), including the spare
// spaces that let shape[0] grow in place.
std::string header_dict(NpyType type, const Dims& shape) {
  std::string dict = std::string("{'descr': '") + npy_type_descr(type) +
                     "', 'fortran_order': False, 'shape': " + shape_tuple(shape) + ", }";
  if (!shape.empty()) {
    const size_t digits = std::to_string(shape[0]).size();
    dict.append(kGrowthAxisMaxDigits - std::min(digits, kGrowthAxisMaxDigits), ' ');
  }
  return dict;
}

// numpy's _wrap_header: spaces then '\n' so that the data starts on a 64-byte boundary. numpy
// computes the padding as 64 - (length % 64), so an already aligned header gains a full 64.
std::string padded_header(const std::string& dict, size_t preamble_size) {
  const size_t unpadded = preamble_size + dict.size() + 1;
  return dict + std::string(kAlignment - unpadded % kAlignment, ' ') + "\n";
}

void append_le(std::vector<uint8_t>& out, uint32_t value, size_t count) {
  for (size_t i = 0; i < count; ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

// ---------------------------------------------------------------------------------------------
// Files

std::string errno_message(int error) {
  return std::generic_category().message(error);
}

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

}  // namespace

std::vector<uint8_t> serialize_npy_header(NpyType type, const Dims& shape) {
  const std::string dict = header_dict(type, shape);
  // Like numpy: format 1.0 when the header fits its uint16 length, else 2.0 (uint32).
  uint8_t major = 1;
  size_t length_size = 2;
  std::string header = padded_header(dict, kMagic.size() + 2 + length_size);
  if (header.size() > std::numeric_limits<uint16_t>::max()) {
    major = 2;
    length_size = 4;
    header = padded_header(dict, kMagic.size() + 2 + length_size);
  }
  if (header.size() > std::numeric_limits<uint32_t>::max()) {
    throw Error("serialize_npy: header for rank " + std::to_string(shape.size()) +
                " does not fit in a .npy file");
  }
  std::vector<uint8_t> out(kMagic.begin(), kMagic.end());
  out.push_back(major);
  out.push_back(0);
  append_le(out, static_cast<uint32_t>(header.size()), length_size);
  out.insert(out.end(), header.begin(), header.end());
  return out;
}

std::vector<uint8_t> serialize_npy(const NpyArray& array) {
  // A default-constructed NpyArray holds no bytes for its scalar shape; refuse to write it.
  const int64_t data_size = checked_byte_size(array.type(), array.shape(), "serialize_npy");
  if (static_cast<uint64_t>(data_size) != array.bytes().size()) {
    throw Error("serialize_npy: " + shape_and_type(array.shape(), array.type()) + " needs " +
                std::to_string(data_size) + " bytes, the array holds " +
                std::to_string(array.bytes().size()));
  }
  std::vector<uint8_t> out = serialize_npy_header(array.type(), array.shape());
  out.insert(out.end(), array.bytes().begin(), array.bytes().end());
  return out;
}

void write_npy(const std::string& path, const NpyArray& array) {
  const std::vector<uint8_t> image = serialize_npy(array);
  FilePtr file(std::fopen(path.c_str(), "wb"));
  if (!file) throw Error("cannot create '" + path + "': " + errno_message(errno));
  if (std::fwrite(image.data(), 1, image.size(), file.get()) != image.size()) {
    throw Error("cannot write '" + path + "': " + errno_message(errno));
  }
  // Buffered data only reaches the disk on close, where e.g. "No space left on device" shows up.
  if (std::fclose(file.release()) != 0) {
    throw Error("cannot write '" + path + "': " + errno_message(errno));
  }
}

}  // namespace maskattn
