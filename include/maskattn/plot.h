// Line plots as PNG (stb_image_write): the loss curves of `maskattn gpt ablate`. Axes span the
// data (y from the smallest to the largest value, padded 5 %), with tick values, axis labels, a
// title and a legend in the top-right corner.
#pragma once

#include <string>
#include <vector>

#include "maskattn/heatmap.h"

namespace maskattn {

struct PlotSeries {
  std::string name;  // the legend's entry
  std::vector<double> x, y;
  Rgb colour;
  bool markers = false;  // a small square at every point (sparse series: validation losses)
};

// Writes FILE.png; throws Error for another extension, an unwritable path, no series, a series
// whose x and y differ in length, or no finite point at all.
void write_line_plot(const std::string& path, const std::vector<PlotSeries>& series,
                     const std::string& title, const std::string& x_label,
                     const std::string& y_label);

}  // namespace maskattn
