// Heatmaps: the PNG decodes to the layout's size with the expected colours at known cells (hidden
// cells grey and hatched, never the colour of weight 0), the SVG names every cell, and the CLI
// writes both from masks and from attention weights, with token labels.
#include <algorithm>
#include <fstream>
#include <sstream>

#include "test_util.h"
#include "viz/heatmap_render.h"
#include "viz/stb.h"

namespace maskattn {
namespace {

struct Decoded {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
  Rgb at(int x, int y) const {
    const uint8_t* p = rgb.data() + (static_cast<size_t>(y) * width + x) * 3;
    return {p[0], p[1], p[2]};
  }
};

Decoded decode_png(const std::string& path) {
  Decoded image;
  int channels = 0;
  unsigned char* pixels = stbi_load(path.c_str(), &image.width, &image.height, &channels, 3);
  EXPECT_NE(pixels, nullptr) << path;
  if (pixels != nullptr) {
    image.rgb.assign(pixels, pixels + static_cast<size_t>(image.width) * image.height * 3);
    stbi_image_free(pixels);
  }
  return image;
}

std::string read_text(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// Panel 0: a 3×4 mask; panel 1: weights with a 0 and a 1 among allowed cells.
std::vector<HeatmapPanel> sample_panels() {
  HeatmapPanel mask;
  mask.title = "mask";
  mask.rows = 3;
  mask.cols = 4;
  mask.allowed = {1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0};
  HeatmapPanel weights = mask;
  weights.title = "weights";
  weights.weights = {1.0f, 0, 0, 0, 0.0f, 1.0f, 0, 0, 0.25f, 0.25f, 0.5f, 0};
  return {mask, weights};
}

TEST(Heatmap, PngHasTheLayoutsSizeAndColoursAtKnownCells) {
  test::TempDir dir;
  const std::vector<HeatmapPanel> panels = sample_panels();
  const HeatmapLabels labels{{"I", "love", "dog"}, {"<bos>", "I", "love", "dog"}};
  write_heatmap(dir.path("h.png"), panels, labels);
  const Decoded png = decode_png(dir.path("h.png"));
  const detail::HeatmapLayout layout = detail::heatmap_layout(panels, labels);
  ASSERT_EQ(png.width, layout.width);
  ASSERT_EQ(png.height, layout.height);
  ASSERT_EQ(layout.panels.size(), 2u);
  // Mask panel: allowed blue, hidden grey.
  EXPECT_EQ(png.at(layout.cell_x(0, 0), layout.cell_y(0, 0)), kAllowedColour);
  EXPECT_EQ(png.at(layout.cell_x(0, 1), layout.cell_y(0, 0)), kHiddenColour);
  EXPECT_EQ(png.at(layout.cell_x(0, 3), layout.cell_y(0, 2)), kHiddenColour);
  // Weights panel: weight 1, weight 0 (allowed) and hidden are three different colours.
  const Rgb one = png.at(layout.cell_x(1, 0), layout.cell_y(1, 0));
  const Rgb zero = png.at(layout.cell_x(1, 0), layout.cell_y(1, 1));
  const Rgb hidden = png.at(layout.cell_x(1, 1), layout.cell_y(1, 0));
  EXPECT_EQ(one, weight_colour(1.0f));
  EXPECT_EQ(zero, weight_colour(0.0f));
  EXPECT_EQ(hidden, kHiddenColour);
  EXPECT_NE(zero, hidden);
  EXPECT_EQ(png.at(layout.cell_x(1, 2), layout.cell_y(1, 2)), weight_colour(0.5f));
  // Hidden cells are hatched: some pixel of the hidden cell has the hatch colour.
  bool hatched = false;
  for (int d = -layout.cell / 2; d < layout.cell / 2; ++d) {
    hatched |= png.at(layout.cell_x(0, 3) + d, layout.cell_y(0, 0)) == kHatchColour;
  }
  EXPECT_TRUE(hatched);
  // The render matches the file pixel for pixel.
  EXPECT_EQ(detail::render_heatmap(panels, labels).rgb, png.rgb);
}

TEST(Heatmap, SvgNamesEveryCellAndLabel) {
  const std::string svg =
      heatmap_svg(sample_panels(), {{"I", "love", "dog"}, {"<bos>", "I", "love", "dog"}});
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_EQ(count(svg, "<title>"), 24u);                               // 2 panels × 12 cells
  EXPECT_EQ(count(svg, "fill=\"url(#hidden)\"><title>"), 12u);         // 6 hidden cells per panel
  EXPECT_NE(svg.find("I → &lt;bos&gt;: allowed"), std::string::npos);  // escaped token labels
  EXPECT_NE(svg.find("love → &lt;bos&gt;: 0.0000</title>"), std::string::npos);  // allowed, 0
  EXPECT_NE(svg.find("love → dog: hidden</title>"), std::string::npos);
  EXPECT_NE(svg.find(">hidden</text>"), std::string::npos);
}

TEST(Heatmap, ColourScaleIsMonotoneAndClamped) {
  EXPECT_EQ(weight_colour(-1.0f), weight_colour(0.0f));
  EXPECT_EQ(weight_colour(NAN), weight_colour(0.0f));
  EXPECT_EQ(weight_colour(2.0f), weight_colour(1.0f));
  for (int k = 0; k < 100; ++k) {
    EXPECT_GE(weight_colour(k / 100.0f).r, weight_colour((k + 1) / 100.0f).r);
  }
}

TEST(Heatmap, Errors) {
  test::TempDir dir;
  EXPECT_MASKATTN_ERROR(write_heatmap(dir.path("h.jpg"), sample_panels()),
                        "must end in .png or .svg");
  EXPECT_MASKATTN_ERROR(write_heatmap(dir.path("h.png"), {}), "heatmap: no panels to draw");
  HeatmapPanel broken;
  broken.rows = 2;
  broken.cols = 2;
  broken.allowed = {1, 1, 1};
  EXPECT_MASKATTN_ERROR(write_heatmap(dir.path("h.svg"), {broken}), "2x2 cells has 3 allowed");
}

TEST(CliHeatmap, MaskAndAttendWriteTheirHeatmaps) {
  test::TempDir dir;
  {
    std::ofstream tokens(dir.path("t.txt"));
    tokens << "<bos> I love dog\n";
  }
  const test::CliResult mask =
      test::run_cli("mask causal --lq 3 --lk 4 --png " + dir.path("m.png") + " --svg " +
                    dir.path("m.svg") + " --tokens " + dir.path("t.txt"));
  ASSERT_EQ(mask.exit_code, 0) << mask.err;
  const Decoded png = decode_png(dir.path("m.png"));
  HeatmapPanel panel;
  panel.title = "b=0 h=0";
  panel.rows = 3;
  panel.cols = 4;
  panel.allowed = allowed_pairs(Mask().causal(), {1, 1, 3, 4}).values();
  const HeatmapLabels labels{{"I", "love", "dog"}, {"<bos>", "I", "love", "dog"}};
  const detail::HeatmapLayout layout = detail::heatmap_layout({panel}, labels);
  EXPECT_EQ(png.width, layout.width);
  EXPECT_EQ(png.height, layout.height);
  EXPECT_EQ(png.at(layout.cell_x(0, 1), layout.cell_y(0, 0)), kAllowedColour);  // I → I
  EXPECT_EQ(png.at(layout.cell_x(0, 2), layout.cell_y(0, 0)), kHiddenColour);   // I → love
  EXPECT_NE(read_text(dir.path("m.svg")).find("dog → &lt;bos&gt;: allowed"), std::string::npos);

  write_npy(dir.path("q.npy"), NpyArray::from_floats(test::random_values(2 * 4 * 8, 3), {2, 4, 8}));
  const std::string q = dir.path("q.npy");
  const test::CliResult attend = test::run_cli(
      "attend --q " + q + " --k " + q + " --v " + q + " --out " + dir.path("o.npy") +
      " --mask causal --heatmap " + dir.path("a.svg") + " --tokens " + dir.path("t.txt"));
  ASSERT_EQ(attend.exit_code, 0) << attend.err;
  const std::string svg = read_text(dir.path("a.svg"));
  EXPECT_EQ(count(svg, "<title>"), 32u);  // B=2 panels × 16 cells
  EXPECT_NE(svg.find(">b=1 h=0</text>"), std::string::npos);
  EXPECT_NE(svg.find("&lt;bos&gt; → &lt;bos&gt;: 1.0000"), std::string::npos);
  const test::CliResult wrong = test::run_cli("mask causal --lq 3 --lk 5 --png " +
                                              dir.path("x.png") + " --tokens " + dir.path("t.txt"));
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_NE(wrong.err.find("has 4 tokens but there are Lk=5 keys"), std::string::npos) << wrong.err;
}

// Global tokens and a per-head block-sparse layout: one panel per head, each cell drawn as the mask
// allows it (a global key's column is allowed in every row, the layout's hidden blocks hatched).
TEST(CliHeatmap, MaskDrawsGlobalTokensAndBlockSparseLayoutsPerHead) {
  test::TempDir dir;
  write_npy(dir.path("g.npy"), NpyArray::from_int64({0, 0, 0, 1, 0, 0}, {6}));
  // Head 0 sees every block; head 1 hides the first key block from the last query block.
  const std::vector<uint8_t> blocks = {1, 1, 1, 1, 1, 1, 1, 1, 1,   // head 0
                                       1, 1, 1, 1, 1, 1, 0, 1, 1};  // head 1
  write_npy(dir.path("l.npy"), NpyArray::from_bools(blocks, {2, 3, 3}));
  const std::string specs =
      "causal global:" + dir.path("g.npy") + " block-sparse:2:2:" + dir.path("l.npy");
  const test::CliResult result = test::run_cli("mask " + specs + " --lq 6 --lk 6 --png " +
                                               dir.path("m.png") + " --svg " + dir.path("m.svg"));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  Mask mask = Mask().causal().global_tokens(Array<int64_t>({6}, {0, 0, 0, 1, 0, 0}));
  mask.block_sparse(Array<uint8_t>({2, 3, 3}, blocks), 2, 2);
  const Array<uint8_t> allowed = allowed_pairs(mask, {1, 2, 6, 6});
  std::vector<HeatmapPanel> panels(2);
  size_t hidden = 0;
  for (int64_t h = 0; h < 2; ++h) {
    panels[h].title = "b=0 h=" + std::to_string(h);
    panels[h].rows = panels[h].cols = 6;
    panels[h].allowed.assign(allowed.values().begin() + h * 36,
                             allowed.values().begin() + (h + 1) * 36);
    hidden += std::count(panels[h].allowed.begin(), panels[h].allowed.end(), uint8_t{0});
  }
  const std::string svg = read_text(dir.path("m.svg"));
  EXPECT_EQ(count(svg, "<title>"), 72u);  // 2 panels × 36 cells
  EXPECT_EQ(count(svg, "fill=\"url(#hidden)\"><title>"), hidden);
  EXPECT_NE(svg.find(">b=0 h=1</text>"), std::string::npos);
  EXPECT_NE(svg.find("0 → 3: allowed</title>"), std::string::npos);  // the later global key
  EXPECT_NE(svg.find("3 → 5: allowed</title>"), std::string::npos);  // the global query
  EXPECT_NE(svg.find("0 → 4: hidden</title>"), std::string::npos);   // causal still applies
  const Decoded png = decode_png(dir.path("m.png"));
  const detail::HeatmapLayout layout = detail::heatmap_layout(panels, {});
  ASSERT_EQ(png.width, layout.width);
  ASSERT_EQ(png.height, layout.height);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 6; ++i) {
      for (int64_t j = 0; j < 6; ++j) {
        EXPECT_EQ(png.at(layout.cell_x(static_cast<size_t>(h), j),
                         layout.cell_y(static_cast<size_t>(h), i)),
                  panels[h].allowed[i * 6 + j] ? kAllowedColour : kHiddenColour)
            << "h=" << h << " i=" << i << " j=" << j;
      }
    }
  }
  // Head 1, query 4 → key 1: hidden by the layout although causal allows it.
  EXPECT_EQ(panels[1].allowed[4 * 6 + 1], 0);
  EXPECT_EQ(panels[0].allowed[4 * 6 + 1], 1);
}

}  // namespace
}  // namespace maskattn
