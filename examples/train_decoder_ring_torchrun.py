"""A decoder trained with its sequence split over torch.distributed ranks: ring attention.

The model is a tiny two-layer decoder in the style of train_decoder_step.py: a token and a
position embedding, then two layers of masked multi-head self-attention (causal + key padding,
``Mask().causal().key_pad_id(ids, PAD)``) and an MLP, each with a residual and a LayerNorm, and a
projection to the vocabulary. Everything but attention works row by row, so each rank holds only
its rows of the sequence — ``maskattn.dist.local_ranges`` gives them, zigzag, and the position
embedding is read at those global positions — and the attention layers call
``maskattn.dist.RingAttention``, which passes the keys and values around the ring of ranks. Each
rank's loss is the sum over its rows divided by the whole batch's token count, so the weights'
gradients, all-reduced (summed) over the group, are those of the whole batch's mean loss.

Every rank starts from the same weights (one seed) and takes the same AdamW steps. At the end
rank 0 trains the same model in one process, with ``maskattn.torch.attention`` on the whole
sequence, and compares the loss curves: they agree to float32 rounding.

Run: torchrun --nproc-per-node 3 examples/train_decoder_ring_torchrun.py
(or: python -m torch.distributed.run --standalone --nproc-per-node 3 examples/…)
"""

import torch
import torch.distributed as tdist
import torch.nn.functional as F

import maskattn
import maskattn.torch as mt
from maskattn import dist

PAD, BOS = 0, 1
SENTENCES = [
    "the quick brown fox jumps over the lazy dog near the river bank",
    "a dog sleeps in the sun",
    "my cat watches the birds from the window every single morning",
    "we walk the dog along the river",
]
D_MODEL, HEADS, STEPS, LAYOUT = 32, 4, 20, "zigzag"


def tokenize(sentences):
    """Word ids (0 = <pad>, 1 = <bos>) in a right-padded [B, L] batch, and the vocabulary size."""
    words = sorted({w for s in sentences for w in s.split()})
    vocab = {w: i + 2 for i, w in enumerate(words)}
    rows = [[BOS] + [vocab[w] for w in s.split()] for s in sentences]
    length = max(len(r) for r in rows)
    return torch.tensor([r + [PAD] * (length - len(r)) for r in rows]), len(vocab) + 2


class SelfAttention(torch.nn.Module):
    """Multi-head self-attention whose core is given: the ring, or one process's attention."""

    def __init__(self, core):
        super().__init__()
        self.core, self.d_k = core, D_MODEL // HEADS
        self.w_qkv = torch.nn.Linear(D_MODEL, 3 * D_MODEL)
        self.w_o = torch.nn.Linear(D_MODEL, D_MODEL)

    def forward(self, x):
        batch, rows, _ = x.shape
        q, k, v = (t.view(batch, rows, HEADS, self.d_k).transpose(1, 2)
                   for t in self.w_qkv(x).chunk(3, dim=-1))
        out = self.core(q, k, v)  # [B, H, rows, d_k]
        return self.w_o(out.transpose(1, 2).reshape(batch, rows, D_MODEL))


class Layer(torch.nn.Module):
    def __init__(self, core):
        super().__init__()
        self.attention, self.norm1 = SelfAttention(core), torch.nn.LayerNorm(D_MODEL)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(D_MODEL, 4 * D_MODEL), torch.nn.GELU(),
                                       torch.nn.Linear(4 * D_MODEL, D_MODEL))
        self.norm2 = torch.nn.LayerNorm(D_MODEL)

    def forward(self, x):
        x = self.norm1(x + self.attention(x))
        return self.norm2(x + self.mlp(x))


class TinyDecoder(torch.nn.Module):
    def __init__(self, vocab_size, length, core):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab_size, D_MODEL)
        self.positions = torch.nn.Embedding(length, D_MODEL)
        self.layers = torch.nn.ModuleList([Layer(core), Layer(core)])
        self.head = torch.nn.Linear(D_MODEL, vocab_size)

    def forward(self, ids, positions):
        """``ids`` [B, rows] at global ``positions`` [rows] (a rank's rows, or all of them)."""
        x = self.tokens(ids) + self.positions(positions)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def train(core, inputs, targets, positions, vocab_size, length, token_count, reduce=None):
    """Per-step losses of STEPS AdamW steps from the seed's weights. ``reduce``: the ring's
    all-reduce (sum over ranks), applied to the loss and to every weight's gradient."""
    torch.manual_seed(0)  # the same initial weights on every rank and in the one-process run
    model = TinyDecoder(vocab_size, length, core)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(STEPS):
        logits = model(inputs, positions)
        # This rank's share of the whole batch's mean loss: its sum over the token count.
        loss = F.cross_entropy(logits.reshape(-1, vocab_size), targets.reshape(-1),
                               ignore_index=-100, reduction="sum") / token_count
        optimizer.zero_grad()
        loss.backward()
        loss = loss.detach()
        if reduce is not None:
            for parameter in model.parameters():
                reduce(parameter.grad)
            reduce(loss)
        optimizer.step()
        losses.append(loss.item())
    return losses


def main():
    torch.set_num_threads(1)
    tdist.init_process_group("gloo")  # torchrun sets the rank, world and rendezvous
    group, rank = tdist.group.WORLD, tdist.get_rank()
    ids, vocab_size = tokenize(SENTENCES)
    inputs, targets = ids[:, :-1], ids[:, 1:].masked_fill(ids[:, 1:] == PAD, -100)
    length = inputs.shape[1]
    token_count = int((targets != -100).sum())
    # The mask describes the whole sequence, on every rank: causal, and no key that is <pad>.
    mask = maskattn.Mask().causal().key_pad_id(inputs.numpy(), PAD)
    rows = [row for first, end in dist.local_ranges(length, LAYOUT, comm=group)
            for row in range(first, end)]

    def ring_core(q, k, v):
        return dist.RingAttention.apply(q, k, v, mask, None, group, LAYOUT)

    def all_reduce(tensor):
        tdist.all_reduce(tensor, group=group)

    ring = train(ring_core, dist.shard(inputs, group, layout=LAYOUT, axis=1),
                 dist.shard(targets, group, layout=LAYOUT, axis=1), torch.tensor(rows),
                 vocab_size, length, token_count, reduce=all_reduce)
    if rank == 0:
        world = tdist.get_world_size()
        print(f"batch {list(inputs.shape)}, vocabulary {vocab_size}, d_model {D_MODEL}, {HEADS} "
              f"heads, 2 layers; the sequence split over {world} ranks ({LAYOUT}: rank 0 holds "
              f"rows {dist.local_ranges(length, LAYOUT, comm=group)})")
        one = train(lambda q, k, v: mt.attention(q, k, v, mask), inputs, targets,
                    torch.arange(length), vocab_size, length, token_count)
        print("step       ring loss  one-process loss")
        for step, (a, b) in enumerate(zip(ring, one)):
            print(f"{step + 1:4d}  {a:14.7f}  {b:16.7f}")
        worst = max(abs(a - b) for a, b in zip(ring, one))
        print(f"largest |ring − one process| loss difference over {STEPS} steps: {worst:.2e}")
        if worst > 1e-4 or ring[-1] >= ring[0]:
            raise SystemExit("unexpected: the losses differ or did not fall")
    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
