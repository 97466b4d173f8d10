"""attention-gym's catalogue of masks and score modifiers on maskattn, forward and backward.

FlexAttention users write a mask as ``mask_mod(b, h, q_idx, kv_idx) -> bool`` and a score
modifier as ``score_mod(score, b, h, q_idx, kv_idx) -> score``. ``maskattn.torch`` takes the same
functions (only the import changes) and traces each once into a *program*, an expression the
kernels evaluate a 64 x 64 tile at a time: no L x L mask or bias is built, and the backward (which
PyTorch's CPU FlexAttention lacks) differentiates the program, so learned tables get gradients.

For every entry the script prints the program the function became and the fraction of 64 x 64
tiles the kernels skip, then checks output and gradients (q, k, v and any learned table) against
FlexAttention's definition computed densely in float64 by PyTorch. It exits non-zero if a check
fails.

Run: python examples/flex_catalogue.py
"""

import math
import sys

import torch

import maskattn
from maskattn.torch import create_block_mask, flex_attention

B, H, L, D = 1, 4, 200, 32
WINDOW, PREFIX, CAP = 48, 40, 20.0


def catalogue():
    """(name, mask_mod, score_mod, learned tables): attention-gym's examples, as users write them."""
    document = torch.arange(L) // 64
    rel = torch.randn(H, 2 * L - 1, dtype=torch.float32).mul_(0.1).requires_grad_()
    gate = torch.rand(H, dtype=torch.float32).add_(0.5).requires_grad_()
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)])
    buckets = 16
    t5_bias = torch.randn(H, buckets, dtype=torch.float32).mul_(0.1).requires_grad_()

    def causal(b, h, q, kv):
        return q >= kv

    def sliding(b, h, q, kv):
        return (q >= kv) & (q - kv <= WINDOW)

    def prefix_lm(b, h, q, kv):
        return (kv <= q) | (kv < PREFIX)

    def documents(b, h, q, kv):
        return (document[q] == document[kv]) & (q >= kv)

    def dilated(b, h, q, kv):
        return (q >= kv) & (q - kv <= 2 * WINDOW) & ((q - kv) % 2 == 0)

    def natten(b, h, q, kv):  # a 2-D neighbourhood on a 10 x 20 image
        qy, qx, ky, kx = q // 20, q % 20, kv // 20, kv % 20
        return ((qy - ky).abs() <= 2) & ((qx - kx).abs() <= 3)

    def per_head(b, h, q, kv):  # even heads causal, odd heads a window
        return torch.where(h % 2 == 0, q >= kv, (q - kv).abs() <= WINDOW)

    def softcap(score, b, h, q, kv):
        return CAP * torch.tanh(score / CAP)

    def alibi(score, b, h, q, kv):
        return score - slopes[h] * (q - kv)

    def relative(score, b, h, q, kv):
        return score + rel[h, q - kv + L - 1]

    def t5(score, b, h, q, kv):  # bidirectional log buckets of the distance
        distance = kv - q
        half = buckets // 2
        side = (distance > 0).long() * half
        n = distance.abs()
        large = half // 2 + (torch.log(n.float() / (half // 2)) / math.log(L / (half // 2))
                             * (half - half // 2)).long()
        bucket = side + torch.where(n < half // 2, n, torch.clamp(large, max=half - 1))
        return score + t5_bias[h, bucket]

    def gated(score, b, h, q, kv):
        return score * gate[h]

    def branch(score, b, h, q, kv):
        return torch.where(score > 0, score, score * 0.5)

    return [
        ("causal", causal, None, []),
        ("sliding window", sliding, None, []),
        ("prefix-LM", prefix_lm, None, []),
        ("packed documents", documents, None, []),
        ("dilated sliding window", dilated, None, []),
        ("NATTEN 2-D neighbourhood", natten, None, []),
        ("per-head masks", per_head, None, []),
        ("tanh soft-capping", causal, softcap, []),
        ("ALiBi", causal, alibi, []),
        ("learned relative bias", causal, relative, [rel]),
        ("T5 bucketed bias", None, t5, [t5_bias]),
        ("gate s * g[h]", causal, gated, [gate]),
        ("score-dependent branch", sliding, branch, []),
    ]


def dense_reference(q, k, v, mask_mod, score_mod, tables):
    """FlexAttention's definition on the whole grid, float64, with autograd."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    saved = [t.data.clone() for t in tables]
    for t in tables:
        t.data = t.data.double()
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(H).view(1, H, 1, 1)
    qi = torch.arange(L).view(1, 1, L, 1)
    ki = torch.arange(L).view(1, 1, 1, L)
    scores = q64 @ k64.transpose(-1, -2) / math.sqrt(D)
    if score_mod is not None:
        scores = score_mod(scores, b, h, qi, ki)
    if mask_mod is not None:
        keep = mask_mod(b, h, qi, ki).expand(B, H, L, L)
        scores = scores.masked_fill(~keep, -math.inf)
    out = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v64
    grads = torch.autograd.grad(out, [q64, k64, v64] + tables, torch.ones_like(out))
    for t, data in zip(tables, saved):
        t.data = data
    return out.detach(), grads


def main():
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, requires_grad=True) for _ in range(3))
    failures = 0
    for name, mask_mod, score_mod, tables in catalogue():
        block_mask = create_block_mask(mask_mod, B, H, L, L) if mask_mod else None
        out = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)
        grads = torch.autograd.grad(out, [q, k, v] + tables, torch.ones_like(out))
        want_out, want_grads = dense_reference(q, k, v, mask_mod, score_mod, tables)
        error = (out.double() - want_out).abs().max().item()
        grad_error = max(((g.double() - w).abs().max() / w.abs().max().clamp(min=1)).item()
                         for g, w in zip(grads, want_grads))
        ok = error < 1e-5 and grad_error < 1e-4
        failures += not ok
        skipped = ""
        if block_mask is not None:
            tiles = maskattn.block_map(block_mask.mask, B, H, L, L)
            skipped = f"{(tiles == 0).mean() * 100:3.0f} % tiles skipped"
        program = block_mask.program.text if block_mask is not None else ""
        print(f"{'ok  ' if ok else 'FAIL'} {name:26s} out {error:.1e}  grads {grad_error:.1e}  "
              f"{skipped:20s} {program}")
    print("every entry matches FlexAttention's definition" if failures == 0
          else f"{failures} entries differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
