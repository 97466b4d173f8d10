"""``torch.nn.functional.scaled_dot_product_attention`` with maskattn underneath.

Design: the PyTorch call is reduced, with torch operations only (so autograd and torch.compile
see them), to maskattn's problem [B, H, L, D], and its masks to maskattn masks:

* inputs (…, H, L, E): extra leading batch axes are broadcast like PyTorch's math backend and
  folded into B; 3-D inputs (N, L, E) take N as the head axis and 2-D inputs (L, E) get one
  head, exactly as PyTorch's matmul-based math path sees them; head counts broadcast (1 ↦ H) or,
  with ``enable_gqa``, group (Hq % Hkv == 0, query head h reads kv head h // (Hq/Hkv));
* ``attn_mask`` must broadcast to (…, Hq, L, S); it keeps its own size-1 axes (a [B,1,1,S]
  padding mask stays that small) and is folded like the inputs only when it has several batch
  axes. A bool mask becomes ``Mask.keep`` (True = attend); a float mask that needs no gradient
  becomes ``Mask.additive`` (−inf hides; the kernels skip its fully hidden tiles); a float mask
  that requires grad becomes a ``ScoreMods`` bias and receives ∂L/∂mask;
* ``is_causal`` is ``Mask().causal("top_left")`` (PyTorch's alignment when L ≠ S);
* ``mask=`` (a maskattn.Mask) and ``mods=`` are intersected/combined with the above.

Converting an L×S mask copies it into the C++ Mask, and the Mask then caches which tiles it
hides. Repeated calls with the same mask tensor (every layer of a model, every step of a loop)
reuse the converted Mask from a small LRU keyed by (data_ptr, shape, stride, dtype, _version) and
checked against a weak reference to the tensor itself, so a new tensor that happens to reuse a
freed one's memory is never mistaken for it, and an in-place change (which bumps _version) is
seen.

Difference from PyTorch, by design: a row with no allowed key gives 0 (and zero gradients) in
every case; ``dropout_p > 0`` is an error (maskattn has no dropout).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

import torch

from . import _core
from ._torch_autograd import (
    Call,
    ScoreMods,
    attention_and_lse,
    check_mask,
    check_tensors,
    core_mods_of,
)
from ._torch_compile import BREAK_REASON, compiled_attention

Error = _core.Error

__all__ = ["scaled_dot_product_attention"]


class _ConvertedMasks:
    """A small, thread-safe LRU: attn_mask tensor → the maskattn.Mask made from it."""

    def __init__(self, capacity: int = 8):
        self._capacity = capacity
        self._entries: OrderedDict = OrderedDict()  # key → (weakref to the tensor, Mask)
        self._lock = threading.RLock()  # re-entrant: a weakref callback may run inside a lookup
        self.conversions = 0  # how many masks were converted (tests read it)

    @staticmethod
    def _key(tensor: torch.Tensor, context):
        try:
            version = tensor._version  # inference-mode tensors have no version counter
        except RuntimeError:
            return None
        return (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype,
                version, context)

    def get(self, tensor: torch.Tensor, context, convert):
        """The Mask for ``tensor`` (in the folding ``context``), converting it on a miss."""
        key = self._key(tensor, context)
        if key is not None:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None and entry[0]() is tensor:
                    self._entries.move_to_end(key)
                    return entry[1]
        mask = convert()
        with self._lock:
            self.conversions += 1
            if key is None:
                return mask
            ref = weakref.ref(tensor, lambda dead, key=key: self._forget(key, dead))
            self._entries[key] = (ref, mask)
            self._entries.move_to_end(key)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
        return mask

    def _forget(self, key, dead_ref):
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] is dead_ref:
                del self._entries[key]

    def clear(self):
        with self._lock:
            self._entries.clear()

    def __len__(self):
        return len(self._entries)


converted_masks = _ConvertedMasks()

_top_left_causal = _core.Mask().causal("top_left")


def _shape(x) -> list:
    return list(x.shape)


def broadcast_shapes(*shapes):
    """NumPy/PyTorch broadcasting of shapes, or None when they do not broadcast. (Plain Python:
    torch.broadcast_shapes costs ~10 µs per call, a third of a decoding step's overhead.)"""
    rank = max((len(shape) for shape in shapes), default=0)
    result = [1] * rank
    for shape in shapes:
        for axis, size in enumerate(shape, start=rank - len(shape)):
            if size != 1:
                if result[axis] not in (1, size):
                    return None
                result[axis] = size
    return tuple(result)


def _broadcast(shapes, what: str, names):
    result = broadcast_shapes(*shapes)
    if result is None:
        listed = ", ".join(f"{n} {list(s)}" for n, s in zip(names, shapes))
        raise Error(f"{what} do not broadcast: {listed}")
    return result


def _fold(x, batch):
    """(*b, H, L, E) broadcast to ``batch`` and folded to [prod(batch), H, L, E]."""
    if tuple(x.shape[:-3]) != batch:
        x = x.expand(*batch, *x.shape[-3:])
    if len(batch) == 1:
        return x
    return x.reshape(-1, *x.shape[-3:])


def fold_inputs(query, key, value, enable_gqa: bool):
    """query, key, value as [B, H, L, E] tensors, the batch axes, and the output's shape (None
    when it is already the folded one)."""
    if query.dim() == 4 and key.dim() == 4 and value.dim() == 4:  # the common case, quickly
        batch, heads_q, heads_k = query.shape[0], query.shape[1], key.shape[1]
        if (key.shape[0] == batch and value.shape[0] == batch and value.shape[1] == heads_k
                and (heads_q == heads_k or heads_k == 1 or enable_gqa)):
            return query, key, value, (batch,), None
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.dim() < 2:
            raise Error(f"{name} has shape {_shape(x)}; expected (..., L, E) with at least 2 axes")
    rank = max(query.dim(), key.dim(), value.dim())
    q, k, v = (x.unsqueeze(0) if x.dim() == 2 else x for x in (query, key, value))
    batch = _broadcast([q.shape[:-3], k.shape[:-3], v.shape[:-3]], "batch axes (before H, L, E)",
                       ("query", "key", "value"))
    heads_q, heads_k, heads_v = q.shape[-3], k.shape[-3], v.shape[-3]
    kv_heads = heads_k
    if heads_k != heads_v:  # PyTorch broadcasts key against value heads (1 ↦ H)
        kv_heads = _broadcast([(heads_k,), (heads_v,)], "key and value head counts",
                              ("key", "value"))[0]
        k = k.expand(*k.shape[:-3], kv_heads, *k.shape[-2:])
        v = v.expand(*v.shape[:-3], kv_heads, *v.shape[-2:])
    if not enable_gqa and heads_q != kv_heads and kv_heads != 1:
        if heads_q != 1:
            raise Error(
                f"query has {heads_q} heads but key/value have {kv_heads} (query {_shape(query)}, "
                f"key {_shape(key)}); set enable_gqa=True for grouped-query attention"
            )
        q = q.expand(*q.shape[:-3], kv_heads, *q.shape[-2:])
    q4, k4, v4 = (_fold(x, batch) for x in (q, k, v))
    heads, q_len = q4.shape[1], q4.shape[2]
    out_shape = (*batch, heads, q_len, v4.shape[3]) if rank >= 3 else (q_len, v4.shape[3])
    return q4, k4, v4, batch, out_shape


def fold_attn_mask(attn_mask, batch, heads: int, q_len: int, k_len: int):
    """attn_mask checked against (*batch, heads, L, S) and reshaped to rank ≤ 4 for [B, H, L, S]
    (the core broadcasts from the trailing axis, as PyTorch does)."""
    target = (*batch, heads, q_len, k_len)
    if broadcast_shapes(tuple(attn_mask.shape), target) != target:
        raise Error(
            f"attn_mask shape {_shape(attn_mask)} does not broadcast to {list(target)} "
            f"(batch..., heads, L, S)"
        )
    extra = attn_mask.dim() - 3  # how many batch axes the mask has
    if extra <= 0 or (len(batch) == 1 and extra == 1):
        return attn_mask
    leading = attn_mask.shape[:extra]
    if all(n == 1 for n in leading):
        return attn_mask.reshape(attn_mask.shape[extra:])
    padded = attn_mask.reshape((1,) * (len(batch) - extra) + tuple(attn_mask.shape))
    return padded.expand(*batch, *padded.shape[-3:]).reshape(-1, *padded.shape[-3:])


def _keep_mask(folded):
    return _core.Mask().keep(folded.detach().cpu().numpy())


def _additive_mask(folded):
    return _core.Mask().additive(folded.detach().to("cpu", torch.float32).numpy())


def _bias_mods(mods, folded):
    """``mods`` with the float mask that requires grad added to its bias (as torch tensors, so
    both receive their gradients)."""
    if mods is None:
        return ScoreMods(bias=folded)
    if isinstance(mods, ScoreMods):
        bias = folded if mods.bias is None else torch.as_tensor(mods.bias) + folded
        return ScoreMods(softcap=mods.softcap, alibi_slopes=mods.alibi_slopes, bias=bias,
                         score_fn=mods.score_fn, threshold=mods.threshold, sinks=mods.sinks)
    if isinstance(mods, _core.ScoreMods):
        if mods.has_score_fn:
            raise Error(
                "a float attn_mask that requires grad becomes a bias, which cannot be added to a "
                "maskattn.ScoreMods with a score_fn; give mods as maskattn.torch.ScoreMods"
            )
        core_bias = mods.bias  # a read-only view: torch.tensor copies it without a warning
        bias = folded if core_bias is None else torch.tensor(core_bias) + folded
        return ScoreMods(softcap=mods.softcap, alibi_slopes=list(mods.alibi_slopes) or None,
                         bias=bias, threshold=mods.threshold, sinks=list(mods.sinks) or None)
    return mods  # core_mods_of names the bad type


def intersect(masks):
    """The intersection of maskattn Masks (None for none)."""
    masks = [m for m in masks if m is not None]
    if not masks:
        return None
    combined = masks[0]
    for other in masks[1:]:
        combined = combined & other
    return combined


def _check_causal_alignment(mask, q_len: int, k_len: int):
    if mask is not None and q_len != k_len and mask.alignment != "top_left":
        raise Error(
            f"is_causal=True is top-left aligned, and with L={q_len} != S={k_len} it would "
            f"re-align mask={mask.describe()} (bottom-right by default); call "
            f"mask.set_alignment('top_left'), or add mask.causal() (bottom-right) instead of "
            f"is_causal"
        )


def check_sdpa_arguments(attn_mask, dropout_p, is_causal):
    if dropout_p != 0.0:
        raise Error(
            f"dropout_p={dropout_p}: maskattn has no attention dropout; pass dropout_p=0.0 "
            f"(as models do in eval mode)"
        )
    if attn_mask is None:
        return
    if is_causal:
        raise Error(
            "attn_mask and is_causal=True cannot be given together (as in PyTorch); put the "
            "causal part into attn_mask, or give a structured mask as mask=maskattn.Mask()"
        )
    if not isinstance(attn_mask, torch.Tensor):
        raise Error(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and not attn_mask.dtype.is_floating_point:
        raise Error(
            f"attn_mask has dtype {attn_mask.dtype} (shape {_shape(attn_mask)}); expected "
            f"torch.bool (True = attend) or a floating dtype (added to the scores)"
        )


def _eager_attention(q4, k4, v4, folded, is_causal, scale, mask, mods, attn_mask=None,
                     batch=None):
    """The maskattn call for folded tensors, with the attn_mask converted (and cached under the
    caller's tensor ``attn_mask`` folded for ``batch``, or under ``folded`` itself)."""
    masks = [mask, _top_left_causal if is_causal else None]
    source = folded if attn_mask is None else attn_mask
    context = (batch, tuple(q4.shape), k4.shape[2])
    if folded is not None and folded.dtype == torch.bool:
        masks.append(converted_masks.get(source, context, lambda: _keep_mask(folded)))
    elif folded is not None and folded.requires_grad and torch.is_grad_enabled():
        mods = _bias_mods(mods, folded)
    elif folded is not None:
        masks.append(converted_masks.get(source, context, lambda: _additive_mask(folded)))
    core_mods, bias, sinks = core_mods_of(mods)
    call = Call(intersect(masks), core_mods, scale, "bhld", None)
    out, _ = attention_and_lse(q4, k4, v4, call, bias, sinks, want_lse=False)
    return out


_eager_attention_outside_graph = torch.compiler.disable(_eager_attention, reason=BREAK_REASON)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *, mask=None,
                                 mods=None):
    """``torch.nn.functional.scaled_dot_product_attention`` computed by maskattn.

    The same arguments and results — bool ``attn_mask`` True = attend, float ``attn_mask``
    added (and differentiable), ``is_causal`` top-left, broadcasting, extra batch axes, 3-D
    inputs, ``enable_gqa`` — except that a row with no allowed key gives 0 (and zero gradients),
    and ``dropout_p`` must be 0. Also takes ``mask=`` (a :class:`maskattn.Mask`, intersected with
    the other masks: structured masks with no L×S tensor) and ``mods=`` (score modifiers).
    """
    check_tensors((("query", query), ("key", key), ("value", value)))
    check_mask(mask)
    check_sdpa_arguments(attn_mask, dropout_p, is_causal)
    q4, k4, v4, batch, out_shape = fold_inputs(query, key, value, enable_gqa)
    heads, q_len, k_len = q4.shape[1], q4.shape[2], k4.shape[2]
    if is_causal:
        _check_causal_alignment(mask, q_len, k_len)
    folded = None
    if attn_mask is not None:
        folded = fold_attn_mask(attn_mask, batch, heads, q_len, k_len)
    if torch.compiler.is_compiling():
        out = compiled_attention(q4, k4, v4, folded, is_causal, scale, mask, mods,
                                 _eager_attention_outside_graph)
    else:
        out = _eager_attention(q4, k4, v4, folded, is_causal, scale, mask, mods, attn_mask, batch)
    return out if out_shape is None else out.reshape(out_shape)
