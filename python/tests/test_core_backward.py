"""attention_backward, gradcheck and merge_partials from Python.

Gradients are checked against PyTorch autograd of conftest's torch_attention in float64 (the
reference) under the rule, the naive error being autograd of the same code in the tested dtype;
the modifiers' gradients (dbias, dsinks) too. gradcheck() (finite differences of the C++ f64
reference) must pass. merge_partials of a split-key computation must equal the full call.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import maskattn as ma
from conftest import (DTYPES, as_f64, assert_within_rule, check_attention, random_inputs,
                      reference_attention, round_to, torch_attention)

B, HQ, HKV, D = 2, 4, 2, 8


def torch_gradients(q, k, v, dout, dtype="float64", bias=None, sinks=None, **reference_args):
    """(dq, dk, dv, dbias, dsinks) of Σ dout·O by autograd of torch_attention in ``dtype``."""
    torch_dtype = getattr(torch, dtype)

    def leaf(x):
        return None if x is None else torch.from_numpy(as_f64(x)).to(torch_dtype).requires_grad_()

    q_t, k_t, v_t, bias_t, sinks_t = (leaf(x) for x in (q, k, v, bias, sinks))
    out, _ = torch_attention(q_t, k_t, v_t, bias=bias_t, sinks=sinks_t, **reference_args)
    out.backward(torch.from_numpy(as_f64(dout)).to(torch_dtype))
    return tuple(None if t is None else t.grad.double().numpy()
                 for t in (q_t, k_t, v_t, bias_t, sinks_t))


def check_gradients(actual, q, k, v, dout, dtype="float32", **reference_args):
    reference = torch_gradients(q, k, v, dout, "float64", **reference_args)
    naive = torch_gradients(q, k, v, dout, dtype, **reference_args)
    for name, got, want, rough in zip(("dq", "dk", "dv", "dbias", "dsinks"), actual, reference,
                                      naive):
        if want is not None:
            assert got is not None and tuple(got.shape) == want.shape, name
            assert_within_rule(got, want, rough, name)


def causal_with_padding(q_len, k_len):
    lengths = np.array([k_len, k_len - 3])
    i, j = np.arange(q_len)[:, None] + (k_len - q_len), np.arange(k_len)[None, :]
    keep = (j <= i)[None, None] & (j < lengths[:, None, None, None])
    return ma.Mask().causal().key_lengths(lengths), keep


@pytest.mark.parametrize("q_len", [3, 17], ids=["short", "long"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_match_torch_autograd(rng, dtype, q_len):
    q, k, v = random_inputs(rng, B, HQ, HKV, q_len, 13, D, dtype=dtype)
    dout = round_to(rng.standard_normal((B, HQ, q_len, D)), dtype)
    mask, keep = causal_with_padding(q_len, 13)
    out, lse = ma.attention(q, k, v, mask, return_lse=True)
    grads = ma.attention_backward(q, k, v, out, lse, dout, mask)
    for grad, like in zip(grads, (q, k, v)):
        assert grad.dtype == like.dtype and grad.shape == like.shape
    check_gradients(grads, q, k, v, dout, dtype, keep=keep)


def test_modifier_gradients_match_torch_autograd(rng):
    q, k, v = random_inputs(rng, B, HQ, HKV, 6, 9, D)
    dout = round_to(rng.standard_normal((B, HQ, 6, D)), "float32")
    bias = round_to(rng.standard_normal((HQ, 1, 9)), "float32")  # broadcasts over B and Lq
    sinks = np.array([0.5, -1.0, 1.5, 0.0], np.float32)
    mods = ma.ScoreMods(softcap=2.0, bias=bias, sinks=sinks)
    mask = ma.Mask().sliding_window(4)
    out, lse = ma.attention(q, k, v, mask, mods, return_lse=True)
    dq, dk, dv, dbias, dsinks = ma.attention_backward(q, k, v, out, lse, dout, mask, mods,
                                                      return_mod_grads=True)
    assert dbias.shape == bias.shape and dbias.dtype == np.float32 and dsinks.shape == (HQ,)
    i, j = np.arange(6)[:, None] + 3, np.arange(9)[None, :]
    keep = (j <= i) & (j > i - 4)
    check_gradients((dq, dk, dv, dbias, dsinks), q, k, v, dout, keep=keep, softcap=2.0,
                    bias=bias, sinks=sinks)
    plain = ma.attention_backward(q, k, v, out, lse, dout, mask, mods)
    assert len(plain) == 3


def test_alibi_gradients_pass_through(rng):
    slopes = np.array([0.5, 0.25, 0.125, 0.0625])
    q, k, v = random_inputs(rng, B, HQ, HKV, 5, 7, D)
    dout = round_to(rng.standard_normal((B, HQ, 5, D)), "float32")
    mods = ma.ScoreMods(alibi_slopes=slopes)
    out, lse = ma.attention(q, k, v, mods=mods, return_lse=True)
    grads = ma.attention_backward(q, k, v, out, lse, dout, mods=mods)
    bias = -slopes[:, None, None] * np.abs(np.arange(5)[:, None] + 2 - np.arange(7)[None, :])
    reference = torch_gradients(q, k, v, dout, bias=bias)
    naive = torch_gradients(q, k, v, dout, "float32", bias=bias)
    for name, got, want, rough in zip(("dq", "dk", "dv"), grads, reference, naive):
        assert_within_rule(got, want, rough, name)


def test_gradcheck_passes_with_masks_and_modifiers(rng):
    q, k, v = random_inputs(rng, 1, 2, 1, 4, 5, 4)
    dout = round_to(rng.standard_normal((1, 2, 4, 4)), "float32")
    mods = ma.ScoreMods(softcap=3.0, bias=rng.standard_normal((4, 5)), sinks=[0.2, -0.3])
    report = ma.gradcheck(q, k, v, dout, ma.Mask().causal(), mods)
    assert report["passed"], report
    names = {entry["tensor"] for entry in report["entries"]}
    assert names == {"dq", "dk", "dv", "dbias", "dsinks"}
    assert all(entry["max_relative_error"] <= report["tolerance"] for entry in report["entries"])


def test_hidden_pairs_contribute_nothing(rng):
    q, k, v = random_inputs(rng, B, HQ, HKV, 5, 7, D)
    dout = round_to(rng.standard_normal((B, HQ, 5, D)), "float32")
    mask = ma.Mask().query_lengths([5, 3]).key_lengths([7, 4])
    out, lse = ma.attention(q, k, v, mask, return_lse=True)
    dout[1, :, 3:] = np.nan  # the hidden rows' dout never matters
    dq, dk, dv = ma.attention_backward(q, k, v, out, lse, dout, mask)
    assert np.all(dq[1, :, 3:] == 0) and np.all(dk[1, :, 4:] == 0) and np.all(dv[1, :, 4:] == 0)
    assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_blhd_gradients_are_the_bhld_gradients(rng, framework):
    q, k, v = random_inputs(rng, B, HQ, HKV, 6, 6, D)
    dout = round_to(rng.standard_normal((B, HQ, 6, D)), "float32")
    mask = ma.Mask().causal()
    out, lse = ma.attention(q, k, v, mask, return_lse=True)
    expected = ma.attention_backward(q, k, v, out, lse, dout, mask)
    blhd = [np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v, out, dout)]
    if framework == "torch":
        blhd, lse = [torch.from_numpy(x) for x in blhd], torch.from_numpy(lse)
    q2, k2, v2, out2, dout2 = blhd
    grads = ma.attention_backward(q2, k2, v2, out2, lse, dout2, mask, layout="blhd")
    for got, want in zip(grads, expected):
        assert type(got) is type(q2)
        np.testing.assert_array_equal(np.asarray(got).transpose(0, 2, 1, 3), want)


def test_backward_refuses_score_fn(rng):
    q, k, v = random_inputs(rng, 1, 1, 1, 2, 2, 4)
    mods = ma.ScoreMods(score_fn=lambda s, b, h, i, j: s)
    out, lse = ma.attention(q, k, v, mods=mods, return_lse=True)
    with pytest.raises(ma.Error, match="score_fn is an opaque callable"):
        ma.attention_backward(q, k, v, out, lse, out, mods=mods)


# --- merge_partials -----------------------------------------------------------------------------


@pytest.mark.parametrize("splits", [(5,), (3, 9)], ids=["two-parts", "three-parts"])
def test_merged_split_key_calls_equal_the_full_call(rng, splits):
    q, k, v = random_inputs(rng, B, HQ, HKV, 6, 12, D)
    keep = rng.random((B, 1, 6, 12)) < 0.5
    keep[0, 0, 2] = False  # a row no part sees
    keep[1, 0, 4, :6] = False  # a row only the later parts see
    full, full_lse = ma.attention(q, k, v, ma.Mask().keep(keep), return_lse=True)
    bounds = (0, *splits, 12)
    parts = []
    for first, end in zip(bounds, bounds[1:]):
        part_keep = ma.Mask().keep(keep[..., first:end])
        parts.append(ma.attention(q, k[:, :, first:end], v[:, :, first:end], part_keep,
                                  return_lse=True))
    merged, lse = ma.merge_partials(parts)
    assert merged.dtype == np.float32 and lse.dtype == np.float32
    check_attention(merged, q, k, v, keep=keep)
    np.testing.assert_allclose(merged, full, rtol=0, atol=1e-6)
    np.testing.assert_allclose(lse, full_lse, rtol=1e-6, atol=1e-6)
    assert np.all(merged[0, :, 2] == 0) and np.all(np.isneginf(lse[0, :, 2]))


def test_a_part_that_saw_nothing_changes_nothing(rng):
    q, k, v = random_inputs(rng, B, HQ, HKV, 4, 6, D)
    out, lse = ma.attention(q, k, v, return_lse=True)
    empty = (np.zeros_like(out), np.full_like(lse, -np.inf))
    merged, merged_lse = ma.merge_partials([(out, lse), empty])
    np.testing.assert_array_equal(merged, out)
    np.testing.assert_array_equal(merged_lse, lse)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_merge_torch_parts_into_out(rng, dtype):
    q, k, v = (torch.from_numpy(as_f64(x)).to(getattr(torch, dtype))
               for x in random_inputs(rng, B, HQ, HKV, 5, 10, D, dtype=dtype))
    parts = [ma.attention(q, k[:, :, :4], v[:, :, :4], return_lse=True),
             ma.attention(q, k[:, :, 4:], v[:, :, 4:], return_lse=True)]
    out = torch.empty(B, HQ, 5, D, dtype=getattr(torch, dtype))
    merged, lse = ma.merge_partials(parts, out=out)
    assert merged is out and isinstance(lse, torch.Tensor) and lse.dtype == torch.float32
    reference, reference_lse = reference_attention(q, k, v)
    np.testing.assert_allclose(as_f64(lse), reference_lse, rtol=1e-5, atol=1e-5)
    check_attention(merged, q, k, v, dtype)


# --- frames: calls on slices of a larger problem -------------------------------------------------


def test_framed_slices_merged_equal_the_whole_call(rng):
    """Causal + ALiBi + sinks, 2 query slices × 2 key slices: each slice call sees the mask and the
    modifiers at its global positions, the key parts merge (sinks counted in one part only), and
    the backward over the slices, summed, equals the whole backward."""
    q, k, v = random_inputs(rng, B, HQ, HKV, 10, 10, D)
    mask = ma.Mask().causal()
    mods = ma.ScoreMods(alibi_slopes=[0.5, 0.25, 0.125, 0.0625][:HQ], sinks=[0.5] * HQ)
    full, full_lse = ma.attention(q, k, v, mask, mods, return_lse=True)
    dout = rng.standard_normal(full.shape).astype(np.float32)
    dq_full, dk_full, dv_full = ma.attention_backward(q, k, v, full, full_lse, dout, mask, mods)
    dk_sum, dv_sum = np.zeros_like(dk_full), np.zeros_like(dv_full)
    for q0, q1 in ((0, 4), (4, 10)):
        parts = []
        for k0, k1 in ((0, 6), (6, 10)):
            parts.append(ma.attention(
                q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], mask, mods, return_lse=True,
                frame=(q0, k0, 10, 10), count_sinks=k0 == 0))
        merged, lse = ma.merge_partials(parts)
        np.testing.assert_allclose(merged, full[:, :, q0:q1], rtol=0, atol=2e-6)
        np.testing.assert_allclose(lse, full_lse[:, :, q0:q1], rtol=0, atol=2e-6)
        for k0, k1 in ((0, 6), (6, 10)):
            dq, dk, dv = ma.attention_backward(
                q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], merged, lse,
                dout[:, :, q0:q1], mask, mods, frame=(q0, k0, 10, 10))
            dk_sum[:, :, k0:k1] += dk
            dv_sum[:, :, k0:k1] += dv
            if k0 == 0:
                dq_sum = dq
            else:
                dq_sum = dq_sum + dq
        np.testing.assert_allclose(dq_sum, dq_full[:, :, q0:q1], rtol=0, atol=2e-5)
    np.testing.assert_allclose(dk_sum, dk_full, rtol=0, atol=2e-5)
    np.testing.assert_allclose(dv_sum, dv_full, rtol=0, atol=2e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_float32_grads_are_the_gradients_before_rounding(rng, dtype):
    """float32_grads=True: the same gradients as float32 arrays, which the default call rounds to
    the inputs' dtype (bit for bit: rounding them gives the default call's values)."""
    q, k, v = (torch.from_numpy(x).to(getattr(torch, dtype))
               for x in random_inputs(rng, B, HQ, HKV, 9, 9, D))
    mask = ma.Mask().causal()
    out, lse = ma.attention(q, k, v, mask, return_lse=True)
    dout = torch.ones_like(out)
    rounded = ma.attention_backward(q, k, v, out, lse, dout, mask)
    unrounded = ma.attention_backward(q, k, v, out, lse, dout, mask, float32_grads=True)
    for name, low, high in zip(("dq", "dk", "dv"), rounded, unrounded):
        assert low.dtype == getattr(torch, dtype) and high.dtype == torch.float32, name
        assert torch.equal(high.to(low.dtype), low), name
    if dtype == "bfloat16":  # the float32 values carry more than the rounded ones
        assert any(not torch.equal(high, low.float()) for low, high in zip(rounded, unrounded))
