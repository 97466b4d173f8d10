// maskattn::Array<T> — an owned, row-major (C order) array of any rank, used for mask and modifier
// inputs (lengths, token ids, keep/blocked/additive matrices, slopes).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "maskattn/error.h"
#include "maskattn/shape.h"

namespace maskattn {

template <typename T>
class Array {
 public:
  Array() = default;  // a scalar-shaped empty array is never valid input; see empty()

  // Throws Error if the number of values does not equal the product of the shape.
  Array(Dims shape, std::vector<T> values) : shape_(std::move(shape)), values_(std::move(values)) {
    const int64_t expected = checked_numel(shape_, "array");
    if (expected != static_cast<int64_t>(values_.size())) {
      throw Error("array of shape " + shape_string(shape_) + " needs " + std::to_string(expected) +
                  " values, got " + std::to_string(values_.size()));
    }
  }

  const Dims& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int axis) const { return shape_[axis]; }
  const std::vector<T>& values() const { return values_; }
  const T* data() const { return values_.data(); }
  int64_t numel() const { return static_cast<int64_t>(values_.size()); }
  bool empty() const { return shape_.empty() && values_.empty(); }

  // Row-major element access for rank-2 arrays (the [B, L] per-token inputs).
  const T& at(int64_t row, int64_t col) const { return values_[row * shape_[1] + col]; }

 private:
  Dims shape_;
  std::vector<T> values_;
};

}  // namespace maskattn
