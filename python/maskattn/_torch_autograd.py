"""The autograd core of ``maskattn.torch``: one ``torch.autograd.Function`` around maskattn's
forward and backward.

Design:

* The forward saves q, k, v, the output and the LSE (O(N) memory, like FlashAttention); the
  backward is maskattn's ``attention_backward``, which recomputes the weights from them. Nothing of
  size Lq×Lk is ever stored for autograd.
* A ``maskattn.ScoreMods`` is a C++ object holding *copies* of its arrays, so it cannot tell
  autograd where its bias came from. :class:`ScoreMods` here mirrors its constructor but keeps the
  torch tensors: a ``bias`` or ``sinks`` tensor that requires grad is an input of the Function and
  receives ∂L/∂bias (reduced to its own shape by the C++ backward) and ∂L/∂sinks.
* A score program's float32 tables (a learned relative-position table captured by a traced
  ``score_mod``) are inputs of the Function too, read in place by the C++ program; the backward
  returns their gradients (``Gradients::dtables``, the scatter-add of every pair's reads).
* When nothing requires grad (inference, ``torch.no_grad()``), the Function is bypassed: the call
  goes straight to the C++ forward, without autograd bookkeeping.
* The C++ results do not depend on the thread count, so neither do these.
* Attention dropout is a pure function of a seed (_dropout): the forward's seed and offset are
  part of the saved :class:`Call`, and the backward passes them again, so it regenerates exactly
  the pairs the forward dropped. A call with ``dropout_p > 0`` and no seed draws one from
  PyTorch's default generator, once, before the forward.
* There is no double backward: ``create_graph=True`` through maskattn raises NotImplementedError
  rather than returning gradients that silently carry no second derivative.
"""

from __future__ import annotations

import atexit
import weakref
from typing import NamedTuple, Optional

import torch

from . import _api, _core
from ._dropout import NO_DROPOUT, Dropout, checked_dropout, seed_for

Error = _core.Error

__all__ = ["ScoreMods", "attention", "attention_and_lse", "Call", "COMPUTE_DTYPES", "check_mask",
           "check_tensors", "core_mods_of", "program_tables_of"]


class ScoreMods:
    """``maskattn.ScoreMods`` for PyTorch: the same keywords, but ``bias`` and ``sinks`` may be
    torch tensors that require grad, and then receive gradients, and so may the float32 tables
    of a ``program`` given as (text, {name: tensor}).

    ``bias`` broadcasts to [B, Hq, Lq, Lk] (rank ≤ 4) and is added to the scaled scores;
    ``sinks`` is [Hq]; ``softcap``, ``alibi_slopes``, ``threshold`` and ``score_fn`` are passed to
    the C++ modifiers unchanged (docs/semantics.md §5 gives the order); ``program`` (a score
    program: its text, (text, tables) or a maskattn.Program) too, its tables read in place.
    """

    def __init__(self, *, softcap=None, alibi_slopes=None, bias=None, score_fn=None,
                 threshold=None, sinks=None, program=None):
        self.softcap = softcap
        self.alibi_slopes = alibi_slopes
        self.bias = bias
        self.score_fn = score_fn
        self.threshold = threshold
        self.sinks = sinks
        self.program = program

    def core(self) -> _core.ScoreMods:
        """The C++ modifiers holding a float32 copy of the current bias and sinks values (a
        program's tables are read in place)."""
        program = self.program
        if isinstance(program, tuple) and len(program) == 2 and isinstance(program[1], dict):
            program = (program[0], {name: table.detach() if isinstance(table, torch.Tensor)
                                    else table for name, table in program[1].items()})
        return _core.ScoreMods(
            softcap=self.softcap,
            alibi_slopes=_float32_values(self.alibi_slopes, "mods.alibi_slopes"),
            bias=_float32_values(self.bias, "mods.bias"),
            score_fn=self.score_fn,
            threshold=self.threshold,
            sinks=_float32_values(self.sinks, "mods.sinks"),
            program=program,
        )

    def program_tables(self):
        """(names, tensors): the torch tensors among the program's tables, which the autograd
        Function takes as inputs (the float32 ones that require grad get gradients)."""
        if not (isinstance(self.program, tuple) and len(self.program) == 2
                and isinstance(self.program[1], dict)):
            return (), []
        tables = [(n, t) for n, t in self.program[1].items() if isinstance(t, torch.Tensor)]
        return tuple(n for n, _ in tables), [t for _, t in tables]

    def __repr__(self):
        parts = []
        for name in ("softcap", "alibi_slopes", "bias", "score_fn", "threshold", "sinks",
                     "program"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, torch.Tensor):
                grad = ", requires_grad" if value.requires_grad else ""
                parts.append(f"{name}=Tensor{list(value.shape)}{grad}")
            else:
                parts.append(f"{name}={value!r}")
        return "maskattn.torch.ScoreMods(" + ", ".join(parts) + ")"


def _float32_values(values, name: str):
    """Values the C++ side can copy: torch tensors as float32 NumPy arrays (NumPy cannot read
    bfloat16 tensors, and the bindings copy NumPy arrays most directly), anything else as given.
    A tensor without strided storage (sparse, MKL-DNN) or without values (meta) is refused by
    ``name`` (P96)."""
    if isinstance(values, torch.Tensor):
        if values.layout is not torch.strided:
            raise Error(f"{name} (shape {list(values.shape)}) has layout {values.layout}; "
                        "maskattn reads strided tensors: convert it with .to_dense()")
        if values.is_meta:
            raise Error(f"{name} (shape {list(values.shape)}) is a meta tensor: it has no "
                        "values to read")
        return values.detach().to("cpu", torch.float32).numpy()
    return values


class Call(NamedTuple):
    """Everything about one attention call that is not a differentiable tensor."""

    mask: Optional[_core.Mask]
    mods: Optional[_core.ScoreMods]
    scale: Optional[float]
    layout: str
    threads: Optional[int]
    table_names: tuple = ()  # mods.program's tables given to the Function, in its order
    dropout: Dropout = NO_DROPOUT  # with its seed chosen: the backward regenerates its pairs


def program_tables_of(mods):
    """(names, tensors) of the torch tables of a maskattn.torch.ScoreMods' program."""
    return mods.program_tables() if isinstance(mods, ScoreMods) else ((), [])


def core_mods_of(mods):
    """(C++ ScoreMods or None, bias tensor or None, sinks tensor or None) for ``mods=``."""
    if mods is None:
        return None, None, None
    if isinstance(mods, _core.ScoreMods):
        return mods, None, None
    if isinstance(mods, ScoreMods):
        bias = mods.bias if isinstance(mods.bias, torch.Tensor) else None
        sinks = mods.sinks if isinstance(mods.sinks, torch.Tensor) else None
        return mods.core(), bias, sinks
    raise Error(
        f"mods must be None, a maskattn.ScoreMods or a maskattn.torch.ScoreMods, "
        f"got {type(mods).__name__}"
    )


# The dtypes maskattn computes in; also what the transformers backend checks a model's tensors
# against (with its own messages).
COMPUTE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_tensors(query, key, value):
    """query, key and value: CPU torch tensors of one dtype that maskattn computes in."""
    # The common case in one test (is_cpu: device.type builds a torch.device each time);
    # otherwise _name_what_is_wrong finds the first problem, in its order.
    tensor = torch.Tensor
    if isinstance(query, tensor) and isinstance(key, tensor) and isinstance(value, tensor):
        dtype = query.dtype
        if (key.dtype is dtype and value.dtype is dtype and dtype in COMPUTE_DTYPES
                and query.is_cpu and key.is_cpu and value.is_cpu):
            return
    _name_what_is_wrong((("query", query), ("key", key), ("value", value)))


def _name_what_is_wrong(named):
    first_name, first = named[0]
    for name, value in named:
        if not isinstance(value, torch.Tensor):
            raise Error(
                f"{name} must be a torch.Tensor, got {type(value).__name__}; "
                f"for NumPy arrays use maskattn.attention"
            )
        if value.device.type != "cpu":
            raise Error(
                f"{name} (shape {list(value.shape)}) is on {value.device}; maskattn computes on "
                f"the CPU: move it with .cpu()"
            )
        if value.dtype not in COMPUTE_DTYPES:
            raise Error(
                f"{name} has dtype {value.dtype} (shape {list(value.shape)}); maskattn computes "
                f"in torch.float32, torch.float16 or torch.bfloat16: convert with .float()"
            )
        if value.dtype != first.dtype:
            raise Error(
                f"{name} has dtype {value.dtype} but {first_name} has {first.dtype}; "
                f"query, key and value share one dtype"
            )


def check_mask(mask):
    if mask is not None and not isinstance(mask, _core.Mask):
        raise Error(
            f"mask must be None or a maskattn.Mask, got {type(mask).__name__}; "
            f"a tensor mask goes to scaled_dot_product_attention's attn_mask"
        )


class SavedCall:
    """The non-tensor part of a call kept for backward. Autograd graphs alive at interpreter
    exit (an output kept in a global) would otherwise hold the C++ Mask until after the
    extension is torn down, and nanobind would report it as leaked; an atexit hook drops it."""

    __slots__ = ("call", "__weakref__")

    def __init__(self, call):
        self.call = call


live_saved_calls = weakref.WeakSet()


@atexit.register
def _release_saved_calls():
    for saved in list(live_saved_calls):
        saved.call = None


class _AttentionFunction(torch.autograd.Function):
    """(q, k, v, bias, sinks, *program tables) → (out, lse); lse is not differentiable."""

    @staticmethod
    def forward(ctx, query, key, value, bias, sinks, call: Call, *tables):
        out, lse = _forward(query, key, value, call)
        save_call(ctx, (query, key, value, out, lse), call, bias, sinks, tables)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        refuse_double_backward("attention")
        query, key, value, out, lse = ctx.saved_tensors[:5]
        call = ctx.saved_call.call
        wants_tables = any(ctx.needs_input_grad[6:])
        grads = _api.attention_backward(
            query, key, value, out, lse, dout, call.mask, call.mods, scale=call.scale,
            layout=call.layout, threads=call.threads, return_mod_grads=True,
            return_table_grads=wants_tables, **call.dropout.core_args(),
        )
        return input_grads(ctx, call, grads, wants_tables)


def save_call(ctx, tensors, call, bias, sinks, tables):
    """What an attention Function's forward keeps for its backward: the tensors (q, k, v, out,
    lse) and the program tables — saved only so that autograd refuses a backward after they were
    changed in place (the program reads them again then) —, the call, and the shapes and dtypes
    the modifier gradients come back in. lse is not differentiable."""
    ctx.save_for_backward(*tensors, *tables)
    ctx.saved_call = SavedCall(call)
    live_saved_calls.add(ctx.saved_call)
    ctx.bias_meta = None if bias is None else (bias.shape, bias.dtype)
    ctx.sinks_meta = None if sinks is None else (sinks.shape, sinks.dtype)
    ctx.table_metas = [(t.shape, t.dtype) for t in tables]
    ctx.mark_non_differentiable(tensors[4])


def refuse_double_backward(what):
    """backward(create_graph=True) would silently be wrong: maskattn's gradients are not
    differentiable."""
    if torch.is_grad_enabled():
        raise NotImplementedError(
            "maskattn has no double backward: its gradients are not differentiable "
            f"(backward with create_graph=True through maskattn {what})"
        )


def input_grads(ctx, call, grads, wants_tables):
    """The Function's gradients, in its inputs' order (q, k, v, bias, sinks, call, *tables), from
    a backward's (dq, dk, dv, dbias, dsinks[, dtables])."""
    dq, dk, dv, dbias, dsinks = grads[:5]
    dtables = grads[5] if wants_tables else {}
    bias_grad = mod_grad(dbias, ctx.bias_meta, ctx.needs_input_grad[3])
    sinks_grad = mod_grad(dsinks, ctx.sinks_meta, ctx.needs_input_grad[4])
    table_grads = [mod_grad(dtables.get(name), meta, needed) for name, meta, needed in
                   zip(call.table_names, ctx.table_metas, ctx.needs_input_grad[6:])]
    return (dq, dk, dv, bias_grad, sinks_grad, None, *table_grads)


def mod_grad(grad, meta, needed):
    """The float32 gradient of a bias or sinks tensor, in that tensor's shape and dtype."""
    if not needed or grad is None or meta is None:
        return None
    shape, dtype = meta
    return grad.reshape(shape).to(dtype)


def _forward(query, key, value, call: Call, return_lse=True):
    """maskattn.attention for a call whose mask, mods and dropout are checked, and its tensors
    by check_tensors (the scale is checked here, where attention would check it)."""
    scale = call.scale
    if scale is not None:
        scale = _api.checked_scale(scale)
    return _api.checked_attention(query, key, value, call.mask, call.mods, scale, call.dropout,
                                  layout=call.layout, threads=call.threads, return_lse=return_lse,
                                  torch_checked=True)


def attention_and_lse(query, key, value, call: Call, bias=None, sinks=None, want_lse=True,
                      tables=()):
    """(out, lse) with autograd when any input requires grad; ``bias``/``sinks`` are the torch
    tensors whose float32 copies ``call.mods`` holds, ``tables`` the tensors its program reads
    (named by ``call.table_names``, in order). Without autograd and ``want_lse=False``, lse is
    None (not computing it saves an allocation: a few µs of a decoding step)."""
    if torch.is_grad_enabled() and (
            query.requires_grad or key.requires_grad or value.requires_grad
            or ((bias is not None or sinks is not None or tables)
                and any(t is not None and t.requires_grad for t in (bias, sinks, *tables)))):
        return _AttentionFunction.apply(query, key, value, bias, sinks, call, *tables)
    if want_lse:
        return _forward(query, key, value, call)
    return _forward(query, key, value, call, return_lse=False), None


def attention(query, key, value, mask=None, mods=None, *, scale=None, layout="bhld",
              threads=None, dropout_p=0.0, dropout_seed=None, dropout_offset=0):
    """Masked attention with autograd: maskattn.attention for torch tensors.

    ``layout="bhld"``: query [B, Hq, Lq, D], key [B, Hkv, Lk, D], value [B, Hkv, Lk, Dv];
    ``"blhd"``: L and H swapped. Hq % Hkv == 0 (GQA). ``mask``: a :class:`maskattn.Mask`;
    ``mods``: a :class:`maskattn.ScoreMods`, or a :class:`maskattn.torch.ScoreMods` whose
    ``bias``/``sinks`` tensors get gradients. Returns the output in query's dtype and layout; a
    row with no allowed key gives 0 (and zero gradients), never NaN.

    ``dropout_p``: attention dropout (as SDPA's ``dropout_p``: pairs dropped after the softmax,
    kept weights scaled by 1/(1 - dropout_p)); applied whenever it is > 0, like SDPA's, so pass
    ``dropout_p if self.training else 0.0``. The dropped pairs are a pure function of
    ``dropout_seed`` and ``dropout_offset``; without a seed, one is drawn from PyTorch's default
    CPU generator (``torch.manual_seed`` reproduces the call). The backward drops the same pairs.
    """
    if torch.compiler.is_compiling():  # a graph break: this call again, eager, outside the graph
        return _attention_outside_graph(query, key, value, mask, mods, scale=scale, layout=layout,
                                        threads=threads, dropout_p=dropout_p,
                                        dropout_seed=dropout_seed, dropout_offset=dropout_offset)
    check_tensors(query, key, value)
    check_mask(mask)
    core_mods, bias, sinks = core_mods_of(mods)
    names, tables = program_tables_of(mods)
    dropout = checked_dropout(dropout_p, dropout_seed, dropout_offset)
    if dropout.p:  # seed_for leaves a call without dropout as it is
        dropout = seed_for(dropout, True, "attention")
    call = Call(mask, core_mods, scale, layout, threads, names, dropout)
    out, _ = attention_and_lse(query, key, value, call, bias, sinks, want_lse=False,
                               tables=tables)
    return out


# torch.compiler.disable's wrapper costs more than the eager check above, so eager calls skip it.
_attention_outside_graph = torch.compiler.disable(
    attention, reason="maskattn.torch.attention takes maskattn.Mask objects, which cannot enter a "
    "graph; scaled_dot_product_attention with tensor masks can")
