#include "core/block_skipping.h"

namespace maskattn::detail {

namespace {
thread_local bool skipping_enabled = true;
}  // namespace

bool block_skipping() {
  return skipping_enabled;
}

ScopedBlockSkipping::ScopedBlockSkipping(bool enabled) : previous_(skipping_enabled) {
  skipping_enabled = enabled;
}

ScopedBlockSkipping::~ScopedBlockSkipping() {
  skipping_enabled = previous_;
}

}  // namespace maskattn::detail
