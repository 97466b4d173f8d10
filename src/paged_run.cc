#include "paged_run.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/block_skipping.h"
#include "core/element.h"
#include "core/parallel.h"
#include "kernels/fused.h"
#include "kernels/problem.h"
#include "kernels/reference.h"
#include "mask/restrict.h"
#include "maskattn/kv_format.h"
#include "validate.h"

namespace maskattn::detail {

namespace {

// The reference kernel's K or V: [B, Hkv, Lk, W] f32, each sequence's rows below its length
// decoded, zeros elsewhere.
std::vector<float> gathered(const KVPages& pages, int64_t batch, int64_t heads, int64_t k_len,
                            int64_t width, bool keys) {
  std::vector<float> out(static_cast<size_t>(batch * heads * k_len * width), 0.0f);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t g = 0; g < heads; ++g) {
      for (int64_t j = 0; j < pages.lengths[b]; ++j) {
        kv_decode_row(pages.format, keys, pages.row(keys, b, g, j), width,
                      out.data() + ((b * heads + g) * k_len + j) * width);
      }
    }
  }
  return out;
}

// The Problem of q over the pages' first q.size(0) sequences: K and V as the kernels' shape-only
// views, every row one zero row (kv_pages.h), Lk the longest sequence.
Problem paged_problem(const TensorView& q, const PagedCall& call, const KVPages& pages,
                      const std::vector<float>& zeros, const Options& options) {
  const int64_t batch = q.size(0);
  int64_t k_len = 0;
  for (int64_t b = 0; b < batch; ++b) k_len = std::max(k_len, pages.lengths[b]);
  const Dims zero_strides = {0, 0, 0, 1};
  const TensorView k(zeros.data(), q.dtype(), {batch, call.kv_heads, k_len, call.head_dim},
                     zero_strides);
  const TensorView v(zeros.data(), q.dtype(), {batch, call.kv_heads, k_len, call.value_dim},
                     zero_strides);
  Problem p = make_problem(q, k, &v, options);
  p.pages = &pages;
  return p;
}

// Resolves the mask and modifiers against p and runs the fused kernel through the pages, or the
// reference on the rows gathered below each sequence's length.
void resolve_and_run_paged(Problem& p, const Mask& placed, const ScoreMods& mods,
                           const Options& options, const MutableTensorView& out,
                           const MutableTensorView& lse) {
  resolve_and_run(p, placed, mods, options, [&](const Problem& checked) {
    if (options.kernel != Kernel::reference) {
      fused::forward(checked, out, lse, block_skipping());
      return;
    }
    const KVPages& pages = *p.pages;
    const std::vector<float> keys = gathered(pages, p.batch, p.kv_heads, p.k_len, p.head_dim, true);
    const std::vector<float> values =
        gathered(pages, p.batch, p.kv_heads, p.k_len, p.value_dim, false);
    Problem dense = checked;
    dense.pages = nullptr;
    dense.k = TensorView(keys.data(), {p.batch, p.kv_heads, p.k_len, p.head_dim});
    dense.v = TensorView(values.data(), {p.batch, p.kv_heads, p.k_len, p.value_dim});
    reference::forward(dense, out, lse);
  });
}

// Rows [first, first + count) of batch entry b of a [B, H, L] or [B, H, L, W] view, as entry 0
// of a batch of one.
TensorView entry_rows(const TensorView& t, int64_t b, int64_t first, int64_t count) {
  if (t.is_null()) return t;
  const char* base = static_cast<const char*>(t.data());
  base += (b * t.stride(0) + first * t.stride(2)) * static_cast<int64_t>(dtype_size(t.dtype()));
  Dims sizes = t.sizes();
  sizes[0] = 1;
  sizes[2] = count;
  return TensorView(base, t.dtype(), sizes, t.strides());
}
MutableTensorView entry_rows(const MutableTensorView& t, int64_t b, int64_t first, int64_t count) {
  if (t.is_null()) return t;
  const TensorView view = entry_rows(static_cast<const TensorView&>(t), b, first, count);
  return MutableTensorView(const_cast<void*>(view.data()), view.dtype(), view.sizes(),
                           view.strides());
}

// Rows [queries, Lq) of entry b: padding, written as a fully hidden row is (docs/semantics.md
// §6): O = +0, LSE the head's sink when one joins the denominators, else −inf.
void write_padding_rows(const MutableTensorView& out, const MutableTensorView& lse, int64_t b,
                        int64_t queries, const ScoreMods& mods, const Options& options) {
  const int64_t rows = out.size(2) - queries;
  const MutableTensorView o = entry_rows(out, b, queries, rows);
  for (int64_t h = 0; h < o.size(1); ++h) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t e = 0; e < o.size(3); ++e) store_float(o, o.offset({0, h, i, e}), 0.0f);
    }
  }
  if (lse.is_null()) return;
  const MutableTensorView l = entry_rows(lse, b, queries, rows);
  const bool sinks = !mods.sinks.empty() && options.count_sinks;
  for (int64_t h = 0; h < l.size(1); ++h) {
    for (int64_t i = 0; i < rows; ++i) {
      store_float(l, l.offset({0, h, i}), sinks ? mods.sinks[h] : -INFINITY);
    }
  }
}

// A tree over a ragged batch: each sequence alone (paged_run.h), after every check on the whole
// batch (`whole`, checked by the caller for its shapes) so that nothing is written before they
// pass.
void run_sequences(const TensorView& q, const PagedCall& call, Problem& whole,
                   const std::vector<float>& zeros, const Mask& placed, const ScoreMods& mods,
                   const Options& options, const MutableTensorView& out,
                   const MutableTensorView& lse) {
  resolve_and_run(whole, placed, mods, options, [](const Problem&) {});
  const int64_t batch = q.size(0), heads = q.size(1);
  std::vector<int64_t> cost(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t lq = call.queries[b], lk = call.pages.lengths[b];
    cost[b] = heads * (lq * lk + lq + lk) + 1;  // varlen's measure (varlen/plan.h)
  }
  const CostPlan plan = plan_by_cost(cost, options.threads);
  run_cost_plan(plan, options.threads, [&](int64_t b, int threads) {
    const int64_t queries = call.queries[b], length = call.pages.lengths[b];
    write_padding_rows(out, lse, b, queries, mods, options);
    if (queries == 0) return;
    KVPages pages = call.pages;
    pages.table += b * pages.table_stride;
    pages.lengths += b;
    Options own = options;
    own.threads = threads;
    own.check_finite = false;  // checked on the whole batch
    own.dropout.batch_offset += static_cast<uint64_t>(b);
    const TensorView q_b = entry_rows(q, b, 0, queries);
    Problem p = paged_problem(q_b, call, pages, zeros, own);
    resolve_and_run_paged(p, restrict_mask(placed, b, queries, length),
                          restrict_mods(mods, b, queries, length), own,
                          entry_rows(out, b, 0, queries), entry_rows(lse, b, 0, queries));
  });
}

}  // namespace

void run_paged(const TensorView& q, PagedCall call, const Mask& placed, const ScoreMods& mods,
               const Options& options, const MutableTensorView& out, const MutableTensorView& lse) {
  const std::vector<float> zeros(static_cast<size_t>(std::max(call.head_dim, call.value_dim)),
                                 0.0f);
  call.pages.zero_row = reinterpret_cast<const uint8_t*>(zeros.data());
  Problem p = paged_problem(q, call, call.pages, zeros, options);
  require_result(out, {p.batch, p.q_heads, p.q_len, p.value_dim}, q.dtype(), "out",
                 "q " + q.shape_string() + " and " + call.values);
  require_disjoint(out, "out", q, "q");
  for (const auto& [input, name] : call.inputs) require_disjoint(out, "out", input, name);
  if (!lse.is_null()) {
    require_output(lse, {p.batch, p.q_heads, p.q_len}, DType::f32, "lse", "q " + q.shape_string());
  }
  if (call.per_sequence) {
    run_sequences(q, call, p, zeros, placed, mods, options, out, lse);
  } else {
    resolve_and_run_paged(p, placed, mods, options, out, lse);
  }
}

}  // namespace maskattn::detail
