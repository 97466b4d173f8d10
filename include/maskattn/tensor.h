// Strided tensor views: a data pointer, an element type, up to 4 sizes and 4 strides (in elements).
// Views never own memory. Q, K, V and O are viewed as [B, H, L, D]; a [B, L, H, D] buffer is viewed
// without a copy by permuting strides (see TensorView::from_blhd).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "maskattn/dtype.h"
#include "maskattn/shape.h"

namespace maskattn {

class TensorView {
 public:
  static constexpr int kMaxRank = 4;

  TensorView() = default;  // the null view: "not given" for optional outputs

  // Contiguous row-major view.
  template <typename T>
  TensorView(const T* data, std::initializer_list<int64_t> sizes)
      : TensorView(data, dtype_of_v<T>, Dims(sizes)) {}
  template <typename T>
  TensorView(const T* data, const Dims& sizes) : TensorView(data, dtype_of_v<T>, sizes) {}

  // Explicit strides, in elements (any sign; 0 repeats an element).
  template <typename T>
  TensorView(const T* data, const Dims& sizes, const Dims& strides)
      : TensorView(data, dtype_of_v<T>, sizes, strides) {}

  // Type-erased forms, for callers that pick the element type at run time.
  TensorView(const void* data, DType dtype, const Dims& sizes);
  TensorView(const void* data, DType dtype, const Dims& sizes, const Dims& strides);

  // A [B, L, H, D] buffer (the layout of most model code and FlashAttention) seen as [B, H, L, D].
  template <typename T>
  static TensorView from_blhd(const T* data, int64_t batch, int64_t length, int64_t heads,
                              int64_t dim) {
    return TensorView(data, {batch, heads, length, dim},
                      {length * heads * dim, dim, heads * dim, 1});
  }

  bool is_null() const { return data_ == nullptr && rank_ == 0; }
  const void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  int rank() const { return rank_; }
  int64_t size(int axis) const { return sizes_[axis]; }
  int64_t stride(int axis) const { return strides_[axis]; }
  Dims sizes() const { return Dims(sizes_.begin(), sizes_.begin() + rank_); }
  Dims strides() const { return Dims(strides_.begin(), strides_.begin() + rank_); }
  int64_t numel() const;
  std::string shape_string() const { return maskattn::shape_string(sizes()); }

  // Element offset (in elements, not bytes) of a multi-index of length rank().
  int64_t offset(const std::array<int64_t, kMaxRank>& index) const {
    int64_t result = 0;
    for (int axis = 0; axis < rank_; ++axis) result += index[axis] * strides_[axis];
    return result;
  }

 protected:
  const void* data_ = nullptr;
  DType dtype_ = DType::f32;
  int rank_ = 0;
  std::array<int64_t, kMaxRank> sizes_{};
  std::array<int64_t, kMaxRank> strides_{};
};

// A view the library may write through (outputs: O, LSE, weights).
class MutableTensorView : public TensorView {
 public:
  MutableTensorView() = default;
  template <typename T>
  MutableTensorView(T* data, std::initializer_list<int64_t> sizes)
      : TensorView(data, dtype_of_v<T>, Dims(sizes)) {}
  template <typename T>
  MutableTensorView(T* data, const Dims& sizes) : TensorView(data, dtype_of_v<T>, sizes) {}
  template <typename T>
  MutableTensorView(T* data, const Dims& sizes, const Dims& strides)
      : TensorView(data, dtype_of_v<T>, sizes, strides) {}
  MutableTensorView(void* data, DType dtype, const Dims& sizes) : TensorView(data, dtype, sizes) {}
  MutableTensorView(void* data, DType dtype, const Dims& sizes, const Dims& strides)
      : TensorView(data, dtype, sizes, strides) {}

  template <typename T>
  static MutableTensorView from_blhd(T* data, int64_t batch, int64_t length, int64_t heads,
                                     int64_t dim) {
    return MutableTensorView(data, {batch, heads, length, dim},
                             {length * heads * dim, dim, heads * dim, 1});
  }

  void* mutable_data() const { return const_cast<void*>(data_); }
};

}  // namespace maskattn
