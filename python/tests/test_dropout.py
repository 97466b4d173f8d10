"""Attention dropout from Python: exactness, reproducibility, statistics and gradients.

maskattn drops each allowed pair as a pure function of (seed, offset, b, h, q, kv)
(include/maskattn/attention.h: Dropout); ``attention_weights`` with the same dropout returns the
weights the output was computed with, P∘Z/(1 - p'), 0 where a pair was dropped. The tests read
the dropped pairs Z from there and check everything else against an independent computation:

* exactness: the forward and the backward against PyTorch's float64 math applied with the same
  Z (conftest's ``torch_attention(dropout=…)``), by the rule max|maskattn − f64| ≤
  2·max|same-dtype math − f64| + 1e-6, for float32 and bfloat16, four masks, both kernels, a
  decode-sized Lq (the row kernel) and Lq > 64 (several tiles);
* reproducibility: a seed gives the same bits (any thread count); ``torch.manual_seed``
  reproduces the seeds drawn for torch tensors;
* statistics: the keep rate and E[O] over seeds;
* gradients: torch.autograd.gradcheck through ``maskattn.torch.attention`` with dropout on.
The Hugging Face training test is in test_dropout_transformers.py.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import maskattn as ma  # noqa: E402
import maskattn.torch as mt  # noqa: E402
from conftest import (as_f64, assert_within_rule, random_inputs, round_to,  # noqa: E402
                      torch_attention)

B, HQ, HKV, D, K_LEN = 2, 4, 2, 16, 96
P, SEED = 0.3, 0x5EED_0F_D80


def keep_scale(p: float) -> float:
    """1/(1 - p'), p' = round(p·65536)/65536: the factor kept weights are scaled by."""
    threshold = round(p * 65536)
    return 65536 / (65536 - threshold)


def packed_ids(length: int) -> np.ndarray:
    """Document ids of three packed documents per row, different boundaries per sequence."""
    ids = np.zeros((B, length), np.int64)
    for b, cuts in enumerate(((30, 61), (17, 70))):
        for cut in cuts:
            ids[b, cut:] += 1
    return ids


def mask_of(kind: str, q_len: int) -> ma.Mask:
    """The test's masks for q [B, HQ, q_len], k [B, HKV, K_LEN] (bottom-right aligned)."""
    if kind == "causal_padding":
        return ma.Mask().causal().key_lengths([K_LEN, K_LEN - 13])
    if kind == "packed":
        ids = packed_ids(K_LEN)
        return ma.Mask().causal().segments(ids[:, K_LEN - q_len:], ids)
    if kind == "window":
        return ma.Mask().sliding_window(24)
    assert kind == "program"
    return ma.Mask().program("((q * 7 + kv) % 5 != 0) & (kv <= q + 40)")


MASKS = ("causal_padding", "packed", "window", "program")


def dropout_factors(q, k, mask, p=P, seed=SEED, offset=0, kernel="auto"):
    """[B, HQ, Lq, Lk] float64: 0 where the call with this dropout drops the pair, 1/(1 - p')
    where it keeps it — read from attention_weights, whose kept weights must be the undropped
    ones rescaled (checked here, to float32 rounding)."""
    dropped = ma.attention_weights(q, k, mask, dropout_p=p, dropout_seed=seed,
                                   dropout_offset=offset, kernel=kernel)
    plain = ma.attention_weights(q, k, mask)
    kept = dropped != 0
    assert not np.any(kept & (plain == 0)), "a pair with weight 0 cannot come back"
    np.testing.assert_allclose(dropped[kept], plain[kept] * keep_scale(p), rtol=2e-7)
    return np.where(kept, keep_scale(p), 0.0)


def torch_gradients(q, k, v, dout, dtype, **reference_args):
    """(dq, dk, dv) of Σ dout·O by autograd of conftest's torch_attention in ``dtype``."""
    torch_dtype = getattr(torch, dtype)
    leaves = [torch.from_numpy(as_f64(x)).to(torch_dtype).requires_grad_() for x in (q, k, v)]
    args = {name: (torch.from_numpy(value).to(torch_dtype) if name == "dropout" else value)
            for name, value in reference_args.items()}
    out, _ = torch_attention(*leaves, **args)
    out.backward(torch.from_numpy(as_f64(dout)).to(torch_dtype))
    return [t.grad.double().numpy() for t in leaves]


def torch_output(q, k, v, dtype, **reference_args):
    torch_dtype = getattr(torch, dtype)
    tensors = [torch.from_numpy(as_f64(x)).to(torch_dtype) for x in (q, k, v)]
    args = {name: (torch.from_numpy(value).to(torch_dtype) if name == "dropout" else value)
            for name, value in reference_args.items()}
    return torch_attention(*tensors, **args)[0].double().numpy()


# --- exactness -----------------------------------------------------------------------------------

@pytest.mark.parametrize("q_len", [5, 80], ids=["decode_rows", "tiles"])
@pytest.mark.parametrize("kernel", ["reference", "fused"])
@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forward_and_backward_match_float64_math_with_the_same_dropped_pairs(rng, dtype, kind,
                                                                             kernel, q_len):
    q, k, v = random_inputs(rng, B, HQ, HKV, q_len, K_LEN, D, dtype=dtype)
    dout = round_to(rng.standard_normal((B, HQ, q_len, D)), dtype)
    mask = mask_of(kind, q_len)
    dropout = dict(dropout_p=P, dropout_seed=SEED)
    out, lse = ma.attention(q, k, v, mask, kernel=kernel, return_lse=True, **dropout)
    grads = ma.attention_backward(q, k, v, out, lse, dout, mask, kernel=kernel, **dropout)

    keep = ma.allowed_pairs(mask, B, HQ, q_len, K_LEN).astype(bool)
    factors = dropout_factors(q, k, mask)
    dropped = (factors == 0) & keep
    assert 0.2 < dropped.sum() / keep.sum() < 0.4  # dropout happened, at about its rate
    reference = dict(keep=keep, dropout=factors)
    assert_within_rule(out, torch_output(q, k, v, "float64", **reference),
                       torch_output(q, k, v, dtype, **reference), "out")
    # The LSE is the undropped one.
    np.testing.assert_array_equal(lse, ma.attention(q, k, v, mask, kernel=kernel,
                                                    return_lse=True)[1])
    expected = torch_gradients(q, k, v, dout, "float64", **reference)
    naive = torch_gradients(q, k, v, dout, dtype, **reference)
    for name, got, want, rough in zip(("dq", "dk", "dv"), grads, expected, naive):
        assert_within_rule(got, want, rough, name)


def test_the_kernels_drop_the_same_pairs(rng):
    """Both kernels against each other, and the weights from either kernel option: one rule."""
    q, k, v = random_inputs(rng, B, HQ, HKV, 80, K_LEN, D)
    mask = mask_of("packed", 80)
    dropout = dict(dropout_p=P, dropout_seed=SEED)
    fused = ma.attention(q, k, v, mask, kernel="fused", **dropout)
    reference = ma.attention(q, k, v, mask, kernel="reference", **dropout)
    np.testing.assert_allclose(fused, reference, atol=2e-6)
    np.testing.assert_array_equal(dropout_factors(q, k, mask, kernel="fused"),
                                  dropout_factors(q, k, mask, kernel="reference"))


def test_p_one_drops_every_pair_and_p_zero_none(rng):
    q, k, v = random_inputs(rng, B, HQ, HKV, 20, K_LEN, D)
    mask = mask_of("causal_padding", 20)
    everything = ma.attention(q, k, v, mask, dropout_p=1.0, dropout_seed=1)
    assert np.all(everything == 0)
    out, lse = ma.attention(q, k, v, mask, return_lse=True)
    nothing, lse_zero = ma.attention(q, k, v, mask, dropout_p=0.0, dropout_seed=1,
                                     return_lse=True)
    np.testing.assert_array_equal(nothing, out)
    np.testing.assert_array_equal(lse_zero, lse)


def test_weights_with_dropout_multiply_v_into_the_output(rng):
    """attention_weights(dropout) is what the output was computed with: O = W·V."""
    q, k, v = random_inputs(rng, 1, 2, 2, 12, 30, D)
    mask = ma.Mask().causal()
    dropout = dict(dropout_p=0.5, dropout_seed=99, dropout_offset=3)
    weights = ma.attention_weights(q, k, mask, **dropout)
    out = ma.attention(q, k, v, mask, kernel="reference", **dropout)
    np.testing.assert_allclose(weights.astype(np.float64) @ v, out, atol=2e-6)


def test_scores_show_no_dropout(rng):
    q, k, _ = random_inputs(rng, 1, 2, 2, 12, 30, D)
    scores = ma.attention_scores(q, k, ma.Mask().causal())
    assert np.isfinite(scores).sum() == 2 * sum(min(30, 18 + i + 1) for i in range(12))


# --- the autograd path ---------------------------------------------------------------------------

def test_torch_attention_matches_the_numpy_calls_forward_and_backward(rng):
    q, k, v = random_inputs(rng, B, HQ, HKV, 80, K_LEN, D)
    dout = round_to(rng.standard_normal((B, HQ, 80, D)), "float32")
    mask = mask_of("window", 80)
    dropout = dict(dropout_p=P, dropout_seed=SEED, dropout_offset=7)
    out, lse = ma.attention(q, k, v, mask, return_lse=True, **dropout)
    grads = ma.attention_backward(q, k, v, out, lse, dout, mask, **dropout)
    leaves = [torch.from_numpy(x).requires_grad_() for x in (q, k, v)]
    torch_out = mt.attention(*leaves, mask, **dropout)
    torch_out.backward(torch.from_numpy(dout))
    np.testing.assert_array_equal(torch_out.detach().numpy(), out)
    for leaf, grad in zip(leaves, grads):
        np.testing.assert_array_equal(leaf.grad.numpy(), grad)


def test_torch_autograd_gradcheck_with_dropout():
    """torch.autograd.gradcheck in float64 around the float32 autograd path (maskattn computes in
    float32): finite differences see the float32 rounding (~6e-8 / eps = 6e-5), far inside the
    tolerances, while gradients of other dropped pairs than the forward's fail (checked too)."""
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 7, 4, generator=generator, dtype=torch.float64,
                           requires_grad=True) for _ in range(3))
    mask = ma.Mask().causal()

    def attention(q, k, v, seed=2024):
        out = mt.attention(q.float(), k.float(), v.float(), mask, dropout_p=0.4, dropout_seed=seed)
        return out.double()

    def other_pairs_gradient(q, k, v):  # the values of seed 2024, the gradient of seed 2025
        wrong = attention(q, k, v, seed=2025)
        return wrong - wrong.detach() + attention(q, k, v).detach()

    tolerances = dict(eps=1e-3, atol=1e-3, rtol=1e-2)
    assert not torch.equal(attention(q, k, v), mt.attention(*(x.float() for x in (q, k, v)),
                                                            mask).double())
    assert torch.autograd.gradcheck(attention, (q, k, v), **tolerances)
    assert not torch.autograd.gradcheck(other_pairs_gradient, (q, k, v), raise_exception=False,
                                        **tolerances)


def test_maskattn_gradcheck_holds_the_dropped_pairs_fixed():
    """maskattn.gradcheck with dropout: finite differences of the f64 reference with the same
    pairs dropped agree with both kernels' backward; without a seed it is P82."""
    rng = np.random.default_rng(5)
    q, k, v, dout = (rng.uniform(-1, 1, (1, 2, 9, 4)).astype(np.float32) for _ in range(4))
    mask = ma.Mask().causal()
    for kernel in ("reference", "fused"):
        report = ma.gradcheck(q, k, v, dout, mask, kernel=kernel, dropout_p=0.4, dropout_seed=11)
        assert report["passed"], report
    undropped = ma.gradcheck(q, k, v, dout, mask)
    assert report["entries"] != undropped["entries"]  # the dropout changed the gradients
    with pytest.raises(ma.Error, match=r"gradcheck: dropout_p=0.4 needs the forward's"):
        ma.gradcheck(q, k, v, dout, mask, dropout_p=0.4)
