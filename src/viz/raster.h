// Text in RGB images, shared by the heatmaps and the line plots: stb_easy_font's quads filled
// into a row-major RGB buffer. Internal, not in the installed headers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "maskattn/heatmap.h"

namespace maskattn::detail {

// The width in pixels of `text` in stb_easy_font (7 pixels high).
int text_width(const std::string& text);

// Draws `text` with its top-left corner at (x, y), clipped to the image; `vertical` turns it to
// read bottom-up from (x, y).
void draw_text(std::vector<uint8_t>& rgb, int width, int height, int x, int y,
               const std::string& text, Rgb colour, bool vertical = false);

}  // namespace maskattn::detail
