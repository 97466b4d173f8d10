"""Attention dropout through every call that takes it: reproducibility, seeds, statistics, SDPA,
torch.compile, and the errors P80–P82.

Exactness against float64 math is test_dropout.py's; here the properties of the dropout itself:

* a seed (and offset) gives the same bits on every call and thread count; other seeds or offsets
  drop other pairs;
* torch tensors without a seed draw one from PyTorch's default generator: ``torch.manual_seed``
  reproduces the draws, and two calls in a row drop different pairs;
* the keep rate through ``attention_weights`` is within 3σ of 1 − p', and the mean output over
  many seeds is the undropped output (each element within 5 standard errors, the standard error
  computed exactly from the weights);
* ``scaled_dot_product_attention(dropout_p=…)`` and its ``torch.compile`` form.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import maskattn as ma  # noqa: E402
import maskattn.torch as mt  # noqa: E402
from conftest import random_inputs, round_to  # noqa: E402

B, HQ, HKV, D = 2, 4, 2, 16


def keep_fraction_expected(p: float) -> float:
    """1 − p', p' = round(p·65536)/65536 (the generator compares 16-bit draws)."""
    return 1 - round(p * 65536) / 65536


def torch_inputs(seed, q_len=40, k_len=40, requires_grad=False):
    generator = torch.Generator().manual_seed(seed)
    shapes = ((B, HQ, q_len, D), (B, HKV, k_len, D), (B, HKV, k_len, D))
    return [torch.randn(shape, generator=generator).requires_grad_(requires_grad)
            for shape in shapes]


# --- reproducibility -----------------------------------------------------------------------------

def test_a_seed_gives_the_same_bits_and_other_seeds_or_offsets_other_pairs(rng):
    q, k, v = random_inputs(rng, B, HQ, HKV, 70, 90, D)
    mask = ma.Mask().causal()

    def run(seed, offset=0):
        return ma.attention(q, k, v, mask, dropout_p=0.2, dropout_seed=seed,
                            dropout_offset=offset)

    first = run(11)
    np.testing.assert_array_equal(run(11), first)
    assert not np.array_equal(run(12), first)
    assert not np.array_equal(run(11, offset=1), first)
    assert not np.array_equal(run(2**64 - 1), first)  # the whole 64-bit key is used


@pytest.mark.parametrize("kernel", ["reference", "fused"])
def test_one_thread_and_two_give_the_same_bits(rng, kernel):
    q, k, v = random_inputs(rng, B, HQ, HKV, 130, 150, D)
    dout = round_to(rng.standard_normal((B, HQ, 130, D)), "float32")
    mask = ma.Mask().causal().key_lengths([150, 101])
    dropout = dict(dropout_p=0.25, dropout_seed=77, kernel=kernel)
    results = []
    for threads in (1, 2):
        out, lse = ma.attention(q, k, v, mask, threads=threads, return_lse=True, **dropout)
        grads = ma.attention_backward(q, k, v, out, lse, dout, mask, threads=threads, **dropout)
        weights = ma.attention_weights(q, k, mask, threads=threads, dropout_p=0.25,
                                       dropout_seed=77)
        results.append([out, lse, *grads, weights])
    for one, two in zip(*results):
        np.testing.assert_array_equal(one, two)


def test_torch_manual_seed_reproduces_sdpa_dropout():
    q, k, v = torch_inputs(1)

    def sdpa():
        return mt.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True,
                                               enable_gqa=True)

    torch.manual_seed(123)
    first, second = sdpa(), sdpa()
    assert not torch.equal(first, second)  # each call draws a new seed
    torch.manual_seed(123)
    assert torch.equal(sdpa(), first)
    assert torch.equal(sdpa(), second)


def test_no_dropout_draws_nothing_from_the_generator():
    q, k, v = torch_inputs(2)
    torch.manual_seed(5)
    mt.scaled_dot_product_attention(q, k, v, dropout_p=0.0, enable_gqa=True)
    mt.attention(q, k, v)
    after = torch.rand(())
    torch.manual_seed(5)
    assert torch.equal(torch.rand(()), after)


def test_sdpa_attention_and_the_numpy_call_draw_alike():
    """The three torch entry points draw their seed the same way: after the same
    torch.manual_seed they drop the same pairs, forward and backward."""
    q, k, v = torch_inputs(3, requires_grad=True)
    dout = torch.randn(B, HQ, 40, D, generator=torch.Generator().manual_seed(4))
    results = []
    for call in ("sdpa", "attention", "numpy"):
        torch.manual_seed(9)
        if call == "sdpa":
            out = mt.scaled_dot_product_attention(q, k, v, dropout_p=0.4, is_causal=True,
                                                  enable_gqa=True)
        elif call == "attention":
            out = mt.attention(q, k, v, ma.Mask().causal(), dropout_p=0.4)
        else:
            out = ma.attention(q.detach(), k.detach(), v.detach(), ma.Mask().causal(),
                               dropout_p=0.4)
            results.append([out])
            continue
        grads = torch.autograd.grad(out, (q, k, v), dout)
        results.append([out.detach(), *grads])
    for one in results[1:]:
        for got, want in zip(one, results[0]):
            assert torch.equal(got, want)


# --- statistics ----------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.1, 0.5])
def test_keep_rate_is_one_minus_p_within_three_sigma(p):
    """2·4·(256·257/2) = 263,168 allowed pairs: σ of the kept fraction, √(p(1−p)/n), ≤ 1e-3."""
    q, k, _ = torch_inputs(5, 256, 256)
    mask = ma.Mask().causal()
    weights = ma.attention_weights(q, k, mask, dropout_p=p, dropout_seed=31337)
    allowed = torch.from_numpy(ma.allowed_pairs(mask, B, HQ, 256, 256)).bool()
    n = int(allowed.sum())
    kept = int(((weights != 0) & allowed).sum())
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(kept / n - keep_fraction_expected(p)) <= 3 * sigma, (kept / n, sigma)


def test_mean_output_over_seeds_is_the_undropped_output(rng):
    """E[O] = O: the mean of N = 400 dropped outputs against the undropped one, each element within
    5 standard errors, where Var[O_id] = Σ_j P_ij² V_jd² · p'/(1 − p') exactly (the pairs are
    dropped independently). A missing 1/(1 − p') rescaling would be off by p·|O|, ~10 standard
    errors for the typical element (checked below too)."""
    p, draws = 0.3, 400
    q, k, v = random_inputs(rng, 1, 2, 2, 16, 16, 8)
    mask = ma.Mask().causal()
    plain = ma.attention(q, k, v, mask).astype(np.float64)
    total = np.zeros_like(plain)
    for seed in range(draws):
        total += ma.attention(q, k, v, mask, dropout_p=p, dropout_seed=seed)
    mean = total / draws
    weights = ma.attention_weights(q, k, mask).astype(np.float64)
    dropped = round(p * 65536) / 65536
    variance = (weights**2) @ (v.astype(np.float64) ** 2) * dropped / (1 - dropped)
    standard_error = np.sqrt(variance / draws)
    z = np.abs(mean - plain) / np.maximum(standard_error, 1e-12)
    assert z.max() <= 5, z.max()
    unscaled_z = np.abs(mean * (1 - dropped) - plain) / np.maximum(standard_error, 1e-12)
    assert np.median(unscaled_z) > 5  # the check would see a missing rescaling


# --- torch.compile -------------------------------------------------------------------------------

def test_compiled_sdpa_with_dropout_equals_eager_under_the_same_seed():
    """aot_eager runs the graph's torch.randint as eager does: the same seed, the same bits,
    forward and backward (the seed tensor is saved for the backward op)."""
    q, k, v = torch_inputs(6, requires_grad=True)

    def block(q, k, v):
        return mt.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True,
                                               enable_gqa=True)

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    results = []
    for function in (block, compiled):
        torch.manual_seed(17)
        out = function(q, k, v)
        results.append([out.detach(), *torch.autograd.grad(out.square().sum(), (q, k, v))])
    for got, want in zip(*results):
        assert torch.equal(got, want)


def test_inductor_backward_drops_the_pairs_its_forward_dropped():
    """Inductor draws with its own generator, so its pairs are not eager's; the backward must
    still use the forward's seed (saved, not drawn again). With V the identity, O is the dropped
    weight matrix W itself, and dV must be Wᵀ·dO."""
    generator = torch.Generator().manual_seed(10)
    q, k = (torch.randn(2, 4, 16, 16, generator=generator) for _ in range(2))
    v = torch.eye(16).expand(2, 4, 16, 16).clone().requires_grad_()
    compiled = torch.compile(
        lambda q, k, v: mt.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True),
        fullgraph=True)
    torch.manual_seed(3)
    weights = compiled(q, k, v)
    dout = torch.randn(weights.shape, generator=generator)
    (dv,) = torch.autograd.grad(weights, (v,), dout)
    allowed = torch.tril(torch.ones(16, 16, dtype=torch.bool))
    assert 0.3 < float((weights.detach()[..., allowed] == 0).float().mean()) < 0.7
    torch.testing.assert_close(dv, weights.detach().transpose(-1, -2) @ dout, rtol=0, atol=1e-5)
    torch.manual_seed(3)
    assert torch.equal(compiled(q, k, v), weights)


def test_custom_op_opcheck_with_dropout():
    q, k, v = torch_inputs(7, 6, 9)
    for x in (q, k, v):
        x.requires_grad_()
    keep = torch.rand(2, 1, 6, 9, generator=torch.Generator().manual_seed(8)) < 0.7
    torch.library.opcheck(torch.ops.maskattn.sdpa.default,
                          (q, k, v, keep, None, False, None, 0.5, torch.tensor(4242)))


# --- errors (docs/errors.md, Python table) -------------------------------------------------------

@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), True, "0.1", None])
def test_P80_dropout_p_must_be_a_probability(bad):
    q, k, v = torch_inputs(8, 4, 4)
    message = r"dropout_p must be a real number in \[0, 1\] \(the probability of dropping a pair\)"
    with pytest.raises(ma.Error, match=message):
        ma.attention(q.numpy(), k.numpy(), v.numpy(), dropout_p=bad, dropout_seed=1)
    with pytest.raises(ma.Error, match=message):
        mt.attention(q, k, v, dropout_p=bad)
    with pytest.raises(ma.Error, match=message):
        mt.scaled_dot_product_attention(q, k, v, dropout_p=bad, enable_gqa=True)


@pytest.mark.parametrize("seed, offset, message", [
    (-1, 0, r"dropout_seed must be None or an int in \[0, 2\*\*64\), got -1"),
    (2**64, 0, r"dropout_seed must be None or an int in \[0, 2\*\*64\), got 18446744073709551616"),
    (1.0, 0, r"dropout_seed must be None or an int in \[0, 2\*\*64\), got 1.0"),
    (1, 2**32, r"dropout_offset must be an int in \[0, 2\*\*32\) \(it separates calls sharing a "
               r"seed\), got 4294967296"),
    (1, None, r"dropout_offset must be an int in \[0, 2\*\*32\) .*got None"),
])
def test_P81_dropout_seed_and_offset_ranges(seed, offset, message):
    q, k, v = torch_inputs(9, 4, 4)
    with pytest.raises(ma.Error, match=message):
        mt.attention(q, k, v, dropout_p=0.1, dropout_seed=seed, dropout_offset=offset)
    with pytest.raises(ma.Error, match=message):
        ma.attention_weights(q, k, dropout_p=0.1, dropout_seed=seed, dropout_offset=offset)


def test_P82_a_seed_is_needed_where_none_can_be_drawn(rng):
    q, k, v = random_inputs(rng, 1, 1, 1, 4, 4, 8)
    with pytest.raises(ma.Error, match=r"attention: dropout_p=0.1 needs dropout_seed= \(an int\) "
                                       r"for NumPy arrays: maskattn draws a seed only from "
                                       r"PyTorch's generator"):
        ma.attention(q, k, v, dropout_p=0.1)
    with pytest.raises(ma.Error, match=r"attention_weights: dropout_p=0.1 needs dropout_seed="):
        ma.attention_weights(q, k, dropout_p=0.1)
    out, lse = ma.attention(q, k, v, dropout_p=0.1, dropout_seed=3, return_lse=True)
    tq, tk, tv, tout, tlse = (torch.from_numpy(x) for x in (q, k, v, out, lse))
    with pytest.raises(ma.Error, match=r"attention_backward: dropout_p=0.1 needs the forward's "
                                       r"dropout_seed \(and dropout_offset\): the backward "
                                       r"regenerates the forward's dropped pairs"):
        ma.attention_backward(tq, tk, tv, tout, tlse, tout, dropout_p=0.1)
