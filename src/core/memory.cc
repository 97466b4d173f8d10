#include "maskattn/memory.h"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "maskattn/error.h"

namespace maskattn {

namespace {

// "123", "512K", "8G", "1.5T" (binary units); returns −1 if the text is not such a size.
double parse_size(const std::string& text) {
  char* end = nullptr;
  const double number = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !std::isfinite(number) || number <= 0) return -1;
  std::string suffix(end);
  while (!suffix.empty() && std::isspace(static_cast<unsigned char>(suffix.back()))) {
    suffix.pop_back();
  }
  if (suffix.empty()) return number;
  if (suffix.size() > 3) return -1;
  const char unit = static_cast<char>(std::toupper(static_cast<unsigned char>(suffix[0])));
  const std::string rest = suffix.substr(1);
  if (!(rest.empty() || rest == "B" || rest == "iB" || rest == "b")) return -1;
  switch (unit) {
    case 'K':
      return number * 1024.0;
    case 'M':
      return number * 1024.0 * 1024.0;
    case 'G':
      return number * 1024.0 * 1024.0 * 1024.0;
    case 'T':
      return number * 1024.0 * 1024.0 * 1024.0 * 1024.0;
    default:
      return -1;
  }
}

// Physical memory, lowered to the cgroup v2 limit when one is set.
int64_t machine_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  double bytes = pages > 0 && page_size > 0 ? static_cast<double>(pages) * page_size : 0x1p62;
  std::ifstream cgroup("/sys/fs/cgroup/memory.max");
  std::string text;
  if (cgroup >> text && text != "max") {
    const double limit = parse_size(text);
    if (limit > 0 && limit < bytes) bytes = limit;
  }
  return static_cast<int64_t>(std::min(bytes, 0x1p62));
}

int64_t default_limit() {
  if (const char* text = std::getenv("MASKATTN_MEMORY_LIMIT"); text != nullptr && *text != '\0') {
    const double bytes = parse_size(text);
    if (bytes <= 0) {
      throw Error(std::string("MASKATTN_MEMORY_LIMIT='") + text +
                  "' is not a size (bytes, or a number with K, M, G or T, e.g. 512M)");
    }
    return static_cast<int64_t>(std::min(bytes, 0x1p62));
  }
  return machine_memory();
}

std::atomic<int64_t> g_limit{0};  // 0 = not yet set: the default, computed on first use

}  // namespace

void set_memory_limit(int64_t bytes) {
  if (bytes < 0) {
    throw Error("set_memory_limit: " + std::to_string(bytes) + " bytes must be ≥ 0 (0 = default)");
  }
  g_limit = bytes;
}

int64_t memory_limit() {
  const int64_t limit = g_limit.load();
  if (limit > 0) return limit;
  static const int64_t fallback = default_limit();  // read once; a bad variable throws each time
  return fallback;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 6) {
    bytes /= 1024.0;
    ++unit;
  }
  char text[64];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%.0f bytes", bytes);
  } else {
    std::snprintf(text, sizeof text, "%.1f %s", bytes, units[unit]);
  }
  return text;
}

void require_memory(double bytes, const std::string& what) {
  const int64_t limit = memory_limit();
  if (bytes > static_cast<double>(limit)) {
    throw Error(what + " needs " + format_bytes(bytes) +
                " of memory, more than the memory limit of " +
                format_bytes(static_cast<double>(limit)) +
                " (the machine's memory by default; see maskattn::set_memory_limit and "
                "MASKATTN_MEMORY_LIMIT)");
  }
}

}  // namespace maskattn
