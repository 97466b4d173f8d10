// The fused backward's driver: converts what needs converting, precomputes D_i = Σ dO_i∘O_i per
// row, picks the product unit (product_unit.h: the forward's, or f32 when that one has no backward
// products) and lets it pack what it reads once per call, plans work items that own key tiles,
// runs them, and sums the per-chunk dQ partials.
//
// Work items. An item is (b, kv head, chunk): the key tiles t with t % chunks == chunk, dealt
// round-robin so that a causal mask's cheap late tiles and expensive early ones mix. The item
// owns dK and dV of its tiles; dQ rows get one partial per chunk, summed in chunk order at the
// end. The number of chunks depends on the shapes only (enough items for kTargetItems threads),
// never on the thread count, so results are bitwise identical for any number of threads. With
// dbias, items that would add into the same bias element (a bias broadcast over batch, heads or
// keys) are merged into one, which keeps that sum in a fixed order too.
#include "kernels/fused_backward.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/element.h"
#include "core/parallel.h"
#include "core/reused.h"
#include "kernels/fused_backward_block.h"
#include "kernels/fused_block.h"
#include "kernels/product_unit.h"
#include "kernels/table_gradients.h"
#include "maskattn/cpu.h"
#include "maskattn/memory.h"

namespace maskattn::detail::fused {

namespace {

constexpr int64_t T = kBackwardTile;
constexpr int64_t kTargetItems = 16;  // split key tiles into chunks until this many items exist
// ... but keep the per-chunk dQ partials within this many bytes (beyond one chunk's): at long
// lengths one partial is already as large as dQ, and more items would not repay their memory.
constexpr double kDqPartialBudget = 64.0 * (1 << 20);

struct Backward;  // tag of this driver's reused() buffers

int thread_count(const Problem& p) {
  return p.threads > 0 ? p.threads : omp_get_max_threads();
}

// `t` as f32 rows `width` ≥ W floats wide that may be read in full (the kernel's products read
// whole vectors): in place when t is f32 with contiguous rows and width == W, else converted
// into `buffer` with zero-filled tails.
bool rows_in_place(const TensorView& t, int64_t width) {
  return t.dtype() == DType::f32 && t.stride(3) == 1 && width == t.size(3);
}

F32Rows f32_rows(const TensorView& t, int64_t width, std::vector<float>& buffer, int threads) {
  if (rows_in_place(t, width)) {
    return {static_cast<const float*>(t.data()), t.stride(0), t.stride(1), t.stride(2)};
  }
  const int64_t rows = t.size(0) * t.size(1) * t.size(2);
  buffer.resize(rows * width);
  convert_to_f32(t, buffer.data(), threads, width);
  return {buffer.data(), t.size(1) * t.size(2) * width, t.size(2) * width, width};
}

int64_t padded(int64_t width) {
  return (width + 15) / 16 * 16;
}

// Writes `values` (row-major, the view's shape) into a view of any strides.
void store_all(const MutableTensorView& t, const float* values) {
  const int64_t count = t.numel();
  for (int64_t n = 0; n < count; ++n) {
    int64_t rest = n, offset = 0;
    for (int axis = t.rank() - 1; axis >= 0; --axis) {
      offset += (rest % t.size(axis)) * t.stride(axis);
      rest /= t.size(axis);
    }
    store_float(t, offset, values[n]);
  }
}

// The most chunks the dQ partials' budget allows: shapes only, so never the thread count.
int64_t most_chunks(const Problem& p) {
  const double partial = 4.0 * p.batch * p.q_heads * p.q_len * padded(p.head_dim);
  return std::max<int64_t>(1, static_cast<int64_t>(kDqPartialBudget / std::max(partial, 1.0)));
}

int64_t table_gradient_elements(const Gradients& grads) {
  int64_t elements = 0;
  for (const MutableTensorView& view : grads.dtables) elements += view.is_null() ? 0 : view.numel();
  return elements;
}

// Working memory: f32 copies of what is not f32 with contiguous rows, per-row D and LSE, the
// per-chunk dQ partials (at most kTargetItems of them), dbias, O(tile) scratch per thread, the
// product unit's per-call packing, and a score program's table gradients (the totals and about
// one f64 buffer per thread: table_gradients.h).
void require_backward_memory(const Problem& p, const TensorView& out, const TensorView& dout,
                             const Gradients& grads, const ProductUnit& unit) {
  const int64_t rows = p.batch * p.q_heads * p.q_len, k_tiles = (p.k_len + T - 1) / T;
  const auto copy = [](const TensorView& t, int64_t width) {
    return rows_in_place(t, width) ? 0.0
                                   : 4.0 * t.numel() / std::max<int64_t>(t.size(3), 1) * width;
  };
  const double dq_rows =
      static_cast<double>(std::min<int64_t>(
          most_chunks(p), std::min<int64_t>(kTargetItems, std::max<int64_t>(k_tiles, 1)))) *
      rows;
  const double bytes =
      copy(p.q, padded(p.head_dim)) + copy(dout, padded(p.value_dim)) + copy(out, p.value_dim) +
      8.0 * rows + 4.0 * dq_rows * padded(p.head_dim) +
      4.0 * static_cast<double>(grads.dbias.is_null() ? 0 : grads.dbias.numel()) +
      4.0 * T * (3.0 * p.head_dim + 3.0 * p.value_dim + 4 * T + 16) * thread_count(p) +
      8.0 * (thread_count(p) + 2) * table_gradient_elements(grads) +
      (unit.backward_call_bytes != nullptr ? unit.backward_call_bytes(p) : 0.0);
  if (bytes > static_cast<double>(memory_limit())) {  // the message's strings only when raised
    require_memory(bytes, "attention_backward (fused kernel) for q " + p.q.shape_string() + ", k " +
                              p.k.shape_string());
  }
}

// Per row: the LSE (contiguous) and D_i = Σ_e dO_ie·O_ie; per query tile: whether Q and dO are
// finite. Filled into c.lse, c.delta, c.q_tile_finite (buffers this thread keeps).
void prepare_rows(const Problem& p, const TensorView& lse, const F32Rows& o, BackwardContext& c) {
  const int64_t rows = p.batch * p.q_heads * p.q_len, q_tiles = (p.q_len + T - 1) / T;
  std::vector<float>& row_state = reused<float, Backward, 3>();
  row_state.resize(2 * rows);
  float* lse_rows = row_state.data();
  float* delta = row_state.data() + rows;
  std::vector<uint8_t>& q_finite = reused<uint8_t, Backward>();
  q_finite.resize(p.batch * p.q_heads * q_tiles);
#pragma omp parallel for schedule(static) num_threads(thread_count(p))
  for (int64_t tile = 0; tile < p.batch * p.q_heads * q_tiles; ++tile) {
    const int64_t bh = tile / q_tiles, b = bh / p.q_heads, h = bh % p.q_heads;
    const int64_t i_end = std::min(p.q_len, (tile % q_tiles + 1) * T);
    bool finite = true;
    for (int64_t i = tile % q_tiles * T; i < i_end; ++i) {
      const int64_t row = bh * p.q_len + i;
      const float row_lse = static_cast<const float*>(lse.data())[lse.offset({b, h, i, 0})];
      const RowDelta row_delta = row_delta_of(c.dout.row(b, h, i), o.row(b, h, i), p.value_dim,
                                              c.q.row(b, h, i), p.head_dim);
      lse_rows[row] = row_lse;
      // A row without keys has O = 0 and no gradient, whatever its dO holds.
      delta[row] = row_lse == -INFINITY ? 0.0f : row_delta.delta;
      finite &= row_delta.finite;
    }
    q_finite[tile] = finite;
  }
  c.lse = lse_rows;
  c.delta = delta;
  c.q_tile_finite = q_finite.data();
}

// ∂L/∂σ_h = −Σ_{b,i} exp(σ_h − LSE_bhi)·D_bhi: the sink is a key with no value (fixed order).
void store_sink_gradients(const Problem& p, const BackwardContext& c,
                          const MutableTensorView& dsinks) {
  for (int64_t h = 0; h < p.q_heads; ++h) {
    double sum = 0.0;
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t i = 0; i < p.q_len; ++i) {
        const int64_t row = (b * p.q_heads + h) * p.q_len + i;
        if (c.lse[row] == -INFINITY) continue;
        sum -= std::exp(double{p.mods->sinks[h]} - c.lse[row]) * c.delta[row];
      }
    }
    store_float(dsinks, h * dsinks.stride(0), static_cast<float>(sum));
  }
}

// Items (b range, kv head range, chunk), costed in non-empty tile pairs; sets c.chunks. With
// dbias, items that would add into the same bias element are merged (see the essay above).
std::vector<BackwardItem> plan_items(const Problem& p, const BlockMap& blocks, bool with_dbias,
                                     BackwardContext& c) {
  const int64_t q_tiles = (p.q_len + T - 1) / T, k_tiles = (p.k_len + T - 1) / T;
  const auto& bias_stride = p.mods->bias_index.stride;
  const bool all_batches = with_dbias && bias_stride[0] == 0 && p.batch > 1;
  const bool all_kv_heads = with_dbias && bias_stride[1] == 0 && p.kv_heads > 1;
  const int64_t b_items = all_batches ? 1 : p.batch, g_items = all_kv_heads ? 1 : p.kv_heads;
  const int64_t base_items = std::max<int64_t>(1, b_items * g_items);
  c.chunks = std::clamp<int64_t>((kTargetItems + base_items - 1) / base_items, 1,
                                 std::max<int64_t>(std::min(k_tiles, most_chunks(p)), 1));
  if (with_dbias && bias_stride[3] == 0) c.chunks = 1;  // every key tile adds into one column

  std::vector<BackwardItem> items;
  const int64_t group = p.kv_heads > 0 ? p.q_heads / p.kv_heads : 0;
  for (int64_t bi = 0; bi < b_items; ++bi) {
    for (int64_t gi = 0; gi < g_items; ++gi) {
      for (int64_t chunk = 0; chunk < c.chunks; ++chunk) {
        BackwardItem item;
        item.b_first = all_batches ? 0 : bi;
        item.b_end = all_batches ? p.batch : bi + 1;
        item.g_first = all_kv_heads ? 0 : gi;
        item.g_end = all_kv_heads ? p.kv_heads : gi + 1;
        item.chunk = chunk;
        for (int64_t b = item.b_first; b < item.b_end; ++b) {
          for (int64_t h = item.g_first * group; h < item.g_end * group; ++h) {
            for (int64_t kt = chunk; kt < k_tiles; kt += c.chunks) {
              for (int64_t qt = 0; qt < q_tiles; ++qt) {
                item.cost += blocks.kind(b, h, qt, kt) != TileKind::empty;
              }
            }
          }
        }
        items.push_back(item);
      }
    }
  }
  return items;
}

// Whether the one chunk's partial can live in dQ itself: f32, rows of exactly dq_width floats,
// [B, Hq, Lq, D] in order (no copy of dQ's size at long lengths).
bool dq_in_place(const Problem& p, const BackwardContext& c, const MutableTensorView& dq) {
  return c.chunks == 1 && dq.dtype() == DType::f32 && c.dq_width == p.head_dim &&
         dq.stride(3) == 1 && dq.stride(2) == p.head_dim && dq.stride(1) == p.q_len * p.head_dim &&
         dq.stride(0) == p.q_heads * p.q_len * p.head_dim;
}

// Zeroed per-chunk dQ partials [chunks][rows][dq_width] into c.dq_partial (dQ's own memory when
// dq_in_place).
void clear_dq_partials(const Problem& p, BackwardContext& c, const MutableTensorView& dq) {
  const int64_t dq_rows = c.chunks * p.batch * p.q_heads * p.q_len;
  if (dq_in_place(p, c, dq)) {
    c.dq_partial = static_cast<float*>(dq.mutable_data());
  } else {
    std::vector<float>& dq_partial = reused<float, Backward, 5>();
    dq_partial.resize(dq_rows * c.dq_width);
    c.dq_partial = dq_partial.data();
  }
#pragma omp parallel for schedule(static) num_threads(thread_count(p))
  for (int64_t row = 0; row < (c.dq_width > 0 ? dq_rows : 0); ++row) {
    std::memset(c.dq_partial + row * c.dq_width, 0, c.dq_width * sizeof(float));
  }
}

// dQ = scale·Σ_chunk partial, chunks in order, rounded once into dq's dtype. In place, the same
// arithmetic (0 + partial, then × scale) on dQ's own memory.
void store_dq(const Problem& p, const BackwardContext& c, const MutableTensorView& dq) {
  const int64_t rows = p.batch * p.q_heads * p.q_len;
  if (c.dq_partial == dq.mutable_data()) {
    const float scale = static_cast<float>(p.scale);
#pragma omp parallel for schedule(static) num_threads(thread_count(p))
    for (int64_t n = 0; n < rows * p.head_dim; ++n)
      c.dq_partial[n] = (0.0f + c.dq_partial[n]) * scale;
    return;
  }
#pragma omp parallel num_threads(thread_count(p))
  {
    std::vector<float> sum(c.dq_width);
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (int64_t chunk = 0; chunk < c.chunks; ++chunk) {
        const float* partial = c.dq_partial + (chunk * rows + row) * c.dq_width;
        for (int64_t d = 0; d < p.head_dim; ++d) sum[d] += partial[d];
      }
      for (int64_t d = 0; d < p.head_dim; ++d) sum[d] *= static_cast<float>(p.scale);
      const int64_t i = row % p.q_len, h = row / p.q_len % p.q_heads;
      const int64_t b = row / (p.q_len * p.q_heads);
      store_row(dq, dq.offset({b, h, i, 0}), dq.stride(3), sum.data(), p.head_dim);
    }
  }
}

// The forward's unit for these inputs (dO's rows must be contiguous too) where it has backward
// products and takes the call, else the f32 unit (product_unit.h).
const ProductUnit& backward_unit(const Problem& p, const TensorView& dout) {
  const bool contiguous =
      p.q.stride(3) == 1 && p.k.stride(3) == 1 && p.v.stride(3) == 1 && dout.stride(3) == 1;
  const ProductUnit& unit =
      product_unit(tile_products(p.q.dtype(), p.head_dim, p.value_dim, contiguous, p.products));
  if (unit.backward_scores == nullptr) return kF32Unit;
  if (unit.backward_fits != nullptr && !unit.backward_fits(p)) return kF32Unit;
  return unit;
}

}  // namespace

void backward(const Problem& problem, const TensorView& out, const TensorView& lse,
              const TensorView& dout, const Gradients& grads, bool block_skipping) {
  const Problem& p = problem;
  const ProductUnit& unit = backward_unit(p, dout);
  require_backward_memory(p, out, dout, grads, unit);
  const int threads = thread_count(p);
  const ResolvedMods& mods = *p.mods;

  BackwardContext c;
  c.problem = &p;
  c.q = f32_rows(p.q, padded(p.head_dim), reused<float, Backward, 0>(), threads);
  c.dout = f32_rows(dout, padded(p.value_dim), reused<float, Backward, 1>(), threads);
  const F32Rows o = f32_rows(out, p.value_dim, reused<float, Backward, 2>(), threads);
  prepare_rows(p, lse, o, c);
  if (!grads.dsinks.is_null()) store_sink_gradients(p, c, grads.dsinks);

  // ---- plan ----
  const BlockMap blocks(*p.mask, T, T, block_skipping);
  const TileMaskBuilder tile_masks(*p.mask);
  c.blocks = &blocks;
  c.tile_masks = &tile_masks;
  c.score_mods = mods.softcap || mods.alibi_slopes != nullptr || mods.bias != nullptr ||
                 mods.program != nullptr || mods.threshold || p.mask->has_additive();
  c.dk = grads.dk;
  c.dv = grads.dv;
  std::vector<float>& dbias = reused<float, Backward, 4>();
  const bool with_dbias = !grads.dbias.is_null();
  if (with_dbias) {
    dbias.assign(grads.dbias.numel(), 0.0f);
    c.dbias = dbias.data();
  }
  const std::vector<BackwardItem> items = plan_items(p, blocks, with_dbias, c);

  // ---- the product unit's per-call packing ----
  c.unit = &unit;
  c.dout_input = dout;
  if (unit.backward_prepare != nullptr) c.prepared = unit.backward_prepare(p, dout, threads);

  // ---- run; then dQ from its partials ----
  c.dq_width = padded(p.head_dim);
  c.dv_width = padded(p.value_dim);
  clear_dq_partials(p, c, grads.dq);
  std::vector<int64_t> costs(items.size());
  for (size_t n = 0; n < items.size(); ++n) costs[n] = items[n].cost + 1;
  const int64_t unit_bytes = unit.backward_thread_bytes != nullptr
                                 ? unit.backward_thread_bytes(p.head_dim, p.value_dim)
                                 : 0;
  // A score program's table gradients: per item, folded in dealing order (table_gradients.h).
  TableGradients table_grads(mods.program, grads);
  std::vector<int64_t> position(items.size());
  const std::vector<int64_t> order = longest_first_order(costs);
  for (size_t n = 0; n < order.size(); ++n) position[order[n]] = static_cast<int64_t>(n);
  run_longest_first(costs, p.threads, [&](int64_t n) {
    thread_local BackwardScratch scratch;
    scratch.reserve(p.head_dim, p.value_dim, unit_bytes);
    TableGradients::Lease lease = table_grads.lease();
    scratch.table_grads = table_grads.empty() ? nullptr : lease.pointers();
    backward_item(c, items[n], scratch);
    table_grads.finish(position[n], std::move(lease));
  });
  store_dq(p, c, grads.dq);
  if (with_dbias) store_all(grads.dbias, dbias.data());
  table_grads.store(grads, grads.accumulate);
}

}  // namespace maskattn::detail::fused
