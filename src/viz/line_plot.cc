// Line plots: the data's range mapped to a fixed plot area, lines drawn by stepping along each
// segment one pixel at a time (2 px thick), ticks at "nice" steps (1, 2 or 5 × 10^k).
#include "maskattn/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "maskattn/error.h"
#include "viz/raster.h"
#include "viz/stb.h"

namespace maskattn {

namespace {

constexpr int kWidth = 720, kHeight = 420;
constexpr int kLeft = 60, kRight = 20, kTop = 30, kBottom = 45;
constexpr Rgb kInk{40, 40, 40}, kGrid{225, 225, 225}, kWhite{255, 255, 255};

struct Canvas {
  std::vector<uint8_t> rgb = std::vector<uint8_t>(kWidth * kHeight * 3, 255);
  void dot(int x, int y, Rgb c) {
    if (x < 0 || y < 0 || x >= kWidth || y >= kHeight) return;
    uint8_t* p = rgb.data() + (static_cast<size_t>(y) * kWidth + x) * 3;
    p[0] = c.r, p[1] = c.g, p[2] = c.b;
  }
  void line(double x0, double y0, double x1, double y1, Rgb c, int thickness) {
    const int steps = static_cast<int>(std::max(std::fabs(x1 - x0), std::fabs(y1 - y0))) + 1;
    for (int n = 0; n <= steps; ++n) {
      const double t = static_cast<double>(n) / steps;
      const int x = static_cast<int>(std::lround(x0 + t * (x1 - x0)));
      const int y = static_cast<int>(std::lround(y0 + t * (y1 - y0)));
      for (int dy = 0; dy < thickness; ++dy) {
        for (int dx = 0; dx < thickness; ++dx) dot(x + dx, y + dy, c);
      }
    }
  }
  void text(int x, int y, const std::string& s, Rgb c, bool vertical = false) {
    detail::draw_text(rgb, kWidth, kHeight, x, y, s, c, vertical);
  }
};

// A tick step of 1, 2 or 5 × 10^k giving about `count` ticks over `span`.
double tick_step(double span, int count) {
  const double raw = span / count;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0}) {
    if (m * power >= raw) return m * power;
  }
  return 10 * power;
}

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", std::fabs(value) < 1e-12 ? 0.0 : value);
  return text;
}

}  // namespace

void write_line_plot(const std::string& path, const std::vector<PlotSeries>& series,
                     const std::string& title, const std::string& x_label,
                     const std::string& y_label) {
  if (path.size() < 4 || path.compare(path.size() - 4, 4, ".png") != 0) {
    throw Error("line plot '" + path + "': only .png is written");
  }
  if (series.empty()) throw Error("line plot '" + path + "': no series to draw");
  double x_min = INFINITY, x_max = -INFINITY, y_min = INFINITY, y_max = -INFINITY;
  for (const PlotSeries& s : series) {
    if (s.x.size() != s.y.size()) {
      throw Error("line plot '" + path + "': series '" + s.name + "' has " +
                  std::to_string(s.x.size()) + " x and " + std::to_string(s.y.size()) +
                  " y values");
    }
    for (size_t n = 0; n < s.x.size(); ++n) {
      if (!std::isfinite(s.x[n]) || !std::isfinite(s.y[n])) continue;
      x_min = std::min(x_min, s.x[n]), x_max = std::max(x_max, s.x[n]);
      y_min = std::min(y_min, s.y[n]), y_max = std::max(y_max, s.y[n]);
    }
  }
  if (!(x_min <= x_max)) throw Error("line plot '" + path + "': no finite point to draw");
  if (x_max == x_min) x_max = x_min + 1;
  const double pad = std::max((y_max - y_min) * 0.05, 1e-9);
  y_min -= pad, y_max += pad;
  const int plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  const auto px = [&](double x) { return kLeft + (x - x_min) / (x_max - x_min) * plot_w; };
  const auto py = [&](double y) { return kTop + (y_max - y) / (y_max - y_min) * plot_h; };
  Canvas canvas;
  // Grid, ticks and their values.
  const double y_step = tick_step(y_max - y_min, 6), x_step = tick_step(x_max - x_min, 8);
  for (double y = std::ceil(y_min / y_step) * y_step; y <= y_max; y += y_step) {
    canvas.line(kLeft, py(y), kLeft + plot_w, py(y), kGrid, 1);
    const std::string label = number(y);
    canvas.text(kLeft - 6 - detail::text_width(label), static_cast<int>(py(y)) - 3, label, kInk);
  }
  for (double x = std::ceil(x_min / x_step) * x_step; x <= x_max; x += x_step) {
    canvas.line(px(x), kTop, px(x), kTop + plot_h, kGrid, 1);
    const std::string label = number(x);
    canvas.text(static_cast<int>(px(x)) - detail::text_width(label) / 2, kTop + plot_h + 6, label,
                kInk);
  }
  canvas.line(kLeft, kTop, kLeft, kTop + plot_h, kInk, 1);
  canvas.line(kLeft, kTop + plot_h, kLeft + plot_w, kTop + plot_h, kInk, 1);
  // The series, then the legend over them.
  for (const PlotSeries& s : series) {
    for (size_t n = 0; n < s.x.size(); ++n) {
      if (s.markers) {
        canvas.line(px(s.x[n]) - 2, py(s.y[n]) - 2, px(s.x[n]) - 2, py(s.y[n]) - 2, s.colour, 5);
      }
      if (n > 0) canvas.line(px(s.x[n - 1]), py(s.y[n - 1]), px(s.x[n]), py(s.y[n]), s.colour, 2);
    }
  }
  int legend_width = 0;
  for (const PlotSeries& s : series)
    legend_width = std::max(legend_width, detail::text_width(s.name));
  const int lx = kLeft + plot_w - legend_width - 40, ly = kTop + 8;
  for (int y = ly - 4; y < ly + 12 * static_cast<int>(series.size()); ++y) {
    for (int x = lx - 4; x < lx + legend_width + 32; ++x) canvas.dot(x, y, kWhite);
  }
  for (size_t n = 0; n < series.size(); ++n) {
    const int y = ly + 12 * static_cast<int>(n);
    canvas.line(lx, y + 3, lx + 20, y + 3, series[n].colour, 2);
    canvas.text(lx + 26, y, series[n].name, kInk);
  }
  canvas.text(kLeft, 10, title, kInk);
  canvas.text(kLeft + plot_w / 2 - detail::text_width(x_label) / 2, kHeight - 16, x_label, kInk);
  canvas.text(12, kTop + plot_h / 2 + detail::text_width(y_label) / 2, y_label, kInk, true);
  if (!stbi_write_png(path.c_str(), kWidth, kHeight, 3, canvas.rgb.data(), kWidth * 3)) {
    throw Error("cannot write line plot '" + path + "'");
  }
}

}  // namespace maskattn
