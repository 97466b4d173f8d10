// The CLI's mask SPEC parser on arbitrary text (one SPEC per line): each SPEC must be applied or
// rejected with maskattn::Error; a mask that parses must then evaluate on a small problem (or
// reject that problem with Error), never crash.
#include <cstdint>
#include <string>

#include "maskattn/attention.h"
#include "maskattn/error.h"
#include "maskattn/mask_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace maskattn;
  if (size > 512) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  Mask mask;
  ScoreMods mods;
  size_t start = 0;
  for (int line = 0; start <= text.size() && line < 8; ++line) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string spec = text.substr(start, end - start);
    start = end + 1;
    try {
      SpecOptions options;
      options.one_head_layout = (line & 1) != 0;
      apply_mask_spec(spec, mask, mods, "--mask " + spec, options);
    } catch (const Error&) {
    }
  }
  try {
    (void)mask.describe();
    (void)allowed_pairs(mask, MaskShape{1, 2, 5, 7});
    (void)block_map(mask, MaskShape{1, 2, 5, 7}, 2, 3);
  } catch (const Error&) {
  }
  return 0;
}
