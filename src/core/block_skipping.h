// The fused kernels' block-skipping switch, for tests and fuzzers. Off, the kernels visit every
// tile with the element mask (no block skipped, no mask-free tile, no hidden lane block of a
// partial tile skipped): the results must be the same
// bits, only the time changes, which is what the tests check. It is a debugging aid, not a setting
// a user tunes, so it is not a field of the public Options.
#pragma once

namespace maskattn::detail {

// Whether attention() and attention_backward() called on this thread skip what the block map
// allows them to (true unless a ScopedBlockSkipping says otherwise). Read on the calling thread
// before the kernels start their own threads.
bool block_skipping();

// Sets the switch on this thread for the scope's lifetime, then restores it.
class ScopedBlockSkipping {
 public:
  explicit ScopedBlockSkipping(bool enabled);
  ~ScopedBlockSkipping();
  ScopedBlockSkipping(const ScopedBlockSkipping&) = delete;
  ScopedBlockSkipping& operator=(const ScopedBlockSkipping&) = delete;

 private:
  bool previous_;
};

}  // namespace maskattn::detail
