"""maskattn.torch.attention (maskattn's own call with autograd): masks, learnable bias and sinks,
layouts, GQA, determinism across thread counts, thread safety, and a small training loop."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

import maskattn  # noqa: E402
import maskattn.torch as mt  # noqa: E402
from test_torch_common import assert_close_to_math, randn, torch_sdpa  # noqa: E402

B, H, D = 2, 4, 16


def bottom_right_causal(q_len, k_len):
    return torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)


@pytest.mark.parametrize("q_len,k_len", [(7, 7), (5, 12)])
def test_mask_and_learnable_bias(q_len, k_len):
    """A bottom-right causal Mask and a torch bias that requires grad, against SDPA with the same
    pairs as an additive mask (whose gradient is the bias's)."""
    leaves = [randn((B, H, q_len, D), 1), randn((B, 2, k_len, D), 2),
              randn((B, 2, k_len, D), 3), randn((1, H, q_len, k_len), 4)]
    hidden = ~bottom_right_causal(q_len, k_len)

    def ours(q, k, v, bias):
        return mt.attention(q, k, v, mask=maskattn.Mask().causal(), mods=mt.ScoreMods(bias=bias))

    def theirs(q, k, v, bias):
        return torch_sdpa(q, k, v, attn_mask=bias.masked_fill(hidden, float("-inf")),
                          enable_gqa=True)

    assert_close_to_math(ours, theirs, leaves, torch.float32)


@pytest.mark.parametrize("entry", ["attention", "sdpa"])
def test_score_program_tables_get_gradients(entry):
    """mt.ScoreMods(program=(text, {name: tensor})): the program reads the tensors in place and
    its float32 tables that require grad get gradients, as a traced score_mod's do."""
    q_len = k_len = 9
    leaves = [randn((B, H, q_len, D), 1), randn((B, H, k_len, D), 2),
              randn((B, H, k_len, D), 3), randn((H, q_len + k_len - 1), 4)]
    i, j = torch.arange(q_len)[:, None], torch.arange(k_len)[None, :]

    def ours(q, k, v, rel):
        mods = mt.ScoreMods(program=(f"s + rel[h, q - kv + {k_len - 1}]", {"rel": rel}))
        if entry == "sdpa":
            return mt.scaled_dot_product_attention(q, k, v, is_causal=True, mods=mods)
        return mt.attention(q, k, v, mask=maskattn.Mask().causal(), mods=mods)

    def theirs(q, k, v, rel):
        bias = rel[:, i - j + k_len - 1].masked_fill(j > i, float("-inf"))
        return torch_sdpa(q, k, v, attn_mask=bias)

    assert_close_to_math(ours, theirs, leaves, torch.float32)


def test_blhd_layout_and_output():
    leaves = [randn((B, 6, H, D), 1), randn((B, 9, H, D), 2), randn((B, 9, H, 8), 3)]

    def ours(q, k, v):
        out = mt.attention(q, k, v, layout="blhd")
        assert out.shape == (B, 6, H, 8)
        return out

    def theirs(q, k, v):
        return torch_sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

    assert_close_to_math(ours, theirs, leaves, torch.float32)


def test_sinks_get_gradients():
    """A sink is a key with score sink[h] and a zero value: SDPA over one extra key (k = 0, so its
    score is its attn_mask entry) is the reference, and the sink's gradient is that column's."""
    L = 6
    leaves = [randn((B, H, L, D), 1), randn((B, H, L, D), 2), randn((B, H, L, D), 3),
              randn((H,), 4)]

    def ours(q, k, v, sinks):
        return mt.attention(q, k, v, mods=mt.ScoreMods(sinks=sinks))

    def theirs(q, k, v, sinks):
        zeros = torch.zeros(B, H, 1, D, dtype=q.dtype)
        column = sinks.reshape(1, H, 1, 1).expand(1, H, L, 1)
        scores = torch.cat([torch.zeros(1, H, L, L, dtype=q.dtype), column], dim=-1)
        return torch_sdpa(q, torch.cat([k, zeros], 2), torch.cat([v, zeros], 2), attn_mask=scores)

    assert_close_to_math(ours, theirs, leaves, torch.float32)


def test_softcap_from_core_score_mods():
    L, cap = 8, 2.0
    leaves = [randn((B, H, L, D), 1) * 3, randn((B, H, L, D), 2), randn((B, H, L, D), 3)]

    def ours(q, k, v):
        return mt.attention(q, k, v, mask=maskattn.Mask().causal(),
                            mods=maskattn.ScoreMods(softcap=cap))

    def theirs(q, k, v):
        scores = q @ k.transpose(-1, -2) / D**0.5
        scores = cap * torch.tanh(scores / cap)
        scores = scores.masked_fill(~bottom_right_causal(L, L), float("-inf"))
        return torch.softmax(scores, -1) @ v

    assert_close_to_math(ours, theirs, leaves, torch.float32)


def backward_outputs(threads, seed=0, q_len=70, k_len=90):
    q, k, v = (randn((B, H, n, D), seed + i).requires_grad_() for i, n in
               enumerate((q_len, k_len, k_len)))
    bias = randn((1, H, q_len, k_len), seed + 5).requires_grad_()
    out = mt.attention(q, k, v, mask=maskattn.Mask().causal().sliding_window(40),
                       mods=mt.ScoreMods(bias=bias), threads=threads)
    out.backward(randn(out.shape, seed + 6))
    return [out.detach(), q.grad, k.grad, v.grad, bias.grad]


def test_bitwise_identical_for_any_thread_count():
    serial = backward_outputs(1)
    for threads in (2, 3, None):
        for got, want in zip(backward_outputs(threads), serial):
            assert torch.equal(got, want)


def sdpa_outputs(seed, attn_mask, mask):
    q, k, v = (randn((B, H, 64, D), seed + i).requires_grad_() for i in range(3))
    out = mt.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, mask=mask)
    out.backward(randn(out.shape, seed + 9))
    return [out.detach(), q.grad, k.grad, v.grad]


def test_four_python_threads_match_serial_calls():
    """Concurrent calls sharing one attn_mask tensor (so one cached conversion) and one Mask."""
    attn_mask = torch.rand(64, 64, generator=torch.Generator().manual_seed(3)) < 0.7
    mask = maskattn.Mask().causal().sliding_window(20)
    seeds = list(range(0, 80, 10))
    serial = {seed: sdpa_outputs(seed, attn_mask, mask) for seed in seeds}
    concurrent = {}
    errors = []
    start = threading.Barrier(4)

    def worker(my_seeds):
        try:
            start.wait()
            for seed in my_seeds:
                concurrent[seed] = sdpa_outputs(seed, attn_mask, mask)
        except Exception as error:  # reported below, in the main thread
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(seeds[n::4],)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for seed in seeds:
        for got, want in zip(concurrent[seed], serial[seed]):
            assert torch.equal(got, want)


class OneLayer(torch.nn.Module):
    """Embedding → causal self-attention (4 heads, GQA 2) → logits, with a padding mask."""

    def __init__(self, attend, vocab=50, width=32, heads=4, kv_heads=2):
        super().__init__()
        self.attend, self.heads, self.kv_heads = attend, heads, kv_heads
        self.embed = torch.nn.Embedding(vocab, width)
        self.q = torch.nn.Linear(width, width)
        self.kv = torch.nn.Linear(width, 2 * width * kv_heads // heads)
        self.o = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens, keep):
        x = self.embed(tokens)
        batch, length, width = x.shape
        split = lambda t, h: t.reshape(batch, length, h, -1).transpose(1, 2)  # noqa: E731
        q = split(self.q(x), self.heads)
        k, v = (split(t, self.kv_heads) for t in self.kv(x).chunk(2, dim=-1))
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        attn_mask = causal & keep[:, None, None, :]
        y = self.attend(q, k, v, attn_mask=attn_mask, enable_gqa=True)
        return self.head(x + self.o(y.transpose(1, 2).reshape(batch, length, width)))


def training_losses(attend, steps=20):
    torch.manual_seed(0)
    model = OneLayer(attend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 50, (4, 24), generator=generator)
    keep = torch.ones(4, 24, dtype=torch.bool)
    keep[1, 18:] = False
    keep[3, 10:] = False
    losses = []
    for _ in range(steps):
        logits = model(tokens[:, :-1], keep[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, 50), tokens[:, 1:].reshape(-1), reduction="none")
        loss = (loss * keep[:, 1:].reshape(-1)).sum() / keep[:, 1:].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_training_loop_losses_match_pytorch_sdpa():
    """20 AdamW steps in float32: the same losses within 1e-5 relative (measured: 1.9e-7; both
    compute in float32 with different summation orders, and AdamW carries the differences)."""
    ours = training_losses(mt.scaled_dot_product_attention)
    theirs = training_losses(torch_sdpa)
    assert ours[-1] < ours[0] - 0.5  # it learns
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: {a} vs {b}"


def test_double_backward_raises_instead_of_a_silent_zero():
    """create_graph=True would give gradients that carry no second derivative through maskattn;
    a gradient penalty would silently lose its attention part, so it is refused."""
    q, k, v = (randn((1, 2, 4, 8), seed).requires_grad_() for seed in (1, 2, 3))
    out = mt.attention(q, k, v)
    with pytest.raises(NotImplementedError, match="maskattn has no double backward"):
        torch.autograd.grad(out.sum(), q, create_graph=True)
    (grad_q,) = torch.autograd.grad(mt.attention(q, k, v).sum(), q)  # the usual backward
    assert grad_q.shape == q.shape


def test_no_nanobind_leak_report_when_a_graph_outlives_the_script():
    """An output that requires grad kept in a global until exit holds its autograd graph, and
    with it the call's Mask, and the mask cache keeps a seen bool mask's Call; the report
    nanobind prints for objects alive at teardown must not appear (maskattn drops them at
    exit)."""
    import os
    import subprocess
    import sys

    script = (
        "import torch, maskattn, maskattn.torch as mt\n"
        "q = torch.randn(1, 2, 5, 8, requires_grad=True)\n"
        "out = mt.scaled_dot_product_attention(q, q, q, mask=maskattn.Mask().causal())\n"
        "kept = mt.attention(q, q, q, mask=maskattn.Mask().sliding_window(2))\n"
        "keep = torch.ones(5, 5, dtype=torch.bool)\n"
        "for _ in range(2):  # the second call keeps its Call (and Mask) for the next\n"
        "    mt.scaled_dot_product_attention(q, q, q, attn_mask=keep)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=dict(os.environ), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "leaked" not in result.stderr, result.stderr


def test_inputs_a_capsule_cannot_describe_are_read_by_value():
    """A negative-bit view (whose DLPack capsule holds the values un-negated, and which .numpy()
    refuses) and a Parameter (a subclass) take the checked path and give the results of their
    plain values, bit for bit, through every entry point, with and without autograd."""
    q, k, v = randn((B, H, 5, D), 1), randn((B, H, 6, D), 2), randn((B, H, 6, D), 3)
    calls = {"maskattn.attention": maskattn.attention, "attention": mt.attention,
             "sdpa": mt.scaled_dot_product_attention, "flex": mt.flex_attention}
    for name, call in calls.items():
        expected = call(-q, k, -v)
        negated = call(torch._neg_view(q), k, torch._neg_view(v))
        assert torch.equal(negated, expected), name
        parameters = [torch.nn.Parameter(x.clone(), requires_grad=False) for x in (q, k, v)]
        assert torch.equal(call(*parameters), call(q, k, v)), name
    leaf, q_leaf = k.clone().requires_grad_(), q.clone().requires_grad_()
    out = mt.attention(torch._neg_view(q_leaf), leaf, v)  # a view that requires grad too
    out.sum().backward()
    plain_leaf, plain_q = k.clone().requires_grad_(), q.clone().requires_grad_()
    plain = mt.attention(-plain_q, plain_leaf, v)
    plain.sum().backward()
    assert torch.equal(out, plain) and torch.equal(leaf.grad, plain_leaf.grad)
    assert torch.equal(q_leaf.grad, plain_q.grad)
