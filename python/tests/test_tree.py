"""Draft trees of speculative decoding from Python: Mask.tree, tree_position_ids, tree_path and
accept_tree_path.

The expected pairs are written in NumPy from docs/semantics.md §3 ("Draft trees"), not from the
library: the last T keys and queries are the draft, a prefix key is seen causally (rows,
bottom-right), a draft key only by the draft queries that descend from it (found by walking each
query's parents). Each case goes through test_core_masks' check_mask (allowed_pairs, attention and
LSE against the float64 reference); then the bitwise equality with a dense keep mask of the same
pairs in every dtype and both kernels, gradients against torch autograd, the helpers, one
speculative step end to end, and this layer's errors P87–P89.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import maskattn as ma
import maskattn.torch as mt
from conftest import DTYPES, random_inputs, round_to
from test_core_backward import check_gradients
from test_core_masks import B, HKV, HQ, check_mask


def raises(pattern):
    return pytest.raises(ma.Error, match=pattern)


def random_parents(rng, rows, size):
    """``rows`` random trees of ``size`` tokens: each parent uniform among the earlier tokens, or
    -1 (a new root)."""
    return np.array([[rng.integers(-1, t) if t > 0 else -1 for t in range(size)]
                     for _ in range(rows)], dtype=np.int64)


def ancestors_or_self(parents, s):
    found = set()
    while s >= 0:
        found.add(s)
        s = parents[s]
    return found


def tree_pairs(parents, q_len, k_len):
    """[B, 1, Lq, Lk] of the tree (parents [T] for every sequence, or [B, T])."""
    parents = np.broadcast_to(np.asarray(parents), (B, np.asarray(parents).shape[-1]))
    size = parents.shape[1]
    keep = np.zeros((B, 1, q_len, k_len), dtype=bool)
    for b in range(B):
        for i in range(q_len):
            s = i - (q_len - size)
            seen = ancestors_or_self(parents[b], s) if s >= 0 else set()
            for j in range(k_len):
                t = j - (k_len - size)
                keep[b, 0, i, j] = j <= i + (k_len - q_len) if t < 0 else t in seen
    return keep


TREE = np.array([-1, 0, 0, 1, 2, -1])  # 0 → 1 → 3, 0 → 2 → 4, and a second root 5


@pytest.mark.parametrize("form", ["list [T]", "int32 [B,T]", "torch [B,T]", "int16 [T]"])
@pytest.mark.parametrize("q_len,k_len", [(6, 10), (10, 10), (3, 10), (12, 10), (6, 6)])
def test_tree_pairs_are_the_ancestors_after_the_prefix(rng, form, q_len, k_len):
    batched = np.stack([TREE, np.array([-1, -1, 1, 0, 3, 4])])
    parents = {"list [T]": TREE.tolist(), "int32 [B,T]": batched.astype(np.int32),
               "torch [B,T]": torch.tensor(batched), "int16 [T]": TREE.astype(np.int16)}[form]
    expected_parents = batched if "[B,T]" in form else TREE
    check_mask(rng, ma.Mask().tree(parents), tree_pairs(expected_parents, q_len, k_len), q_len,
               k_len)


def test_tree_with_other_components_and_heads(rng):
    parents = random_parents(rng, B, 9)
    keep = tree_pairs(parents, 9, 20)
    j = np.arange(20)
    starts = np.array([3, 0])
    padding = (j[None, :] >= starts[:, None])[:, None, None, :]
    check_mask(rng, ma.Mask().tree(parents).key_starts(starts), keep & padding, 9, 20)
    # Heads 1 and 3 only: the other heads are causal.
    i = np.arange(9)[:, None] + 11
    causal = np.broadcast_to(j[None, :] <= i, (B, HQ, 9, 20))
    expected = causal.copy()
    expected[:, [1, 3]] = np.broadcast_to(keep, (B, 1, 9, 20))
    check_mask(rng, ma.Mask().causal().tree(parents, heads=[1, 3]), expected, 9, 20)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", ["fused", "reference"])
def test_tree_attention_is_the_dense_keep_of_its_pairs_bitwise(rng, dtype, kernel):
    for size, prefix, q_len in ((5, 300, 5), (70, 40, 70), (30, 0, 30), (20, 50, 70)):
        parents = random_parents(rng, B, size)
        q, k, v = random_inputs(rng, B, HQ, HKV, q_len, size + prefix, 16, dtype=dtype)
        tree = ma.Mask().tree(parents)
        dense = ma.Mask().keep(tree_pairs(parents, q_len, size + prefix))
        out, lse = ma.attention(q, k, v, tree, kernel=kernel, return_lse=True)
        dense_out, dense_lse = ma.attention(q, k, v, dense, kernel=kernel, return_lse=True)
        np.testing.assert_array_equal(np.asarray(out).view(np.uint8),
                                      np.asarray(dense_out).view(np.uint8))
        np.testing.assert_array_equal(lse, dense_lse)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tree_gradients_match_torch_autograd(rng, dtype):
    parents = random_parents(rng, B, 11)
    q, k, v = random_inputs(rng, B, HQ, HKV, 11, 17, 8, dtype=dtype)
    dout = round_to(rng.standard_normal((B, HQ, 11, 8)), dtype)
    mask = ma.Mask().tree(parents)
    out, lse = ma.attention(q, k, v, mask, return_lse=True)
    grads = ma.attention_backward(q, k, v, out, lse, dout, mask)
    check_gradients(grads, q, k, v, dout, dtype, keep=tree_pairs(parents, 11, 17))


def test_tree_through_torch_autograd_equals_the_dense_keep(rng):
    parents = torch.tensor(random_parents(rng, B, 7))
    tensors = [torch.from_numpy(x).requires_grad_() for x in random_inputs(rng, B, HQ, HKV, 7, 15, 8)]
    dense = ma.Mask().keep(tree_pairs(parents.numpy(), 7, 15))
    results = []
    for mask in (ma.Mask().tree(parents), dense):
        leaves = [x.detach().clone().requires_grad_() for x in tensors]
        out = mt.attention(*leaves, mask)
        out.square().sum().backward()
        results.append([out.detach()] + [x.grad for x in leaves])
    for got, want in zip(*results):
        assert torch.equal(got, want)


# --- the helpers --------------------------------------------------------------------------------


def test_position_ids_are_the_depth_after_the_prefix():
    np.testing.assert_array_equal(ma.tree_position_ids(TREE, 4), [4, 5, 5, 6, 6, 4])
    batched = ma.tree_position_ids(torch.tensor([[-1, 0, 1], [-1, -1, 0]]), 0)
    assert isinstance(batched, torch.Tensor) and batched.dtype == torch.int64
    assert batched.tolist() == [[0, 1, 2], [0, 0, 1]]
    assert ma.tree_path(TREE, 4) == [0, 2, 4]
    assert ma.tree_path(np.array([[-1, 0, 1], [-1, -1, 1]]), 2, b=1) == [1, 2]
    assert ma.tree_path(TREE, np.int64(3), b=torch.tensor(0)) == [0, 1, 3]


@pytest.mark.parametrize("framework", ["numpy", "torch", "bfloat16 tensor"])
def test_accept_tree_path_moves_the_path_after_the_prefix(rng, framework):
    # A cache of capacity 12 holding 10 rows: a prefix of 4 and a draft of 6.
    k = rng.standard_normal((B, HKV, 12, 4)).astype(np.float32)
    v = rng.standard_normal((B, HKV, 12, 3)).astype(np.float32)
    path = np.array([[0], [5]])  # a root in each sequence: the same count A = 1
    expected_k, expected_v = k.copy(), v.copy()
    for b, rows in enumerate(([4 + 0], [4 + 5])):
        expected_k[b, :, 4:5] = k[b][:, rows]
        expected_v[b, :, 4:5] = v[b][:, rows]
    if framework == "numpy":
        kc, vc = k.copy(), v.copy()
    elif framework == "torch":
        kc, vc = torch.from_numpy(k.copy()), torch.from_numpy(v.copy())
    else:
        kc, vc = torch.from_numpy(k).bfloat16(), torch.from_numpy(v).bfloat16()
        expected_k = torch.from_numpy(expected_k).bfloat16().float().numpy()
        expected_v = torch.from_numpy(expected_v).bfloat16().float().numpy()
    length = ma.accept_tree_path(kc, vc, TREE, path, length=10)
    assert length == 5
    got_k = kc.float().numpy() if framework != "numpy" else kc
    got_v = vc.float().numpy() if framework != "numpy" else vc
    np.testing.assert_array_equal(got_k[:, :, :5], expected_k[:, :, :5])
    np.testing.assert_array_equal(got_v[:, :, :5], expected_v[:, :, :5])
    # The whole path of node 4 in both sequences, on arrays that are exactly the filled cache.
    kc, vc = k[:, :, :10].copy(), v[:, :, :10].copy()
    assert ma.accept_tree_path(kc, vc, TREE, ma.tree_path(TREE, 4)) == 7
    np.testing.assert_array_equal(kc[:, :, 4:7], k[:, :, [4, 6, 8]])
    # An empty path rolls the draft back.
    assert ma.accept_tree_path(kc, vc, TREE, []) == 4


def test_one_speculative_step_equals_decoding_each_path(rng):
    """Prefix keys and values, a draft tree's q, k, v: each draft output equals attention of its
    query over the prefix and its own path (bitwise with the reference kernel, to rounding with
    the fused one); after accept the cache is the prefix and the path, and the next step on it
    equals the same step on a cache that never held the other branches."""
    prefix, size, heads, dim = 37, 7, HQ, 16
    parents = np.array([[-1, 0, 0, 1, 2, 3, -1], [-1, -1, 1, 0, 2, 4, 5]])
    q, k, v = random_inputs(rng, B, heads, HKV, size, prefix + size, dim)
    for kernel, tolerance in (("reference", 0.0), ("fused", 1e-6)):
        out = ma.attention(q, k, v, ma.Mask().tree(parents), kernel=kernel)
        for b in range(B):
            for node in range(size):
                rows = list(range(prefix)) + [prefix + t for t in ma.tree_path(parents, node, b)]
                alone = ma.attention(q[b:b + 1, :, node:node + 1], k[b:b + 1, :, rows],
                                     v[b:b + 1, :, rows], ma.Mask().causal(), kernel=kernel)
                np.testing.assert_allclose(out[b:b + 1, :, node:node + 1], alone, rtol=0,
                                           atol=tolerance)
    path = np.array([ma.tree_path(parents, 5, b) for b in range(B)])  # 4 tokens in each
    kc, vc = k.copy(), v.copy()
    length = ma.accept_tree_path(kc, vc, parents, path)
    assert length == prefix + 4
    plain_k = np.stack([k[b][:, list(range(prefix)) + list(prefix + path[b])] for b in range(B)])
    plain_v = np.stack([v[b][:, list(range(prefix)) + list(prefix + path[b])] for b in range(B)])
    np.testing.assert_array_equal(kc[:, :, :length], plain_k)
    np.testing.assert_array_equal(vc[:, :, :length], plain_v)
    q2, k2, v2 = random_inputs(rng, B, heads, HKV, 3, 3, dim)
    step = ma.Mask().tree([-1, 0, 0])
    after_accept = ma.attention(q2, np.concatenate([kc[:, :, :length], k2], 2),
                                np.concatenate([vc[:, :, :length], v2], 2), step)
    after_plain = ma.attention(q2, np.concatenate([plain_k, k2], 2),
                               np.concatenate([plain_v, v2], 2), step)
    np.testing.assert_array_equal(after_accept, after_plain)


def test_library_errors_reach_python():
    with raises(r"^tree: parents\[2\] = 2 must be -1"):
        ma.Mask().tree([-1, 0, 2])
    with raises(r"tree\[5\]: the draft of T=5 tokens is longer than the keys, Lk=4"):
        ma.allowed_pairs(ma.Mask().tree([-1, 0, 1, 2, 3]), 1, 1, 3, 4)
    k = np.zeros((1, 1, 6, 2), np.float32)
    with raises(r"accept_tree_path: path\[2\] = 2 has parent 0, not path\[1\]"):
        ma.accept_tree_path(k, k.copy(), [-1, 0, 0], [0, 1, 2])


# --- errors -------------------------------------------------------------------------------------


def test_P87_accept_tree_path_needs_arrays_it_can_write(rng):
    k = np.zeros((1, 1, 6, 2), np.float32)
    with raises(r"^accept_tree_path: k must be the cache itself, an array to move rows in "
                r"\(NumPy, PyTorch or DLPack\), got list"):
        ma.accept_tree_path(k.tolist(), k, [-1], [0])
    frozen = k.copy()
    frozen.flags.writeable = False
    with raises(r"^accept_tree_path: v \(shape \[1, 1, 6, 2\]\) is read-only; the accepted rows "
                r"are moved in place"):
        ma.accept_tree_path(k, frozen, [-1], [0])
    with raises(r"^accept_tree_path: k has shape \[6, 2\]; a cache is \[B, H, L, D\]"):
        ma.accept_tree_path(k[0, 0], k, [-1], [0])


def test_P88_tree_helper_arguments_must_be_ints():
    for bad in (4.0, True, None, "4", torch.tensor(4.0)):
        with raises(r"^tree_position_ids: prefix_length must be an int, got "):
            ma.tree_position_ids(TREE, bad)
    with raises(r"^tree_path: node must be an int, got 2.0"):
        ma.tree_path(TREE, 2.0)
    with raises(r"^tree_path: b must be an int, got False"):
        ma.tree_path(TREE, 2, b=False)
    k = np.zeros((1, 1, 6, 2), np.float32)
    with raises(r"^accept_tree_path: length must be an int, got 6.0"):
        ma.accept_tree_path(k, k.copy(), [-1], [0], length=6.0)


def test_P89_tree_indices_must_be_integers():
    with raises(r"^tree: parents has dtype float64; it holds token indices: give integers"):
        ma.Mask().tree([-1.0, 0.0])
    with raises(r"^tree: parents has dtype bool; it holds token indices"):
        ma.Mask().tree(np.array([True, False]))
    with raises(r"^tree_position_ids: parents has dtype float32"):
        ma.tree_position_ids(torch.tensor([-1.0, 0.0]), 0)
    k = np.zeros((1, 1, 6, 2), np.float32)
    with raises(r"^accept_tree_path: path has dtype float64; it holds token indices"):
        ma.accept_tree_path(k, k.copy(), [-1, 0], [0.0, 1.0])
    assert ma.accept_tree_path(k, k.copy(), [-1, 0], []) == 4  # an empty list is no index at all
