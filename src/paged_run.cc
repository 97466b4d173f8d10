#include "paged_run.h"

#include <algorithm>
#include <vector>

#include "core/block_skipping.h"
#include "kernels/fused.h"
#include "kernels/problem.h"
#include "kernels/reference.h"
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

}  // namespace

void run_paged(const TensorView& q, PagedCall call, const Mask& placed, const ScoreMods& mods,
               const Options& options, const MutableTensorView& out, const MutableTensorView& lse) {
  const int64_t batch = q.size(0);
  int64_t k_len = 0;
  for (int64_t b = 0; b < batch; ++b) k_len = std::max(k_len, call.pages.lengths[b]);
  // K and V as the kernels' shape-only views: every row one zero row (kv_pages.h).
  const std::vector<float> zeros(static_cast<size_t>(std::max(call.head_dim, call.value_dim)),
                                 0.0f);
  const Dims zero_strides = {0, 0, 0, 1};
  const TensorView k(zeros.data(), q.dtype(), {batch, call.kv_heads, k_len, call.head_dim},
                     zero_strides);
  const TensorView v(zeros.data(), q.dtype(), {batch, call.kv_heads, k_len, call.value_dim},
                     zero_strides);
  Problem p = make_problem(q, k, &v, options);
  require_result(out, {p.batch, p.q_heads, p.q_len, p.value_dim}, q.dtype(), "out",
                 "q " + q.shape_string() + " and " + call.values);
  require_disjoint(out, "out", q, "q");
  for (const auto& [input, name] : call.inputs) require_disjoint(out, "out", input, name);
  if (!lse.is_null()) {
    require_output(lse, {p.batch, p.q_heads, p.q_len}, DType::f32, "lse", "q " + q.shape_string());
  }
  call.pages.zero_row = reinterpret_cast<const uint8_t*>(zeros.data());
  p.pages = &call.pages;
  resolve_and_run(p, placed, mods, options, [&](const Problem& checked) {
    if (options.kernel != Kernel::reference) {
      fused::forward(checked, out, lse, block_skipping());
      return;
    }
    const std::vector<float> keys =
        gathered(call.pages, p.batch, p.kv_heads, k_len, p.head_dim, true);
    const std::vector<float> values =
        gathered(call.pages, p.batch, p.kv_heads, k_len, p.value_dim, false);
    Problem dense = checked;
    dense.pages = nullptr;
    dense.k = TensorView(keys.data(), {p.batch, p.kv_heads, k_len, p.head_dim});
    dense.v = TensorView(values.data(), {p.batch, p.kv_heads, k_len, p.value_dim});
    reference::forward(dense, out, lse);
  });
}

}  // namespace maskattn::detail
