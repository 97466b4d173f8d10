"""Errors P20–P39 of docs/errors.md (maskattn.torch): each raises maskattn.Error (a ValueError)
with the catalogue message, before computing anything. The tracer's errors (P35, P36, P68–P72)
are tested in test_torch_trace.py."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import maskattn  # noqa: E402
import maskattn.torch as mt  # noqa: E402
from test_torch_common import randn  # noqa: E402


def qkv(q_len=5, k_len=6, heads=4, kv_heads=4):
    return (randn((2, heads, q_len, 8), 1), randn((2, kv_heads, k_len, 8), 2),
            randn((2, kv_heads, k_len, 8), 3))


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


ENTRY_POINTS = {
    "attention": lambda q, k, v: mt.attention(q, k, v),
    "sdpa": lambda q, k, v: mt.scaled_dot_product_attention(q, k, v),
    "flex": lambda q, k, v: mt.flex_attention(q, k, v),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_P20_inputs_must_be_torch_tensors(entry):
    q, k, v = qkv()
    with pytest.raises(maskattn.Error, match="query must be a torch.Tensor, got ndarray; for "
                                             "NumPy arrays use maskattn.attention"):
        ENTRY_POINTS[entry](q.numpy(), k, v)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_P21_inputs_must_be_on_the_cpu(entry):
    q, k, v = qkv()
    with pytest.raises(maskattn.Error, match=r"key \(shape \[2, 4, 6, 8\]\) is on meta; maskattn "
                                             r"computes on the CPU: move it with .cpu\(\)"):
        ENTRY_POINTS[entry](q, k.to("meta"), v)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_P22_float64_is_not_computed(entry):
    q, k, v = (x.double() for x in qkv())
    with pytest.raises(maskattn.Error, match=r"query has dtype torch.float64 \(shape \[2, 4, 5, "
                                             r"8\]\); maskattn computes in torch.float32"):
        ENTRY_POINTS[entry](q, k, v)


def test_P23_query_key_value_share_one_dtype():
    q, k, v = qkv()
    with pytest.raises(maskattn.Error, match="value has dtype torch.float16 but query has "
                                             "torch.float32; query, key and value share one dtype"):
        mt.scaled_dot_product_attention(q, k, v.half())


def test_P24_mask_must_be_a_maskattn_mask():
    q, k, v = qkv()
    for call in (mt.attention, mt.scaled_dot_product_attention):
        with pytest.raises(maskattn.Error, match="mask must be None or a maskattn.Mask, got "
                                                 "Tensor; a tensor mask goes to"):
            call(q, k, v, mask=torch.ones(5, 6, dtype=torch.bool))


def test_P25_mods_must_be_score_mods():
    q, k, v = qkv()
    with pytest.raises(maskattn.Error, match="mods must be None, a maskattn.ScoreMods or a "
                                             "maskattn.torch.ScoreMods, got dict"):
        mt.attention(q, k, v, mods={"softcap": 2.0})


def test_P27_attn_mask_with_is_causal():
    q, k, v = qkv()
    with pytest.raises(maskattn.Error, match="attn_mask and is_causal=True cannot be given "
                                             "together"):
        mt.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 6, dtype=torch.bool),
                                        is_causal=True)


def test_P28_attn_mask_type_and_dtype():
    q, k, v = qkv()
    with pytest.raises(maskattn.Error, match=r"attn_mask has dtype torch.int64 \(shape \[5, 6\]\);"
                                             r" expected torch.bool \(True = attend\) or a "
                                             r"floating dtype"):
        mt.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 6, dtype=torch.int64))
    with pytest.raises(maskattn.Error, match="attn_mask must be a torch.Tensor or None, got "
                                             "ndarray"):
        mt.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((5, 6), dtype=bool))
    sparse = torch.ones(5, 6, dtype=torch.bool).to_sparse()
    with pytest.raises(maskattn.Error, match=r"attn_mask \(shape \[5, 6\]\) has layout "
                                             r"torch.sparse_coo; .*\.to_dense\(\)"):
        mt.scaled_dot_product_attention(q, k, v, attn_mask=sparse)


def test_P29_attn_mask_must_broadcast():
    q, k, v = qkv()
    with pytest.raises(maskattn.Error, match=r"attn_mask shape \[3, 6\] does not broadcast to "
                                             r"\[2, 4, 5, 6\] \(batch..., heads, L, S\)"):
        mt.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(3, 6, dtype=torch.bool))


def test_P30_ranks_and_batch_axes():
    q, k, v = qkv()
    with pytest.raises(maskattn.Error, match=r"query has shape \[8\]; expected \(..., L, E\) "
                                             r"with at least 2 axes"):
        mt.scaled_dot_product_attention(q[0, 0, 0], k, v)
    with pytest.raises(maskattn.Error, match=r"batch axes \(before H, L, E\) do not broadcast: "
                                             r"query \[2\], key \[3\], value \[2\]"):
        mt.scaled_dot_product_attention(q, torch.cat([k, k[:1]]), v)
    with pytest.raises(maskattn.Error, match=r"flex_attention: query has shape \[4, 5, 8\]; "
                                             r"expected 4 axes \[B, H, L, E\]"):
        mt.flex_attention(q[0], k, v)


def test_P31_head_counts_without_enable_gqa():
    q, k, v = qkv(kv_heads=2)
    with pytest.raises(maskattn.Error, match=r"query has 4 heads but key/value have 2 \(query "
                                             r"\[2, 4, 5, 8\], key \[2, 2, 6, 8\]\); set "
                                             r"enable_gqa=True"):
        mt.scaled_dot_product_attention(q, k, v)
    with pytest.raises(maskattn.Error, match="flex_attention: query has 4 heads but key has 2; "
                                             "set enable_gqa=True"):
        mt.flex_attention(q, k, v)
    with pytest.raises(maskattn.Error, match="key and value head counts do not broadcast"):
        mt.scaled_dot_product_attention(q, k, torch.cat([v, v[:, :1]], 1))


def test_P32_is_causal_would_realign_a_mask():
    q, k, v = qkv(q_len=5, k_len=6)
    with pytest.raises(maskattn.Error, match=r"is_causal=True is top-left aligned, and with L=5 "
                                             r"!= S=6 it would re-align mask=sliding_window\(3\)"):
        mt.scaled_dot_product_attention(q, k, v, is_causal=True,
                                        mask=maskattn.Mask().sliding_window(3))
    top_left = maskattn.Mask().sliding_window(3).set_alignment("top_left")
    mt.scaled_dot_product_attention(q, k, v, is_causal=True, mask=top_left)  # accepted


def test_P33_learnable_mask_and_a_score_fn():
    q, k, v = qkv()
    mods = maskattn.ScoreMods(score_fn=lambda s, b, h, i, j: s)
    with pytest.raises(maskattn.Error, match="a float attn_mask that requires grad becomes a "
                                             "bias, which cannot be added to a maskattn.ScoreMods "
                                             "with a score_fn"):
        mt.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(5, 6, requires_grad=True),
                                        mods=mods)


def test_P34_create_block_mask_arguments():
    cases = [
        (dict(B=0), r"create_block_mask: B must be None or an int >= 1, got 0"),
        (dict(Q_LEN=None), r"create_block_mask: Q_LEN must be an int >= 1, got None"),
        (dict(BLOCK_SIZE=(64,)), r"create_block_mask: BLOCK_SIZE must be an int >= 1 or a pair "
                                 r"of them, got \(64,\)"),
        (dict(device="meta"), r"create_block_mask: device='meta'; maskattn computes on the CPU"),
        (dict(mask_mod="causal"), r"create_block_mask: mask_mod must be callable, got str"),
    ]
    for overrides, message in cases:
        kwargs = dict(mask_mod=causal, B=None, H=None, Q_LEN=8, KV_LEN=8)
        kwargs.update(overrides)
        with pytest.raises(maskattn.Error, match=message):
            mt.create_block_mask(**kwargs)


def test_P37_flex_block_mask():
    q, k, v = qkv(q_len=6)
    with pytest.raises(maskattn.Error, match="block_mask must be None, a BlockMask from "
                                             "create_block_mask or a maskattn.Mask, got Tensor"):
        mt.flex_attention(q, k, v, block_mask=torch.ones(6, 6, dtype=torch.bool))
    wrong = mt.create_block_mask(causal, 3, None, 6, 6)
    with pytest.raises(maskattn.Error, match=r"flex_attention: block_mask shape \[3, 1, 6, 6\] "
                                             r"does not fit query \[2, 4, 6, 8\] and key "
                                             r"\[2, 4, 6, 8\]: expected \[1 or 2, 1 or 4, 6, 6\]"):
        mt.flex_attention(q, k, v, block_mask=wrong)


def test_P38_score_mod_not_callable():
    q, k, v = qkv(q_len=6, k_len=6)
    with pytest.raises(maskattn.Error, match="flex_attention: score_mod must be callable, got int"):
        mt.flex_attention(q, k, v, score_mod=3)


def test_P39_flex_argument_combinations():
    q, k, v = qkv(q_len=6, k_len=6)
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    with pytest.raises(maskattn.Error, match="flex_attention: give score_mod or mods, not both"):
        mt.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s,
                          mods=maskattn.ScoreMods(softcap=2.0))
    with pytest.raises(maskattn.Error, match="flex_attention: give return_lse or return_aux, "
                                             "not both"):
        mt.flex_attention(q, k, v, return_lse=True, return_aux=flex.AuxRequest(lse=True))
    with pytest.raises(maskattn.Error, match=r"return_aux=AuxRequest\(max_scores=True\) is not "
                                             r"supported"):
        mt.flex_attention(q, k, v, return_aux=flex.AuxRequest(max_scores=True))
