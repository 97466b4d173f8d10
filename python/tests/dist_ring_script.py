"""Run by test_dist.py under ``mpirun -np P``: maskattn.dist on every rank against one-process
maskattn.attention / attention_backward and the float64 formula, gathered on rank 0.

Every rank builds the same global inputs from one seed, takes its rows with dist.shard, runs the
ring, and sends its rows to rank 0, which puts them back at their global rows (local_ranges) and
compares. Prints one line per case on rank 0; exits 1 on any mismatch (mpirun then fails).
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

import maskattn
from maskattn import dist
from conftest import reference_attention

comm = MPI.COMM_WORLD
failures = 0


def gathered(local, length, layout):
    """Rank 0: the global [B, H, length, ...] array from every rank's rows (else None)."""
    pieces = comm.gather(local, root=0)
    if comm.rank != 0:
        return None
    whole = np.zeros(local.shape[:2] + (length,) + local.shape[3:], local.dtype)
    for rank, piece in enumerate(pieces):
        start = 0
        for first, end in dist.local_ranges(length, layout, rank=rank, world=comm.size):
            whole[:, :, first:end] = piece[:, :, start:start + end - first]
            start += end - first
    return whole


def check(name, actual, expected, tolerance):
    global failures
    if comm.rank != 0:
        return
    error = float(np.max(np.abs(actual.astype(np.float64) - expected.astype(np.float64))))
    ok = error <= tolerance
    failures += not ok
    print(f"{name}: np={comm.size} max|diff|={error:.3e} (tolerance {tolerance:g}) "
          f"{'ok' if ok else 'FAILED'}", flush=True)


def case(name, shape, mask, keep, layout, dropout=None):
    """``dropout``: maskattn's dropout keyword arguments for the ring and the one-process calls
    alike; the float64 formula then takes the pairs attention_weights shows dropped."""
    dropout = dropout or {}
    batch, q_heads, kv_heads, length, dim = shape
    rng = np.random.default_rng(7)
    q = rng.uniform(-1, 1, (batch, q_heads, length, dim)).astype(np.float32)
    k = rng.uniform(-1, 1, (batch, kv_heads, length, dim)).astype(np.float32)
    v = rng.uniform(-1, 1, (batch, kv_heads, length, dim)).astype(np.float32)
    dout = rng.uniform(-1, 1, (batch, q_heads, length, dim)).astype(np.float32)
    local = {n: dist.shard(x, comm, layout=layout) for n, x in
             (("q", q), ("k", k), ("v", v), ("dout", dout))}
    out, lse = dist.ring_attention(local["q"], local["k"], local["v"], mask, comm=comm,
                                   layout=layout, return_lse=True, **dropout)
    grads = dist.ring_attention_backward(local["q"], local["k"], local["v"], out, lse,
                                         local["dout"], mask, comm=comm, layout=layout, **dropout)
    whole = [gathered(x, length, layout) for x in (out, lse, *grads)]
    if comm.rank == 0:
        one_out, one_lse = maskattn.attention(q, k, v, mask, return_lse=True, **dropout)
        one_grads = maskattn.attention_backward(q, k, v, one_out, one_lse, dout, mask, **dropout)
        reference_out, reference_lse = reference_attention(q, k, v, keep=keep)
        if dropout:  # O = W·V with W the dropped weights (float64 product), LSE undropped
            weights = maskattn.attention_weights(q, k, mask, **dropout).astype(np.float64)
            group = q_heads // kv_heads
            reference_out = weights @ np.repeat(v.astype(np.float64), group, axis=1)
        check(f"{name} out vs attention()", whole[0], one_out, 1e-5)
        check(f"{name} lse vs attention()", whole[1], one_lse, 1e-5)
        check(f"{name} out vs float64", whole[0], reference_out, 1e-5)
        check(f"{name} lse vs float64", whole[1], reference_lse, 1e-5)
        for label, ring_grad, one_grad in zip(("dq", "dk", "dv"), whole[2:], one_grads):
            check(f"{name} {label} vs attention_backward()", ring_grad, one_grad, 1e-5)


def torch_case():
    """The autograd Function: out.backward() runs the ring backward."""
    try:
        import torch
    except ImportError:
        if comm.rank == 0:
            print("torch autograd: skipped (no torch)", flush=True)
        return
    rng = np.random.default_rng(3)
    q, k, v = (rng.uniform(-1, 1, (1, 2, 29, 8)).astype(np.float32) for _ in range(3))
    mask = maskattn.Mask().causal()
    tensors = [torch.tensor(dist.shard(x, comm), requires_grad=True) for x in (q, k, v)]
    out = dist.RingAttention.apply(*tensors, mask, None, comm, "zigzag")
    out.sum().backward()
    dq = gathered(tensors[0].grad.numpy(), 29, "zigzag")
    if comm.rank == 0:
        one_out, one_lse = maskattn.attention(q, k, v, mask, return_lse=True)
        expected = maskattn.attention_backward(q, k, v, one_out, one_lse, np.ones_like(one_out),
                                               mask)[0]
        check("torch autograd dq", dq, expected, 1e-5)


L = 37  # not a multiple of 2P for P = 2, 3, 4
causal = np.tril(np.ones((L, L), dtype=bool))
window = causal & ~np.tril(np.ones((L, L), dtype=bool), -6)  # sliding_window(6): 6 keys
case("causal zigzag GQA", (2, 4, 2, L, 8), maskattn.Mask().causal(), causal, "zigzag")
case("sliding window contiguous", (1, 2, 2, L, 8), maskattn.Mask().sliding_window(6), window,
     "contiguous")
case("dropout causal zigzag GQA", (2, 4, 2, L, 8), maskattn.Mask().causal(), causal, "zigzag",
     {"dropout_p": 0.3, "dropout_seed": 99, "dropout_offset": 2})
torch_case()
if comm.size > 1:  # P79: a rank whose dropout differs makes every rank raise, none waits
    try:
        x = dist.shard(np.ones((1, 1, L, 4), np.float32), comm)
        dist.ring_attention(x, x, x, comm=comm, dropout_p=0.1, dropout_seed=comm.rank)
        message = None
    except maskattn.Error as error:
        message = str(error)
    expected = ("ring_attention: rank 1 drops with (dropout_p, dropout_seed, dropout_offset) = "
                "(0.1, 1, 0) but rank 0 with (0.1, 0, 0); every rank must give the same dropout")
    ok = message is not None and message.startswith(expected)
    failures += not ok
    print(f"P79 on rank {comm.rank}: {'ok' if ok else 'FAILED: ' + str(message)}", flush=True)
sys.exit(1 if comm.allreduce(failures) else 0)
