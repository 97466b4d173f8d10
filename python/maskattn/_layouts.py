"""Builders of the common block-sparse layouts, for :meth:`Mask.block_sparse`.

Each returns a uint8 NumPy array of 0/1, [blocks, blocks] (or [heads, blocks, blocks] when
``heads > 0``), that ``Mask.block_sparse(layout, block)`` takes as it is: the block size is the
caller's. The C++ builders (maskattn/sparse_layouts.h) compute them and check the values (block
counts ≥ 1, an odd sliding width, …); this layer only refuses arguments of the wrong type with
maskattn.Error, where the binding would raise a TypeError listing its internal signature.
"""

from __future__ import annotations

import operator

import numpy as np

from . import _core
from ._tools import checked_seed

Error = _core.Error

__all__ = ["bigbird_layout", "strided_layout", "fixed_layout"]

_INT64 = range(-(2**63), 2**63)


def _int(value, where: str, name: str) -> int:
    """A Python, NumPy or PyTorch integer (operator.index takes them; bools and floats are
    refused, as Mask's own integer arguments refuse them)."""
    try:
        number = None if isinstance(value, (bool, np.bool_)) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number not in _INT64:
        raise Error(f"{where}: {name} must be an int, got {value!r}")
    return number


def _flag(value, where: str, name: str) -> bool:
    # A causal flag is True or False (NumPy's bool_ too), not 0, 2 or "yes".
    if not isinstance(value, (bool, np.bool_)):
        raise Error(f"{where}: {name} must be True or False, got {value!r}")
    return bool(value)


def bigbird_layout(blocks, *, sliding_blocks=3, global_blocks=2, random_blocks=3, seed=0, heads=0):
    """BigBird's layout (Zaheer et al. 2020, ITC; Hugging Face's ``block_sparse`` attention).

    Every block row sees the ``sliding_blocks`` blocks centred on itself (odd); the global
    blocks — the first ⌈global_blocks/2⌉ and the last ⌊global_blocks/2⌋, so 2 is Hugging Face's
    first and last block — see and are seen by every block; each other row sees
    ``random_blocks`` more blocks drawn without repetition from those it does not see yet (fewer
    when fewer remain).
    The draw is a fixed function of ``seed`` (and of the head: with ``heads > 0`` each head draws
    its own), the same on every machine; it is not Hugging Face's NumPy draw.
    """
    where = "bigbird_layout"
    return _core.bigbird_layout(
        _int(blocks, where, "blocks"), _int(sliding_blocks, where, "sliding_blocks"),
        _int(global_blocks, where, "global_blocks"), _int(random_blocks, where, "random_blocks"),
        checked_seed(seed, where), _int(heads, where, "heads"))


def strided_layout(blocks, local_blocks, stride, *, causal=True, heads=0):
    """The Sparse Transformer's strided pattern (Child et al. 2019) on blocks: row r sees the
    blocks c with |r − c| < ``local_blocks`` and every c with (r − c) mod ``stride`` == 0;
    ``causal`` keeps c ≤ r. Every head (``heads > 0``) gets the same pattern."""
    where = "strided_layout"
    return _core.strided_layout(
        _int(blocks, where, "blocks"), _int(local_blocks, where, "local_blocks"),
        _int(stride, where, "stride"), _flag(causal, where, "causal"), _int(heads, where, "heads"))


def fixed_layout(blocks, chunk_blocks, summary_blocks, *, causal=True, heads=0):
    """The Sparse Transformer's fixed pattern on blocks: row r sees the blocks of its own chunk of
    ``chunk_blocks`` blocks and the last ``summary_blocks`` blocks of every chunk (≤
    chunk_blocks); ``causal`` keeps c ≤ r. Every head (``heads > 0``) gets the same pattern."""
    where = "fixed_layout"
    return _core.fixed_layout(
        _int(blocks, where, "blocks"), _int(chunk_blocks, where, "chunk_blocks"),
        _int(summary_blocks, where, "summary_blocks"), _flag(causal, where, "causal"),
        _int(heads, where, "heads"))
