// The fused forward's row kernel: a few queries (decoding: Lq ≤ 8) against many keys, compiled
// once per SIMD target (Highway runtime dispatch).
//
// Design. Decoding computes one new query row per head against a KV cache of thousands of keys.
// The tile kernel would put 64 queries across the SIMD lanes and waste all but one of them, so
// this kernel turns the layout around: the head dimension D goes across the lanes and each score
// is a dot product of the scaled query row with one key row. The work is then memory-bound (each
// key and value is used once per query row), so the kernel is built around the memory stream:
//
// - Rows share reads. The driver hands over up to kMaxRows rows (head, query) of one batch entry
//   that use the same kv head (the query heads of a GQA group, and the few queries): every K and
//   V row is read once for all of them.
// - K and V are read in place, in their own dtype (RowSource): converting them to f32 first would
//   add a pass over memory for data read once. f16/bf16 rows are widened in registers.
// - Rows ahead are requested (prefetched) by the first row of the batch, in step with its passes.
//   With K and V in place (tensors, not pages) the two streams take turns: scoring a tile's keys
//   requests its value rows, one per key, and summing its values requests the next tile's key
//   rows. A pass over 64 rows lasts long enough for the other stream's rows to arrive, and every
//   row is asked for once, a tile ahead of its use (2026-12-05, AMD host, Lk=32768, 2 threads,
//   interleaved: f32 H=8 6.5 → 5.4 ms, bf16 3.1 → 1.95 ms, f32 H=32 over 8 KV heads 9.9 →
//   7.7 ms; the rows' own stream 8 rows ahead, the rule before, left each tile's first rows and
//   every page boundary to wait). A paged cache's tile is several runs (one per block): there a
//   run requests its own rows kPrefetchRows ahead and the first rows of the run after it, the next
//   tile's included (with blocks of 16: int8 decode 7.7 → 3.6 ms).
// - Scores of four keys are reduced together (DotFour: an interleave tree inside 128-bit blocks,
//   then the blocks summed) instead of one horizontal sum per key, which cost more than the key's
//   products; and P·V keeps up to four output vectors in registers across the keys
//   (AccumulateValueVectors) instead of a store-to-load chain through memory. Both measured
//   1.1–1.9× faster decode attention than their one-key forms (2026-11, Zen 5).
//
// Per tile of 64 keys the kernel runs the same steps as the tile kernel, from the same shared
// pieces: the block map's tile kinds (empty tiles are skipped, partial ones get a bit row from
// TileMaskBuilder), the modifier chain (score_chain.h, here in f64 like the reference: few scores,
// so exactness is free), the online softmax (softmax-inl.h, its row layout), O += P·V skipping
// zero weights (so hidden keys' values are never read into the result), and EndOfRow.
//
// With very long caches and few (b, kv head) pairs, the driver splits the keys into chunks run in
// parallel (`with_sink` false) and merges the partial (O, LSE) pairs (merge.h).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/fused_rows.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/convert-inl.h"
#include "kernels/dropout-inl.h"
#include "kernels/fused_block.h"
#include "kernels/kv_rows-inl.h"
#include "kernels/score_chain.h"
#include "kernels/softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace maskattn::detail::fused {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr int64_t kPrefetchRows = 8;

// A run of key or value rows read in place by the row kernel: rows of f32, f16 or bf16 with unit
// inner stride `stride` elements apart, or quantized rows (kv_format.h) `row_bytes` apart
// (decoding reads each row once, so converting first would only add a pass over memory).
struct RowSource {
  const void* base = nullptr;
  DType dtype = DType::f32;
  KVFormat format = KVFormat::f32;  // a quantized format, or the dtype's own
  int64_t stride = 0;               // elements between rows (unquantized formats)
  int64_t row_bytes = 0;            // bytes between rows
  int64_t width_bytes = 0;          // bytes of one row's data
  int64_t group = 0;                // elements per scale (quantized formats)
};

RowSource SourceRows(const TensorView& t, int64_t b, int64_t g, int64_t j0, int64_t count,
                     int64_t width, float* buffer) {
  if (t.stride(3) == 1) {
    const auto* bytes = static_cast<const uint8_t*>(t.data()) +
                        t.offset({b, g, j0, 0}) * static_cast<int64_t>(dtype_size(t.dtype()));
    const auto element = static_cast<int64_t>(dtype_size(t.dtype()));
    return {bytes,           t.dtype(), kv_format_of(t.dtype()), t.stride(2), t.stride(2) * element,
            width * element, 0};
  }
  int64_t stride = 0;
  const float* rows = TileRows(t, b, g, j0, count, width, buffer, stride);
  return {rows, DType::f32, KVFormat::f32, stride, stride * 4, width * 4, 0};
}

// A tile's rows as runs sharing a stride: one run for a tensor; for a paged cache one per block
// the tile touches, and a stride-0 run of the zero row past the sequence's end (kv_pages.h).
// `after` is the first run of the next tile of a paged cache (after_count rows; 0 if none):
// the loops over a run request rows ahead only inside it, so each run requests the first rows
// of the run after it (PrefetchNextRun) — with blocks of 16 a run is 16 rows, and the rows
// before the within-run distance were otherwise always waited for.
constexpr int kMaxRuns = static_cast<int>(kTileK / 16) + 1;
struct TileSource {
  RowSource runs[kMaxRuns];
  int64_t first[kMaxRuns + 1] = {};  // run r holds the tile's rows [first[r], first[r + 1])
  int count = 0;
  RowSource after;
  int64_t after_count = 0;
};

TileSource SourceTile(const Problem& p, bool keys, int64_t b, int64_t g, int64_t j0, int64_t count,
                      int64_t k_end, float* buffer) {
  TileSource tile;
  const int64_t width = keys ? p.head_dim : p.value_dim;
  if (p.pages == nullptr) {
    tile.runs[0] = SourceRows(keys ? p.k : p.v, b, g, j0, count, width, buffer);
    tile.first[1] = count;
    tile.count = 1;
    return tile;
  }
  const KVPages& pages = *p.pages;
  RowSource shape;
  shape.format = pages.format;
  shape.dtype = is_quantized(pages.format) ? DType::f32 : kv_format_dtype(pages.format);
  shape.width_bytes = pages.row_bytes(keys);
  shape.group = kv_group_size(pages.format, keys, width);
  const int64_t element = static_cast<int64_t>(dtype_size(shape.dtype));
  const auto run_at = [&](const uint8_t* row, int64_t stride) {
    RowSource run = shape;
    run.base = row;
    run.row_bytes = stride;
    run.stride = stride / element;
    return run;
  };
  pages.for_each_run(keys, b, g, j0, j0 + count,
                     [&](const uint8_t* row, int64_t, int64_t end, int64_t stride) {
                       tile.runs[tile.count] = run_at(row, stride);
                       tile.first[++tile.count] = end - j0;
                     });
  const int64_t next = j0 + kTileK;
  if (next < std::min(k_end, pages.held(b))) {  // the next tile's first run
    pages.for_each_run(keys, b, g, next, pages.run_end(b, next, std::min(k_end, next + kTileK)),
                       [&](const uint8_t* row, int64_t, int64_t end, int64_t stride) {
                         tile.after = run_at(row, stride);
                         tile.after_count = end - next;
                       });
  }
  return tile;
}

template <typename T>
float DotT(const float* HWY_RESTRICT a, const T* HWY_RESTRICT b, int64_t count) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  int64_t d = 0;
  for (; d + 2 * N <= count; d += 2 * N) {
    acc0 = hn::MulAdd(hn::LoadU(df, a + d), LoadAsFloat(b + d), acc0);
    acc1 = hn::MulAdd(hn::LoadU(df, a + d + N), LoadAsFloat(b + d + N), acc1);
  }
  for (; d + N <= count; d += N) acc0 = hn::MulAdd(hn::LoadU(df, a + d), LoadAsFloat(b + d), acc0);
  float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
  for (; d < count; ++d) sum += a[d] * AsFloat(b[d]);
  return sum;
}

#if HWY_TARGET != HWY_SCALAR  // one-lane vectors: scores one key at a time
// out[x] = Σ_d q[d]·K[x][d] for four key rows (row x at k + x·stride). The four accumulators are
// reduced together (an interleave tree inside 128-bit blocks, then the blocks summed) instead of
// one horizontal sum per key, which cost more than the key's products when decoding.
template <typename T>
HWY_INLINE void DotFour(const float* HWY_RESTRICT q, const T* HWY_RESTRICT k, int64_t stride,
                        int64_t dim, float* HWY_RESTRICT out) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  int64_t d = 0;
  for (; d + N <= dim; d += N) {
    const VF qv = hn::LoadU(df, q + d);
    a0 = hn::MulAdd(qv, LoadAsFloat(k + d), a0);
    a1 = hn::MulAdd(qv, LoadAsFloat(k + stride + d), a1);
    a2 = hn::MulAdd(qv, LoadAsFloat(k + 2 * stride + d), a2);
    a3 = hn::MulAdd(qv, LoadAsFloat(k + 3 * stride + d), a3);
  }
  StoreSumsOfFour(df, a0, a1, a2, a3, out);
  for (; d < dim; ++d) {
    for (int x = 0; x < 4; ++x) out[x] += q[d] * AsFloat(k[x * stride + d]);
  }
}
#endif

HWY_INLINE void PrefetchSourceRow(const RowSource& source, int64_t j) {
  const auto* row = static_cast<const uint8_t*>(source.base) + j * source.row_bytes;
  for (int64_t byte = 0; byte < source.width_bytes; byte += 64) hwy::Prefetch(row + byte);
}

// The rows a pass over a run requests while it runs: at its row j, row j + `offset` of `source`
// while that is below `end`. Either the same run kPrefetchRows ahead, or (K and V in place) the
// other stream's rows in step: the tile's value rows while its keys are scored, the next tile's
// key rows while its values are summed (the essay's "Rows ahead").
struct RowRequests {
  const RowSource* source = nullptr;
  int64_t offset = 0, end = 0;

  HWY_INLINE void at(int64_t j) const {
    if (source != nullptr && j + offset < end) PrefetchSourceRow(*source, j + offset);
  }
};

// out[e] += Σ_j w[j]·V[j][e] for e in [0, kVectors·N), keys j in order, zero weights skipped; the
// kVectors output vectors stay in registers across the keys (accumulating in memory instead made
// every key wait for the previous key's store: a store-to-load chain through `out`).
template <int kVectors, typename T>
HWY_INLINE void AccumulateValueVectors(const T* HWY_RESTRICT v, int64_t stride, int64_t count,
                                       const float* HWY_RESTRICT w, float* HWY_RESTRICT out,
                                       const RowRequests& requests) {
  const DF df;
  const size_t N = hn::Lanes(df);
  VF acc[kVectors];
  for (int x = 0; x < kVectors; ++x) acc[x] = hn::LoadU(df, out + x * N);
  for (int64_t j = 0; j < count; ++j, v += stride) {
    requests.at(j);
    if (w[j] == 0.0f) continue;
    const VF weight = hn::Set(df, w[j]);
    for (int x = 0; x < kVectors; ++x) acc[x] = hn::MulAdd(weight, LoadAsFloat(v + x * N), acc[x]);
  }
  for (int x = 0; x < kVectors; ++x) hn::StoreU(acc[x], df, out + x * N);
}

// out[e] += Σ_j w[j]·V[j][e] over `count` value rows (row j at v + j·stride) and all value_dim
// columns: blocks of up to 4 vectors, then the columns past the last whole vector. Each element is
// one sum over j in order, so the result does not depend on the blocking. The first block makes
// the pass's `requests`.
template <typename T>
void AccumulateValues(const T* HWY_RESTRICT v, int64_t stride, int64_t count, int64_t value_dim,
                      const float* HWY_RESTRICT w, float* HWY_RESTRICT out, RowRequests requests) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  int64_t e = 0;
  for (; e + 4 * N <= value_dim; e += 4 * N, requests = RowRequests()) {
    AccumulateValueVectors<4>(v + e, stride, count, w, out + e, requests);
  }
  switch ((value_dim - e) / N) {
    case 3:
      AccumulateValueVectors<3>(v + e, stride, count, w, out + e, requests);
      break;
    case 2:
      AccumulateValueVectors<2>(v + e, stride, count, w, out + e, requests);
      break;
    case 1:
      AccumulateValueVectors<1>(v + e, stride, count, w, out + e, requests);
      break;
    default:
      break;
  }
  e += (value_dim - e) / N * N;
  for (; e < value_dim; ++e) {
    float sum = out[e];
    for (int64_t j = 0; j < count; ++j) {
      if (w[j] != 0.0f) sum += w[j] * AsFloat(v[j * stride + e]);
    }
    out[e] = sum;
  }
}

// Calls fn(row pointer) with the row typed by the source's dtype.
template <typename Fn>
HWY_INLINE void WithRow(const RowSource& source, int64_t j, Fn&& fn) {
  switch (source.dtype) {
    case DType::f32:
      fn(static_cast<const float*>(source.base) + j * source.stride);
      break;
    case DType::f16:
      fn(static_cast<const hwy::float16_t*>(source.base) + j * source.stride);
      break;
    case DType::bf16:
      fn(static_cast<const hwy::bfloat16_t*>(source.base) + j * source.stride);
      break;
  }
}

// Row r's queries, scaled once, and its softmax state; the outputs start at 0.
void StartRows(const Context& c, int64_t b, const Row* rows, int64_t row_count, bool with_sink,
               Scratch& scratch) {
  const Problem& p = *c.problem;
  for (int64_t r = 0; r < row_count; ++r) {
    float* q = scratch.q_rows + r * p.head_dim;
    LoadRow(p.q, p.q.offset({b, rows[r].h, rows[r].i, 0}), p.q.stride(3), p.head_dim, q);
    for (int64_t d = 0; d < p.head_dim; ++d) q[d] *= static_cast<float>(p.scale);
    SoftmaxStart(p, rows[r].h, with_sink, scratch.row_max + r, scratch.row_sum + r,
                 scratch.poisoned + r, 1);
  }
  std::memset(scratch.out, 0, row_count * p.value_dim * sizeof(float));
}

// The key tiles any of the rows may see: the union of their bands in the block map.
BlockMap::TileRange UnionOfBands(const Context& c, int64_t b, const Row* rows, int64_t row_count) {
  BlockMap::TileRange band{INT64_MAX, 0};
  for (int64_t r = 0; r < row_count; ++r) {
    const BlockMap::TileRange row = c.blocks->k_tile_range(b, rows[r].h, rows[r].i / kTileQ);
    if (row.first < row.end) band = {std::min(band.first, row.first), std::max(band.end, row.end)};
  }
  return band;
}

// Requests the first `rows` rows of the run after run r: the tile's next run, or the next tile's
// first (TileSource::after). None past the sequence's blocks (the zero row, stride 0).
void PrefetchNextRun(const TileSource& tile, int r, int64_t rows) {
  const bool inside = r + 1 < tile.count;
  const RowSource& next = inside ? tile.runs[r + 1] : tile.after;
  const int64_t count = inside ? tile.first[r + 2] - tile.first[r + 1] : tile.after_count;
  if (next.row_bytes == 0) return;
  const int64_t n = std::min(rows, count);
  if (next.row_bytes == next.width_bytes) {  // rows back to back: their lines, each once
    const auto* first = static_cast<const uint8_t*>(next.base);
    for (int64_t byte = 0; byte < n * next.row_bytes; byte += 64) hwy::Prefetch(first + byte);
    return;
  }
  for (int64_t j = 0; j < n; ++j) PrefetchSourceRow(next, j);
}

// The rows a run's pass requests (RowRequests): none but for the first row of a batch (the rows
// share the reads); for K and V in place, the other stream's rows of `companion` in step;
// otherwise the run's own rows kPrefetchRows ahead.
RowRequests RequestsOf(bool prefetch, const RowSource& run, int64_t count,
                       const TileSource* companion) {
  if (!prefetch) return {};
  if (companion != nullptr) return {&companion->runs[0], 0, companion->first[1]};
  return {&run, kPrefetchRows, count};
}

// s[j] = q·K[j] for the `count` rows of one run, making the pass's `requests`.
void DotRun(const float* q, const RowSource& k, int64_t count, int64_t dim,
            const RowRequests& requests, float* s) {
  if (is_quantized(k.format)) {
    const auto* keys = static_cast<const uint8_t*>(k.base);
    WithQuantized(k.format, [&](auto format) {
      DotQuantizedRun<decltype(format)::value>(q, keys, k.row_bytes, count, dim, k.group, s);
    });
    return;
  }
  WithRow(k, 0, [&](const auto* keys) {
    int64_t j = 0;
#if HWY_TARGET != HWY_SCALAR
    for (; j + 4 <= count; j += 4) {
      for (int64_t n = j; n < j + 4; ++n) requests.at(n);
      DotFour(q, keys + j * k.stride, k.stride, dim, s + j);
    }
#endif
    for (; j < count; ++j) {
      requests.at(j);
      s[j] = DotT(q, keys + j * k.stride, dim);
    }
  });
}

// s[j] = q·K[j0 + j] for the `count` keys of the tile, run by run; `values` (K and V in place:
// the tile's value rows, or null) are requested in step.
void DotKeys(const float* q, const TileSource& k, int64_t dim, bool prefetch,
             const TileSource* values, float* s) {
  for (int r = 0; r < k.count; ++r) {
    const int64_t count = k.first[r + 1] - k.first[r];
    if (prefetch && values == nullptr)
      PrefetchNextRun(k, r, is_quantized(k.runs[r].format) ? kRowsAhead : kPrefetchRows);
    DotRun(q, k.runs[r], count, dim, RequestsOf(prefetch, k.runs[r], count, values),
           s + k.first[r]);
  }
}

// out += Σ_j w[j]·V[j] over the tile's value rows, run by run (each element one sum in key order);
// `next_keys` (K and V in place: the next tile's key rows, or null) are requested in step.
void AccumulateTile(const TileSource& v, int64_t value_dim, const float* w, float* out,
                    bool prefetch, const TileSource* next_keys) {
  for (int r = 0; r < v.count; ++r) {
    const RowSource& run = v.runs[r];
    const int64_t count = v.first[r + 1] - v.first[r];
    if (prefetch && next_keys == nullptr)
      PrefetchNextRun(v, r, is_quantized(run.format) ? kRowsAhead : kPrefetchRows);
    if (is_quantized(run.format)) {
      WithQuantized(run.format, [&](auto format) {
        AccumulateQuantized<decltype(format)::value>(static_cast<const uint8_t*>(run.base),
                                                     run.row_bytes, count, value_dim, run.group,
                                                     w + v.first[r], out);
      });
      continue;
    }
    WithRow(run, 0, [&](const auto* values) {
      AccumulateValues(values, run.stride, count, value_dim, w + v.first[r], out,
                       RequestsOf(prefetch, run, count, next_keys));
    });
  }
}

// Row r's final scores for key tile [j0, j0 + count), padded with −inf to a whole tile: the
// product, then the mask (−inf for hidden pairs) and the modifier chain on the allowed ones.
void RowScores(const Context& c, int64_t b, Row row, int64_t r, TileKind kind, const TileSource& k,
               const TileSource* values, int64_t j0, int64_t count, Scratch& scratch) {
  const Problem& p = *c.problem;
  float* s = scratch.s + r * kTileK;
  std::fill(s + count, s + kTileK, -INFINITY);
  if (kind == TileKind::empty) {
    std::fill(s, s + count, -INFINITY);
    return;
  }
  DotKeys(scratch.q_rows + r * p.head_dim, k, p.head_dim, r == 0, values, s);
  const uint64_t* allowed = nullptr;
  if (kind == TileKind::partial) {
    c.tile_masks->build(b, row.h, row.i, 1, j0, count, scratch.allowed);
    allowed = scratch.allowed;
  }
  const bool additive = p.mask->has_additive() && kind == TileKind::partial;
  for (int64_t j = 0; j < count; ++j) {
    if (allowed != nullptr && !(allowed[j] & 1)) {
      s[j] = -INFINITY;
    } else if (c.score_mods) {
      s[j] = static_cast<float>(
          modified_score(*p.mods, *p.mask, additive, b, row.h, row.i, j0 + j, s[j]));
    }
  }
}

// A key tile's K and V rows; with K and V in place, also the next tile's key rows (up to the walk's
// end), which its value pass requests (RowRequests).
struct TileSources {
  TileSource k, v, next_k;
  bool in_step = false;  // K and V in place: each pass requests the other stream's rows

  const TileSource* values() const { return in_step ? &v : nullptr; }
  const TileSource* next_keys() const { return in_step && next_k.count > 0 ? &next_k : nullptr; }
};
TileSources SourcesOf(const Problem& p, int64_t b, int64_t g, int64_t j0, int64_t count,
                      int64_t k_end, int64_t walk_end, Scratch& scratch) {
  TileSources tile;
  tile.k = SourceTile(p, true, b, g, j0, count, k_end, scratch.k);
  tile.v = SourceTile(p, false, b, g, j0, count, k_end, scratch.v);
  tile.in_step = p.pages == nullptr && p.k.stride(3) == 1 && p.v.stride(3) == 1;
  const int64_t next = j0 + count;
  if (tile.in_step && next < walk_end) {
    tile.next_k =
        SourceTile(p, true, b, g, next, std::min(kTileK, walk_end - next), k_end, nullptr);
  }
  return tile;
}

// The row kernel: for each key tile any row may see, scores, one online-softmax step per row
// (rescaling its output by α), and O += P·V with each value row read once for all rows.
void AttendRows(const Context& c, int64_t b, const Row* rows, int64_t row_count, int64_t k_first,
                int64_t k_end, bool with_sink, Scratch& scratch) {
  const Problem& p = *c.problem;
  const int64_t g = p.kv_head(rows[0].h);
  StartRows(c, b, rows, row_count, with_sink, scratch);
  const BlockMap::TileRange band = UnionOfBands(c, b, rows, row_count);
  const int64_t k_tile_end = std::min(band.end, (k_end + kTileK - 1) / kTileK);
  for (int64_t k_tile = std::max(band.first, k_first / kTileK); k_tile < k_tile_end; ++k_tile) {
    const int64_t j0 = k_tile * kTileK;
    const int64_t count = std::min(kTileK, k_end - j0);
    TileKind kinds[kMaxRows];
    bool any = false;
    for (int64_t r = 0; r < row_count; ++r) {
      kinds[r] = c.blocks->kind(b, rows[r].h, rows[r].i / kTileQ, k_tile);
      any |= kinds[r] != TileKind::empty;
    }
    if (!any) continue;
    const TileSources tile =
        SourcesOf(p, b, g, j0, count, k_end, std::min(k_end, k_tile_end * kTileK), scratch);
    for (int64_t r = 0; r < row_count; ++r) {
      RowScores(c, b, rows[r], r, kinds[r], tile.k, tile.values(), j0, count, scratch);
      const float alpha = SoftmaxStepRow<kTileK>(scratch.s + r * kTileK, scratch.row_max[r],
                                                 scratch.row_sum[r], scratch.poisoned[r]);
      if (p.dropout.on) {  // dropped pairs get weight 0 (P·V skips them); 1/(1 − p') at the end
        const uint64_t keep =
            DropoutRowBitsAt(p.dropout, static_cast<uint32_t>(b * p.q_heads + rows[r].h),
                             rows[r].i + p.mask->q_origin(), j0 + p.mask->k_origin());
        ApplyDropoutRows(&keep, 1, 1.0f, scratch.s + r * kTileK);
      }
      if (alpha != 1.0f) {
        float* out = scratch.out + r * p.value_dim;
        for (int64_t e = 0; e < p.value_dim; ++e) out[e] *= alpha;
      }
    }
    for (int64_t r = 0; r < row_count; ++r) {
      AccumulateTile(tile.v, p.value_dim, scratch.s + r * kTileK, scratch.out + r * p.value_dim,
                     r == 0, tile.next_keys());
    }
  }
  for (int64_t r = 0; r < row_count; ++r) {
    const RowEnd end = EndOfRow(scratch.row_max[r], scratch.row_sum[r], scratch.poisoned[r]);
    float* out = scratch.out + r * p.value_dim;
    if (end.normalise && p.dropout.on) {
      const float factor = p.dropout.keep_scale_f32 / scratch.row_sum[r];
      for (int64_t e = 0; e < p.value_dim; ++e) out[e] *= factor;
    } else if (end.normalise) {
      for (int64_t e = 0; e < p.value_dim; ++e) out[e] /= scratch.row_sum[r];
    } else {
      std::fill(out, out + p.value_dim, end.fill);
    }
    scratch.lse[r] = end.lse;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace maskattn::detail::fused
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace maskattn::detail::fused {

HWY_EXPORT(AttendRows);

void attend_rows(const Context& context, int64_t b, const Row* rows, int64_t row_count,
                 int64_t k_first, int64_t k_end, bool with_sink, Scratch& scratch) {
  HWY_DYNAMIC_DISPATCH(AttendRows)(context, b, rows, row_count, k_first, k_end, with_sink, scratch);
}

}  // namespace maskattn::detail::fused
#endif  // HWY_ONCE
