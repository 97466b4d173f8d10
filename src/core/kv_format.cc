// The KV cache's row formats (maskattn/kv_format.h): the scalar definition of encoding on append
// and of the decoded values x̂ that every kernel reproduces in registers.
#include "maskattn/kv_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "maskattn/error.h"

namespace maskattn {

namespace {

constexpr int64_t kKeyGroup = 32;  // channels per key scale (and per q4 scale)

// The smallest f16 whose magnitude is ≥ |v| (v ≥ 0 finite); false when that is beyond 65504.
bool f16_at_least(float v, float16* out) {
  float16 h = float16_from_float(v);
  if (to_float(h) < v) h.bits = static_cast<uint16_t>(h.bits + 1);
  if ((h.bits & 0x7C00) == 0x7C00) return false;  // rounded to infinity
  *out = h;
  return true;
}

// Round to nearest even onto a minifloat with `mantissa_bits` and `bias` (no infinities),
// saturating at `max_code` (the largest finite code without its sign).
uint8_t encode_minifloat(float x, int mantissa_bits, int bias, uint8_t max_code) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(x));
  if (a == 0.0) return sign;
  int exponent = 0;
  std::frexp(a, &exponent);  // a = f·2^exponent, f in [0.5, 1): unbiased exponent − 1
  const int min_normal = 1 - bias;
  const int unbiased = std::max(exponent - 1, min_normal);
  // a in units of the last place at that exponent; rounding to an integer is the RNE step (the
  // default rounding mode), and a carry into the next binade lands on the right code by itself.
  const double units = std::nearbyint(std::ldexp(a, mantissa_bits - unbiased));
  const double code = std::ldexp(unbiased - min_normal, mantissa_bits) + units;
  return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::min<double>(code, max_code)));
}

float code_max(KVFormat format) {
  switch (format) {
    case KVFormat::int8:
      return 127.0f;
    case KVFormat::fp8_e4m3:
      return 448.0f;
    case KVFormat::fp8_e5m2:
      return 57344.0f;
    default:
      return 8.0f;  // q4: |m / scale| = 8 at the element of largest magnitude
  }
}

// Codes of one group (`count` elements) with scale s.
void encode_group(KVFormat format, const float* x, int64_t count, float s, uint8_t* codes) {
  for (int64_t e = 0; e < count; ++e) {
    // x / s, not x · (1/s): one rounding, so a value on a code decodes back to itself.
    const float scaled = s == 0.0f ? 0.0f : x[e] / s;
    switch (format) {
      case KVFormat::int8:
        codes[e] = static_cast<uint8_t>(
            static_cast<int8_t>(std::clamp(std::nearbyint(scaled), -127.0f, 127.0f)));
        break;
      case KVFormat::fp8_e4m3:
        codes[e] = fp8_e4m3_from_float(scaled);
        break;
      case KVFormat::fp8_e5m2:
        codes[e] = fp8_e5m2_from_float(scaled);
        break;
      default: {  // q4: element i in byte i % 16, low nibble for i < 16
        const auto n = static_cast<uint8_t>(std::clamp(std::nearbyint(scaled) + 8.0f, 0.0f, 15.0f));
        uint8_t& byte = codes[e % 16];
        byte = e < 16 ? static_cast<uint8_t>((byte & 0xF0) | n)
                      : static_cast<uint8_t>((byte & 0x0F) | (n << 4));
        break;
      }
    }
  }
}

float decode_code(KVFormat format, const uint8_t* codes, int64_t e) {
  switch (format) {
    case KVFormat::int8:
      return static_cast<float>(static_cast<int8_t>(codes[e]));
    case KVFormat::fp8_e4m3:
      return float_from_fp8_e4m3(codes[e]);
    case KVFormat::fp8_e5m2:
      return float_from_fp8_e5m2(codes[e]);
    default: {
      const uint8_t byte = codes[e % 32 % 16 + e / 32 * 16];
      return static_cast<float>((e % 32 < 16 ? byte & 0x0F : byte >> 4)) - 8.0f;
    }
  }
}

int64_t code_bytes(KVFormat format, int64_t count) {
  return format == KVFormat::q4 ? count / 2 : count;
}

}  // namespace

const char* kv_format_name(KVFormat format) {
  switch (format) {
    case KVFormat::f32:
      return "f32";
    case KVFormat::f16:
      return "f16";
    case KVFormat::bf16:
      return "bf16";
    case KVFormat::int8:
      return "int8";
    case KVFormat::fp8_e4m3:
      return "fp8-e4m3";
    case KVFormat::fp8_e5m2:
      return "fp8-e5m2";
    case KVFormat::q4:
      return "q4";
  }
  return "?";
}

KVFormat parse_kv_format(const std::string& name, const std::string& what) {
  for (KVFormat format : {KVFormat::f32, KVFormat::f16, KVFormat::bf16, KVFormat::int8,
                          KVFormat::fp8_e4m3, KVFormat::fp8_e5m2, KVFormat::q4}) {
    if (name == kv_format_name(format)) return format;
  }
  if (name == "fp8_e4m3" || name == "fp8") return KVFormat::fp8_e4m3;
  if (name == "fp8_e5m2") return KVFormat::fp8_e5m2;
  throw Error(what + " = '" + name +
              "' is not a KV cache format: use f32, f16, bf16, int8, fp8-e4m3, fp8-e5m2 or q4");
}

bool is_quantized(KVFormat format) {
  return format != KVFormat::f32 && format != KVFormat::f16 && format != KVFormat::bf16;
}

DType kv_format_dtype(KVFormat format) {
  switch (format) {
    case KVFormat::f32:
      return DType::f32;
    case KVFormat::f16:
      return DType::f16;
    case KVFormat::bf16:
      return DType::bf16;
    default:
      throw Error(std::string("KV format ") + kv_format_name(format) +
                  " is quantized: its rows have no element dtype");
  }
}

KVFormat kv_format_of(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return KVFormat::f16;
    case DType::bf16:
      return KVFormat::bf16;
    default:
      return KVFormat::f32;
  }
}

int64_t kv_group_size(KVFormat format, bool keys, int64_t width) {
  if (!is_quantized(format)) return 0;
  if (format == KVFormat::q4 || keys) return std::min(kKeyGroup, width);
  return width;
}

int64_t kv_row_bytes(KVFormat format, bool keys, int64_t width) {
  if (!is_quantized(format))
    return width * static_cast<int64_t>(dtype_size(kv_format_dtype(format)));
  const int64_t group = kv_group_size(format, keys, width);
  return (width + group - 1) / group * 2 + code_bytes(format, width);
}

bool kv_width_fits(KVFormat format, int64_t width) {
  return width >= 1 && (format != KVFormat::q4 || width % kKeyGroup == 0);
}

bool kv_encode_row(KVFormat format, bool keys, const float* values, int64_t width, uint8_t* row,
                   int64_t* bad_index) {
  for (int64_t e = 0; e < width; ++e) {
    if (!std::isfinite(values[e])) {
      *bad_index = e;
      return false;
    }
  }
  if (!is_quantized(format)) {
    for (int64_t e = 0; e < width; ++e) {
      switch (format) {
        case KVFormat::f16: {
          const float16 h = float16_from_float(values[e]);
          std::memcpy(row + 2 * e, &h, 2);
          break;
        }
        case KVFormat::bf16: {
          const bfloat16 h = bfloat16_from_float(values[e]);
          std::memcpy(row + 2 * e, &h, 2);
          break;
        }
        default:
          std::memcpy(row + 4 * e, values + e, 4);
      }
    }
    return true;
  }
  const int64_t group = kv_group_size(format, keys, width);
  const int64_t groups = (width + group - 1) / group;
  uint8_t* codes = row + 2 * groups;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t first = g * group, count = std::min(group, width - first);
    int64_t largest_at = first;  // the element of largest magnitude (signed, for q4)
    for (int64_t e = first; e < first + count; ++e) {
      if (std::fabs(values[e]) > std::fabs(values[largest_at])) largest_at = e;
    }
    const float largest = values[largest_at];
    float16 scale;
    if (!f16_at_least(std::fabs(largest) / code_max(format), &scale)) {
      *bad_index = largest_at;
      return false;
    }
    // q4's scale carries the opposite sign of the largest element, which then decodes to −8.
    if (format == KVFormat::q4 && largest > 0.0f) scale.bits |= 0x8000;
    std::memcpy(row + 2 * g, &scale, 2);
    encode_group(format, values + first, count, to_float(scale), codes + code_bytes(format, first));
  }
  return true;
}

void kv_decode_row(KVFormat format, bool keys, const uint8_t* row, int64_t width, float* values) {
  if (!is_quantized(format)) {
    for (int64_t e = 0; e < width; ++e) {
      switch (format) {
        case KVFormat::f16: {
          float16 h;
          std::memcpy(&h, row + 2 * e, 2);
          values[e] = to_float(h);
          break;
        }
        case KVFormat::bf16: {
          bfloat16 h;
          std::memcpy(&h, row + 2 * e, 2);
          values[e] = to_float(h);
          break;
        }
        default:
          std::memcpy(values + e, row + 4 * e, 4);
      }
    }
    return;
  }
  const int64_t group = kv_group_size(format, keys, width);
  const int64_t groups = (width + group - 1) / group;
  const uint8_t* codes = row + 2 * groups;
  for (int64_t e = 0; e < width; ++e) {
    float16 scale;
    std::memcpy(&scale, row + 2 * (e / group), 2);
    values[e] = to_float(scale) * decode_code(format, codes, e);
  }
}

uint8_t fp8_e4m3_from_float(float x) {
  return encode_minifloat(x, 3, 7, 0x7E);
}
uint8_t fp8_e5m2_from_float(float x) {
  return encode_minifloat(x, 2, 15, 0x7B);
}

float float_from_fp8_e4m3(uint8_t code) {
  const int exponent = (code >> 3) & 0x0F, mantissa = code & 0x07;
  const float magnitude = exponent == 0
                              ? std::ldexp(static_cast<float>(mantissa), -9)
                              : std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  return (code & 0x80) ? -magnitude : magnitude;
}

float float_from_fp8_e5m2(uint8_t code) {
  return to_float(float16{static_cast<uint16_t>(code << 8)});
}

}  // namespace maskattn
