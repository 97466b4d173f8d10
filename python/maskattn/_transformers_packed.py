"""Packed (padding-free) batches in the Hugging Face backend: attention_varlen instead of one
long masked sequence.

transformers trains "padding-free" by concatenating documents into one row (or a few rows) with
no pad tokens (``DataCollatorWithFlattening``). Its flash-attention path then calls flash-attn's
varlen kernel, from one of two sources, in this order (``_flash_attention_forward``):

* the kwargs ``cu_seq_lens_q``, ``cu_seq_lens_k``, ``max_length_q``, ``max_length_k`` that the
  collator adds with ``return_flash_attn_kwargs=True`` and the model passes down to every
  attention call (they reach an ``AttentionInterface`` function in ``**kwargs``);
* otherwise ``position_ids`` that restart inside a row, which ``masking_utils`` also turns into a
  packed-sequence mask function (``packed_sequence_mask_function``): the backend's
  :class:`PreparedMask` then holds the documents as segment ids.

The backend does the same: with the four kwargs, or with segment ids in the prepared mask, the
documents are the sequences of one ``maskattn.torch.attention_varlen`` call over the flattened
``[B·L, H, D]`` tokens, and the rest of the prepared mask (causal, a sliding window) is each
document's own mask. Each document then costs its own Lᵢ² instead of a share of the pack's L²
(no tile straddling two documents), and its rows are bit for bit those of the document alone.
Where the prepared mask holds anything else (key padding, chunks, bidirectional blocks), or the
call needs what varlen cannot give (the attention weights, an additive bias, a KV cache), the
backend keeps its masked call, which computes the same pairs.

Four kwargs given only in part are an error (P86): flash attention would silently ignore them
and, without position ids, attend across the documents.
"""

from __future__ import annotations

import torch

from ._core import Error, Mask
from ._transformers_parts import Remapped, Segments, Window

_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")

__all__ = ["packed_call"]


def _given_offsets(kwargs):
    """The four flash-attention kwargs, all or none (P86)."""
    values = [kwargs.get(name) for name in _KWARGS]
    given = [name for name, value in zip(_KWARGS, values) if value is not None]
    if not given:
        return None
    if len(given) != len(_KWARGS):
        missing = [name for name in _KWARGS if name not in given]
        raise Error(
            f"maskattn attention backend: packed-batch kwargs {given} are given without "
            f"{missing}; give all four (DataCollatorWithFlattening(return_flash_attn_kwargs=True) "
            f"does) or none (position_ids restarting at each document also mark a packed batch)")
    return tuple(values)


def _offsets_of_segments(ids: torch.Tensor):
    """Documents of segment ids [B, L] (transformers' packed_sequence_mask), flattened row by
    row: a document starts at every row's start and wherever the id changes."""
    ids = ids.detach().to("cpu", torch.int64)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    first = starts.reshape(-1).nonzero().reshape(-1)
    cu = torch.cat([first, torch.tensor([ids.numel()])]).to(torch.int32)
    longest = int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0
    return cu, cu, longest, longest


def _document_mask(prepared, windows_of):
    """The mask of one document: the prepared mask's causal and window pieces, or None when it
    holds a piece varlen does not carry (key padding, chunks, spans)."""
    parts = prepared.parts
    if parts is None or not all(isinstance(p, (Window, Segments, Remapped)) for p in parts):
        return None
    mask = Mask()
    length = prepared.q_len
    if not windows_of(mask, [p for p in parts if isinstance(p, Window)], False,
                      (length, length, 0, 0)):
        return None
    return mask


def packed_call(query, attention_mask, bias, kwargs, causal, prepared_type, windows_of):
    """(cu_seqlens_q, cu_seqlens_k, max_q, max_k, document mask) when this attention call is a
    packed batch that varlen computes, else None. ``query`` is [B, H, L, D]; ``causal`` is the
    module's rule when no mask creation reached the call."""
    offsets = _given_offsets(kwargs)
    if bias is not None or kwargs.get("output_attentions"):
        return None
    if attention_mask is None:
        if offsets is None:
            return None
        return (*offsets, Mask().causal() if causal else Mask())
    if not isinstance(attention_mask, prepared_type) or attention_mask.parts is None:
        return None
    if attention_mask.offsets != (0, 0) or attention_mask.q_len != attention_mask.kv_len:
        return None  # a KV cache: queries are not their documents' whole rows
    segments = [p for p in attention_mask.parts if isinstance(p, Segments)]
    if offsets is None:
        if len(segments) != 1 or segments[0].ids.shape[1] != query.shape[2]:
            return None
        offsets = _offsets_of_segments(segments[0].ids)
    mask = _document_mask(attention_mask, windows_of)
    return None if mask is None else (*offsets, mask)
