"""maskattn: masked scaled-dot-product attention on the CPU.

NumPy-level API (this module; needs only NumPy)::

    import maskattn as ma
    mask = ma.Mask().causal().key_lengths([5, 3])
    out, lse = ma.attention(q, k, v, mask=mask, return_lse=True)

PyTorch drop-ins with autograd: ``maskattn.torch``; the Hugging Face attention backend:
``maskattn.transformers``. docs/python.md is the guide.
"""

from ._core import Error, Mask, Program, ScoreMods, UNBOUNDED, gpt_loss_and_gradients
from ._api import (
    allowed_pairs,
    any_allowed,
    attention,
    attention_backward,
    attention_scores,
    attention_weights,
    block_map,
    cpu_info,
    gradcheck,
    merge_partials,
)
from ._layouts import bigbird_layout, fixed_layout, strided_layout
from ._paged import KV_FORMATS, PagedKVCache, attention_paged
from ._tree import accept_tree_path, tree_path, tree_position_ids
from ._varlen import attention_varlen, attention_varlen_backward

# The debugging and data tools (audit, health report, heatmaps, tokens and batches).
from ._tools import (
    AuditReport,
    HeadHealth,
    HealthReport,
    audit_mask,
    health_report,
    heatmap_svg,
    write_heatmap,
    write_mask_heatmap,
    Vocabulary,
    TokenBatch,
    PatchMasking,
    PAD_ID,
    UNK_ID,
    BOS_ID,
    EOS_ID,
    SEP_ID,
    CLS_ID,
    MASK_ID,
    collate,
    cross_attention,
    image_text,
    mae_patch_masking,
    mlm_masking,
)

from . import _tools  # noqa: E402  (its names are imported above)

try:
    from importlib.metadata import version as _version

    __version__ = _version("maskattn")
except Exception:  # not installed (a build tree on PYTHONPATH)
    __version__ = "0+unknown"

__all__ = [
    "Error",
    "Mask",
    "Program",
    "ScoreMods",
    "UNBOUNDED",
    "allowed_pairs",
    "any_allowed",
    "attention",
    "attention_backward",
    "attention_scores",
    "attention_weights",
    "block_map",
    "cpu_info",
    "gradcheck",
    "merge_partials",
    "attention_varlen",
    "attention_varlen_backward",
    "bigbird_layout",
    "strided_layout",
    "fixed_layout",
    "gpt_loss_and_gradients",
    "KV_FORMATS",
    "PagedKVCache",
    "attention_paged",
    "tree_position_ids",
    "tree_path",
    "accept_tree_path",
]
__all__ += _tools.__all__
