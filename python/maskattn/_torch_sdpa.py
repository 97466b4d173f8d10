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
* ``mask=`` (a maskattn.Mask) and ``mods=`` are intersected/combined with the above;
* ``dropout_p`` is maskattn's attention dropout with a seed drawn from PyTorch's default
  generator for each call (offset 0), so ``torch.manual_seed`` reproduces it as it reproduces
  PyTorch's SDPA dropout — the same rate and scaling, not the same dropped pairs (maskattn's
  pairs come from its own counter-based generator, PyTorch's from ``bernoulli_``).

This module folds the shapes; _torch_masks converts the masks (and caches the conversions), for
this eager call and for the custom ops of _torch_compile alike.

Difference from PyTorch, by design: a row with no allowed key gives 0 (and zero gradients) in
every case.
"""

from __future__ import annotations

import torch

from . import _core
from ._torch_autograd import (Call, attention_and_lse, check_mask, check_tensors, core_mods_of,
                              program_tables_of)
from ._dropout import NO_DROPOUT, Dropout, checked_dropout, torch_seed
from ._torch_compile import BREAK_REASON, compiled_attention
from ._torch_masks import (check_causal_alignment, converted_masks, core_mask, mods_with_bias,
                           split_attn_mask)

Error = _core.Error

__all__ = ["scaled_dot_product_attention"]


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
    """query, key, value as [B, H, L, E] tensors, the batch axes, the output's shape (None when
    it is already the folded one) and (H, L, S) of the folded problem."""
    q_shape, k_shape, v_shape = query.shape, key.shape, value.shape  # each read makes a Size
    if len(q_shape) == 4 and len(k_shape) == 4 and len(v_shape) == 4:  # the common case, quickly
        batch, heads_q, heads_k = q_shape[0], q_shape[1], k_shape[1]
        if (k_shape[0] == batch and v_shape[0] == batch and v_shape[1] == heads_k
                and (heads_q == heads_k or heads_k == 1 or enable_gqa)):
            return query, key, value, (batch,), None, (heads_q, q_shape[2], k_shape[2])
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
    return q4, k4, v4, batch, out_shape, (heads, q_len, k4.shape[2])


def fold_attn_mask(attn_mask, batch, heads: int, q_len: int, k_len: int):
    """attn_mask checked against (*batch, heads, L, S) and reshaped to rank ≤ 4 for [B, H, L, S]
    (the core broadcasts from the trailing axis, as PyTorch does)."""
    shape = attn_mask.shape
    if len(shape) == 4 and len(batch) == 1:  # the common case: it broadcasts, nothing to fold
        size_b, size_h, size_q, size_k = shape
        if ((size_b == 1 or size_b == batch[0]) and (size_h == 1 or size_h == heads)
                and (size_q == 1 or size_q == q_len) and (size_k == 1 or size_k == k_len)):
            return attn_mask
    target = (*batch, heads, q_len, k_len)
    if broadcast_shapes(tuple(shape), target) != target:
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


def check_sdpa_arguments(attn_mask, dropout_p, is_causal):
    if type(dropout_p) is not float or dropout_p != 0.0:  # (the default needs no check)
        checked_dropout(dropout_p, None, 0)
    if attn_mask is None:
        return
    if is_causal:
        raise Error(
            "attn_mask and is_causal=True cannot be given together (as in PyTorch); put the "
            "causal part into attn_mask, or give a structured mask as mask=maskattn.Mask()"
        )
    if not isinstance(attn_mask, torch.Tensor):
        raise Error(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    dtype = attn_mask.dtype
    if dtype is not torch.bool and not dtype.is_floating_point:
        raise Error(
            f"attn_mask has dtype {attn_mask.dtype} (shape {_shape(attn_mask)}); expected "
            f"torch.bool (True = attend) or a floating dtype (added to the scores)"
        )
    if attn_mask.layout is not torch.strided:
        raise Error(f"attn_mask (shape {_shape(attn_mask)}) has layout {attn_mask.layout}; "
                    "maskattn reads strided tensors: convert it with .to_dense()")


def _seen_keep_mask_attention(folded_inputs, attn_mask, scale):
    """A bool attn_mask alone (no mask=, mods=, is_causal or dropout), already converted for this
    folding (the mask of every layer of a model, of every step of a loop): straight to the call,
    or None when it was not seen. Its own checks passed when it was converted (its tensor state and
    the fold are the cache's key: a sparse tensor, never converted, is never found), and the
    argument checks skipped pass for such a call. The Call at the default scale (a fortieth of
    the call at Lk = 1 to build) is kept in the cache's entry, and goes with it."""
    q4, k4, v4, batch, out_shape, dims = folded_inputs
    entry = converted_masks.peek(attn_mask, (batch, *dims))
    if entry is None:
        return None
    call = entry[3] if scale is None else None
    if call is None:
        call = Call(entry[2], None, scale, "bhld", None, (), NO_DROPOUT)
        if scale is None:
            entry[3] = call
    out, _ = attention_and_lse(q4, k4, v4, call, None, None, want_lse=False, tables=())
    return out if out_shape is None else out.reshape(out_shape)


def _eager_attention(q4, k4, v4, folded, is_causal, scale, mask, mods, attn_mask=None,
                     context=None, dropout_p=0.0):
    """The maskattn call for folded tensors, with the attn_mask converted (and cached under the
    caller's tensor ``attn_mask`` folded as ``context`` says — (batch axes, H, L, S) —, or under
    ``folded`` itself) and, with dropout, a seed drawn from PyTorch's generator."""
    mask_tensor, bias = (None, None) if folded is None else split_attn_mask(folded)
    if mask_tensor is None:
        call_mask = core_mask(mask, is_causal, None, None, None)
    else:
        cached_as = folded if attn_mask is None else attn_mask
        if context is None:
            context = (None, q4.shape[1], q4.shape[2], k4.shape[2])
        call_mask = core_mask(mask, is_causal, mask_tensor, cached_as, context)
    if bias is not None:
        mods = mods_with_bias(mods, bias)
    core_mods = sinks = None
    names, tables = (), ()
    if mods is not None:
        core_mods, bias, sinks = core_mods_of(mods)
        names, tables = program_tables_of(mods)
    dropout = NO_DROPOUT if dropout_p == 0 else Dropout(float(dropout_p), torch_seed(), 0)
    call = Call(call_mask, core_mods, scale, "bhld", None, names, dropout)
    out, _ = attention_and_lse(q4, k4, v4, call, bias, sinks, want_lse=False, tables=tables)
    return out


_eager_attention_outside_graph = torch.compiler.disable(_eager_attention, reason=BREAK_REASON)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *, mask=None,
                                 mods=None):
    """``torch.nn.functional.scaled_dot_product_attention`` computed by maskattn.

    The same arguments and results — bool ``attn_mask`` True = attend, float ``attn_mask``
    added (and differentiable), ``is_causal`` top-left, broadcasting, extra batch axes, 3-D
    inputs, ``enable_gqa``, ``dropout_p`` (applied whenever > 0, as in PyTorch: pass
    ``dropout_p if self.training else 0.0``; its seed is drawn from PyTorch's default generator)
    — except that a row with no allowed key gives 0 (and zero gradients). Also takes ``mask=`` (a
    :class:`maskattn.Mask`, intersected with the other masks: structured masks with no L×S
    tensor) and ``mods=`` (score modifiers).
    """
    check_tensors(query, key, value)
    folded_inputs = None
    if mask is not None:
        check_mask(mask)
    elif (type(attn_mask) is torch.Tensor and not is_causal and mods is None
          and type(dropout_p) is float and dropout_p == 0.0 and attn_mask.dtype is torch.bool
          and not torch.compiler.is_compiling()):
        # The argument checks below pass for such a call, so folding first raises the same
        # errors in the same order; a mask not seen before keeps the fold for the full path.
        folded_inputs = fold_inputs(query, key, value, enable_gqa)
        out = _seen_keep_mask_attention(folded_inputs, attn_mask, scale)
        if out is not None:
            return out
    if attn_mask is not None or type(dropout_p) is not float or dropout_p != 0.0:
        check_sdpa_arguments(attn_mask, dropout_p, is_causal)  # (the defaults need no check)
    if folded_inputs is None:
        folded_inputs = fold_inputs(query, key, value, enable_gqa)
    q4, k4, v4, batch, out_shape, (heads, q_len, k_len) = folded_inputs
    if is_causal:
        check_causal_alignment(mask, q_len, k_len)
    folded = None
    if attn_mask is not None:
        folded = fold_attn_mask(attn_mask, batch, heads, q_len, k_len)
    if torch.compiler.is_compiling():
        out = compiled_attention(q4, k4, v4, folded, is_causal, scale, mask, mods, dropout_p,
                                 _eager_attention_outside_graph)
    else:
        out = _eager_attention(q4, k4, v4, folded, is_causal, scale, mask, mods, attn_mask,
                               (batch, heads, q_len, k_len), dropout_p)
    return out if out_shape is None else out.reshape(out_shape)
