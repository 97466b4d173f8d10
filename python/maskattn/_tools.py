"""Debugging and data tools: the leakage audit, the health report, heatmaps, tokens and batches.

The C++ library does all the work (``include/maskattn/{audit,health,heatmap,tokens}.h``); this
module gives it Python arguments and results:

* ``audit_mask`` and ``health_report`` return small report classes (``AuditReport``,
  ``HealthReport`` of ``HeadHealth``) with a readable ``repr`` and a ``summary()``, built from the
  plain values the core returns;
* the heatmap writers take what ``allowed_pairs`` and ``attention_weights`` return (NumPy arrays or
  CPU tensors) and check shapes and label counts before drawing, so a mistake names the argument;
* ``Vocabulary``, ``TokenBatch``, ``PatchMasking`` and ``cross_attention``/``image_text`` are the
  C++ classes and functions themselves (``_core``); ``collate``, ``mae_patch_masking`` and
  ``mlm_masking`` only check their Python arguments first.

Every invalid argument raises :class:`maskattn.Error` (docs/errors.md, rows P50–P59).
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, fields

import numpy as np

from . import _core
from ._api import allowed_pairs, input_views
from ._arrays import Error, is_torch

PAD_ID = _core.PAD_ID
UNK_ID = _core.UNK_ID
BOS_ID = _core.BOS_ID
EOS_ID = _core.EOS_ID
SEP_ID = _core.SEP_ID
CLS_ID = _core.CLS_ID
MASK_ID = _core.MASK_ID

Vocabulary = _core.Vocabulary
TokenBatch = _core.TokenBatch
PatchMasking = _core.PatchMasking
cross_attention = _core.cross_attention
image_text = _core.image_text

__all__ = [
    "AuditReport",
    "HeadHealth",
    "HealthReport",
    "audit_mask",
    "health_report",
    "heatmap_svg",
    "write_heatmap",
    "write_mask_heatmap",
    "Vocabulary",
    "TokenBatch",
    "PatchMasking",
    "PAD_ID",
    "UNK_ID",
    "BOS_ID",
    "EOS_ID",
    "SEP_ID",
    "CLS_ID",
    "MASK_ID",
    "collate",
    "cross_attention",
    "image_text",
    "mae_patch_masking",
    "mlm_masking",
]

# How many pairs a summary lists per kind before "…".
_SUMMARY_PAIRS = 5

_AUDIT_DTYPES = {
    "float32": "f32",
    "f32": "f32",
    "float": "f32",
    "float16": "f16",
    "f16": "f16",
    "half": "f16",
    "bfloat16": "bf16",
    "bf16": "bf16",
}


def _dtype_tag(dtype) -> str:
    """"float32"/"float16"/"bfloat16" (or a NumPy, ml_dtypes or torch dtype) → the core's tag."""
    key = dtype if isinstance(dtype, str) else (
        getattr(dtype, "name", None) or str(dtype).replace("torch.", "")
    )
    if key not in _AUDIT_DTYPES:
        raise Error(f'audit_mask: dtype must be "float32", "float16" or "bfloat16", got {dtype!r}')
    return _AUDIT_DTYPES[key]


def checked_seed(seed, where: str) -> int:
    """A seed for the C++ draws (an int in [0, 2**64)), refused with maskattn.Error naming
    ``where`` otherwise; the layout builders check theirs with it too."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not (
        0 <= int(seed) < 2**64
    ):
        raise Error(f"{where}: seed must be an int in [0, 2**64), got {seed!r}")
    return int(seed)


def _pairs_text(name: str, pairs) -> str:
    shown = ", ".join(str(p) for p in pairs[:_SUMMARY_PAIRS])
    more = f", … ({len(pairs) - _SUMMARY_PAIRS} more)" if len(pairs) > _SUMMARY_PAIRS else ""
    return f"  {name}: {len(pairs)}" + (f" — {shown}{more}" if pairs else "")


class AuditReport:
    """What :func:`audit_mask` measured.

    ``allowed``, ``expected`` (None without an expected mask) and ``influence`` are uint8 NumPy
    arrays [B, Hq, Lq, Lk]; ``influence`` is 1 where perturbing key/value j changed output i.
    Pair lists hold (b, h, i, j) tuples: ``kernel_leaks`` (hidden by the mask yet influential: a
    kernel bug), ``leaks`` (allowed but not expected), ``blind_spots`` (expected but hidden),
    ``silent_pairs`` (allowed, yet without influence: an underflowed weight). ``empty_rows`` holds
    (b, h, i): queries that see no key. ``passed``: no kernel leak, no leak, no blind spot.
    """

    def __init__(self, values: dict):
        self.shape = tuple(values["shape"])
        self.passed = bool(values["passed"])
        self.has_expected = bool(values["has_expected"])
        self.allowed = values["allowed"]
        self.expected = values["expected"]
        self.influence = values["influence"]
        self.kernel_leaks = values["kernel_leaks"]
        self.leaks = values["leaks"]
        self.blind_spots = values["blind_spots"]
        self.silent_pairs = values["silent_pairs"]
        self.empty_rows = values["empty_rows"]
        self.allowed_count = int(values["allowed_count"])
        self.hidden_count = int(values["hidden_count"])

    def __repr__(self) -> str:
        return (
            f"AuditReport(passed={self.passed}, shape={self.shape}, "
            f"kernel_leaks={len(self.kernel_leaks)}, leaks={len(self.leaks)}, "
            f"blind_spots={len(self.blind_spots)}, silent_pairs={len(self.silent_pairs)}, "
            f"empty_rows={len(self.empty_rows)})"
        )

    def summary(self) -> str:
        """A few lines for a person: the verdict, the counts and the first pairs of each kind."""
        verdict = "PASSED" if self.passed else "FAILED"
        lines = [
            f"mask audit of [B,Hq,Lq,Lk] = {list(self.shape)}: {verdict} "
            f"({self.allowed_count} allowed, {self.hidden_count} hidden pairs)",
            _pairs_text("kernel leaks (hidden but influential)", self.kernel_leaks),
        ]
        if self.has_expected:
            lines.append(_pairs_text("leaks (allowed, not expected)", self.leaks))
            lines.append(_pairs_text("blind spots (expected, hidden)", self.blind_spots))
        else:
            lines.append("  (no expected mask: leaks and blind spots not checked)")
        lines.append(_pairs_text("empty rows (b, h, i): output 0", self.empty_rows))
        lines.append(_pairs_text("silent pairs (allowed, no influence)", self.silent_pairs))
        return "\n".join(lines)


def audit_mask(mask, mods=None, expected=None, *, batch=1, q_heads=1, kv_heads=None, q_len,
               k_len=None, head_dim=8, dtype="float32", kernel="auto", seed=1) -> AuditReport:
    """Does ``mask`` hide what you think it hides, and does the kernel honour it?

    Runs the real kernel on seeded random inputs of [B, Hq, Lq, head_dim] (kv heads ``kv_heads``,
    default ``q_heads``), perturbs each key and value in turn and records which outputs change;
    compares that with the mask and with ``expected`` (another :class:`Mask`, optional). Costs one
    attention call per key: keep the sizes small (each in [1, 4096], at most 2**24 pairs).
    """
    k_len = q_len if k_len is None else k_len
    kv_heads = q_heads if kv_heads is None else kv_heads
    values = _core.audit_mask(
        mask, mods, expected, batch, q_heads, kv_heads, q_len, k_len, head_dim, _dtype_tag(dtype),
        kernel, checked_seed(seed, "audit_mask"),
    )
    return AuditReport(values)


@dataclass(frozen=True)
class HeadHealth:
    """One (b, h) head: scores scale·q·k over allowed pairs (min/max), the largest final logit,
    the mean entropy of its rows' weights (nats, rows with keys), the fraction of hidden pairs,
    rows with no key, and NaN/Inf counts in the final scores and outputs. Min/max/logit are NaN
    when no pair is allowed."""

    b: int
    h: int
    score_min: float
    score_max: float
    max_logit: float
    mean_entropy: float
    hidden_fraction: float
    empty_rows: int
    nan_count: int
    inf_count: int


@dataclass(frozen=True)
class HealthReport:
    """Per-head statistics (``heads``, at most ``max_heads``) and warnings about the mask's and
    bias's finite values and about NaN/Inf."""

    heads: list
    warnings: list

    def summary(self) -> str:
        """A table of the heads, then the warnings."""
        lines = ["   b   h   score min   score max   max logit   entropy  hidden  empty  nan  inf"]
        for x in self.heads:
            lines.append(
                f"{x.b:4d}{x.h:4d}{x.score_min:12.4g}{x.score_max:12.4g}{x.max_logit:12.4g}"
                f"{x.mean_entropy:10.4f}{x.hidden_fraction:8.3f}{x.empty_rows:7d}"
                f"{x.nan_count:5d}{x.inf_count:5d}"
            )
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def health_report(q, k, v, mask=None, mods=None, *, scale=None, layout="bhld", dtype=None,
                  max_heads=64) -> HealthReport:
    """Per-head numbers of one attention problem (q, k, v as :func:`attention` takes them) and
    warnings about additive masks whose finite values do not hide. A debugging tool: it
    materialises the [B, Hq, Lq, Lk] scores and weights."""
    if isinstance(max_heads, bool) or not isinstance(max_heads, (int, np.integer)) or max_heads < 1:
        raise Error(f"health_report: max_heads must be an int >= 1, got {max_heads!r}")
    (qb, kb, vb), element = input_views((q, k, v), ("q", "k", "v"), dtype, layout)
    values = _core.health_report(qb, kb, vb, mask, mods, scale, int(max_heads), element)
    names = [f.name for f in fields(HeadHealth)]
    heads = [HeadHealth(**{name: head[name] for name in names}) for head in values["heads"]]
    return HealthReport(heads=heads, warnings=list(values["warnings"]))


def _host(x):
    """A torch tensor as a NumPy array (token ids go to the core as NumPy); anything else as is."""
    return x.detach().cpu().numpy() if is_torch(x) else x


def _numpy(x, name: str) -> np.ndarray:
    """A NumPy view (or copy) of an array, nested list or CPU tensor, for the heatmaps; the core
    converts the values (allowed to 0/1, weights to float32)."""
    try:
        return np.asarray(_host(x))
    except (TypeError, ValueError) as error:
        raise Error(f"heatmap: {name} cannot be read as an array: {error}") from None


def _shape_text(shape) -> str:
    return "[" + ",".join(str(n) for n in shape) + "]"  # as the core writes shapes: [2,4,3,5]


def _labels(labels, count: int, name: str, axis: str):
    if labels is None:
        return []
    if isinstance(labels, (str, bytes)):
        raise Error(f"heatmap: {name} is a string; give one label per {axis} (a list of str)")
    labels = [str(label) for label in labels]
    if len(labels) != count:
        raise Error(f"heatmap: {name} has {len(labels)} labels but the panels have {count} {axis}s")
    return labels


def _heatmap_arguments(allowed, weights, row_labels, col_labels):
    """allowed as [B, H, Lq, Lk] uint8, weights float32 of that shape or None, and the labels."""
    allowed = _numpy(allowed, "allowed")
    if allowed.ndim == 2:
        allowed = allowed[None, None]
    if allowed.ndim != 4:
        raise Error(
            f"heatmap: allowed has shape {_shape_text(allowed.shape)}; expected [B,H,Lq,Lk] "
            "(as from allowed_pairs) or one panel [Lq,Lk]"
        )
    if weights is not None:
        weights = _numpy(weights, "weights")
        if weights.ndim == 2:
            weights = weights[None, None]
        if weights.shape != allowed.shape:
            raise Error(
                f"heatmap: weights have shape {_shape_text(weights.shape)} but allowed has "
                f"{_shape_text(allowed.shape)}; give both for the same [B,H,Lq,Lk]"
            )
    rows = _labels(row_labels, allowed.shape[2], "row_labels", "row")
    cols = _labels(col_labels, allowed.shape[3], "col_labels", "column")
    return allowed, weights, rows, cols


def heatmap_svg(allowed, weights=None, *, row_labels=None, col_labels=None, max_panels=16) -> str:
    """An SVG heatmap of a mask (``allowed`` [B, H, Lq, Lk], 1 = allowed, as from
    :func:`allowed_pairs`) or of attention weights (``weights`` of the same shape, as from
    :func:`attention_weights`): one panel per (b, h), at most ``max_panels``; hidden pairs hatched
    grey. Labels: one string per query row / key column (default: indices)."""
    allowed, weights, rows, cols = _heatmap_arguments(allowed, weights, row_labels, col_labels)
    return _core.heatmap_svg(allowed, weights, rows, cols, max_panels)


def write_heatmap(path, allowed, weights=None, *, row_labels=None, col_labels=None,
                  max_panels=16) -> None:
    """:func:`heatmap_svg`'s picture written to ``path``: PNG or SVG by its extension."""
    if not isinstance(path, (str, os.PathLike)):
        raise Error(f"write_heatmap: path must be a str or os.PathLike, got {type(path).__name__}")
    allowed, weights, rows, cols = _heatmap_arguments(allowed, weights, row_labels, col_labels)
    _core.write_heatmap(os.fspath(path), allowed, weights, rows, cols, max_panels)


def write_mask_heatmap(path, mask, batch=1, q_heads=1, q_len=None, k_len=None, *, row_labels=None,
                       col_labels=None, max_panels=16) -> None:
    """The heatmap of ``mask`` evaluated for [batch, q_heads, q_len, k_len] (k_len defaults to
    q_len) written to ``path`` (.png or .svg)."""
    pairs = allowed_pairs(mask, batch, q_heads, q_len, k_len)
    write_heatmap(path, pairs, row_labels=row_labels, col_labels=col_labels,
                  max_panels=max_panels)


def collate(sequences, side="right", min_length=0) -> TokenBatch:
    """Pads token id sequences (lists, NumPy arrays or tensors) into a :class:`TokenBatch` of
    length max(longest sequence, ``min_length``): ``side="right"`` puts <pad> after the tokens
    (training, encoders), ``"left"`` before them (batched generation)."""
    if not isinstance(sequences, (str, bytes)):  # (the core rejects a string with a message)
        sequences = [_host(sequence) for sequence in sequences]
        for n, sequence in enumerate(sequences):
            if isinstance(sequence, numbers.Number) or getattr(sequence, "ndim", None) == 0:
                raise Error(
                    f"collate: sequences[{n}] is a single id ({sequence!r}); sequences is a list "
                    "of sequences (collate([ids]) for one)"
                )
    return _core.collate(sequences, side, min_length)


def mae_patch_masking(patches, mask_ratio, seed) -> PatchMasking:
    """MAE masking: a seeded random round(patches·(1 − mask_ratio)) of ``patches`` positions are
    kept (``keep`` [patches] 0/1, ``kept`` sorted indices); ``mask()`` hides the others as keys
    and as queries."""
    return _core.mae_patch_masking(patches, mask_ratio, checked_seed(seed, "mae_patch_masking"))


def mlm_masking(ids, vocabulary_size, seed, rate=0.15):
    """BERT-style MLM masking of ``ids`` [B, L] (or a :class:`TokenBatch`): each real, non-special
    token is selected with probability ``rate``; a selected token becomes MASK_ID 80 % of the
    time, a random word 10 %, itself 10 %. Returns (inputs, labels), int64, labels −100 where not
    selected; torch tensors for a torch input, NumPy arrays otherwise."""
    if isinstance(ids, TokenBatch):
        ids = ids.ids
    as_torch = is_torch(ids)
    source = _host(ids)
    inputs, labels = _core.mlm_masking(source, vocabulary_size, checked_seed(seed, "mlm_masking"),
                                       rate)
    if as_torch:
        import torch

        return torch.from_numpy(inputs), torch.from_numpy(labels)
    return inputs, labels
