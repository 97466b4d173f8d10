"""Attention dropout's arguments: checking them, and where a seed comes from when none is given.

maskattn drops each allowed pair (b, h, q, kv) with probability ``dropout_p`` as a pure function
of (seed, offset, b, h, q, kv) (docs/semantics.md §17). The seed therefore *is*
the dropout: a forward, its backward and ``attention_weights`` given the same seed and offset
drop the same pairs, on any thread count and with either kernel. Nothing else is stored.

Where a missing seed comes from:

* torch tensors: one draw from PyTorch's default CPU generator, so that ``torch.manual_seed``
  reproduces a run, as it does for ``torch.nn.functional.dropout``. The draw is
  ``torch.randint(0, 2**63 - 1, ())``, not ``Tensor.random_()``: both take one 64-bit word from
  the generator, but only the out-of-place ``randint`` can be traced by ``torch.compile``, and the
  compiled and eager calls must draw alike (with the ``aot_eager`` backend they draw the same
  value; inductor substitutes its own generator, seeded from PyTorch's).
* NumPy arrays: none. NumPy has no generator that every program shares (``default_rng()`` makes
  a new one; the legacy global state is discouraged), and a seed drawn behind the caller's back
  could not be given to the backward, so ``dropout_p > 0`` needs ``dropout_seed=``.
* ``attention_backward``: none, for any input: it must regenerate its forward's pairs, so it
  takes the forward's seed and offset.

The offset separates calls that share a seed (the layers of a model, the steps of a loop); with a
fresh seed per call it stays 0.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from . import _core

Error = _core.Error

__all__ = ["Dropout", "NO_DROPOUT", "UNSEEDED_NO_DROPOUT", "backward_seed", "checked_dropout",
           "seed_for", "torch_seed", "torch_seed_tensor"]

# Seeds are the Philox key (64 bits); offsets one 32-bit word of its counter (E135 above that).
_SEED_LIMIT = 2**64
_OFFSET_LIMIT = 2**32


class Dropout(NamedTuple):
    """Resolved dropout of one call: ``p`` in [0, 1], the seed (None until one is chosen) and the
    offset, in the order the bindings take them."""

    p: float = 0.0
    seed: "int | None" = 0
    offset: int = 0

    def core_args(self) -> dict:
        """The keyword arguments of the bindings (seed 0 stands for "none" when p is 0)."""
        return dict(dropout_p=self.p, dropout_seed=self.seed or 0, dropout_offset=self.offset)


NO_DROPOUT = Dropout()


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


# What checked_dropout makes of the defaults (no dropout, no seed), made once: nearly every call
# gives them, and a decoding step is a few µs in all.
UNSEEDED_NO_DROPOUT = Dropout(0.0, None, 0)


def checked_dropout(dropout_p, dropout_seed, dropout_offset, p_name="dropout_p") -> Dropout:
    """The three keyword arguments checked (P80, P81); the seed stays None when not given.
    ``p_name`` is what the caller calls the rate (transformers' ``dropout``)."""
    if (type(dropout_p) is float and dropout_p == 0.0 and dropout_seed is None
            and type(dropout_offset) is int and dropout_offset == 0):
        return UNSEEDED_NO_DROPOUT  # the defaults, without the isinstance checks below
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or not (
        0.0 <= float(dropout_p) <= 1.0
    ):
        raise Error(
            f"{p_name} must be a real number in [0, 1] (the probability of dropping a pair), "
            f"got {dropout_p!r}"
        )
    if dropout_seed is not None and not (_is_int(dropout_seed)
                                         and 0 <= int(dropout_seed) < _SEED_LIMIT):
        raise Error(f"dropout_seed must be None or an int in [0, 2**64), got {dropout_seed!r}")
    if not (_is_int(dropout_offset) and 0 <= int(dropout_offset) < _OFFSET_LIMIT):
        raise Error(
            f"dropout_offset must be an int in [0, 2**32) (it separates calls sharing a seed), "
            f"got {dropout_offset!r}"
        )
    seed = None if dropout_seed is None else int(dropout_seed)
    return Dropout(float(dropout_p), seed, int(dropout_offset))


def torch_seed_tensor():
    """A 0-d int64 tensor in [0, 2**63 - 1) from PyTorch's default CPU generator (traceable)."""
    import torch  # noqa: PLC0415 - only torch callers get here; the package needs only NumPy

    return torch.randint(0, 2**63 - 1, (), dtype=torch.int64)


def torch_seed() -> int:
    """A seed from PyTorch's default CPU generator, as a Python int."""
    return int(torch_seed_tensor().item())


def seed_for(dropout: Dropout, is_torch_input: bool, where: str) -> Dropout:
    """``dropout`` with its seed chosen: the caller's, else (p > 0, torch inputs) one drawn from
    PyTorch's generator; NumPy inputs with p > 0 and no seed are P82."""
    if dropout.seed is not None or dropout.p == 0.0:
        return dropout
    if not is_torch_input:
        raise Error(
            f"{where}: dropout_p={dropout.p} needs dropout_seed= (an int) for NumPy arrays: "
            f"maskattn draws a seed only from PyTorch's generator, for torch tensors. Give the "
            f"same dropout_seed and dropout_offset to attention_backward and attention_weights "
            f"to regenerate the same dropped pairs"
        )
    return dropout._replace(seed=torch_seed())


def backward_seed(dropout: Dropout, function: str = "attention_backward") -> Dropout:
    """The backward's dropout (and gradcheck's): with p > 0 the forward's seed must be given
    (P82)."""
    if dropout.seed is None and dropout.p > 0.0:
        raise Error(
            f"{function}: dropout_p={dropout.p} needs the forward's dropout_seed (and "
            f"dropout_offset): the backward regenerates the forward's dropped pairs from them"
        )
    return dropout
