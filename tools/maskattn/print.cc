#include "print.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>

namespace maskattn::cli {

namespace {

std::string format_number(double value, int decimals) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  if (value == 0.0) value = 0.0;  // print -0 as 0
  std::string text = fmt::format("{:.{}f}", value, decimals);
  if (text.find_first_not_of("-0.") == std::string::npos && text[0] == '-') text.erase(0, 1);
  return text;
}

}  // namespace

void print_matrix(const std::string& title, const std::vector<double>& values, int64_t rows,
                  int64_t cols, int decimals) {
  std::vector<std::string> cells(values.size());
  size_t width = 1;
  for (size_t n = 0; n < values.size(); ++n) {
    cells[n] = format_number(values[n], decimals);
    width = std::max(width, cells[n].size());
  }
  fmt::print("{} =\n", title);
  for (int64_t r = 0; r < rows; ++r) {
    fmt::print("{}", r == 0 ? "  [[" : "   [");
    for (int64_t c = 0; c < cols; ++c) {
      fmt::print("{:>{}}{}", cells[r * cols + c], width, c + 1 < cols ? ", " : "");
    }
    fmt::print("{}\n", r + 1 < rows ? "]," : "]]");
  }
  if (rows == 0) fmt::print("  []\n");
}

void print_grid(const std::vector<uint8_t>& allowed, int64_t rows, int64_t cols,
                const std::vector<std::string>& row_labels, const std::string& columns) {
  size_t label_width = 0;
  for (const std::string& label : row_labels) label_width = std::max(label_width, label.size());
  const int index_width = static_cast<int>(std::to_string(std::max<int64_t>(rows - 1, 0)).size());
  const std::string margin(index_width + 2 + (label_width ? label_width + 1 : 0), ' ');
  // Column indices, one digit per cell: a tens row when there are more than ten keys.
  if (cols > 10) {
    fmt::print("{}", margin);
    for (int64_t j = 0; j < cols; ++j) {
      fmt::print("{}", j >= 10 ? std::to_string((j / 10) % 10) + " " : "  ");
    }
    fmt::print("\n");
  }
  fmt::print("{}", margin);
  for (int64_t j = 0; j < cols; ++j) fmt::print("{} ", j % 10);
  fmt::print("  {}\n", columns);
  for (int64_t i = 0; i < rows; ++i) {
    fmt::print("{:>{}}  ", i, index_width);
    if (label_width) {
      fmt::print("{:<{}} ", i < static_cast<int64_t>(row_labels.size()) ? row_labels[i] : "",
                 label_width);
    }
    int64_t count = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const bool on = allowed[i * cols + j] != 0;
      count += on;
      fmt::print("{} ", on ? "█" : "·");
    }
    fmt::print("  {}\n", count);
  }
}

}  // namespace maskattn::cli
