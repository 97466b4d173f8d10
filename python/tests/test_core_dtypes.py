"""Element types, frameworks, layouts, strides and in-place I/O of maskattn.attention.

float32/float16/bfloat16 from NumPy, ml_dtypes and PyTorch (and raw 16-bit views with dtype=)
are checked against the float64 reference under the rule of conftest; layouts and strided views
must give the same bits as contiguous copies (the kernels' arithmetic depends on the shapes
only); outputs are written in place and inputs read in place. Fully hidden rows give 0 and LSE
-inf in every dtype, never NaN.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import maskattn as ma
from maskattn import _arrays
from conftest import (DTYPES, as_f64, check_attention, numpy_dtype, random_inputs,
                      reference_attention, round_to)

B, HQ, HKV, D = 2, 4, 2, 16


def to_torch(x, dtype):
    return torch.from_numpy(as_f64(x)).to(getattr(torch, dtype))  # exact: x holds dtype values


def padded_causal(q_len, k_len):
    """A causal mask with key padding, and its allowed pairs [B, 1, Lq, Lk]."""
    lengths = np.array([k_len, k_len - 4])
    i, j = np.arange(q_len)[:, None] + (k_len - q_len), np.arange(k_len)[None, :]
    keep = (j <= i)[None, None] & (j < lengths[:, None, None, None])
    return ma.Mask().causal().key_lengths(lengths), keep


# --- dtypes and frameworks ----------------------------------------------------------------------


@pytest.mark.parametrize("q_len", [3, 20], ids=["row-kernel", "tile-kernel"])
@pytest.mark.parametrize("framework", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_within_the_rule(rng, dtype, framework, q_len):
    q, k, v = random_inputs(rng, B, HQ, HKV, q_len, 29, D, dtype=dtype)
    mask, keep = padded_causal(q_len, 29)
    inputs = (q, k, v) if framework == "numpy" else tuple(to_torch(x, dtype) for x in (q, k, v))
    out, lse = ma.attention(*inputs, mask, return_lse=True)
    if framework == "numpy":
        assert isinstance(out, np.ndarray) and out.dtype == numpy_dtype(dtype)
        assert isinstance(lse, np.ndarray) and lse.dtype == np.float32
    else:
        assert isinstance(out, torch.Tensor) and out.dtype == getattr(torch, dtype)
        assert isinstance(lse, torch.Tensor) and lse.dtype == torch.float32
    assert tuple(out.shape) == (B, HQ, q_len, D) and tuple(lse.shape) == (B, HQ, q_len)
    check_attention(out, q, k, v, dtype, keep=keep)
    _, reference_lse = reference_attention(q, k, v, keep=keep)
    np.testing.assert_allclose(as_f64(lse), reference_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_raw_16_bit_views_with_dtype_argument(rng, dtype):
    q, k, v = random_inputs(rng, B, HQ, HKV, 5, 9, D, dtype=dtype)
    expected = ma.attention(q, k, v).view(np.uint16)
    raw = ma.attention(*(x.view(np.uint16) for x in (q, k, v)), dtype=dtype)
    assert raw.dtype == np.uint16
    np.testing.assert_array_equal(raw, expected)
    short_name = {"bfloat16": "bf16", "float16": "half"}[dtype]
    for spelling in (numpy_dtype(dtype), np.dtype(numpy_dtype(dtype)), short_name):
        spelled = ma.attention(*(x.view(np.uint16) for x in (q, k, v)), dtype=spelling)
        np.testing.assert_array_equal(spelled, expected)
    signed = ma.attention(*(x.view(np.int16) for x in (q, k, v)), dtype=dtype)
    np.testing.assert_array_equal(signed.view(np.uint16), expected)
    tensors = [to_torch(x, dtype).view(torch.int16) for x in (q, k, v)]
    from_torch = ma.attention(*tensors, dtype=getattr(torch, dtype))
    assert from_torch.dtype == torch.int16
    np.testing.assert_array_equal(from_torch.numpy().view(np.uint16), expected)


def test_ml_dtypes_and_torch_bfloat16_give_the_same_bits(rng):
    q, k, v = random_inputs(rng, B, HQ, HKV, 12, 12, D, dtype="bfloat16")
    mask = ma.Mask().causal()
    from_numpy = ma.attention(q, k, v, mask)
    from_torch = ma.attention(*(to_torch(x, "bfloat16") for x in (q, k, v)), mask)
    np.testing.assert_array_equal(from_numpy.view(np.uint16),
                                  from_torch.view(torch.int16).numpy().view(np.uint16))


# --- layouts and strides ------------------------------------------------------------------------


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_blhd_layout_gives_the_bhld_bits(rng, framework):
    q, k, v = random_inputs(rng, B, HQ, HKV, 11, 14, D)
    mask = ma.Mask().sliding_window(5)
    expected, expected_lse = ma.attention(q, k, v, mask, return_lse=True)
    blhd = [np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v)]
    if framework == "torch":
        blhd = [torch.from_numpy(x) for x in blhd]
    out, lse = ma.attention(*blhd, mask, layout="blhd", return_lse=True)
    assert tuple(out.shape) == (B, 11, HQ, D) and tuple(lse.shape) == (B, HQ, 11)
    np.testing.assert_array_equal(np.asarray(out).transpose(0, 2, 1, 3), expected)
    np.testing.assert_array_equal(np.asarray(lse), expected_lse)


def test_strided_negative_and_zero_stride_views_are_read_in_place(rng):
    q_big = round_to(rng.standard_normal((B, HQ, 14, D)), "float32")
    k_big = round_to(rng.standard_normal((B, HKV, 9, 2 * D)), "float32")
    v_big = round_to(rng.standard_normal((1, HKV, 9, D)), "float32")
    q = q_big[:, :, ::2]  # stride 2 along L
    k = k_big[:, :, ::-1, ::2]  # negative stride along L, stride 2 along D
    v = np.broadcast_to(v_big, (B, HKV, 9, D))  # stride 0 along B (read-only)
    assert v.strides[0] == 0 and k.strides[2] < 0
    mask = ma.Mask().causal()
    out = ma.attention(q, k, v, mask)
    copies = [np.ascontiguousarray(x) for x in (q, k, v)]
    np.testing.assert_array_equal(out, ma.attention(*copies, mask))
    i, j = np.arange(7)[:, None] + 2, np.arange(9)[None, :]
    check_attention(out, q, k, v, keep=j <= i)


def test_torch_strided_and_expanded_views(rng):
    q, k, v = (torch.from_numpy(x) for x in random_inputs(rng, B, HQ, HKV, 6, 10, 2 * D))
    q_view = q[..., ::2]  # stride 2 along D
    k_view = k[:, :, :, :D].transpose(2, 3).contiguous().transpose(2, 3)  # column-major L, D
    v_view = v[:1, :, :, :D].expand(B, HKV, 10, D)  # stride 0 along B
    assert v_view.stride(0) == 0 and not k_view.is_contiguous()
    out = ma.attention(q_view, k_view, v_view)
    expected = ma.attention(*(x.contiguous() for x in (q_view, k_view, v_view)))
    assert torch.equal(out, expected)
    check_attention(out, q_view, k_view, v_view)


@pytest.mark.parametrize("q_heads,kv_heads", [(6, 3), (4, 1), (4, 4)], ids=["gqa", "mqa", "mha"])
def test_grouped_query_heads_read_their_kv_head(rng, q_heads, kv_heads):
    q, k, v = random_inputs(rng, B, q_heads, kv_heads, 7, 10, D, value_dim=5)
    mask, keep = padded_causal(7, 10)
    out = ma.attention(q, k, v, mask)
    assert out.shape == (B, q_heads, 7, 5)
    check_attention(out, q, k, v, keep=keep)


# --- in place -----------------------------------------------------------------------------------


def test_inputs_reach_the_core_without_a_copy(rng):
    q, _, _ = random_inputs(rng, B, HQ, HKV, 4, 4, D)
    view, _ = _arrays.core_view(q[:, :, ::2], "q", "")
    assert np.shares_memory(view, q)
    blhd = _arrays.to_bhld(q, "blhd")
    assert np.shares_memory(blhd, q) and blhd.shape == (B, 4, HQ, D)
    bf16 = round_to(q, "bfloat16")
    view, tag = _arrays.core_view(bf16, "q", "")
    assert tag == "bf16" and view.dtype == np.uint16 and np.shares_memory(view, bf16)
    tensor = torch.from_numpy(q).requires_grad_()
    view, _ = _arrays.core_view(tensor, "q", "")
    assert view.__array_interface__["data"][0] == tensor.data_ptr()
    bf16_tensor = torch.from_numpy(q).bfloat16().transpose(1, 2)
    view, tag = _arrays.core_view(bf16_tensor, "q", "")
    assert tag == "bf16" and view.__array_interface__["data"][0] == bf16_tensor.data_ptr()
    assert view.strides == tuple(2 * s for s in bf16_tensor.stride())


def test_out_is_written_in_place_and_nothing_else(rng):
    q, k, v = random_inputs(rng, B, HQ, HKV, 5, 8, D)
    expected = ma.attention(q, k, v, ma.Mask().causal())
    storage = np.full((B, 5, HQ + 1, D), 7.0, np.float32)  # blhd with one extra head
    out = storage[:, :, :HQ, :]
    result = ma.attention(*(x.transpose(0, 2, 1, 3) for x in (q, k, v)), ma.Mask().causal(),
                          layout="blhd", out=out)
    assert result is out
    np.testing.assert_array_equal(storage[:, :, :HQ].transpose(0, 2, 1, 3), expected)
    assert np.all(storage[:, :, HQ] == 7.0)  # the rest of the buffer is untouched
    tensor_out = torch.full((B, HQ, 5, D), 7.0)
    pointer = tensor_out.data_ptr()
    result = ma.attention(*(torch.from_numpy(x) for x in (q, k, v)), ma.Mask().causal(),
                          out=tensor_out)
    assert result is tensor_out and tensor_out.data_ptr() == pointer
    np.testing.assert_array_equal(tensor_out.numpy(), expected)


# --- fully hidden rows --------------------------------------------------------------------------


HIDDEN_ROWS = {  # name: (mask, mods, q_len, k_len, hidden rows [B, Lq] of the first head)
    "query padding": (lambda: ma.Mask().query_lengths([2, 5]), None, 5, 6,
                      np.arange(5)[None, :] >= np.array([[2], [5]])),
    "causal Lq > Lk": (lambda: ma.Mask().causal(), None, 7, 4,
                       np.broadcast_to(np.arange(7) < 3, (B, 7))),
    "additive -inf row": (lambda: ma.Mask().additive(np.where(np.arange(5)[:, None] == 1, -np.inf,
                                                              np.zeros((5, 6)))),
                          None, 5, 6, np.broadcast_to(np.arange(5) == 1, (B, 5))),
    "threshold": (lambda: None, lambda: ma.ScoreMods(threshold=1e9), 5, 6, np.ones((B, 5), bool)),
    "no keys": (lambda: None, None, 5, 0, np.ones((B, 5), bool)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", HIDDEN_ROWS)
def test_fully_hidden_rows_give_zero_and_minus_inf(rng, case, dtype):
    make_mask, make_mods, q_len, k_len, hidden = HIDDEN_ROWS[case]
    q, k, v = random_inputs(rng, B, HQ, HKV, q_len, k_len, D, dtype=dtype)
    mods = make_mods() if make_mods else None
    out, lse = ma.attention(q, k, v, make_mask(), mods, return_lse=True)
    out = as_f64(out)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    rows = np.broadcast_to(hidden[:, None, :], (B, HQ, q_len))
    assert rows.any()
    assert np.all(out[rows] == 0) and not np.signbit(out[rows]).any()  # +0.0
    assert np.all(np.isneginf(lse[rows])) and np.all(np.isfinite(lse[~rows]))


def test_garbage_in_hidden_keys_never_reaches_the_output(rng):
    q, k, v = random_inputs(rng, B, HQ, HKV, 4, 8, D)
    clean = ma.attention(q, k, v, ma.Mask().key_lengths([8, 5]))
    k, v = k.copy(), v.copy()
    k[1, :, 6] = np.inf
    v[1, :, 5] = np.nan
    np.testing.assert_array_equal(ma.attention(q, k, v, ma.Mask().key_lengths([8, 5])), clean)
