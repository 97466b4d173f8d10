"""maskattn.PagedKVCache and attention_paged: against PyTorch's float64 math on the cache's
decoded values, bitwise against maskattn.attention on the same rows in a contiguous tensor, the
block bookkeeping, draft trees over ragged batches (each sequence's own, bitwise the call on it
alone), and the Python catalogue rows P94–P95."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import maskattn as ma


def filled(format_, lengths, heads=2, dim=32, block=16, seed=0):
    cache = ma.PagedKVCache(64, block, heads, dim, format=format_)
    rng = np.random.default_rng(seed)
    ids = []
    for n in lengths:
        s = cache.add_sequence()
        cache.append(s, rng.standard_normal((heads, n, dim), dtype=np.float32),
                     rng.standard_normal((heads, n, dim), dtype=np.float32))
        ids.append(s)
    return cache, ids


def decoded_rows(cache, sequence, group):
    """The sequence's decoded keys and values in float64, each kv head repeated for its `group`
    query heads: [Hq, n, D]."""
    k = torch.from_numpy(cache.decoded_keys(sequence)).double().repeat_interleave(group, 0)
    v = torch.from_numpy(cache.decoded_values(sequence)).double().repeat_interleave(group, 0)
    return k, v


def torch_reference(q, cache, ids, query_lengths):
    """Each sequence alone: its queries at its own end, causal, float64 math on decoded rows."""
    batch, hq, lq, _ = q.shape
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = hq // cache.kv_heads
    for b, s in enumerate(ids):
        k, v = decoded_rows(cache, s, group)
        n, t = k.shape[1], query_lengths[b]
        qs = q[b, :, :t].double()
        scores = qs @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        positions = torch.arange(n - t, n)[:, None]
        scores = scores.masked_fill(torch.arange(n)[None, :] > positions, float("-inf"))
        out[b, :, :t] = torch.softmax(scores, -1) @ v
    return out


@pytest.mark.parametrize("format_", ["f32", "bf16", "int8", "fp8-e4m3", "fp8-e5m2", "q4"])
@pytest.mark.parametrize("lq", [1, 3, 70])
def test_paged_attention_matches_float64_math_on_the_decoded_cache(format_, lq):
    cache, ids = filled(format_, [150, 3, 80], heads=2)
    q = torch.randn(3, 4, lq, 32)
    qlens = [min(lq, cache.length(s)) for s in ids]
    out = ma.attention_paged(q, cache, ids, query_lengths=qlens)
    want = torch_reference(q, cache, ids, qlens)
    assert out.dtype == torch.float32
    assert (out.double() - want).abs().max().item() < 2e-6
    for b, t in enumerate(qlens):
        assert torch.all(out[b, :, t:] == 0)  # padded query rows


def test_paged_equals_contiguous_attention_bitwise():
    cache, ids = filled("f32", [200, 37], heads=2)
    longest = 200
    k = np.zeros((2, 2, longest, 32), np.float32)
    v = np.zeros_like(k)
    for b, s in enumerate(ids):
        n = cache.length(s)
        k[b, :, :n] = cache.decoded_keys(s)
        v[b, :, :n] = cache.decoded_values(s)
    q = np.random.default_rng(1).standard_normal((2, 4, 1, 32), dtype=np.float32)
    lengths = [cache.length(s) for s in ids]
    mask = ma.Mask().causal().key_lengths(lengths).query_lengths([1, 1])
    dense = ma.attention(q, k, v, mask=mask)
    paged = ma.attention_paged(q, cache, ids)
    assert np.array_equal(dense, paged)


def test_fork_free_and_the_pool():
    cache, (a,) = filled("int8", [20])
    assert cache.blocks_in_use == 2
    b = cache.fork(a)
    assert cache.block_table(a) == cache.block_table(b) and cache.blocks_in_use == 2
    cache.append(b, np.ones((2, 1, 32), np.float32), np.ones((2, 1, 32), np.float32))
    assert cache.blocks_in_use == 3 and cache.length(b) == 21 and cache.length(a) == 20
    q = torch.randn(2, 2, 1, 32)
    out = ma.attention_paged(q, cache, [a, b])
    alone = ma.attention_paged(q[:1], cache, [a])
    assert torch.equal(out[:1], alone)
    cache.free(a)
    cache.free(b)
    assert cache.blocks_in_use == 0 and cache.live_sequences() == []


def test_append_accepts_torch_and_bfloat16():
    cache = ma.PagedKVCache(8, 16, 1, 32, format="bf16")
    s = cache.add_sequence()
    k = torch.randn(1, 5, 32, dtype=torch.bfloat16)
    cache.append(s, k, k.transpose(0, 0))
    assert torch.equal(torch.from_numpy(cache.decoded_keys(s)), k.float())


def test_out_of_blocks_is_the_catalogue_error_and_changes_nothing():
    cache = ma.PagedKVCache(1, 16, 1, 8)
    s = cache.add_sequence()
    with pytest.raises(ma.Error, match="out of blocks"):
        cache.append(s, np.ones((1, 17, 8), np.float32), np.ones((1, 17, 8), np.float32))
    assert cache.length(s) == 0 and cache.free_blocks == 1


def test_P94_cache_must_be_a_paged_kv_cache():
    with pytest.raises(ma.Error, match="cache must be a maskattn.PagedKVCache, got dict"):
        ma.attention_paged(np.zeros((1, 1, 1, 8), np.float32), {}, [0])


def test_P95_sequences_and_query_lengths_are_lists_of_ints():
    cache, ids = filled("f32", [4, 4], heads=1, dim=8)
    q = np.zeros((2, 1, 1, 8), np.float32)
    with pytest.raises(ma.Error, match="sequences must be a list of ints, got an element 0.5"):
        ma.attention_paged(q, cache, [0, 0.5])
    with pytest.raises(ma.Error, match="query_lengths has 1 values but q has a batch of 2"):
        ma.attention_paged(q, cache, ids, query_lengths=[1])
    with pytest.raises(ma.Error, match="sequence must be an int"):
        cache.append("0", np.ones((1, 1, 8), np.float32), np.ones((1, 1, 8), np.float32))


def descends(parents, s, t):
    """Draft token s is t or one of t's descendants."""
    while s >= 0:
        if s == t:
            return True
        s = parents[s]
    return False


def tree_reference(q, cache, ids, query_lengths, parents):
    """docs/semantics.md §3 and §18 in float64 on the decoded cache: sequence b's draft is its
    last T positions and its queries its last query_lengths[b]; a key before the draft is seen
    causally, a draft key only by a draft query that is it or descends from it."""
    batch, hq, lq, dim = q.shape
    size = parents.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = hq // cache.kv_heads
    for b, s in enumerate(ids):
        k, v = decoded_rows(cache, s, group)
        n, t = k.shape[1], query_lengths[b]
        allowed = torch.zeros(t, n, dtype=torch.bool)
        for i in range(t):
            position, draft_query = n - t + i, i - (t - size)
            for j in range(n):
                draft_key = j - (n - size)
                allowed[i, j] = j <= position if draft_key < 0 else (
                    draft_query >= 0 and descends(parents[b].tolist(), draft_query, draft_key))
        scores = q[b, :, :t].double() @ k.transpose(-1, -2) / dim ** 0.5
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[b, :, :t] = torch.softmax(scores, -1) @ v
    return out


@pytest.mark.parametrize("format_", ["f32", "int8"])
def test_a_tree_over_a_ragged_batch_is_each_sequences_own(format_):
    """Speculative decoding for several requests at once: sequences of different lengths (one as
    long as the draft), each with its own tree ([B, T] parents) and its own query count; each
    sequence's rows equal the call on it alone, bit for bit, and the documented rule."""
    cache, ids = filled(format_, [37, 5, 64, 20], heads=2)
    parents = torch.tensor([[-1, 0, 0, 1, 2], [-1, -1, 0, 1, 1], [-1, 0, 1, 2, 3],
                            [-1, 0, 0, 0, -1]])
    qlens = [8, 5, 3, 6]
    q = torch.randn(4, 4, 8, 32, generator=torch.Generator().manual_seed(5))
    out, lse = ma.attention_paged(q, cache, ids, query_lengths=qlens, mask=ma.Mask().tree(parents),
                                  threads=2, return_lse=True)
    for b, n in enumerate(qlens):
        alone, alone_lse = ma.attention_paged(q[b:b + 1, :, :n], cache, [ids[b]],
                                              mask=ma.Mask().tree(parents[b]), return_lse=True)
        assert torch.equal(out[b:b + 1, :, :n], alone)
        assert torch.equal(lse[b:b + 1, :, :n], alone_lse)
        assert torch.all(out[b, :, n:] == 0) and torch.all(lse[b, :, n:] == float("-inf"))
    want = tree_reference(q, cache, ids, qlens, parents)
    assert (out.double() - want).abs().max().item() < 2e-6


def test_a_tree_needs_every_sequence_to_hold_its_draft():
    cache, ids = filled("f32", [9, 3], heads=1, dim=8)
    q = np.zeros((2, 1, 2, 8), np.float32)
    with pytest.raises(ma.Error, match=r"attention_paged: sequences\[1\] = 1 holds 3 positions, "
                                       r"fewer than the 4 draft tokens of tree\[4\]"):
        ma.attention_paged(q, cache, ids, mask=ma.Mask().tree([-1, 0, 1, 2]))
