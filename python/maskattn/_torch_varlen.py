"""Varlen attention for PyTorch with autograd: ``maskattn.torch.attention_varlen`` and the
flash-attn drop-in ``flash_attn_varlen_func``.

The autograd design is ``_torch_autograd``'s: the forward saves q, k, v, out and lse (O(total)
memory), the backward is maskattn's varlen backward, a ``maskattn.torch.ScoreMods`` bias, sinks
and float32 program tables that require grad are inputs of the Function and get their gradients
(summed over the sequences), and a call with dropout keeps its seed for the backward.

``flash_attn_varlen_func`` keeps flash-attn 2's signature and meanings, translated into a
maskattn mask: ``causal=True`` is bottom-right aligned per sequence (FlashAttention ≥ 2.1, and
maskattn's default alignment), ``window_size=(left, right)`` is ``Mask.window(left, right)`` with
-1 unbounded (with causal, right = 0), ``softcap`` and ``alibi_slopes`` [Hq] are the modifiers of
the same names (ALiBi at bottom-right positions, flash-attn's ``-slope·|i + Lk − Lq − j|``).
"""

from __future__ import annotations

import numbers
from typing import NamedTuple, Optional

import torch

from . import _core, _varlen
from ._dropout import NO_DROPOUT, Dropout, checked_dropout, seed_for
from ._torch_autograd import (
    input_grads,
    refuse_double_backward,
    save_call,
    check_mask,
    check_tensors,
    core_mods_of,
    program_tables_of,
)

Error = _core.Error

__all__ = ["attention_varlen", "flash_attn_varlen_func"]


class VarlenCall(NamedTuple):
    """Everything about one varlen call that is not a differentiable tensor."""

    offsets: tuple  # (cu_q, cu_k, max_q, max_k) as the core takes them
    mask: Optional[_core.Mask]
    mods: Optional[_core.ScoreMods]
    scale: Optional[float]
    threads: Optional[int]
    table_names: tuple = ()
    dropout: Dropout = NO_DROPOUT


def _forward(query, key, value, call: VarlenCall):
    return _varlen.attention_varlen(
        query, key, value, *call.offsets, call.mask, call.mods, scale=call.scale,
        threads=call.threads, return_lse=True, **call.dropout.core_args(),
    )


class _VarlenFunction(torch.autograd.Function):
    """(q, k, v, bias, sinks, *program tables) → (out, lse); lse is not differentiable."""

    @staticmethod
    def forward(ctx, query, key, value, bias, sinks, call: VarlenCall, *tables):
        out, lse = _forward(query, key, value, call)
        save_call(ctx, (query, key, value, out, lse), call, bias, sinks, tables)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        refuse_double_backward("attention_varlen")
        query, key, value, out, lse = ctx.saved_tensors[:5]
        call = ctx.saved_call.call
        wants_tables = any(ctx.needs_input_grad[6:])
        grads = _varlen.attention_varlen_backward(
            query, key, value, out, lse, dout.contiguous(), *call.offsets, call.mask, call.mods,
            scale=call.scale, threads=call.threads, return_mod_grads=True,
            return_table_grads=wants_tables, **call.dropout.core_args(),
        )
        return input_grads(ctx, call, grads, wants_tables)


def _varlen_and_lse(query, key, value, call, bias, sinks, tables):
    if torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (query, key, value, bias, sinks, *tables)
    ):
        return _VarlenFunction.apply(query, key, value, bias, sinks, call, *tables)
    return _forward(query, key, value, call)


@torch.compiler.disable(reason="maskattn.torch.attention_varlen takes maskattn.Mask objects")
def attention_varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                     max_seqlen_k=None, mask=None, mods=None, *, scale=None, threads=None,
                     return_lse=False, dropout_p=0.0, dropout_seed=None, dropout_offset=0):
    """maskattn.attention_varlen for torch tensors, with autograd.

    query [total_q, Hq, D], key [total_k, Hkv, D], value [total_k, Hkv, Dv]; ``cu_seqlens_q``,
    ``cu_seqlens_k`` B + 1 offsets (int32 or int64 tensors); the mask and ``mods`` (a
    maskattn.ScoreMods, or a maskattn.torch.ScoreMods whose bias, sinks and program tables get
    gradients) describe the padded batch [B, Hq, max_seqlen_q, max_seqlen_k]. Returns out
    [total_q, Hq, Dv] (and lse [Hq, total_q] with ``return_lse``). Dropout as in
    :func:`maskattn.torch.attention`.
    """
    check_tensors(query, key, value)
    check_mask(mask)
    core_mods, bias, sinks = core_mods_of(mods)
    names, tables = program_tables_of(mods)
    dropout = seed_for(checked_dropout(dropout_p, dropout_seed, dropout_offset), True,
                       "attention_varlen")
    call = VarlenCall(_varlen.varlen_arguments(cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                               max_seqlen_k),
                      mask, core_mods, scale, threads, names, dropout)
    out, lse = _varlen_and_lse(query, key, value, call, bias, sinks, tables)
    return (out, lse) if return_lse else out


def _window_mask(causal, window_size):
    """flash-attn's causal and window_size as a maskattn.Mask (P85 for a malformed window)."""
    values = list(window_size) if isinstance(window_size, (tuple, list)) else []
    if len(values) != 2 or not all(
        isinstance(x, numbers.Integral) and not isinstance(x, bool) and x >= -1 for x in values
    ):
        raise Error(f"flash_attn_varlen_func: window_size must be (left, right), two ints >= -1 "
                    f"(-1: unbounded), got {window_size!r}")
    left, right = (_core.UNBOUNDED if x == -1 else int(x) for x in values)
    if causal:
        right = 0
    mask = _core.Mask()
    if left == _core.UNBOUNDED and right == 0:
        return mask.causal()
    if left == _core.UNBOUNDED and right == _core.UNBOUNDED:
        return mask
    return mask.window(left, right)


def _flash_mods(softcap, alibi_slopes, num_heads):
    """softcap and alibi_slopes as maskattn modifiers (P85 for per-sequence slopes that differ)."""
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real) or softcap < 0:
        raise Error(f"flash_attn_varlen_func: softcap must be a real number >= 0 (0: none), "
                    f"got {softcap!r}")
    slopes = None
    if alibi_slopes is not None:
        slopes = torch.as_tensor(alibi_slopes).detach().to("cpu", torch.float32)
        if slopes.dim() == 2 and bool((slopes == slopes[:1]).all()):
            slopes = slopes[0]
        if slopes.dim() != 1 or slopes.shape[0] != num_heads:
            raise Error(f"flash_attn_varlen_func: alibi_slopes must be [nheads] = [{num_heads}] "
                        f"(or [batch, nheads] with the same row for every sequence), got shape "
                        f"{list(slopes.shape)}")
        slopes = slopes.numpy()
    if slopes is None and not softcap:
        return None
    return _core.ScoreMods(softcap=float(softcap) if softcap else None, alibi_slopes=slopes)


@torch.compiler.disable(reason="maskattn's varlen call runs outside the graph")
def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None):
    """A drop-in for flash-attn 2's ``flash_attn_varlen_func`` on the CPU, with autograd.

    q [total_q, nheads, D], k and v [total_k, nheads_k, D] (GQA when nheads_k divides nheads),
    ``cu_seqlens_q``/``cu_seqlens_k`` int32 offsets, ``causal`` bottom-right aligned per
    sequence, ``window_size=(left, right)`` (-1 unbounded), ``softcap``, ``alibi_slopes``
    [nheads], ``dropout_p`` (its seed drawn from PyTorch's generator, as flash-attn draws its
    own). ``deterministic`` changes nothing: maskattn's backward is always deterministic.
    ``return_attn_probs=True`` returns (out, softmax_lse [nheads, total_q], None): the lse, and no
    attention probabilities (flash-attn's are for testing only). ``block_table`` (paged KV) is not
    supported (P85).
    """
    if block_table is not None:
        raise Error("flash_attn_varlen_func: block_table (a paged KV cache) is not supported; "
                    "pass k and v packed as [total_k, nheads_k, D]")
    del deterministic  # maskattn is deterministic whatever it says
    mask = _window_mask(bool(causal), window_size)
    mods = _flash_mods(softcap, alibi_slopes, q.shape[1] if q.dim() == 3 else -1)
    result = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              mask, mods, scale=softmax_scale, return_lse=return_attn_probs,
                              dropout_p=dropout_p)
    if return_attn_probs:
        out, lse = result
        return out, lse, None
    return result
