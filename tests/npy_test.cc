// Tests for the .npy reader/writer. Golden bytes are written out by hand from the format as numpy
// 1.24 writes it (numpy is not a test dependency): magic "\x93NUMPY", version bytes, little-endian
// header length, the dict with keys sorted, 21 - len(str(shape[0])) spare spaces, then spaces and
// '\n' up to a multiple of 64 bytes (a full extra 64 if already aligned).
#include "maskattn/npy.h"

#include <gtest/gtest.h>
#include <stdlib.h>    // mkdtemp
#include <sys/stat.h>  // mkfifo

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "maskattn/error.h"

namespace maskattn {
namespace {

using namespace std::string_literals;
using namespace std::string_view_literals;

constexpr NpyType kAllTypes[] = {NpyType::f2, NpyType::f4, NpyType::f8, NpyType::b1,
                                 NpyType::i1, NpyType::i2, NpyType::i4, NpyType::i8,
                                 NpyType::u1, NpyType::u2, NpyType::u4, NpyType::u8};

std::vector<uint8_t> to_bytes(std::string_view text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

template <typename T>
std::vector<uint8_t> raw_bytes(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

void append(std::vector<uint8_t>& out, const std::vector<uint8_t>& more) {
  out.insert(out.end(), more.begin(), more.end());
}

// A .npy image with `header` taken verbatim (no padding added), for hand-written test headers.
std::vector<uint8_t> npy_image(uint8_t major, std::string_view header, std::string_view data = "") {
  std::vector<uint8_t> out = to_bytes("\x93NUMPY"sv);
  out.push_back(major);
  out.push_back(0);
  const size_t length_size = major == 1 ? 2 : 4;
  for (size_t i = 0; i < length_size; ++i) out.push_back((header.size() >> (8 * i)) & 0xFF);
  append(out, to_bytes(header));
  append(out, to_bytes(data));
  return out;
}

NpyArray parse(const std::vector<uint8_t>& image, const std::string& name = "test.npy") {
  return parse_npy(image.data(), image.size(), name);
}

// The message of the Error that `parse` raises, or a note saying it did not raise.
std::string parse_error(const std::vector<uint8_t>& image, const std::string& name = "test.npy") {
  try {
    parse(image, name);
  } catch (const Error& error) {
    return error.what();
  }
  return "<no error>";
}

// Distinct, deterministic bytes; bool arrays get the only legal values, 0 and 1.
std::vector<uint8_t> sample_bytes(NpyType type, const Dims& shape) {
  const int64_t numel = checked_numel(shape, "sample");
  std::vector<uint8_t> bytes(static_cast<size_t>(numel) * npy_type_size(type));
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = type == NpyType::b1 ? i % 2 : static_cast<uint8_t>(i * 37 + 11);
  }
  return bytes;
}

// A fresh directory under /tmp, removed with everything in it when the test ends.
class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/maskattn_npy_test_XXXXXX";
    if (mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_raw(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

const std::string kPrefix10 = "\x93NUMPY\x01\x00"s + "v\x00"s;  // version 1.0, header 118 bytes

// ---------------------------------------------------------------------------------------------
// Types and NpyArray

TEST(NpyType, NamesDescrsAndSizesMatchNumpy) {
  const char* const names[] = {"float16", "float32", "float64", "bool",   "int8",   "int16",
                               "int32",   "int64",   "uint8",   "uint16", "uint32", "uint64"};
  const char* const descrs[] = {"<f2", "<f4", "<f8", "|b1", "|i1", "<i2",
                                "<i4", "<i8", "|u1", "<u2", "<u4", "<u8"};
  const size_t sizes[] = {2, 4, 8, 1, 1, 2, 4, 8, 1, 2, 4, 8};
  for (size_t i = 0; i < std::size(kAllTypes); ++i) {
    EXPECT_STREQ(npy_type_name(kAllTypes[i]), names[i]);
    EXPECT_STREQ(npy_type_descr(kAllTypes[i]), descrs[i]);
    EXPECT_EQ(npy_type_size(kAllTypes[i]), sizes[i]);
  }
}

TEST(NpyArray, ConstructorRejectsWrongByteCount) {
  try {
    NpyArray(NpyType::f4, {2, 3}, std::vector<uint8_t>(20));
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "NpyArray: shape [2,3] of float32 needs 24 bytes, got 20");
  }
}

TEST(NpyArray, ConstructorRejectsNegativeShape) {
  EXPECT_THROW(NpyArray(NpyType::u1, {-1}, {}), Error);
}

TEST(NpyArray, ScalarHasOneElement) {
  const NpyArray scalar = NpyArray::from_int64({7}, {});
  EXPECT_EQ(scalar.rank(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.bytes().size(), 8u);
}

TEST(NpyArray, FromFloatsRejectsValueCountMismatch) {
  try {
    NpyArray::from_floats({1, 2, 3, 4, 5}, {2, 3});
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "from_floats: 5 values do not fill shape [2,3] (6 elements)");
  }
}

TEST(NpyArray, FromBoolsRejectsValuesOtherThanZeroAndOne) {
  try {
    NpyArray::from_bools({0, 1, 2}, {3});
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "from_bools: value 2 at index 2 is not 0 or 1");
  }
}

TEST(NpyArray, FromHelpersSetTypeAndBytes) {
  EXPECT_EQ(NpyArray::from_floats({1.5f}, {1}).type(), NpyType::f4);
  EXPECT_EQ(NpyArray::from_float16({float16{0x3C00}}, {1}).bytes(),
            (std::vector<uint8_t>{0, 0x3C}));
  EXPECT_EQ(NpyArray::from_int64({-2}, {}).bytes(),
            (std::vector<uint8_t>{0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}));
  const NpyArray bools = NpyArray::from_bools({1, 0}, {2});
  EXPECT_EQ(bools.type(), NpyType::b1);
  EXPECT_EQ(bools.bytes(), (std::vector<uint8_t>{1, 0}));
  EXPECT_TRUE(NpyArray::from_float16({}, {0}).is_float());
  EXPECT_FALSE(bools.is_float());
}

// ---------------------------------------------------------------------------------------------
// Round trips: every type, ranks 0..4 and empty arrays

const std::vector<Dims> kRoundTripShapes = {{},           {5}, {2, 3},   {2, 3, 4},
                                            {2, 1, 3, 2}, {0}, {3, 0, 2}};

class NpyRoundTrip : public ::testing::TestWithParam<NpyType> {};

TEST_P(NpyRoundTrip, SerializeThenParse) {
  for (const Dims& shape : kRoundTripShapes) {
    SCOPED_TRACE(shape_string(shape));
    const NpyArray original(GetParam(), shape, sample_bytes(GetParam(), shape));
    const NpyArray parsed = parse(serialize_npy(original));
    EXPECT_EQ(parsed.type(), GetParam());
    EXPECT_EQ(parsed.shape(), shape);
    EXPECT_EQ(parsed.bytes(), original.bytes());
  }
}

TEST_P(NpyRoundTrip, WriteThenRead) {
  const TempDir dir;
  for (const Dims& shape : kRoundTripShapes) {
    SCOPED_TRACE(shape_string(shape));
    const std::string path = dir.file("array.npy");
    const NpyArray original(GetParam(), shape, sample_bytes(GetParam(), shape));
    write_npy(path, original);
    const NpyArray read = read_npy(path);
    EXPECT_EQ(read.type(), GetParam());
    EXPECT_EQ(read.shape(), shape);
    EXPECT_EQ(read.bytes(), original.bytes());
    EXPECT_EQ(std::filesystem::file_size(path), serialize_npy(original).size());
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, NpyRoundTrip, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return std::string(npy_type_name(info.param)); });

// ---------------------------------------------------------------------------------------------
// Golden bytes: files exactly as numpy 1.24 writes them

TEST(NpyGolden, ParsesNumpyFloat32Matrix) {
  // np.save(f, np.arange(6, dtype='<f4').reshape(2, 3))
  std::vector<uint8_t> image =
      to_bytes(kPrefix10 + "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" +
               std::string(58, ' ') + "\n");
  ASSERT_EQ(image.size(), 128u);
  append(image, raw_bytes(std::vector<float>{0, 1, 2, 3, 4, 5}));

  const NpyArray array = parse(image);
  EXPECT_EQ(array.type(), NpyType::f4);
  EXPECT_EQ(array.shape(), (Dims{2, 3}));
  EXPECT_EQ(array.to_float32("a"), (std::vector<float>{0, 1, 2, 3, 4, 5}));
}

TEST(NpyGolden, SerializeMatchesNumpyFloat32Matrix) {
  std::vector<uint8_t> expected =
      to_bytes(kPrefix10 + "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" +
               std::string(58, ' ') + "\n");
  append(expected, raw_bytes(std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(serialize_npy(NpyArray::from_floats({0, 1, 2, 3, 4, 5}, {2, 3})), expected);
}

TEST(NpyGolden, SerializeMatchesNumpyFloat64Scalar) {
  // np.save(f, np.float64(1.5)): no spare growth spaces for a scalar.
  std::vector<uint8_t> expected =
      to_bytes(kPrefix10 + "{'descr': '<f8', 'fortran_order': False, 'shape': (), }" +
               std::string(62, ' ') + "\n");
  ASSERT_EQ(expected.size(), 128u);
  append(expected, raw_bytes(std::vector<double>{1.5}));
  EXPECT_EQ(serialize_npy(NpyArray(NpyType::f8, {}, raw_bytes(std::vector<double>{1.5}))),
            expected);
}

TEST(NpyGolden, SerializeMatchesNumpyBoolVector) {
  // np.save(f, np.array([True, False, True, True, False]))
  std::vector<uint8_t> expected =
      to_bytes(kPrefix10 + "{'descr': '|b1', 'fortran_order': False, 'shape': (5,), }" +
               std::string(60, ' ') + "\n");
  ASSERT_EQ(expected.size(), 128u);
  append(expected, {1, 0, 1, 1, 0});
  EXPECT_EQ(serialize_npy(NpyArray::from_bools({1, 0, 1, 1, 0}, {5})), expected);
}

TEST(NpyGolden, SerializeMatchesNumpyUint16Vector) {
  // np.save(f, np.array([1, 256, 65535], dtype='<u2'))
  std::vector<uint8_t> expected =
      to_bytes(kPrefix10 + "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }" +
               std::string(60, ' ') + "\n");
  append(expected, {0x01, 0x00, 0x00, 0x01, 0xFF, 0xFF});
  EXPECT_EQ(serialize_npy(NpyArray(NpyType::u2, {3}, {0x01, 0x00, 0x00, 0x01, 0xFF, 0xFF})),
            expected);
}

TEST(NpyGolden, SerializeMatchesNumpyEmptyArrayWithLongFirstAxis) {
  // np.save(f, np.zeros((123456789, 0), dtype='|u1')): the spare spaces shrink with shape[0]'s
  // digits (21 - 9 = 12), the alignment padding makes up the rest.
  const std::vector<uint8_t> expected =
      to_bytes(kPrefix10 + "{'descr': '|u1', 'fortran_order': False, 'shape': (123456789, 0), }" +
               std::string(50, ' ') + "\n");
  ASSERT_EQ(expected.size(), 128u);
  EXPECT_EQ(serialize_npy(NpyArray(NpyType::u1, {123456789, 0}, {})), expected);
}

TEST(NpyGolden, SerializeSpareSpacesCanSpillIntoAnotherBlock) {
  // A rank-20 array of ones: the dict is 113 bytes, which with the 20 spare spaces no longer fits
  // in 128 bytes, so numpy's header grows to 192.
  const Dims shape(20, 1);
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (1";
  for (int i = 1; i < 20; ++i) dict += ", 1";
  dict += "), }";
  ASSERT_EQ(dict.size(), 113u);
  std::vector<uint8_t> expected =
      to_bytes("\x93NUMPY\x01\x00"s + "\xb6\x00"s + dict + std::string(68, ' ') + "\n");
  ASSERT_EQ(expected.size(), 192u);
  append(expected, raw_bytes(std::vector<float>{2.5f}));
  EXPECT_EQ(serialize_npy(NpyArray::from_floats({2.5f}, shape)), expected);
}

TEST(NpyGolden, SerializePadsAFullBlockWhenAlreadyAligned) {
  // Magic, length, dict (97), spare spaces (20) and '\n' make exactly 128 bytes; numpy's padding
  // formula 64 - (128 % 64) still adds 64 spaces.
  const Dims shape = {1, 10, 10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  const std::string dict =
      "{'descr': '<f4', 'fortran_order': False, 'shape': "
      "(1, 10, 10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1), }";
  ASSERT_EQ(dict.size(), 97u);
  const std::vector<uint8_t> expected =
      to_bytes("\x93NUMPY\x01\x00"s + "\xb6\x00"s + dict + std::string(84, ' ') + "\n");
  ASSERT_EQ(expected.size(), 192u);
  const std::vector<uint8_t> image =
      serialize_npy(NpyArray::from_floats(std::vector<float>(100), shape));
  EXPECT_EQ(std::vector<uint8_t>(image.begin(), image.begin() + 192), expected);
  EXPECT_EQ(image.size(), 192u + 400u);
}

TEST(NpyGolden, SerializeSwitchesToVersion2ForHeadersOver64KiB) {
  // Only reachable with ranks numpy cannot create; the writer still must not overflow uint16.
  const Dims shape(30000, 1);
  const std::vector<uint8_t> image = serialize_npy(NpyArray::from_floats({1.0f}, shape));
  ASSERT_GT(image.size(), 12u);
  ASSERT_EQ(std::vector<uint8_t>(image.begin(), image.begin() + 8),
            to_bytes("\x93NUMPY\x02\x00"sv));
  const size_t header_size = image[8] | image[9] << 8 | image[10] << 16 | image[11] << 24;
  EXPECT_GT(header_size, 65535u);
  EXPECT_EQ((12 + header_size) % 64, 0u);
  ASSERT_EQ(image.size(), 12 + header_size + 4);
  EXPECT_EQ(image[12 + header_size - 1], '\n');
  // numpy's 32-dimension limit makes the reader refuse it.
  EXPECT_NE(parse_error(image).find("more than 32 dimensions"), std::string::npos);
}

TEST(NpyGolden, SerializeRejectsDefaultConstructedArray) {
  // Shape [] means one element, but a default NpyArray holds no bytes.
  try {
    serialize_npy(NpyArray());
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(),
                 "serialize_npy: shape [] of float32 needs 4 bytes, the array holds 0");
  }
}

// ---------------------------------------------------------------------------------------------
// Fortran order, versions and header spellings

TEST(NpyParse, FortranOrderRank2IsTransposedToCOrder) {
  // np.save(f, np.asfortranarray(np.arange(6, dtype='<i4').reshape(2, 3))): the spare spaces are
  // sized by shape[-1] for Fortran arrays, and the data is column by column.
  const std::vector<int32_t> column_major = {0, 3, 1, 4, 2, 5};
  std::vector<uint8_t> image =
      to_bytes(kPrefix10 + "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }" +
               std::string(59, ' ') + "\n");
  ASSERT_EQ(image.size(), 128u);
  append(image, raw_bytes(column_major));
  const NpyArray array = parse(image);
  EXPECT_EQ(array.shape(), (Dims{2, 3}));
  EXPECT_EQ(array.to_int64("a"), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
}

TEST(NpyParse, FortranOrderRank3IsTransposedToCOrder) {
  // a[i][j][k] = 100i + 10j + k with shape (2, 3, 4); Fortran order stores i fastest, then j, k.
  std::vector<int16_t> fortran_data;
  for (int k = 0; k < 4; ++k) {
    for (int j = 0; j < 3; ++j) {
      for (int i = 0; i < 2; ++i)
        fortran_data.push_back(static_cast<int16_t>(100 * i + 10 * j + k));
    }
  }
  std::vector<int64_t> c_order;
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) c_order.push_back(100 * i + 10 * j + k);
    }
  }
  const std::vector<uint8_t> bytes = raw_bytes(fortran_data);
  const std::string data(bytes.begin(), bytes.end());
  const NpyArray array =
      parse(npy_image(1, "{'descr': '<i2', 'fortran_order': True, 'shape': (2, 3, 4), }\n", data));
  EXPECT_EQ(array.shape(), (Dims{2, 3, 4}));
  EXPECT_EQ(array.to_int64("a"), c_order);
}

TEST(NpyParse, FortranOrderVectorAndEmptyArrayAreUnchanged) {
  const NpyArray vector =
      parse(npy_image(1, "{'descr': '|u1', 'fortran_order': True, 'shape': (3,), }\n", "\1\2\3"));
  EXPECT_EQ(vector.bytes(), (std::vector<uint8_t>{1, 2, 3}));
  const NpyArray empty =
      parse(npy_image(1, "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 0, 3), }\n"));
  EXPECT_EQ(empty.shape(), (Dims{2, 0, 3}));
  EXPECT_TRUE(empty.bytes().empty());
}

TEST(NpyParse, Version2Header) {
  const NpyArray array = parse(npy_image(
      2, "{'descr': '<u4', 'fortran_order': False, 'shape': (2,), }    \n", "\1\0\0\0\2\0\0\0"sv));
  EXPECT_EQ(array.type(), NpyType::u4);
  EXPECT_EQ(array.to_int64("a"), (std::vector<int64_t>{1, 2}));
}

TEST(NpyParse, Version3Header) {
  const NpyArray array =
      parse(npy_image(3, "{'descr': '|i1', 'fortran_order': False, 'shape': (1,), }\n", "\xff"));
  EXPECT_EQ(array.to_int64("a"), (std::vector<int64_t>{-1}));
}

TEST(NpyParse, Python2LongSuffix) {
  const NpyArray array =
      parse(npy_image(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (1L, 2L), }\n",
                      "\x05\0\0\0\0\0\0\0\x06\0\0\0\0\0\0\0"sv));
  EXPECT_EQ(array.shape(), (Dims{1, 2}));
  EXPECT_EQ(array.to_int64("a"), (std::vector<int64_t>{5, 6}));
}

TEST(NpyParse, KeysInAnyOrderWithoutTrailingComma) {
  const NpyArray array = parse(
      npy_image(1, "{'shape': (2,), 'fortran_order': False, 'descr': '<i2'}\n", "\1\0\2\0"sv));
  EXPECT_EQ(array.type(), NpyType::i2);
  EXPECT_EQ(array.shape(), (Dims{2}));
}

TEST(NpyParse, DoubleQuotedStrings) {
  const NpyArray array = parse(npy_image(
      1, "{\"descr\": \"<f2\", \"fortran_order\": False, \"shape\": (1,)}\n", "\x00\x3c"sv));
  EXPECT_EQ(array.to_float16("a")[0].bits, 0x3C00);
}

TEST(NpyParse, ArbitraryWhitespaceAndTrailingCommas) {
  const NpyArray array = parse(npy_image(
      1, "  {\n\t'descr' :'<u2' ,'fortran_order':False,\r\n 'shape':( 2 , 1 , ) ,\n}  \t\n",
      "\1\0\2\0"sv));
  EXPECT_EQ(array.shape(), (Dims{2, 1}));
  EXPECT_EQ(array.to_int64("a"), (std::vector<int64_t>{1, 2}));
}

TEST(NpyParse, ScalarShape) {
  const NpyArray array = parse(
      npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }\n", "\0\0\x80\x3f"sv));
  EXPECT_EQ(array.rank(), 0);
  EXPECT_EQ(array.to_float32("a"), (std::vector<float>{1.0f}));
}

TEST(NpyParse, ByteOrderSpellings) {
  const struct {
    const char* descr;
    NpyType type;
  } cases[] = {{"<f8", NpyType::f8}, {"=f8", NpyType::f8}, {"|b1", NpyType::b1},
               {"<b1", NpyType::b1}, {"=i1", NpyType::i1}, {"|u1", NpyType::u1},
               {"<u1", NpyType::u1}, {">u1", NpyType::u1}, {"=u8", NpyType::u8}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.descr);
    const std::string header =
        std::string("{'descr': '") + c.descr + "', 'fortran_order': False, 'shape': (0,), }\n";
    EXPECT_EQ(parse(npy_image(1, header)).type(), c.type);
  }
}

// ---------------------------------------------------------------------------------------------
// Malformed files: each case names the phrase its message must contain

struct MalformedCase {
  const char* label;
  std::string header;  // the dict text; '\n' is appended
  std::string data;
  std::string phrase;
};

std::string dict_with(const std::string& descr, const std::string& shape,
                      const std::string& fortran_order = "False") {
  return "{'descr': " + descr + ", 'fortran_order': " + fortran_order + ", 'shape': " + shape +
         ", }";
}

std::string ones_shape(int rank) {
  std::string shape = "(1";
  for (int i = 1; i < rank; ++i) shape += ", 1";
  return shape + ")";
}

const MalformedCase kMalformedCases[] = {
    {"EmptyHeader", "", "", "expected '{' at the start of the header"},
    {"NotADict", "[1, 2]", "", "expected '{' at the start of the header"},
    {"KeyNotQuoted", "{descr: '<f4'}", "", "expected a quoted key"},
    {"MissingColon", "{'descr' '<f4'}", "", "expected ':' after key 'descr'"},
    {"MissingClosingBrace", "{'descr': '<f4', 'fortran_order': False, 'shape': ()", "",
     "expected ',' or '}' after the value of 'shape', found the end of the header"},
    {"TextAfterDict", dict_with("'<f4'", "()") + " x", "", "unexpected text after the closing '}'"},
    {"MissingDescr", "{'fortran_order': False, 'shape': ()}", "", "missing key 'descr'"},
    {"MissingFortranOrder", "{'descr': '<f4', 'shape': ()}", "", "missing key 'fortran_order'"},
    {"MissingShape", "{'descr': '<f4', 'fortran_order': False}", "", "missing key 'shape'"},
    {"DuplicateKey", "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}", "",
     "duplicate key 'descr'"},
    {"UnknownKey", "{'descr': '<f4', 'fortran_order': False, 'shape': (), 'extra': 1}", "",
     "unknown key 'extra'"},
    {"UnterminatedString", "{'descr': '<f4", "", "unterminated string"},
    {"EscapeInString", dict_with("'<f\\x34'", "()"), "", "escape sequences"},
    {"StructuredDescr", dict_with("[('a', '<f4'), ('b', '<i4')]", "(1,)"), "",
     "structured dtypes (a 'descr' list of fields) are unsupported"},
    {"DescrNotString", dict_with("4", "()"), "", "'descr' must be a string"},
    {"FortranOrderInt", dict_with("'<f4'", "()", "0"), "", "'fortran_order' must be True or False"},
    {"FortranOrderString", dict_with("'<f4'", "()", "'False'"), "",
     "'fortran_order' must be True or False"},
    {"FortranOrderLowercase", dict_with("'<f4'", "()", "false"), "",
     "'fortran_order' must be True or False"},
    {"ShapeList", dict_with("'<f4'", "[2, 3]"), "", "'shape' must be a tuple of ints"},
    {"ShapeNone", dict_with("'<f4'", "None"), "", "'shape' must be a tuple of ints"},
    {"ShapeParenthesizedInt", dict_with("'<f4'", "(5)"), "",
     "'shape' (5) is not a tuple; a one-dimensional shape is written (5,)"},
    {"ShapeFloat", dict_with("'<f4'", "(2.0,)"), "", "expected ',' or ')' in 'shape'"},
    {"ShapeMissingComma", dict_with("'<f4'", "(2 3)"), "", "expected ',' or ')' in 'shape'"},
    {"ShapeDoubleComma", dict_with("'<f4'", "(2,,)"), "", "expected a non-negative integer"},
    {"ShapeNegative", dict_with("'<f4'", "(-1, 3)"), "", "'shape' has a negative size"},
    {"ShapeSizeBeyondInt64", dict_with("'<f4'", "(9223372036854775808,)"), "",
     "'shape' size is too large for int64"},
    {"ShapeRank33", dict_with("'<f4'", ones_shape(33)), "", "'shape' has more than 32 dimensions"},
    {"BigEndianFloat", dict_with("'>f4'", "()"), "", "big-endian dtype '>f4' is unsupported"},
    {"BigEndianSuggestsConversion", dict_with("'>i8'", "()"), "", "arr.astype('<i8')"},
    {"UnicodeDtype", dict_with("'<U3'", "()"), "", "unsupported dtype '<U3'"},
    {"ObjectDtype", dict_with("'|O'", "()"), "", "unsupported dtype '|O'"},
    {"ComplexDtype", dict_with("'<c8'", "()"), "", "unsupported dtype '<c8'"},
    {"NoByteOrderForMultiByteType", dict_with("'|f4'", "()"), "", "unsupported dtype '|f4'"},
    {"MissingByteOrder", dict_with("'f4'", "()"), "", "unsupported dtype 'f4'"},
    {"NumelOverflow", dict_with("'<f4'", "(1099511627776, 1099511627776)"), "",
     "header shape [1099511627776,1099511627776] has more elements than int64 can count"},
    {"DataSizeOverflow", dict_with("'<f4'", "(4611686018427387904,)"), "",
     "header shape [4611686018427387904] of float32 is too large: its data size overflows int64"},
    {"HugeShapeWithoutData", dict_with("'|u1'", "(4611686018427387904,)"), "",
     "truncated data: shape [4611686018427387904] of uint8 needs 4611686018427387904 bytes, file "
     "has 0"},
    {"TruncatedData", dict_with("'<f4'", "(2, 3)"), std::string(20, '\0'),
     "truncated data: shape [2,3] of float32 needs 24 bytes, file has 20"},
    {"TrailingBytes", dict_with("'<f4'", "(2, 3)"), std::string(28, '\0'),
     "4 trailing bytes after the data: shape [2,3] of float32 needs 24 bytes, file has 28"},
    {"BoolByteTwo", dict_with("'|b1'", "(3,)"), std::string("\0\1\2", 3),
     "bool element 2 has byte value 2; expected 0 or 1"},
};

// Names the case in gtest's failure output instead of dumping its bytes.
void PrintTo(const MalformedCase& c, std::ostream* out) {
  *out << c.label;
}

class NpyMalformed : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(NpyMalformed, ErrorNamesFileAndProblem) {
  const MalformedCase& c = GetParam();
  const std::string message = parse_error(npy_image(1, c.header + "\n", c.data), "case.npy");
  EXPECT_EQ(message.rfind("case.npy: ", 0), 0u) << message;
  EXPECT_NE(message.find(c.phrase), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(Cases, NpyMalformed, ::testing::ValuesIn(kMalformedCases),
                         [](const auto& info) { return std::string(info.param.label); });

TEST(NpyMalformedPreamble, BadMagic) {
  const std::string message = parse_error(to_bytes("\x93NUMPZ\x01\x00\x00\x00"sv), "x.npy");
  EXPECT_EQ(message, "x.npy: not a .npy file (it does not start with \"\\x93NUMPY\")");
  EXPECT_EQ(parse_error(to_bytes("PK\x03\x04"sv), "x.npz").rfind("x.npz: not a .npy file", 0), 0u);
}

TEST(NpyMalformedPreamble, UnsupportedVersion) {
  EXPECT_EQ(parse_error(to_bytes("\x93NUMPY\x04\x00\x00\x00\x00\x00"sv), "x.npy"),
            "x.npy: unsupported .npy format version 4.0 (supported: 1.0, 2.0, 3.0)");
  EXPECT_NE(parse_error(to_bytes("\x93NUMPY\x01\x01\x00\x00"sv)).find("version 1.1"),
            std::string::npos);
}

TEST(NpyMalformedPreamble, HeaderLengthBeyondFile) {
  const std::vector<uint8_t> image = to_bytes("\x93NUMPY\x01\x00\xff\xff{'descr'"sv);
  EXPECT_EQ(parse_error(image, "x.npy"),
            "x.npy: truncated header: it should be 65535 bytes, file has 8 after the preamble");
}

TEST(NpyMalformedPreamble, EmptyInput) {
  EXPECT_THROW(parse_npy(nullptr, 0, "empty.npy"), Error);
}

// Each prefix is copied into a buffer of exactly its length, so AddressSanitizer flags any read
// past the end.
TEST(NpyMalformedPreamble, EveryProperPrefixIsRejected) {
  std::vector<std::vector<uint8_t>> images = {
      serialize_npy(NpyArray::from_floats({0, 1, 2, 3, 4, 5}, {2, 3})),
      serialize_npy(NpyArray::from_bools({1}, {})),
      serialize_npy(NpyArray::from_int64({}, {0, 4})),
      npy_image(2, "{'descr': '<i2', 'fortran_order': True, 'shape': (2, 2), }\n",
                "\1\0\2\0\3\0\4\0"sv),
  };
  for (const std::vector<uint8_t>& image : images) {
    ASSERT_NO_THROW(parse(image));
    for (size_t size = 0; size < image.size(); ++size) {
      SCOPED_TRACE(size);
      const std::vector<uint8_t> prefix(image.begin(), image.begin() + size);
      const std::string message = parse_error(prefix, "cut.npy");
      EXPECT_EQ(message.rfind("cut.npy: truncated", 0), 0u) << message;
    }
  }
}

// If the parser allocated from the header before checking the data, these shapes would ask for
// 2^62 bytes or more: AddressSanitizer aborts on such a request, and without it std::bad_alloc
// (not maskattn::Error) would fail the test.
TEST(NpyMalformedPreamble, HugeShapesFailWithoutAllocating) {
  const char* const shapes[] = {"(1099511627776, 1099511627776)", "(4611686018427387904,)"};
  for (const char* shape : shapes) {
    for (const char* descr : {"'<f4'", "'|u1'"}) {
      SCOPED_TRACE(std::string(shape) + descr);
      const std::vector<uint8_t> image = npy_image(1, dict_with(descr, shape) + "\n", "12345678");
      EXPECT_THROW(parse(image), Error);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Element conversions

TEST(NpyConvert, ToFloat32FromFloat16IsExact) {
  const std::vector<float16> halves = {{0x3C00}, {0xC000}, {0x0001}, {0x7BFF}, {0x7C00}};
  const std::vector<float> floats = NpyArray::from_float16(halves, {5}).to_float32("h");
  EXPECT_EQ(floats, (std::vector<float>{1.0f, -2.0f, 0x1p-24f, 65504.0f,
                                        std::numeric_limits<float>::infinity()}));
}

TEST(NpyConvert, ToFloat32FromFloat64RoundsToNearest) {
  const std::vector<double> doubles = {0.1, 1.0 + 0x1p-24, 1.0 + 0x1p-23 + 0x1p-24, -INFINITY};
  const NpyArray array(NpyType::f8, {4}, raw_bytes(doubles));
  const std::vector<float> floats = array.to_float32("d");
  EXPECT_EQ(floats[0], 0.1f);
  EXPECT_EQ(floats[1], 1.0f);             // tie, rounds to even
  EXPECT_EQ(floats[2], 1.0f + 0x1p-22f);  // tie, rounds to even (up)
  EXPECT_EQ(floats[3], -INFINITY);        // infinities stay infinities
}

TEST(NpyConvert, ToFloat32RefusesFiniteFloat64BeyondFloat32Range) {
  // np.finfo(np.float64).min in an additive mask must not turn into -inf (which would hide).
  const NpyArray array(NpyType::f8, {2},
                       raw_bytes(std::vector<double>{0.0, -1.7976931348623157e308}));
  try {
    array.to_float32("add.npy");
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(),
                 "add.npy value -1.7976931348623157e+308 at flat index 1 is outside "
                 "the float32 range (±3.4e38)");
  }
}

TEST(NpyConvert, ToFloat32RefusesIntegersAndBool) {
  try {
    NpyArray::from_int64({1}, {1}).to_float32("--q q.npy");
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "--q q.npy has dtype int64; expected float16, float32 or float64");
  }
  EXPECT_THROW(NpyArray::from_bools({1}, {1}).to_float32("b"), Error);
}

TEST(NpyConvert, ToFloat16CopiesBitsAndRefusesOtherFloats) {
  const std::vector<float16> halves = {{0x7E01}, {0x8000}};  // a NaN payload and -0
  const std::vector<float16> copied = NpyArray::from_float16(halves, {2}).to_float16("h");
  ASSERT_EQ(copied.size(), 2u);
  EXPECT_EQ(copied[0].bits, 0x7E01);
  EXPECT_EQ(copied[1].bits, 0x8000);
  try {
    NpyArray::from_floats({1}, {1}).to_float16("mask");
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "mask has dtype float32; expected float16");
  }
}

TEST(NpyConvert, ToInt64WidensEveryIntegerType) {
  EXPECT_EQ(NpyArray(NpyType::i1, {2}, {0x80, 0x7F}).to_int64("a"),
            (std::vector<int64_t>{-128, 127}));
  EXPECT_EQ(NpyArray(NpyType::u1, {1}, {0xFF}).to_int64("a"), (std::vector<int64_t>{255}));
  EXPECT_EQ(NpyArray(NpyType::i2, {1}, {0x00, 0x80}).to_int64("a"), (std::vector<int64_t>{-32768}));
  EXPECT_EQ(NpyArray(NpyType::u2, {1}, {0xFF, 0xFF}).to_int64("a"), (std::vector<int64_t>{65535}));
  EXPECT_EQ(NpyArray(NpyType::i4, {1}, {0xFF, 0xFF, 0xFF, 0xFF}).to_int64("a"),
            (std::vector<int64_t>{-1}));
  EXPECT_EQ(NpyArray(NpyType::u4, {1}, {0xFF, 0xFF, 0xFF, 0xFF}).to_int64("a"),
            (std::vector<int64_t>{4294967295}));
  EXPECT_EQ(NpyArray::from_int64({std::numeric_limits<int64_t>::min()}, {1}).to_int64("a"),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min()}));
  EXPECT_EQ(
      NpyArray(NpyType::u8, {1}, {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F}).to_int64("a"),
      (std::vector<int64_t>{std::numeric_limits<int64_t>::max()}));
  EXPECT_EQ(NpyArray::from_bools({1, 0}, {2}).to_int64("a"), (std::vector<int64_t>{1, 0}));
}

TEST(NpyConvert, ToInt64RefusesFloats) {
  try {
    NpyArray::from_floats({1}, {1}).to_int64("key lengths");
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "key lengths has dtype float32; expected bool or an integer type");
  }
}

TEST(NpyConvert, ToInt64RefusesUint64AboveInt64Max) {
  const std::vector<uint64_t> values = {1, std::numeric_limits<uint64_t>::max()};
  try {
    NpyArray(NpyType::u8, {2}, raw_bytes(values)).to_int64("lengths");
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(),
                 "lengths value 18446744073709551615 at index 1 does not fit in int64");
  }
}

// ---------------------------------------------------------------------------------------------
// Files

TEST(NpyFile, ReadMissingFileNamesPath) {
  const TempDir dir;
  const std::string path = dir.file("missing.npy");
  try {
    read_npy(path);
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), "cannot open '" + path + "': No such file or directory");
  }
}

TEST(NpyFile, ReadDirectoryIsRefused) {
  const TempDir dir;
  try {
    read_npy(dir.path());
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("'" + dir.path() + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("directory"), std::string::npos) << message;
  }
}

TEST(NpyFile, ContentErrorsStartWithPath) {
  const TempDir dir;
  const std::string path = dir.file("short.npy");
  std::vector<uint8_t> image = serialize_npy(NpyArray::from_floats({1, 2, 3, 4, 5, 6}, {2, 3}));
  image.erase(image.end() - 4, image.end());  // drop the last element
  write_raw(path, image);
  try {
    read_npy(path);
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()),
              path + ": truncated data: shape [2,3] of float32 needs 24 bytes, file has 20");
  }
}

TEST(NpyFile, ReadsHandWrittenNumpyFile) {
  const TempDir dir;
  const std::string path = dir.file("golden.npy");
  std::vector<uint8_t> image =
      to_bytes(kPrefix10 + "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }" +
               std::string(60, ' ') + "\n");
  append(image, raw_bytes(std::vector<int64_t>{7, -8, 9}));
  write_raw(path, image);
  EXPECT_EQ(read_npy(path).to_int64("golden"), (std::vector<int64_t>{7, -8, 9}));
}

TEST(NpyFile, WriteIntoMissingDirectoryNamesPath) {
  const TempDir dir;
  const std::string path = dir.file("no/such/dir/out.npy");
  try {
    write_npy(path, NpyArray::from_floats({1}, {1}));
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), "cannot create '" + path + "': No such file or directory");
  }
}

TEST(NpyFile, WriteReportsFullDevice) {
  // /dev/full accepts the open and fails the write (or the flush at close) with ENOSPC.
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  try {
    write_npy("/dev/full", NpyArray::from_floats({1, 2, 3}, {3}));
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "cannot write '/dev/full': No space left on device");
  }
}

TEST(NpyFile, WriteReplacesExistingFile) {
  const TempDir dir;
  const std::string path = dir.file("replace.npy");
  write_npy(path, NpyArray::from_floats(std::vector<float>(1000), {1000}));
  write_npy(path, NpyArray::from_int64({4}, {}));
  EXPECT_EQ(read_npy(path).to_int64("r"), (std::vector<int64_t>{4}));
}

// ---------------------------------------------------------------------------------------------
// Memory-mapped files (MappedNpy): the same checks and messages as read_npy, the data in place

// The message of the Error that MappedNpy raises for `path`, or a note saying it did not raise.
std::string map_error(const std::string& path) {
  try {
    MappedNpy mapped(path);
  } catch (const Error& error) {
    return error.what();
  }
  return "<no error>";
}

TEST(NpyMapped, UsesTheFileDataInPlaceAndEqualsReadNpy) {
  const TempDir dir;
  const std::string path = dir.file("m.npy");
  const NpyArray array = NpyArray::from_floats({1, 2, 3, 4, 5, 6}, {2, 3});
  write_npy(path, array);
  const MappedNpy mapped(path);
  EXPECT_EQ(mapped.type(), NpyType::f4);
  EXPECT_EQ(mapped.shape(), (Dims{2, 3}));
  EXPECT_EQ(mapped.layout().data_offset, 128u);
  EXPECT_EQ(mapped.layout().data_size, 24u);
  ASSERT_NE(mapped.c_order_data(), nullptr);
  EXPECT_EQ(std::memcmp(mapped.c_order_data(), array.bytes().data(), 24), 0);
  const NpyArray copy = mapped.to_array();
  EXPECT_EQ(copy.bytes(), array.bytes());
  EXPECT_EQ(read_npy(path).bytes(), array.bytes());
}

TEST(NpyMapped, SerializeHeaderIsTheFilesPrefix) {
  const NpyArray array = NpyArray::from_int64({1, 2, 3}, {3});
  std::vector<uint8_t> image = serialize_npy_header(NpyType::i8, {3});
  EXPECT_EQ(image.size() % 64, 0u);
  append(image, array.bytes());
  EXPECT_EQ(image, serialize_npy(array));
}

TEST(NpyMapped, TruncatedAndOversizedDataAreTheCatalogueErrors) {
  const TempDir dir;
  std::vector<uint8_t> image = serialize_npy(NpyArray::from_floats({1, 2, 3}, {3}));
  image.pop_back();  // E51: the header promises 12 bytes of data, the file has 11
  write_raw(dir.file("short.npy"), image);
  EXPECT_EQ(map_error(dir.file("short.npy")),
            dir.file("short.npy") +
                ": truncated data: shape [3] of float32 needs 12 bytes, file "
                "has 11");
  image.push_back(0);
  image.push_back(0);  // E56: the header says less than the file holds
  write_raw(dir.file("long.npy"), image);
  EXPECT_EQ(map_error(dir.file("long.npy")),
            dir.file("long.npy") +
                ": 1 trailing bytes after the data: shape [3] of float32 "
                "needs 12 bytes, file has 13");
  image.resize(40);  // E50: cut inside the header
  write_raw(dir.file("header.npy"), image);
  EXPECT_NE(map_error(dir.file("header.npy")).find(": truncated header"), std::string::npos);
  write_raw(dir.file("empty.npy"), {});  // mmap cannot map 0 bytes: still a clean error
  EXPECT_EQ(map_error(dir.file("empty.npy")),
            dir.file("empty.npy") +
                ": truncated preamble: file has 0 bytes, too few for the .npy "
                "magic, version and header length");
}

TEST(NpyMapped, BigEndianAndUnsupportedDtypesAreRefused) {
  const TempDir dir;
  write_raw(dir.file("b.npy"),
            npy_image(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }\n", "abcd"));
  EXPECT_EQ(map_error(dir.file("b.npy")),
            dir.file("b.npy") +
                ": big-endian dtype '>f4' is unsupported; convert the array to "
                "little-endian first, e.g. arr.astype('<f4')");
  write_raw(
      dir.file("c.npy"),
      npy_image(1, "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }\n", "abcdefgh"));
  EXPECT_NE(map_error(dir.file("c.npy")).find("unsupported dtype '<c8'"), std::string::npos);
}

TEST(NpyMapped, FortranOrderIsNotUsedInPlaceButCopiedTransposed) {
  const TempDir dir;
  // [[1, 2, 3], [4, 5, 6]] in Fortran order: columns first.
  const std::vector<uint8_t> columns = raw_bytes(std::vector<float>{1, 4, 2, 5, 3, 6});
  write_raw(dir.file("f.npy"),
            npy_image(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }\n",
                      std::string_view(reinterpret_cast<const char*>(columns.data()), 24)));
  const MappedNpy mapped(dir.file("f.npy"));
  EXPECT_EQ(mapped.c_order_data(), nullptr);
  EXPECT_EQ(mapped.to_array().to_float32("f"), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(NpyMapped, UnalignedDataIsNotUsedInPlace) {
  const TempDir dir;
  // A hand-written header of odd length: the float32 data starts at byte 67, not a multiple of 4.
  const std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }   \n";
  ASSERT_EQ((10 + header.size()) % 4, 3u);
  const std::vector<uint8_t> values = raw_bytes(std::vector<float>{1.5f, -2});
  write_raw(
      dir.file("u.npy"),
      npy_image(1, header, std::string_view(reinterpret_cast<const char*>(values.data()), 8)));
  const MappedNpy mapped(dir.file("u.npy"));
  EXPECT_EQ(mapped.c_order_data(), nullptr);
  EXPECT_EQ(mapped.to_array().to_float32("u"), (std::vector<float>{1.5f, -2}));
}

TEST(NpyMapped, BoolBytesAreCheckedBeforeTheyAreHandedOut) {
  const TempDir dir;
  write_raw(dir.file("b.npy"),
            npy_image(1, "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }\n",
                      "\x01\x00\x02"sv));
  EXPECT_EQ(map_error(dir.file("b.npy")),
            dir.file("b.npy") + ": bool element 2 has byte value 2; expected 0 or 1");
}

TEST(NpyMapped, MissingFilesDirectoriesAndFifosAreRefusedWithoutWaiting) {
  const TempDir dir;
  EXPECT_EQ(map_error(dir.file("none.npy")),
            "cannot open '" + dir.file("none.npy") + "': No such file or directory");
  EXPECT_EQ(map_error(dir.path()), "cannot read '" + dir.path() + "': Is a directory");
  const std::string fifo = dir.file("fifo.npy");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(map_error(fifo).find("cannot read '" + fifo + "'"), std::string::npos);  // no hang
}

TEST(NpyMapped, MappedFileMovesItsMapping) {
  const TempDir dir;
  write_npy(dir.file("m.npy"), NpyArray::from_floats({7}, {1}));
  MappedFile first = MappedFile::open_read_only(dir.file("m.npy"));
  const uint8_t* data = first.data();
  ASSERT_NE(data, nullptr);
  MappedFile second = std::move(first);
  EXPECT_EQ(second.data(), data);
  EXPECT_EQ(first.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(second.size(), 132u);
}

}  // namespace
}  // namespace maskattn
