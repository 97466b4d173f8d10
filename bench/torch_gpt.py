"""PyTorch's side of bench/gpt_compare: the identical GPT (nanoGPT's shape, float32, eager) trained
and sampled on the CPU, printed as one line of key=value pairs like bench/gpt_run's.

    python bench/torch_gpt.py --layers 4 --d-model 128 --heads 4 --context 64 --batch 16
                              --vocab 93 --steps 20 --warmup 3 --threads 2 --generate 3

Training steps are nanoGPT's: forward with scaled_dot_product_attention(is_causal=True),
cross-entropy, backward, clip_grad_norm_(1.0), AdamW (β = (0.9, 0.95), weight decay 0.1 on the
matrices, PyTorch's default implementation), zero_grad. Generation is greedy through a KV cache
kept per layer in preallocated tensors (PyTorch's own operations; no recomputation of the prefix).
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(d_model), torch.nn.LayerNorm(d_model)
        self.c_attn = torch.nn.Linear(d_model, 3 * d_model)
        self.c_proj = torch.nn.Linear(d_model, d_model)
        self.c_fc = torch.nn.Linear(d_model, 4 * d_model)
        self.mlp_proj = torch.nn.Linear(4 * d_model, d_model)

    def split(self, x):
        batch, length, width = x.shape
        return x.view(batch, length, self.heads, width // self.heads).transpose(1, 2)

    def forward(self, x, cache=None, position=0):
        batch, length, width = x.shape
        q, k, v = (self.split(t) for t in self.c_attn(self.ln_1(x)).split(width, dim=2))
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # one new position attends over the cache
            keys, values = cache
            keys[:, :, position:position + length] = k
            values[:, :, position:position + length] = v
            y = F.scaled_dot_product_attention(q, keys[:, :, :position + length],
                                               values[:, :, :position + length])
        x = x + self.c_proj(y.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class Gpt(torch.nn.Module):
    def __init__(self, vocab, context, layers, d_model, heads):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, d_model), torch.nn.Embedding(context, d_model)
        self.blocks = torch.nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(d_model)

    def forward(self, tokens, caches=None, position=0):
        x = self.wte(tokens) + self.wpe(torch.arange(position, position + tokens.shape[1]))
        for n, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[n], position)
        return self.ln_f(x) @ self.wte.weight.t()  # the tied head


def main():
    parser = argparse.ArgumentParser()
    for name, default in (("layers", 4), ("d-model", 128), ("heads", 4), ("context", 64),
                          ("batch", 16), ("vocab", 93), ("steps", 20), ("warmup", 3),
                          ("threads", 2), ("generate", 0)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    model = Gpt(args.vocab, args.context, args.layers, args.d_model, args.heads)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=2e-3, betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(2)
    times = []
    for step in range(args.warmup + args.steps):
        tokens = torch.randint(7, args.vocab, (args.batch, args.context + 1), generator=generator)
        start = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    line = (f"step_ms={median * 1e3:.3f} "
            f"train_tokens_per_s={args.batch * args.context / median:.1f}")
    if args.generate > 0:
        heads, dim = args.heads, args.d_model // args.heads
        rates = []
        with torch.no_grad():
            for run in range(args.generate + 1):  # the first is a warm-up
                caches = [(torch.empty(1, heads, args.context, dim),
                           torch.empty(1, heads, args.context, dim)) for _ in model.blocks]
                token = torch.tensor([[7]])
                start = time.perf_counter()
                for position in range(args.context - 1):
                    logits = model(token, caches, position)
                    token = logits[:, -1:].argmax(-1)
                if run > 0:
                    rates.append((args.context - 1) / (time.perf_counter() - start))
        line += f" generate_tokens_per_s={statistics.median(rates):.1f}"
    print(line)


if __name__ == "__main__":
    main()
