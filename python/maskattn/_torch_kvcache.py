"""``maskattn.torch.attention_with_kvcache``: FlashAttention's ``flash_attn_with_kvcache`` on the
CPU, reading a paged KV cache the caller owns in place.

FlashAttention (and vLLM's flash backend, and transformers' continuous batching) keep one
layer's keys as a tensor ``k_cache [num_blocks, block_size, Hkv, D]`` plus a ``block_table
[B, max_blocks]`` (int32) naming the blocks of each sequence, or, without a block table, as
``[B, L_cache, Hkv, D]``. This function takes the same arguments with the same meaning:
``cache_seqlens`` are the lengths before this call, the new rows ``k``/``v`` (optional) are
written into the cache at those positions (in place, as FlashAttention does), and the queries
are the last Lq positions of each sequence (bottom-right) when ``causal``. The attention itself
is maskattn's C++ ``attention_paged(PagedTensors)`` (include/maskattn/paged_tensors.h): the
pages are read where they are, no gather copy. docs/python.md ("Continuous batching") is the
guide.
"""

from __future__ import annotations

import numbers

import torch

from . import _core
from ._api import attention as _attention
from ._api import check_mask_mods_scale
from ._arrays import Error, core_view, threads_arg
from ._torch_autograd import COMPUTE_DTYPES

__all__ = ["attention_with_kvcache"]


def _tensor(x, name, ndim, shape_text):
    """``x`` checked as a CPU torch tensor of ``ndim`` axes (maskattn.Error P90 otherwise)."""
    if not isinstance(x, torch.Tensor):
        raise Error(f"attention_with_kvcache: {name} must be a torch tensor {shape_text}, "
                    f"got {type(x).__name__}")
    if x.ndim != ndim or x.device.type != "cpu":
        raise Error(f"attention_with_kvcache: {name} has shape {list(x.shape)} on "
                    f"{x.device}; expected a CPU tensor {shape_text}")
    return x


def _check_tensors(q, k_cache, v_cache, k, v, paged):
    cache_text = "[num_blocks, block_size, Hkv, D]" if paged else "[B, L_cache, Hkv, D]"
    _tensor(q, "q", 4, "[B, Lq, Hq, D]")
    _tensor(k_cache, "k_cache", 4, cache_text)
    _tensor(v_cache, "v_cache", 4, cache_text)
    if (k is None) != (v is None):
        raise Error("attention_with_kvcache: k and v are given together (the new rows) or not "
                    "at all")
    for x, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        if x.dtype != q.dtype or q.dtype not in COMPUTE_DTYPES:
            raise Error(f"attention_with_kvcache: q has dtype {q.dtype} and {name} {x.dtype}; "
                        f"they share one of float32, float16, bfloat16")
    if k is not None:
        _tensor(k, "k", 4, "[B, L_new, Hkv, D]")
        _tensor(v, "v", 4, "[B, L_new, Hkv, Dv]")
        if k.shape[:3] != v.shape[:3] or k.shape[0] != q.shape[0] or \
                k.shape[2:] != k_cache.shape[2:] or v.shape[2:] != v_cache.shape[2:]:
            raise Error(f"attention_with_kvcache: k {list(k.shape)} and v {list(v.shape)} must "
                        f"be [B, L_new, Hkv, D|Dv] for q {list(q.shape)} and the caches "
                        f"{list(k_cache.shape)}, {list(v_cache.shape)}")


def _seqlens(cache_seqlens, batch, default):
    """cache_seqlens (an int, or B ints in any integer tensor or sequence) as a LongTensor [B]."""
    if cache_seqlens is None:
        if default is None:
            raise Error("attention_with_kvcache: cache_seqlens is required with a block_table "
                        "(the lengths of the sequences before this call)")
        return torch.full((batch,), default, dtype=torch.int64)
    if isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool):
        return torch.full((batch,), int(cache_seqlens), dtype=torch.int64)
    lengths = torch.as_tensor(cache_seqlens)
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool or \
            lengths.shape != (batch,) or bool((lengths < 0).any()):
        raise Error(f"attention_with_kvcache: cache_seqlens must be an int or {batch} ints >= 0 "
                    f"(one per sequence), got {cache_seqlens!r}")
    return lengths.to(torch.int64)


def _block_table(block_table, batch):
    table = _tensor(block_table, "block_table", 2, "[B, max_blocks] (int32)")
    if table.dtype.is_floating_point or table.dtype == torch.bool or table.shape[0] != batch:
        raise Error(f"attention_with_kvcache: block_table must be an integer tensor [B, "
                    f"max_blocks] with B = {batch}, got {table.dtype} {list(table.shape)}")
    return table.to(torch.int32).contiguous()


def _append(k_cache, v_cache, k, v, seqlens, table):
    """Writes the new rows at positions seqlens[b] + t (FlashAttention's in-place update)."""
    new = k.shape[1]
    positions = seqlens[:, None] + torch.arange(new, dtype=torch.int64)  # [B, L_new]
    size = k_cache.shape[1]
    if table is None:
        if new and int(positions.max()) >= size:
            raise Error(f"attention_with_kvcache: appending {new} rows after cache_seqlens "
                        f"{seqlens.tolist()} needs {int(positions.max()) + 1} positions but "
                        f"k_cache holds {size}")
        rows = torch.arange(k.shape[0])[:, None].expand_as(positions)
        k_cache[rows, positions] = k
        v_cache[rows, positions] = v
        return
    if new and int(positions.max()) >= table.shape[1] * size:
        raise Error(f"attention_with_kvcache: appending {new} rows after cache_seqlens "
                    f"{seqlens.tolist()} needs {int(positions.max()) + 1} positions but the "
                    f"block_table holds {table.shape[1]} blocks of {size}")
    blocks = table.to(torch.int64).gather(1, positions // size)
    if new and (bool((blocks < 0).any()) or bool((blocks >= k_cache.shape[0]).any())):
        raise Error(f"attention_with_kvcache: the block_table entries for the new rows "
                    f"{blocks.tolist()} must be blocks of k_cache [0, {k_cache.shape[0]})")
    k_cache[blocks, positions % size] = k
    v_cache[blocks, positions % size] = v


def _mask_and_mods(mask, mods, causal, window_size, softcap):
    """FlashAttention's window_size and softcap as maskattn components, on top of mask/mods."""
    try:
        left, right = (int(side) for side in window_size)
    except (TypeError, ValueError):
        raise Error(f"attention_with_kvcache: window_size must be two ints (left, right), -1 "
                    f"for an unbounded side, got {window_size!r}") from None
    if (left, right) != (-1, -1):
        window = _core.Mask().window(None if left < 0 else left, None if right < 0 else right)
        mask = window if mask is None else mask & window
    if softcap:
        if mods is not None:
            raise Error("attention_with_kvcache: give softcap either as softcap= or in mods, "
                        "not both")
        mods = _core.ScoreMods(softcap=float(softcap))
    return mask, mods


def _lengths_after(q, k_cache, k, cache_seqlens, paged):
    """(lengths before, lengths after appending k) as LongTensors [B]. More queries than
    positions are allowed: the first ones see no key under causal (FlashAttention's rule)."""
    before = _seqlens(cache_seqlens, q.shape[0], None if paged else k_cache.shape[1])
    return before, before + (0 if k is None else k.shape[1])


def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None,
                           block_table=None, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, return_softmax_lse=False, *,
                           mask=None, mods=None, threads=None, kernel="auto"):
    """FlashAttention's ``flash_attn_with_kvcache`` (same arguments, same meaning), on the CPU.

    q [B, Lq, Hq, D]; k_cache, v_cache [num_blocks, block_size, Hkv, D|Dv] with ``block_table``
    [B, max_blocks] (block_size a multiple of 16), else [B, L_cache, Hkv, D|Dv]; ``k``, ``v``
    [B, L_new, Hkv, D|Dv] are written into the caches at ``cache_seqlens`` (int or [B], the
    lengths before this call; required with a block table) first. Attention then runs over the
    first cache_seqlens + L_new positions of each sequence, the queries being its last Lq
    positions when ``causal`` (bottom-right). ``window_size`` (-1: unbounded), ``softcap``,
    ``softmax_scale`` as FlashAttention; ``mask``/``mods`` add maskattn components. Returns
    out [B, Lq, Hq, Dv] in q's dtype (and LSE [B, Hq, Lq] float32 with
    ``return_softmax_lse``). No gradient flows back (as in FlashAttention)."""
    paged = block_table is not None
    _check_tensors(q, k_cache, v_cache, k, v, paged)
    scale = check_mask_mods_scale(mask, mods, softmax_scale)
    mask, mods = _mask_and_mods(mask, mods, causal, window_size, softcap)
    before, after = _lengths_after(q, k_cache, k, cache_seqlens, paged)
    table = _block_table(block_table, q.shape[0]) if paged else None
    with torch.no_grad():
        if k is not None:
            _append(k_cache, v_cache, k.to(k_cache.dtype), v.to(v_cache.dtype), before, table)
        if not paged:
            return _attend_dense(q, k_cache, v_cache, after, causal, mask, mods, scale,
                                 return_softmax_lse, threads, kernel)
        return _attend(q, k_cache, v_cache, table, after, causal, mask, mods, scale,
                       return_softmax_lse, threads, kernel)


def _as_pages(k_cache, v_cache):
    """[B, L_cache, Hkv, D] caches as pools of blocks of 16 positions, sequence b in blocks
    [b·n, (b + 1)·n) of the table: a view when L_cache is a multiple of 16 and the batch axis is
    contiguous, else a copy (padded with zeros, which no sequence reads)."""
    batch, length = k_cache.shape[:2]
    columns = max(-(-length // 16), 1)
    pad = columns * 16 - length

    def pages(x):
        if pad:
            x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad))
        if x.stride(3) != 1:  # pages hold contiguous rows
            x = x.contiguous()
        return x.reshape(batch * columns, 16, x.shape[2], x.shape[3])

    table = torch.arange(batch * columns, dtype=torch.int32).reshape(batch, columns)
    return pages(k_cache), pages(v_cache), table


def _attend_dense(q, k_cache, v_cache, lengths, causal, mask, mods, scale, return_lse, threads,
                  kernel):
    """Without a block table each sequence's cache is one row of k_cache: plain attention on
    the [B, longest, Hkv, D] view, its queries placed by the same mask the paged call builds. A
    draft tree over sequences of different lengths is each sequence's own, at its own end
    (docs/semantics.md §18), which one call over [B, longest] cannot place: that call reads the
    cache as pages instead, as the paged form does."""
    if mask is not None and lengths.numel() and bool((lengths != lengths[0]).any()) \
            and _core.mask_has_tree(mask):
        k_pages, v_pages, table = _as_pages(k_cache, v_cache)
        return _attend(q, k_pages, v_pages, table, lengths, causal, mask, mods, scale, return_lse,
                       threads, kernel)
    longest = int(lengths.max()) if lengths.numel() else 0
    # query_lengths too: each entry's queries align at its own length, not at the longest.
    placed = _core.Mask().key_lengths(lengths.tolist()) & _core.Mask().query_lengths(
        [q.shape[1]] * q.shape[0])
    if causal:
        placed = _core.Mask().causal() & placed
    if mask is not None:
        placed = placed & mask
    return _attention(q, k_cache[:, :longest], v_cache[:, :longest], placed, mods, scale=scale,
                      layout="blhd", threads=threads, return_lse=return_lse, kernel=kernel)


def _attend(q, k_cache, v_cache, table, lengths, causal, mask, mods, scale, return_lse, threads,
            kernel):
    batch, q_len, heads, _ = q.shape
    out = torch.empty((batch, q_len, heads, v_cache.shape[3]), dtype=q.dtype)
    lse = torch.empty((batch, heads, q_len), dtype=torch.float32) if return_lse else None
    qv, element = core_view(q.permute(0, 2, 1, 3), "q", "")
    kc, _ = core_view(k_cache, "k_cache", "")
    vc, _ = core_view(v_cache, "v_cache", "")
    ov, _ = core_view(out.permute(0, 2, 1, 3), "out", "")
    lv = None if lse is None else core_view(lse, "lse", "")[0]
    _core.attention_paged_tensors(
        qv, kc, vc, table.numpy(), lengths.tolist(), bool(causal), ov, [], mask, mods, lv, scale,
        threads_arg(threads), kernel, element)
    return (out, lse) if return_lse else out
