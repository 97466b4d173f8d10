// Heatmap rendering: one layout, drawn either into an RGB image (PNG through stb_image_write,
// text through stb_easy_font's quads) or as SVG elements at the same coordinates.
#include "viz/heatmap_render.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "maskattn/error.h"
#include "maskattn/memory.h"
#include "viz/raster.h"
#include "viz/stb.h"

namespace maskattn {

using detail::draw_text;
using detail::text_width;

namespace {

constexpr int kMargin = 10;
constexpr int kTextHeight = 7;  // stb_easy_font glyphs
constexpr int kTitleHeight = 14;
constexpr int kLegendWidth = 70;
constexpr size_t kMaxLabel = 12;

std::string cut(std::string label) {
  if (label.size() > kMaxLabel) label = label.substr(0, kMaxLabel - 1) + "~";
  for (char& c : label) {
    if (static_cast<unsigned char>(c) < 32 || static_cast<unsigned char>(c) > 126) c = '?';
  }
  return label;
}

std::string row_label(const HeatmapLabels& labels, int64_t i) {
  return cut(i < static_cast<int64_t>(labels.rows.size()) ? labels.rows[i] : std::to_string(i));
}
std::string col_label(const HeatmapLabels& labels, int64_t j) {
  return cut(j < static_cast<int64_t>(labels.cols.size()) ? labels.cols[j] : std::to_string(j));
}

// Every how many rows/columns a label fits without overlapping its neighbour.
int64_t label_step(int cell) {
  return std::max<int64_t>(1, (kTextHeight + 2 + cell - 1) / cell);
}

bool has_weights(const std::vector<HeatmapPanel>& panels) {
  return std::any_of(panels.begin(), panels.end(),
                     [](const HeatmapPanel& p) { return !p.weights.empty(); });
}

void check(const std::vector<HeatmapPanel>& panels) {
  if (panels.empty()) throw Error("heatmap: no panels to draw");
  for (const HeatmapPanel& p : panels) {
    const auto cells =
        static_cast<size_t>(std::max<int64_t>(p.rows, 0) * std::max<int64_t>(p.cols, 0));
    if (p.rows < 1 || p.cols < 1 || p.allowed.size() != cells ||
        (!p.weights.empty() && p.weights.size() != cells)) {
      throw Error("heatmap: panel '" + p.title + "' of " + std::to_string(p.rows) + "x" +
                  std::to_string(p.cols) + " cells has " + std::to_string(p.allowed.size()) +
                  " allowed flags and " + std::to_string(p.weights.size()) + " weights");
    }
  }
}

void fill(std::vector<uint8_t>& rgb, int width, int x0, int y0, int w, int h, Rgb colour,
          bool hatched = false) {
  for (int y = y0; y < y0 + h; ++y) {
    for (int x = x0; x < x0 + w; ++x) {
      // Hatching: a diagonal line every 4 pixels, kept off the cell's centre pixel so that the
      // centre always shows the base grey (tests read it).
      const bool line = hatched && (x + y) % 4 == 0 && !(x == x0 + w / 2 && y == y0 + h / 2);
      const Rgb c = line ? kHatchColour : colour;
      uint8_t* pixel = rgb.data() + (static_cast<size_t>(y) * width + x) * 3;
      pixel[0] = c.r, pixel[1] = c.g, pixel[2] = c.b;
    }
  }
}

std::string hex(Rgb c) {
  char text[8];
  std::snprintf(text, sizeof text, "#%02x%02x%02x", c.r, c.g, c.b);
  return text;
}

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Label geometry shared by the layout and both renderers.
struct Margins {
  int row_labels = 0, col_labels = 0;
};
Margins margins(const std::vector<HeatmapPanel>& panels, const HeatmapLabels& labels, int cell) {
  Margins m;
  const int64_t step = label_step(cell);
  for (const HeatmapPanel& p : panels) {
    for (int64_t i = 0; i < p.rows; i += step)
      m.row_labels = std::max(m.row_labels, text_width(row_label(labels, i)));
    for (int64_t j = 0; j < p.cols; j += step)
      m.col_labels = std::max(m.col_labels, text_width(col_label(labels, j)));
  }
  m.row_labels += 4;
  m.col_labels += 4;
  return m;
}

}  // namespace

Rgb weight_colour(float weight) {
  // ColorBrewer "Blues", 9 stops, linear in the weight.
  static constexpr Rgb kStops[] = {{247, 251, 255}, {222, 235, 247}, {198, 219, 239},
                                   {158, 202, 225}, {107, 174, 214}, {66, 146, 198},
                                   {33, 113, 181},  {8, 81, 156},    {8, 48, 107}};
  if (!(weight >= 0.0f)) weight = 0.0f;  // NaN too
  const float t = std::min(weight, 1.0f) * 8.0f;
  const int lo = std::min(static_cast<int>(t), 7);
  const float f = t - static_cast<float>(lo);
  const auto mix = [&](uint8_t a, uint8_t b) {
    return static_cast<uint8_t>(std::lround(a + (static_cast<float>(b) - a) * f));
  };
  return {mix(kStops[lo].r, kStops[lo + 1].r), mix(kStops[lo].g, kStops[lo + 1].g),
          mix(kStops[lo].b, kStops[lo + 1].b)};
}

std::vector<HeatmapPanel> heatmap_panels(const Array<uint8_t>& allowed,
                                         const std::vector<float>& weights, int64_t max_panels) {
  if (allowed.rank() != 4) {
    throw Error("heatmap_panels: allowed has shape " + shape_string(allowed.shape()) +
                "; expected [B,H,Lq,Lk]");
  }
  if (!weights.empty() && static_cast<int64_t>(weights.size()) != allowed.numel()) {
    throw Error("heatmap_panels: " + std::to_string(weights.size()) + " weights for allowed " +
                shape_string(allowed.shape()));
  }
  const int64_t B = allowed.dim(0), H = allowed.dim(1), L = allowed.dim(2), M = allowed.dim(3);
  std::vector<HeatmapPanel> panels;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H && static_cast<int64_t>(panels.size()) < max_panels; ++h) {
      HeatmapPanel p;
      p.title = "b=" + std::to_string(b) + " h=" + std::to_string(h);
      p.rows = L;
      p.cols = M;
      const size_t first = static_cast<size_t>((b * H + h) * L * M),
                   count = static_cast<size_t>(L * M);
      p.allowed.assign(allowed.values().begin() + first, allowed.values().begin() + first + count);
      if (!weights.empty())
        p.weights.assign(weights.begin() + first, weights.begin() + first + count);
      panels.push_back(std::move(p));
    }
  }
  return panels;
}

namespace detail {

int HeatmapLayout::cell_x(size_t p, int64_t col) const {
  return panels[p].x + static_cast<int>(col) * cell + cell / 2;
}
int HeatmapLayout::cell_y(size_t p, int64_t row) const {
  return panels[p].y + static_cast<int>(row) * cell + cell / 2;
}

HeatmapLayout heatmap_layout(const std::vector<HeatmapPanel>& panels, const HeatmapLabels& labels) {
  check(panels);
  int64_t rows = 0, cols = 0;
  for (const HeatmapPanel& p : panels) rows = std::max(rows, p.rows), cols = std::max(cols, p.cols);
  HeatmapLayout layout;
  layout.cell = static_cast<int>(std::clamp<int64_t>(480 / std::max(rows, cols), 2, 28));
  const Margins m = margins(panels, labels, layout.cell);
  const int block_w = m.row_labels + static_cast<int>(cols) * layout.cell + kMargin;
  const int block_h = kTitleHeight + m.col_labels + static_cast<int>(rows) * layout.cell + kMargin;
  const int grid_cols = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(panels.size()))));
  const int grid_rows = static_cast<int>((panels.size() + grid_cols - 1) / grid_cols);
  for (size_t n = 0; n < panels.size(); ++n) {
    const int gx = static_cast<int>(n) % grid_cols, gy = static_cast<int>(n) / grid_cols;
    layout.panels.push_back({kMargin + gx * block_w + m.row_labels,
                             kMargin + gy * block_h + kTitleHeight + m.col_labels});
  }
  layout.width = kMargin + grid_cols * block_w + kLegendWidth;
  layout.height = std::max(kMargin + grid_rows * block_h, kMargin + 150);
  require_memory(3.0 * layout.width * layout.height, "a heatmap of " +
                                                         std::to_string(layout.width) + "x" +
                                                         std::to_string(layout.height) + " pixels");
  return layout;
}

Rgb HeatmapImage::at(int x, int y) const {
  const uint8_t* pixel = rgb.data() + (static_cast<size_t>(y) * layout.width + x) * 3;
  return {pixel[0], pixel[1], pixel[2]};
}

HeatmapImage render_heatmap(const std::vector<HeatmapPanel>& panels, const HeatmapLabels& labels) {
  HeatmapImage image;
  image.layout = heatmap_layout(panels, labels);
  const HeatmapLayout& L = image.layout;
  image.rgb.assign(static_cast<size_t>(L.width) * L.height * 3, 255);
  const Rgb ink{40, 40, 40};
  const int64_t step = label_step(L.cell);
  for (size_t n = 0; n < panels.size(); ++n) {
    const HeatmapPanel& p = panels[n];
    const int x0 = L.panels[n].x, y0 = L.panels[n].y;
    const Margins m = margins(panels, labels, L.cell);
    draw_text(image.rgb, L.width, L.height, x0 - m.row_labels, y0 - m.col_labels - kTitleHeight + 2,
              p.title, ink);
    for (int64_t i = 0; i < p.rows; ++i) {
      for (int64_t j = 0; j < p.cols; ++j) {
        const size_t cell = static_cast<size_t>(i * p.cols + j);
        const int x = x0 + static_cast<int>(j) * L.cell, y = y0 + static_cast<int>(i) * L.cell;
        if (!p.allowed[cell]) {
          fill(image.rgb, L.width, x, y, L.cell, L.cell, kHiddenColour, true);
        } else {
          fill(image.rgb, L.width, x, y, L.cell, L.cell,
               p.weights.empty() ? kAllowedColour : weight_colour(p.weights[cell]));
        }
      }
    }
    for (int64_t i = 0; i < p.rows; i += step) {
      const std::string label = row_label(labels, i);
      draw_text(image.rgb, L.width, L.height, x0 - 3 - text_width(label),
                y0 + static_cast<int>(i) * L.cell + (L.cell - kTextHeight) / 2, label, ink);
    }
    for (int64_t j = 0; j < p.cols; j += step) {
      draw_text(image.rgb, L.width, L.height,
                x0 + static_cast<int>(j) * L.cell + (L.cell - kTextHeight) / 2, y0 - 3,
                col_label(labels, j), ink, true);
    }
  }
  // Legend: the weight scale (when there are weights) and the hidden swatch.
  const int lx = L.width - kLegendWidth + 8;
  int ly = kMargin + kTitleHeight;
  if (has_weights(panels)) {
    draw_text(image.rgb, L.width, L.height, lx, ly - 10, "weight", ink);
    for (int k = 0; k < 100; ++k) {
      fill(image.rgb, L.width, lx, ly + k, 14, 1, weight_colour(1.0f - k / 99.0f));
    }
    draw_text(image.rgb, L.width, L.height, lx + 18, ly, "1", ink);
    draw_text(image.rgb, L.width, L.height, lx + 18, ly + 93, "0", ink);
    ly += 110;
  } else {
    fill(image.rgb, L.width, lx, ly, 14, 14, kAllowedColour);
    draw_text(image.rgb, L.width, L.height, lx + 18, ly + 4, "allowed", ink);
    ly += 20;
  }
  fill(image.rgb, L.width, lx, ly, 14, 14, kHiddenColour, true);
  draw_text(image.rgb, L.width, L.height, lx + 18, ly + 4, "hidden", ink);
  return image;
}

}  // namespace detail

namespace {

using detail::HeatmapLayout;

// The SVG's root element, the hatch pattern of hidden cells and a white background.
std::string svg_header(const HeatmapLayout& L) {
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(L.width) +
                    "\" height=\"" + std::to_string(L.height) + "\" font-family=\"monospace\" " +
                    "font-size=\"8\">\n";
  svg +=
      "<defs><pattern id=\"hidden\" width=\"4\" height=\"4\" patternUnits=\"userSpaceOnUse\">"
      "<rect width=\"4\" height=\"4\" fill=\"" +
      hex(kHiddenColour) +
      "\"/>"
      "<path d=\"M0,4 L4,0\" stroke=\"" +
      hex(kHatchColour) +
      "\" stroke-width=\"1\"/>"
      "</pattern></defs>\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  return svg;
}

// Panel n: its title, one titled <rect> per cell (hovering shows the pair and its weight), and
// the row and column labels.
std::string svg_panel(const std::vector<HeatmapPanel>& panels, size_t n,
                      const HeatmapLabels& labels, const HeatmapLayout& L) {
  const Margins m = margins(panels, labels, L.cell);
  const int64_t step = label_step(L.cell);
  const std::string cell = std::to_string(L.cell);
  const HeatmapPanel& p = panels[n];
  const int x0 = L.panels[n].x, y0 = L.panels[n].y;
  std::string svg = "<g class=\"panel\"><text x=\"" + std::to_string(x0 - m.row_labels) +
                    "\" y=\"" + std::to_string(y0 - m.col_labels - 4) + "\">" + escape(p.title) +
                    "</text>\n";
  for (int64_t i = 0; i < p.rows; ++i) {
    for (int64_t j = 0; j < p.cols; ++j) {
      const size_t index = static_cast<size_t>(i * p.cols + j);
      std::string fill_colour;
      std::string title;
      if (!p.allowed[index]) {
        fill_colour = "url(#hidden)";
        title = "hidden";
      } else if (p.weights.empty()) {
        fill_colour = hex(kAllowedColour);
        title = "allowed";
      } else {
        fill_colour = hex(weight_colour(p.weights[index]));
        char text[32];
        std::snprintf(text, sizeof text, "%.4f", p.weights[index]);
        title = text;
      }
      svg += "<rect x=\"" + std::to_string(x0 + j * L.cell) + "\" y=\"" +
             std::to_string(y0 + i * L.cell) + "\" width=\"" + cell + "\" height=\"" + cell +
             "\" fill=\"" + fill_colour + "\"><title>" + escape(row_label(labels, i)) + " → " +
             escape(col_label(labels, j)) + ": " + title + "</title></rect>\n";
    }
  }
  for (int64_t i = 0; i < p.rows; i += step) {
    svg += "<text x=\"" + std::to_string(x0 - 3) + "\" y=\"" +
           std::to_string(y0 + i * L.cell + L.cell / 2 + 3) + "\" text-anchor=\"end\">" +
           escape(row_label(labels, i)) + "</text>\n";
  }
  for (int64_t j = 0; j < p.cols; j += step) {
    const int x = x0 + static_cast<int>(j) * L.cell + L.cell / 2 + 3, y = y0 - 3;
    svg += "<text x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(y) +
           "\" transform=\"rotate(-90 " + std::to_string(x) + " " + std::to_string(y) + ")\">" +
           escape(col_label(labels, j)) + "</text>\n";
  }
  svg += "</g>\n";
  return svg;
}

// The legend: the weight scale (or the allowed swatch for a mask) and the hidden swatch.
std::string svg_legend(const std::vector<HeatmapPanel>& panels, const HeatmapLayout& L) {
  std::string svg;
  const int lx = L.width - kLegendWidth + 8;
  int ly = kMargin + kTitleHeight;
  if (has_weights(panels)) {
    svg += "<defs><linearGradient id=\"scale\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">";
    for (int k = 0; k <= 8; ++k) {
      svg += "<stop offset=\"" + std::to_string(k / 8.0) + "\" stop-color=\"" +
             hex(weight_colour(k / 8.0f)) + "\"/>";
    }
    svg += "</linearGradient></defs>\n<text x=\"" + std::to_string(lx) + "\" y=\"" +
           std::to_string(ly - 4) + "\">weight</text><rect x=\"" + std::to_string(lx) + "\" y=\"" +
           std::to_string(ly) + "\" width=\"14\" height=\"100\" fill=\"url(#scale)\"/><text x=\"" +
           std::to_string(lx + 18) + "\" y=\"" + std::to_string(ly + 7) + "\">1</text><text x=\"" +
           std::to_string(lx + 18) + "\" y=\"" + std::to_string(ly + 100) + "\">0</text>\n";
    ly += 110;
  } else {
    svg += "<rect x=\"" + std::to_string(lx) + "\" y=\"" + std::to_string(ly) +
           "\" width=\"14\" height=\"14\" fill=\"" + hex(kAllowedColour) + "\"/><text x=\"" +
           std::to_string(lx + 18) + "\" y=\"" + std::to_string(ly + 10) + "\">allowed</text>\n";
    ly += 20;
  }
  svg += "<rect x=\"" + std::to_string(lx) + "\" y=\"" + std::to_string(ly) +
         "\" width=\"14\" height=\"14\" fill=\"url(#hidden)\"/><text x=\"" +
         std::to_string(lx + 18) + "\" y=\"" + std::to_string(ly + 10) + "\">hidden</text>\n";
  return svg;
}

}  // namespace

std::string heatmap_svg(const std::vector<HeatmapPanel>& panels, const HeatmapLabels& labels) {
  const HeatmapLayout L = detail::heatmap_layout(panels, labels);
  std::string svg = svg_header(L);
  for (size_t n = 0; n < panels.size(); ++n) svg += svg_panel(panels, n, labels, L);
  svg += svg_legend(panels, L);
  svg += "</svg>\n";
  return svg;
}

void write_heatmap(const std::string& path, const std::vector<HeatmapPanel>& panels,
                   const HeatmapLabels& labels) {
  const auto ends_with = [&](const std::string& suffix) {
    return path.size() >= suffix.size() &&
           path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends_with(".png")) {
    const detail::HeatmapImage image = detail::render_heatmap(panels, labels);
    if (!stbi_write_png(path.c_str(), image.layout.width, image.layout.height, 3, image.rgb.data(),
                        image.layout.width * 3)) {
      throw Error("cannot write heatmap '" + path + "'");
    }
  } else if (ends_with(".svg")) {
    const std::string svg = heatmap_svg(panels, labels);
    std::ofstream file(path, std::ios::binary);
    file << svg;
    file.close();
    if (!file) throw Error("cannot write heatmap '" + path + "'");
  } else {
    throw Error("heatmap file '" + path + "' must end in .png or .svg");
  }
}

}  // namespace maskattn
