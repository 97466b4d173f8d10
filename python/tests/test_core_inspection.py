"""attention_weights, attention_scores and cpu_info against NumPy float64.

The weights and scores come from the C++ f64 reference, rounded once to float32, so they are
compared with a float32 rounding tolerance; hidden pairs must be exactly 0 (weights) and -inf
(final scores). allowed_pairs and block_map are tested with the masks (test_core_masks.py).
"""

from __future__ import annotations

import numpy as np
import torch

import maskattn as ma
from conftest import as_f64, random_inputs

B, HQ, HKV, D = 2, 4, 2, 8


def scaled_scores(q, k):
    q, k = as_f64(q), np.repeat(as_f64(k), q.shape[1] // k.shape[1], axis=1)
    return np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(q.shape[-1])


def test_weights_are_the_softmax_over_allowed_keys(rng):
    q, k, _ = random_inputs(rng, B, HQ, HKV, 5, 7, D)
    lengths = np.array([7, 4])
    weights = ma.attention_weights(q, k, ma.Mask().causal().key_lengths(lengths))
    assert weights.dtype == np.float32 and weights.shape == (B, HQ, 5, 7)
    i, j = np.arange(5)[:, None] + 2, np.arange(7)[None, :]
    allowed = (j <= i)[None, None] & (j < lengths[:, None, None, None])
    scores = np.where(allowed, scaled_scores(q, k), -np.inf)
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(weights, expected, rtol=1e-6, atol=1e-7)
    assert np.all(weights[~np.broadcast_to(allowed, weights.shape)] == 0)


def test_weights_with_sinks_sum_to_less_than_one(rng):
    q, k, _ = random_inputs(rng, 1, 2, 1, 3, 4, D)
    sinks = np.array([1.0, -2.0])
    weights = ma.attention_weights(torch.from_numpy(q), torch.from_numpy(k),
                                   mods=ma.ScoreMods(sinks=sinks))
    assert isinstance(weights, torch.Tensor) and weights.dtype == torch.float32
    scores = scaled_scores(q, k)
    top = np.maximum(scores.max(-1, keepdims=True), sinks[None, :, None, None])
    denominator = np.exp(scores - top).sum(-1, keepdims=True) + np.exp(sinks[None, :, None, None]
                                                                       - top)
    np.testing.assert_allclose(weights.numpy(), np.exp(scores - top) / denominator, rtol=1e-6)
    assert np.all(weights.numpy().sum(-1) < 1)


def test_scores_scaled_and_final(rng):
    q, k, _ = random_inputs(rng, B, HQ, HKV, 4, 6, D)
    bias = rng.standard_normal((4, 6))
    mods = ma.ScoreMods(softcap=1.0, bias=bias)
    mask = ma.Mask().sliding_window(3)
    scaled = ma.attention_scores(q, k, mask, mods, stage="scaled")
    np.testing.assert_allclose(scaled, scaled_scores(q, k), rtol=1e-6, atol=1e-6)
    final = ma.attention_scores(q, k, mask, mods)
    i, j = np.arange(4)[:, None] + 2, np.arange(6)[None, :]
    allowed = np.broadcast_to((j <= i) & (j > i - 3), final.shape)
    expected = np.tanh(scaled_scores(q, k)) + bias.astype(np.float32)
    np.testing.assert_allclose(final[allowed], expected[allowed], rtol=1e-6, atol=1e-6)
    assert np.all(np.isneginf(final[~allowed]))
    blhd = ma.attention_scores(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), mask, mods,
                               layout="blhd")
    np.testing.assert_array_equal(blhd, final)  # scores are [B, Hq, Lq, Lk] in either layout


def test_cpu_info_names_the_product_units():
    info = ma.cpu_info()
    assert set(info["products"]) == {"float32", "float16", "bfloat16"}
    assert all(unit in ("f32", "bf16-dot", "amx") for unit in info["products"].values())
    assert isinstance(info["avx512"], bool) and info["simd_target"]
