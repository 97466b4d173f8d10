#include "gpt_progress.h"

#include <fmt/core.h>
#include <unistd.h>

#include <cstdio>

namespace maskattn::cli {

Progress::Progress(int64_t steps, int64_t first_step)
    : steps_(steps),
      first_step_(first_step),
      terminal_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()) {}

void Progress::update(int64_t step, double loss, int64_t tokens_per_step) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done = step - first_step_;
  const double per_step = done > 0 ? seconds / static_cast<double>(done) : 0.0;
  const double tokens_per_second =
      per_step > 0 ? static_cast<double>(tokens_per_step) / per_step : 0.0;
  const auto eta = static_cast<int64_t>(per_step * static_cast<double>(steps_ - step) + 0.5);
  const std::string line = fmt::format("step {}/{}  loss {:.4f}  {:.0f} tok/s  ETA {}:{:02d}", step,
                                       steps_, loss, tokens_per_second, eta / 60, eta % 60);
  if (terminal_) {
    std::fprintf(stderr, "\r%-70s", line.c_str());
    std::fflush(stderr);
    return;
  }
  const int64_t tenth = std::max<int64_t>(steps_ / 10, 1);
  if (step % tenth == 0 || step == steps_) {
    if (step != last_printed_) std::fprintf(stderr, "%s\n", line.c_str());
    last_printed_ = step;
  }
}

void Progress::finish() {
  if (terminal_) std::fprintf(stderr, "\n");
}

}  // namespace maskattn::cli
