// Names of the library's enums and their inverses (dtype.h, attention.h). The product units'
// are in kernels/products.cc beside the units themselves.
#include "core/names.h"

#include "maskattn/attention.h"
#include "maskattn/dtype.h"

namespace maskattn {

namespace {
constexpr std::array kDTypes = {DType::f32, DType::f16, DType::bf16};
constexpr std::array kKernels = {Kernel::automatic, Kernel::reference, Kernel::fused};
}  // namespace

DType parse_dtype(const std::string& name, const std::string& what) {
  return detail::parse_name(name, what, "dtype", kDTypes, dtype_name);
}

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::automatic:
      return "auto";
    case Kernel::reference:
      return "reference";
    case Kernel::fused:
      return "fused";
  }
  return "?";
}

Kernel parse_kernel(const std::string& name, const std::string& what) {
  return detail::parse_name(name, what, "kernel", kKernels, kernel_name);
}

}  // namespace maskattn
