"""Shared helpers for the maskattn.torch tests (imported by the other test_torch_* files), and the
tests of the helpers themselves.

The accuracy rule of the issue: for each compared tensor (output and every gradient),

    max |maskattn − reference| ≤ 2 · max |naive − reference| + 1e-6

where the reference is PyTorch's math SDPA on float64 copies of the (already dtype-rounded)
inputs and "naive" is the same PyTorch math SDPA computed in the test's dtype.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.functional import scaled_dot_product_attention as torch_sdpa  # noqa: E402


DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def randn(shape, seed, dtype=torch.float32):
    """Deterministic normal values (drawn in float64, so every dtype sees the same numbers)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)


def math_sdpa(*args, **kwargs):
    with sdpa_kernel(SDPBackend.MATH):
        return torch_sdpa(*args, **kwargs)


def run_with_grads(fn, leaves, dout):
    """fn(*leaf copies) → [output, grad of each leaf that is floating point]."""
    copies = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in leaves]
    out = fn(*copies)
    out.backward(dout.to(out.dtype))
    return [out.detach()] + [c.grad for c in copies if c.is_floating_point()]


def max_error(value, reference) -> float:
    difference = (value.double() - reference.double()).abs()
    both_inf = torch.isinf(value.double()) & torch.isinf(reference.double()) & (
        value.double() == reference.double())
    difference = torch.where(both_inf, torch.zeros_like(difference), difference)
    return difference.max().item() if difference.numel() else 0.0


def assert_close_to_math(ours, theirs, leaves, dtype, seed=99, names=None):
    """Compare ``ours(*leaves)`` with ``theirs(*leaves)`` (PyTorch, run under the math backend),
    output and gradients, by the issue's rule. Float leaves are rounded to ``dtype`` first;
    bool leaves stay bool."""
    rounded = [x.to(dtype) if x.is_floating_point() else x for x in leaves]
    as_f64 = [x.double() if x.is_floating_point() else x for x in rounded]
    with sdpa_kernel(SDPBackend.MATH):
        shape_probe = theirs(*as_f64)
        dout = randn(shape_probe.shape, seed, torch.float64).to(dtype)
        reference = run_with_grads(theirs, as_f64, dout)
        naive = run_with_grads(theirs, rounded, dout)
    result = run_with_grads(ours, rounded, dout)
    names = names or ["out"] + [f"grad{n}" for n in range(len(result) - 1)]
    report = []
    for name, got, base, ref in zip(names, result, naive, reference):
        assert got.shape == ref.shape, f"{name}: shape {list(got.shape)} vs {list(ref.shape)}"
        assert got.dtype == base.dtype, f"{name}: dtype {got.dtype} vs {base.dtype}"
        error, naive_error = max_error(got, ref), max_error(base, ref)
        report.append((name, error, naive_error))
        assert error <= 2 * naive_error + 1e-6, (
            f"{name}: maskattn error {error:.3g} > 2 × naive {naive_error:.3g} + 1e-6 ({dtype})"
        )
    return report


def test_rule_rejects_a_wrong_result():
    """The helper must fail when the output is off (a test that cannot fail checks nothing)."""
    q, k, v = (randn((1, 2, 5, 8), seed) for seed in (1, 2, 3))

    def shifted(*args):
        return torch_sdpa(*args) + 1e-3

    with pytest.raises(AssertionError, match="out: maskattn error"):
        assert_close_to_math(shifted, torch_sdpa, [q, k, v], torch.float32)


def test_rule_rejects_a_wrong_gradient():
    q, k, v = (randn((1, 2, 5, 8), seed) for seed in (1, 2, 3))

    def wrong_grad(q, k, v):
        return torch_sdpa(q, k, v) + 1e-3 * (q.sum() - q.sum().detach())

    with pytest.raises(AssertionError, match="grad0"):
        assert_close_to_math(wrong_grad, torch_sdpa, [q, k, v], torch.float32)


def test_rule_accepts_pytorch_itself():
    q, k, v = (randn((1, 2, 5, 8), seed) for seed in (1, 2, 3))
    report = assert_close_to_math(math_sdpa, torch_sdpa, [q, k, v], torch.float16)
    assert all(error == naive for _, error, naive in report)
