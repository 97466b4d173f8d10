"""Packed documents with create_block_mask + flex_attention from maskattn.torch.

Training batches often pack several short documents into one row, so that no compute is spent
on padding. Attention must then stay inside each document: causal *and* same document. This is
FlexAttention's "document masking" recipe, written exactly as for
``torch.nn.attention.flex_attention`` — only the import changes:

    from maskattn.torch import create_block_mask, flex_attention

    def document_causal(b, h, q_idx, kv_idx):
        return (document_id[b, q_idx] == document_id[b, kv_idx]) & (q_idx >= kv_idx)

The script builds a batch of two rows, each packing a few documents, shows the block structure
the kernels see (blocks with no allowed pair are skipped), runs flex_attention forward and
backward (maskattn has a CPU backward), and checks that no token saw another document: the
softmax weights across documents are exactly 0, changing one document's keys and values leaves
every other document's output bit for bit unchanged and gives its tokens zero gradient, and each
document's output equals that document computed alone. The structured maskattn mask
``Mask().causal().segments(document_id)`` gives the same output without any L×L array.

Run: python examples/packed_documents.py
"""

import torch

import maskattn
import maskattn.torch as mt
from maskattn.torch import create_block_mask, flex_attention

HEADS, DIM, BLOCK = 4, 32, 16
DOCUMENT_LENGTHS = [[40, 24, 50, 14], [16, 16, 96]]  # each row packs to 128 tokens


def document_ids(lengths_per_row):
    rows = [torch.cat([torch.full((n,), d) for d, n in enumerate(lengths)])
            for lengths in lengths_per_row]
    return torch.stack(rows)  # [B, L]


def show_blocks(block_mask):
    """One character per BLOCK×BLOCK tile: █ full, ▒ partial, · skipped."""
    allowed = block_mask.allowed()  # [B or 1, 1, L, L], only for this display
    batch, _, length, _ = allowed.shape
    tiles = allowed.reshape(batch, length // BLOCK, BLOCK, length // BLOCK, BLOCK)
    counts = tiles.sum(dim=(2, 4))
    for row in range(batch):
        starts = [0] + torch.cumsum(torch.tensor(DOCUMENT_LENGTHS[row]), 0).tolist()[:-1]
        print(f"row {row}: documents of {DOCUMENT_LENGTHS[row]} tokens, starting at {starts}")
        for i in range(counts.shape[1]):
            line = "".join("█" if c == BLOCK * BLOCK else ("▒" if c else "·")
                           for c in counts[row, i].tolist())
            print(f"  {line}")
    print(f"{block_mask}: {block_mask.sparsity():.0f}% of the {BLOCK}×{BLOCK} blocks skipped")


def main():
    torch.set_num_threads(2)
    document_id = document_ids(DOCUMENT_LENGTHS)
    batch, length = document_id.shape

    def document_causal(b, h, q_idx, kv_idx):
        return (document_id[b, q_idx] == document_id[b, kv_idx]) & (q_idx >= kv_idx)

    block_mask = create_block_mask(document_causal, batch, None, length, length,
                                   BLOCK_SIZE=BLOCK)
    show_blocks(block_mask)

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, HEADS, length, DIM, generator=generator, requires_grad=True)
               for _ in range(3))
    out = flex_attention(q, k, v, block_mask=block_mask)

    # 1. The weights across documents are exactly zero.
    weights = torch.as_tensor(maskattn.attention_weights(q.detach(), k.detach(), block_mask.mask))
    other_document = document_id[:, None, :, None] != document_id[:, None, None, :]
    leaked = weights.masked_select(other_document.expand_as(weights)).abs().max().item()
    print(f"largest weight on another document's token: {leaked}")

    # 2. Another document's keys and values change nothing, and get no gradient from this one.
    row, first = 0, document_id[0] == 0
    out[row, :, first].square().sum().backward()
    foreign_grad = max(t.grad[row][:, ~first].abs().max().item() for t in (k, v))
    print(f"largest gradient on the other documents' keys/values from document 0's loss: "
          f"{foreign_grad}")
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[row][:, ~first] = torch.randn_like(k2[row][:, ~first])
    v2[row][:, ~first] = torch.randn_like(v2[row][:, ~first])
    with torch.no_grad():
        changed = flex_attention(q.detach(), k2, v2, block_mask=block_mask)
    unchanged = torch.equal(changed[row, :, first], out.detach()[row, :, first])
    print(f"document 0's output unchanged (bit for bit) after replacing the others: {unchanged}")

    # 3. Each document alone gives the same output as inside the pack.
    worst = 0.0
    with torch.no_grad():
        for b in range(batch):
            for d in range(len(DOCUMENT_LENGTHS[b])):
                tokens = document_id[b] == d
                alone = mt.attention(q[b:b + 1, :, tokens], k[b:b + 1, :, tokens],
                                     v[b:b + 1, :, tokens], maskattn.Mask().causal())
                worst = max(worst, (alone[0] - out[b, :, tokens]).abs().max().item())
    print(f"largest difference between a document alone and inside the pack: {worst:.1e}")

    # 4. The structured mask: causal & segments, evaluated inside the kernel (no L×L array).
    structured = maskattn.Mask().causal().segments(document_id.numpy())
    with torch.no_grad():
        same = mt.attention(q, k, v, structured)
    difference = (same - out).abs().max().item()
    print(f"Mask().causal().segments(document_id) vs the block mask: {difference:.1e}")

    if leaked != 0 or foreign_grad != 0 or not unchanged or worst > 1e-5 or difference > 1e-6:
        raise SystemExit("unexpected: a token saw another document")
    print("no token saw another document")


if __name__ == "__main__":
    main()
