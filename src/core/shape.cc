#include "maskattn/shape.h"

#include <limits>

#include "maskattn/error.h"

namespace maskattn {

std::string shape_string(const Dims& dims) {
  std::string text = "[";
  for (size_t axis = 0; axis < dims.size(); ++axis) {
    if (axis > 0) text += ",";
    text += std::to_string(dims[axis]);
  }
  return text + "]";
}

int64_t checked_numel(const Dims& dims, const std::string& what) {
  // The product of the non-zero sizes must fit too: strides and offsets are computed from it even
  // when a zero size makes the array empty.
  int64_t nonzero_product = 1;
  bool empty = false;
  for (int64_t size : dims) {
    if (size < 0) throw Error(what + " shape " + shape_string(dims) + " has a negative size");
    if (size == 0) {
      empty = true;
      continue;
    }
    if (nonzero_product > std::numeric_limits<int64_t>::max() / size) {
      throw Error(what + " shape " + shape_string(dims) +
                  " has more elements than int64 can count");
    }
    nonzero_product *= size;
  }
  return empty ? 0 : nonzero_product;
}

}  // namespace maskattn
