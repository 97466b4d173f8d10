"""The pieces maskattn.transformers reads out of transformers' composed mask functions (one
dataclass per kind of piece), shared by the mask translation (transformers.py) and the packed
batches' varlen path (_transformers_packed.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Chunk", "KeyKeep", "Remapped", "Segments", "Spans", "Window"]


@dataclass(frozen=True)
class Window:
    """lo ≤ q − kv ≤ hi on absolute indices (±inf: unbounded)."""
    lo: float
    hi: float


@dataclass(frozen=True)
class Chunk:
    size: int
    left_padding: torch.Tensor  # [B]: chunks count from each sequence's first real token


@dataclass(frozen=True)
class KeyKeep:
    keep: torch.Tensor  # [B, ≥ kv_offset + Lk], indexed by absolute key index


@dataclass(frozen=True)
class Segments:
    ids: torch.Tensor  # [B, L], packed sequences (no cache, so Lq == Lk == L)


@dataclass(frozen=True)
class Spans:
    block_ids: torch.Tensor  # [B, ≥ L]: −1 = no block; a block is bidirectional inside


@dataclass(frozen=True)
class Remapped:
    """Positions restarted per packed sequence: harmless for windows (they see only q − kv,
    unchanged inside a sequence), provided the packed-sequence segments are also present."""
