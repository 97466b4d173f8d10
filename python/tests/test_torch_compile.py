"""The maskattn::sdpa custom ops: torch.library's own checks, and torch.compile(fullgraph=True)
of models calling maskattn.torch.scaled_dot_product_attention (no graph break)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import maskattn  # noqa: E402
import maskattn.torch as mt  # noqa: E402
from test_torch_common import randn  # noqa: E402


def op_samples():
    q, k, v = randn((2, 4, 6, 8), 1), randn((2, 2, 9, 8), 2), randn((2, 2, 9, 8), 3)
    keep = torch.rand(2, 1, 6, 9, generator=torch.Generator().manual_seed(4)) < 0.7
    additive = randn((6, 9), 5)
    yield (q, k, v, None, None, False, None)
    yield (q, k, v, keep, None, False, 0.3)
    yield (q, k, v, additive, None, False, None)
    yield (q, k, v, None, additive.clone(), True, None)
    yield (q.bfloat16(), k.bfloat16(), v.bfloat16(), None, None, True, None)


@pytest.mark.parametrize("sample", list(range(5)))
def test_opcheck(sample):
    """Schema, fake (meta) implementation, autograd registration, AOT dispatch."""
    args = list(op_samples())[sample]
    grads = [x.requires_grad_() if isinstance(x, torch.Tensor) and n in (0, 1, 2, 4) else x
             for n, x in enumerate(args)]
    torch.library.opcheck(torch.ops.maskattn.sdpa.default, tuple(grads))


class Block(torch.nn.Module):
    """Projections and three SDPA calls (bool mask, is_causal with GQA, a learnable float mask)."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 32)
        self.position_bias = torch.nn.Parameter(randn((1, 4, 10, 10), 7) * 0.1)

    def forward(self, x, keep):
        batch, length, _ = x.shape
        q, k, v = self.qkv(x).split((16, 8, 8), dim=-1)
        q = q.reshape(batch, length, 4, 4).transpose(1, 2)
        k, v = (t.reshape(batch, length, 2, 4).transpose(1, 2) for t in (k, v))
        a = mt.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)
        b = mt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        c = mt.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                            attn_mask=self.position_bias)
        return (a * b + c).sum()


def losses_and_grads(model, x, keep):
    model.zero_grad()
    loss = model(x, keep)
    loss.backward()
    return [loss.detach()] + [p.grad.clone() for p in model.parameters()]


def inputs():
    x = randn((2, 10, 16), 1)
    keep = torch.rand(2, 1, 1, 10, generator=torch.Generator().manual_seed(2)) < 0.8
    return x, keep


def test_fullgraph_compile_has_no_graph_break():
    torch.manual_seed(0)
    model = Block()
    x, keep = inputs()
    explanation = torch._dynamo.explain(model)(x, keep)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for got, want in zip(losses_and_grads(compiled, x, keep), losses_and_grads(model, x, keep)):
        assert torch.equal(got, want)  # the same kernels, called through the op


def test_fullgraph_compile_with_inductor():
    torch.manual_seed(0)
    model = Block()
    x, keep = inputs()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    for got, want in zip(losses_and_grads(compiled, x, keep), losses_and_grads(model, x, keep)):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)  # inductor fuses the linears


def test_mask_objects_break_the_graph():
    q, k, v = (randn((1, 2, 8, 4), seed) for seed in (1, 2, 3))
    mask = maskattn.Mask().causal().sliding_window(3)

    def with_mask(q, k, v):
        return mt.scaled_dot_product_attention(q, k, v, mask=mask) * 2

    torch._dynamo.reset()
    eager = with_mask(q, k, v)
    assert torch.equal(torch.compile(with_mask, backend="aot_eager")(q, k, v), eager)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="mask= and mods= hold C\\+\\+ objects"):
        torch.compile(with_mask, fullgraph=True, backend="aot_eager")(q, k, v)


@pytest.mark.parametrize("entry", ["attention", "flex_attention"])
def test_mask_object_entry_points_break_the_graph(entry):
    """maskattn.torch.attention and flex_attention run outside the graph under torch.compile
    (their eager call, unchanged) and name why with fullgraph=True."""
    q, k, v = (randn((1, 2, 8, 4), seed) for seed in (1, 2, 3))
    if entry == "attention":
        mask = maskattn.Mask().causal().sliding_window(3)

        def call(q, k, v):
            return mt.attention(q, k, v, mask) * 2

        reason = "maskattn.torch.attention takes maskattn.Mask objects"
    else:
        block_mask = mt.create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx, None, None,
                                          8, 8)

        def call(q, k, v):
            return mt.flex_attention(q, k, v, block_mask=block_mask) * 2

        reason = "maskattn's flex_attention traces score_mod in Python"
    torch._dynamo.reset()
    eager = call(q, k, v)
    assert torch.equal(torch.compile(call, backend="aot_eager")(q, k, v), eager)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=reason):
        torch.compile(call, fullgraph=True, backend="aot_eager")(q, k, v)
