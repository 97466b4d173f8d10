#include "maskattn/dtype.h"

#include <bit>
#include <cmath>

namespace maskattn {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
  }
  return "?";
}

size_t dtype_size(DType dtype) {
  return dtype == DType::f32 ? 4 : 2;
}

float to_float(float16 x) {
  const uint32_t sign = static_cast<uint32_t>(x.bits & 0x8000u) << 16;
  const uint32_t exponent = (x.bits >> 10) & 0x1Fu;
  const uint32_t mantissa = x.bits & 0x3FFu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa · 2^-24, exact in f32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  // Rebias the exponent from 15 to 127.
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

float to_float(bfloat16 x) {
  return std::bit_cast<float>(static_cast<uint32_t>(x.bits) << 16);
}

float16 float16_from_float(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  bits &= 0x7FFFFFFFu;
  if (bits >= 0x7F800000u) {  // inf or NaN; NaN keeps its top payload bits and is made quiet
    const uint16_t nan_payload = bits > 0x7F800000u ? (0x0200u | ((bits >> 13) & 0x3FFu)) : 0;
    return {static_cast<uint16_t>(sign | 0x7C00u | nan_payload)};
  }
  if (bits >= 0x47800000u) return {static_cast<uint16_t>(sign | 0x7C00u)};  // |x| >= 65536
  if (bits < 0x38800000u) {
    // |x| < 2^-14: f16 subnormal (or zero). Adding 0.5f aligns the value so that the f32 ulp is
    // 2^-24, the f16 subnormal step; the f32 addition rounds to nearest even for us.
    const float aligned = std::bit_cast<float>(bits) + 0.5f;
    return {static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(aligned) - 0x3F000000u))};
  }
  // Normal: rebias exponent 127 → 15, then round the 13 dropped bits to nearest even. A carry
  // out of the mantissa correctly bumps the exponent (and 65520 ≤ |x| < 65536 becomes inf).
  const uint32_t odd = (bits >> 13) & 1u;
  bits = bits - 0x38000000u + 0x0FFFu + odd;
  return {static_cast<uint16_t>(sign | (bits >> 13))};
}

bfloat16 bfloat16_from_float(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return {static_cast<uint16_t>((bits >> 16) | 0x0040u)};  // quiet NaN
  }
  const uint32_t odd = (bits >> 16) & 1u;
  return {static_cast<uint16_t>((bits + 0x7FFFu + odd) >> 16)};
}

namespace {

// Rounds a double to f32 "to odd": truncate toward zero and set the last mantissa bit when the
// result is inexact. A value rounded to odd with ≥ 2 spare bits, then rounded to nearest even into
// a narrower format, equals the direct correctly rounded result (Boldo & Melquiond 2008). f32 has
// 24 significant bits, f16 11 and bf16 8, so this gives exact one-step rounding.
float round_to_odd_float(double x) {
  float f = static_cast<float>(x);
  if (std::isnan(x) || static_cast<double>(f) == x) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 1u);
}

}  // namespace

float16 float16_from_double(double x) {
  return float16_from_float(round_to_odd_float(x));
}
bfloat16 bfloat16_from_double(double x) {
  return bfloat16_from_float(round_to_odd_float(x));
}
float float_from_double(double x) {
  return static_cast<float>(x);
}

}  // namespace maskattn
