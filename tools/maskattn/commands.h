// The maskattn subcommands. Each returns the process exit code and throws maskattn::Error for
// invalid input (main() prints it as one line on stderr).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace maskattn::cli {

struct AttendArgs {
  std::string q, k, v, out;
  std::vector<std::string> masks;
  std::optional<double> scale;
  std::string lse, weights;  // empty = not written
  std::string dtype;         // "" = the files' dtype
  int threads = 0;
  std::string kernel = "auto";
  int repeat = 0;  // > 0: one warm-up, then `repeat` timed runs, timing printed on stderr
};
int run_attend(const AttendArgs& args);

int run_example();

struct MaskArgs {
  std::vector<std::string> specs;
  int64_t q_len = 0, k_len = 0;
  int64_t batch = 0, head = 0;
};
int run_mask(const MaskArgs& args);

int run_demo();

}  // namespace maskattn::cli
