// Element types of attention tensors (f32, f16, bf16) and exact conversions between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace maskattn {

// IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits. Stored as raw bits.
struct float16 {
  uint16_t bits = 0;
};

// bfloat16: the upper 16 bits of an IEEE binary32. Stored as raw bits.
struct bfloat16 {
  uint16_t bits = 0;
};

enum class DType : uint8_t { f32, f16, bf16 };

const char* dtype_name(DType dtype);  // "f32", "f16", "bf16"
// The inverse of dtype_name; an Error for any other text, naming `what` (an option, an argument):
// `--dtype = 'f64' is not a dtype: use f32, f16 or bf16` (errors.md E97).
DType parse_dtype(const std::string& name, const std::string& what);
size_t dtype_size(DType dtype);  // bytes per element

template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<float16> {
  static constexpr DType value = DType::f16;
};
template <>
struct dtype_of<bfloat16> {
  static constexpr DType value = DType::bf16;
};
template <typename T>
inline constexpr DType dtype_of_v = dtype_of<T>::value;

// Widening is exact.
float to_float(float16 x);
float to_float(bfloat16 x);

// Narrowing rounds to nearest, ties to even (IEEE default), for both types. Overflow gives ±inf,
// NaN stays NaN (quiet), subnormals are produced and kept. Highway 1.0.3's bf16 DemoteTo truncates
// instead, so it is not used for this.
float16 float16_from_float(float x);
bfloat16 bfloat16_from_float(float x);

// Correctly rounded (RNE) from double in one step: no double rounding through f32.
float16 float16_from_double(double x);
bfloat16 bfloat16_from_double(double x);
float float_from_double(double x);

}  // namespace maskattn
