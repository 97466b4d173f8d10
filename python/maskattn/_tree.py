"""Tree speculative decoding: the helpers around ``Mask.tree`` (maskattn/tree.h).

One step: the target model appends the draft's keys and values to its cache, computes the T
draft queries in one call with ``Mask().tree(parents)`` at the positions ``tree_position_ids``
gives, picks the deepest draft token its own predictions agree with, and keeps that token's
``tree_path`` in the cache with ``accept_tree_path``. docs/semantics.md §3 ("Draft trees") and
docs/python.md ("Speculative decoding with a draft tree") describe them.
"""

from __future__ import annotations

import numbers
import sys

import numpy as np

from . import _core
from ._arrays import Error, core_view, is_torch

__all__ = ["tree_position_ids", "tree_path", "accept_tree_path"]


def _int_arg(function: str, name: str, value) -> int:
    """An int (Python, NumPy or 0-d PyTorch integer), or maskattn.Error (P88)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if not (is_torch(value) and value.ndim == 0 and not value.is_floating_point()
                and str(value.dtype) != "torch.bool"):
            raise Error(f"{function}: {name} must be an int, got {value!r}")
    return int(value)


def tree_position_ids(parents, prefix_length):
    """Each draft token's depth in its tree (a root is 0) plus ``prefix_length``: the position ids
    of the draft for rotary embeddings, shaped like ``parents`` ([T] or [B, T]), int64, in the
    framework of ``parents`` (a torch tensor for a tensor, else a NumPy array). ``prefix_length``
    is the number of positions cached before the draft; with a left-padded batch subtract each
    sequence's start, as its positions count from its first real token."""
    prefix_length = _int_arg("tree_position_ids", "prefix_length", prefix_length)
    positions = _core.tree_position_ids(parents, prefix_length)
    if is_torch(parents):
        return sys.modules["torch"].from_numpy(positions)
    return positions


def tree_path(parents, node, b=0):
    """The draft indices from a root down to ``node`` (inclusive), as a list of ints, in the tree
    of sequence ``b`` (any ``b`` for [T] parents): the accepted path when ``node`` is the deepest
    draft token the target model agrees with."""
    node = _int_arg("tree_path", "node", node)
    b = _int_arg("tree_path", "b", b)
    return list(_core.tree_path(parents, node, b))


def _cache_view(x, name: str):
    """``x`` as the core writes it in place, with its element tag (P87 when it cannot be)."""
    if not (is_torch(x) or isinstance(x, np.ndarray) or hasattr(x, "__dlpack__")):
        raise Error(
            f"accept_tree_path: {name} must be the cache itself, an array to move rows in "
            f"(NumPy, PyTorch or DLPack), got {type(x).__name__}"
        )
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        raise Error(
            f"accept_tree_path: {name} (shape {list(x.shape)}) is read-only; the accepted rows "
            "are moved in place"
        )
    if getattr(x, "ndim", 4) != 4:
        raise Error(
            f"accept_tree_path: {name} has shape {list(x.shape)}; a cache is [B, H, L, D] "
            "(move the sequence axis to axis 2, e.g. with .transpose)"
        )
    return core_view(x, f"accept_tree_path: {name}", "")


def accept_tree_path(k, v, parents, path, *, length=None):
    """Keeps the accepted path of a verified draft in a KV cache held as arrays: ``k`` [B, H, L, D]
    and ``v`` [B, H, L, Dv] (NumPy arrays or CPU tensors, any strides and float dtype), whose rows
    ``[length - T, length)`` are the draft (``length`` defaults to L: the arrays are the filled
    cache). ``path`` is [A] (every sequence) or [B, A] (the same count A for every sequence):
    draft indices from a root down the tree (``tree_path``). The accepted rows move, in place, to
    ``[length - T, length - T + A)``; returns the new length (rows after it are stale: slice them
    off, e.g. ``k[:, :, :new_length]``). Everything is checked before a row moves."""
    k_view, k_element = _cache_view(k, "k")
    v_view, v_element = _cache_view(v, "v")
    length = k.shape[2] if length is None else _int_arg("accept_tree_path", "length", length)
    return _core.accept_tree_path(k_view, k_element, v_view, v_element, length, parents, path)
