"""Run by test_dist_torch.py under ``python -m torch.distributed.run --nproc-per-node P``:
maskattn.dist over a gloo process group on every rank against one-process maskattn.attention /
attention_backward and the float64 formula, gathered on rank 0.

Every rank builds the same global inputs from one seed, takes its rows with dist.shard, runs the
ring forward and backward, and sends its rows to rank 0, which puts them back at their global
rows (local_ranges) and compares: max |ring − one process| ≤ 2 · max |one process − float64| +
1e-6, and bit for bit when P = 1 (the ring is then one call per block). Prints one line per
check on rank 0 and exits 1 on any mismatch.

``--errors DIR`` runs the error cases after the checks: each rank writes DIR/rank<r>.json,
{case: the message it raised, or None}, and the test compares the ranks' files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as tdist

import maskattn
from maskattn import dist
from conftest import torch_attention

tdist.init_process_group("gloo")
GROUP = tdist.new_group(backend="gloo")  # not the default group: the ring takes any gloo group
RANK, WORLD = tdist.get_rank(), tdist.get_world_size()
B, HQ, HKV, L, D = 2, 4, 2, 37, 8  # L = 37: not a multiple of 2P for P = 2, 3
failures = 0


def gathered(local, length, layout):
    """Rank 0: the global [B, H, length, ...] float64 array from every rank's rows (else None)."""
    pieces = [None] * WORLD
    tdist.all_gather_object(pieces, local.detach().double().numpy(), group=GROUP)
    if RANK != 0:
        return None
    whole = np.zeros(pieces[0].shape[:2] + (length,) + pieces[0].shape[3:])
    for rank, piece in enumerate(pieces):
        start = 0
        for first, end in dist.local_ranges(length, layout, rank=rank, world=WORLD):
            whole[:, :, first:end] = piece[:, :, start:start + end - first]
            start += end - first
    return whole


def check(name, ring, single, exact):
    """The rule against one process and the float64 formula; bitwise when P = 1."""
    global failures
    if RANK != 0:
        return
    single = single.detach().double().numpy()
    exact = exact.detach().double().numpy()
    finite = np.isfinite(single)
    error = float(np.max(np.abs(ring - single), where=finite, initial=0.0))
    bound = 2 * float(np.max(np.abs(single - exact), where=finite, initial=0.0)) + 1e-6
    if WORLD == 1:
        bound = 0.0
    ok = error <= bound and np.array_equal(np.isfinite(ring), finite)
    failures += not ok
    print(f"{name}: P={WORLD} max|ring - one process|={error:.3e} (bound {bound:.3e}) "
          f"{'ok' if ok else 'FAILED'}", flush=True)


def global_inputs(dtype, seed=7):
    generator = torch.Generator().manual_seed(seed)

    def uniform(heads, rows=L):
        return (torch.rand((B, heads, rows, D), generator=generator) * 2 - 1).to(dtype)

    return uniform(HQ), uniform(HKV), uniform(HKV), uniform(HQ)  # q, k, v, dout


def float64_reference(q, k, v, dout, mask, dropout=None):
    """(out, lse, dq, dk, dv) of the float64 formula on the same (rounded) inputs; with
    ``dropout`` (maskattn's keyword arguments), the pairs maskattn.attention_weights shows dropped
    held fixed: each weight times 0 or 1/(1 - p')."""
    keep = maskattn.allowed_pairs(mask, B, HQ, L).astype(bool)
    factors = None
    if dropout:
        dropped = maskattn.attention_weights(q, k, mask, **dropout).double()
        plain = maskattn.attention_weights(q, k, mask).double()
        kept_scale = 65536 / (65536 - round(dropout["dropout_p"] * 65536))  # 1/(1 - p')
        factors = torch.where((plain > 0) & (dropped > 0), kept_scale, 0.0).double()
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    out, lse = torch_attention(*leaves, keep=keep, dropout=factors)
    out.backward(dout.double())
    return (out, lse, *(x.grad for x in leaves))


def case(name, mask, dtype, layout, dropout=None):
    """``dropout``: maskattn's dropout keyword arguments, the same for the ring and the one
    process call (the ring drops the pairs the whole call drops)."""
    dropout = dropout or {}
    q, k, v, dout = global_inputs(dtype)
    local = {n: dist.shard(x, GROUP, layout=layout) for n, x in
             (("q", q), ("k", k), ("v", v), ("dout", dout))}
    out, lse = dist.ring_attention(local["q"], local["k"], local["v"], mask, comm=GROUP,
                                   layout=layout, return_lse=True, **dropout)
    grads = dist.ring_attention_backward(local["q"], local["k"], local["v"], out, lse,
                                         local["dout"], mask, comm=GROUP, layout=layout,
                                         **dropout)
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads), "dtypes"
    ring = [gathered(x, L, layout) for x in (out, lse, *grads)]
    if RANK == 0:
        one_out, one_lse = maskattn.attention(q, k, v, mask, return_lse=True, **dropout)
        one = (one_out, one_lse, *maskattn.attention_backward(q, k, v, one_out, one_lse, dout,
                                                              mask, **dropout))
        exact = float64_reference(q, k, v, dout, mask, dropout)
        for label, ring_x, one_x, exact_x in zip(("out", "lse", "dq", "dk", "dv"), ring, one,
                                                 exact):
            check(f"{name} {label}", ring_x, one_x, exact_x)


def autograd_case(dropout_p=0.0):
    """RingAttention.apply: out.backward() runs the ring backward (comm=None: the default group,
    torch.distributed being initialised). With dropout and no seed, every rank draws the seed
    from its own PyTorch generator, seeded alike here."""
    q, k, v, dout = global_inputs(torch.float32, seed=3)
    mask = maskattn.Mask().causal().key_lengths([L, 30])
    leaves = [dist.shard(x, layout="zigzag").clone().requires_grad_() for x in (q, k, v)]
    torch.manual_seed(77)
    out = dist.RingAttention.apply(*leaves, mask, None, None, "zigzag", dropout_p)
    (out * dist.shard(dout, layout="zigzag")).sum().backward()
    ring = [gathered(x.grad, L, "zigzag") for x in leaves]
    if RANK == 0:
        torch.manual_seed(77)  # the seed RingAttention drew
        dropout = {"dropout_p": dropout_p, "dropout_seed": int(
            torch.randint(0, 2**63 - 1, (), dtype=torch.int64))} if dropout_p else {}
        one_out, one_lse = maskattn.attention(q, k, v, mask, return_lse=True, **dropout)
        one = maskattn.attention_backward(q, k, v, one_out, one_lse, dout, mask, **dropout)
        exact = float64_reference(q, k, v, dout, mask, dropout)[2:]
        for label, ring_x, one_x, exact_x in zip(("dq", "dk", "dv"), ring, one, exact):
            check(f"RingAttention autograd{' with dropout' if dropout else ''} {label}", ring_x,
                  one_x, exact_x)


def numerical_cases():
    documents = torch.tensor([[0] * 10 + [1] * 15 + [2] * 12, [0] * 20 + [1] * 17])
    masks = {
        "causal + key padding": maskattn.Mask().causal().key_lengths([L, 23]),
        "packed documents": maskattn.Mask().causal().segments(documents.numpy()),
    }
    for mask_name, mask in masks.items():
        for dtype in (torch.float32, torch.bfloat16):
            for layout in ("zigzag", "contiguous"):
                case(f"{mask_name} {str(dtype)[6:]} {layout}", mask, dtype, layout)
    # Attention dropout: the slices drop the pairs of the whole call (keyed on global rows).
    dropout = {"dropout_p": 0.3, "dropout_seed": 2024, "dropout_offset": 1}
    case("dropout, causal + key padding float32 zigzag", masks["causal + key padding"],
         torch.float32, "zigzag", dropout)
    case("dropout, packed documents bfloat16 contiguous", masks["packed documents"],
         torch.bfloat16, "contiguous", dropout)
    autograd_case()
    autograd_case(dropout_p=0.2)


def raised(call):
    """The message of the maskattn.Error ``call()`` raises on this rank, or None."""
    try:
        call()
    except maskattn.Error as error:
        return str(error)
    return None


def error_cases():
    """{case: what this rank raised}: one rank's arguments are wrong in each case."""
    q, k, v, _ = global_inputs(torch.float32)
    local = [dist.shard(x, GROUP) for x in (q, k, v)]
    mask = maskattn.Mask().causal()
    bad_shape = list(local)
    if RANK == 1 % WORLD:  # rank 1 passes a 3-axis q
        bad_shape[0] = local[0][0]
    messages = {"bad shape": raised(lambda: dist.ring_attention(*bad_shape, mask, comm=GROUP))}
    other_problem = list(local)
    if RANK == WORLD - 1:  # the last rank's v has another value dim
        other_problem[2] = local[2][..., :4]
    messages["other problem"] = raised(lambda: dist.ring_attention(*other_problem, mask,
                                                                   comm=GROUP))
    short = list(local)
    if RANK == 0:  # rank 0 holds one query row too few of the 37
        short[0] = local[0][:, :, 1:]
    messages["rows"] = raised(lambda: dist.ring_attention(*short, mask, comm=GROUP, q_len=L,
                                                          k_len=L))
    # An error inside the ring (a bias of the wrong shape on one rank: the calls refuse it):
    # the other ranks finish their steps and every rank raises it after the last one.
    bias = torch.zeros((1, 1, L, L + (RANK == WORLD - 1)))
    mods = maskattn.ScoreMods(bias=bias)
    messages["during the ring"] = raised(lambda: dist.ring_attention(*local, mask, mods,
                                                                     comm=GROUP))
    # Different dropout seeds on one rank: the ranks would drop different pairs (P77).
    messages["other dropout"] = raised(lambda: dist.ring_attention(
        *local, mask, comm=GROUP, dropout_p=0.2, dropout_seed=1 + (RANK == 1 % WORLD)))
    out, lse = dist.ring_attention(*local, mask, comm=GROUP, return_lse=True)
    backward_inputs = [*local, out, lse, out]
    if RANK == 0:
        backward_inputs[3] = out.numpy()  # a NumPy out: the torch ring takes tensors
    messages["numpy"] = raised(lambda: dist.ring_attention_backward(*backward_inputs, mask,
                                                                    comm=GROUP))
    return messages


if __name__ == "__main__":
    numerical_cases()
    if sys.argv[1:2] == ["--errors"]:
        Path(sys.argv[2], f"rank{RANK}.json").write_text(json.dumps(error_cases()))
    total = torch.tensor([failures])
    tdist.all_reduce(total)
    tdist.destroy_process_group()
    sys.exit(1 if int(total) else 0)
