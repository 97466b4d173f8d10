"""Training a Hugging Face GPT-2 with attention dropout through maskattn, next to eager attention.

GPT-2's config has ``attn_pdrop = 0.1``: in training mode transformers hands that rate to the
attention function as ``dropout``. With ``attn_implementation="maskattn"`` the pairs are dropped
by maskattn's dropout — a pure function of a seed drawn from PyTorch's generator at each call,
which the backward reuses — instead of eager's ``nn.functional.dropout`` on the L×L weights.

A tiny GPT-2 (2 layers, width 64, 4 heads, every dropout at its default 0.1) learns a fixed batch
of random sequences for 40 AdamW steps, from the same initial weights, four times per attention
implementation, each run from its own ``torch.manual_seed``. The two implementations drop
different pairs, so their losses differ run by run; what must agree is the loss curve on average.
The script prints both mean curves and whether the mean loss of the last ten steps agrees
within four standard errors of the difference (a two-sample t statistic); then it repeats one
maskattn run to show that ``torch.manual_seed`` reproduces it exactly.

Run: python examples/train_gpt2_dropout.py
"""

import math
import statistics
import sys

import torch
import transformers

import maskattn.transformers

VOCAB, LENGTH, BATCH, STEPS, RUNS = 64, 32, 8, 40, 4
REPORT_EVERY, LAST = 10, 10


def new_model(attention: str):
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
                                     n_positions=LENGTH, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)  # the same starting weights for every run
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention)
    return model.train()  # training mode: attention dropout on


def run(attention: str, seed: int) -> list:
    """One training run; every dropout decision in it follows from torch.manual_seed(seed)."""
    model = new_model(attention)
    tokens = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=torch.Generator().manual_seed(7))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(seed)
    losses = []
    for _ in range(STEPS):
        loss = model(input_ids=tokens, labels=tokens).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main() -> int:
    maskattn.transformers.register()
    torch.set_num_threads(1)  # small matrices: one thread each for torch and maskattn is fastest
    curves = {name: [run(name, seed) for seed in range(RUNS)] for name in ("maskattn", "eager")}

    print(f"mean training loss of {RUNS} runs each (attn_pdrop = 0.1)")
    print(f"{'step':>5} {'maskattn':>10} {'eager':>10}")
    for step in range(0, STEPS, REPORT_EVERY):
        means = [statistics.mean(c[step] for c in curves[name]) for name in curves]
        print(f"{step:>5} {means[0]:>10.4f} {means[1]:>10.4f}")
    # One number per run: its mean loss over the last steps (less noisy than the last step).
    ends = {name: [statistics.mean(c[-LAST:]) for c in runs] for name, runs in curves.items()}
    difference = statistics.mean(ends["maskattn"]) - statistics.mean(ends["eager"])
    standard_error = math.sqrt(sum(statistics.variance(e) / RUNS for e in ends.values()))
    agree = abs(difference) <= 4 * standard_error
    print(f"mean loss of the last {LAST} steps: maskattn {statistics.mean(ends['maskattn']):.4f}, "
          f"eager {statistics.mean(ends['eager']):.4f}, difference {difference:+.4f} "
          f"(standard error {standard_error:.4f})")
    print(f"the curves agree (within 4 standard errors): {agree}")
    reproduced = run("maskattn", 0) == curves["maskattn"][0]
    print(f"torch.manual_seed(0) reproduces a maskattn run exactly: {reproduced}")
    return 0 if agree and reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
