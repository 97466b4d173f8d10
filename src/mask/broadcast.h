// NumPy broadcasting of a dense mask or bias to the score tensor [B, Hq, Lq, Lk].
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "maskattn/mask.h"
#include "maskattn/shape.h"

namespace maskattn::detail {

// Element strides into a row-major source for each score axis; 0 on broadcast axes.
struct BroadcastStrides {
  std::array<int64_t, 4> stride{};
  int64_t offset(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return b * stride[0] + h * stride[1] + i * stride[2] + j * stride[3];
  }
};

// Shapes align at the trailing axis; each source size must equal the target size or be 1.
// Throws "<what> shape [8,256] does not broadcast to scores [8,12,256,256]".
BroadcastStrides broadcast_to_scores(const Dims& source, const MaskShape& target,
                                     const std::string& what);

std::string scores_shape_string(const MaskShape& shape);

}  // namespace maskattn::detail
