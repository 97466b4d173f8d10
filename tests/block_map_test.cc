// The block map and the partial-block element mask: classifications agree with the element grid,
// structured masks skip what they should, and bit rows reproduce allowed_pairs exactly.
#include <cmath>

#include "mask/block_map.h"
#include "mask/tile_mask.h"
#include "test_util.h"

namespace maskattn {
namespace {

using detail::TileKind;

struct Case {
  const char* name;
  Mask mask;
};

// A catalogue of masks over B = 2, Hq = 3 with Lq, Lk given; every component appears.
std::vector<Case> catalogue(int64_t lq, int64_t lk) {
  std::vector<int64_t> seg_q, seg_k, span_q, span_k, q_keep, k_ids;
  std::vector<uint8_t> dense;
  std::vector<float> additive;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t i = 0; i < lq; ++i) {
      seg_q.push_back((i + b) / 5);
      span_q.push_back(i % 7 < 3 ? 1 : 0);
      q_keep.push_back(i % 9 != 4);
    }
    for (int64_t j = 0; j < lk; ++j) {
      seg_k.push_back((j + b) / 5);
      span_k.push_back(j % 7 < 3 ? 1 : 0);
      k_ids.push_back(j % 11 == 10 ? 0 : 1 + j);
    }
  }
  for (int64_t n = 0; n < 2 * lq * lk; ++n) dense.push_back((n / 7) % 3 != 0);
  std::vector<int64_t> doc;  // documents of 6 rows, over max(Lq, Lk) rows, for a program
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < std::max(lq, lk); ++t) doc.push_back((t + 2 * b) / 6);
  }
  std::vector<int64_t> global_q, global_k;  // the first token and every 9th of each sequence
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t i = 0; i < lq; ++i) global_q.push_back((i + b) % 9 == 0);
    for (int64_t j = 0; j < lk; ++j) global_k.push_back((j + b) % 9 == 0);
  }
  std::vector<uint8_t> layout, rows;
  for (int64_t n = 0; n < 3 * ((lq + 2) / 3) * ((lk + 1) / 2); ++n) layout.push_back(n % 5 < 2);
  for (int64_t n = 0; n < 2 * ((lq + 3) / 4); ++n) rows.push_back(n % 3 != 1);
  for (int64_t n = 0; n < 3 * lk; ++n) additive.push_back(n % 4 == 0 ? -INFINITY : (n % 3) * 0.5f);
  return {
      {"none", Mask()},
      {"causal", Mask().causal()},
      {"causal top-left", Mask().causal(Alignment::top_left)},
      {"window(5,2)", Mask().window(5, 2)},
      {"sliding_window(9) & chunk(7)", Mask().sliding_window(9).chunk(7)},
      {"ragged", Mask().causal().key_lengths({lk, lk / 2}).query_lengths({lq, lq / 3})},
      {"left padding", Mask().causal().key_starts({3, 0}).chunk(6)},
      {"keep & ids", Mask()
                         .query_keep(Array<int64_t>({2, lq}, q_keep))
                         .key_pad_id(Array<int64_t>({2, lk}, k_ids), 0)},
      {"segments",
       Mask().causal().segments(Array<int64_t>({2, lq}, seg_q), Array<int64_t>({2, lk}, seg_k))},
      {"spans",
       Mask().causal().spans(Array<int64_t>({2, lq}, span_q), Array<int64_t>({2, lk}, span_k))},
      {"prefix & window", Mask().sliding_window(4).prefix_lm(6)},
      {"window(unbounded, 4), window(2, 2⁶²) & prefix",
       Mask().window(kUnbounded, 4).window(2, int64_t{1} << 62, HeadSet{1}).prefix_lm(3)},
      {"per head", Mask().causal(HeadSet{0}).window(3, 0, HeadSet{2}).chunk(8, HeadSet{1})},
      {"dense keep [B,1,Lq,Lk]", Mask().keep(Array<uint8_t>({2, 1, lq, lk}, dense))},
      {"additive [Hq,1,Lk]", Mask().additive(Array<float>({3, 1, lk}, additive))},
      {"predicate", Mask().predicate([](int64_t b, int64_t h, int64_t i, int64_t j) {
         return (i / 3 + j / 4 + b + h) % 3 != 0;
       })},
      {"program", Mask().program("(q // 3 + kv // 4 + b + h) % 3 != 0")},
      {"program & causal & ragged",
       Mask()
           .causal()
           .key_lengths({lk, lk / 2})
           .program("doc[b, q] == doc[b, kv]",
                    {ProgramTable::own("doc", doc, {2, std::max(lq, lk)})})},
      {"global & window", Mask().window(3, 1).global_tokens(Array<int64_t>({2, lq}, global_q),
                                                            Array<int64_t>({2, lk}, global_k))},
      {"global [L] & causal @1 & chunk",
       Mask().causal().chunk(11).global_tokens(
           Array<int64_t>({lq}, {global_q.begin(), global_q.begin() + lq}),
           Array<int64_t>({lk}, {global_k.begin(), global_k.begin() + lk}), HeadSet{1})},
      {"block-sparse [Hq,nQ,nK] 3x2",
       Mask().block_sparse(Array<uint8_t>({3, (lq + 2) / 3, (lk + 1) / 2}, layout), 3, 2)},
      {"block-sparse [B,1,nQ,1] 4x64 & causal",
       Mask().causal().block_sparse(Array<uint8_t>({2, 1, (lq + 3) / 4, 1}, rows), 4, 64)},
  };
}

TEST(BlockMap, ClassificationsAgreeWithTheElementGrid) {
  for (const auto& [lq, lk, tq, tk] : {std::array<int64_t, 4>{23, 23, 4, 4},
                                       {17, 31, 3, 5},
                                       {31, 12, 8, 4},
                                       {64, 64, 16, 16},
                                       {130, 140, 100, 70}}) {
    for (const Case& c : catalogue(lq, lk)) {
      const MaskShape shape = {2, 3, lq, lk};
      const Array<uint8_t> allowed = allowed_pairs(c.mask, shape);
      const Array<uint8_t> map = block_map(c.mask, shape, tq, tk);
      const int64_t q_tiles = map.dim(2), k_tiles = map.dim(3);
      int64_t counts[3] = {0, 0, 0};
      for (int64_t b = 0; b < 2; ++b) {
        for (int64_t h = 0; h < 3; ++h) {
          for (int64_t qt = 0; qt < q_tiles; ++qt) {
            for (int64_t kt = 0; kt < k_tiles; ++kt) {
              const auto kind =
                  static_cast<TileKind>(map.values()[((b * 3 + h) * q_tiles + qt) * k_tiles + kt]);
              ++counts[static_cast<int>(kind)];
              int64_t on = 0, size = 0;
              for (int64_t i = qt * tq; i < std::min(lq, (qt + 1) * tq); ++i) {
                for (int64_t j = kt * tk; j < std::min(lk, (kt + 1) * tk); ++j) {
                  on += allowed.values()[((b * 3 + h) * lq + i) * lk + j];
                  ++size;
                }
              }
              const int64_t expected_on = kind == TileKind::empty  ? 0
                                          : kind == TileKind::full ? size
                                                                   : on;
              ASSERT_EQ(on, expected_on)
                  << c.name << " b" << b << " h" << h << " tile " << qt << "," << kt;
            }
          }
        }
      }
      if (std::string(c.name) == "causal" && lq == lk) {
        EXPECT_GT(counts[0], 0) << "causal must skip blocks above the diagonal";
        EXPECT_GT(counts[1], 0) << "causal must have mask-free blocks below the diagonal";
      }
    }
  }
}

TEST(BlockMap, NextCandidateSkipsOnlyEmptyTiles) {
  // Whatever the mask, the tiles next_candidate jumps over are empty ones.
  for (const auto& [lq, lk, tq, tk] :
       {std::array<int64_t, 4>{23, 23, 4, 4}, {17, 31, 3, 5}, {130, 140, 10, 7}}) {
    for (const Case& c : catalogue(lq, lk)) {
      const MaskShape shape = {2, 3, lq, lk};
      const detail::ResolvedMask resolved(c.mask, shape);
      const detail::BlockMap blocks(resolved, tq, tk);
      for (int64_t b = 0; b < 2; ++b) {
        for (int64_t h = 0; h < 3; ++h) {
          for (int64_t qt = 0; qt < blocks.q_tiles(); ++qt) {
            for (int64_t kt = 0; kt <= blocks.k_tiles(); ++kt) {
              const int64_t next = blocks.next_candidate(b, h, qt, kt);
              ASSERT_GE(next, kt) << c.name;
              ASSERT_LE(next, std::max(kt, blocks.k_tiles())) << c.name;
              for (int64_t skipped = kt; skipped < next; ++skipped) {
                ASSERT_EQ(blocks.kind(b, h, qt, skipped), TileKind::empty)
                    << c.name << " b" << b << " h" << h << " tile " << qt << "," << skipped;
              }
            }
          }
        }
      }
    }
  }
}

// Global tokens 100 and 700 of N = 1024 (with tiles of 64, in tiles 1 and 10).
Array<int64_t> two_global_tokens() {
  std::vector<int64_t> ids(1024, 0);
  ids[100] = ids[700] = 1;
  return Array<int64_t>({1024}, ids);
}

TEST(BlockMap, NextCandidateJumpsToTheNextGlobalKeyOrLayoutBlock) {
  // Window(64, 64) with global tokens 100 and 700 over N = 1024, tiles of 64: past its band a
  // query tile holding no global token can only see the tiles of global keys 100 (tile 1) and
  // 700 (tile 10); a tile holding one sees every tile.
  const Mask longformer = Mask().window(64, 64).global_tokens(two_global_tokens());
  const MaskShape shape = {1, 1, 1024, 1024};
  const detail::ResolvedMask resolved(longformer, shape);
  const detail::BlockMap blocks(resolved, 64, 64);
  EXPECT_EQ(blocks.next_candidate(0, 0, 5, 7), 10);   // band 4..6, then global key 700
  EXPECT_EQ(blocks.next_candidate(0, 0, 5, 2), 4);    // after tile 1's key, the band
  EXPECT_EQ(blocks.next_candidate(0, 0, 5, 11), 16);  // nothing left
  EXPECT_EQ(blocks.next_candidate(0, 0, 10, 2), 2);   // tile 10 holds global query 700
  // A block-sparse layout: the next key tile whose block is on.
  std::vector<uint8_t> layout(16 * 16, 0);
  layout[3 * 16 + 3] = layout[3 * 16 + 12] = 1;
  const Mask sparse = Mask().block_sparse(Array<uint8_t>({16, 16}, layout), 64, 64);
  const detail::ResolvedMask resolved_sparse(sparse, shape);
  const detail::BlockMap sparse_blocks(resolved_sparse, 64, 64);
  EXPECT_EQ(sparse_blocks.next_candidate(0, 0, 3, 4), 12);
  EXPECT_EQ(sparse_blocks.next_candidate(0, 0, 3, 13), 16);
}

TEST(BlockMap, KeyRowsHoldEveryAllowedPairOfTheTile) {
  // Whatever the mask, with and without global queries apart, no allowed pair of a tile lies
  // outside key_rows; where only windows and global tokens make the mask, a tile beside the band
  // narrows to its global keys.
  for (const auto& [lq, lk, tq, tk] :
       {std::array<int64_t, 4>{23, 23, 4, 4}, {17, 31, 3, 5}, {130, 140, 10, 7}}) {
    for (const Case& c : catalogue(lq, lk)) {
      const MaskShape shape = {2, 3, lq, lk};
      const Array<uint8_t> allowed = allowed_pairs(c.mask, shape);
      const detail::ResolvedMask resolved(c.mask, shape);
      for (const bool apart : {false, true}) {
        if (apart && !detail::BlockMap::global_queries_see_every_key(resolved)) continue;
        const detail::BlockMap blocks(resolved, tq, tk, true, apart);
        for (int64_t b = 0; b < 2; ++b) {
          for (int64_t h = 0; h < 3; ++h) {
            for (int64_t qt = 0; qt < blocks.q_tiles(); ++qt) {
              for (int64_t kt = 0; kt < blocks.k_tiles(); ++kt) {
                const auto rows = blocks.key_rows(b, h, qt, kt);
                const int64_t tile_rows = std::min(lk, (kt + 1) * tk) - kt * tk;
                ASSERT_LE(0, rows.first) << c.name;
                ASSERT_LE(rows.end, tile_rows) << c.name;
                for (int64_t i = qt * tq; i < std::min(lq, (qt + 1) * tq); ++i) {
                  for (int64_t j = kt * tk; j < kt * tk + tile_rows; ++j) {
                    if (!allowed.values()[((b * 3 + h) * lq + i) * lk + j]) continue;
                    ASSERT_TRUE(rows.first <= j - kt * tk && j - kt * tk < rows.end)
                        << c.name << " apart " << apart << " b" << b << " h" << h << " pair " << i
                        << "," << j;
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  // Window(64, 64) with global tokens 100 and 700 over N = 1024, tiles of 64.
  const Mask longformer = Mask().window(64, 64).global_tokens(two_global_tokens());
  const detail::ResolvedMask resolved(longformer, {1, 1, 1024, 1024});
  const detail::BlockMap blocks(resolved, 64, 64, true, true);
  EXPECT_EQ(blocks.key_rows(0, 0, 5, 10).first, 700 - 640);  // beside the band: key 700 alone
  EXPECT_EQ(blocks.key_rows(0, 0, 5, 10).end, 700 - 640 + 1);
  EXPECT_EQ(blocks.key_rows(0, 0, 5, 12).end, 0);   // no key at all
  EXPECT_EQ(blocks.key_rows(0, 0, 5, 5).end, 64);   // inside the band: all of it
  EXPECT_EQ(blocks.key_rows(0, 0, 5, 3).first, 0);  // the band's near edge, from 256
  EXPECT_EQ(blocks.key_rows(0, 0, 10, 2).end, 64);  // tile 10 holds global query 700
  // Another component (a chunk) keeps the whole tile: not known in O(log L).
  const Mask chunk = Mask().window(64, 64).chunk(512).global_tokens(two_global_tokens());
  const detail::ResolvedMask chunked(chunk, {1, 1, 1024, 1024});  // keeps a reference to `chunk`
  EXPECT_EQ(detail::BlockMap(chunked, 64, 64).key_rows(0, 0, 5, 10).first, 0);
}

TEST(BlockMap, CausalSkipsTheUpperTriangle) {
  const Array<uint8_t> map = block_map(Mask().causal(), {1, 1, 256, 256});
  const std::vector<uint8_t> expected = {1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1};
  std::vector<uint8_t> diagonal_partial = expected;
  for (int t = 0; t < 4; ++t) diagonal_partial[t * 4 + t] = 2;
  EXPECT_EQ(map.values(), diagonal_partial);
}

TEST(BlockMap, SlidingWindowVisitsOnlyTheBand) {
  const Array<uint8_t> map = block_map(Mask().sliding_window(64), {1, 1, 1024, 1024});
  int64_t visited = 0;
  for (uint8_t kind : map.values()) visited += kind != 0;
  EXPECT_EQ(visited, 16 + 15);  // the diagonal and the band just below it
}

TEST(BlockMap, LongformerVisitsTheBandAndTheGlobalRowsAndColumns) {
  // N = 1024, tiles of 64, window(128, 128), global tokens 0..3 and 700: the band (3 partial
  // tiles wide at most 5), key tiles 0 and 10 for every query tile, and every key tile for the
  // query tiles holding a global token (0 and 10). Nothing else, and no tile is scanned.
  std::vector<int64_t> ids(1024, 0);
  for (const int64_t t : {0, 1, 2, 3, 700}) ids[t] = 1;
  const Mask mask = Mask().window(128, 128).global_tokens(Array<int64_t>({1024}, ids));
  const MaskShape shape = {1, 1, 1024, 1024};
  const Array<uint8_t> map = block_map(mask, shape);
  const detail::ResolvedMask resolved(mask, shape);
  const detail::BlockMap blocks(resolved, 64, 64);
  int64_t visited = 0;
  for (int64_t qt = 0; qt < 16; ++qt) {
    for (int64_t kt = 0; kt < 16; ++kt) {
      const bool band = std::abs(qt - kt) <= 2, global = qt == 0 || qt == 10 || kt == 0 || kt == 10;
      const uint8_t kind = map.values()[qt * 16 + kt];
      EXPECT_EQ(kind != 0, band || global) << qt << "," << kt;
      visited += kind != 0;
    }
    const detail::BlockMap::TileRange range = blocks.k_tile_range(0, 0, qt);
    if (qt == 0 || qt == 10) {
      EXPECT_EQ(range.first, 0);
      EXPECT_EQ(range.end, 16);
    } else {
      EXPECT_EQ(range.first, 0) << qt;  // the global key tile 0
      EXPECT_EQ(range.end, std::max<int64_t>(std::min<int64_t>(qt + 3, 16), 11)) << qt;
    }
  }
  EXPECT_LT(visited, 16 * 16 / 2);
}

TEST(BlockMap, GlobalQueriesApart) {
  // Window(64, 64) and global tokens 100 and 700 over N = 1024: a global query sees every key, so
  // its rows may be computed apart; the map then keeps their query tiles (1 and 10) to their
  // bands and the global keys' tiles.
  const Mask longformer = Mask().window(64, 64).global_tokens(two_global_tokens());
  const MaskShape shape = {1, 2, 1024, 1024};
  const detail::ResolvedMask resolved(longformer, shape);
  EXPECT_TRUE(detail::BlockMap::global_queries_see_every_key(resolved));
  EXPECT_EQ(detail::BlockMap::global_query_rows(resolved, 0, 1), (std::vector<int64_t>{100, 700}));
  const detail::BlockMap together(resolved, 64, 64);
  const detail::BlockMap apart(resolved, 64, 64, true, true);
  EXPECT_EQ(together.k_tile_range(0, 0, 10).end, 16);
  EXPECT_EQ(apart.k_tile_range(0, 0, 10).first, 1);  // global key 100's tile, then the band
  EXPECT_EQ(apart.k_tile_range(0, 0, 10).end, 12);
  EXPECT_EQ(together.kind(0, 0, 10, 14), TileKind::partial);
  EXPECT_EQ(apart.kind(0, 0, 10, 14), TileKind::empty);
  EXPECT_EQ(apart.kind(0, 0, 10, 1), TileKind::partial);  // the global key
  EXPECT_EQ(apart.next_candidate(0, 0, 10, 2), 9);
  // Per head, and only where nothing but windows stands between a global query and a key.
  const Mask on_head_1 = Mask().causal().global_tokens(two_global_tokens(), HeadSet{1});
  const detail::ResolvedMask resolved_head(on_head_1, shape);
  EXPECT_TRUE(detail::BlockMap::global_query_rows(resolved_head, 0, 0).empty());
  EXPECT_EQ(detail::BlockMap::global_query_rows(resolved_head, 0, 1).size(), 2u);
  for (const Mask& mask :
       {Mask().causal(), Mask().window(8, 8).global_tokens(two_global_tokens()).key_lengths({1000}),
        Mask().global_tokens(two_global_tokens()).chunk(128)}) {
    EXPECT_FALSE(detail::BlockMap::global_queries_see_every_key(detail::ResolvedMask(mask, shape)));
  }
}

TEST(BlockMap, BlockSparseLayoutsAreClassifiedWithoutTouchingElements) {
  // Layout blocks of 32 under tiles of 64: a tile is full when its four blocks are on, empty when
  // none is, else partial; the row's key tiles run from its first to its last non-empty one.
  std::vector<uint8_t> layout(8 * 8, 0);
  for (int64_t r = 0; r < 8; ++r) {
    layout[r * 8 + r] = 1;        // the diagonal block
    layout[r * 8 + (r ^ 1)] = 1;  // its partner in the same 64-tile: diagonal tiles are full
  }
  layout[0 * 8 + 6] = 1;  // one block of tile (0, 3): partial
  const Mask mask = Mask().block_sparse(Array<uint8_t>({8, 8}, layout), 32, 32);
  const MaskShape shape = {1, 1, 256, 256};
  const Array<uint8_t> map = block_map(mask, shape);
  const std::vector<uint8_t> expected = {1, 0, 0, 2, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
  EXPECT_EQ(map.values(), expected);
  const detail::ResolvedMask resolved(mask, shape);
  const detail::BlockMap blocks(resolved, 64, 64);
  EXPECT_EQ(blocks.k_tile_range(0, 0, 0).first, 0);
  EXPECT_EQ(blocks.k_tile_range(0, 0, 0).end, 4);
  EXPECT_EQ(blocks.k_tile_range(0, 0, 2).first, 2);
  EXPECT_EQ(blocks.k_tile_range(0, 0, 2).end, 3);
}

TEST(BlockMap, DenseScanIsCachedInTheMask) {
  const Mask mask = Mask().keep(Array<uint8_t>({1, 1, 64, 64}, std::vector<uint8_t>(4096, 1)));
  const Array<uint8_t> first = block_map(mask, {1, 2, 64, 64}, 16, 16);
  const Mask copy = mask;  // copies share the cache
  EXPECT_EQ(block_map(copy, {1, 2, 64, 64}, 16, 16).values(), first.values());
  for (uint8_t kind : first.values()) EXPECT_EQ(kind, 1);
}

TEST(BlockMap, AdditiveBlocksWithValuesToAddAreNotMaskFree) {
  std::vector<float> values(16, 0.0f);
  values[5] = -2.0f;  // finite: not hidden, but must be added
  const Array<uint8_t> map =
      block_map(Mask().additive(Array<float>({4, 4}, values)), {1, 1, 4, 4}, 2, 2);
  EXPECT_EQ(map.values(), (std::vector<uint8_t>{2, 1, 1, 1}));
}

// Bit rows of queries [q0, q0 + q_count) against keys [k0, k0 + k_count) equal the element grid.
void ExpectTileBits(const detail::TileMaskBuilder& builder, const Array<uint8_t>& allowed,
                    const std::string& name, const MaskShape& shape, int64_t b, int64_t h,
                    int64_t q0, int64_t q_count, int64_t k0, int64_t k_count) {
  std::vector<uint64_t> bits(k_count, ~uint64_t{0});
  builder.build(b, h, q0, q_count, k0, k_count, bits.data());
  const int64_t lq = shape.q_len, lk = shape.k_len;
  for (int64_t n = 0; n < k_count; ++n) {
    for (int64_t i = 0; i < 64; ++i) {
      const bool bit = (bits[n] >> i) & 1;
      const bool expected =
          i < q_count && allowed.values()[((b * shape.q_heads + h) * lq + q0 + i) * lk + k0 + n];
      ASSERT_EQ(bit, expected) << name << " Lq=" << lq << " Lk=" << lk << " b" << b << " h" << h
                               << " i" << q0 + i << " j" << k0 + n;
    }
  }
}

TEST(TileMask, BitRowsAreExactInFramesNearTheInt64Range) {
  // Frames of ~2⁶³ rows put positions where a bound computed by saturating steps would be wrong:
  // a left-padding key (kpos < 0) with an unbounded right side and bottom-right alignment over
  // 2⁶³ − 1 queries (a saturated lower bound pulled back into range by the query offset), and a
  // chunk whose last position would pass INT64_MAX. The bit rows must match the pair-by-pair
  // semantics (ResolvedMask::allowed), for 64 × 64 tiles and the row kernel's single rows.
  struct Extreme {
    const char* name;
    Mask mask;
    Frame frame;
  };
  Frame deep;
  deep.q_total = INT64_MAX;
  deep.k_total = 64;
  Frame far_keys;
  far_keys.k_offset = INT64_MAX - 100;
  far_keys.k_total = INT64_MAX;
  far_keys.q_offset = INT64_MAX - 100;
  far_keys.q_total = INT64_MAX;
  const std::vector<Extreme> cases = {
      {"window(0, unbounded) & key_starts, Lq_total = 2⁶³ − 1",
       Mask().window(0, kUnbounded).key_starts({10}), deep},
      {"chunk(100) at offsets 2⁶³ − 101", Mask().chunk(100), far_keys},
  };
  for (const Extreme& c : cases) {
    const detail::ResolvedMask resolved(c.mask, {1, 1, 64, 64}, c.frame);
    const detail::TileMaskBuilder builder(resolved);
    std::vector<uint64_t> bits(64);
    builder.build(0, 0, 0, 64, 0, 64, bits.data());
    for (int64_t j = 0; j < 64; ++j) {
      uint64_t expected = 0;
      for (int64_t i = 0; i < 64; ++i) {
        if (resolved.allowed(0, 0, i, j)) expected |= uint64_t{1} << i;
      }
      ASSERT_EQ(bits[j], expected) << c.name << " key " << j;
    }
    for (int64_t i = 0; i < 64; i += 9) {
      builder.build(0, 0, i, 1, 0, 64, bits.data());
      for (int64_t j = 0; j < 64; ++j) {
        ASSERT_EQ(bits[j] & 1, resolved.allowed(0, 0, i, j) ? 1u : 0u)
            << c.name << " query " << i << " key " << j;
      }
    }
  }
}

TEST(TileMask, BitRowsReproduceTheElementGrid) {
  for (const auto& [lq, lk] : {std::pair<int64_t, int64_t>{70, 70}, {5, 130}, {130, 9}}) {
    for (const Case& c : catalogue(lq, lk)) {
      const MaskShape shape = {2, 3, lq, lk};
      const Array<uint8_t> allowed = allowed_pairs(c.mask, shape);
      const detail::ResolvedMask resolved(c.mask, shape);
      const detail::TileMaskBuilder builder(resolved);
      for (int64_t b = 0; b < 2; ++b) {
        for (int64_t h = 0; h < 3; ++h) {
          // The tile kernels' 64 × 64 tiles.
          for (int64_t q0 = 0; q0 < lq; q0 += 64) {
            for (int64_t k0 = 0; k0 < lk; k0 += 64) {
              ExpectTileBits(builder, allowed, c.name, shape, b, h, q0,
                             std::min<int64_t>(64, lq - q0), k0, std::min<int64_t>(64, lk - k0));
            }
          }
          // The row kernel's: one query against every key (more than 64 at once).
          for (int64_t i = 0; i < lq; i += 3) {
            ExpectTileBits(builder, allowed, c.name, shape, b, h, i, 1, 0, lk);
          }
          // Blocks that start anywhere, against key runs that start anywhere.
          ExpectTileBits(builder, allowed, c.name, shape, b, h, lq / 3,
                         std::min<int64_t>(64, lq - lq / 3), lk / 5, lk - lk / 5);
        }
      }
    }
  }
}

}  // namespace
}  // namespace maskattn
