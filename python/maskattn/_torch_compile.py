"""maskattn as ``torch.library`` custom ops, so that ``torch.compile(fullgraph=True)`` traces
``maskattn.torch.scaled_dot_product_attention`` without a graph break.

Design: a custom op's arguments must be tensors and plain values, so the ops take the SDPA
tensor-mask forms only — a bool keep mask, a float additive mask, a float bias (the float mask
when it requires grad) and the top-left causal flag, split by _torch_masks as the eager call
splits them — and build the maskattn Mask inside, where the tensors are real.
``maskattn::sdpa`` returns (out, lse); its autograd formula calls ``maskattn::sdpa_backward``,
also an op, so the backward graph compiles too. Fake (meta) implementations give the shapes: out [B, H, L, Dv] in q's dtype and lse [B, H, L] float32,
contiguous, as the real calls allocate them.

Dropout: the ops take ``dropout_p`` and the seed as a 0-d int64 tensor, drawn inside the graph
by ``torch.randint`` from PyTorch's generator (_dropout.torch_seed_tensor, the eager call's draw
too); the autograd formula saves that tensor and hands it to the backward op, which regenerates
the forward's dropped pairs from it.

Limitation: ``mask=`` (a maskattn.Mask) and ``mods=`` are C++ objects with no tensor form, so a
call that uses them runs outside the graph (``torch.compiler.disable``: a graph break, which
``fullgraph=True`` reports as an error naming the reason). So do ``maskattn.torch.attention``
and ``flex_attention``, which evaluate Mask objects and Python callables on real tensors. Give
the mask as an ``attn_mask`` tensor (or ``is_causal``) for a graph without breaks.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _api
from ._dropout import Dropout, torch_seed_tensor
from ._torch_autograd import Call, ScoreMods
from ._torch_masks import core_mask, split_attn_mask

__all__ = ["compiled_attention"]


def _call_for(attn_mask: Optional[Tensor], bias: Optional[Tensor], is_causal: bool,
              scale: Optional[float], dropout_p: float, dropout_seed: Optional[Tensor]) -> Call:
    """The maskattn call for the op's arguments (split as split_attn_mask splits them)."""
    mask = core_mask(None, is_causal, attn_mask, attn_mask, "op")
    mods = None if bias is None else ScoreMods(bias=bias).core()
    seed = 0 if dropout_seed is None else int(dropout_seed)
    return Call(mask, mods, scale, "bhld", None, (), Dropout(dropout_p, seed, 0))


@torch.library.custom_op("maskattn::sdpa", mutates_args=(), device_types="cpu")
def sdpa_op(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor],
            bias: Optional[Tensor], is_causal: bool, scale: Optional[float],
            dropout_p: float = 0.0, dropout_seed: Optional[Tensor] = None
            ) -> Tuple[Tensor, Tensor]:
    call = _call_for(attn_mask, bias, is_causal, scale, dropout_p, dropout_seed)
    return _api.attention(query, key, value, call.mask, call.mods, scale=scale, return_lse=True,
                          **call.dropout.core_args())


@sdpa_op.register_fake
def _sdpa_fake(query, key, value, attn_mask, bias, is_causal, scale, dropout_p=0.0,
               dropout_seed=None):
    batch, heads, q_len, _ = query.shape
    out = query.new_empty((batch, heads, q_len, value.shape[3]))
    return out, query.new_empty((batch, heads, q_len), dtype=torch.float32)


@torch.library.custom_op("maskattn::sdpa_backward", mutates_args=(), device_types="cpu")
def sdpa_backward_op(query: Tensor, key: Tensor, value: Tensor, out: Tensor, lse: Tensor,
                     dout: Tensor, attn_mask: Optional[Tensor], bias: Optional[Tensor],
                     is_causal: bool, scale: Optional[float], dropout_p: float = 0.0,
                     dropout_seed: Optional[Tensor] = None
                     ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    call = _call_for(attn_mask, bias, is_causal, scale, dropout_p, dropout_seed)
    dq, dk, dv, dbias, _ = _api.attention_backward(
        query, key, value, out, lse, dout, call.mask, call.mods, scale=scale,
        return_mod_grads=True, **call.dropout.core_args())
    if bias is None:
        return dq, dk, dv, query.new_empty((0,))
    return dq, dk, dv, dbias.reshape(bias.shape).to(bias.dtype)


@sdpa_backward_op.register_fake
def _sdpa_backward_fake(query, key, value, out, lse, dout, attn_mask, bias, is_causal, scale,
                        dropout_p=0.0, dropout_seed=None):
    dbias = query.new_empty((0,)) if bias is None else bias.new_empty(bias.shape)
    return (query.new_empty(query.shape), key.new_empty(key.shape),
            value.new_empty(value.shape), dbias)


def _setup_context(ctx, inputs, output):
    query, key, value, attn_mask, bias, is_causal, scale, dropout_p, dropout_seed = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, out, lse, attn_mask, bias, dropout_seed)
    ctx.is_causal, ctx.scale, ctx.dropout_p = is_causal, scale, dropout_p
    ctx.has_bias = bias is not None


def _backward(ctx, dout, _dlse):
    query, key, value, out, lse, attn_mask, bias, dropout_seed = ctx.saved_tensors
    dq, dk, dv, dbias = torch.ops.maskattn.sdpa_backward(
        query, key, value, out, lse, dout, attn_mask, bias, ctx.is_causal, ctx.scale,
        ctx.dropout_p, dropout_seed)
    return dq, dk, dv, None, (dbias if ctx.has_bias else None), None, None, None, None


sdpa_op.register_autograd(_backward, setup_context=_setup_context)


BREAK_REASON = ("maskattn: mask= and mods= hold C++ objects, which cannot enter a graph; "
                "give the mask as an attn_mask tensor (or is_causal) to compile without a break")


def compiled_attention(q4, k4, v4, folded_mask, is_causal, scale, mask, mods, dropout_p,
                       outside_graph):
    """The SDPA call inside a torch.compile region: through the custom op, or (with mask= or
    mods=) through ``outside_graph``, the eager call wrapped in torch.compiler.disable (which
    draws its dropout seed itself)."""
    if mask is not None or mods is not None:
        return outside_graph(q4, k4, v4, folded_mask, is_causal, scale, mask, mods,
                             dropout_p=dropout_p)
    attn_mask, bias = split_attn_mask(folded_mask)
    seed = torch_seed_tensor() if dropout_p > 0 else None
    out, _ = torch.ops.maskattn.sdpa(q4, k4, v4, attn_mask, bias, bool(is_causal),
                                     None if scale is None else float(scale), float(dropout_p),
                                     seed)
    return out
