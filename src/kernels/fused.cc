// The fused kernel's driver: chooses the kernel and, for the tile kernel, the product unit
// (product_unit.h), whose per-call packing it runs and counts as working memory; plans work items,
// runs them on OpenMP threads with per-thread scratch, merges split-key partials and writes the
// outputs in the caller's dtype and layout.
//
// Work items. With many queries an item is one (b, h, 64-query block) against all keys (tile
// kernel), or a run of consecutive such blocks of one head when their key band is short. With few
// queries (decoding, Lq ≤ kRowModeQueries) an item is a batch of rows sharing a kv head against
// one chunk of keys (row kernel); when there are too few (b, kv head) pairs to keep the threads
// busy the keys are split into fixed chunks of kChunkKeys and the partial (O, LSE) pairs merged
// afterwards. Every plan depends on the shapes only, never on the thread count, and each item's
// arithmetic is fixed, so results are bitwise identical for any number of threads. Tile items are
// handed out kv head by kv head (b, g), longest first within each (counted in non-empty tiles):
// longest first keeps a causal mask's uneven rows balanced, and head by head keeps one head's K
// and V in the caches while its blocks run (core/parallel.h, longest_first_within_groups).
// Global-token queries spread over the sequence run apart, gathered into blocks of their own
// (GlobalRows below). Blocks whose key band is long run two at a time (attend_block_pair), so that
// each K and V tile comes from the caches once for both.
#include "kernels/fused.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <numeric>
#include <vector>

#include "core/element.h"
#include "core/parallel.h"
#include "core/reused.h"
#include "kernels/fused_block.h"
#include "kernels/merge.h"
#include "kernels/product_unit.h"
#include "mask/resolved_mask.h"
#include "maskattn/cpu.h"
#include "maskattn/memory.h"

namespace maskattn::detail::fused {

namespace {

constexpr int64_t kRowModeQueries = 8;    // at most this many queries: the row kernel
constexpr int64_t kChunkKeys = 4096;      // key chunk of split-key decoding (multiple of kTileK)
constexpr int64_t kSplitBelowItems = 16;  // split keys when fewer (b, kv head, rows) items exist

struct Forward;  // tag of this driver's reused() buffers

struct Item {
  int64_t b = 0, h = 0;                   // tile mode: one head; row mode: any head of the kv group
  int64_t q_first = 0;                    // tile mode: the first query of the item's first block
  int64_t q_blocks = 1;                   // tile mode: consecutive 64-query blocks
  int64_t rows_first = 0, row_count = 0;  // row mode: rows of the (b, g) row list
  int64_t g = 0, k_first = 0, k_end = 0;
  int64_t cost = 0;
  int64_t partial = -1;  // row mode with split keys: index of the partial-result slot
  bool paired = false;   // tile mode: two blocks (q_blocks = 2) run together (attend_block_pair)
};

// How one call runs: which kernel, and for the tile kernel which product unit.
struct Mode {
  bool rows = false;  // row kernel (few queries), else the tile kernel
  // The tile kernel's product unit (cpu.h): f32 FMA, vdpbf16ps or AMX on bf16 inputs; what it
  // prepares once per call (product_unit.h) is part of the call's working memory.
  const ProductUnit* unit = nullptr;
};

Mode choose_mode(const Problem& p) {
  Mode mode;
  mode.rows = p.q_len <= kRowModeQueries;
  const bool contiguous = p.q.stride(3) == 1 && p.k.stride(3) == 1 && p.v.stride(3) == 1;
  if (!mode.rows) {
    // A paged cache's rows are decoded per tile into f32 (kv_pages.h): the f32 unit reads them.
    mode.unit = p.pages != nullptr
                    ? &product_unit(Products::f32)
                    : &product_unit(tile_products(p.q.dtype(), p.head_dim, p.value_dim, contiguous,
                                                  p.products));
  }
  return mode;
}

// Working memory: the product unit's per-call packing, split-key partials, and O(tile) scratch
// per thread (kept across calls; two for the tile kernel's paired blocks). Throws the catalogue's
// memory error when it cannot be had.
void require_working_memory(const Problem& p, const Mode& mode) {
  double bytes = 4.0 * (kTileQ + kTileK) * (2.0 * p.head_dim + 2.0 * p.value_dim + kTileQ) *
                 (p.threads > 0 ? p.threads : omp_get_max_threads()) * (mode.rows ? 1 : 2);
  if (mode.unit != nullptr) bytes += mode.unit->call_bytes(p);
  if (mode.rows && p.k_len > 2 * kChunkKeys) {
    bytes += 4.0 * p.batch * p.kv_heads * (p.k_len / kChunkKeys + 1) * kMaxRows *
             (p.value_dim + 1) * ((p.q_heads / std::max<int64_t>(p.kv_heads, 1)) * p.q_len);
  }
  if (bytes > static_cast<double>(memory_limit())) {  // the message's strings only when raised
    require_memory(bytes, "attention (fused kernel) for q " + p.q.shape_string() + ", k " +
                              p.k.shape_string());
  }
}

bool has_score_mods(const Problem& p) {
  const ResolvedMods& mods = *p.mods;
  return mods.softcap || mods.alibi_slopes != nullptr || mods.bias != nullptr ||
         mods.score_fn != nullptr || mods.program != nullptr || mods.threshold ||
         p.mask->has_additive();
}

// Tile mode: one item per (b, h, 64-query block) against all keys, costed in tiles visited.
// Blocks whose key band is short (a sliding window, chunks) come in runs of consecutive blocks of
// one head instead: each block then finds most of its K and V band, and the next block's queries,
// already in this thread's caches, where one block alone would spend much of its time waiting for
// memory (a window of 256 keys visits only 5 tiles per block). A run's first block meets its whole
// band cold, so runs are long: 32 blocks rather than 8 took a window of 256 at N = 16384 from
// 51.5 to 50.6 ms (AMD host, 2 threads, interleaved medians), while the 64 items kept for the
// threads bound them anyway. Grouping changes which thread computes a block, never how: the
// results are the same bits.
constexpr int64_t kShortBandTiles = 8;  // bands of at most this many tiles are grouped
constexpr int64_t kMaxRunBlocks = 32;   // blocks per item at most

void plan_tile_items(const Problem& p, const BlockMap& blocks, bool pairing,
                     std::vector<Item>& items) {
  // Keep at least 64 items, so that the threads still share the work evenly.
  const int64_t run_limit =
      std::clamp<int64_t>(p.batch * p.q_heads * blocks.q_tiles() / 64, 1, kMaxRunBlocks);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.q_heads; ++h) {
      bool run_open = false;   // the last item is a run of short-band blocks of this head
      bool pair_open = false;  // the last item is a long-band block a second one may join
      for (int64_t qt = 0; qt < blocks.q_tiles(); ++qt) {
        const BlockMap::TileRange band = blocks.k_tile_range(b, h, qt);
        const int64_t tiles = band.end - band.first;  // visited at most: the item's cost
        const bool short_band = tiles <= kShortBandTiles;
        if (short_band && run_open && items.back().q_blocks < run_limit) {
          items.back().q_blocks += 1;
          items.back().cost += tiles;
          continue;
        }
        if (!short_band && pair_open) {
          items.back().q_blocks = 2;
          items.back().paired = true;
          items.back().cost += tiles;
          pair_open = false;
          continue;
        }
        Item item;
        item.b = b;
        item.h = h;
        item.q_first = qt * kTileQ;
        item.k_end = p.k_len;
        item.cost = tiles;
        items.push_back(item);
        run_open = short_band;
        pair_open = pairing && !short_band;
      }
    }
  }
}

// Row mode: the rows (h relative to the kv group, i) of one (b, g), in order.
std::vector<Row> group_rows(const Problem& p) {
  std::vector<Row> rows;
  const int64_t group = p.kv_heads > 0 ? p.q_heads / p.kv_heads : 0;
  for (int64_t h = 0; h < group; ++h) {
    for (int64_t i = 0; i < p.q_len; ++i) rows.push_back({h, i});
  }
  return rows;
}

// Row mode: key chunks per row batch; more than one only when too few (b, g, row batch) items
// would leave threads idle on a long cache.
int64_t key_chunks(const Problem& p, int64_t row_batches) {
  if (p.batch * p.kv_heads * row_batches < kSplitBelowItems && p.k_len > 2 * kChunkKeys) {
    return (p.k_len + kChunkKeys - 1) / kChunkKeys;
  }
  return 1;
}

// Row mode: one item per (b, g, batch of kMaxRows rows, key chunk); chunks of one row batch are
// consecutive, which merge_split_keys() relies on.
void plan_row_items(const Problem& p, int64_t row_count, int64_t chunks, std::vector<Item>& items) {
  const int64_t row_batches = (row_count + kMaxRows - 1) / kMaxRows;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t g = 0; g < p.kv_heads; ++g) {
      for (int64_t batch = 0; batch < row_batches; ++batch) {
        for (int64_t c = 0; c < chunks; ++c) {
          Item item;
          item.b = b;
          item.g = g;
          item.rows_first = batch * kMaxRows;
          item.row_count = std::min<int64_t>(kMaxRows, row_count - item.rows_first);
          item.k_first = chunks == 1 ? 0 : c * kChunkKeys;
          item.k_end = chunks == 1 ? p.k_len : std::min(p.k_len, (c + 1) * kChunkKeys);
          item.cost = item.k_end - item.k_first;
          if (chunks > 1) item.partial = static_cast<int64_t>(items.size());
          items.push_back(item);
        }
      }
    }
  }
}

// Writes one finished row: O in the output's dtype, and its LSE when asked for.
struct RowWriter {
  const MutableTensorView& out;
  const MutableTensorView& lse;
  int64_t value_dim;

  void operator()(int64_t b, int64_t h, int64_t i, const float* values, float row_lse) const {
    block(b, h, i, 1, values, &row_lse);
  }
  // Rows [i, i + count) of (b, h), `value_dim` apart in `values`.
  void block(int64_t b, int64_t h, int64_t i, int64_t count, const float* values,
             const float* row_lse) const {
    if (out.numel() > 0) {
      store_rows(out, out.offset({b, h, i, 0}), out.stride(2), out.stride(3), values, value_dim,
                 count, value_dim);
    }
    if (lse.is_null()) return;
    float* first = static_cast<float*>(lse.mutable_data()) + lse.offset({b, h, i, 0});
    for (int64_t r = 0; r < count; ++r) first[r * lse.stride(2)] = row_lse[r];
  }
};

// Split-key partial results: [item][row][Dv] and [item][row].
struct Partials {
  std::vector<float>& out;
  std::vector<float>& lse;
};

// Block n of a tile item.
Block block_of(const Problem& p, const Item& item, int64_t n) {
  Block block;
  block.b = item.b;
  block.h = item.h;
  block.q_first = item.q_first + n * kTileQ;
  block.q_count = std::min(kTileQ, p.q_len - block.q_first);
  block.k_first = 0;
  block.k_end = item.k_end;
  return block;
}

// A tile item's blocks, one after another, or both at once when paired (scratch[1] then holds the
// second block's state).
void run_tile_item(const Context& context, const Item& item, const RowWriter& write,
                   Scratch* scratch, int64_t unit_bytes) {
  const Problem& p = *context.problem;
  if (item.paired) {
    scratch[1].reserve(p.head_dim, p.value_dim, unit_bytes);
    const Block blocks[2] = {block_of(p, item, 0), block_of(p, item, 1)};
    attend_block_pair(context, blocks, scratch);
    for (int n = 0; n < 2; ++n) {
      write.block(item.b, item.h, blocks[n].q_first, blocks[n].q_count, scratch[n].out,
                  scratch[n].lse);
    }
    return;
  }
  for (int64_t n = 0; n < item.q_blocks; ++n) {
    const Block block = block_of(p, item, n);
    attend_block(context, block, scratch[0]);
    write.block(block.b, block.h, block.q_first, block.q_count, scratch[0].out, scratch[0].lse);
  }
}

// ---- global-token queries, apart --------------------------------------------------------------
// A query that is a global token (Longformer) sees every key, so the block holding it sweeps the
// whole row of key tiles for that one query while its other queries see only their band: with
// global tokens spread over the sequence, every block holding one did (2.2× the proportional time
// at N = 16384). Where such queries see every key (BlockMap::global_queries_see_every_key) and are
// spread over more blocks than they fill, they are gathered into a small Q of their own, up to 64
// per block of their head, and run as dense blocks against all keys after the other items; the
// other blocks visit only their bands (BlockMap's global_queries_apart), and the gathered results
// overwrite the global rows they wrote. The same bits: a gathered query meets the same key tiles in
// the same order with the same arithmetic in its lane, and its lane in the band-only block lost
// only tiles it saw nothing of, which would have left its running maximum, sum and output exactly
// as they were (α = exp(0) = 1, weights 0); only that lane's result is replaced anyway.
struct GlobalRows {
  std::vector<std::vector<int64_t>> rows;  // [B·Hq]: the call's global query rows of (b, h)
  int64_t width = 0;                       // the most of one (b, h)
  bool apart() const { return width > 0; }
};

GlobalRows global_rows_apart(const Problem& p, bool block_skipping) {
  GlobalRows global;
  if (!block_skipping || p.dropout.on || p.pages != nullptr || has_score_mods(p) ||
      !BlockMap::global_queries_see_every_key(*p.mask)) {
    return global;
  }
  global.rows.resize(p.batch * p.q_heads);
  int64_t sweeping_blocks = 0, gathered_blocks = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.q_heads; ++h) {
      std::vector<int64_t>& rows = global.rows[b * p.q_heads + h];
      rows = BlockMap::global_query_rows(*p.mask, b, h);
      const int64_t count = static_cast<int64_t>(rows.size());
      for (int64_t n = 0; n < count; ++n) {
        sweeping_blocks += n == 0 || rows[n] / kTileQ != rows[n - 1] / kTileQ;
      }
      gathered_blocks += (count + kTileQ - 1) / kTileQ;
      global.width = std::max(global.width, count);
    }
  }
  if (gathered_blocks >= sweeping_blocks) return GlobalRows();  // nothing to gain
  return global;
}

// The global rows of p.q, row n of (b, h) at [b, h, n], in p.q's dtype (zero rows past a head's
// count) in `storage`.
TensorView gather_global_queries(const Problem& p, const GlobalRows& global,
                                 std::vector<uint8_t>& storage) {
  const int64_t size = static_cast<int64_t>(dtype_size(p.q.dtype()));
  const int64_t row_bytes = p.head_dim * size;
  storage.assign(p.batch * p.q_heads * global.width * row_bytes, 0);
  const auto* q = static_cast<const uint8_t*>(p.q.data());
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.q_heads; ++h) {
      const std::vector<int64_t>& rows = global.rows[b * p.q_heads + h];
      for (size_t n = 0; n < rows.size(); ++n) {
        uint8_t* to = storage.data() + ((b * p.q_heads + h) * global.width + n) * row_bytes;
        const int64_t from = p.q.offset({b, h, rows[n], 0});
        for (int64_t d = 0; d < p.head_dim; ++d) {
          std::memcpy(to + d * size, q + (from + d * p.q.stride(3)) * size, size);
        }
      }
    }
  }
  return TensorView(storage.data(), p.q.dtype(), {p.batch, p.q_heads, global.width, p.head_dim});
}

// Runs the gathered rows as dense blocks against every key (after every other item: their
// results replace what those wrote for the same rows).
void run_global_rows(const Context& context, const GlobalRows& global, const RowWriter& write,
                     int64_t unit_bytes) {
  const Problem& p = *context.problem;
  std::vector<uint8_t>& storage = reused<uint8_t, Forward>();
  Problem gathered = p;
  gathered.q = gather_global_queries(p, global, storage);
  gathered.q_len = global.width;
  const Mask none;
  const ResolvedMask every_key(none, {p.batch, p.q_heads, global.width, p.k_len});
  gathered.mask = &every_key;
  const BlockMap blocks(every_key, kTileQ, kTileK);
  const TileMaskBuilder tile_masks(every_key);
  Context gathered_context = context;
  gathered_context.problem = &gathered;
  gathered_context.blocks = &blocks;
  gathered_context.tile_masks = &tile_masks;
  std::vector<Block> blocks_to_run;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.q_heads; ++h) {
      const auto count = static_cast<int64_t>(global.rows[b * p.q_heads + h].size());
      for (int64_t q_first = 0; q_first < count; q_first += kTileQ) {
        Block block;
        block.b = b;
        block.h = h;
        block.q_first = q_first;
        block.q_count = std::min(kTileQ, count - q_first);
        block.k_end = p.k_len;
        blocks_to_run.push_back(block);
      }
    }
  }
  std::vector<int64_t> order(blocks_to_run.size());
  std::iota(order.begin(), order.end(), 0);
  run_in_order(order, p.threads, [&](int64_t index) {
    thread_local Scratch scratch;
    scratch.reserve(p.head_dim, p.value_dim, unit_bytes);
    const Block& block = blocks_to_run[index];
    attend_block(gathered_context, block, scratch);
    const std::vector<int64_t>& rows = global.rows[block.b * p.q_heads + block.h];
    for (int64_t r = 0; r < block.q_count; ++r) {
      write(block.b, block.h, rows[block.q_first + r], scratch.out + r * p.value_dim,
            scratch.lse[r]);
    }
  });
}

void run_row_item(const Context& context, const Item& item, const std::vector<Row>& rows,
                  bool split, const RowWriter& write, const Partials& partials, Scratch& scratch) {
  const Problem& p = *context.problem;
  const int64_t group = p.q_heads / p.kv_heads;
  Row batch[kMaxRows];
  for (int64_t r = 0; r < item.row_count; ++r) {
    const Row row = rows[item.rows_first + r];
    batch[r] = {item.g * group + row.h, row.i};
  }
  attend_rows(context, item.b, batch, item.row_count, item.k_first, item.k_end, !split, scratch);
  for (int64_t r = 0; r < item.row_count; ++r) {
    const float* values = scratch.out + r * p.value_dim;
    if (item.partial < 0) {
      write(item.b, batch[r].h, batch[r].i, values, scratch.lse[r]);
    } else {
      std::copy_n(values, p.value_dim,
                  partials.out.data() + (item.partial * kMaxRows + r) * p.value_dim);
      partials.lse[item.partial * kMaxRows + r] = scratch.lse[r];
    }
  }
}

// Merges each row's split-key partials chunk by chunk in key order (merge.h), with the sink.
void merge_split_keys(const Problem& p, const std::vector<Item>& items,
                      const std::vector<Row>& rows, int64_t chunks, const Partials& partials,
                      const RowWriter& write) {
  const int64_t group = p.q_heads / p.kv_heads;
  std::vector<float> merged(p.value_dim);
  for (size_t n = 0; n < items.size(); n += chunks) {
    const Item& first = items[n];  // chunks of one (b, g, row batch) are consecutive
    for (int64_t r = 0; r < first.row_count; ++r) {
      const Row row = rows[first.rows_first + r];
      const int64_t h = first.g * group + row.h;
      const float sink = p.mods->sinks != nullptr ? p.mods->sinks[h] : -INFINITY;
      const float row_lse =
          merge_row(chunks, partials.out.data() + (first.partial * kMaxRows + r) * p.value_dim,
                    kMaxRows * p.value_dim, partials.lse.data() + first.partial * kMaxRows + r,
                    kMaxRows, sink, p.value_dim, merged.data());
      write(first.b, h, row.i, merged.data(), row_lse);
    }
  }
}

// Whether long-band blocks run two at a time (attend_block_pair): for units that keep no block
// state outside the scratch, and while that leaves at least 64 items for the threads.
bool pairs_blocks(const Problem& p, const Mode& mode, const BlockMap& blocks) {
  if (mode.rows || mode.unit->end_block != nullptr || mode.unit->raw_scores != nullptr) {
    return false;
  }
  return p.batch * p.q_heads * blocks.q_tiles() >= 2 * 64;
}

}  // namespace

void forward(const Problem& problem, const MutableTensorView& out, const MutableTensorView& lse,
             bool block_skipping) {
  if (problem.batch * problem.q_heads * problem.q_len == 0) return;
  if (out.numel() == 0 && lse.is_null()) return;
  const Mode mode = choose_mode(problem);
  require_working_memory(problem, mode);
  Problem p = problem;
  // The unit's per-call packing (f32: K and V converted once, when they are not f32 rows).
  const void* prepared = mode.unit != nullptr ? mode.unit->prepare(p) : nullptr;

  // ---- what every item reads ----
  const GlobalRows global = mode.rows ? GlobalRows() : global_rows_apart(p, block_skipping);
  const BlockMap blocks(*p.mask, kTileQ, kTileK, block_skipping, global.apart());
  const TileMaskBuilder tile_masks(*p.mask);
  Context context;
  context.problem = &p;
  context.blocks = &blocks;
  context.tile_masks = &tile_masks;
  context.unit = mode.unit;
  context.prepared = prepared;
  context.score_mods = has_score_mods(p);
  context.skip_hidden_rows = block_skipping;
  std::unique_ptr<std::atomic<uint8_t>[]> v_finite;
  if (!mode.rows) {
    v_finite.reset(new std::atomic<uint8_t>[p.batch * p.kv_heads * blocks.k_tiles()]());
    context.v_tile_finite = v_finite.get();
  }

  // ---- plan ----
  std::vector<Item>& items = reused<Item, Forward>();
  items.clear();
  const std::vector<Row> rows = mode.rows ? group_rows(p) : std::vector<Row>();
  const int64_t row_count = static_cast<int64_t>(rows.size());
  const int64_t chunks = mode.rows ? key_chunks(p, (row_count + kMaxRows - 1) / kMaxRows) : 1;
  if (mode.rows) {
    plan_row_items(p, row_count, chunks, items);
  } else {
    plan_tile_items(p, blocks, pairs_blocks(p, mode, blocks), items);
  }
  const Partials partials{reused<float, Forward, 1>(), reused<float, Forward, 2>()};
  if (chunks > 1) {
    partials.out.resize(items.size() * kMaxRows * p.value_dim);
    partials.lse.resize(items.size() * kMaxRows);
  }

  // ---- run, head by head and longest first; then merge split-key partials ----
  const RowWriter write{out, lse, p.value_dim};
  std::vector<int64_t> costs(items.size()), groups(items.size());
  for (size_t n = 0; n < items.size(); ++n) {
    costs[n] = items[n].cost;
    groups[n] = mode.rows ? 0 : items[n].b * p.kv_heads + p.kv_head(items[n].h);
  }
  const int64_t unit_bytes = mode.unit != nullptr && mode.unit->thread_bytes != nullptr
                                 ? mode.unit->thread_bytes(p.head_dim, p.value_dim)
                                 : 0;
  run_in_order(longest_first_within_groups(costs, groups), p.threads, [&](int64_t index) {
    thread_local Scratch scratch[2];
    scratch[0].reserve(p.head_dim, p.value_dim, unit_bytes);
    if (mode.rows) {
      run_row_item(context, items[index], rows, chunks > 1, write, partials, scratch[0]);
    } else {
      run_tile_item(context, items[index], write, scratch, unit_bytes);
    }
  });
  if (chunks > 1) merge_split_keys(p, items, rows, chunks, partials, write);
  if (global.apart()) run_global_rows(context, global, write, unit_bytes);
}

}  // namespace maskattn::detail::fused
