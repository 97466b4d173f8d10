"""maskattn.torch.create_block_mask / flex_attention against PyTorch's FlexAttention.

Where PyTorch's CPU FlexAttention runs (probed with torch 2.15 on CPU):
* forward, eager (``flex_attention`` without torch.compile: an unfused reference that
  materialises the scores): float64, float32 — the comparisons below use it, float64 as the
  reference and float32 as the naive computation;
* forward under ``torch.compile`` (inductor's CPU template): float32, float16, bfloat16, not
  float64 ("LoweringException: ... supported in FlexAttention for CPU device"); it computes what
  eager computes, and compiling costs ~20 s per shape, so it is not exercised here;
* backward: nowhere on CPU ("FlexAttention does not support backward on CPU", eager and
  compiled; asserted below). Gradients are therefore compared with PyTorch's math SDPA given the
  same pairs as a dense mask (and, for score_mod biases, the same term as a float mask).
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention")

import maskattn  # noqa: E402
import maskattn.torch as mt  # noqa: E402
from maskattn import _torch_flex  # noqa: E402
from test_torch_common import assert_close_to_math, max_error, randn, torch_sdpa  # noqa: E402

B, H, L, D = 2, 4, 70, 16

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

DOCUMENTS = torch.tensor([0] * 20 + [1] * 30 + [2] * 20)
PREFIX = 12


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < 16)


def document(b, h, q_idx, kv_idx):
    return (DOCUMENTS[q_idx] == DOCUMENTS[kv_idx]) & (q_idx >= kv_idx)


def prefix_lm(b, h, q_idx, kv_idx):
    return (kv_idx < PREFIX) | (q_idx >= kv_idx)


def per_batch_and_head(b, h, q_idx, kv_idx):
    """Depends on every index: batch b sees b·5 keys ahead, head 0 is causal, others windowed."""
    return (kv_idx <= q_idx + 5 * b) & ((h == 0) | (q_idx - kv_idx < 8 * h))


MASK_MODS = {f.__name__: f for f in (causal, sliding_window, document, prefix_lm,
                                     per_batch_and_head)}


def dense_pairs(mask_mod, batch, heads, q_len, kv_len):
    """The element-level mask from PyTorch's own create_mask (the reference)."""
    return flex.create_mask(mask_mod, batch, heads, q_len, kv_len, device="cpu")


def compare_forward(ours_call, theirs_call, dtype=torch.float32):
    """Output and LSE of maskattn (in ``dtype``) against PyTorch's eager flex in float64
    (reference) and in ``dtype`` (naive), by the rule of test_torch_common."""
    q, k, v = (randn((B, H, L, D), seed) for seed in (1, 2, 3))
    reference = theirs_call(q.double(), k.double(), v.double())
    naive = theirs_call(q.to(dtype), k.to(dtype), v.to(dtype))
    ours = ours_call(q.to(dtype), k.to(dtype), v.to(dtype))
    for name, got, base, ref in zip(("out", "lse"), ours, naive, reference):
        error, naive_error = max_error(got, ref), max_error(base, ref)
        assert error <= 2 * naive_error + 1e-6, f"{name}: {error:.3g} vs naive {naive_error:.3g}"
    return ours


@pytest.mark.parametrize("name", sorted(MASK_MODS))
def test_mask_mods_match_pytorch_flex(name):
    mask_mod = MASK_MODS[name]
    batch, heads = (B, H) if name == "per_batch_and_head" else (None, None)
    theirs_mask = flex.create_block_mask(mask_mod, batch, heads, L, L, device="cpu")
    ours_mask = mt.create_block_mask(mask_mod, batch, heads, L, L)
    compare_forward(
        lambda q, k, v: mt.flex_attention(q, k, v, block_mask=ours_mask, return_lse=True),
        lambda q, k, v: flex.flex_attention(q, k, v, block_mask=theirs_mask, return_lse=True),
    )


@pytest.mark.parametrize("name", sorted(MASK_MODS))
def test_mask_mod_gradients_match_math_sdpa(name):
    mask_mod = MASK_MODS[name]
    ours_mask = mt.create_block_mask(mask_mod, B, H, L, L)
    dense = dense_pairs(mask_mod, B, H, L, L)
    leaves = [randn((B, H, L, D), seed) for seed in (4, 5, 6)]
    assert_close_to_math(lambda q, k, v: mt.flex_attention(q, k, v, block_mask=ours_mask),
                         lambda q, k, v: torch_sdpa(q, k, v, attn_mask=dense), leaves,
                         torch.float32)


def test_pytorch_flex_has_no_cpu_backward():
    q, k, v = (randn((1, 2, 8, 8), seed).requires_grad_() for seed in (1, 2, 3))
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex.flex_attention(q, k, v).sum().backward()


@pytest.mark.parametrize("block_size", [64, 128, (128, 64), 100])
def test_block_mask_inspection_matches_pytorch(block_size):
    for mask_mod, batch, heads in ((causal, None, None), (per_batch_and_head, B, H)):
        theirs = flex.create_block_mask(mask_mod, batch, heads, 300, 260, device="cpu",
                                        BLOCK_SIZE=block_size)
        ours = mt.create_block_mask(mask_mod, batch, heads, 300, 260, BLOCK_SIZE=block_size)
        assert ours.shape == tuple(theirs.shape)
        assert torch.equal(ours.to_dense(), theirs.to_dense().to(torch.int32))
        assert ours.sparsity() == pytest.approx(theirs.sparsity())
        assert torch.equal(ours.allowed(),
                           dense_pairs(mask_mod, batch or 1, heads or 1, 300, 260))
    assert "█" in ours.to_string() and "maskattn.torch.BlockMask" in repr(ours)


def test_mask_mod_is_traced_once_into_a_program():
    """create_block_mask calls mask_mod once, with traced values, and keeps a mask program: no
    keep mask of Q × KV bytes."""
    calls = []

    def counting(b, h, q_idx, kv_idx):
        calls.append(type(q_idx).__name__)
        return sliding_window(b, h, q_idx, kv_idx)

    block_mask = mt.create_block_mask(counting, None, None, L, L)
    assert calls == ["Traced"]
    assert block_mask.mask.describe() == "program `(q >= kv) & (q - kv < 16)` (top-left)"
    assert torch.equal(block_mask.allowed(), dense_pairs(sliding_window, 1, 1, L, L))


def test_unused_axes_stay_broadcast():
    """A causal mask_mod with B and H given keeps a [1,1,L,L] keep mask, not [B,H,L,L]."""
    block_mask = mt.create_block_mask(causal, 8, 16, L, L)
    assert block_mask.shape == (8, 16, L, L)
    q, k, v = (randn((8, 16, L, 8), seed) for seed in (1, 2, 3))
    out = mt.flex_attention(q, k, v, block_mask=block_mask)
    expected = torch_sdpa(q, k, v, is_causal=True)
    assert max_error(out, expected) < 1e-5


def test_broadcast_batch_and_heads_keep_the_real_indices_as_pytorch():
    """B=None, H=None with a mask_mod that reads b and h: the BlockMask's own inspection is of
    b = 0, h = 0 (its shape is [1, 1, Q, KV]), but attention evaluates mask_mod at every pair's
    real b and h, as PyTorch's flex_attention does."""
    theirs_mask = flex.create_block_mask(per_batch_and_head, None, None, L, L, device="cpu")
    ours_mask = mt.create_block_mask(per_batch_and_head, None, None, L, L)
    assert torch.equal(ours_mask.to_dense(), theirs_mask.to_dense().to(torch.int32))
    compare_forward(
        lambda q, k, v: mt.flex_attention(q, k, v, block_mask=ours_mask, return_lse=True),
        lambda q, k, v: flex.flex_attention(q, k, v, block_mask=theirs_mask, return_lse=True),
    )


def test_pytorch_block_mask_is_accepted():
    theirs_mask = flex.create_block_mask(document, None, None, L, L, device="cpu")
    ours_mask = mt.create_block_mask(document, None, None, L, L)
    q, k, v = (randn((B, H, L, D), seed) for seed in (1, 2, 3))
    assert torch.equal(mt.flex_attention(q, k, v, block_mask=theirs_mask),
                       mt.flex_attention(q, k, v, block_mask=ours_mask))


def test_pytorch_block_mask_from_kv_blocks_keeps_its_block_sparsity():
    # BlockMask.from_kv_blocks has a mask_mod that allows everything: the blocks alone say which
    # pairs are computed (partial blocks: mask_mod applies; full blocks: every pair). Block
    # diagonal at BLOCK_SIZE 64 over L=128 here, as compiled flex computes it.
    length, block = 128, 64
    kv_num_blocks = torch.ones(1, 1, 2, dtype=torch.int32)
    kv_indices = torch.tensor([[[[0, 1], [1, 0]]]], dtype=torch.int32)
    theirs = flex.BlockMask.from_kv_blocks(kv_num_blocks, kv_indices, BLOCK_SIZE=block,
                                           seq_lengths=(length, length))
    q, k, v = (randn((1, 2, length, 8), seed) for seed in (4, 5, 6))
    keep = torch.zeros(length, length, dtype=torch.bool)
    keep[:block, :block] = keep[block:, block:] = True
    out = mt.flex_attention(q, k, v, block_mask=theirs)
    assert max_error(out, torch_sdpa(q.double(), k.double(), v.double(), attn_mask=keep)) < 1e-6


def test_pytorch_full_blocks_skip_the_mask_mod_as_in_pytorch():
    # Query block 1 lists key block 0 as partial (causal applies: all of it is in the past) and
    # key block 1 as full (every pair, the future within the block included); query block 0
    # lists key block 0 as partial only.
    length, block = 128, 64
    theirs = flex.BlockMask.from_kv_blocks(
        torch.tensor([[[1, 1]]], dtype=torch.int32), torch.tensor([[[[0, 0], [0, 0]]]]),
        torch.tensor([[[0, 1]]], dtype=torch.int32), torch.tensor([[[[0, 0], [1, 0]]]]),
        BLOCK_SIZE=block, mask_mod=causal, seq_lengths=(length, length))
    q, k, v = (randn((1, 1, length, 8), seed) for seed in (7, 8, 9))
    keep = torch.ones(length, length, dtype=torch.bool).tril()
    keep[block:, block:] = True
    out = mt.flex_attention(q, k, v, block_mask=theirs)
    assert max_error(out, torch_sdpa(q.double(), k.double(), v.double(), attn_mask=keep)) < 1e-6


def test_gqa():
    ours_mask = mt.create_block_mask(sliding_window, None, None, L, L)
    theirs_mask = flex.create_block_mask(sliding_window, None, None, L, L, device="cpu")
    q = randn((B, H, L, D), 1)
    k, v = randn((B, 2, L, D), 2), randn((B, 2, L, D), 3)
    theirs = flex.flex_attention(q.double(), k.double(), v.double(), block_mask=theirs_mask,
                                 enable_gqa=True)
    ours = mt.flex_attention(q, k, v, block_mask=ours_mask, enable_gqa=True)
    assert max_error(ours, theirs) < 2e-6


SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625])
SCORE_MODS = {
    "alibi_signed": lambda s, b, h, q, kv: s + SLOPES[h] * (kv - q),
    "alibi_abs": lambda s, b, h, q, kv: s - SLOPES[h] * (kv - q).abs(),
    "softcap": lambda s, b, h, q, kv: 3.0 * torch.tanh(s / 3.0),
    "relative_bias": lambda s, b, h, q, kv: s + 0.01 * (q - kv) * (h + 1) + 0.1 * b,
    "softcap_and_bias": lambda s, b, h, q, kv: 3.0 * torch.tanh(s / 3.0) + 0.2 * h,
    "hide_by_score_mod": lambda s, b, h, q, kv: torch.where(kv % 3 == 0, float("-inf"), s),
}


@pytest.mark.parametrize("name", sorted(SCORE_MODS))
def test_score_mods_match_pytorch_flex(name):
    score_mod = SCORE_MODS[name]
    theirs_mask = flex.create_block_mask(causal, None, None, L, L, device="cpu")
    ours_mask = mt.create_block_mask(causal, None, None, L, L)

    def ours(q, k, v):
        return mt.flex_attention(2 * q, k, v, score_mod=score_mod, block_mask=ours_mask,
                                 return_lse=True)

    def theirs(q, k, v):
        return flex.flex_attention(2 * q, k, v, score_mod=score_mod, block_mask=theirs_mask,
                                   return_lse=True)

    compare_forward(ours, theirs)


def test_learnable_score_mod_bias_gets_gradients():
    """score + table[h, q - kv + L - 1] with a learnable table: the gradient reaches the table
    through maskattn's dbias, as PyTorch SDPA's reaches it through a float attn_mask."""
    table = randn((H, 2 * L - 1), 9) * 0.1
    dense = dense_pairs(document, 1, 1, L, L)
    leaves = [randn((B, H, L, D), seed) for seed in (1, 2, 3)] + [table]
    ours_mask = mt.create_block_mask(document, None, None, L, L)

    def ours(q, k, v, table):
        def score_mod(s, b, h, q_idx, kv_idx):
            return s + table[h, q_idx - kv_idx + L - 1]
        return mt.flex_attention(q, k, v, score_mod=score_mod, block_mask=ours_mask)

    def theirs(q, k, v, table):
        offsets = torch.arange(L)[:, None] - torch.arange(L)[None, :] + L - 1
        bias = table[:, offsets].unsqueeze(0).masked_fill(~dense, float("-inf"))
        return torch_sdpa(q, k, v, attn_mask=bias)

    assert_close_to_math(ours, theirs, leaves, torch.float32)


def test_softcap_gradients():
    dense = dense_pairs(causal, 1, 1, L, L)
    ours_mask = mt.create_block_mask(causal, None, None, L, L)
    leaves = [randn((B, H, L, D), seed) * 2 for seed in (1, 2, 3)]

    def ours(q, k, v):
        return mt.flex_attention(q, k, v, score_mod=SCORE_MODS["softcap"], block_mask=ours_mask)

    def theirs(q, k, v):
        scores = 3.0 * torch.tanh(q @ k.transpose(-1, -2) / D**0.5 / 3.0)
        return torch.softmax(scores.masked_fill(~dense, float("-inf")), -1) @ v

    assert_close_to_math(ours, theirs, leaves, torch.float32)


def test_fully_masked_rows_give_zero_output_and_minus_inf_lse():
    """maskattn and (asserted) this PyTorch's flex give 0 and LSE −inf; maskattn's gradients
    there are 0 (PyTorch's flex has no CPU backward to compare)."""
    def skip_row_3(b, h, q_idx, kv_idx):
        return (q_idx != 3) & (kv_idx <= q_idx)

    q, k, v = (randn((1, 2, 10, 8), seed).requires_grad_() for seed in (1, 2, 3))
    out, lse = mt.flex_attention(q, k, v, block_mask=mt.create_block_mask(
        skip_row_3, None, None, 10, 10), return_lse=True)
    out.backward(torch.ones_like(out))
    assert torch.equal(out[0, :, 3], torch.zeros(2, 8)) and torch.isneginf(lse[0, :, 3]).all()
    assert torch.equal(q.grad[0, :, 3], torch.zeros(2, 8))
    theirs, theirs_lse = flex.flex_attention(
        q.detach(), k.detach(), v.detach(), return_lse=True,
        block_mask=flex.create_block_mask(skip_row_3, None, None, 10, 10, device="cpu"))
    assert torch.equal(theirs[0, :, 3], torch.zeros(2, 8))
    assert torch.isneginf(theirs_lse[0, :, 3]).all()


def test_return_aux_gives_the_lse():
    q, k, v = (randn((1, 2, 10, 8), seed) for seed in (1, 2, 3))
    out, aux = mt.flex_attention(q, k, v, return_aux=flex.AuxRequest(lse=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        same, lse = mt.flex_attention(q, k, v, return_lse=True)
    assert torch.equal(aux.lse, lse) and torch.equal(out, same) and aux.max_scores is None


def test_mods_argument():
    q, k, v = (randn((1, 2, 10, 8), seed) for seed in (1, 2, 3))
    capped = mt.flex_attention(q, k, v, mods=maskattn.ScoreMods(softcap=2.0))
    traced = mt.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: 2.0 * torch.tanh(s / 2))
    assert max_error(capped, traced) < 1e-6


def test_a_structured_mask_as_block_mask():
    """block_mask=maskattn.Mask(): packed documents and causal with no dense keep mask."""
    ids = DOCUMENTS.unsqueeze(0).expand(B, -1).numpy()
    structured = maskattn.Mask().causal().segments(ids)
    theirs_mask = flex.create_block_mask(document, None, None, L, L, device="cpu")
    compare_forward(
        lambda q, k, v: mt.flex_attention(q, k, v, block_mask=structured, return_lse=True),
        lambda q, k, v: flex.flex_attention(q, k, v, block_mask=theirs_mask, return_lse=True),
    )


def test_score_mod_indices_are_rows_under_a_bottom_right_mask():
    """With a caller's Mask, positions may differ from indices (bottom-right when Lq < Lk); a
    score_mod still sees FlexAttention's q_idx and kv_idx, the rows."""
    q = randn((1, H, 5, D), 1)
    k, v = randn((1, H, 9, D), 2), randn((1, H, 9, D), 3)
    score_mod = SCORE_MODS["alibi_abs"]
    theirs = flex.flex_attention(q.double(), k.double(), v.double(), score_mod=score_mod,
                                 block_mask=flex.create_block_mask(
                                     lambda b, h, i, j: j <= i + 4, None, None, 5, 9,
                                     device="cpu"))
    ours = mt.flex_attention(q, k, v, score_mod=score_mod, block_mask=maskattn.Mask().causal())
    assert max_error(ours, theirs) < 2e-6
