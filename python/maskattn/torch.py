"""maskattn for PyTorch: drop-ins for ``torch.nn.functional.scaled_dot_product_attention`` and
``torch.nn.attention.flex_attention``, with autograd through maskattn's CPU backward.

    import maskattn.torch as mt
    out = mt.attention(q, k, v, mask=maskattn.Mask().causal())      # maskattn's own call
    out = mt.scaled_dot_product_attention(q, k, v, attn_mask=m)     # SDPA's semantics

Every function is autograd-aware (a ``torch.autograd.Function`` whose backward is
``maskattn.attention_backward``, saving only the output and the LSE), returns tensors in the
query's dtype and layout, and gives 0 — never NaN — for a row with no allowed key.
docs/python.md is the guide; this module only gathers the public names.
"""

from __future__ import annotations

from . import _torch_compile  # noqa: F401  (registers the maskattn::sdpa custom ops)
from ._torch_autograd import ScoreMods, attention
from ._torch_flex import BlockMask, create_block_mask, flex_attention
from ._torch_kvcache import attention_with_kvcache
from ._torch_sdpa import scaled_dot_product_attention
from ._torch_varlen import attention_varlen, flash_attn_varlen_func

__all__ = [
    "BlockMask",
    "ScoreMods",
    "attention",
    "attention_varlen",
    "attention_with_kvcache",
    "create_block_mask",
    "flash_attn_varlen_func",
    "flex_attention",
    "scaled_dot_product_attention",
]
