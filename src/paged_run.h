// What both attention_paged() entry points do once their pages are described (paged_attention.cc
// for a PagedKVCache, paged_tensors.cc for caller-owned pools): the Problem with shape-only k and
// v views whose rows are all one zero row (kernels/kv_pages.h: code unaware of pages reads zeros,
// never the pool), the output checks, and the run — the fused kernel through the pages, or
// Kernel::reference on the rows decoded below each sequence's length into dense f32 tensors (so
// whatever a pool holds past a sequence's end never reaches the oracle).
//
// A draft tree over a ragged batch (docs/semantics.md §18) runs one sequence at a time: each
// sequence's draft is its own last T positions, which one call cannot place (a tree sits in the
// call's last rows, §3). See run_paged.
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
  std::vector<int64_t> queries;  // [B] each sequence's query count
  bool per_sequence = false;     // tree_per_sequence() (validate.h) said so
};

// `placed` is the caller's mask with each sequence's queries placed at its own end. With
// call.per_sequence, sequence b runs as attention_paged() on it alone would: q's rows
// [0, queries[b]) of entry b against its pages, `placed` and `mods` restricted to entry b
// (mask/restrict.h), Dropout::batch_offset + b; its rows past queries[b] are written as a fully
// hidden row's (O = 0, LSE −inf or the sink). Every check runs on the whole batch first. The
// sequences are planned over the threads as varlen's are (core/parallel.h, plan_by_cost): a
// call's bits do not depend on its thread count, so the plan never changes a result.
void run_paged(const TensorView& q, PagedCall call, const Mask& placed, const ScoreMods& mods,
               const Options& options, const MutableTensorView& out, const MutableTensorView& lse);

}  // namespace maskattn::detail
