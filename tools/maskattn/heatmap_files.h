// What the CLI's heatmap options share: token labels from a file.
#pragma once

#include <cstdint>
#include <string>

#include "maskattn/heatmap.h"

namespace maskattn::cli {

// --tokens FILE: whitespace-separated tokens, one per key. Queries take the tokens of the keys
// at their positions, aligned bottom-right (the last Lq keys) unless `top_left`. Without a file,
// indices. Throws Error when the file cannot be read or its token count is not Lk.
HeatmapLabels token_labels(const std::string& path, int64_t q_len, int64_t k_len, bool top_left);

}  // namespace maskattn::cli
