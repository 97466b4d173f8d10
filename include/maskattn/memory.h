// The memory cap: the most memory one call may allocate for its working buffers and for the
// arrays it returns. A request above it fails with maskattn::Error, naming what needed the memory,
// before anything is allocated, instead of ending in std::bad_alloc or the kernel's OOM killer.
//
// Default: the machine's physical memory, or the cgroup's memory.max when that is lower. The
// environment variable MASKATTN_MEMORY_LIMIT (bytes, or with a K/M/G/T suffix, e.g. "512M"), read
// on first use, replaces the default; set_memory_limit() replaces both.
#pragma once

#include <cstdint>
#include <string>

namespace maskattn {

// bytes > 0 sets the cap; 0 restores the default. Throws Error for a negative value.
void set_memory_limit(int64_t bytes);
int64_t memory_limit();

// "1.5 GiB", "512 MiB", "12 KiB", "100 bytes": how the cap and requests are shown in messages.
std::string format_bytes(double bytes);

// Throws Error "<what> needs <X> of memory, more than the memory limit of <Y> (…)" when `bytes`
// exceeds the cap. `bytes` is a double so that products of sizes cannot overflow on the way.
void require_memory(double bytes, const std::string& what);

}  // namespace maskattn
