"""maskattn: masked scaled-dot-product attention on the CPU.

NumPy-level API (this module; needs only NumPy)::

    import maskattn as ma
    mask = ma.Mask().causal().key_lengths([5, 3])
    out, lse = ma.attention(q, k, v, mask=mask, return_lse=True)

PyTorch drop-ins with autograd: ``maskattn.torch``; the Hugging Face attention backend:
``maskattn.transformers``. docs/python.md is the guide.
"""

from ._core import Error, Mask, ScoreMods, UNBOUNDED
from ._api import (
    allowed_pairs,
    attention,
    attention_backward,
    attention_scores,
    attention_weights,
    block_map,
    cpu_info,
    gradcheck,
    merge_partials,
)

try:
    from importlib.metadata import version as _version

    __version__ = _version("maskattn")
except Exception:  # not installed (a build tree on PYTHONPATH)
    __version__ = "0+unknown"

__all__ = [
    "Error",
    "Mask",
    "ScoreMods",
    "UNBOUNDED",
    "allowed_pairs",
    "attention",
    "attention_backward",
    "attention_scores",
    "attention_weights",
    "block_map",
    "cpu_info",
    "gradcheck",
    "merge_partials",
]
