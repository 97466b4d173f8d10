// What both attention_paged() entry points do once their pages are described (paged_attention.cc
// for a PagedKVCache, paged_tensors.cc for caller-owned pools): the Problem with shape-only k and
// v views whose rows are all one zero row (kernels/kv_pages.h: code unaware of pages reads zeros,
// never the pool), the output checks, and the run — the fused kernel through the pages, or
// Kernel::reference on the rows decoded below each sequence's length into dense f32 tensors (so
// whatever a pool holds past a sequence's end never reaches the oracle).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kernels/kv_pages.h"
#include "maskattn/attention.h"

namespace maskattn::detail {

struct PagedCall {
  KVPages pages;  // every field but zero_row, which the run provides
  int64_t kv_heads = 0, head_dim = 0, value_dim = 0;
  std::string values;  // how messages name where Dv comes from, e.g. "values [4,16,2,8]"
  // Inputs besides q that `out` must not overlap, with their names.
  std::vector<std::pair<TensorView, const char*>> inputs;
};

// `placed` is the caller's mask with each sequence's queries placed at its own end.
void run_paged(const TensorView& q, PagedCall call, const Mask& placed, const ScoreMods& mods,
               const Options& options, const MutableTensorView& out, const MutableTensorView& lse);

}  // namespace maskattn::detail
