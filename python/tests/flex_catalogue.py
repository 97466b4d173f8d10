"""attention-gym's catalogue of FlexAttention mask_mods and score_mods, written as its examples
write them (pytorch-labs/attention-gym: attn_gym/masks/*.py, attn_gym/mods/*.py, and the T5
relative-position buckets of Hugging Face's T5Attention), for the maskattn.torch tests.

Every entry is a *factory*: ``MASK_MODS[name]()`` returns the mask_mod, and
``SCORE_MODS[name](*tables)`` the score_mod closing over the learned tables given (created by
``SCORE_TABLES[name]()``), so that a test can build the same score_mod over float32 tables
(maskattn, whose tables get .grad) and over float64 copies (the reference).

Sizes: L = 130 queries and keys (three 64-wide tiles, the last partial), H = 4 heads, B = 2.
"""

from __future__ import annotations

import math

import torch
from torch.nn.attention.flex_attention import and_masks, or_masks

B, H, L = 2, 4, 130
CANVAS_W, CANVAS_H = 13, 10  # NATTEN: L = 13 × 10 pixels


def _generator(seed):
    return torch.Generator().manual_seed(seed)


# ---- mask_mods ----------------------------------------------------------------------------------

def causal_mask(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def generate_sliding_window(window_size):
    def sliding_window(b, h, q_idx, kv_idx):
        return q_idx - kv_idx <= window_size
    return and_masks(sliding_window, causal_mask)


def generate_prefix_lm_mask(prefix_length):
    def prefix_mask(b, h, q_idx, kv_idx):
        return kv_idx < prefix_length
    return or_masks(prefix_mask, causal_mask)


def length_to_offsets(lengths):
    offsets = torch.tensor([0, *lengths], dtype=torch.int32)
    return torch.cumsum(offsets, dim=-1)


def generate_doc_mask_mod(mask_mod, offsets):
    counts = offsets[1:] - offsets[:-1]
    document_id = torch.repeat_interleave(torch.arange(len(counts), dtype=torch.int32), counts)

    def doc_mask_mod(b, h, q_idx, kv_idx):
        same_doc = document_id[q_idx] == document_id[kv_idx]
        q_logical = q_idx - offsets[document_id[q_idx]]
        kv_logical = kv_idx - offsets[document_id[kv_idx]]
        inner_mask = mask_mod(b, h, q_logical, kv_logical)
        return same_doc & inner_mask
    return doc_mask_mod


def generate_dilated_sliding_window(window_size, dilation):
    def dilated_sliding_window(b, h, q_idx, kv_idx):
        diff = torch.abs(q_idx - kv_idx)
        in_window = diff <= window_size
        is_dilated = (diff % dilation) == 0
        return in_window & is_dilated
    return dilated_sliding_window


def generate_natten(canvas_w, canvas_h, kernel_w, kernel_h):
    def get_x_y(idx):
        return idx // canvas_w, idx % canvas_w

    def natten_mask_mod(b, h, q_idx, kv_idx):
        q_x, q_y = get_x_y(q_idx)
        kv_x, kv_y = get_x_y(kv_idx)
        kernel_center_x = q_x.clamp(kernel_w // 2, (canvas_w - 1) - kernel_w // 2)
        kernel_center_y = q_y.clamp(kernel_h // 2, (canvas_h - 1) - kernel_h // 2)
        hori_mask = (kernel_center_x - kv_x).abs() <= kernel_w // 2
        vert_mask = (kernel_center_y - kv_y).abs() <= kernel_h // 2
        return hori_mask & vert_mask
    return natten_mask_mod


def generate_per_head_windows():
    """Per-head masks: head h sees a causal window of WINDOWS[h] keys (a captured table), and
    the second sequence of the batch additionally sees the first 8 keys."""
    windows = torch.tensor([4, 16, 64, 1000])

    def per_head(b, h, q_idx, kv_idx):
        in_window = (q_idx >= kv_idx) & (q_idx - kv_idx < windows[h])
        return in_window | ((b == 1) & (kv_idx < 8))
    return per_head


MASK_MODS = {
    "causal": lambda: causal_mask,
    "sliding_window": lambda: generate_sliding_window(24),
    "prefix_lm": lambda: generate_prefix_lm_mask(20),
    "document": lambda: generate_doc_mask_mod(causal_mask, length_to_offsets([30, 45, 1, 54])),
    "dilated_sliding_window": lambda: generate_dilated_sliding_window(16, 2),
    "natten": lambda: generate_natten(CANVAS_W, CANVAS_H, 5, 3),
    "per_head": generate_per_head_windows,
}


# ---- score_mods ---------------------------------------------------------------------------------

def generate_tanh_softcap(soft_cap):
    def tanh_softcap(score, b, h, q_idx, kv_idx):
        return soft_cap * torch.tanh(score / soft_cap)
    return tanh_softcap


def generate_alibi_bias(heads):
    def alibi_mod(score, b, h, q_idx, kv_idx):
        scale = torch.exp2(-((h + 1) * 8.0 / heads))
        bias = (kv_idx - q_idx) * scale
        return score + bias
    return alibi_mod


def relative_bias(rel):
    def rel_bias(score, b, h, q_idx, kv_idx):
        return score + rel[h, q_idx - kv_idx + L - 1]
    return rel_bias


def _relative_position_bucket(relative_position, bidirectional=True, num_buckets=32,
                              max_distance=128):
    """Hugging Face's T5Attention._relative_position_bucket, unchanged."""
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    relative_position_if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    relative_position_if_large = torch.min(
        relative_position_if_large, torch.full_like(relative_position_if_large, num_buckets - 1)
    )
    relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
    return relative_buckets


def t5_bias(values):
    """T5's bucketed relative bias: values [num_buckets, H] (nn.Embedding's weight)."""
    def t5(score, b, h, q_idx, kv_idx):
        bucket = _relative_position_bucket(kv_idx - q_idx)
        return score + values[bucket, h]
    return t5


def gated(gate):
    def gate_mod(score, b, h, q_idx, kv_idx):
        return score * gate[h]
    return gate_mod


def leaky_branch(score, b, h, q_idx, kv_idx):
    """A branch on the score itself: negative scores are halved."""
    return torch.where(score > 0, score, 0.5 * score)


def key_bias(bias):
    """A learned bias per (sequence, head, key): bias [B, H, L], a 3-D table."""
    def bias_mod(score, b, h, q_idx, kv_idx):
        return score + bias[b, h, kv_idx]
    return bias_mod


SCORE_MODS = {
    "softcap": lambda: generate_tanh_softcap(2),
    "alibi": lambda: generate_alibi_bias(H),
    "relative_bias": relative_bias,
    "t5_bias": t5_bias,
    "gate": gated,
    "score_branch": lambda: leaky_branch,
    "key_bias": key_bias,
}
# The learned tables of each score_mod (float32, drawn once; tests set requires_grad).
SCORE_TABLES = {
    "relative_bias": lambda: [torch.randn(H, 2 * L - 1, generator=_generator(21)) * 0.5],
    "t5_bias": lambda: [torch.randn(32, H, generator=_generator(22)) * 0.5],
    "gate": lambda: [torch.rand(H, generator=_generator(23)) + 0.5],
    "key_bias": lambda: [torch.randn(B, H, L, generator=_generator(24))],
}


def score_mod_of(name, tables=None):
    """The score_mod ``name`` over ``tables`` (default: its SCORE_TABLES)."""
    if tables is None:
        tables = SCORE_TABLES.get(name, lambda: [])()
    return SCORE_MODS[name](*tables)


def index_grid(batch=B, heads=H, q_len=L, kv_len=L):
    """b, h, q_idx, kv_idx as broadcast int64 tensors [B,1,1,1] … [1,1,1,KV]."""
    return (torch.arange(batch).view(-1, 1, 1, 1), torch.arange(heads).view(1, -1, 1, 1),
            torch.arange(q_len).view(1, 1, -1, 1), torch.arange(kv_len).view(1, 1, 1, -1))
