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
  int64_t product = 1;
  for (int64_t size : dims) {
    if (size < 0) throw Error(what + " shape " + shape_string(dims) + " has a negative size");
    if (size != 0 && product > std::numeric_limits<int64_t>::max() / size) {
      throw Error(what + " shape " + shape_string(dims) +
                  " has more elements than int64 can count");
    }
    product *= size;
  }
  return product;
}

}  // namespace maskattn
