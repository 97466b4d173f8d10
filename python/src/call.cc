#include "call.h"

#include "maskattn/cpu.h"

namespace maskattn::python {

const Mask& mask_or_none(const Mask* mask) {
  static const Mask kAllowAll;
  return mask != nullptr ? *mask : kAllowAll;
}

const ScoreMods& mods_or_none(const ScoreMods* mods) {
  static const ScoreMods kNoMods;
  return mods != nullptr ? *mods : kNoMods;
}

Options options_of(std::optional<double> scale, int threads, const std::string& kernel,
                   const std::string& products, bool check_finite) {
  Options options;
  options.scale = scale;
  options.threads = threads;
  options.kernel = parse_kernel(kernel, "kernel");
  options.products = parse_products(products, "products");
  options.check_finite = check_finite;
  return options;
}

Frame frame_of(const std::optional<std::vector<int64_t>>& frame) {
  if (!frame) return Frame{};
  if (frame->size() != 4)
    throw Error("frame must hold 4 integers, got " + std::to_string(frame->size()));
  return Frame{(*frame)[0], (*frame)[1], (*frame)[2], (*frame)[3]};
}

MutableTensorView optional_output(const std::optional<OutputArray>& array, const char* name,
                                  const std::string& element) {
  return array ? output_view(*array, name, element) : MutableTensorView();
}

}  // namespace maskattn::python
