// Terminal output shared by the CLI commands: matrices with fixed decimals, mask grids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace maskattn::cli {

// "title =" then the matrix, numpy style, `decimals` digits after the point; ±inf as "-inf".
void print_matrix(const std::string& title, const std::vector<double>& values, int64_t rows,
                  int64_t cols, int decimals = 3);

// The allowed/hidden grid of one (batch, head): █ allowed, · hidden, row and column indices,
// optional row labels (tokens), and the number of allowed keys per row. `columns` names the
// columns in the header ("keys"; "key blocks" for a block-sparse layout).
void print_grid(const std::vector<uint8_t>& allowed, int64_t rows, int64_t cols,
                const std::vector<std::string>& row_labels = {},
                const std::string& columns = "keys");

}  // namespace maskattn::cli
