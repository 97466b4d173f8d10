// Reading and writing single elements of a view of any element type, as f32. For the paths that
// are not hot (validation, merging, output rows); kernels convert whole rows with SIMD.
#pragma once

#include <cmath>
#include <cstdint>

#include "maskattn/tensor.h"

namespace maskattn::detail {

inline float load_float(const TensorView& t, int64_t offset) {
  switch (t.dtype()) {
    case DType::f32:
      return static_cast<const float*>(t.data())[offset];
    case DType::f16:
      return to_float(static_cast<const float16*>(t.data())[offset]);
    case DType::bf16:
      return to_float(static_cast<const bfloat16*>(t.data())[offset]);
  }
  return NAN;
}

// Rounds to nearest even into the view's dtype.
inline void store_float(const MutableTensorView& t, int64_t offset, float value) {
  switch (t.dtype()) {
    case DType::f32:
      static_cast<float*>(t.mutable_data())[offset] = value;
      break;
    case DType::f16:
      static_cast<float16*>(t.mutable_data())[offset] = float16_from_float(value);
      break;
    case DType::bf16:
      static_cast<bfloat16*>(t.mutable_data())[offset] = bfloat16_from_float(value);
      break;
  }
}

}  // namespace maskattn::detail
