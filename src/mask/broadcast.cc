#include "mask/broadcast.h"

#include "maskattn/error.h"

namespace maskattn::detail {

std::string scores_shape_string(const MaskShape& shape) {
  return shape_string({shape.batch, shape.q_heads, shape.q_len, shape.k_len});
}

BroadcastStrides broadcast_to_scores(const Dims& source, const MaskShape& target,
                                     const std::string& what) {
  const std::array<int64_t, 4> target_sizes = {target.batch, target.q_heads, target.q_len,
                                               target.k_len};
  const int rank = static_cast<int>(source.size());
  if (rank > 4) {
    throw Error(what + " shape " + shape_string(source) + " does not broadcast to scores " +
                scores_shape_string(target) + " (rank > 4)");
  }
  BroadcastStrides result;
  int64_t row_major_stride = 1;
  // Walk axes from the last; source axis a meets target axis 4 − rank + a.
  for (int axis = rank - 1; axis >= 0; --axis) {
    const int target_axis = 4 - rank + axis;
    const int64_t size = source[axis];
    if (size == target_sizes[target_axis]) {
      result.stride[target_axis] = size == 1 ? 0 : row_major_stride;
    } else if (size == 1) {
      result.stride[target_axis] = 0;
    } else {
      throw Error(what + " shape " + shape_string(source) + " does not broadcast to scores " +
                  scores_shape_string(target));
    }
    row_major_stride *= size;
  }
  return result;
}

}  // namespace maskattn::detail
