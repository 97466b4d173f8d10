// Helpers shared by the test files: deterministic random data, mask grids as strings, error
// assertions, and running the CLI.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "maskattn/maskattn.h"

namespace maskattn::test {

// Uniform values in [lo, hi), reproducible from the seed.
std::vector<float> random_values(size_t count, uint64_t seed, float lo = -1.0f, float hi = 1.0f);

// The allowed grid of one (batch, head) as rows of '1' (allowed) and '.' (hidden), e.g.
// {"1...", "11..", "111.", "1111"} for causal with Lq = Lk = 4.
std::vector<std::string> grid(const Mask& mask, const MaskShape& shape, int64_t b = 0,
                              int64_t h = 0);

// Runs `statement`, expects maskattn::Error whose message contains every substring.
#define EXPECT_MASKATTN_ERROR(statement, ...)                                  \
  do {                                                                         \
    try {                                                                      \
      statement;                                                               \
      ADD_FAILURE() << "expected maskattn::Error from: " #statement;           \
    } catch (const ::maskattn::Error& error_) {                                \
      for (const std::string& part_ : std::vector<std::string>{__VA_ARGS__}) { \
        EXPECT_NE(std::string(error_.what()).find(part_), std::string::npos)   \
            << "message: " << error_.what() << "\nmissing: " << part_;         \
      }                                                                        \
    }                                                                          \
  } while (0)

// A fresh directory under /tmp, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path(const std::string& name) const { return root_ + "/" + name; }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};
// Runs the maskattn binary with `arguments` (already shell-quoted where needed).
CliResult run_cli(const std::string& arguments);

}  // namespace maskattn::test
