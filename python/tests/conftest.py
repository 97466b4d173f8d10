"""Shared helpers of the Python tests: independent references and the tolerance rule.

* ``reference_attention`` is the oracle: the formula of docs/semantics.md §1 in float64 NumPy,
  written from the document, not from the library (a boolean ``keep`` says which pairs are
  allowed; ``bias`` is added to the scores, where -inf hides; ``sinks`` join the denominator).
* ``torch_attention`` is the same formula in PyTorch, for two uses: in float64 with autograd
  (the gradients' reference) and in a 16/32-bit dtype (the "naive" computation of the rule).
* The rule: maskattn's error against the float64 reference may be at most twice the naive
  same-dtype error plus 1e-6 (``assert_within_rule``). Both see the inputs rounded to the dtype.

Test files import these with ``from conftest import ...`` (pytest puts this directory on
sys.path). Other fixtures live with the tests that use them.
"""

from __future__ import annotations

import numpy as np
import pytest

DTYPES = ("float32", "float16", "bfloat16")


def as_f64(x) -> np.ndarray:
    """A float64 NumPy copy of a NumPy array (ml_dtypes.bfloat16 included) or a torch tensor."""
    if hasattr(x, "detach"):
        return x.detach().to("cpu").double().numpy()
    return np.asarray(x).astype(np.float64)


def numpy_dtype(dtype: str):
    """The NumPy element type for "float32", "float16" or "bfloat16" (ml_dtypes)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def round_to(x, dtype: str) -> np.ndarray:
    """``x`` rounded (to nearest even) into ``dtype``, as a NumPy array of that dtype."""
    return np.asarray(x, dtype=np.float64).astype(numpy_dtype(dtype))


def random_inputs(rng, batch, q_heads, kv_heads, q_len, k_len, head_dim, value_dim=None,
                  dtype="float32"):
    """q [B,Hq,Lq,D], k [B,Hkv,Lk,D], v [B,Hkv,Lk,Dv] of standard normals, in ``dtype``."""
    value_dim = head_dim if value_dim is None else value_dim
    shapes = ((batch, q_heads, q_len, head_dim), (batch, kv_heads, k_len, head_dim),
              (batch, kv_heads, k_len, value_dim))
    return tuple(round_to(rng.standard_normal(shape), dtype) for shape in shapes)


def reference_attention(q, k, v, keep=None, bias=None, scale=None, sinks=None, softcap=None):
    """(out [B,Hq,Lq,Dv], lse [B,Hq,Lq]) in float64. ``keep``: bool, broadcast to the scores
    [B,Hq,Lq,Lk] (None allows every pair); ``softcap``: cap·tanh(s/cap) first; ``bias``: float
    added to the scores (-inf hides); ``sinks``: [Hq] logits in the denominator. A row with
    nothing allowed gives 0 and -inf."""
    q, k, v = as_f64(q), as_f64(k), as_f64(v)
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = scale * np.einsum("bhid,bhjd->bhij", q, k)
    if softcap is not None:
        scores = softcap * np.tanh(scores / softcap)
    if bias is not None:
        scores = scores + as_f64(bias)
    allowed = scores != -np.inf
    if keep is not None:
        allowed = allowed & np.broadcast_to(np.asarray(keep, dtype=bool), scores.shape)
    scores = np.where(allowed, scores, -np.inf)
    sink = None
    if sinks is not None:
        sink = np.broadcast_to(as_f64(sinks)[None, :, None, None], scores.shape[:3] + (1,))
    top = scores.max(axis=-1, keepdims=True)
    if sink is not None:
        top = np.maximum(top, sink)
    top = np.where(np.isfinite(top), top, 0.0)
    weights = np.where(allowed, np.exp(scores - top), 0.0)
    denominator = weights.sum(axis=-1, keepdims=True)
    if sink is not None:
        denominator = denominator + np.exp(sink - top)
    safe = np.where(denominator > 0, denominator, 1.0)
    out = np.einsum("bhij,bhjd->bhid", weights / safe, v)
    with np.errstate(divide="ignore"):
        lse = np.where(denominator > 0, np.log(safe) + top, -np.inf)[..., 0]
    return out, lse


def torch_attention(q, k, v, keep=None, bias=None, scale=None, sinks=None, softcap=None,
                    dropout=None):
    """The reference formula on torch tensors, in their dtype and differentiable (also in q, k,
    v, ``bias`` and ``sinks``); hidden pairs and fully hidden rows give no NaN in either
    direction. ``dropout``: attention dropout with given pairs, a tensor broadcasting to the
    scores that multiplies the normalised weights (0 for a dropped pair, 1/(1 - p) for a kept
    one); the LSE stays the undropped one. Returns (out, lse)."""
    import torch

    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    scores = scale * (q @ k.transpose(-1, -2))
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    allowed = scores != -torch.inf
    if keep is not None:
        keep = torch.from_numpy(np.array(keep, dtype=bool))  # a writable copy
        allowed = allowed & keep.expand(scores.shape)
    scores = torch.where(allowed, scores, torch.full_like(scores, -torch.inf))
    top = scores.amax(dim=-1, keepdim=True)
    sink = None
    if sinks is not None:
        sink = sinks.to(scores.dtype)[None, :, None, None].expand(top.shape)
        top = torch.maximum(top, sink)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top)).detach()
    weights = torch.where(allowed, torch.exp(scores - top), torch.zeros_like(scores))
    denominator = weights.sum(dim=-1, keepdim=True)
    if sink is not None:
        denominator = denominator + torch.exp(sink - top)
    safe = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    weights = weights / safe
    if dropout is not None:
        weights = weights * dropout.to(weights.dtype)
    out = weights @ v
    lse = torch.where(denominator > 0, torch.log(safe) + top, torch.full_like(top, -torch.inf))
    return out, lse[..., 0]


def naive_attention(q, k, v, dtype: str, **reference_args):
    """The reference computed in ``dtype`` by PyTorch (the rule's "naive" error), as float64."""
    import torch

    torch_dtype = getattr(torch, dtype)
    tensors = [torch.from_numpy(as_f64(x)).to(torch_dtype) for x in (q, k, v)]
    args = dict(reference_args)
    for name in ("bias", "sinks", "dropout"):
        if args.get(name) is not None:
            args[name] = torch.from_numpy(as_f64(args[name])).to(torch_dtype)
    out, _ = torch_attention(*tensors, **args)
    return out.double().numpy()


def max_error(actual, reference) -> float:
    difference = np.abs(as_f64(actual) - as_f64(reference))
    return float(difference.max()) if difference.size else 0.0


def assert_within_rule(actual, reference, naive, what: str = "output"):
    """max |actual - reference| ≤ 2 · max |naive - reference| + 1e-6."""
    error, naive_error = max_error(actual, reference), max_error(naive, reference)
    assert np.all(np.isfinite(as_f64(actual))), f"{what}: non-finite values"
    assert error <= 2 * naive_error + 1e-6, (
        f"{what}: error {error:.3g} exceeds 2 x naive {naive_error:.3g} + 1e-6"
    )


def check_attention(actual, q, k, v, dtype="float32", **reference_args):
    """maskattn's ``actual`` output against the reference under the rule, for inputs in dtype."""
    reference, _ = reference_attention(q, k, v, **reference_args)
    naive = naive_attention(q, k, v, dtype, **reference_args)
    assert_within_rule(actual, reference, naive)


@pytest.fixture
def rng():
    """A fixed-seed generator: every test sees the same numbers on every run."""
    return np.random.default_rng(20240613)
