// NumPy .npy reading (writing: npy_write.cc). Format reference: numpy/lib/format.py and NEP 1.
//
// Layout: magic "\x93NUMPY", major and minor version bytes, the header length (uint16 LE for 1.0,
// uint32 LE for 2.0/3.0), the header (a Python dict literal padded with spaces and ending in
// '\n'), then the raw element bytes.
#include "maskattn/npy.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <string_view>

#include "maskattn/error.h"
#include "npy_internal.h"

namespace maskattn {
namespace {

using npy_detail::checked_byte_size;
using npy_detail::kMagic;
using npy_detail::shape_and_type;

constexpr size_t kMaxRank = 32;  // numpy 1.x's NPY_MAXDIMS

static_assert(sizeof(float16) == 2, "float16 must be exactly its 16 bits to be memcpy'd");

struct TypeInfo {
  NpyType type;
  const char* name;
  const char* descr;
  size_t size;
};

// Indexed by the NpyType value.
constexpr TypeInfo kTypes[] = {
    {NpyType::f2, "float16", "<f2", 2}, {NpyType::f4, "float32", "<f4", 4},
    {NpyType::f8, "float64", "<f8", 8}, {NpyType::b1, "bool", "|b1", 1},
    {NpyType::i1, "int8", "|i1", 1},    {NpyType::i2, "int16", "<i2", 2},
    {NpyType::i4, "int32", "<i4", 4},   {NpyType::i8, "int64", "<i8", 8},
    {NpyType::u1, "uint8", "|u1", 1},   {NpyType::u2, "uint16", "<u2", 2},
    {NpyType::u4, "uint32", "<u4", 4},  {NpyType::u8, "uint64", "<u8", 8},
};

constexpr bool types_indexed_by_value() {
  for (size_t i = 0; i < std::size(kTypes); ++i) {
    if (static_cast<size_t>(kTypes[i].type) != i) return false;
  }
  return true;
}
static_assert(types_indexed_by_value(), "kTypes must list the types in NpyType order");

const TypeInfo& type_info(NpyType type) {
  const auto index = static_cast<size_t>(type);
  if (index >= std::size(kTypes)) {
    throw Error("invalid NpyType value " + std::to_string(index));
  }
  return kTypes[index];
}

// Renders untrusted header text for an error message: quoted, non-printable bytes escaped, long
// text cut short so that a hostile header cannot produce a megabyte-sized message.
std::string excerpt(std::string_view text) {
  constexpr size_t kMaxShown = 40;
  std::string out = "'";
  for (size_t i = 0; i < text.size() && i < kMaxShown; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte >= 0x20 && byte < 0x7F) {
      out += static_cast<char>(byte);
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xF];
    }
  }
  if (text.size() > kMaxShown) out += "...";
  return out + "'";
}

// ---------------------------------------------------------------------------------------------
// Header parsing

struct NpyHeader {
  NpyType type = NpyType::f4;
  bool fortran_order = false;
  Dims shape;
};

// Maps a descr such as "<f4" to a type. Byte order: '<' little-endian, '=' native (little-endian
// on every host this library supports), '|' not applicable (1-byte types only), '>' big-endian.
NpyType type_from_descr(const std::string& descr, const std::string& name) {
  const TypeInfo* match = nullptr;
  for (const TypeInfo& info : kTypes) {
    if (descr.size() >= 2 && descr.compare(1, std::string::npos, info.descr + 1) == 0) {
      match = &info;
    }
  }
  if (match == nullptr) {
    throw Error(name + ": unsupported dtype " + excerpt(descr) +
                " (supported: float16/32/64, bool, int8/16/32/64, uint8/16/32/64)");
  }
  const char order = descr[0];
  // A single byte has no byte order, so every order character describes the same data.
  if (match->size == 1 && (order == '|' || order == '<' || order == '=' || order == '>')) {
    return match->type;
  }
  if (order == '<' || order == '=') return match->type;
  if (order == '>') {
    throw Error(name + ": big-endian dtype " + excerpt(descr) +
                " is unsupported; convert the array to little-endian first, e.g. arr.astype('<" +
                std::string(match->descr + 1) + "')");
  }
  throw Error(name + ": unsupported dtype " + excerpt(descr) + " (a " + match->name +
              " descr must start with '<')");
}

// A strict recursive-descent parser for the subset of Python literal syntax numpy writes:
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// Keys may come in any order, strings may use either quote, whitespace is free, trailing commas
// are allowed, and integers may carry Python 2's 'L' suffix.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& name) : text_(text), name_(name) {}

  NpyHeader parse() {
    NpyHeader header;
    bool seen_descr = false, seen_fortran_order = false, seen_shape = false;
    skip_space();
    expect('{', "'{' at the start of the header (it must be a Python dict)");
    while (true) {
      skip_space();
      if (consume('}')) break;
      if (!at_quote()) fail("expected a quoted key or '}'");
      const std::string key = parse_string();
      skip_space();
      expect(':', "':' after key " + excerpt(key));
      skip_space();
      if (key == "descr") {
        mark_seen(seen_descr, key);
        header.type = type_from_descr(parse_descr(), name_);
      } else if (key == "fortran_order") {
        mark_seen(seen_fortran_order, key);
        header.fortran_order = parse_bool(key);
      } else if (key == "shape") {
        mark_seen(seen_shape, key);
        header.shape = parse_shape();
      } else {
        fail("unknown key " + excerpt(key) + " (expected 'descr', 'fortran_order' and 'shape')");
      }
      skip_space();
      if (consume(',')) continue;
      expect('}', "',' or '}' after the value of " + excerpt(key));
      break;
    }
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the closing '}'");
    if (!seen_descr) fail("missing key 'descr'");
    if (!seen_fortran_order) fail("missing key 'fortran_order'");
    if (!seen_shape) fail("missing key 'shape'");
    return header;
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const {
    throw Error(name_ + ": invalid .npy header: " + problem + " (at header byte " +
                std::to_string(pos_) + ")");
  }

  void mark_seen(bool& seen, const std::string& key) const {
    if (seen) fail("duplicate key " + excerpt(key));
    seen = true;
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }
  bool at_quote() const { return !at_end() && (peek() == '\'' || peek() == '"'); }
  static bool is_digit(char c) { return c >= '0' && c <= '9'; }

  void skip_space() {
    while (!at_end() && std::strchr(" \t\n\r\f\v", text_[pos_]) != nullptr) ++pos_;
  }

  bool consume(char c) {
    if (at_end() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }

  // Consumes `c` or fails with "expected <expectation>, found <what is there>".
  void expect(char c, const std::string& expectation) {
    if (consume(c)) return;
    const std::string found = at_end() ? "the end of the header" : excerpt(text_.substr(pos_, 1));
    fail("expected " + expectation + ", found " + found);
  }

  // A quoted string without escapes: numpy never needs them for the values we accept.
  std::string parse_string() {
    const char quote = text_[pos_++];
    const size_t start = pos_;
    while (!at_end() && text_[pos_] != quote) {
      if (text_[pos_] == '\\') fail("escape sequences in strings are not supported");
      if (text_[pos_] == '\n') break;
      ++pos_;
    }
    if (at_end() || text_[pos_] != quote) fail("unterminated string");
    ++pos_;
    return std::string(text_.substr(start, pos_ - 1 - start));
  }

  std::string parse_descr() {
    if (peek() == '[') {
      fail("structured dtypes (a 'descr' list of fields) are unsupported; save a plain array");
    }
    if (!at_quote()) fail("'descr' must be a string such as '<f4'");
    return parse_string();
  }

  // A bare word such as True or 123L.
  std::string_view parse_word() {
    const size_t start = pos_;
    while (!at_end() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) != 0 || text_[pos_] == '_')) {
      ++pos_;
    }
    return text_.substr(start, pos_ - start);
  }

  bool parse_bool(const std::string& key) {
    const size_t start = pos_;
    const std::string_view word = parse_word();
    if (word == "True") return true;
    if (word == "False") return false;
    pos_ = start;
    fail(excerpt(key) + " must be True or False");
  }

  Dims parse_shape() {
    if (!consume('(')) fail("'shape' must be a tuple of ints such as (2, 3)");
    Dims shape;
    skip_space();
    if (consume(')')) return shape;  // () is a scalar
    bool saw_comma = false;
    while (true) {
      shape.push_back(parse_dim());
      if (shape.size() > kMaxRank) {
        fail("'shape' has more than " + std::to_string(kMaxRank) + " dimensions");
      }
      skip_space();
      if (consume(',')) {
        saw_comma = true;
        skip_space();
        if (consume(')')) break;
        continue;
      }
      expect(')', "',' or ')' in 'shape'");
      break;
    }
    // In Python (5) is just the int 5, which numpy refuses as a shape too.
    if (shape.size() == 1 && !saw_comma) {
      const std::string size = std::to_string(shape[0]);
      fail("'shape' (" + size + ") is not a tuple; a one-dimensional shape is written (" + size +
           ",)");
    }
    return shape;
  }

  int64_t parse_dim() {
    if (peek() == '-') fail("'shape' has a negative size");
    if (!is_digit(peek())) fail("expected a non-negative integer in 'shape'");
    int64_t value = 0;
    while (is_digit(peek())) {
      const int digit = text_[pos_] - '0';
      if (value > (std::numeric_limits<int64_t>::max() - digit) / 10) {
        fail("a 'shape' size is too large for int64");
      }
      value = value * 10 + digit;
      ++pos_;
    }
    consume('L');  // Python 2 wrote long integers as 123L
    return value;
  }

  std::string_view text_;
  const std::string& name_;
  size_t pos_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Preamble: magic, version and header length

struct Preamble {
  size_t header_offset = 0;  // where the dict text starts
  size_t header_size = 0;
};

uint32_t read_le(const uint8_t* bytes, size_t count) {
  uint32_t value = 0;
  for (size_t i = count; i-- > 0;) value = (value << 8) | bytes[i];
  return value;
}

Preamble parse_preamble(const uint8_t* data, size_t size, const std::string& name) {
  const size_t magic_present = std::min(size, kMagic.size());
  if (magic_present > 0 && std::memcmp(data, kMagic.data(), magic_present) != 0) {
    throw Error(name + ": not a .npy file (it does not start with \"\\x93NUMPY\")");
  }
  const std::string too_short = name + ": truncated preamble: file has " + std::to_string(size) +
                                " bytes, too few for the .npy magic, version and header length";
  if (size < kMagic.size() + 2) throw Error(too_short);
  const int major = data[6], minor = data[7];
  if ((major < 1 || major > 3) || minor != 0) {
    throw Error(name + ": unsupported .npy format version " + std::to_string(major) + "." +
                std::to_string(minor) + " (supported: 1.0, 2.0, 3.0)");
  }
  const size_t length_size = major == 1 ? 2 : 4;
  Preamble preamble;
  preamble.header_offset = kMagic.size() + 2 + length_size;
  if (size < preamble.header_offset) throw Error(too_short);
  preamble.header_size = read_le(data + 8, length_size);
  const size_t available = size - preamble.header_offset;
  if (preamble.header_size > available) {
    throw Error(name + ": truncated header: it should be " + std::to_string(preamble.header_size) +
                " bytes, file has " + std::to_string(available) + " after the preamble");
  }
  return preamble;
}

// ---------------------------------------------------------------------------------------------
// Data

// numpy writes a Fortran-order array as the C-order bytes of its transpose: the first index
// varies fastest. Walks the source in that order with an odometer and scatters each element to
// its C-order position. The header parser caps the rank at kMaxRank, so the odometer fits in
// fixed arrays.
std::vector<uint8_t> fortran_to_c_order(const uint8_t* data, const Dims& shape, int64_t numel,
                                        size_t element_size) {
  const size_t rank = shape.size();
  if (rank > kMaxRank) throw Error("fortran_to_c_order: rank " + std::to_string(rank) + " > 32");
  std::vector<uint8_t> out(static_cast<size_t>(numel) * element_size);
  std::array<int64_t, kMaxRank> c_stride{};
  int64_t stride = 1;
  for (size_t axis = rank; axis-- > 0;) {
    c_stride[axis] = stride;
    stride *= shape[axis];
  }
  std::array<int64_t, kMaxRank> index{};
  int64_t target = 0;
  for (int64_t source = 0; source < numel; ++source) {
    std::memcpy(out.data() + target * element_size, data + source * element_size, element_size);
    for (size_t axis = 0; axis < rank; ++axis) {
      target += c_stride[axis];
      if (++index[axis] < shape[axis]) break;
      target -= c_stride[axis] * shape[axis];
      index[axis] = 0;
    }
  }
  return out;
}

}  // namespace

namespace npy_detail {

// Bytes needed to hold `shape` of `type`; throws Error starting with `what` if that overflows.
int64_t checked_byte_size(NpyType type, const Dims& shape, const std::string& what) {
  const int64_t numel = checked_numel(shape, what);
  const auto element_size = static_cast<int64_t>(npy_type_size(type));
  if (numel > std::numeric_limits<int64_t>::max() / element_size) {
    throw Error(what + " shape " + shape_string(shape) + " of " + npy_type_name(type) +
                " is too large: its data size overflows int64");
  }
  return numel * element_size;
}

std::string shape_and_type(const Dims& shape, NpyType type) {
  return "shape " + shape_string(shape) + " of " + npy_type_name(type);
}

}  // namespace npy_detail

const char* npy_type_name(NpyType type) {
  return type_info(type).name;
}
const char* npy_type_descr(NpyType type) {
  return type_info(type).descr;
}
size_t npy_type_size(NpyType type) {
  return type_info(type).size;
}

// ---------------------------------------------------------------------------------------------
// Files and images

NpyLayout parse_npy_layout(const uint8_t* data, size_t size, const std::string& name) {
  const Preamble preamble = parse_preamble(data, size, name);
  const std::string_view text(reinterpret_cast<const char*>(data) + preamble.header_offset,
                              preamble.header_size);
  const NpyHeader header = HeaderParser(text, name).parse();

  // Everything below is checked against the bytes actually present before anything is allocated,
  // so a header claiming an enormous shape costs nothing.
  const auto needed =
      static_cast<uint64_t>(checked_byte_size(header.type, header.shape, name + ": header"));
  const size_t data_offset = preamble.header_offset + preamble.header_size;
  const size_t available = size - data_offset;
  const std::string sizes = shape_and_type(header.shape, header.type) + " needs " +
                            std::to_string(needed) + " bytes, file has " +
                            std::to_string(available);
  if (needed > available) throw Error(name + ": truncated data: " + sizes);
  if (needed < available) {
    throw Error(name + ": " + std::to_string(available - needed) +
                " trailing bytes after the data: " + sizes);
  }
  NpyLayout layout;
  layout.type = header.type;
  layout.shape = header.shape;
  layout.fortran_order = header.fortran_order;
  layout.data_offset = data_offset;
  layout.data_size = static_cast<size_t>(needed);
  return layout;
}

namespace npy_detail {

void check_bools(const uint8_t* bytes, size_t count, const std::string& name) {
  for (size_t i = 0; i < count; ++i) {
    if (bytes[i] > 1) {
      throw Error(name + ": bool element " + std::to_string(i) + " has byte value " +
                  std::to_string(bytes[i]) + "; expected 0 or 1");
    }
  }
}

NpyArray array_from_layout(const uint8_t* data, const NpyLayout& layout, const std::string& name) {
  const uint8_t* payload = data + layout.data_offset;
  const size_t element_size = npy_type_size(layout.type);
  std::vector<uint8_t> bytes =
      layout.fortran_order && layout.shape.size() > 1
          ? fortran_to_c_order(payload, layout.shape,
                               static_cast<int64_t>(layout.data_size / element_size), element_size)
          : std::vector<uint8_t>(payload, payload + layout.data_size);
  if (layout.type == NpyType::b1) check_bools(bytes.data(), bytes.size(), name);
  return NpyArray(layout.type, layout.shape, std::move(bytes));
}

}  // namespace npy_detail

NpyArray parse_npy(const uint8_t* data, size_t size, const std::string& name) {
  return npy_detail::array_from_layout(data, parse_npy_layout(data, size, name), name);
}

NpyArray read_npy(const std::string& path) {
  return MappedNpy(path).to_array();
}

}  // namespace maskattn
