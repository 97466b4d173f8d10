#include "mask/block_map.h"
#include "mask/program_scan.h"

#include <algorithm>
#include <cmath>

namespace maskattn::detail {

namespace {

using Form = component::Padding::Form;

// Folds one component's kind into the block's: empty wins, then partial.
void fold(TileKind& block, TileKind part) {
  if (part == TileKind::empty || block == TileKind::empty) {
    block = TileKind::empty;
  } else if (part == TileKind::partial) {
    block = TileKind::partial;
  }
}

TileKind from_count(int64_t count, int64_t size) {
  if (count == 0) return TileKind::empty;
  return count == size ? TileKind::full : TileKind::partial;
}

// Two id ranges (segments, chunks): one shared id → every pair matches; disjoint → none does.
TileKind match_kind(BlockMap::Range q, BlockMap::Range k) {
  if (q.lo == q.hi && k.lo == k.hi && q.lo == k.lo) return TileKind::full;
  if (q.hi < k.lo || k.hi < q.lo) return TileKind::empty;
  return TileKind::partial;
}

// Min/max id of every tile of every sequence of a [B, L] id array, for tiles of rows
// [origin, end) (a call's slice of the global rows).
std::vector<BlockMap::Range> tile_ranges(const Array<int64_t>& ids, int64_t tile, int64_t tiles,
                                         int64_t origin, int64_t end) {
  const int64_t batch = ids.dim(0);
  std::vector<BlockMap::Range> ranges(batch * tiles);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < tiles; ++t) {
      BlockMap::Range& range = ranges[b * tiles + t];
      range = {INT64_MAX, INT64_MIN};
      for (int64_t i = origin + t * tile; i < std::min(end, origin + (t + 1) * tile); ++i) {
        range.lo = std::min(range.lo, ids.at(b, i));
        range.hi = std::max(range.hi, ids.at(b, i));
      }
    }
  }
  return ranges;
}

// Prefix sums of real tokens for keep-vector and token-id padding ([B, L + 1]: real tokens among
// [0, t) of sequence b at b * (L + 1) + t); empty for lengths and starts, which need none.
std::vector<int64_t> real_token_prefix(const component::Padding& padding, int64_t batch,
                                       int64_t length) {
  std::vector<int64_t> prefix;
  if (padding.form == Form::keep || padding.form == Form::token_ids) {
    prefix.assign(batch * (length + 1), 0);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < length; ++t) {
        const int64_t value = padding.values.at(b, t);
        const bool real = padding.form == Form::keep ? value != 0 : value != padding.pad_id;
        prefix[b * (length + 1) + t + 1] = prefix[b * (length + 1) + t] + real;
      }
    }
  }
  return prefix;
}

// The kind of every block of a [batch, heads] grid, from every pair of it:
// classify_pair(b, h, i, j, any_hidden, any_allowed, any_work) sets what the pair shows.
// Pairs are given in global rows.
template <typename ClassifyPair>
ScannedKinds scan_tiles(const BlockMap& map, int64_t batch, int64_t heads,
                        ClassifyPair&& classify_pair) {
  ScannedKinds kinds;
  kinds.batch = batch;
  kinds.heads = heads;
  kinds.q_tiles = map.q_tiles();
  kinds.k_tiles = map.k_tiles();
  kinds.kinds.resize(batch * heads * kinds.q_tiles * kinds.k_tiles);
  size_t n = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t qt = 0; qt < kinds.q_tiles; ++qt) {
        for (int64_t kt = 0; kt < kinds.k_tiles; ++kt) {
          bool any_hidden = false, any_allowed = false, any_work = false;
          for (int64_t i = map.q_first(qt); i < map.q_end(qt); ++i) {
            for (int64_t j = map.k_first(kt); j < map.k_end(kt); ++j) {
              classify_pair(b, h, i, j, any_hidden, any_allowed, any_work);
            }
          }
          kinds.kinds[n++] = !any_allowed             ? TileKind::empty
                             : any_hidden || any_work ? TileKind::partial
                                                      : TileKind::full;
        }
      }
    }
  }
  return kinds;
}

}  // namespace

BlockMap::BlockMap(const ResolvedMask& mask, int64_t tile_q, int64_t tile_k, bool skipping,
                   bool global_queries_apart)
    : mask_(mask),
      tile_q_(tile_q),
      tile_k_(tile_k),
      q_tiles_((mask.shape().q_len + tile_q - 1) / tile_q),
      k_tiles_((mask.shape().k_len + tile_k - 1) / tile_k),
      skipping_(skipping),
      global_queries_apart_(global_queries_apart),
      trees_(mask, tile_q, tile_k) {
  if (!skipping_) return;
  const MaskShape& shape = mask.global_shape();
  for (const component::Padding* padding : mask.query_padding_) {
    query_counts_.push_back({padding, real_token_prefix(*padding, shape.batch, shape.q_len)});
  }
  for (const component::Padding* padding : mask.key_padding_) {
    key_counts_.push_back({padding, real_token_prefix(*padding, shape.batch, shape.k_len)});
  }
  const int64_t q_rows_end = q_origin() + mask.shape().q_len;
  const int64_t k_rows_end = k_origin() + mask.shape().k_len;
  for (const component::Segments* segments : mask.segments_) {
    segment_q_.push_back(
        tile_ranges(segments->query_ids, tile_q_, q_tiles_, q_origin(), q_rows_end));
    segment_k_.push_back(tile_ranges(segments->key_ids, tile_k_, k_tiles_, k_origin(), k_rows_end));
  }
  count_global_tokens();
  scan_data_components();
  classify_layouts();
}

ScanGrid BlockMap::grid() const {
  return {mask_.shape(), mask_.global_shape(), q_origin(), k_origin(), tile_q_, tile_k_};
}

void BlockMap::count_global_tokens() {
  const MaskShape& shape = mask_.global_shape();
  const auto prefix_of = [](const Array<int64_t>& ids) {
    const int64_t rows = ids.dim(0), length = ids.dim(1);
    std::vector<int64_t> prefix(rows * (length + 1), 0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t t = 0; t < length; ++t) {
        prefix[r * (length + 1) + t + 1] = prefix[r * (length + 1) + t] + (ids.at(r, t) != 0);
      }
    }
    return prefix;
  };
  for (const component::GlobalTokens* global : mask_.globals_) {
    GlobalCounts counts{global, prefix_of(global->query_ids), prefix_of(global->key_ids), {}};
    for (int64_t b = 0; b < shape.batch; ++b) {
      Range span{INT64_MAX, INT64_MIN};
      for (int64_t j = 0; j < shape.k_len; ++j) {
        if (!ResolvedMask::is_global(global->key_ids, b, j)) continue;
        span.lo = std::min(span.lo, j);
        span.hi = j;
      }
      counts.key_span.push_back(span);
    }
    global_counts_.push_back(std::move(counts));
  }
}

// A layout block covers whole kernel tiles or parts of them: a tile is full when every layout
// block it overlaps is on, empty when every one is off. O(blocks) per tile, no element touched.
void BlockMap::classify_layouts() {
  const MaskShape& shape = mask_.global_shape();
  ScanCache& cache = MaskInternals::scan_cache(*mask_.mask_);
  for (const ResolvedMask::LayoutRef& layout : mask_.layouts_) {
    const int64_t block_q = layout.sparse->block_q, block_k = layout.sparse->block_k;
    const int64_t batch = layout.index.stride[0] == 0 ? 1 : shape.batch;
    const int64_t heads = layout.index.stride[1] == 0 ? 1 : shape.q_heads;
    auto kinds = cache.get(grid(), layout.component, [&] {
      ScannedKinds scanned{batch, heads, q_tiles_, k_tiles_, {}};
      scanned.kinds.reserve(batch * heads * q_tiles_ * k_tiles_);
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t qt = 0; qt < q_tiles_; ++qt) {
            const int64_t qb_first = q_first(qt) / block_q;
            const int64_t qb_last = (q_end(qt) - 1) / block_q;
            for (int64_t kt = 0; kt < k_tiles_; ++kt) {
              const int64_t kb_first = k_first(kt) / block_k;
              const int64_t kb_last = (k_end(kt) - 1) / block_k;
              int64_t on = 0;
              for (int64_t qb = qb_first; qb <= qb_last; ++qb) {
                for (int64_t kb = kb_first; kb <= kb_last; ++kb) {
                  on += layout.allows_block(b, h, qb, kb);
                }
              }
              scanned.kinds.push_back(
                  from_count(on, (qb_last - qb_first + 1) * (kb_last - kb_first + 1)));
            }
          }
        }
      }
      return scanned;
    });
    scanned_.push_back(kinds);
    layout_rows_.push_back(rows_of(kinds));
  }
}

// Per row of the kinds (b, h, query tile): the key tiles from the first to the last non-empty one.
BlockMap::LayoutRows BlockMap::rows_of(std::shared_ptr<const ScannedKinds> kinds) const {
  LayoutRows rows{kinds, {}};
  for (int64_t row = 0; row < kinds->batch * kinds->heads * q_tiles_; ++row) {
    TileRange range{0, 0};
    const TileKind* first = kinds->kinds.data() + row * k_tiles_;
    int64_t kt = 0;
    while (kt < k_tiles_ && first[kt] == TileKind::empty) ++kt;
    if (kt < k_tiles_) {
      int64_t end = k_tiles_;
      while (first[end - 1] == TileKind::empty) --end;
      range = {kt, end};
    }
    rows.rows.push_back(range);
  }
  return rows;
}

void BlockMap::scan_data_components() {
  // One scan per problem size, kept in the Mask's cache.
  const ResolvedMask& mask = mask_;
  const MaskShape& shape = mask.global_shape();
  ScanCache& cache = MaskInternals::scan_cache(*mask.mask_);
  // A dense mask broadcast along an axis is scanned once along it.
  const auto extent = [&](const BroadcastStrides& index, int axis, int64_t size) {
    return index.stride[axis] == 0 ? int64_t{1} : size;
  };
  for (const ResolvedMask::DenseRef& dense : mask.dense_bool_) {
    scanned_.push_back(cache.get(grid(), dense.component, [&] {
      const auto* values = static_cast<const uint8_t*>(dense.values);
      return scan_tiles(
          *this, extent(dense.index, 0, shape.batch), extent(dense.index, 1, shape.q_heads),
          [&](int64_t b, int64_t h, int64_t i, int64_t j, bool& hidden, bool& allowed, bool&) {
            const bool on = (values[dense.index.offset(b, h, i, j)] != 0) != dense.blocked;
            (on ? allowed : hidden) = true;
          });
    }));
  }
  for (const ResolvedMask::DenseRef& dense : mask.additive_) {
    scanned_.push_back(cache.get(grid(), dense.component, [&] {
      const auto* values = static_cast<const float*>(dense.values);
      return scan_tiles(
          *this, extent(dense.index, 0, shape.batch), extent(dense.index, 1, shape.q_heads),
          [&](int64_t b, int64_t h, int64_t i, int64_t j, bool& hidden, bool& allowed, bool& work) {
            const float value = values[dense.index.offset(b, h, i, j)];
            if (value == -INFINITY) {
              hidden = true;
            } else {
              allowed = true;
              work |= value != 0.0f;  // a value to add: not a mask-free block
            }
          });
    }));
  }
  for (const ResolvedMask::PredicateRef& ref : mask.predicates_) {
    scanned_.push_back(cache.get(grid(), ref.component, [&] {
      return scan_tiles(
          *this, shape.batch, shape.q_heads,
          [&](int64_t b, int64_t h, int64_t i, int64_t j, bool& hidden, bool& allowed, bool&) {
            (ref.predicate->allows(b, h, i, j) ? allowed : hidden) = true;
          });
    }));
  }
  // Programs: a tile at a time (mask_tile), over the axes the program reads; they bound the key
  // tiles of each query tile as layouts do.
  for (const ResolvedMask::ProgramRef& ref : mask.programs_) {
    const int64_t batch = ref.program->depends_on_batch() ? shape.batch : 1;
    const int64_t heads = ref.program->depends_on_head() ? shape.q_heads : 1;
    auto kinds = cache.get(grid(), ref.component,
                           [&] { return scan_program(*this, *ref.program, batch, heads); });
    scanned_.push_back(kinds);
    layout_rows_.push_back(rows_of(kinds));
  }
}

TileKind BlockMap::padding_kind(const component::Padding& padding, const PaddingCounts* counts,
                                int64_t b, int64_t first, int64_t end, int64_t length) const {
  int64_t real = 0;
  switch (padding.form) {
    case Form::lengths:
      real = std::max<int64_t>(0, std::min(end, padding.values.values()[b]) - first);
      break;
    case Form::starts:
      real = std::max<int64_t>(0, end - std::max(first, padding.values.values()[b]));
      break;
    case Form::keep:
    case Form::token_ids: {
      const int64_t* prefix = counts->prefix.data() + b * (length + 1);
      real = prefix[end] - prefix[first];
      break;
    }
  }
  return from_count(real, end - first);
}

TileKind BlockMap::order_kind(int64_t b, int64_t h, int64_t q_first, int64_t q_end, int64_t k_first,
                              int64_t k_end) const {
  // Over the block, distance = qpos − kpos ranges over [d_min, d_max].
  const int64_t d_min = mask_.global_qpos(b, q_first) - mask_.global_kpos(b, k_end - 1);
  const int64_t d_max = mask_.global_qpos(b, q_end - 1) - mask_.global_kpos(b, k_first);
  TileKind kind = TileKind::full;
  for (const component::Window* window : mask_.windows_) {
    if (!window->heads.contains(h)) continue;
    if (d_max < -window->right || d_min > window->left) {
      kind = TileKind::empty;
    } else if (d_min < -window->right || d_max > window->left) {
      if (kind == TileKind::full) kind = TileKind::partial;
    }
  }
  if (kind == TileKind::full) return kind;
  // Spans, prefix-LM and global tokens can allow pairs the windows hide.
  const TileKind global = global_kind(b, h, q_first, q_end, k_first, k_end);
  if (global == TileKind::full) return global;
  if (global == TileKind::partial) kind = TileKind::partial;
  for (const component::Spans* spans : mask_.spans_) {
    if (spans->heads.contains(h)) return TileKind::partial;
  }
  for (const component::Prefix* prefix : mask_.prefixes_) {
    if (!prefix->heads.contains(h)) continue;
    const bool queries_in =
        mask_.global_qpos(b, q_end - 1) >= 0 && mask_.global_qpos(b, q_first) < prefix->length;
    const bool keys_in =
        mask_.global_kpos(b, k_end - 1) >= 0 && mask_.global_kpos(b, k_first) < prefix->length;
    if (queries_in && keys_in) return TileKind::partial;
  }
  return kind;
}

TileKind BlockMap::global_kind(int64_t b, int64_t h, int64_t q_first, int64_t q_end,
                               int64_t k_first, int64_t k_end) const {
  TileKind kind = TileKind::empty;
  const MaskShape& shape = mask_.global_shape();
  for (const GlobalCounts& counts : global_counts_) {
    if (!counts.global->heads.contains(h)) continue;
    const int64_t q_row = ResolvedMask::global_row(counts.global->query_ids, b);
    const int64_t k_row = ResolvedMask::global_row(counts.global->key_ids, b);
    const int64_t* queries = counts.queries.data() + q_row * (shape.q_len + 1);
    const int64_t* keys = counts.keys.data() + k_row * (shape.k_len + 1);
    const int64_t global_queries = global_queries_apart_ ? 0 : queries[q_end] - queries[q_first];
    const int64_t global_keys = keys[k_end] - keys[k_first];
    if (global_queries == q_end - q_first || global_keys == k_end - k_first) return TileKind::full;
    if (global_queries > 0 || global_keys > 0) kind = TileKind::partial;
  }
  return kind;
}

bool BlockMap::windows_relaxed(int64_t h) const {
  bool relaxed = false;  // spans or prefix-LM may allow pairs anywhere outside the windows
  for (const component::Spans* spans : mask_.spans_) relaxed |= spans->heads.contains(h);
  for (const component::Prefix* prefix : mask_.prefixes_) relaxed |= prefix->heads.contains(h);
  return relaxed;
}

BlockMap::Range BlockMap::window_band(int64_t b, int64_t h, int64_t q_tile, Range keys) const {
  if (windows_relaxed(h)) return keys;
  const int64_t qpos_lo = mask_.global_qpos(b, q_first(q_tile));
  const int64_t qpos_hi = mask_.global_qpos(b, q_end(q_tile) - 1);
  const int64_t to_index = -mask_.global_kpos(b, 0);  // key row = kpos + to_index
  for (const component::Window* window : mask_.windows_) {
    if (!window->heads.contains(h)) continue;
    // qpos − left ≤ kpos ≤ qpos + right for some qpos in [qpos_lo, qpos_hi].
    keys.lo = std::max(keys.lo, saturating_add(saturating_add(qpos_lo, -window->left), to_index));
    keys.hi = std::min(keys.hi, saturating_add(saturating_add(qpos_hi, window->right), to_index));
  }
  return keys;
}

bool BlockMap::holds_global_query(const GlobalCounts& counts, int64_t b, int64_t q_tile) const {
  if (global_queries_apart_) return false;
  const int64_t q_row = ResolvedMask::global_row(counts.global->query_ids, b);
  const int64_t* queries = counts.queries.data() + q_row * (mask_.global_shape().q_len + 1);
  return queries[q_end(q_tile)] > queries[q_first(q_tile)];
}

BlockMap::TileRange BlockMap::k_tile_range(int64_t b, int64_t h, int64_t q_tile) const {
  if (!skipping_) return {0, k_tiles_};
  const MaskShape& shape = mask_.global_shape();
  // Keys [lo, hi] (global rows) that some query of the tile may see; narrowed component by
  // component, starting from the call's keys.
  int64_t lo = k_origin(), hi = k_origin() + mask_.shape().k_len - 1;
  for (const component::Padding* padding : mask_.key_padding_) {
    if (padding->form == Form::lengths) hi = std::min(hi, padding->values.values()[b] - 1);
    if (padding->form == Form::starts) lo = std::max(lo, padding->values.values()[b]);
  }
  const int64_t q_last = q_end(q_tile) - 1;
  const int64_t qpos_lo = mask_.global_qpos(b, q_first(q_tile));
  const int64_t qpos_hi = mask_.global_qpos(b, q_last);
  const int64_t to_index = -mask_.global_kpos(b, 0);  // key row = kpos + to_index
  // Keys [band.lo, band.hi] inside every window, widened by what global tokens allow: every key
  // for a tile holding a global query, else also the first to the last global key.
  Range band = window_band(b, h, q_tile, {lo, hi});
  for (const GlobalCounts& counts : global_counts_) {
    if (!counts.global->heads.contains(h)) continue;
    const Range keys = counts.key_span[b];
    if (holds_global_query(counts, b, q_tile)) {
      band = {0, shape.k_len - 1};
    } else if (keys.lo <= keys.hi) {
      const bool band_empty = band.hi < band.lo;
      band.lo = band_empty ? keys.lo : std::min(band.lo, keys.lo);
      band.hi = band_empty ? keys.hi : std::max(band.hi, keys.hi);
    }
  }
  lo = std::max(lo, band.lo);
  hi = std::min(hi, band.hi);
  for (const component::Chunk* chunk : mask_.chunks_) {
    if (!chunk->heads.contains(h)) continue;
    lo = std::max(lo, floor_div(qpos_lo, chunk->size) * chunk->size + to_index);
    hi = std::min(hi, (floor_div(qpos_hi, chunk->size) + 1) * chunk->size - 1 + to_index);
  }
  hi = std::min(hi, trees_.last_key(h, q_last));
  if (hi < lo) return {0, 0};
  TileRange range = {(lo - k_origin()) / tile_k_, (hi - k_origin()) / tile_k_ + 1};
  for (const LayoutRows& layout : layout_rows_) {
    const TileRange row = layout.at(b, h, q_tile);
    range = {std::max(range.first, row.first), std::min(range.end, row.end)};
  }
  return range.first < range.end ? range : TileRange{0, 0};
}

int64_t BlockMap::next_candidate(int64_t b, int64_t h, int64_t q_tile, int64_t k_tile) const {
  if (!skipping_ || k_tile >= k_tiles_) return k_tile;
  int64_t next = std::max(k_tile, next_global_candidate(b, h, q_tile, k_tile));
  for (const auto& scanned : scanned_) {
    while (next < k_tiles_ && scanned->at(b, h, q_tile, next) == TileKind::empty) ++next;
  }
  return next;
}

// Outside the windows' band of a query tile holding no global query, only a tile holding a global
// key can have an allowed pair (order_kind): the next such tile, or the band.
int64_t BlockMap::next_global_candidate(int64_t b, int64_t h, int64_t q_tile,
                                        int64_t k_tile) const {
  if (global_counts_.empty()) return k_tile;
  const int64_t k_len = mask_.global_shape().k_len;
  const Range band = window_band(b, h, q_tile, {k_origin(), k_origin() + mask_.shape().k_len - 1});
  if (band.lo <= k_first(k_tile) && k_first(k_tile) <= band.hi) return k_tile;
  int64_t next =
      band.lo > k_first(k_tile) && band.lo <= band.hi ? (band.lo - k_origin()) / tile_k_ : k_tiles_;
  for (const GlobalCounts& counts : global_counts_) {
    if (!counts.global->heads.contains(h)) continue;
    if (holds_global_query(counts, b, q_tile)) return k_tile;
    const int64_t k_row = ResolvedMask::global_row(counts.global->key_ids, b);
    const int64_t* keys = counts.keys.data() + k_row * (k_len + 1);
    // The first global key at or after the tile's first key: keys[] is a non-decreasing prefix
    // count, so the first count above keys[first] ends at it.
    const int64_t first = k_first(k_tile);
    const int64_t* above = std::upper_bound(keys + first + 1, keys + k_len + 1, keys[first]);
    if (above == keys + k_len + 1) continue;
    const int64_t key = (above - keys) - 1;
    next = std::min(next, (key - k_origin()) / tile_k_);
  }
  return std::min(next, k_tiles_);
}

BlockMap::TileRange BlockMap::key_rows(int64_t b, int64_t h, int64_t q_tile, int64_t k_tile) const {
  const int64_t k_first = this->k_first(k_tile), k_end = this->k_end(k_tile);
  const TileRange whole = {0, k_end - k_first};
  if (!skipping_ || !global_queries_see_every_key(mask_)) return whole;
  // Keys [lo, hi] (global rows): inside every window for some query of the tile...
  Range keys = window_band(b, h, q_tile, {k_first, k_end - 1});
  const MaskShape& shape = mask_.global_shape();
  for (const GlobalCounts& counts : global_counts_) {
    if (!counts.global->heads.contains(h)) continue;
    const int64_t q_row = ResolvedMask::global_row(counts.global->query_ids, b);
    const int64_t* queries = counts.queries.data() + q_row * (shape.q_len + 1);
    if (queries[q_end(q_tile)] > queries[q_first(q_tile)]) return whole;
    // ...or from the first to the last global key of the tile: in the non-decreasing prefix
    // counts, the first count above keys[k_first] ends at the first one, and the first count equal
    // to keys[k_end] ends just past the last one.
    const int64_t k_row = ResolvedMask::global_row(counts.global->key_ids, b);
    const int64_t* prefix = counts.keys.data() + k_row * (shape.k_len + 1);
    if (prefix[k_end] == prefix[k_first]) continue;
    const int64_t first =
        std::upper_bound(prefix + k_first + 1, prefix + k_end + 1, prefix[k_first]) - prefix - 1;
    const int64_t last =
        std::lower_bound(prefix + k_first + 1, prefix + k_end + 1, prefix[k_end]) - prefix - 1;
    const bool none_yet = keys.hi < keys.lo;
    keys.lo = none_yet ? first : std::min(keys.lo, first);
    keys.hi = none_yet ? last : std::max(keys.hi, last);
  }
  keys.lo = std::max(keys.lo, k_first);
  keys.hi = std::min(keys.hi, k_end - 1);
  if (keys.hi < keys.lo) return {0, 0};
  return {keys.lo - k_first, keys.hi - k_first + 1};
}

TileKind BlockMap::kind(int64_t b, int64_t h, int64_t q_tile, int64_t k_tile) const {
  if (!skipping_) return TileKind::partial;
  const MaskShape& shape = mask_.global_shape();
  const int64_t q_first = this->q_first(q_tile), q_end = this->q_end(q_tile);
  const int64_t k_first = this->k_first(k_tile), k_end = this->k_end(k_tile);
  TileKind kind = TileKind::full;
  for (const PaddingCounts& counts : query_counts_) {
    fold(kind, padding_kind(*counts.padding, &counts, b, q_first, q_end, shape.q_len));
  }
  for (const PaddingCounts& counts : key_counts_) {
    fold(kind, padding_kind(*counts.padding, &counts, b, k_first, k_end, shape.k_len));
  }
  if (kind == TileKind::empty) return kind;
  fold(kind, order_kind(b, h, q_first, q_end, k_first, k_end));
  for (const component::Chunk* chunk : mask_.chunks_) {
    if (!chunk->heads.contains(h)) continue;
    fold(kind, match_kind({floor_div(mask_.global_qpos(b, q_first), chunk->size),
                           floor_div(mask_.global_qpos(b, q_end - 1), chunk->size)},
                          {floor_div(mask_.global_kpos(b, k_first), chunk->size),
                           floor_div(mask_.global_kpos(b, k_end - 1), chunk->size)}));
  }
  for (size_t n = 0; n < mask_.segments_.size(); ++n) {
    if (!mask_.segments_[n]->heads.contains(h)) continue;
    const Range q = segment_q_[n][b * q_tiles_ + q_tile];
    const Range k = segment_k_[n][b * k_tiles_ + k_tile];
    fold(kind, match_kind({q.lo, q.hi}, {k.lo, k.hi}));
  }
  fold(kind, trees_.kind(b, h, q_tile, k_tile, q_first, q_end, k_first, k_end));
  for (const auto& scanned : scanned_) fold(kind, scanned->at(b, h, q_tile, k_tile));
  return kind;
}

bool BlockMap::global_queries_see_every_key(const ResolvedMask& mask) {
  // order_bits (tile_mask.cc): windows are the only components a global query's row ignores.
  return !mask.globals_.empty() && mask.key_padding_.empty() && mask.query_padding_.empty() &&
         mask.chunks_.empty() && mask.segments_.empty() && mask.spans_.empty() &&
         mask.prefixes_.empty() && mask.layouts_.empty() && mask.dense_bool_.empty() &&
         mask.additive_.empty() && mask.predicates_.empty() && mask.programs_.empty() &&
         mask.trees_.empty();
}

std::vector<int64_t> BlockMap::global_query_rows(const ResolvedMask& mask, int64_t b, int64_t h) {
  std::vector<const component::GlobalTokens*> of_head;
  for (const component::GlobalTokens* global : mask.globals_) {
    if (global->heads.contains(h)) of_head.push_back(global);
  }
  std::vector<int64_t> rows;
  if (of_head.empty()) return rows;
  for (int64_t i = 0; i < mask.shape().q_len; ++i) {
    for (const component::GlobalTokens* global : of_head) {
      if (ResolvedMask::is_global(global->query_ids, b, i + mask.q_origin())) {
        rows.push_back(i);
        break;
      }
    }
  }
  return rows;
}

}  // namespace maskattn::detail
