// Heatmaps of masks and attention weights, as PNG (stb_image_write) or SVG: one panel per
// (batch, head), row and column labels (token strings or indices), a colour scale, and hidden
// pairs drawn hatched grey so that they never look like a weight of 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "maskattn/array.h"
#include "maskattn/attention.h"

namespace maskattn {

// One grid: `allowed` (rows·cols, 1 = allowed) always; `weights` (rows·cols, in [0, 1]) for an
// attention heatmap, empty for a mask (allowed cells are then drawn in one colour).
struct HeatmapPanel {
  std::string title;  // "b=0 h=1"
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> allowed;
  std::vector<float> weights;
};

// Row (query) and column (key) labels; empty = indices. Long labels are cut to 12 characters.
struct HeatmapLabels {
  std::vector<std::string> rows, cols;
};

// Panels from maskattn arrays: a mask [B, H, Lq, Lk] (allowed_pairs) and optionally its weights
// (attention_weights, same shape), at most `max_panels` (b, h) pairs in order.
std::vector<HeatmapPanel> heatmap_panels(const Array<uint8_t>& allowed,
                                         const std::vector<float>& weights = {},
                                         int64_t max_panels = 16);

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb&) const = default;
};
Rgb weight_colour(float weight);                    // the scale: 0 → near white, 1 → dark blue
inline constexpr Rgb kAllowedColour{33, 113, 181};  // mask panels: an allowed pair
inline constexpr Rgb kHiddenColour{189, 189, 189};  // hidden pairs: this grey, hatched with
inline constexpr Rgb kHatchColour{115, 115, 115};   // diagonal lines of this one

std::string heatmap_svg(const std::vector<HeatmapPanel>& panels, const HeatmapLabels& labels);

// Writes FILE.png or FILE.svg by the extension; throws Error for another extension, an
// unwritable path, no panels, or a panel whose arrays do not match rows·cols.
void write_heatmap(const std::string& path, const std::vector<HeatmapPanel>& panels,
                   const HeatmapLabels& labels = {});

}  // namespace maskattn
