"""ScoreMods from Python against the float64 NumPy reference (docs/semantics.md §5).

The order is fixed: s = scale·q·k → softcap → + ALiBi + bias + additive masks → score_fn →
threshold → softmax with sinks. Each test expresses the modifier with the reference's own
arguments (softcap, bias, keep, sinks), computed here from the document's formulas.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import maskattn as ma
from conftest import (as_f64, assert_within_rule, check_attention, random_inputs,
                      reference_attention)

B, HQ, HKV, D = 2, 4, 2, 8


def scaled_scores(q, k, scale=None):
    """scale·Q·Kᵀ in float64, with kv heads repeated for GQA: [B, Hq, Lq, Lk]."""
    q, k = as_f64(q), as_f64(k)
    k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    return scale * np.einsum("bhid,bhjd->bhij", q, k)


def test_softcap_squashes_the_scores(rng):
    q, k, v = random_inputs(rng, B, HQ, HKV, 6, 9, D)
    mods = ma.ScoreMods(softcap=1.5)
    assert mods.softcap == 1.5
    out = ma.attention(q, k, v, mods=mods, scale=1.0)  # large scores: the cap matters
    check_attention(out, q, k, v, scale=1.0, softcap=1.5)
    reference, _ = reference_attention(q, k, v, scale=1.0)
    assert np.abs(as_f64(out) - reference).max() > 1e-2  # the test sees the cap


@pytest.mark.parametrize("q_len,k_len", [(5, 9), (9, 5)])
def test_alibi_uses_bottom_right_positions(rng, q_len, k_len):
    slopes = np.array([0.5, 0.25, 0.125, 0.0625])
    q, k, v = random_inputs(rng, B, HQ, HKV, q_len, k_len, D)
    qpos = np.arange(q_len)[:, None] + (k_len - q_len)
    kpos = np.arange(k_len)[None, :]
    bias = -slopes[:, None, None] * np.abs(qpos - kpos)
    out = ma.attention(q, k, v, mods=ma.ScoreMods(alibi_slopes=slopes))
    check_attention(out, q, k, v, bias=bias)


def test_alibi_positions_ignore_left_padding(rng):
    slopes, starts = np.array([0.3, 0.2, 0.1, 0.05]), np.array([0, 2])
    q, k, v = random_inputs(rng, B, HQ, HKV, 6, 6, D)
    i, j = np.arange(6)[:, None], np.arange(6)[None, :]
    bias = -slopes[None, :, None, None] * np.abs(i - j)[None, None]  # shifts cancel: i-s - (j-s)
    keep = j[None, None] >= starts[:, None, None, None]
    mask = ma.Mask().key_starts(starts)
    out = ma.attention(q, k, v, mask, ma.ScoreMods(alibi_slopes=slopes))
    check_attention(out, q, k, v, keep=keep, bias=bias)


@pytest.mark.parametrize("shape", [(6, 7), (B, 1, 1, 7), (HQ, 6, 7), (B, HQ, 6, 7)])
def test_bias_broadcasts_and_minus_inf_hides(rng, shape):
    bias = rng.standard_normal(shape)
    bias[rng.random(shape) < 0.2] = -np.inf
    q, k, v = random_inputs(rng, B, HQ, HKV, 6, 7, D)
    mods = ma.ScoreMods(bias=bias)
    assert mods.bias.shape == shape and mods.bias.dtype == np.float32
    out, lse = ma.attention(q, k, v, mods=mods, return_lse=True)
    check_attention(out, q, k, v, bias=bias)
    _, reference_lse = reference_attention(q, k, v, bias=bias)
    np.testing.assert_allclose(lse, reference_lse, rtol=1e-5, atol=1e-5)


def test_bias_and_additive_masks_add_up(rng):
    q, k, v = random_inputs(rng, B, HQ, HKV, 5, 5, D)
    bias, additive = rng.standard_normal((5, 5)), rng.standard_normal((B, 1, 5, 5))
    out = ma.attention(q, k, v, ma.Mask().additive(additive), ma.ScoreMods(bias=bias))
    check_attention(out, q, k, v, bias=bias + additive)


def test_score_fn_gets_the_score_and_indices(rng):
    q, k, v = random_inputs(rng, B, HQ, HKV, 5, 7, D)

    def shift(score, b, h, i, j):
        return score + 0.1 * (i - j) + 0.2 * h - 0.3 * b

    b, h, i, j = np.ix_(range(B), range(HQ), range(5), range(7))
    out = ma.attention(q, k, v, mods=ma.ScoreMods(score_fn=shift))
    check_attention(out, q, k, v, bias=0.1 * (i - j) + 0.2 * h - 0.3 * b)
    minus_inf = ma.ScoreMods(score_fn=lambda s, b, h, i, j: -np.inf if (i + j) % 2 else s)
    out = ma.attention(q, k, v, mods=minus_inf)
    check_attention(out, q, k, v, keep=(i + j) % 2 == 0)


def test_score_fn_is_called_only_for_allowed_pairs(rng):
    q, k, v = random_inputs(rng, 1, 2, 2, 6, 6, D)
    seen, lock = [], threading.Lock()

    def record(score, b, h, i, j):
        with lock:
            seen.append((i, j))
        return score

    ma.attention(q, k, v, ma.Mask().causal(), ma.ScoreMods(score_fn=record))
    assert seen and all(j <= i for i, j in seen)


def test_score_fn_sees_the_score_after_softcap_and_bias(rng):
    q, k, v = random_inputs(rng, 1, 1, 1, 3, 4, D)
    bias = rng.standard_normal((3, 4))
    seen = {}

    def record(score, b, h, i, j):
        seen[i, j] = score
        return score

    ma.attention(q, k, v, mods=ma.ScoreMods(softcap=2.0, bias=bias, score_fn=record))
    expected = 2.0 * np.tanh(scaled_scores(q, k)[0, 0] / 2.0) + bias.astype(np.float32)
    got = np.array([[seen[i, j] for j in range(4)] for i in range(3)])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def threshold_between_scores(scores, near=0.0):
    """A threshold in the widest gap between scores near ``near`` (no score within rounding)."""
    values = np.sort(scores.ravel())
    gaps = np.diff(values)
    centre = np.argmin(np.abs(values - near))
    window = slice(max(centre - 5, 0), min(centre + 5, len(gaps)))
    best = window.start + np.argmax(gaps[window])
    return float((values[best] + values[best + 1]) / 2)


def test_threshold_hides_scores_below_it(rng):
    q, k, v = random_inputs(rng, B, HQ, HKV, 6, 8, D)
    scores = scaled_scores(q, k)
    tau = threshold_between_scores(scores)
    out = ma.attention(q, k, v, mods=ma.ScoreMods(threshold=tau))
    check_attention(out, q, k, v, keep=scores >= tau)
    out, lse = ma.attention(q, k, v, mods=ma.ScoreMods(threshold=1e6), return_lse=True)
    assert np.all(out == 0) and np.all(np.isneginf(lse))  # above every score: all rows hidden


def test_threshold_applies_after_the_other_modifiers(rng):
    q, k, v = random_inputs(rng, B, HQ, HKV, 6, 8, D)
    bias = rng.standard_normal((6, 8))
    final = 1.5 * np.tanh(scaled_scores(q, k) / 1.5) + bias
    tau = threshold_between_scores(final, near=0.3)
    mods = ma.ScoreMods(softcap=1.5, bias=bias, threshold=tau)
    out = ma.attention(q, k, v, mods=mods)
    check_attention(out, q, k, v, softcap=1.5, bias=bias, keep=final >= tau)


def test_sinks_join_the_denominator_and_the_lse(rng):
    sinks = np.array([0.5, -1.0, 2.0, 0.0])
    q, k, v = random_inputs(rng, B, HQ, HKV, 5, 7, D)
    lengths = np.array([7, 3])
    keep = np.arange(7)[None, None, None, :] < lengths[:, None, None, None]
    mask = ma.Mask().key_lengths(lengths).query_lengths([5, 2])  # some rows fully hidden
    keep = keep & (np.arange(5)[None, None, :, None] < np.array([5, 2])[:, None, None, None])
    keep = np.broadcast_to(keep, (B, HQ, 5, 7))
    out, lse = ma.attention(q, k, v, mask, ma.ScoreMods(sinks=sinks), return_lse=True)
    check_attention(out, q, k, v, keep=keep, sinks=sinks)
    reference, reference_lse = reference_attention(q, k, v, keep=keep, sinks=sinks)
    hidden = ~keep.any(-1)
    np.testing.assert_allclose(lse[~hidden], reference_lse[~hidden], rtol=1e-5, atol=1e-5)
    # A fully hidden row: all its weight on the sink, so O = 0 and LSE = the sink's logit.
    assert np.all(out[hidden] == 0)
    sink_of_row = np.broadcast_to(sinks[None, :, None], hidden.shape)
    np.testing.assert_allclose(lse[hidden], sink_of_row[hidden])


def test_mods_take_numpy_lists_and_torch():
    """ScoreMods accept NumPy, lists and torch tensors; repr names what is set."""
    import torch

    mods = ma.ScoreMods(alibi_slopes=torch.tensor([0.5, 0.25]), sinks=[0.0, 1.0],
                        bias=torch.zeros(3, 3, dtype=torch.bfloat16), threshold=-5.0)
    assert list(mods.alibi_slopes) == [0.5, 0.25] and list(mods.sinks) == [0.0, 1.0]
    assert mods.threshold == -5.0 and not mods.has_score_fn and not mods.empty()
    assert "alibi_slopes[2]" in repr(mods) and "bias[3,3]" in repr(mods)
    assert ma.ScoreMods().empty()


# --- score programs -------------------------------------------------------------------------------


def test_score_program_takes_score_fns_place_in_the_order(rng):
    """softcap → bias → program: the program sees the capped, biased score; its tables are read
    in place, indexed by rows (q - kv)."""
    q, k, v = random_inputs(rng, B, HQ, HKV, 5, 7, D)
    rel = rng.standard_normal((HQ, 11)).astype(np.float32)
    bias = rng.standard_normal((5, 7))
    program = ("s + rel[h, q - kv + 6] - 0.25 * b", {"rel": rel})
    mods = ma.ScoreMods(softcap=2.0, bias=bias, program=program)
    assert "program='s + rel[h, q - kv + 6] - 0.25 * b'" in repr(mods)
    b, h, i, j = np.ix_(range(B), range(HQ), range(5), range(7))
    out = ma.attention(q, k, v, mods=mods)
    check_attention(out, q, k, v, softcap=2.0, bias=bias + rel[h, i - j + 6] - 0.25 * b)


def test_score_program_hides_with_minus_inf_and_needs_no_score_fn(rng):
    q, k, v = random_inputs(rng, B, HQ, HKV, 6, 6, D)
    mods = ma.ScoreMods(program="where(kv % 3 == 1, -1e39, s)")  # -1e39 is -inf in f32
    out = ma.attention(q, k, v, mods=mods)
    check_attention(out, q, k, v, keep=(np.arange(6) % 3 != 1)[None, None, None, :])
    assert isinstance(mods.program, ma.Program) and mods.program.kind == "score"
    with pytest.raises(ma.Error, match="give score_fn or program, not both"):
        ma.ScoreMods(score_fn=lambda s, b, h, i, j: s, program="s")


def test_score_program_table_gradients(rng):
    """∂L/∂rel is the sum of ∂L/∂bias over the pairs that read each entry (torch autograd of
    the dense bias, scattered back)."""
    import torch

    q, k, v = random_inputs(rng, B, HQ, HKV, 5, 7, D)
    dout = rng.standard_normal((B, HQ, 5, D)).astype(np.float32)
    rel = rng.standard_normal((HQ, 11)).astype(np.float32)
    doc = np.array([0, 0, 1, 1, 1, 1, 2])  # an int table: no gradient
    mods = ma.ScoreMods(program=("s * 0.5 + rel[h, q - kv + 6] + doc[kv]", {"rel": rel,
                                                                           "doc": doc}))
    out, lse = ma.attention(q, k, v, mods=mods, return_lse=True)
    dq, dk, dv, dtables = ma.attention_backward(q, k, v, out, lse, dout, mods=mods,
                                                return_table_grads=True)
    assert set(dtables) == {"rel"} and dtables["rel"].shape == rel.shape

    def run(dtype):
        cast = {"float64": torch.float64, "float32": torch.float32}[dtype]
        q_t, k_t, v_t, rel_t = (torch.from_numpy(x).to(cast).requires_grad_()
                                for x in (q, k, v, rel))
        i, j = torch.arange(5)[:, None], torch.arange(7)[None, :]
        k_r, v_r = (x.repeat_interleave(HQ // HKV, dim=1) for x in (k_t, v_t))
        scores = (q_t @ k_r.transpose(-1, -2)) / D ** 0.5 * 0.5 + rel_t[:, i - j + 6] \
            + torch.from_numpy(doc)[j].to(cast)
        (torch.softmax(scores, -1) @ v_r).backward(torch.from_numpy(dout).to(cast))
        return [x.grad.double().numpy() for x in (q_t, k_t, v_t, rel_t)]

    reference, naive = run("float64"), run("float32")
    for name, got, want, rough in zip(("dq", "dk", "dv", "drel"), (dq, dk, dv, dtables["rel"]),
                                      reference, naive):
        assert_within_rule(got, want, rough, name)
