"""Sparse attention from Python: Mask.global_tokens, Mask.block_sparse and the layout builders.

The expected pairs are written in NumPy from docs/semantics.md, not from the library: a global
query or key relaxes exactly what causal and window components hide (padding, chunks, segments,
layouts and dense masks still apply); a block-sparse layout allows (i, j) iff
layout[b, h, i // block_q, j // block_k] is 1, on indices. Each case goes through test_core_masks'
check_mask (allowed_pairs, attention and LSE against the float64 reference); dtypes, gradients,
the bitwise equality with a dense keep mask of the same pairs, block maps, the builders'
properties and the errors (the C++ library's E101–E104, and this layer's P60–P62) follow.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import maskattn as ma
from conftest import DTYPES, check_attention, random_inputs, round_to
from test_core_backward import check_gradients
from test_core_masks import B, HKV, HQ, check_mask, expected_block_map, grid, positions, window


def raises(pattern):
    return pytest.raises(ma.Error, match=pattern)


def global_pairs(query_ids, key_ids, q_len, k_len):
    """[B, 1, Lq, Lk]: the query or the key is global (ids [B, L] or [L], nonzero = global)."""
    b, _, i, j = grid(q_len, k_len)
    query_ids = np.broadcast_to(np.asarray(query_ids) != 0, (B, q_len))
    key_ids = np.broadcast_to(np.asarray(key_ids) != 0, (B, k_len))
    return query_ids[b, i] | key_ids[b, j]


def layout_pairs(layout, block_q, block_k, q_len, k_len):
    """[B|1, H|1, Lq, Lk]: the layout's block of (i, j), a size-1 block axis broadcast."""
    layout = np.asarray(layout).astype(bool)
    layout = layout.reshape((1,) * (4 - layout.ndim) + layout.shape)
    rows = np.arange(q_len) // block_q if layout.shape[2] > 1 else np.zeros(q_len, int)
    cols = np.arange(k_len) // block_k if layout.shape[3] > 1 else np.zeros(k_len, int)
    return layout[:, :, rows[:, None], cols[None, :]]


GLOBAL_IDS = np.array([[1, 0, 0, 0, 0, 1, 0, 0, 0], [0, 0, 0, 7, 0, 0, 0, 0, -1]])


# --- global tokens ------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["int64 [B,L]", "bool [B,L]", "int32 [L]", "torch [B,L]"])
def test_global_tokens_relax_causal_and_windows(rng, form):
    ids = {"int64 [B,L]": GLOBAL_IDS, "bool [B,L]": GLOBAL_IDS != 0,
           "int32 [L]": GLOBAL_IDS[0].astype(np.int32),
           "torch [B,L]": torch.tensor(GLOBAL_IDS, dtype=torch.int16)}[form]
    expected_ids = GLOBAL_IDS[0] if form == "int32 [L]" else GLOBAL_IDS
    relaxed = global_pairs(expected_ids, expected_ids, 9, 9)
    qpos, kpos = positions(9, 9)
    check_mask(rng, ma.Mask().causal().global_tokens(ids), (kpos <= qpos) | relaxed, 9, 9)
    check_mask(rng, ma.Mask().global_tokens(ids).window(1, 1),
               window(qpos, kpos, 1, 1) | relaxed, 9, 9)
    check_mask(rng, ma.Mask().sliding_window(2).global_tokens(ids, heads=None),
               window(qpos, kpos, 1, 0) | relaxed, 9, 9)
    check_mask(rng, ma.Mask().global_tokens(ids), np.ones((9, 9), bool), 9, 9)  # nothing to relax


def test_a_global_query_sees_the_future_and_every_query_sees_a_global_key():
    ids = np.zeros(6, np.int64)
    ids[2] = 1
    pairs = ma.allowed_pairs(ma.Mask().causal().global_tokens(ids), q_len=6)[0, 0]
    np.testing.assert_array_equal(pairs[2], np.ones(6))  # the global query: everything
    np.testing.assert_array_equal(pairs[:, 2], np.ones(6))  # the global key: every query
    np.testing.assert_array_equal(np.delete(np.delete(pairs, 2, 0), 2, 1),
                                  np.tril(np.ones((5, 5))))  # the rest: causal


def test_global_tokens_leave_padding_chunks_segments_dense_masks_alone(rng):
    relaxed = global_pairs(GLOBAL_IDS, GLOBAL_IDS, 9, 9)
    qpos, kpos = positions(9, 9)
    b, _, i, j = grid(9, 9)
    causal = (kpos <= qpos) | relaxed
    lengths = np.array([9, 4])  # sequence 1's global key 8 (id -1) is padding: still hidden
    check_mask(rng, ma.Mask().causal().global_tokens(GLOBAL_IDS).key_lengths(lengths),
               causal & (j < lengths[:, None, None, None]), 9, 9)
    check_mask(rng, ma.Mask().causal().global_tokens(GLOBAL_IDS).query_lengths(lengths),
               causal & (i < lengths[:, None, None, None]), 9, 9)
    check_mask(rng, ma.Mask().causal().global_tokens(GLOBAL_IDS).chunk(4),
               causal & (qpos // 4 == kpos // 4), 9, 9)
    segments = np.array([[0, 0, 0, 0, 1, 1, 1, 1, 1]] * B)
    check_mask(rng, ma.Mask().causal().global_tokens(GLOBAL_IDS).segments(segments),
               causal & (segments[b, i] == segments[b, j]), 9, 9)
    keep = rng.random((9, 9)) < 0.7
    check_mask(rng, ma.Mask().causal().global_tokens(GLOBAL_IDS).keep(keep), causal & keep, 9, 9)


def test_global_tokens_with_left_padding_index_ids_by_row(rng):
    starts = np.array([0, 3])
    qpos, kpos = positions(9, 9, key_starts=starts)
    _, _, _, j = grid(9, 9)
    expected = (j >= starts[:, None, None, None]) & (
        (kpos <= qpos) | global_pairs(GLOBAL_IDS, GLOBAL_IDS, 9, 9))
    check_mask(rng, ma.Mask().key_starts(starts).causal().global_tokens(GLOBAL_IDS), expected,
               9, 9)


@pytest.mark.parametrize("q_len,k_len", [(4, 10), (10, 4)])
def test_global_tokens_query_and_key_ids(rng, q_len, k_len):
    query_ids = rng.random((B, q_len)) < 0.3
    key_ids = (rng.random(k_len) < 0.3).astype(np.int8)  # [Lk]: every sequence
    relaxed = global_pairs(query_ids, key_ids, q_len, k_len)
    qpos, kpos = positions(q_len, k_len)
    check_mask(rng, ma.Mask().causal().global_tokens(query_ids, key_ids),
               (kpos <= qpos) | relaxed, q_len, k_len)
    qpos, kpos = positions(q_len, k_len, "top_left")
    check_mask(rng, ma.Mask().causal("top_left").global_tokens(query_ids, key_ids=key_ids),
               (kpos <= qpos) | relaxed, q_len, k_len)


def test_global_tokens_relax_only_components_of_their_heads(rng):
    qpos, kpos = positions(9, 9)
    _, h, _, _ = grid(9, 9)
    relaxed = global_pairs(GLOBAL_IDS, GLOBAL_IDS, 9, 9)
    check_mask(rng, ma.Mask().causal().global_tokens(GLOBAL_IDS, heads=[1, 3]),
               (kpos <= qpos) | (relaxed & np.isin(h, [1, 3])), 9, 9)
    mask = ma.Mask().causal(heads=range(2)).window(1, 0, heads=[2, 3]).global_tokens(
        GLOBAL_IDS, heads=range(1, 3))
    order = np.where(h < 2, kpos <= qpos, window(qpos, kpos, 1, 0))
    check_mask(rng, mask, order | (relaxed & np.isin(h, [1, 2])), 9, 9)


# --- block-sparse layouts -----------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 3), (HQ, 4, 3), (B, HQ, 4, 3), (1, 1, 4, 3), (4, 1),
                                   (HQ, 1, 3)])
def test_block_sparse_layout_of_any_rank_on_indices(rng, shape):
    layout = rng.random(shape) < 0.5
    expected = layout_pairs(layout, 3, 4, 11, 10)  # the last blocks are cut: ⌈11/3⌉ = 4
    check_mask(rng, ma.Mask().block_sparse(layout, 3, 4), expected, 11, 10)
    check_mask(rng, ma.Mask().block_sparse(layout.astype(np.int32), block_q=3, block_k=4),
               expected, 11, 10)
    check_mask(rng, ma.Mask().block_sparse(torch.from_numpy(layout), 3, 4), expected, 11, 10)


def test_block_sparse_square_blocks_by_default(rng):
    layout = ma.strided_layout(4, 1, 2)
    expected = layout_pairs(layout, 3, 3, 12, 12)
    check_mask(rng, ma.Mask().block_sparse(layout, 3), expected, 12, 12)
    assert ma.Mask().block_sparse(layout, 3).describe() == "block_sparse(3,3)"


def test_block_sparse_ignores_positions_and_intersects_the_rest(rng):
    layout = ma.fixed_layout(3, 2, 1, causal=False)
    qpos, kpos = positions(9, 12)  # Lq ≠ Lk: causal is bottom-right, the layout is on indices
    _, _, _, j = grid(9, 12)
    lengths = np.array([12, 7])
    check_mask(rng, ma.Mask().block_sparse(layout, 3, 4).causal().key_lengths(lengths),
               layout_pairs(layout, 3, 4, 9, 12) & (kpos <= qpos)
               & (j < lengths[:, None, None, None]), 9, 12)
    segments = np.array([[0] * 6 + [1] * 6] * B)
    b, _, i, j = grid(12, 12)
    check_mask(rng, ma.Mask().block_sparse(layout, 4).segments(segments),
               layout_pairs(layout, 4, 4, 12, 12) & (segments[b, i] == segments[b, j]), 12, 12)


def test_global_tokens_do_not_relax_a_layout(rng):
    layout = ma.strided_layout(3, 1, 2, causal=False)
    qpos, kpos = positions(9, 9)
    relaxed = global_pairs(GLOBAL_IDS, GLOBAL_IDS, 9, 9)
    expected = ((kpos <= qpos) | relaxed) & layout_pairs(layout, 3, 3, 9, 9)
    check_mask(rng, ma.Mask().causal().global_tokens(GLOBAL_IDS).block_sparse(layout, 3),
               expected, 9, 9)


# --- Longformer and BigBird: dtypes, gradients, a dense mask's bits, block maps ------------------


L, BLOCK = 192, 32  # several 64-key kernel tiles, some of them skipped


def longformer(rng, length=L):
    """window ±length/8, two global tokens per sequence, right padding: (mask, allowed)."""
    ids = np.zeros((B, length), np.int64)
    ids[:, 0] = 1
    ids[np.arange(B), rng.integers(1, length - length // 5, B)] = 1
    lengths = np.array([length, length - length // 5])
    side = length // 8
    qpos, kpos = positions(length, length)
    _, _, _, j = grid(length, length)
    allowed = (window(qpos, kpos, side, side) | global_pairs(ids, ids, length, length)) & (
        j < lengths[:, None, None, None])
    mask = ma.Mask().window(side, side).global_tokens(ids).key_lengths(lengths)
    return mask, np.broadcast_to(allowed, (B, HQ, length, length))


def bigbird(rng, length=L):
    """A per-head BigBird layout of 6 blocks, causal: (mask, allowed)."""
    block = length // 6
    layout = ma.bigbird_layout(6, random_blocks=1, seed=int(rng.integers(100)), heads=HQ)
    qpos, kpos = positions(length, length)
    allowed = layout_pairs(layout, block, block, length, length) & (kpos <= qpos)
    mask = ma.Mask().block_sparse(layout, block, block).causal()
    return mask, np.broadcast_to(allowed, (B, HQ, length, length))


PATTERNS = {"longformer": longformer, "bigbird": bigbird}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_sparse_patterns_forward_in_every_dtype(rng, pattern, dtype):
    mask, allowed = PATTERNS[pattern](rng)
    np.testing.assert_array_equal(ma.allowed_pairs(mask, B, HQ, L, L).astype(bool), allowed)
    q, k, v = random_inputs(rng, B, HQ, HKV, L, L, 16, dtype=dtype)
    check_attention(ma.attention(q, k, v, mask), q, k, v, dtype, keep=allowed)


# The gradients at a size the backward tests use (test_core_backward: ≤ 17 keys): at L = 192 the
# fused f32 backward's rounding of P recomputed from f32 scores exceeds the rule's 2 x naive +
# 1e-6 on dv of a global key (5e-6, the same bits as a dense keep mask of the same pairs, checked
# below); that is the kernel's f32 arithmetic, not the mask.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_sparse_patterns_backward_in_every_dtype(rng, pattern, dtype):
    mask, allowed = PATTERNS[pattern](rng, 24)
    q, k, v = random_inputs(rng, B, HQ, HKV, 24, 24, 8, dtype=dtype)
    dout = round_to(rng.standard_normal((B, HQ, 24, 8)), dtype)
    out, lse = ma.attention(q, k, v, mask, return_lse=True)
    grads = ma.attention_backward(q, k, v, out, lse, dout, mask)
    check_gradients(grads, q, k, v, dout, dtype, keep=allowed)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_dense_keep_mask_of_the_same_pairs_gives_the_same_bits(rng, pattern, dtype):
    mask, allowed = PATTERNS[pattern](rng)
    dense = ma.Mask().keep(allowed)
    q, k, v = random_inputs(rng, B, HQ, HKV, L, L, 16, dtype=dtype)
    dout = round_to(rng.standard_normal((B, HQ, L, 16)), dtype)
    out, lse = ma.attention(q, k, v, mask, return_lse=True)
    dense_out, dense_lse = ma.attention(q, k, v, dense, return_lse=True)
    assert np.array_equal(out, dense_out) and np.array_equal(lse, dense_lse)
    grads = ma.attention_backward(q, k, v, out, lse, dout, mask)
    dense_grads = ma.attention_backward(q, k, v, out, lse, dout, dense)
    for name, got, want in zip(("dq", "dk", "dv"), grads, dense_grads):
        assert np.array_equal(got, want), name


def test_block_map_of_a_layout_is_the_layout_at_its_own_block_size():
    layout = ma.bigbird_layout(8, seed=3, heads=HQ)
    tiles = ma.block_map(ma.Mask().block_sparse(layout, 16), B, HQ, 128, tile_q=16, tile_k=16)
    np.testing.assert_array_equal(tiles, np.broadcast_to(layout, (B, HQ, 8, 8)))
    assert (tiles == 0).any() and (tiles == 1).any()


@pytest.mark.parametrize("pattern", PATTERNS)
def test_block_map_skips_the_tiles_away_from_the_band(rng, pattern):
    mask, allowed = PATTERNS[pattern](rng)
    tiles = ma.block_map(mask, B, HQ, L, L, tile_q=32, tile_k=32)
    expected = expected_block_map(np.ascontiguousarray(allowed), 32, 32)
    np.testing.assert_array_equal(tiles[tiles != 2], expected[tiles != 2])  # sound
    assert (expected == 0).any() and (tiles == 0).sum() == (expected == 0).sum()  # skips them all


def test_flex_attention_takes_a_block_sparse_mask_as_its_block_mask(rng):
    import maskattn.torch as mt

    layout = torch.from_numpy(ma.strided_layout(L // BLOCK, 2, 3)).bool()

    def mask_mod(b, h, q_idx, kv_idx):
        return layout[q_idx // BLOCK, kv_idx // BLOCK]

    q, k, v = (torch.from_numpy(x) for x in random_inputs(rng, B, HQ, HQ, L, L, 16))
    from_mask_mod = mt.flex_attention(q, k, v, block_mask=mt.create_block_mask(
        mask_mod, None, None, L, L, BLOCK_SIZE=BLOCK))
    from_layout = mt.flex_attention(q, k, v, block_mask=ma.Mask().block_sparse(layout, BLOCK))
    assert torch.equal(from_mask_mod, from_layout)


def test_longformer_global_attention_mask_is_global_tokens():
    """Hugging Face's LongformerSelfAttention (float64, its global projections set to the local
    ones, so that only the pattern differs) against window(w/2, w/2) & global_tokens & padding:
    attention_window w is two-sided, the global_attention_mask goes in unchanged."""
    pytest.importorskip("transformers")
    from transformers import LongformerConfig
    from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

    torch.manual_seed(0)
    batch, length, embed, heads, attention_window = 2, 32, 32, 4, 8
    config = LongformerConfig(hidden_size=embed, num_attention_heads=heads,
                              attention_window=[attention_window], attention_probs_dropout_prob=0)
    layer = LongformerSelfAttention(config, layer_id=0).eval().double()
    for name in ("query", "key", "value"):
        getattr(layer, name + "_global").load_state_dict(getattr(layer, name).state_dict())
    hidden = torch.randn(batch, length, embed, dtype=torch.float64)
    global_attention_mask = torch.zeros(batch, length, dtype=torch.long)
    global_attention_mask[:, 0] = 1
    global_attention_mask[0, 13] = global_attention_mask[1, 20] = 1
    attention_mask = torch.ones(batch, length, dtype=torch.long)
    attention_mask[1, -5:] = 0
    # LongformerModel.forward's encoding of the two masks: -10000 padding, 0 local, +10000 global.
    merged = attention_mask * (global_attention_mask + 1)
    encoded = torch.where(merged == 0, -1e4, torch.where(merged == 2, 1e4, 0.0)).double()
    with torch.no_grad():
        expected = layer(hidden, attention_mask=encoded, is_index_masked=encoded < 0,
                         is_index_global_attn=encoded > 0, is_global_attn=True)[0]
        q, k, v = (getattr(layer, name)(hidden).view(batch, length, heads, -1).float()
                   for name in ("query", "key", "value"))
    mask = (ma.Mask().window(attention_window // 2, attention_window // 2)
            .global_tokens(global_attention_mask)
            .key_keep(attention_mask).query_keep(attention_mask))  # HF zeroes padded queries
    out = ma.attention(q, k, v, mask, layout="blhd").reshape(batch, length, embed)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)  # f32 inputs


# --- the layout builders ------------------------------------------------------------------------


def bigbird_seen_before_random(blocks, sliding, global_blocks):
    """[blocks, blocks]: the band of `sliding` blocks centred on each row, and the global blocks'
    rows and columns (the first ⌈g/2⌉ and the last ⌊g/2⌋)."""
    r, c = np.arange(blocks)[:, None], np.arange(blocks)[None, :]
    is_global = np.zeros(blocks, bool)
    is_global[:(global_blocks + 1) // 2] = True
    is_global[blocks - global_blocks // 2:] = True
    band = np.abs(r - c) <= (sliding - 1) // 2
    return band | is_global[:, None] | is_global[None, :], is_global


@pytest.mark.parametrize("blocks,sliding,global_blocks,random_blocks",
                         [(16, 3, 2, 3), (12, 5, 3, 2), (7, 3, 2, 10), (9, 1, 0, 1), (3, 3, 2, 3)])
def test_bigbird_layout_band_globals_and_random_blocks(blocks, sliding, global_blocks,
                                                       random_blocks):
    layout = ma.bigbird_layout(blocks, sliding_blocks=sliding, global_blocks=global_blocks,
                               random_blocks=random_blocks, seed=11)
    assert layout.dtype == np.uint8 and layout.shape == (blocks, blocks)
    assert set(np.unique(layout)) <= {0, 1}
    before, is_global = bigbird_seen_before_random(blocks, sliding, global_blocks)
    assert np.all(layout[before] == 1)  # the band and the global rows and columns are full
    extra = (layout.astype(bool) & ~before).sum(axis=1)
    remaining = (~before).sum(axis=1)
    np.testing.assert_array_equal(extra[~is_global],
                                  np.minimum(random_blocks, remaining)[~is_global])


def test_bigbird_layout_is_a_function_of_its_seed_and_head():
    same = ma.bigbird_layout(16, seed=5)
    np.testing.assert_array_equal(same, ma.bigbird_layout(16, seed=np.uint64(5)))
    assert not np.array_equal(same, ma.bigbird_layout(16, seed=6))
    assert not np.array_equal(ma.bigbird_layout(16), ma.bigbird_layout(16, seed=2**64 - 1))
    per_head = ma.bigbird_layout(16, seed=5, heads=4)
    assert per_head.shape == (4, 16, 16) and per_head.dtype == np.uint8
    assert len({per_head[h].tobytes() for h in range(4)}) == 4  # each head draws its own
    np.testing.assert_array_equal(per_head, ma.bigbird_layout(16, seed=5, heads=4))


def strided_expected(blocks, local_blocks, stride, causal):
    r, c = np.arange(blocks)[:, None], np.arange(blocks)[None, :]
    seen = (np.abs(r - c) < local_blocks) | ((r - c) % stride == 0)
    return seen & (c <= r) if causal else seen


def fixed_expected(blocks, chunk_blocks, summary_blocks, causal):
    r, c = np.arange(blocks)[:, None], np.arange(blocks)[None, :]
    seen = (r // chunk_blocks == c // chunk_blocks) | (c % chunk_blocks >= chunk_blocks
                                                        - summary_blocks)
    return seen & (c <= r) if causal else seen


@pytest.mark.parametrize("causal", [True, False])
def test_strided_and_fixed_layouts(causal):
    for blocks, local, stride in ((10, 2, 3), (7, 1, 1), (5, 9, 4)):
        layout = ma.strided_layout(blocks, local, stride, causal=causal)
        assert layout.dtype == np.uint8 and layout.shape == (blocks, blocks)
        np.testing.assert_array_equal(layout, strided_expected(blocks, local, stride, causal))
    for blocks, chunk, summary in ((10, 4, 1), (9, 3, 0), (6, 2, 2)):
        layout = ma.fixed_layout(blocks, chunk, summary, causal=causal)
        assert layout.dtype == np.uint8 and layout.shape == (blocks, blocks)
        np.testing.assert_array_equal(layout, fixed_expected(blocks, chunk, summary, causal))
    strided, fixed = ma.strided_layout(10, 2, 3, causal=causal), ma.fixed_layout(10, 4, 1,
                                                                                causal=causal)
    for layout in (strided, fixed):  # causal: the lower triangle with its diagonal
        assert np.all(np.diag(layout) == 1) and np.triu(layout, 1).any() != causal
    if not causal:
        np.testing.assert_array_equal(strided, strided.T)  # |r − c|, (r − c) mod s: symmetric
    heads = ma.strided_layout(6, 2, 2, causal=causal, heads=3)
    assert heads.shape == (3, 6, 6)
    np.testing.assert_array_equal(heads, np.broadcast_to(heads[0], heads.shape))
    assert ma.fixed_layout(6, 3, 1, causal=causal, heads=2).shape == (2, 6, 6)


def test_a_builders_layout_at_a_block_size_masks_attention(rng):
    layout = ma.strided_layout(5, 2, 2)
    expected = layout_pairs(layout, 4, 4, 18, 18)  # the last block holds two queries and keys
    check_mask(rng, ma.Mask().block_sparse(layout, 4), expected, 18, 18)
    assert not np.triu(expected[0, 0], 4).any()


# --- errors -------------------------------------------------------------------------------------


def test_global_token_ids_must_fit_the_call():  # E103
    ids = np.zeros((B, 9), np.int64)
    with raises(r"^global_tokens ids have shape \[2,9\]; expected \[B,L\] = \[2,8\] \(or \[8\] "
                r"for every sequence\)"):
        ma.allowed_pairs(ma.Mask().causal().global_tokens(ids), B, 1, 8)
    with raises(r"^global_tokens ids have shape \[2,9\]; expected \[B,L\] = \[3,9\]"):
        ma.attention(*random_inputs(np.random.default_rng(0), 3, 1, 1, 9, 9, 4),
                     ma.Mask().global_tokens(ids))
    with raises(r"^global_tokens key ids have shape \[2,9\]; expected \[B,Lk\] = \[2,10\]"):
        ma.allowed_pairs(ma.Mask().global_tokens(ids[:, :3], ids), B, 1, 3, 10)
    with raises(r"^global_tokens has shape \[2,2,2\]; expected \[B,L\] or \[L\]"):
        ma.Mask().global_tokens(np.zeros((2, 2, 2)))
    with raises(r"^key global_tokens has shape \[1,1,2\]; expected \[B,Lk\] or \[Lk\]"):
        ma.Mask().global_tokens(np.zeros(2), np.zeros((1, 1, 2)))
    with raises(r"^global_tokens applies to head 5 but the query has Hq=2 heads"):
        ma.allowed_pairs(ma.Mask().global_tokens([0, 1], heads=[5]), 1, 2, 2)


def test_one_global_id_array_needs_as_many_queries_as_keys():  # E103
    with raises(r"^global_tokens: one id array for queries and keys needs Lq == Lk \(got Lq=9, "
                r"Lk=10\); give query and key ids separately"):
        ma.allowed_pairs(ma.Mask().causal().global_tokens(np.zeros(9)), 1, 1, 9, 10)


def test_global_token_ids_are_integers():
    with raises(r"^ids must hold integers, found 0.5 at flat index 0"):  # P18
        ma.Mask().global_tokens([0.5, 1])
    with raises(r"^key_ids must hold integers, found nan"):
        ma.Mask().global_tokens([0, 1], [np.nan, 1])
    with raises(r"^ids is None; it needs values"):
        ma.Mask().global_tokens(None)


def test_a_layout_must_cover_the_lengths_block_for_block():  # E102
    layout = np.ones((3, 3), bool)
    with raises(r"^block_sparse\(4,4\): layout \[3,3\] has 3 query blocks of 4, but Lq=20 needs "
                r"⌈20/4⌉ = 5"):
        ma.allowed_pairs(ma.Mask().block_sparse(layout, 4), 1, 1, 20, 12)
    with raises(r"^block_sparse\(4,7\): layout \[3,3\] has 3 key blocks of 7, but Lk=22 needs "
                r"⌈22/7⌉ = 4"):
        ma.allowed_pairs(ma.Mask().block_sparse(layout, 4, 7), 1, 1, 12, 22)
    with raises(r"^block_sparse\(4,4\): layout \[3,3\] has 3 query blocks of 4, but Lq=8 needs "
                r"⌈8/4⌉ = 2"):  # too many blocks is as wrong as too few
        ma.allowed_pairs(ma.Mask().block_sparse(layout, 4), 1, 1, 8, 12)
    with raises(r"^block_sparse\(4,4\): layout shape \[3,3,3\] does not broadcast to "
                r"\[B,Hq,nQ,nK\] = \[1,2,3,3\]"):
        ma.allowed_pairs(ma.Mask().block_sparse(np.ones((3, 3, 3)), 4), 1, 2, 12)


def test_a_layout_is_a_rank_2_to_4_array_of_0_and_1_with_positive_block_sizes():  # E101
    for shape in ((3,), (1, 1, 1, 1, 1)):
        with raises(r"^block_sparse\(2,2\): layout has shape \[[0-9,]+\]; expected \[nQ,nK\], "
                    r"\[H,nQ,nK\] or \[B,H,nQ,nK\]"):
            ma.Mask().block_sparse(np.ones(shape), 2)
    with raises(r"^layout must hold only 0 and 1 \(or bools\), found 2 at flat index 1"):  # P18
        ma.Mask().block_sparse(np.array([[0, 2]]), 2)
    with raises(r"^layout must hold only 0 and 1 \(or bools\), found 0.5 at flat index 1"):
        ma.Mask().block_sparse(torch.tensor([[0, 0.5]]), 2)
    with raises(r"^block_sparse\(0,0\): block sizes must be ≥ 1 \(block_q = 0, block_k = 0\)"):
        ma.Mask().block_sparse(np.ones((2, 2)), 0)
    with raises(r"^block_sparse\(2,-1\): block sizes must be ≥ 1 \(block_q = 2, block_k = -1\)"):
        ma.Mask().block_sparse(np.ones((2, 2)), 2, -1)


def test_layout_builders_check_their_values():  # E104
    for call, message in (
            (lambda: ma.bigbird_layout(0), r"bigbird_layout: blocks = 0 must be ≥ 1"),
            (lambda: ma.bigbird_layout(4, sliding_blocks=2),
             r"bigbird_layout: sliding_blocks = 2 must be odd"),
            (lambda: ma.bigbird_layout(4, global_blocks=-1),
             r"bigbird_layout: global_blocks = -1 must be ≥ 0"),
            (lambda: ma.bigbird_layout(4, random_blocks=-1),
             r"bigbird_layout: random_blocks = -1 must be ≥ 0"),
            (lambda: ma.bigbird_layout(4, heads=-1), r"bigbird_layout: heads = -1 must be ≥ 0"),
            (lambda: ma.strided_layout(4, 0, 1), r"strided_layout: local_blocks = 0 must be ≥ 1"),
            (lambda: ma.strided_layout(4, 1, 0), r"strided_layout: stride = 0 must be ≥ 1"),
            (lambda: ma.fixed_layout(4, 2, 3),
             r"fixed_layout: summary_blocks = 3 exceeds chunk_blocks = 2"),
            (lambda: ma.fixed_layout(4, 0, 0), r"fixed_layout: chunk_blocks = 0 must be ≥ 1")):
        with raises("^" + message):
            call()


def test_P60_block_sizes_not_ints():
    for bad in (2.0, True, "3", None):
        with raises(r"^block_sparse: block_q must be an int, got "):
            ma.Mask().block_sparse(np.ones((2, 2)), bad)
    with raises(r"^block_sparse: block_k must be an int, got '3'"):
        ma.Mask().block_sparse(np.ones((2, 2)), 2, "3")
    ma.Mask().block_sparse(np.ones((2, 2)), np.int32(2), torch.tensor(3))  # integers of any kind


def test_P61_layout_builder_arguments_of_the_wrong_type():
    with raises(r"^bigbird_layout: blocks must be an int, got 4.0"):
        ma.bigbird_layout(4.0)
    with raises(r"^bigbird_layout: random_blocks must be an int, got True"):
        ma.bigbird_layout(4, random_blocks=True)
    with raises(r"^bigbird_layout: blocks must be an int, got 9223372036854775808"):
        ma.bigbird_layout(2**63)
    with raises(r"^strided_layout: stride must be an int, got '2'"):
        ma.strided_layout(4, 1, "2")
    with raises(r"^fixed_layout: heads must be an int, got None"):
        ma.fixed_layout(4, 2, 1, heads=None)
    for bad in (1, "yes", None):
        with raises(r"^strided_layout: causal must be True or False, got "):
            ma.strided_layout(4, 1, 1, causal=bad)
    with raises(r"^fixed_layout: causal must be True or False, got 0"):
        ma.fixed_layout(4, 2, 1, causal=0)
    assert ma.fixed_layout(np.int64(4), 2, 1, causal=np.bool_(False)).shape == (4, 4)


def test_P62_bigbird_seed_not_an_unsigned_64_bit_int():
    for bad in (-1, 2**64, 1.5, True, "7"):
        with raises(r"^bigbird_layout: seed must be an int in \[0, 2\*\*64\), got "):
            ma.bigbird_layout(4, seed=bad)
