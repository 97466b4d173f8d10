// How a KV cache stores one row (the D keys or Dv values of one position and kv head): plain f32,
// f16 or bf16, or quantized (int8, fp8 e4m3/e5m2, q4) with scales, on append (docs/semantics.md
// §18). The kernels read quantized rows in place and dequantize in registers; these scalar
// functions are the definition they are tested against.
//
// A quantized row is its scales then its codes:
//
//     [ scale_0 … scale_{G−1} : f16 ][ codes ]        G = ⌈width / group⌉ groups
//
// Group g covers the elements [g·group, min((g+1)·group, width)) and its value is
// x̂ = scale_g · decode(code). Keys are grouped by 32 channels (the outlier channels KIVI found in
// the keys of large LLMs then only coarsen their own group); values by the whole row (one scale per
// token and head, as KIVI recommends for values); q4 groups both by 32 (llama.cpp's q4_0). What
// these choices do on trained models is measured in docs/semantics.md §18 (bench/kv_group_study).
//
//   int8      code ∈ [−127, 127], decode = code; scale = amax / 127, rounded up to an f16
//   fp8_e4m3  OCP E4M3 (bias 7, no infinities, max 448); scale = amax / 448, rounded up
//   fp8_e5m2  OCP E5M2 (bias 15, an f16's top byte, max 57344); scale = amax / 57344, rounded up
//   q4        4-bit code n, decode = n − 8 ∈ [−8, 7]; scale = m / −8 with m the group's element
//             of largest magnitude, rounded away from 0; two codes per byte, byte i of a group
//             of 32 holding element i (low nibble) and element i + 16 (high)
//
// Rounding the scale up (in magnitude) keeps every |x / scale| inside the code range, so no code
// saturates except q4's +8 (→ 7). Bounds on |x − x̂| per element (s = the group's scale):
// int8 ≤ s/2; fp8 ≤ half a unit in the last place of the code's binade times s (relative 2⁻⁴
// for e4m3 and 2⁻³ for e5m2 of normal codes); q4 ≤ s/2, and ≤ s for the values that round to +8.
// Inputs must be finite, and a group's scale must fit an f16 (amax ≤ 65504 × the code's maximum):
// append() throws Error E145 otherwise.
#pragma once

#include <cstdint>
#include <string>

#include "maskattn/dtype.h"

namespace maskattn {

enum class KVFormat : uint8_t { f32, f16, bf16, int8, fp8_e4m3, fp8_e5m2, q4 };

const char* kv_format_name(KVFormat format);  // "f32", …, "int8", "fp8-e4m3", "fp8-e5m2", "q4"
// The inverse of kv_format_name (also "fp8_e4m3", "fp8"→e4m3); Error E144 naming `what` otherwise.
KVFormat parse_kv_format(const std::string& name, const std::string& what);
bool is_quantized(KVFormat format);
// The unquantized formats as a DType (f32, f16, bf16); quantized ones have none (Error).
DType kv_format_dtype(KVFormat format);
KVFormat kv_format_of(DType dtype);

// Elements per scale: keys 32, values the whole row, q4 32 for both; 0 for unquantized formats.
int64_t kv_group_size(KVFormat format, bool keys, int64_t width);
// Bytes of one stored row of `width` elements.
int64_t kv_row_bytes(KVFormat format, bool keys, int64_t width);
// Whether `width` is storable: q4 needs a multiple of 32; others any width ≥ 1.
bool kv_width_fits(KVFormat format, int64_t width);

// Encodes `width` floats into one row (kv_row_bytes bytes). Returns false, writing nothing useful,
// when a value is not finite or a scale does not fit an f16; `bad_index` then names the element.
bool kv_encode_row(KVFormat format, bool keys, const float* values, int64_t width, uint8_t* row,
                   int64_t* bad_index);
// Decodes one row into `width` floats: x̂ exactly as the kernels compute it (an f32 product of
// the f16 scale and the code, both exact in f32).
void kv_decode_row(KVFormat format, bool keys, const uint8_t* row, int64_t width, float* values);

// The fp8 conversions of the formats above: round to nearest even, saturating at the format's
// largest finite value; decoding is exact.
uint8_t fp8_e4m3_from_float(float x);
uint8_t fp8_e5m2_from_float(float x);
float float_from_fp8_e4m3(uint8_t code);
float float_from_fp8_e5m2(uint8_t code);

}  // namespace maskattn
