"""Every mask component from Python against NumPy expectations written from docs/semantics.md.

Each case builds a ``maskattn.Mask`` and, independently, the boolean matrix of allowed pairs
[B, Hq, Lq, Lk] that §2–§3 of the semantics define (positions, alignment, each component's
rule). The test checks three things: ``allowed_pairs`` equals the matrix; ``attention`` equals the
float64 NumPy reference run with that matrix (within the rule of conftest); the LSE too, with
-inf exactly on the rows that see no key. ``block_map`` is checked against tiles of the matrix.
"""

from __future__ import annotations

import numpy as np
import pytest

import maskattn as ma
from conftest import check_attention, random_inputs, reference_attention

B, HQ, HKV = 2, 4, 2


def grid(q_len, k_len):
    """Index arrays b, h, i, j that broadcast to [B, Hq, Lq, Lk]."""
    b, h, i, j = np.ix_(np.arange(B), np.arange(HQ), np.arange(q_len), np.arange(k_len))
    return b, h, i, j


def positions(q_len, k_len, align="bottom_right", key_starts=None, query_starts=None,
              key_lengths=None, query_lengths=None):
    """(qpos [B,1,Lq,1], kpos [B,1,1,Lk]) as semantics §2 defines them."""
    b, _, i, j = grid(q_len, k_len)
    key_start = np.zeros(B, int) if key_starts is None else np.asarray(key_starts)
    kpos = j - key_start[b]
    if align == "top_left":
        if query_starts is not None:
            query_start = np.asarray(query_starts)
        elif q_len == k_len:
            query_start = key_start
        else:
            query_start = np.zeros(B, int)
        qpos = i - query_start[b]
    elif key_lengths is not None and query_lengths is not None:
        offset = np.asarray(key_lengths) - np.asarray(query_lengths)
        qpos = i + offset[b] - key_start[b]
    else:
        qpos = i + (k_len - q_len) - key_start[b]
    return qpos, kpos


def window(qpos, kpos, left, right):
    lower = True if left is None else qpos - left <= kpos
    upper = True if right is None else kpos <= qpos + right
    return lower & upper


def full(expected, q_len, k_len):
    return np.broadcast_to(expected, (B, HQ, q_len, k_len))


def check_mask(rng, mask, expected, q_len, k_len, bias=None):
    """allowed_pairs, attention and LSE of ``mask`` against the expected allowed pairs."""
    expected = full(np.asarray(expected, dtype=bool), q_len, k_len)
    pairs = ma.allowed_pairs(mask, B, HQ, q_len, k_len)
    assert pairs.dtype == np.uint8 and pairs.shape == (B, HQ, q_len, k_len)
    np.testing.assert_array_equal(pairs.astype(bool), expected)
    np.testing.assert_array_equal(
        ma.allowed_pairs(mask, B, HQ, q_len, k_len, b=1, h=HQ - 1).astype(bool), expected[1, -1])

    q, k, v = random_inputs(rng, B, HQ, HKV, q_len, k_len, 8)
    out, lse = ma.attention(q, k, v, mask, return_lse=True)
    check_attention(out, q, k, v, keep=expected, bias=bias)
    _, reference_lse = reference_attention(q, k, v, keep=expected, bias=bias)
    hidden = ~expected.any(axis=-1)
    assert np.all(np.isneginf(lse[hidden])), "a row without keys must have LSE -inf"
    assert np.all(out[hidden] == 0), "a row without keys must output 0"
    np.testing.assert_allclose(lse[~hidden], reference_lse[~hidden], rtol=1e-5, atol=1e-5)
    assert not np.isnan(out).any()


# --- causal, window, sliding window, chunk ------------------------------------------------------


@pytest.mark.parametrize("q_len,k_len", [(9, 9), (5, 12), (12, 5)])
def test_causal_bottom_right_by_default(rng, q_len, k_len):
    qpos, kpos = positions(q_len, k_len)
    check_mask(rng, ma.Mask().causal(), kpos <= qpos, q_len, k_len)
    assert ma.Mask().causal().alignment == "bottom_right"


@pytest.mark.parametrize("q_len,k_len", [(5, 12), (12, 5)])
def test_causal_top_left_is_sdpa_is_causal(rng, q_len, k_len):
    qpos, kpos = positions(q_len, k_len, "top_left")
    expected = kpos <= qpos
    np.testing.assert_array_equal(expected[0, 0], np.tril(np.ones((q_len, k_len), bool)))
    check_mask(rng, ma.Mask().causal("top_left"), expected, q_len, k_len)
    check_mask(rng, ma.Mask().set_alignment("top-left").causal(), expected, q_len, k_len)


@pytest.mark.parametrize("left,right", [(3, 1), (0, 0), (None, 2), (None, None)])
def test_window_sides_inclusive_and_unbounded(rng, left, right):
    qpos, kpos = positions(7, 11)
    check_mask(rng, ma.Mask().window(left, right), window(qpos, kpos, left, right), 7, 11)


# FlashAttention's window_size = (left, -1): a window unbounded on the right (once an overflow in
# the fused kernel's tile mask; tests/fused_test.cc WindowUnboundedOnTheRight).
@pytest.mark.parametrize("q_len,k_len", [(7, 11), (70, 70)], ids=["row-kernel", "tile-kernel"])
def test_window_with_unbounded_right_side(rng, q_len, k_len):
    qpos, kpos = positions(q_len, k_len)
    check_mask(rng, ma.Mask().window(2, None), window(qpos, kpos, 2, None), q_len, k_len)


def test_window_top_left(rng):
    qpos, kpos = positions(6, 10, "top_left")
    mask = ma.Mask().set_alignment("top_left").window(2, 1)
    check_mask(rng, mask, window(qpos, kpos, 2, 1), 6, 10)


def test_sliding_window_sees_w_keys_including_its_own(rng):
    qpos, kpos = positions(6, 13)
    expected = window(qpos, kpos, 3, 0)
    assert expected.sum(axis=-1).max() == 4
    check_mask(rng, ma.Mask().sliding_window(4), expected, 6, 13)


@pytest.mark.parametrize("q_len,k_len,size", [(11, 11, 4), (10, 6, 3)])
def test_chunk_floor_division_also_for_negative_positions(rng, q_len, k_len, size):
    qpos, kpos = positions(q_len, k_len)
    check_mask(rng, ma.Mask().chunk(size), qpos // size == kpos // size, q_len, k_len)


# --- padding ------------------------------------------------------------------------------------


def test_key_lengths_right_padding(rng):
    _, _, _, j = grid(5, 9)
    lengths = np.array([7, 3])
    check_mask(rng, ma.Mask().key_lengths(lengths), j < lengths[:, None, None, None], 5, 9)


def test_key_starts_hide_left_padding_and_move_positions(rng):
    starts = [0, 3]
    _, _, _, j = grid(8, 8)
    qpos, kpos = positions(8, 8, key_starts=starts)
    real = j >= np.array(starts)[:, None, None, None]
    check_mask(rng, ma.Mask().key_starts(starts).causal(), real & (kpos <= qpos), 8, 8)
    check_mask(rng, ma.Mask().key_starts(starts).chunk(3), real & (qpos // 3 == kpos // 3), 8, 8)


def test_key_keep_and_pad_id(rng):
    _, _, _, j = grid(4, 6)
    keep = np.array([[1, 1, 0, 1, 1, 0], [0, 1, 1, 1, 1, 1]])
    expected = keep.astype(bool)[np.arange(B)[:, None, None, None], j]
    check_mask(rng, ma.Mask().key_keep(keep), expected, 4, 6)
    token_ids = np.where(keep == 1, 17, 5)
    check_mask(rng, ma.Mask().key_pad_id(token_ids, pad_id=5), expected, 4, 6)
    check_mask(rng, ma.Mask().key_pad_id(np.where(keep == 1, 9, 0)), expected, 4, 6)


def test_query_padding_forms_hide_whole_rows(rng):
    _, _, i, _ = grid(6, 6)
    lengths = np.array([4, 6])
    check_mask(rng, ma.Mask().query_lengths(lengths), i < lengths[:, None, None, None], 6, 6)
    starts = np.array([2, 0])
    check_mask(rng, ma.Mask().query_starts(starts), i >= starts[:, None, None, None], 6, 6)
    keep = np.array([[1, 0, 1, 1, 1, 0], [1, 1, 1, 1, 0, 1]])
    expected = keep.astype(bool)[np.arange(B)[:, None, None, None], i]
    check_mask(rng, ma.Mask().query_keep(keep), expected, 6, 6)
    check_mask(rng, ma.Mask().query_pad_id(np.where(keep == 1, 3, 0)), expected, 6, 6)


def test_query_starts_set_top_left_positions(rng):
    starts, q_len, k_len = [1, 0], 5, 7
    _, _, i, _ = grid(q_len, k_len)
    qpos, kpos = positions(q_len, k_len, "top_left", query_starts=starts)
    real = i >= np.array(starts)[:, None, None, None]
    mask = ma.Mask().causal("top_left").query_starts(starts)
    check_mask(rng, mask, real & (kpos <= qpos), q_len, k_len)


def test_both_lengths_align_each_sequence_by_its_own_lengths(rng):
    q_lengths, k_lengths = np.array([3, 5]), np.array([6, 9])
    _, _, i, j = grid(5, 9)
    qpos, kpos = positions(5, 9, key_lengths=k_lengths, query_lengths=q_lengths)
    real = (i < q_lengths[:, None, None, None]) & (j < k_lengths[:, None, None, None])
    mask = ma.Mask().query_lengths(q_lengths).key_lengths(k_lengths).causal()
    check_mask(rng, mask, real & (kpos <= qpos), 5, 9)


# --- segments, spans, prefix-LM -----------------------------------------------------------------


def test_segments_one_array_and_two(rng):
    ids = np.array([[0, 0, 0, 1, 1, 2, 2, 2], [5, 5, 6, 6, 6, 6, 7, 7]])
    b, _, i, j = grid(8, 8)
    same = ids[b, i] == ids[b, j]
    qpos, kpos = positions(8, 8)
    check_mask(rng, ma.Mask().segments(ids), same, 8, 8)
    check_mask(rng, ma.Mask().segments(ids).causal(), same & (kpos <= qpos), 8, 8)
    q_ids = ids[:, 5:]
    b, _, i, j = grid(3, 8)
    check_mask(rng, ma.Mask().segments(q_ids, ids), q_ids[b, i] == ids[b, j], 3, 8)


def test_spans_relax_causal_and_windows_only(rng):
    spans = np.array([[0, 1, 1, 1, 0, 0, 2, 2], [0, 0, 0, 0, 3, 3, 3, 0]])
    b, _, i, j = grid(8, 8)
    together = (spans[b, i] == spans[b, j]) & (spans[b, i] != 0)
    qpos, kpos = positions(8, 8)
    check_mask(rng, ma.Mask().causal().spans(spans), (kpos <= qpos) | together, 8, 8)
    windowed = window(qpos, kpos, 1, 0) | together
    check_mask(rng, ma.Mask().window(1, 0).spans(spans), windowed, 8, 8)
    lengths = np.array([8, 6])  # padding still applies inside a span
    expected = ((kpos <= qpos) | together) & (j < lengths[:, None, None, None])
    check_mask(rng, ma.Mask().causal().spans(spans).key_lengths(lengths), expected, 8, 8)
    check_mask(rng, ma.Mask().spans(spans), np.ones((8, 8), bool), 8, 8)  # nothing to relax


def test_prefix_lm_is_one_span_over_the_prefix(rng):
    qpos, kpos = positions(9, 9)
    prefix = (qpos < 4) & (kpos < 4) & (qpos >= 0) & (kpos >= 0)
    check_mask(rng, ma.Mask().causal().prefix_lm(4), (kpos <= qpos) | prefix, 9, 9)
    expected = window(qpos, kpos, 1, 0) | prefix  # after the prefix: only inside the window
    check_mask(rng, ma.Mask().sliding_window(2).prefix_lm(4), expected, 9, 9)


# --- dense masks and predicates -----------------------------------------------------------------


@pytest.mark.parametrize("shape", [(6, 7), (B, 1, 1, 7), (HQ, 6, 7), (1, HQ, 1, 7), (B, HQ, 6, 7)])
def test_keep_broadcasts_like_numpy(rng, shape):
    keep = rng.random(shape) < 0.6
    check_mask(rng, ma.Mask().keep(keep), keep, 6, 7)
    check_mask(rng, ma.Mask().keep(keep.astype(np.uint8)), keep, 6, 7)


def test_blocked_is_the_opposite_of_keep(rng):
    blocked = rng.random((B, 1, 6, 7)) < 0.4
    check_mask(rng, ma.Mask().blocked(blocked), ~blocked, 6, 7)
    triu = np.triu(np.ones((6, 6), bool), 1)  # the tutorials' mask
    qpos, kpos = positions(6, 6)
    check_mask(rng, ma.Mask().blocked(triu), kpos <= qpos, 6, 6)


def test_additive_adds_values_and_minus_inf_hides(rng):
    values = rng.standard_normal((B, 1, 6, 7))
    values[rng.random(values.shape) < 0.3] = -np.inf
    values[0, 0, 2] = -np.inf  # a fully hidden row
    check_mask(rng, ma.Mask().additive(values), np.isfinite(values), 6, 7, bias=values)


def test_predicate_is_called_with_indices(rng):
    def allows(b, h, i, j):
        return (b + h + i + 2 * j) % 3 != 0

    b, h, i, j = grid(5, 6)
    check_mask(rng, ma.Mask().predicate(allows, "mine"), (b + h + i + 2 * j) % 3 != 0, 5, 6)
    table = rng.random((B, HQ, 5, 6)) < 0.5  # numpy.bool_ answers
    check_mask(rng, ma.Mask().predicate(lambda b, h, i, j: table[b, h, i, j]), table, 5, 6)


# --- programs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("q_len,k_len", [(9, 9), (5, 12), (70, 130)])
def test_program_reads_tables_with_row_indices(rng, q_len, k_len):
    """q and kv are row indices (top-left, FlexAttention's q_idx/kv_idx) whatever the lengths;
    tables of every type, read in place."""
    doc = np.sort(rng.integers(0, 3, max(q_len, k_len)))  # int64
    window = np.array([2, 5, 100, 1], np.int32)  # per head
    hidden_key = rng.random(k_len) < 0.2  # bool
    b, h, i, j = grid(q_len, k_len)
    expected = (doc[i] == doc[j]) & (i - j < window[h]) & ~hidden_key[j] | (b == 1) & (j == 0)
    mask = ma.Mask().program("(doc[q] == doc[kv]) & (q - kv < window[h]) & ~hidden[kv] | "
                             "(b == 1) & (kv == 0)", doc=doc, window=window, hidden=hidden_key)
    check_mask(rng, mask, expected, q_len, k_len)
    assert mask.describe().startswith("program `")


def test_program_tables_are_borrowed_not_copied():
    doc = np.array([0, 0, 1, 1], np.int64)
    program = ma.Program.mask("doc[q] == doc[kv]", doc=doc)
    assert program.allows(0, 0, 1, 2) is False
    doc[2] = 0  # the program reads the caller's memory
    assert program.allows(0, 0, 1, 2) is True
    assert program.tables == [("doc", "int64", (4,))] and program.kind == "mask"
    strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1]  # a view with stride 4
    assert ma.Program.score("s + x[q]", x=strided).score_of(0.5, 0, 0, 2, 0) == 9.5


def test_program_from_a_compiled_program_and_from_lists(rng):
    program = ma.Program.mask("ids[q] >= ids[kv]", ids=[3, 1, 2, 0, 4])
    i, j = np.ix_(range(5), range(5))
    ids = np.array([3, 1, 2, 0, 4])
    check_mask(rng, ma.Mask().program(program), (ids[i] >= ids[j])[None, None], 5, 5)
    with pytest.raises(ma.Error, match="a compiled maskattn.Program already holds its tables"):
        ma.Mask().program(program, ids=ids)
    with pytest.raises(ma.Error, match="is a score program"):
        ma.Mask().program(ma.Program.score("s * 2.0"))


# --- per-head components and & ------------------------------------------------------------------


def test_heads_argument_restricts_a_component_to_those_heads(rng):
    qpos, kpos = positions(7, 7)
    _, h, _, _ = grid(7, 7)
    causal = kpos <= qpos
    check_mask(rng, ma.Mask().causal(heads=[0, 2]), causal | ~np.isin(h, [0, 2]), 7, 7)
    check_mask(rng, ma.Mask().window(1, 1, heads=range(1, 3)),
               window(qpos, kpos, 1, 1) | ~np.isin(h, [1, 2]), 7, 7)
    check_mask(rng, ma.Mask().sliding_window(2, heads=3), window(qpos, kpos, 1, 0) | (h != 3), 7, 7)
    chunked = (qpos // 3 == kpos // 3) | (h != 0)
    check_mask(rng, ma.Mask().chunk(3, heads=np.int64(0)), chunked, 7, 7)
    ids = np.array([[0, 0, 1, 1, 1, 2, 2]] * B)
    b, _, i, j = grid(7, 7)
    check_mask(rng, ma.Mask().segments(ids, heads=[1]), (ids[b, i] == ids[b, j]) | (h != 1), 7, 7)


def test_spans_relax_only_components_of_their_heads(rng):
    qpos, kpos = positions(6, 6)
    _, h, i, j = grid(6, 6)
    prefix = (qpos < 3) & (kpos < 3)
    mask = ma.Mask().causal(heads=[0, 1]).window(0, 0, heads=[2, 3]).prefix_lm(3, heads=[0, 2])
    relaxed = np.isin(h, [0, 2]) & prefix
    expected = np.where(h < 2, kpos <= qpos, window(qpos, kpos, 0, 0)) | relaxed
    check_mask(rng, mask, expected, 6, 6)


def test_and_intersects_masks(rng):
    qpos, kpos = positions(6, 8)
    _, _, _, j = grid(6, 8)
    lengths = np.array([8, 5])
    mask = ma.Mask().causal() & ma.Mask().key_lengths(lengths)
    assert len(mask) == 2
    check_mask(rng, mask, (kpos <= qpos) & (j < lengths[:, None, None, None]), 6, 8)


def test_no_mask_and_empty_mask_allow_everything(rng):
    q, k, v = random_inputs(rng, B, HQ, HKV, 3, 5, 8)
    check_attention(ma.attention(q, k, v), q, k, v)
    np.testing.assert_array_equal(ma.attention(q, k, v, ma.Mask()), ma.attention(q, k, v))
    assert ma.allowed_pairs(None, 1, 1, 2, 3).all()


# --- block_map ----------------------------------------------------------------------------------


def expected_block_map(allowed, tile_q, tile_k):
    """0 = no pair allowed in the tile, 1 = every pair, 2 = some (tiles cut at the edges)."""
    batch, heads, q_len, k_len = allowed.shape
    rows, cols = -(-q_len // tile_q), -(-k_len // tile_k)
    tiles = np.zeros((batch, heads, rows, cols), np.uint8)
    for r in range(rows):
        for c in range(cols):
            tile = allowed[:, :, r * tile_q:(r + 1) * tile_q, c * tile_k:(c + 1) * tile_k]
            tiles[:, :, r, c] = np.where(tile.all((2, 3)), 1, np.where(tile.any((2, 3)), 2, 0))
    return tiles


BLOCK_MAP_MASKS = {  # name: (builder, the map is exact rather than only sound)
    "causal": (lambda: ma.Mask().causal(), True),
    "segments": (lambda: ma.Mask().segments(np.repeat([[0] * 4 + [1] * 4 + [2] * 3], B, 0)), True),
    "keep": (lambda: ma.Mask().keep(np.tril(np.ones((11, 11), bool), 1)), True),
    # Structured components classify a tile one by one from its corners (design.md §4), so an
    # intersection may be "partial" where it is empty: sound, not exact.
    "sliding+lengths": (lambda: ma.Mask().sliding_window(3).key_lengths([10, 6]), False),
}


@pytest.mark.parametrize("name", BLOCK_MAP_MASKS)
def test_block_map_matches_tiles_of_the_allowed_pairs(name):
    build, exact = BLOCK_MAP_MASKS[name]
    mask = build()
    allowed = ma.allowed_pairs(mask, B, HQ, 11, 11).astype(bool)
    tiles = ma.block_map(mask, B, HQ, 11, 11, tile_q=4, tile_k=4)
    assert tiles.shape == (B, HQ, 3, 3) and tiles.dtype == np.uint8
    expected = expected_block_map(allowed, 4, 4)
    if exact:
        np.testing.assert_array_equal(tiles, expected)
    else:  # an empty or full tile must be what it says; "partial" may be conservative
        np.testing.assert_array_equal(tiles[tiles != 2], expected[tiles != 2])
        assert (tiles == 0).any()  # it still skips something
    assert ma.block_map(mask, B, HQ, 11).shape == (B, HQ, 1, 1)  # default 64 x 64 tiles


# --- any_allowed --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BLOCK_MAP_MASKS)
def test_any_allowed_says_whether_a_slice_holds_an_allowed_pair(name):
    """any_allowed on every slice [q0, q1) × [k0, k1) of an 11 × 11 problem (the frame puts it at
    its global rows) against the slice of allowed_pairs; without a frame, the whole problem."""
    mask = BLOCK_MAP_MASKS[name][0]()
    allowed = ma.allowed_pairs(mask, B, HQ, 11, 11).astype(bool)
    cuts = (0, 2, 5, 6, 11)
    answers = set()
    for q0, q1 in zip(cuts, cuts[1:]):
        for k0, k1 in zip(cuts, cuts[1:]):
            expected = bool(allowed[:, :, q0:q1, k0:k1].any())
            answer = ma.any_allowed(mask, B, HQ, q1 - q0, k1 - k0, frame=(q0, k0, 11, 11))
            assert answer is expected, (name, q0, k0)
            answers.add(answer)
    assert answers == {True, False}  # each mask has both kinds of slice here
    assert ma.any_allowed(mask, B, HQ, 11) is True
    assert ma.any_allowed(ma.Mask().key_lengths([0, 0]), B, HQ, 11) is False
