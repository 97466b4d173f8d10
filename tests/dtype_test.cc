// f16/bf16 conversions: exact widening, round-to-nearest-even narrowing, specials, and one-step
// rounding from double.
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "test_util.h"

namespace maskattn {
namespace {

uint32_t bits_of(float x) {
  return std::bit_cast<uint32_t>(x);
}
float float_of(uint32_t bits) {
  return std::bit_cast<float>(bits);
}

// Independent oracle: the nearest bf16 (ties to even) found by comparing the two neighbours in f64.
uint16_t nearest_bf16(float x) {
  const uint32_t bits = bits_of(x);
  const uint16_t down = static_cast<uint16_t>(bits >> 16);
  const uint16_t up = static_cast<uint16_t>(down + 1);
  const double lo = float_of(static_cast<uint32_t>(down) << 16);
  const double hi = float_of(static_cast<uint32_t>(up) << 16);  // may be inf: then x < midpoint
  const double exact = x;
  const double to_lo = std::fabs(exact - lo);
  const double to_hi = std::isinf(hi) ? std::fabs(exact - lo) * 2 + 1 : std::fabs(hi - exact);
  if (std::isinf(hi)) {
    // Above the largest finite bf16: rounds to inf iff at or past the midpoint 2^128·(1 − 2^-9).
    const double midpoint = std::ldexp(1.0, 128) * (1.0 - std::ldexp(1.0, -9));
    return std::fabs(exact) >= midpoint ? up : down;
  }
  if (to_lo < to_hi) return down;
  if (to_hi < to_lo) return up;
  return (down & 1) ? up : down;
}

TEST(Float16, WideningThenNarrowingIsIdentityForEveryPattern) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const float16 x{static_cast<uint16_t>(bits)};
    const float wide = to_float(x);
    const float16 back = float16_from_float(wide);
    if (std::isnan(wide)) {
      EXPECT_EQ(back.bits & 0x7C00, 0x7C00) << bits;
      EXPECT_NE(back.bits & 0x03FF, 0) << bits;
    } else {
      EXPECT_EQ(back.bits, bits) << "pattern " << bits;
    }
  }
}

TEST(Float16, NarrowingMatchesCompilerFloat16OnASweepOfFloats) {
  // _Float16 conversion (libgcc) is IEEE round-to-nearest-even: an independent oracle.
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 65521) {
    const float x = float_of(static_cast<uint32_t>(bits));
    if (std::isnan(x)) continue;
    const _Float16 expected = static_cast<_Float16>(x);
    uint16_t expected_bits;
    std::memcpy(&expected_bits, &expected, 2);
    ASSERT_EQ(float16_from_float(x).bits, expected_bits) << "x = " << x << " bits " << bits;
  }
}

TEST(Float16, TiesGoToEvenAndOverflowGoesToInfinity) {
  EXPECT_EQ(float16_from_float(1.0f + 0x1p-11f).bits, 0x3C00);      // tie, 1.0 is even
  EXPECT_EQ(float16_from_float(1.0f + 3 * 0x1p-11f).bits, 0x3C02);  // tie, up to even
  EXPECT_EQ(float16_from_float(65504.0f).bits, 0x7BFF);
  EXPECT_EQ(float16_from_float(65519.0f).bits, 0x7BFF);
  EXPECT_EQ(float16_from_float(65520.0f).bits, 0x7C00);  // the midpoint to 2^16 rounds to inf
  EXPECT_EQ(float16_from_float(-1e9f).bits, 0xFC00);     // the tutorials' -1e9 is -inf in f16
  EXPECT_EQ(float16_from_float(0x1p-24f).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(float16_from_float(0x1p-25f).bits, 0x0000);  // tie to even (zero)
  EXPECT_EQ(float16_from_float(-0.0f).bits, 0x8000);
  EXPECT_TRUE(std::isnan(to_float(float16_from_float(NAN))));
}

TEST(BFloat16, RoundsToNearestEvenNotTruncates) {
  // Highway 1.0.3's DemoteTo truncates 1.0068359375 to 1.0; nearest-even gives 1.0078125.
  EXPECT_EQ(to_float(bfloat16_from_float(1.0068359375f)), 1.0078125f);
  EXPECT_EQ(bfloat16_from_float(1.0f + 0x1p-8f).bits, 0x3F80);      // tie, stays even
  EXPECT_EQ(bfloat16_from_float(1.0f + 3 * 0x1p-8f).bits, 0x3F82);  // tie, up to even
  EXPECT_EQ(bfloat16_from_float(std::numeric_limits<float>::max()).bits, 0x7F80);
  EXPECT_EQ(bfloat16_from_float(-INFINITY).bits, 0xFF80);
  const bfloat16 nan = bfloat16_from_float(float_of(0x7F800001u));  // signalling NaN payload
  EXPECT_TRUE(std::isnan(to_float(nan)));
  EXPECT_NE(nan.bits & 0x0040, 0);  // quiet
}

TEST(BFloat16, NarrowingMatchesNearestNeighbourOracleOnASweep) {
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 7919) {
    const float x = float_of(static_cast<uint32_t>(bits));
    if (std::isnan(x) || std::isinf(x)) continue;
    ASSERT_EQ(bfloat16_from_float(x).bits, nearest_bf16(x)) << "x = " << x;
  }
}

TEST(FromDouble, RoundsOnceWithoutDoubleRounding) {
  // 1 + 2^-11 + 2^-40: via f32 it becomes the tie 1 + 2^-11 and then 1.0; correct is 1 + 2^-10.
  EXPECT_EQ(float16_from_double(1.0 + 0x1p-11 + 0x1p-40).bits, 0x3C01);
  EXPECT_EQ(bfloat16_from_double(1.0 + 0x1p-8 + 0x1p-40).bits, 0x3F81);
  EXPECT_EQ(float16_from_double(1.0 + 0x1p-11).bits, 0x3C00);  // a true tie still goes to even
  EXPECT_EQ(float16_from_double(1e300).bits, 0x7C00);
  EXPECT_EQ(bfloat16_from_double(-1e300).bits, 0xFF80);
  EXPECT_TRUE(std::isnan(to_float(float16_from_double(NAN))));
  EXPECT_EQ(float_from_double(0.1), 0.1f);
}

TEST(FromDouble, AgreesWithFloatPathWhenTheDoubleIsAFloat) {
  for (float x : test::random_values(10000, 7, -70000.0f, 70000.0f)) {
    EXPECT_EQ(float16_from_double(x).bits, float16_from_float(x).bits);
    EXPECT_EQ(bfloat16_from_double(x).bits, bfloat16_from_float(x).bits);
  }
}

TEST(DType, NamesAndSizes) {
  EXPECT_STREQ(dtype_name(DType::f32), "f32");
  EXPECT_STREQ(dtype_name(DType::f16), "f16");
  EXPECT_STREQ(dtype_name(DType::bf16), "bf16");
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_of_v<float16>, DType::f16);
}

}  // namespace
}  // namespace maskattn
