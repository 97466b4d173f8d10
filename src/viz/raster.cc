#include "viz/raster.h"

#include <algorithm>

#include "viz/stb.h"

namespace maskattn::detail {

int text_width(const std::string& text) {
  std::string copy = text;
  return stb_easy_font_width(copy.data());
}

void draw_text(std::vector<uint8_t>& rgb, int width, int height, int x, int y,
               const std::string& text, Rgb colour, bool vertical) {
  std::string copy = text;
  static thread_local std::vector<char> vertices(64 * 1024);
  const int quads = stb_easy_font_print(0, 0, copy.data(), nullptr, vertices.data(),
                                        static_cast<int>(vertices.size()));
  for (int q = 0; q < quads; ++q) {
    const auto* v = reinterpret_cast<const float*>(vertices.data() + q * 64);  // 4 × 16 bytes
    const float qx0 = v[0], qy0 = v[1], qx1 = v[8], qy1 = v[9];                // corners 0 and 2
    int x0, x1, y0, y1;
    if (!vertical) {
      x0 = x + static_cast<int>(qx0), x1 = x + static_cast<int>(qx1);
      y0 = y + static_cast<int>(qy0), y1 = y + static_cast<int>(qy1);
    } else {
      x0 = x + static_cast<int>(qy0), x1 = x + static_cast<int>(qy1);
      y0 = y - static_cast<int>(qx1), y1 = y - static_cast<int>(qx0);
    }
    for (int py = std::max(y0, 0); py < std::min(y1, height); ++py) {
      for (int px = std::max(x0, 0); px < std::min(x1, width); ++px) {
        uint8_t* pixel = rgb.data() + (static_cast<size_t>(py) * width + px) * 3;
        pixel[0] = colour.r, pixel[1] = colour.g, pixel[2] = colour.b;
      }
    }
  }
}

}  // namespace maskattn::detail
