#include "heatmap_files.h"

#include <fstream>
#include <vector>

#include "maskattn/error.h"

namespace maskattn::cli {

HeatmapLabels token_labels(const std::string& path, int64_t q_len, int64_t k_len, bool top_left) {
  HeatmapLabels labels;
  if (path.empty()) return labels;
  std::ifstream file(path);
  if (!file) throw Error("--tokens: cannot open '" + path + "'");
  std::vector<std::string> tokens;
  for (std::string token; file >> token;) tokens.push_back(token);
  if (static_cast<int64_t>(tokens.size()) != k_len) {
    throw Error("--tokens " + path + " has " + std::to_string(tokens.size()) +
                " tokens but there are Lk=" + std::to_string(k_len) + " keys (one token per key)");
  }
  labels.cols = tokens;
  const int64_t shift = top_left ? 0 : k_len - q_len;  // query i sits at key position i + shift
  for (int64_t i = 0; i < q_len; ++i) {
    const int64_t position = i + shift;
    std::string label = "q";  // a query with no key at its position (more queries than keys)
    label += std::to_string(i);
    labels.rows.push_back(position >= 0 && position < k_len ? tokens[position] : label);
  }
  return labels;
}

}  // namespace maskattn::cli
