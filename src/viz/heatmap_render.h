// The heatmap's pixel geometry and its RGB rendering before PNG encoding: internal (the PNG and
// SVG writers share the layout; tests read pixels at known cells), not in the installed headers.
#pragma once

#include <cstdint>
#include <vector>

#include "maskattn/heatmap.h"

namespace maskattn::detail {

// Where things are drawn, in pixels (the PNG's; the SVG uses the same coordinates).
struct HeatmapLayout {
  int width = 0, height = 0;
  int cell = 0;  // cell side
  struct Origin {
    int x, y;  // top-left corner of the panel's cell grid
  };
  std::vector<Origin> panels;
  // The centre pixel of cell (row, col) of panel p.
  int cell_x(size_t p, int64_t col) const;
  int cell_y(size_t p, int64_t row) const;
};
HeatmapLayout heatmap_layout(const std::vector<HeatmapPanel>& panels, const HeatmapLabels& labels);

// The PNG's pixels, RGB, row-major: what write_heatmap() encodes, and what tests read.
struct HeatmapImage {
  HeatmapLayout layout;
  std::vector<uint8_t> rgb;  // width·height·3
  Rgb at(int x, int y) const;
};
HeatmapImage render_heatmap(const std::vector<HeatmapPanel>& panels, const HeatmapLabels& labels);

}  // namespace maskattn::detail
