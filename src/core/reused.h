// Scratch vectors that outlive a call, one per thread: why repeated calls on small problems do not
// pay for fresh allocations.
#pragma once

#include <vector>

namespace maskattn::detail {

// A vector of the calling thread kept across calls: a fresh allocation of this size would be a
// fresh mmap and page faults (11–16 µs per 4 KiB page on the project VM). A reference to it is
// what parallel regions must capture: naming a thread_local inside them would reach each worker's
// own, empty, instance. `Owner` and `kSlot` tell apart the buffers of different users.
template <typename T, typename Owner, int kSlot = 0>
std::vector<T>& reused() {
  thread_local std::vector<T> storage;
  return storage;
}

}  // namespace maskattn::detail
