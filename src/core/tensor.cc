#include "maskattn/tensor.h"

#include "maskattn/error.h"

namespace maskattn {

namespace {

// Checks the shape first: with the product of the non-zero sizes inside int64 (checked_numel),
// no stride can overflow.
Dims row_major_strides(const Dims& sizes) {
  checked_numel(sizes, "tensor view");
  Dims strides(sizes.size(), 1);
  for (int axis = static_cast<int>(sizes.size()) - 2; axis >= 0; --axis) {
    strides[axis] = strides[axis + 1] * sizes[axis + 1];
  }
  return strides;
}

}  // namespace

TensorView::TensorView(const void* data, DType dtype, const Dims& sizes)
    : TensorView(data, dtype, sizes, row_major_strides(sizes)) {}

TensorView::TensorView(const void* data, DType dtype, const Dims& sizes, const Dims& strides)
    : data_(data), dtype_(dtype), rank_(static_cast<int>(sizes.size())) {
  if (sizes.empty() || sizes.size() > kMaxRank) {
    throw Error("tensor view of shape " + maskattn::shape_string(sizes) + " has rank " +
                std::to_string(sizes.size()) + "; views have rank 1 to 4");
  }
  if (strides.size() != sizes.size()) {
    throw Error("tensor view of shape " + maskattn::shape_string(sizes) + " got " +
                std::to_string(strides.size()) + " strides " + maskattn::shape_string(strides));
  }
  checked_numel(sizes, "tensor view");
  for (int axis = 0; axis < rank_; ++axis) {
    sizes_[axis] = sizes[axis];
    strides_[axis] = strides[axis];
  }
}

int64_t TensorView::numel() const {
  int64_t product = rank_ == 0 ? 0 : 1;
  for (int axis = 0; axis < rank_; ++axis) product *= sizes_[axis];
  return product;
}

}  // namespace maskattn
