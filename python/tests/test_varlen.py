"""Varlen attention from Python: maskattn.attention_varlen (NumPy), maskattn.torch.attention_varlen
(autograd) and the flash-attn drop-in flash_attn_varlen_func, and the errors P83–P85.

* bit for bit, each sequence's rows equal ``attention()`` (and ``attention_backward()``) on that
  sequence alone with the mask restricted to it, for int32 and int64 offsets, empty sequences,
  float32/float16/bfloat16 and 1 or 2 threads;
* against the float64 reference of conftest (an independent formula), per sequence;
* autograd gradients equal the NumPy-level backward, and PyTorch's SDPA per sequence;
* ``flash_attn_varlen_func``'s causal is bottom-right per sequence, its window_size, softcap and
  alibi_slopes are maskattn's window, softcap and ALiBi.
"""

from __future__ import annotations

import numpy as np
import pytest

import maskattn as ma
from conftest import DTYPES, as_f64, reference_attention, round_to

HQ, HKV, D, DV = 4, 2, 16, 8
LENGTH_MIXES = [([5, 0, 17, 70, 3], [5, 0, 17, 70, 3]), ([9, 40, 1], [30, 0, 65])]


def packed_inputs(rng, lq, lk, dtype="float32"):
    tq, tk = sum(lq), sum(lk)
    return (round_to(rng.standard_normal((tq, HQ, D)), dtype),
            round_to(rng.standard_normal((tk, HKV, D)), dtype),
            round_to(rng.standard_normal((tk, HKV, DV)), dtype))


def offsets(lengths, dtype):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(dtype)


def masks_for(lq, lk, only=None):
    """Masks of the padded batch (only None) or of sequence ``only`` alone (b = only)."""
    rows_q = max(lq) if only is None else lq[only]
    rows_k = max(lk) if only is None else lk[only]
    batch = range(len(lq)) if only is None else [only]
    segments_k = np.array([[(j + 3 * b) // 11 for j in range(rows_k)] for b in batch])
    segments_q = np.array([[(i + lk[b] - lq[b] + 3 * b) // 11 for i in range(rows_q)]
                           for b in batch])
    keep = np.array([[(b * 7 + j) % 5 != 0 for j in range(rows_k)] for b in batch])
    return {
        "causal": ma.Mask().causal(),
        "sliding window": ma.Mask().sliding_window(6),
        "segments": ma.Mask().causal().segments(segments_q, segments_k),
        "key keep": ma.Mask().key_keep(keep),
        "program": ma.Mask().program(
            "(q + b) % 3 != kv % 2" if only is None else f"(q + (b + {only})) % 3 != kv % 2"),
    }


def sequence_alone(x, cu, i):
    """Sequence i's rows of a packed [total, H, D] array as a [1, H, L, D] array (a view)."""
    return x[cu[i]:cu[i + 1]].transpose(1, 0, 2)[None]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mix", range(len(LENGTH_MIXES)))
def test_each_sequence_is_attention_alone_bit_for_bit(dtype, mix):
    lq, lk = LENGTH_MIXES[mix]
    rng = np.random.default_rng(mix)
    q, k, v = packed_inputs(rng, lq, lk, dtype)
    dout = round_to(rng.standard_normal((sum(lq), HQ, DV)), dtype)
    cu_q, cu_k = offsets(lq, np.int64), offsets(lk, np.int64)
    for name, mask in masks_for(lq, lk).items():
        for threads, index_dtype in ((1, np.int32), (2, np.int64)):
            out, lse = ma.attention_varlen(q, k, v, offsets(lq, index_dtype),
                                           offsets(lk, index_dtype), max(lq), max(lk), mask,
                                           threads=threads, return_lse=True)
            dq, dk, dv = ma.attention_varlen_backward(q, k, v, out, lse, dout, cu_q, cu_k,
                                                      mask=mask, threads=threads)
            assert out.shape == (sum(lq), HQ, DV) and lse.shape == (HQ, sum(lq))
            for i in range(len(lq)):
                alone_mask = masks_for(lq, lk, i)[name]
                qi, ki, vi = (sequence_alone(x, c, i) for x, c in ((q, cu_q), (k, cu_k),
                                                                    (v, cu_k)))
                if lq[i] == 0:
                    continue
                o, l = ma.attention(qi, ki, vi, alone_mask, return_lse=True)
                assert np.array_equal(sequence_alone(out, cu_q, i).view(np.uint8),
                                      o.view(np.uint8)), (name, i)
                assert np.array_equal(lse[:, cu_q[i]:cu_q[i + 1]], l[0], equal_nan=True)
                grads = ma.attention_backward(qi, ki, vi, o, l, sequence_alone(dout, cu_q, i),
                                              alone_mask)
                for got, want, cu in zip((dq, dk, dv), grads, (cu_q, cu_k, cu_k)):
                    assert np.array_equal(sequence_alone(got, cu, i).view(np.uint8),
                                          want.view(np.uint8)), (name, i)


def test_against_the_float64_reference_per_sequence():
    lq, lk = LENGTH_MIXES[1]
    rng = np.random.default_rng(7)
    q, k, v = packed_inputs(rng, lq, lk)
    cu_q, cu_k = offsets(lq, np.int32), offsets(lk, np.int32)
    out = ma.attention_varlen(q, k, v, cu_q, cu_k, mask=ma.Mask().causal())
    for i in range(len(lq)):
        qi, ki, vi = (sequence_alone(x, c, i) for x, c in ((q, cu_q), (k, cu_k), (v, cu_k)))
        if lk[i] == 0:  # no keys: rows of zeros
            assert not sequence_alone(out, cu_q, i).any()
            continue
        # bottom-right causal: query t sees keys j ≤ t + Lk − Lq
        keep = np.arange(lk[i])[None, :] <= np.arange(lq[i])[:, None] + lk[i] - lq[i]
        want, _ = reference_attention(qi, ki, vi, keep=keep)
        np.testing.assert_allclose(as_f64(sequence_alone(out, cu_q, i)), want, atol=2e-6)


torch = pytest.importorskip("torch")
import maskattn.torch as mt  # noqa: E402


def torch_packed(lq, lk, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator).to(dtype).requires_grad_()
            for shape in ((sum(lq), HQ, D), (sum(lk), HKV, D), (sum(lk), HKV, DV))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_autograd_equals_the_numpy_backward(dtype):
    lq, lk = LENGTH_MIXES[0]
    q, k, v = torch_packed(lq, lk, dtype)
    cu = torch.tensor(offsets(lq, np.int32))
    sinks = torch.tensor([0.1, -0.2, 0.3, 0.0], requires_grad=True)
    mods = mt.ScoreMods(sinks=sinks, softcap=10.0)
    out = mt.attention_varlen(q, k, v, cu, cu, max(lq), max(lk), ma.Mask().causal(), mods)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    out.backward(dout)
    with torch.no_grad():
        o, lse = ma.attention_varlen(q, k, v, cu, cu, mask=ma.Mask().causal(), mods=mods.core(),
                                     return_lse=True)
        dq, dk, dv, _, dsinks = ma.attention_varlen_backward(
            q, k, v, o, lse, dout, cu, cu, mask=ma.Mask().causal(), mods=mods.core(),
            return_mod_grads=True)
    assert torch.equal(out.detach(), o)
    for got, want in ((q.grad, dq), (k.grad, dk), (v.grad, dv), (sinks.grad, dsinks)):
        assert torch.equal(got, want)


def test_flash_attn_varlen_func_matches_sdpa_per_sequence():
    lq, lk = [6, 11, 2], [9, 11, 7]  # Lq < Lk: bottom-right alignment matters
    q, k, v = torch_packed(lq, lk, seed=4)
    v = torch.randn(sum(lk), HKV, D).requires_grad_()  # flash-attn: Dv = D
    cu_q, cu_k = torch.tensor(offsets(lq, np.int32)), torch.tensor(offsets(lk, np.int32))
    out, lse, probs = mt.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk),
                                                causal=True, return_attn_probs=True)
    assert probs is None and lse.shape == (HQ, sum(lq))
    out.sum().backward()
    for i in range(len(lq)):
        qs, ks, vs = (x.detach()[c[i]:c[i + 1]].transpose(0, 1)[None].clone().requires_grad_()
                      for x, c in ((q, cu_q), (k, cu_k), (v, cu_k)))
        keep = torch.arange(lk[i])[None] <= torch.arange(lq[i])[:, None] + lk[i] - lq[i]
        want = torch.nn.functional.scaled_dot_product_attention(
            qs, ks.repeat_interleave(2, 1), vs.repeat_interleave(2, 1), attn_mask=keep)
        torch.testing.assert_close(out[cu_q[i]:cu_q[i + 1]].detach(),
                                   want[0].transpose(0, 1).detach(), rtol=1e-5, atol=1e-5)
        want.sum().backward()
        torch.testing.assert_close(q.grad[cu_q[i]:cu_q[i + 1]], qs.grad[0].transpose(0, 1),
                                   rtol=1e-4, atol=1e-5)


def test_flash_attn_varlen_func_window_softcap_and_alibi_are_maskattns():
    lq = lk = [13, 30]
    q, k, v = torch_packed(lq, lk, seed=5)
    v = torch.randn(sum(lk), HKV, D)
    cu = torch.tensor(offsets(lq, np.int32))
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    got = mt.flash_attn_varlen_func(q, k, v, cu, cu, 30, 30, causal=True, window_size=(4, -1),
                                    softcap=5.0, alibi_slopes=slopes, softmax_scale=0.3)
    want = mt.attention_varlen(q, k, v, cu, cu, 30, 30, ma.Mask().window(4, 0),
                               ma.ScoreMods(softcap=5.0, alibi_slopes=slopes.numpy()), scale=0.3)
    assert torch.equal(got, want)
    both = mt.flash_attn_varlen_func(q, k, v, cu, cu, 30, 30, window_size=(3, 2))
    assert torch.equal(both, mt.attention_varlen(q, k, v, cu, cu, 30, 30, ma.Mask().window(3, 2)))


@pytest.mark.parametrize("bad, message", [
    (np.array([0.0, 2.0, 5.0]), "cu_seqlens_q must be a 1-D integer array"),
    (np.array([[0, 2, 5]]), "cu_seqlens_q must be a 1-D integer array"),
    ("torch-float", "cu_seqlens_q must be a 1-D integer tensor"),
])
def test_P83_cu_seqlens_not_one_dimensional_integers(bad, message):
    q, k, v = packed_inputs(np.random.default_rng(0), [2, 3], [2, 3])
    if isinstance(bad, str):
        bad = torch.tensor([0.0, 2.0, 5.0])
    with pytest.raises(ma.Error, match=message):
        ma.attention_varlen(q, k, v, bad, [0, 2, 5])


@pytest.mark.parametrize("bad", [2.5, -1, True, "3"])
def test_P84_max_seqlen_not_a_length(bad):
    q, k, v = packed_inputs(np.random.default_rng(0), [2, 3], [2, 3])
    with pytest.raises(ma.Error, match=r"max_seqlen_q must be None \(the longest sequence\) or "
                                       r"an int >= 0"):
        ma.attention_varlen(q, k, v, [0, 2, 5], [0, 2, 5], bad, 3)


def test_P85_flash_attn_arguments_maskattn_cannot_honour():
    q, k, v = torch_packed([2, 3], [2, 3])
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    with pytest.raises(ma.Error, match="block_table"):
        mt.flash_attn_varlen_func(q, k, v, cu, cu, 3, 3, block_table=torch.zeros(2, 1))
    with pytest.raises(ma.Error, match=r"window_size must be \(left, right\)"):
        mt.flash_attn_varlen_func(q, k, v, cu, cu, 3, 3, window_size=(-2, 0))
    with pytest.raises(ma.Error, match=r"alibi_slopes must be \[nheads\] = \[4\]"):
        mt.flash_attn_varlen_func(q, k, v, cu, cu, 3, 3, alibi_slopes=torch.rand(2, 4))
    with pytest.raises(ma.Error, match="softcap must be a real number >= 0"):
        mt.flash_attn_varlen_func(q, k, v, cu, cu, 3, 3, softcap=-1.0)


def test_the_library_checks_the_offsets_values():
    q, k, v = packed_inputs(np.random.default_rng(0), [2, 3], [2, 3])
    with pytest.raises(ma.Error, match="cu_seqlens_q ends at 4 but q has 5 rows"):
        ma.attention_varlen(q, k, v, [0, 2, 4], [0, 2, 5])
    with pytest.raises(ma.Error, match="q has shape"):
        ma.attention_varlen(q[None], k, v, [0, 2, 5], [0, 2, 5])
