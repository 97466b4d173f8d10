"""The paged, quantized KV cache of serving: :class:`PagedKVCache` and :func:`attention_paged`.

A pool of fixed-size blocks holds the keys and values of many sequences of their own lengths
(vLLM's and FlashAttention's block tables); each sequence grows a block at a time, can be forked
(its blocks shared until written: prefix sharing) and freed. The cache's format stores rows as
f32/f16/bf16 or quantized on append (int8, fp8-e4m3, fp8-e5m2, q4); attention reads them in
place, dequantizing in registers. docs/python.md ("Serving: the paged KV cache") is the guide,
docs/semantics.md §18 the definition.
"""

from __future__ import annotations

import numbers

from . import _core
from ._api import check_mask_mods_scale, input_views, output_views, rank4_shape
from ._arrays import Error, core_view, element_tag, threads_arg

__all__ = ["PagedKVCache", "attention_paged", "KV_FORMATS"]

KV_FORMATS = ("f32", "f16", "bf16", "int8", "fp8-e4m3", "fp8-e5m2", "q4")


class PagedKVCache(_core.PagedKVCache):
    """PagedKVCache(blocks, block_size, kv_heads, head_dim, format="f32", value_dim=0)

    ``blocks`` blocks of ``block_size`` positions (a multiple of 16 in [16, 1024]) for
    ``kv_heads`` heads of ``head_dim`` keys (``value_dim`` values; 0: head_dim), allocated once
    (the memory cap applies). ``format``: one of :data:`KV_FORMATS`.

    Sequences: ``add_sequence()`` → id, ``fork(id)`` (shares the blocks, copy on write),
    ``free(id)``, ``truncate(id, length)``, ``length(id)``, ``block_table(id)``,
    ``blocks_needed(id, count)``; the pool: ``free_blocks``, ``blocks_in_use``.
    """

    def append(self, sequence, k, v, *, dtype=None):
        """Appends T positions to ``sequence``: k [Hkv, T, D] and v [Hkv, T, Dv] of any float
        dtype and strides, encoded into the cache's format. Raises maskattn.Error, changing
        nothing, when the pool is short of blocks, a value is not finite (or too large for a
        quantized format's scale) or a shape disagrees."""
        if isinstance(sequence, bool) or not isinstance(sequence, numbers.Integral):
            raise Error(f"sequence must be an int (an id from add_sequence), got {sequence!r}")
        element = element_tag(dtype)
        views = []
        for x, name in ((k, "k"), (v, "v")):
            view, tag = core_view(x, name, element)
            views.append(view)
            element = element or tag
        self._append(int(sequence), views[0], views[1], element)


def _id_list(values, name, length=None):
    """A list of ints from a sequence, NumPy array or tensor, or maskattn.Error naming ``name``."""
    try:
        items = [values] if isinstance(values, numbers.Integral) else list(values)
    except TypeError:
        raise Error(f"{name} must be a list of ints, got {type(values).__name__}") from None
    out = []
    for item in items:
        if hasattr(item, "item"):
            item = item.item()
        if isinstance(item, bool) or not isinstance(item, numbers.Integral):
            raise Error(f"{name} must be a list of ints, got an element {item!r}")
        out.append(int(item))
    if length is not None and len(out) != length:
        raise Error(f"{name} has {len(out)} values but q has a batch of {length}")
    return out


def attention_paged(
    q,
    cache,
    sequences,
    query_lengths=None,
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
):
    """Attention of q [B, Hq, Lq, D] against the sequences ``sequences[b]`` of a
    :class:`PagedKVCache`: batch entry b's queries are the last ``query_lengths[b]`` positions
    (default Lq) of its sequence, already appended, aligned at that sequence's own end (causal);
    rows past query_lengths[b] are padding and output 0. ``mask`` and ``mods`` apply on top, over
    [B, Hq, Lq, longest sequence]; they must not give lengths or starts of their own. Returns O
    in q's framework, dtype and layout (and LSE [B, Hq, Lq] float32 with ``return_lse=True``).
    The cache is read in place; ``kernel="reference"`` decodes it and runs the f64 oracle."""
    if not isinstance(cache, _core.PagedKVCache):
        raise Error(f"cache must be a maskattn.PagedKVCache, got {type(cache).__name__}")
    scale = check_mask_mods_scale(mask, mods, scale)
    (qb,), element = input_views((q,), ("q",), dtype, layout)
    batch, heads, q_len, _ = rank4_shape(qb, "q", "[B,Hq,Lq,D]")
    ids = _id_list(sequences, "sequences", batch)
    lengths = [] if query_lengths is None else _id_list(query_lengths, "query_lengths", batch)
    shape = (batch, heads, q_len, cache.value_dim)
    result, out_view, lse, lse_view = output_views(q, shape, layout, out, element, return_lse)
    _core.attention_paged(
        qb, cache, ids, out_view, lengths, mask, mods, lse_view, scale, threads_arg(threads),
        kernel, element,
    )
    return (result, lse) if return_lse else result
