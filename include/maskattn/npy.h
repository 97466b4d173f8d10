// Reading and writing NumPy .npy files (format versions 1.0, 2.0, 3.0).
//
// Supported element types (little-endian, as numpy writes them on x86/ARM): float16/32/64, bool,
// int8/16/32/64, uint8/16/32/64; C and Fortran order (Fortran arrays are transposed to C order on
// read). Anything else — big-endian, structured or object dtypes, a malformed, truncated or
// oversized header, a shape whose data would not fit in the file — raises maskattn::Error naming
// the file, never reads past the data it was given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "maskattn/dtype.h"
#include "maskattn/shape.h"

namespace maskattn {

enum class NpyType : uint8_t { f2, f4, f8, b1, i1, i2, i4, i8, u1, u2, u4, u8 };

const char* npy_type_name(NpyType type);   // numpy's name: "float32", "bool", "uint16", ...
const char* npy_type_descr(NpyType type);  // the header's descr: "<f4", "|b1", ...
size_t npy_type_size(NpyType type);        // bytes per element

// An array as stored in a .npy file: element type, shape, raw little-endian bytes in C order.
class NpyArray {
 public:
  NpyArray() = default;
  // Throws Error if bytes.size() != numel(shape) · npy_type_size(type).
  NpyArray(NpyType type, Dims shape, std::vector<uint8_t> bytes);

  static NpyArray from_floats(const std::vector<float>& values, Dims shape);
  static NpyArray from_float16(const std::vector<float16>& values, Dims shape);
  static NpyArray from_int64(const std::vector<int64_t>& values, Dims shape);
  static NpyArray from_bools(const std::vector<uint8_t>& values, Dims shape);  // 0/1 → |b1

  NpyType type() const { return type_; }
  const Dims& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const;
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  bool is_float() const;  // f2, f4, f8

  // Element conversions. `what` names the array in error messages ("--q q.npy", "key lengths").
  // to_float32: float types only (float64 rounds to nearest f32); integers and bool are refused.
  std::vector<float> to_float32(const std::string& what) const;
  // to_float16: float16 arrays only, bits copied.
  std::vector<float16> to_float16(const std::string& what) const;
  // to_int64: bool and integer types only (uint64 values above INT64_MAX are refused).
  std::vector<int64_t> to_int64(const std::string& what) const;

 private:
  NpyType type_ = NpyType::f4;
  Dims shape_;
  std::vector<uint8_t> bytes_;
};

// What the header of a .npy image says, checked against the image's size: the data must fill the
// shape exactly (no truncated data, no trailing bytes).
struct NpyLayout {
  NpyType type = NpyType::f4;
  Dims shape;
  bool fortran_order = false;
  size_t data_offset = 0;  // where the element bytes start in the image
  size_t data_size = 0;    // numel · element size, the rest of the image
};
// Parses and checks the preamble and header only, with parse_npy's messages; reads no data byte.
NpyLayout parse_npy_layout(const uint8_t* data, size_t size, const std::string& name);

// Parses a whole .npy image held in memory; `name` is used in error messages.
NpyArray parse_npy(const uint8_t* data, size_t size, const std::string& name);
// Reads a file (through MappedNpy, then copied); errors name the path.
NpyArray read_npy(const std::string& path);

// A file mapped into memory with POSIX mmap; unmapped on destruction. Move-only.
class MappedFile {
 public:
  MappedFile() = default;
  // The whole file, read-only. Errors name the path: "cannot open '…': …", and "cannot read '…'"
  // for directories and other files that are not regular files (FIFOs are not waited on).
  static MappedFile open_read_only(const std::string& path);
  // The first `size` bytes of the open file `fd`, readable and writable, shared with the file:
  // what is stored there is the file's content. `path` names the file in messages.
  static MappedFile map_writable(int fd, size_t size, const std::string& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  uint8_t* mutable_data() { return data_; }  // only for map_writable
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;  // null for an empty file: mmap cannot map 0 bytes
  size_t size_ = 0;
};

// A .npy file used in place, as numpy.load(path, mmap_mode="r") does: the header is parsed and
// checked as read_npy does (same errors), but the elements stay in the file's read-only mapping,
// and the kernel's reads load its pages. The file must not shrink while it is mapped: like any
// mapped file, reading a page that no longer exists raises SIGBUS.
class MappedNpy {
 public:
  explicit MappedNpy(const std::string& path);

  const NpyLayout& layout() const { return layout_; }
  NpyType type() const { return layout_.type; }
  const Dims& shape() const { return layout_.shape; }
  const std::string& path() const { return path_; }
  // The element bytes, usable in place: C order (a Fortran-order array of rank > 1 is not) and
  // aligned to the element size (numpy aligns its data to 64 bytes; a hand-written header may
  // not). Null when they are not; then to_array() makes the C-order copy.
  const uint8_t* c_order_data() const;
  // The array as read_npy returns it: a C-order copy (Fortran order transposed, bools checked).
  NpyArray to_array() const;

 private:
  std::string path_;
  MappedFile file_;
  NpyLayout layout_;
};

// Format 1.0 (2.0 when the header needs it), C order, header padded to a multiple of 64 bytes.
std::vector<uint8_t> serialize_npy(const NpyArray& array);
// The bytes before the data of such a file holding `shape` of `type`: magic, version, header.
// Its length is a multiple of 64, so the data that follows is aligned like numpy's.
std::vector<uint8_t> serialize_npy_header(NpyType type, const Dims& shape);
// Writes the file; throws Error naming the path if it cannot be written completely.
void write_npy(const std::string& path, const NpyArray& array);

}  // namespace maskattn
