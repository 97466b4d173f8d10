#include "core/store_f32.h"

#include <array>

#include "core/element.h"

namespace maskattn::detail {

void store_f32(const float* src, const MutableTensorView& dst, bool add) {
  const int rank = dst.rank();
  if (rank == 0 || dst.numel() == 0) return;
  const int64_t width = dst.size(rank - 1), stride = dst.stride(rank - 1);
  const int64_t rows = dst.numel() / width;
  std::array<int64_t, TensorView::kMaxRank> index{};  // the row's index; its last axis stays 0
  float* const f32 = dst.dtype() == DType::f32 ? static_cast<float*>(dst.mutable_data()) : nullptr;
  for (int64_t row = 0; row < rows; ++row, src += width) {
    const int64_t first = dst.offset(index);
    if (f32 != nullptr) {
      float* out = f32 + first;
      // Not 0 + src when storing: that would turn −0 into +0.
      if (add) {
        for (int64_t e = 0; e < width; ++e) out[e * stride] += src[e];
      } else {
        for (int64_t e = 0; e < width; ++e) out[e * stride] = src[e];
      }
    } else {
      for (int64_t e = 0; e < width; ++e) {
        const int64_t offset = first + e * stride;
        store_float(dst, offset, add ? load_float(dst, offset) + src[e] : src[e]);
      }
    }
    for (int axis = rank - 2; axis >= 0; --axis) {  // row-major increment of the row index
      if (++index[axis] < dst.size(axis)) break;
      index[axis] = 0;
    }
  }
}

}  // namespace maskattn::detail
