#include "test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace maskattn::test {

std::vector<float> random_values(size_t count, uint64_t seed, float lo, float hi) {
  std::vector<float> values(count);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& value : values) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const double unit = static_cast<double>(state >> 11) * 0x1p-53;
    value = lo + static_cast<float>(unit) * (hi - lo);
  }
  return values;
}

std::vector<std::string> grid(const Mask& mask, const MaskShape& shape, int64_t b, int64_t h) {
  const Array<uint8_t> allowed = allowed_pairs(mask, shape);
  std::vector<std::string> rows;
  for (int64_t i = 0; i < shape.q_len; ++i) {
    std::string row;
    for (int64_t j = 0; j < shape.k_len; ++j) {
      const int64_t n = ((b * shape.q_heads + h) * shape.q_len + i) * shape.k_len + j;
      row += allowed.values()[n] ? '1' : '.';
    }
    rows.push_back(row);
  }
  return rows;
}

TempDir::TempDir() {
  std::string pattern = "/tmp/maskattn_test_XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  root_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(root_, ignored);
}

CliResult run_cli(const std::string& arguments) {
  TempDir dir;
  const std::string command = std::string("'") + MASKATTN_CLI + "' " + arguments + " >'" +
                              dir.path("out") + "' 2>'" + dir.path("err") + "'";
  const int status = std::system(command.c_str());
  CliResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  const auto slurp = [](const std::string& path) {
    std::ifstream file(path, std::ios::binary);
    std::stringstream text;
    text << file.rdbuf();
    return text.str();
  };
  result.out = slurp(dir.path("out"));
  result.err = slurp(dir.path("err"));
  return result;
}

}  // namespace maskattn::test
