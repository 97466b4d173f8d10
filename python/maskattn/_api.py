"""The NumPy-level API: attention, its backward, partial merges and mask inspection.

Every function takes NumPy arrays, PyTorch tensors (CPU) or anything with DLPack, reads them in
place whatever their strides, and allocates its outputs in the caller's framework and dtype. The
C++ library does the work with the GIL released; this layer only chooses defaults and allocates.
"""

from __future__ import annotations

import numbers

from . import _core
from ._arrays import (
    Error,
    check_element,
    core_view,
    element_tag,
    empty_like_framework,
    is_torch,
    new_output,
    plain_views,
    threads_arg,
    to_bhld,
    torch_call_arrays,
    writable_output,
)
from ._dropout import backward_seed, checked_dropout, seed_for

__all__ = [
    "attention",
    "attention_backward",
    "merge_partials",
    "allowed_pairs",
    "any_allowed",
    "block_map",
    "attention_weights",
    "attention_scores",
    "gradcheck",
    "cpu_info",
]


def rank4_shape(x, name: str, axes: str):
    """The shape of a 4-axis view, or maskattn.Error naming ``name`` and the ``axes`` expected."""
    shape = x.shape
    if len(shape) != 4:
        raise Error(f"{name} has shape {list(shape)}; expected {axes}")
    return shape


def check_mask_mods_scale(mask, mods, scale=None):
    """The scale as the core takes it (None: 1/sqrt(D)), after checking the arguments the core
    takes as objects: refused with maskattn.Error (not the binding's TypeError listing its
    internal signature) when they have the wrong type."""
    if mask is not None and not isinstance(mask, _core.Mask):
        raise Error(f"mask must be a maskattn.Mask or None, got {type(mask).__name__}")
    if mods is not None and not isinstance(mods, _core.ScoreMods):
        raise Error(f"mods must be a maskattn.ScoreMods or None, got {type(mods).__name__}")
    return None if scale is None else checked_scale(scale)


def checked_scale(scale) -> float:
    """A scale that is not None, as the float the core takes (maskattn.torch checks its mask and
    modifiers itself, and only the scale here)."""
    if type(scale) is float:
        return scale
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise Error(f"scale must be None (1/sqrt(D)) or a real number, got {scale!r}")
    return float(scale)


def input_views(arrays, names, dtype, layout):
    """Core views of q, k, v (and friends) in [B, H, L, D] order, with their shared element tag."""
    if dtype is None and layout == "bhld":
        views = plain_views(arrays)
        if views is not None:
            return views, ""
    element = element_tag(dtype)
    views = []
    for x, name in zip(arrays, names):
        view, tag = core_view(x, name, element)
        if tag and element and tag != element:
            raise Error(f"{name} holds {tag} but dtype={dtype!r} was given")
        check_element(view, name, element, dtype)
        element = element or tag
        views.append(to_bhld(view, layout))
    return views, element


def frame_values(frame):
    """``frame=`` as the core takes it: None, or [q_offset, k_offset, q_total, k_total] as ints."""
    if frame is None:
        return None
    values = list(frame) if isinstance(frame, (tuple, list)) else []
    if len(values) != 4 or not all(
        isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in values
    ):
        raise Error(
            "frame must be (q_offset, k_offset, q_total, k_total), four integers; "
            f"got {frame!r}"
        )
    return [int(x) for x in values]


def check_out(out, name, shape_bhld, layout):
    view, _ = core_view(writable_output(out, name), name, "")
    view = to_bhld(view, layout)
    if tuple(view.shape) != tuple(shape_bhld):
        want = list(shape_bhld) if layout == "bhld" else [shape_bhld[i] for i in (0, 2, 1, 3)]
        raise Error(f"{name} has shape {list(out.shape)} but must be {want} ({layout})")
    return view


def output_views(q, shape, layout, out, element, return_lse):
    """O for a forward call — a new array in q's framework, or the caller's ``out`` checked —
    and its core view; with ``return_lse`` also LSE [B, Hq, Lq] float32 and its view (else
    None, None)."""
    if out is None:
        result, out_view = new_output(q, shape, layout)
    else:
        result = out
        out_view, _ = core_view(check_out(out, "out", shape, layout), "out", element)
    lse = lse_view = None
    if return_lse:
        lse = empty_like_framework(q, shape[:3], "float32")
        lse_view = core_view(lse, "lse", "")[0]
    return result, out_view, lse, lse_view


def attention(
    q,
    k,
    v,
    mask=None,
    mods=None,
    *,
    scale=None,
    layout="bhld",
    dtype=None,
    threads=None,
    return_lse=False,
    out=None,
    kernel="auto",
    products="auto",
    check_finite=False,
    frame=None,
    count_sinks=True,
    dropout_p=0.0,
    dropout_seed=None,
    dropout_offset=0,
):
    """O = softmax(scale·Q·Kᵀ + M)·V with ``mask`` (a :class:`Mask`) and ``mods`` (:class:`ScoreMods`).

    ``layout="bhld"``: q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv]; ``"blhd"``: the
    same with L and H swapped (model code, FlashAttention). Returns O in q's dtype and layout, and
    with ``return_lse=True`` also LSE [B, Hq, Lq] (float32, natural log). A row with no allowed
    key gives O = 0 and LSE = -inf, never NaN.

    ``frame=(q_offset, k_offset, q_total, k_total)``: q and k are rows [q_offset, q_offset + Lq)
    and [k_offset, k_offset + Lk) of a problem of q_total queries and k_total keys, and the mask
    and modifiers are evaluated at those global positions (docs/semantics.md: frames); slices
    merged with :func:`merge_partials` equal one call over the whole problem. ``count_sinks=False``
    leaves ``mods.sinks`` out of this call's denominators: with a split of the keys, count them in
    exactly one part.

    ``dropout_p``: attention dropout — each allowed pair is dropped with probability dropout_p
    after the softmax, the kept weights scaled by 1/(1 - dropout_p), as a pure function of
    (``dropout_seed``, ``dropout_offset``, b, h, q, kv) (docs/semantics.md §17):
    the same seed and offset give the same pairs in :func:`attention_backward` and
    :func:`attention_weights`, for any thread count and kernel. LSE stays the undropped one.
    Without a seed, torch tensors draw one from PyTorch's default generator
    (``torch.manual_seed`` reproduces the call); NumPy arrays need ``dropout_seed``.
    """
    scale = check_mask_mods_scale(mask, mods, scale)
    dropout = checked_dropout(dropout_p, dropout_seed, dropout_offset)
    if dropout.p:  # seed_for leaves a call without dropout as it is
        dropout = seed_for(dropout, is_torch(q), "attention")
    return checked_attention(q, k, v, mask, mods, scale, dropout, layout=layout, dtype=dtype,
                             threads=threads, return_lse=return_lse, out=out, kernel=kernel,
                             products=products, check_finite=check_finite, frame=frame,
                             count_sinks=count_sinks)


def checked_attention(q, k, v, mask, mods, scale, dropout, *, layout="bhld", dtype=None,
                      threads=None, return_lse=False, out=None, kernel="auto", products="auto",
                      check_finite=False, frame=None, count_sinks=True, torch_checked=False):
    """:func:`attention` once ``mask``, ``mods`` and ``scale`` are checked (check_mask_mods_scale)
    and ``dropout`` is a checked Dropout with its seed chosen: what maskattn.torch calls, which
    has checked them itself (and with ``torch_checked``, that q, k and v are CPU tensors of one
    dtype maskattn computes in). The rest is checked here, as attention checks it."""
    arrays = None
    if layout == "bhld" and dtype is None and out is None:
        # plain torch tensors, as capsules
        arrays = torch_call_arrays(q, k, v, return_lse, torch_checked)
    if arrays is None:
        (qb, kb, vb), element = input_views((q, k, v), ("q", "k", "v"), dtype, layout)
        batch, heads, q_len, _ = rank4_shape(qb, "q", "[B,Hq,Lq,D]")
        rank4_shape(kb, "k", "[B,Hkv,Lk,D]")
        value_dim = rank4_shape(vb, "v", "[B,Hkv,Lk,Dv]")[3]
        shape = (batch, heads, q_len, value_dim)
        result, out_view, lse, lse_view = output_views(q, shape, layout, out, element, return_lse)
    else:
        qb, kb, vb, element, result, out_view, lse, lse_view = arrays
    _core.attention(
        qb, kb, vb, out_view, mask, mods, lse_view, scale,
        0 if threads is None else threads_arg(threads), kernel, products, check_finite, element,
        None if frame is None else frame_values(frame), count_sinks is True or bool(count_sinks),
        dropout.p, dropout.seed or 0, dropout.offset,
    )
    return (result, lse) if return_lse else result


def attention_backward(
    q,
    k,
    v,
    out,
    lse,
    dout,
    mask=None,
    mods=None,
    *,
    scale=None,
    layout="bhld",
    dtype=None,
    threads=None,
    kernel="auto",
    products="auto",
    return_mod_grads=False,
    frame=None,
    return_table_grads=False,
    float32_grads=False,
    dropout_p=0.0,
    dropout_seed=None,
    dropout_offset=0,
):
    """Gradients (dq, dk, dv) of a loss given dout = ∂L/∂O, from what :func:`attention` returned.

    ``out`` and ``lse`` are that call's results for the same inputs, mask and modifiers. Gradients
    have the dtype and layout of their inputs; dk, dv sum over the query heads sharing a kv head.
    With ``return_mod_grads=True`` the result is (dq, dk, dv, dbias, dsinks): dbias (float32, the
    shape of ``mods.bias``) and dsinks (float32 [Hq]) are None when ``mods`` has no bias or sinks.
    Hidden pairs contribute exactly nothing: a fully hidden row has dq = 0. ``frame`` as in
    :func:`attention`: out and lse are the slice's merged results, the gradients the slice's rows,
    and dbias the gradient of the whole bias (zero outside the slice). With
    ``return_table_grads=True`` one more element follows: {table name: ∂L/∂table} (float32, the
    table's shape) for each float32 table of ``mods.program`` (empty without a program).
    ``float32_grads=True`` returns dq, dk, dv in float32 whatever the inputs' dtype: the gradients
    of one slice, unrounded, to be summed over slices and rounded once (as ``out=`` may be float32
    for :func:`merge_partials`).
    With attention dropout, give the forward's ``dropout_p``, ``dropout_seed`` and
    ``dropout_offset``: the backward regenerates the same dropped pairs (a seed is required).
    """
    scale = check_mask_mods_scale(mask, mods, scale)
    dropout = backward_seed(checked_dropout(dropout_p, dropout_seed, dropout_offset))
    views, element = input_views(
        (q, k, v, out, dout), ("q", "k", "v", "out", "dout"), dtype, layout
    )
    qb, kb, vb, ob, db = views
    lse_view, _ = core_view(lse, "lse", "")
    shapes = [rank4_shape(x, n, a) for x, n, a in zip(
        (qb, kb, vb), ("q", "k", "v"), ("[B,Hq,Lq,D]", "[B,Hkv,Lk,D]", "[B,Hkv,Lk,Dv]"))]
    grad_dtype = "float32" if float32_grads else None
    grads, grad_views = zip(*(new_output(like, shape, layout, grad_dtype)
                              for like, shape in zip((q, k, v), shapes)))
    dbias = dsinks = None
    if mods is not None:
        bias = mods.bias
        if bias is not None:
            dbias = empty_like_framework(q, tuple(bias.shape), "float32")
        if len(mods.sinks) > 0:
            dsinks = empty_like_framework(q, (len(mods.sinks),), "float32")
    table_grads = table_grads_for(q, mods) if return_table_grads else {}
    _core.attention_backward(
        qb, kb, vb, ob, lse_view, db, *grad_views, dbias, dsinks,
        [core_view(g, "dtables", "")[0] if g is not None else None for g in table_grads.values()],
        mask, mods, scale, threads_arg(threads), kernel, products, element, frame_values(frame),
        **dropout.core_args(),
    )
    result = (*grads, dbias, dsinks) if return_mod_grads else tuple(grads)
    if return_table_grads:
        return (*result, {name: g for name, g in table_grads.items() if g is not None})
    return result


def table_grads_for(like, mods):
    """{name: zeroed float32 gradient, or None for a table that has none} for every table of
    ``mods.program``, in the program's order (the core takes one entry per table)."""
    program = mods.program if mods is not None else None
    if program is None:
        return {}
    grads = {}
    for name, dtype, shape in program.tables:
        grads[name] = None
        if dtype == "float32":
            grads[name] = empty_like_framework(like, shape, "float32")
            grads[name][...] = 0
    return grads


def merge_partials(parts, *, dtype=None, out=None):
    """Attention over disjoint key sets merged into attention over their union.

    ``parts`` is a sequence of (out [B, Hq, Lq, Dv], lse [B, Hq, Lq] float32) pairs, each from one
    :func:`attention` call with ``return_lse=True``. Returns (out, lse); a part whose row saw no
    key (LSE -inf) changes nothing.
    """
    parts = list(parts)
    if not parts:
        raise Error("merge_partials needs at least one (out, lse) part")
    element = element_tag(dtype)
    outs, lses = [], []
    for n, part in enumerate(parts):
        if len(part) != 2:
            raise Error(f"merge_partials: part {n} must be an (out, lse) pair")
        view, tag = core_view(part[0], f"part {n} out", element)
        element = element or tag
        outs.append(view)
        lses.append(core_view(part[1], f"part {n} lse", "")[0])
    first_out, first_lse = parts[0]
    if out is not None:
        writable_output(out, "out")
    result = out if out is not None else empty_like_framework(first_out, tuple(first_out.shape))
    lse = empty_like_framework(first_out, tuple(first_lse.shape), "float32")
    _core.merge_partials(outs, lses, core_view(result, "out", element)[0], lse, element)
    return result, lse


def allowed_pairs(mask, batch=1, q_heads=1, q_len=None, k_len=None, *, b=None, h=None):
    """The mask evaluated for [B, Hq, Lq, Lk] as a uint8 NumPy array (1 = allowed); with b and h,
    one sequence and head: [Lq, Lk]."""
    check_mask_mods_scale(mask, None)
    if q_len is None:
        raise Error("allowed_pairs needs q_len (and k_len, default q_len)")
    k_len = q_len if k_len is None else k_len
    return _core.allowed_pairs(mask, batch, q_heads, q_len, k_len, b, h)


def any_allowed(mask, batch=1, q_heads=1, q_len=None, k_len=None, *, frame=None):
    """Whether the mask allows any pair of a [B, Hq, Lq, Lk] problem — or, with ``frame=(q_offset,
    k_offset, q_total, k_total)``, of the slice of a larger problem at those rows (as
    :func:`attention` evaluates it). Exact, O(tiles) for structured masks: a ring skips the slice
    pairs for which it is False."""
    check_mask_mods_scale(mask, None)
    if q_len is None:
        raise Error("any_allowed needs q_len (and k_len, default q_len)")
    k_len = q_len if k_len is None else k_len
    return _core.any_allowed(mask, batch, q_heads, q_len, k_len, frame_values(frame))


def block_map(mask, batch=1, q_heads=1, q_len=None, k_len=None, *, tile_q=64, tile_k=64):
    """The tiles the kernels see: [B, Hq, ⌈Lq/tile_q⌉, ⌈Lk/tile_k⌉], 0 = empty (skipped),
    1 = full, 2 = partial."""
    check_mask_mods_scale(mask, None)
    if q_len is None:
        raise Error("block_map needs q_len (and k_len, default q_len)")
    k_len = q_len if k_len is None else k_len
    return _core.block_map(mask, batch, q_heads, q_len, k_len, tile_q, tile_k)


def attention_weights(q, k, mask=None, mods=None, *, scale=None, layout="bhld", dtype=None,
                      threads=None, kernel="auto", dropout_p=0.0, dropout_seed=None,
                      dropout_offset=0):
    """The softmax weights P [B, Hq, Lq, Lk] (float32) — a debugging tool: it costs Lq·Lk per
    head. Hidden pairs get exactly 0. With ``dropout_p`` (and the seed and offset of an
    :func:`attention` call), the weights that call multiplied V by: P∘Z/(1 - p'), 0 where a pair
    was dropped; the seed is chosen as in :func:`attention`."""
    scale = check_mask_mods_scale(mask, mods, scale)
    dropout = seed_for(checked_dropout(dropout_p, dropout_seed, dropout_offset), is_torch(q),
                       "attention_weights")
    (qb, kb), element = input_views((q, k), ("q", "k"), dtype, layout)
    batch, heads, q_len, _ = rank4_shape(qb, "q", "[B,Hq,Lq,D]")
    k_len = rank4_shape(kb, "k", "[B,Hkv,Lk,D]")[2]
    weights = empty_like_framework(q, (batch, heads, q_len, k_len), "float32")
    _core.attention_weights(qb, kb, weights, mask, mods, scale, threads_arg(threads), kernel,
                            element, **dropout.core_args())
    return weights


def attention_scores(q, k, mask=None, mods=None, *, stage="final", scale=None, layout="bhld",
                     dtype=None, threads=None):
    """The scores [B, Hq, Lq, Lk] (float32): ``stage="scaled"`` is scale·Q·Kᵀ alone, ``"final"``
    is what enters the softmax (every modifier applied, hidden pairs -inf)."""
    if stage not in ("scaled", "final"):
        raise Error(f'stage must be "scaled" or "final", got {stage!r}')
    scale = check_mask_mods_scale(mask, mods, scale)
    (qb, kb), element = input_views((q, k), ("q", "k"), dtype, layout)
    batch, heads, q_len, _ = rank4_shape(qb, "q", "[B,Hq,Lq,D]")
    k_len = rank4_shape(kb, "k", "[B,Hkv,Lk,D]")[2]
    scores = empty_like_framework(q, (batch, heads, q_len, k_len), "float32")
    _core.attention_scores(qb, kb, scores, stage == "final", mask, mods, scale,
                           threads_arg(threads), element)
    return scores


def gradcheck(q, k, v, dout, mask=None, mods=None, *, scale=None, layout="bhld", dtype=None,
              kernel="auto", step=1e-3, tolerance=None, dropout_p=0.0, dropout_seed=None,
              dropout_offset=0):
    """attention_backward checked against central finite differences of the f64 reference
    (small problems: two forwards per element). Returns a dict with ``passed``, ``tolerance``
    and one entry per gradient tensor. With dropout (a seed is required) the dropped pairs are
    held fixed, as the backward differentiates."""
    scale = check_mask_mods_scale(mask, mods, scale)
    dropout = backward_seed(checked_dropout(dropout_p, dropout_seed, dropout_offset), "gradcheck")
    (qb, kb, vb, db), element = input_views((q, k, v, dout), ("q", "k", "v", "dout"), dtype, layout)
    return _core.gradcheck(qb, kb, vb, db, mask, mods, scale, kernel, step, tolerance, element,
                           **dropout.core_args())


def cpu_info():
    """What this CPU offers the kernels and which unit computes each dtype's products."""
    return _core.cpu_info()
