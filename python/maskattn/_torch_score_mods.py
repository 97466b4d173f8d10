"""FlexAttention's index functions on maskattn: calling a ``mask_mod``/``score_mod`` on broadcast
index tensors in row chunks (shared with _torch_flex), and what a ``score_mod`` does, found by
probing, as maskattn modifiers.

maskattn's kernels apply a fixed chain of modifiers (docs/semantics.md §5): softcap, then ALiBi
and biases, then the mask. A ``score_mod(score, b, h, q_idx, kv_idx)`` is an arbitrary function,
so it is evaluated — once per row chunk, vectorised on broadcast index tensors, with constant
float64 scores — and accepted only when the probes prove it is one of:

* **additive**: score_mod(s) − s = t(b, h, q, kv) for every probe s → a bias t (−inf entries
  hide their pair; a t that depends on tensors requiring grad gets their gradients through the
  bias's);
* **softcap**: score_mod(s) − t = cap·tanh(s / cap), one cap for every pair → softcap + bias t.

A bias that is exactly ALiBi, t = −m_h·|q − kv| (or m_h·(kv − q) when the block mask hides every
kv > q, the form of PyTorch's ALiBi example), becomes ALiBi slopes, so no L×KV tensor is kept.
Anything else (a multiplicative change, a branch on the score, a softcap applied after a bias)
raises maskattn.Error. Probing cannot prove a function identical everywhere; the probes
s ∈ {0, 1, −3, 37.5, ±1e6} catch scaling, offsets that depend on s, and branches at 0 and at any
threshold below 1e6 in magnitude.
"""

from __future__ import annotations

import math

import torch

from . import _core
from ._torch_autograd import ScoreMods

Error = _core.Error

__all__ = ["analyse_score_mod", "call_index_function", "index_grid", "row_chunks"]

_PROBES = (1.0, -3.0, 37.5, 1e6, -1e6)  # besides 0, which gives the term itself
_SMALL_PROBES = (1.0, -3.0, 37.5)
_ELEMENTS_PER_CHUNK = 1 << 20  # six float64 results per chunk: 48 MiB
_RELATIVE = 1e-9  # float64 probes: an additive mod reproduces s + t to ~1e-16


def call_index_function(function, name, args, target, want_bool):
    """function(*args) checked: a tensor of the right dtype that broadcasts to ``target``,
    returned as a 4-D view (its size-1 axes kept)."""
    try:
        result = function(*args)
    except Error:
        raise
    except Exception as error:
        raise Error(
            f"{name} failed on broadcast index tensors (b [B,1,1,1], h [1,H,1,1], q_idx "
            f"[1,1,rows,1], kv_idx [1,1,1,KV_LEN]): {type(error).__name__}: {error}. maskattn "
            f"calls {name} once on whole index tensors, so write it with torch operations "
            f"(&, |, torch.where) rather than Python if/and/or"
        ) from error
    kind = "bool" if want_bool else "floating"
    if not isinstance(result, torch.Tensor):
        raise Error(f"{name} returned {type(result).__name__}; it must return a {kind} tensor")
    ok_dtype = result.dtype == torch.bool if want_bool else result.dtype.is_floating_point
    if not ok_dtype:
        raise Error(f"{name} returned dtype {result.dtype} (shape {list(result.shape)}); "
                    f"it must return a {kind} tensor")
    try:
        fits = result.dim() <= 4 and tuple(torch.broadcast_shapes(result.shape, target)) == target
    except RuntimeError:
        fits = False
    if not fits:
        raise Error(f"{name} returned shape {list(result.shape)}, which does not broadcast to "
                    f"{list(target)} (B, H, rows, KV_LEN) for the index tensors it was given")
    return result.reshape((1,) * (4 - result.dim()) + tuple(result.shape))


def index_grid(batch, heads, kv_len, device="cpu"):
    return (torch.arange(batch, device=device).view(-1, 1, 1, 1),
            torch.arange(heads, device=device).view(1, -1, 1, 1),
            torch.arange(kv_len, device=device).view(1, 1, 1, -1))


def row_chunks(q_len, batch, heads, kv_len, budget):
    rows = max(1, budget // max(1, batch * heads * kv_len))
    for start in range(0, q_len, rows):
        yield torch.arange(start, min(q_len, start + rows)).view(1, 1, -1, 1)


def _tolerance(s, term):
    return _RELATIVE * (abs(s) + term.abs() + 1.0)


def _probe(score_mod, value, grid, target):
    score = torch.full((1, 1, 1, 1), value, dtype=torch.float64)
    result = call_index_function(score_mod, "score_mod", (score, *grid), target, False)
    return result.double() if result.dtype != torch.float64 else result


def _matches(values, expected, term, finite, s) -> bool:
    """values ≈ expected on the pairs the term leaves visible."""
    error = (values - expected).abs()
    return bool(((error <= _tolerance(s, term)) | ~finite).all())


def _softcap_of(term, probes, finite):
    """The cap when score_mod(s) = cap·tanh(s/cap) + t with one cap for every pair, else None."""
    caps = ((probes[1e6] - probes[-1e6]) / 2)[finite]
    cap = caps[0].item()
    if not (0 < cap < 5e4) or not bool(((caps - cap).abs() <= _RELATIVE * (cap + 1)).all()):
        return None  # below 5e4, tanh(1e6/cap) is exactly 1 in float64
    for s in _SMALL_PROBES:
        if not _matches(probes[s], term + cap * math.tanh(s / cap), term, finite, s):
            return None
    return cap


def _classify(term, probes, state):
    """Updates state {"mode", "cap"} with one chunk's evidence; raises when it contradicts."""
    shape = torch.broadcast_shapes(term.shape, *(value.shape for value in probes.values()))
    term = term.detach().expand(shape)
    probes = {s: value.expand(shape) for s, value in probes.items()}
    if torch.isnan(term).any() or torch.isposinf(term).any():
        raise Error("score_mod returned nan or +inf for score 0; it may return -inf (hides the "
                    "pair), nothing else non-finite")
    hidden = torch.isneginf(term)
    for s, value in probes.items():
        if not bool((torch.isneginf(value) | ~hidden).all()):
            raise Error(f"score_mod hides a pair at score 0 but not at score {s}: the hiding "
                        f"depends on the score, which maskattn cannot reproduce")
    finite = ~hidden
    if not bool(finite.any()):
        return  # every pair hidden: consistent with any mode
    if state["mode"] in (None, "additive") and all(
            _matches(value, term + s, term, finite, s) for s, value in probes.items()):
        state["mode"] = "additive"
        return
    cap = _softcap_of(term, probes, finite)
    if cap is not None and state["mode"] is None:
        state["mode"], state["cap"] = "softcap", cap
        return
    if cap is not None and state["mode"] == "softcap" and abs(cap - state["cap"]) <= (
            _RELATIVE * (cap + 1)):
        return
    raise Error(
        "score_mod is not a term added to the score (score_mod(s) - s differs between probe "
        "scores 0, 1, -3, 37.5, ±1e6), nor one softcap cap*tanh(s/cap) plus such a term; "
        "maskattn cannot reproduce it exactly. Give maskattn's modifiers instead: "
        "mods=maskattn.torch.ScoreMods(softcap=..., alibi_slopes=..., bias=..., sinks=...)"
    )


def _alibi_slopes(term, heads, hides_future):
    """Slopes [H] when the bias is ALiBi in either form, else None."""
    if term.requires_grad or term.shape[3] < 2 or not bool(torch.isfinite(term).all()):
        return None
    if not bool((term == term[:1]).all()):
        return None  # depends on the batch
    q_len, kv_len = term.shape[2], term.shape[3]
    offset = (torch.arange(kv_len).view(1, -1) - torch.arange(q_len).view(-1, 1)).double()
    forms = [("abs", -term[0, :, 0, 1], -offset.abs())]
    if hides_future:
        forms.append(("signed", term[0, :, 0, 1], offset))
    for _, slopes, distance in forms:
        candidate = slopes.view(-1, 1, 1) * distance
        if bool(((term[0] - candidate).abs() <= 1e-6 * (candidate.abs() + 1)).all()):
            slopes = slopes.expand(heads) if slopes.numel() == 1 else slopes
            return slopes.float().contiguous()
    return None


def analyse_score_mod(score_mod, batch, heads, q_len, kv_len, hides_future,
                      positions_are_indices=True):
    """A :class:`maskattn.torch.ScoreMods` doing what ``score_mod`` does (see the module).
    ALiBi slopes are used only when the mask's positions are the indices (a BlockMask's are; a
    caller's maskattn.Mask may align or shift them), else the bias stays a tensor."""
    if not callable(score_mod):
        raise Error(f"score_mod must be callable, got {type(score_mod).__name__}")
    b, h, kv = index_grid(batch, heads, kv_len)
    state = {"mode": None, "cap": None}
    terms = []
    for q in row_chunks(q_len, batch, heads, kv_len, _ELEMENTS_PER_CHUNK):
        grid, target = (b, h, q, kv), (batch, heads, q.shape[2], kv_len)
        term = _probe(score_mod, 0.0, grid, target)
        with torch.no_grad():
            probes = {s: _probe(score_mod, s, grid, target) for s in _PROBES}
        _classify(term, probes, state)
        terms.append(term.to(torch.float32).expand(-1, -1, q.shape[2], kv_len))
    term_batch = max(t.shape[0] for t in terms)
    term_heads = max(t.shape[1] for t in terms)
    bias = torch.cat([t.expand(term_batch, term_heads, -1, -1) for t in terms], dim=2)
    softcap = state["cap"] if state["mode"] == "softcap" else None
    if not bias.requires_grad and bool((bias == 0).all()):
        return ScoreMods(softcap=softcap) if softcap is not None else None
    slopes = None
    if positions_are_indices:
        slopes = _alibi_slopes(bias, heads, hides_future)
    if slopes is not None:
        return ScoreMods(softcap=softcap, alibi_slopes=slopes)
    return ScoreMods(softcap=softcap, bias=bias)
