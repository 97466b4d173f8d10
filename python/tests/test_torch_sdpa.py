"""maskattn.torch.scaled_dot_product_attention against torch.nn.functional.scaled_dot_product_attention
(math backend, float64 reference), forward and gradients, by the rule in test_torch_common."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import maskattn  # noqa: E402
import maskattn.torch as mt  # noqa: E402
from maskattn._torch_masks import converted_masks  # noqa: E402
from test_torch_common import (  # noqa: E402
    DTYPES,
    assert_close_to_math,
    math_sdpa,
    randn,
    torch_sdpa,
)

B, H, D = 2, 4, 16


def qkv(q_len, k_len, heads=H, kv_heads=H, seed=0, value_dim=D):
    return [
        randn((B, heads, q_len, D), seed),
        randn((B, kv_heads, k_len, D), seed + 1),
        randn((B, kv_heads, k_len, value_dim), seed + 2),
    ]


def bool_mask(shape, seed, keep=0.7):
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=generator) < keep
    return mask


def float_mask(shape, seed):
    """Finite values plus some −inf (hidden pairs)."""
    values = randn(shape, seed)
    return values.masked_fill(~bool_mask(shape, seed + 7, keep=0.8), float("-inf"))


MASK_SHAPES = {
    "LS": lambda L, S: (L, S),
    "11LS": lambda L, S: (1, 1, L, S),
    "B11S": lambda L, S: (B, 1, 1, S),
    "BHLS": lambda L, S: (B, H, L, S),
    "1HLS": lambda L, S: (1, H, L, S),
}


def both(**kwargs):
    """The same keyword arguments for maskattn and PyTorch."""
    return (
        lambda q, k, v: mt.scaled_dot_product_attention(q, k, v, **kwargs),
        lambda q, k, v: torch_sdpa(q, k, v, **kwargs),
    )


@pytest.mark.parametrize("shape_name", sorted(MASK_SHAPES))
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_masks_broadcast_like_pytorch(shape_name, kind):
    L, S = 10, 23
    shape = MASK_SHAPES[shape_name](L, S)
    leaves = qkv(L, S)
    if kind == "bool":
        mask = bool_mask(shape, 5)
        ours, theirs = both(attn_mask=mask)
    else:  # the float mask is a leaf: its gradient is compared too
        leaves.append(float_mask(shape, 5))

        def ours(q, k, v, m):
            return mt.scaled_dot_product_attention(q, k, v, attn_mask=m)

        def theirs(q, k, v, m):
            return torch_sdpa(q, k, v, attn_mask=m)

    assert_close_to_math(ours, theirs, leaves, torch.float32)


@pytest.mark.parametrize("q_len,k_len", [(16, 16), (10, 23), (23, 10)])
def test_is_causal_is_top_left(q_len, k_len):
    ours, theirs = both(is_causal=True)
    assert_close_to_math(ours, theirs, qkv(q_len, k_len), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["plain", "causal", "bool", "float", "gqa"])
def test_dtypes(dtype, case):
    L, S = 12, 12
    leaves = qkv(L, S, kv_heads=2 if case == "gqa" else H)
    kwargs = {
        "plain": {},
        "causal": {"is_causal": True},
        "bool": {"attn_mask": bool_mask((B, 1, L, S), 3)},
        "gqa": {"enable_gqa": True, "attn_mask": bool_mask((L, S), 4)},
    }.get(case)
    if case == "float":
        leaves.append(float_mask((1, H, L, S), 6))

        def ours(q, k, v, m):
            return mt.scaled_dot_product_attention(q, k, v, attn_mask=m)

        def theirs(q, k, v, m):
            return torch_sdpa(q, k, v, attn_mask=m)
    else:
        ours, theirs = both(**kwargs)
    assert_close_to_math(ours, theirs, leaves, dtype)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_gqa(kv_heads):
    ours, theirs = both(enable_gqa=True, is_causal=True)
    assert_close_to_math(ours, theirs, qkv(9, 9, kv_heads=kv_heads), torch.float32)


def test_single_kv_head_broadcasts_without_enable_gqa():
    ours, theirs = both()
    assert_close_to_math(ours, theirs, qkv(7, 9, kv_heads=1), torch.float32)


def test_extra_batch_axes_fold_into_b():
    leaves = [randn((3, 2, H, 6, D), 1), randn((2, H, 9, D), 2), randn((3, 1, H, 9, D), 3),
              float_mask((3, 1, 1, 6, 9), 4)]

    def ours(q, k, v, m):
        return mt.scaled_dot_product_attention(q, k, v, attn_mask=m)

    def theirs(q, k, v, m):
        return torch_sdpa(q, k, v, attn_mask=m)

    assert_close_to_math(ours, theirs, leaves, torch.float32)


@pytest.mark.parametrize("rank", [2, 3])
def test_low_rank_inputs(rank):
    shape = (5,) if rank == 3 else ()
    leaves = [randn((*shape, 6, D), 1), randn((*shape, 9, D), 2), randn((*shape, 9, 8), 3)]
    ours, theirs = both(attn_mask=bool_mask((6, 9), 4))
    assert_close_to_math(ours, theirs, leaves, torch.float32)


def test_non_contiguous_inputs():
    """[B, L, H, D] buffers seen as [B, H, L, D], and a head dim taken with a stride."""

    def views(q, k, v):
        return q.transpose(1, 2), k.transpose(1, 2)[..., ::2], v[:, :, 1::2]

    leaves = [randn((B, 8, H, D), 1), randn((B, 11, H, 2 * D), 2), randn((B, H, 22, D), 3)]
    mask = bool_mask((8, 11), 5)

    def ours(q, k, v):
        return mt.scaled_dot_product_attention(*views(q, k, v), attn_mask=mask)

    def theirs(q, k, v):
        return torch_sdpa(*views(q, k, v), attn_mask=mask)

    assert_close_to_math(ours, theirs, leaves, torch.float32)


def test_mask_argument_matches_the_equivalent_attn_mask():
    """mask=maskattn.Mask() (no L×S tensor) gives what the same pairs as an attn_mask give."""
    L = 20
    documents = torch.tensor([[0] * 7 + [1] * 13, [0] * 12 + [1] * 8])
    structured = maskattn.Mask().causal().segments(documents.numpy()).sliding_window(5)
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    dense = (j <= i) & (i - j < 5) & (documents[:, None, :, None] == documents[:, None, None, :])

    def ours(q, k, v):
        return mt.scaled_dot_product_attention(q, k, v, mask=structured)

    def theirs(q, k, v):
        return torch_sdpa(q, k, v, attn_mask=dense)

    assert_close_to_math(ours, theirs, qkv(L, L), torch.float32)


def test_mask_argument_intersects_attn_mask_and_is_causal():
    L = 12
    padding = maskattn.Mask().key_lengths([9, 12])
    lengths = torch.tensor([9, 12])
    keep_keys = torch.arange(L)[None, None, None, :] < lengths[:, None, None, None]
    extra = bool_mask((L, L), 8, keep=0.8)
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    cases = [
        ({"attn_mask": extra}, keep_keys & extra),
        ({"is_causal": True}, keep_keys & causal),
    ]
    for kwargs, dense in cases:
        def ours(q, k, v, kwargs=kwargs):
            return mt.scaled_dot_product_attention(q, k, v, mask=padding, **kwargs)

        def theirs(q, k, v, dense=dense):
            return torch_sdpa(q, k, v, attn_mask=dense)

        assert_close_to_math(ours, theirs, qkv(L, L), torch.float32)


def test_float_mask_gradient_is_reduced_to_its_shape():
    L, S = 6, 9
    q, k, v = qkv(L, S)
    mask = float_mask((1, 1, L, S), 2).requires_grad_()
    out = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.sum().backward()
    assert mask.grad.shape == mask.shape and mask.grad.dtype == mask.dtype
    hidden = torch.isinf(mask.detach())
    assert hidden.any() and (mask.grad[hidden] == 0).all()


def test_mods_bias_adds_to_a_float_mask_that_requires_grad():
    L = 8
    leaves = qkv(L, L) + [float_mask((L, L), 1), randn((1, H, 1, L), 2)]

    def ours(q, k, v, m, bias):
        return mt.scaled_dot_product_attention(q, k, v, attn_mask=m,
                                               mods=mt.ScoreMods(bias=bias))

    def theirs(q, k, v, m, bias):
        return torch_sdpa(q, k, v, attn_mask=m + bias)

    assert_close_to_math(ours, theirs, leaves, torch.float32)


def fully_masked(kind, L=6):
    """A mask whose row 2 (every head, every batch) hides every key."""
    keep = bool_mask((L, L), 11, keep=0.8) | torch.eye(L, dtype=torch.bool)
    keep[2] = False
    if kind == "bool":
        return keep
    return torch.zeros(L, L).masked_fill(~keep, float("-inf"))


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_fully_masked_rows_give_zero_and_zero_gradients(kind):
    L = 6
    q, k, v = (x.requires_grad_() for x in qkv(L, L))
    mask = fully_masked(kind, L)
    if kind == "float":
        mask.requires_grad_()
    out = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.backward(torch.ones_like(out))
    assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))
    assert not torch.isnan(out).any()
    assert torch.equal(q.grad[:, :, 2], torch.zeros_like(q.grad[:, :, 2]))
    for grad in (q.grad, k.grad, v.grad) + ((mask.grad,) if kind == "float" else ()):
        assert torch.isfinite(grad).all()
    if kind == "float":
        assert (mask.grad[2] == 0).all()


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_pytorch_behaviour_on_fully_masked_rows(kind):
    """What this PyTorch does on the same rows (recorded, not assumed): since 2.5 the math
    backend's safe softmax and the CPU flash kernel give 0 and zero gradients, as maskattn does;
    older versions gave NaN (pytorch #103749)."""
    L = 6
    q, k, v = (x.requires_grad_() for x in qkv(L, L))
    out = math_sdpa(q, k, v, attn_mask=fully_masked(kind, L))
    out.backward(torch.ones_like(out))
    version = tuple(int(part) for part in torch.__version__.split(".")[:2])
    if version >= (2, 5):
        assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))
        assert torch.equal(q.grad[:, :, 2], torch.zeros_like(q.grad[:, :, 2]))
    else:
        assert torch.isnan(out[:, :, 2]).all()
    default_backend = torch_sdpa(q.detach(), k.detach(), v.detach(),
                                 attn_mask=fully_masked(kind, L))
    if version >= (2, 5):
        assert torch.equal(default_backend[:, :, 2], torch.zeros_like(out[:, :, 2]))


def test_attn_mask_conversion_is_cached():
    L = 16
    q, k, v = qkv(L, L)
    mask = bool_mask((L, L), 1)
    converted_masks.clear()
    first = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    count = converted_masks.conversions
    again = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert converted_masks.conversions == count and torch.equal(first, again)
    mask[3] = ~mask[3]  # in place: a new _version, a new conversion, a new result
    changed = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert converted_masks.conversions == count + 1
    assert not torch.equal(changed[:, :, 3], first[:, :, 3])
    assert torch.equal(changed[:, :, :3], first[:, :, :3])


def test_one_mask_tensor_in_two_problems_is_cached_for_each():
    """A padding mask [B, 1, 1, S] shared by a self-attention (L = S) and a one-query decoding
    call: each problem keeps its own entry (no reconversion when the calls alternate), and a
    resize in place (same tensor, new shape) is seen."""
    S = 12
    q, k, v = qkv(S, S)
    keep = torch.ones(2, 1, 1, S, dtype=torch.bool)
    keep[1, ..., 9:] = False
    converted_masks.clear()
    before = converted_masks.conversions
    rounds = []
    for _ in range(3):
        full = mt.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        last = mt.scaled_dot_product_attention(q[:, :, -1:], k, v, attn_mask=keep)
        rounds.append((full, last))
    assert converted_masks.conversions == before + 2 and len(converted_masks) == 2
    for full, last in rounds:
        expected = math_sdpa(q.double(), k.double(), v.double(), attn_mask=keep)
        assert (full.double() - expected).abs().max() < 1e-5
        assert torch.equal(last, rounds[0][1])
    keep.resize_(2, 1, 1, 1)  # same tensor, storage and problem, a new shape: converted again
    assert keep.all()  # (the storage's first two elements)
    broadcast = mt.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    assert converted_masks.conversions == before + 3
    expected = math_sdpa(q.double(), k.double(), v.double())
    assert (broadcast.double() - expected).abs().max() < 1e-5


def test_cache_never_confuses_a_new_tensor_with_a_dead_one():
    """Same shape, same dtype, maybe the same memory and _version 0: still converted anew."""
    L = 16
    q, k, v = qkv(L, L)
    converted_masks.clear()
    before = converted_masks.conversions
    results = []
    for seed in range(4):
        mask = bool_mask((L, L), seed) | torch.eye(L, dtype=torch.bool)
        ours = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        expected = math_sdpa(q.double(), k.double(), v.double(), attn_mask=mask)
        assert (ours.double() - expected).abs().max() < 1e-5
        results.append(ours)
        del mask
    assert converted_masks.conversions == before + 4
    assert len(converted_masks) <= 1  # dead tensors' entries are dropped


def test_a_seen_bool_mask_skips_its_conversion_but_nothing_it_must_see():
    """A bool attn_mask seen before in the same problem goes straight to the call; what it does
    not check again must still be seen: a swap of the tensor's data (a new dtype, shape or strides
    over the same storage, which leaves _version alone), is_causal (refused), dropout (applied),
    bad inputs (the full path's error), and gradients."""
    L = 16
    q, k, v = qkv(L, L)
    storage = bool_mask((L, L), 3) | torch.eye(L, dtype=torch.bool)
    mask = storage.view(L, L)
    converted_masks.clear()
    before = converted_masks.conversions
    first = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    again = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert converted_masks.conversions == before + 1 and torch.equal(first, again)
    scaled = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    expected = math_sdpa(q.double(), k.double(), v.double(), attn_mask=mask, scale=0.3)
    assert (scaled.double() - expected).abs().max() < 1e-5
    assert torch.equal(mt.scaled_dot_product_attention(q, k, v, attn_mask=mask), first)
    # Swaps of the data behind the same tensor object, each over the same memory (data_ptr) in
    # the same problem: new strides, a new shape (broadcast), a new dtype.
    for swapped in (storage.t(), storage[:, :1]):
        mask.data = swapped
        ours = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        expected = math_sdpa(q.double(), k.double(), v.double(), attn_mask=swapped)
        assert (ours.double() - expected).abs().max() < 1e-5
    assert converted_masks.conversions == before + 3
    mask.data = storage.view(torch.uint8)
    with pytest.raises(maskattn.Error, match="attn_mask has dtype torch.uint8"):
        mt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    mask.data = storage
    with pytest.raises(maskattn.Error, match="is_causal"):
        mt.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    torch.manual_seed(5)
    dropped = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.5)
    assert not torch.equal(dropped, first)
    with pytest.raises(maskattn.Error) as seen_mask:
        mt.scaled_dot_product_attention(q, k[:, :2], v, attn_mask=mask)
    with pytest.raises(maskattn.Error) as fresh_mask:
        mt.scaled_dot_product_attention(q, k[:, :2], v, attn_mask=mask.clone())
    assert str(seen_mask.value) == str(fresh_mask.value)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    mt.scaled_dot_product_attention(*leaves, attn_mask=mask).sum().backward()
    reference = [x.detach().double().requires_grad_() for x in (q, k, v)]
    math_sdpa(*reference, attn_mask=mask).sum().backward()
    for ours_leaf, math_leaf in zip(leaves, reference):
        assert (ours_leaf.grad.double() - math_leaf.grad).abs().max() < 1e-5


def test_no_grad_inputs_give_no_graph():
    q, k, v = qkv(5, 5)
    out = mt.scaled_dot_product_attention(q, k, v)
    assert out.grad_fn is None and not out.requires_grad
    with torch.no_grad():
        out = mt.scaled_dot_product_attention(*(x.requires_grad_() for x in (q, k, v)))
    assert out.grad_fn is None


@pytest.mark.parametrize("entry", ["scaled_dot_product_attention", "attention", "flex_attention"])
def test_a_graph_exactly_when_pytorch_records_one(entry):
    """The autograd Function is skipped exactly when PyTorch's own SDPA records no graph: grad
    mode off, or no input that requires grad."""
    call = getattr(mt, entry)
    for grad_mode in (True, False):
        for needs in ((), ("q", "k", "v"), ("v",)):
            q, k, v = (x.detach().requires_grad_(name in needs)
                       for name, x in zip("qkv", qkv(5, 5)))
            with torch.set_grad_enabled(grad_mode):
                ours = call(q, k, v)
                theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            assert ours.requires_grad == theirs.requires_grad
            assert (ours.grad_fn is None) == (theirs.grad_fn is None)


def test_scale():
    ours, theirs = both(scale=0.3, attn_mask=bool_mask((9, 11), 2))
    assert_close_to_math(ours, theirs, qkv(9, 11), torch.float32)


def test_learnable_mask_with_core_score_mods():
    """A float attn_mask that requires grad joins a maskattn.ScoreMods (softcap here) as a bias."""
    L, cap = 8, 2.0
    leaves = [randn((B, H, L, D), 1), randn((B, H, L, D), 2), randn((B, H, L, D), 3),
              float_mask((L, L), 4)]

    def ours(q, k, v, m):
        return mt.scaled_dot_product_attention(q, k, v, attn_mask=m,
                                               mods=maskattn.ScoreMods(softcap=cap))

    def theirs(q, k, v, m):
        scores = cap * torch.tanh(q @ k.transpose(-1, -2) / D**0.5 / cap) + m
        return torch.softmax(scores, -1) @ v

    assert_close_to_math(ours, theirs, leaves, torch.float32)


@pytest.mark.xfail(strict=True, reason=(
    "maskattn's fused float32 backward recomputes P = exp(s - lse), and its dk/dv errors grow "
    "with the score magnitude faster than PyTorch's math backward: the error ratio to the "
    "2x-naive bound is ~0.3 for scores of std 1, ~0.5-1.3 for std 2, ~1-1.8 for std 3, ~1-3 for "
    "std 6 (10 seeds each; here 3.1: dk 1.2e-5 vs naive 4e-6). The reference kernel is exact. "
    "A C++ kernel matter, reported; the other tests use scores of std ~1"))
def test_large_scores_gradients():
    leaves = [randn((B, H, 8, D), 11) * 6, randn((B, H, 8, D), 12), randn((B, H, 8, D), 13)]
    assert_close_to_math(mt.scaled_dot_product_attention, torch_sdpa, leaves, torch.float32,
                         seed=19)
