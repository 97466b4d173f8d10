"""Varlen (packed) attention for NumPy arrays and tensors: FlashAttention's ``cu_seqlens`` call.

B sequences packed along the token axis with no padding: q [total_q, Hq, D], k [total_k, Hkv, D],
v [total_k, Hkv, Dv] → out [total_q, Hq, Dv], lse [Hq, total_q] (FlashAttention's varlen
layout). Sequence i owns rows cu_seqlens_q[i] … cu_seqlens_q[i+1] of q and cu_seqlens_k[i] …
cu_seqlens_k[i+1] of k and v. The mask is that of the padded batch [B, Hq, max_seqlen_q,
max_seqlen_k]: sequence i is its batch entry i (docs/semantics.md §19). The C++ library does the
work (maskattn/varlen.h); this layer converts the offsets and allocates.
"""

from __future__ import annotations

import numbers

import numpy as np

from . import _core
from ._api import table_grads_for, check_mask_mods_scale, input_views
from ._arrays import Error, core_view, empty_like_framework, is_torch, threads_arg
from ._dropout import backward_seed, checked_dropout, seed_for

__all__ = ["attention_varlen", "attention_varlen_backward", "offsets"]


def offsets(values, name):
    """``cu_seqlens`` as a list of ints: a 1-D integer array (int32 as FlashAttention makes them,
    or int64), tensor or sequence. Anything else is maskattn.Error (P83); the C++ call checks
    the values (E136–E138)."""
    if is_torch(values):
        if values.dtype.is_floating_point or values.dtype.is_complex or values.dim() != 1 or \
                str(values.dtype) == "torch.bool":
            raise Error(f"{name} must be a 1-D integer tensor (int32 or int64) of B + 1 offsets, "
                        f"got {values.dtype} of shape {list(values.shape)}")
        return [int(x) for x in values.detach().cpu().tolist()]
    array = np.asarray(values)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise Error(f"{name} must be a 1-D integer array (int32 or int64) of B + 1 offsets, "
                    f"got {array.dtype} of shape {list(array.shape)}")
    return [int(x) for x in array.tolist()]


def max_length(value, cu, name):
    """``max_seqlen``: None (the longest sequence of ``cu``) or an int >= 0 (P84)."""
    if value is None:
        return max((b - a for a, b in zip(cu, cu[1:])), default=0)
    if is_torch(value) and value.dim() == 0 and not value.dtype.is_floating_point:
        value = int(value.item())
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise Error(f"{name} must be None (the longest sequence) or an int >= 0, got {value!r}")
    return int(value)


def varlen_arguments(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """The four varlen arguments as the core takes them."""
    cu_q = offsets(cu_seqlens_q, "cu_seqlens_q")
    cu_k = offsets(cu_seqlens_k, "cu_seqlens_k")
    return (cu_q, cu_k, max_length(max_seqlen_q, cu_q, "max_seqlen_q"),
            max_length(max_seqlen_k, cu_k, "max_seqlen_k"))


def _packed(views, names):
    for view, name in zip(views, names):
        if len(view.shape) != 3:
            raise Error(f"{name} has shape {list(view.shape)}; a varlen call expects "
                        f"[total, heads, dim] (sequences packed along the first axis)")


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                     mask=None, mods=None, *, scale=None, dtype=None, threads=None,
                     return_lse=False, kernel="auto", products="auto", check_finite=False,
                     dropout_p=0.0, dropout_seed=None, dropout_offset=0):
    """Attention of packed sequences, each over its own keys.

    q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv]; ``cu_seqlens_q`` and
    ``cu_seqlens_k``: B + 1 cumulative offsets starting at 0 (int32 or int64 arrays or tensors,
    or lists); ``max_seqlen_q``/``max_seqlen_k``: bounds of the lengths (None: the longest). The
    ``mask`` and ``mods`` are those of the padded batch [B, Hq, max_seqlen_q, max_seqlen_k]:
    sequence i is batch entry i, its first Lq_i queries and Lk_i keys (causal aligns each
    sequence's last query with its last key). Returns out [total_q, Hq, Dv] in q's dtype, and with
    ``return_lse=True`` also lse [Hq, total_q] (float32). Bit for bit, sequence i's rows are
    :func:`attention` on sequence i alone with the mask restricted to entry i. Dropout draws with
    b = i (the padded batch's pairs).
    """
    scale = check_mask_mods_scale(mask, mods, scale)
    dropout = seed_for(checked_dropout(dropout_p, dropout_seed, dropout_offset), is_torch(q),
                       "attention_varlen")
    cu_q, cu_k, max_q, max_k = varlen_arguments(cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                max_seqlen_k)
    (qv, kv, vv), element = input_views((q, k, v), ("q", "k", "v"), dtype, "bhld")
    _packed((qv, kv, vv), ("q", "k", "v"))
    out = empty_like_framework(q, (q.shape[0], q.shape[1], v.shape[2]))
    out_view = core_view(out, "out", element)[0]
    lse = lse_view = None
    if return_lse:
        lse = empty_like_framework(q, (q.shape[1], q.shape[0]), "float32")
        lse_view = core_view(lse, "lse", "")[0]
    _core.attention_varlen(qv, kv, vv, out_view, cu_q, cu_k, max_q, max_k, mask, mods, lse_view,
                           scale, threads_arg(threads), kernel, products, check_finite, element,
                           **dropout.core_args())
    return (out, lse) if return_lse else out


def attention_varlen_backward(q, k, v, out, lse, dout, cu_seqlens_q, cu_seqlens_k,
                              max_seqlen_q=None, max_seqlen_k=None, mask=None, mods=None, *,
                              scale=None, dtype=None, threads=None, kernel="auto",
                              products="auto", return_mod_grads=False, return_table_grads=False,
                              dropout_p=0.0, dropout_seed=None, dropout_offset=0):
    """Gradients (dq, dk, dv) of :func:`attention_varlen` given dout, from its out and lse, in the
    packed shapes of q, k, v. ``return_mod_grads`` and ``return_table_grads`` as in
    :func:`attention_backward`: dbias, dsinks and the program tables' gradients are summed over
    the sequences. With dropout, give the forward's seed and offset."""
    scale = check_mask_mods_scale(mask, mods, scale)
    dropout = backward_seed(checked_dropout(dropout_p, dropout_seed, dropout_offset),
                            "attention_varlen_backward")
    cu_q, cu_k, max_q, max_k = varlen_arguments(cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                max_seqlen_k)
    views, element = input_views((q, k, v, out, dout), ("q", "k", "v", "out", "dout"), dtype,
                                 "bhld")
    _packed(views, ("q", "k", "v", "out", "dout"))
    grads = [empty_like_framework(x, tuple(x.shape)) for x in (q, k, v)]
    dbias = dsinks = None
    if mods is not None:
        if mods.bias is not None:
            dbias = empty_like_framework(q, tuple(mods.bias.shape), "float32")
        if len(mods.sinks) > 0:
            dsinks = empty_like_framework(q, (len(mods.sinks),), "float32")
    table_grads = table_grads_for(q, mods) if return_table_grads else {}
    _core.attention_varlen_backward(
        *views[:3], views[3], core_view(lse, "lse", "")[0], views[4], cu_q, cu_k, max_q, max_k,
        *(core_view(g, name, element)[0] for g, name in zip(grads, ("dq", "dk", "dv"))), dbias,
        dsinks,
        [core_view(g, "dtables", "")[0] if g is not None else None for g in table_grads.values()],
        mask, mods, scale, threads_arg(threads), kernel, products, element,
        **dropout.core_args(),
    )
    result = (*grads, dbias, dsinks) if return_mod_grads else tuple(grads)
    if return_table_grads:
        return (*result, {name: g for name, g in table_grads.items() if g is not None})
    return result
