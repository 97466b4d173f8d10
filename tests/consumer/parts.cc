// Uses the installed components beside the attention library: maskattn::viz (an SVG heatmap of a
// causal mask) and maskattn::model (the GPT's character vocabulary). Exits 0 when both answer.
#include <cstdio>
#include <string>

#include "maskattn/heatmap.h"
#include "maskattn/maskattn.h"
#include "maskattn/model/char_vocabulary.h"

int main() {
  const maskattn::Array<uint8_t> allowed =
      maskattn::allowed_pairs(maskattn::Mask().causal(), {1, 1, 3, 3});
  const std::string svg = maskattn::heatmap_svg(maskattn::heatmap_panels(allowed), {});
  const auto vocabulary = maskattn::model::CharVocabulary::from_text("dog");
  if (svg.find("<svg") == std::string::npos ||
      vocabulary.decode(vocabulary.encode("god")) != "god") {
    std::printf("consumer: the viz or model component answered wrongly\n");
    return 1;
  }
  std::printf("consumer: viz and model components OK\n");
  return 0;
}
