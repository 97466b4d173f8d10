"""A decoder training step in PyTorch with maskattn's attention, next to the tutorial version.

The model is the tutorials' one-layer decoder: an embedding, a masked multi-head self-attention
(w_q, w_k, w_v, w_o, split_heads) with a look-ahead mask and a padding mask, and a projection
to the vocabulary. The tutorials compute the attention by hand:

    scores = q @ k.transpose(-2, -1) / sqrt(d_k)
    scores = scores.masked_fill(look_ahead | padding, -1e9)
    out = softmax(scores) @ v

Here the same model trains three times from the same initial weights, with only that core
swapped: the tutorial's masked_fill(-1e9), PyTorch's scaled_dot_product_attention with a bool
mask, and maskattn.torch.attention with ``Mask().causal().key_pad_id(ids, PAD)`` — a structured
mask, no L×L tensor. Each run does 20 AdamW steps on a right-padded batch of short sentences and
prints its losses; the three columns agree to float32 rounding.

Run: python examples/train_decoder_step.py
"""

import math

import torch
import torch.nn.functional as F

import maskattn
import maskattn.torch as mt

PAD = 0
SENTENCES = [
    "i love my dog",
    "the dog loves me too",
    "we walk the dog every day",
    "i love walks",
]
D_MODEL, HEADS, STEPS = 32, 4, 20


def tokenize(sentences):
    """Word ids (0 = <pad>, 1 = <bos>) in a right-padded [B, L] batch."""
    words = sorted({w for s in sentences for w in s.split()})
    vocab = {w: i + 2 for i, w in enumerate(words)}
    rows = [[1] + [vocab[w] for w in s.split()] for s in sentences]
    length = max(len(r) for r in rows)
    ids = torch.tensor([r + [PAD] * (length - len(r)) for r in rows])
    return ids, len(vocab) + 2


def tutorial_attention(q, k, v, ids):
    """The tutorials' version: -1e9 where the look-ahead or the padding mask hides a pair."""
    length = q.shape[2]
    look_ahead = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
    padding = (ids == PAD)[:, None, None, :]  # [B, 1, 1, L]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(look_ahead | padding, -1e9)
    return F.softmax(scores, dim=-1) @ v


def sdpa_attention(q, k, v, ids):
    """PyTorch's SDPA with a bool mask (True = attend)."""
    length = q.shape[2]
    allowed = torch.tril(torch.ones(length, length, dtype=torch.bool))
    allowed = allowed & (ids != PAD)[:, None, None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


def maskattn_attention(q, k, v, ids):
    """maskattn: causal & key padding by token id, evaluated inside the kernel."""
    mask = maskattn.Mask().causal().key_pad_id(ids.numpy(), PAD)
    return mt.attention(q, k, v, mask)


class MaskedMultiHeadAttention(torch.nn.Module):
    def __init__(self, d_model, num_heads, core):
        super().__init__()
        self.num_heads, self.d_k, self.core = num_heads, d_model // num_heads, core
        self.w_q = torch.nn.Linear(d_model, d_model)
        self.w_k = torch.nn.Linear(d_model, d_model)
        self.w_v = torch.nn.Linear(d_model, d_model)
        self.w_o = torch.nn.Linear(d_model, d_model)

    def split_heads(self, x):
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.d_k).transpose(1, 2)

    def forward(self, x, ids):
        q, k, v = (self.split_heads(w(x)) for w in (self.w_q, self.w_k, self.w_v))
        out = self.core(q, k, v, ids)  # [B, H, L, d_k]
        batch, _, length, _ = out.shape
        return self.w_o(out.transpose(1, 2).reshape(batch, length, -1))


class TinyDecoder(torch.nn.Module):
    def __init__(self, vocab_size, core):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab_size, D_MODEL)
        self.attention = MaskedMultiHeadAttention(D_MODEL, HEADS, core)
        self.norm = torch.nn.LayerNorm(D_MODEL)
        self.head = torch.nn.Linear(D_MODEL, vocab_size)

    def forward(self, ids):
        x = self.embedding(ids)
        x = x + self.attention(x, ids)
        return self.head(self.norm(x))


def train(core, ids, vocab_size):
    torch.manual_seed(0)  # the same initial weights for every core
    model = TinyDecoder(vocab_size, core)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    inputs, targets = ids[:, :-1], ids[:, 1:].masked_fill(ids[:, 1:] == PAD, -100)
    losses = []
    for _ in range(STEPS):
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, vocab_size), targets.reshape(-1),
                               ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main():
    torch.set_num_threads(2)
    ids, vocab_size = tokenize(SENTENCES)
    print(f"batch {list(ids.shape)} (right-padded with <pad>={PAD}), vocabulary {vocab_size}, "
          f"d_model {D_MODEL}, {HEADS} heads, {STEPS} AdamW steps")
    runs = {name: train(core, ids, vocab_size) for name, core in (
        ("tutorial -1e9", tutorial_attention), ("torch SDPA", sdpa_attention),
        ("maskattn", maskattn_attention))}
    print("step  " + "".join(f"{name:>15s}" for name in runs))
    for step in range(STEPS):
        print(f"{step + 1:4d}  " + "".join(f"{losses[step]:15.6f}" for losses in runs.values()))
    worst = max(abs(a - b) for a, b in zip(runs["maskattn"], runs["torch SDPA"]))
    print(f"largest |maskattn − SDPA| loss difference over {STEPS} steps: {worst:.2e}")
    if worst > 1e-4 or runs["maskattn"][-1] >= runs["maskattn"][0]:
        raise SystemExit("unexpected: the losses differ or did not fall")


if __name__ == "__main__":
    main()
