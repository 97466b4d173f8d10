"""maskattn.dist over torch.distributed process groups (docs/distributed.md, "Over
torch.distributed").

The ring itself runs in other processes: ``python -m torch.distributed.run --standalone
--nproc-per-node P dist_torch_script.py`` compares every rank's rows against one-process maskattn
and the float64 formula and exits 1 on a mismatch. Here: that run for P = 1, 2 and 3; one run of
3 ranks in which one rank's arguments are wrong, case by case, and every rank must raise the same
error; the ring's plan against the bytes and calls the C++ ring counted (docs/distributed.md); and
the catalogue rows P74–P78, in this process on a one-rank gloo group where they need no peers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as tdist

import maskattn
from maskattn import _ring_plan, dist

SCRIPT = Path(__file__).resolve().parent / "dist_torch_script.py"
# 2 masks × 2 dtypes × 2 layouts × (out, lse, dq, dk, dv), 2 cases with attention dropout × 5,
# and the autograd Function's 3 grads without and with dropout.
CHECKS_PER_RUN = 2 * 2 * 2 * 5 + 2 * 5 + 2 * 3


def launch(ranks, *arguments, timeout=120):
    """The script under torch.distributed.run with ``ranks`` processes on a free port."""
    package = Path(maskattn.__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(package)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               str(ranks), str(SCRIPT), *arguments]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)


def assert_every_check_passed(result):
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED" not in result.stdout
    assert result.stdout.count(" ok\n") == CHECKS_PER_RUN, result.stdout  # every check ran


@pytest.fixture(scope="module")
def run_of_3(tmp_path_factory):
    """One 3-rank run: the checks, then the error cases, each rank writing {case: message} to
    rank<r>.json. It must end in time: a rank left waiting would hang it."""
    directory = tmp_path_factory.mktemp("ring_errors")
    start = time.monotonic()
    result = launch(3, "--errors", str(directory), timeout=90)
    assert time.monotonic() - start < 90
    return result, directory


@pytest.mark.parametrize("ranks", [1, 2])
def test_ring_over_gloo_matches_one_process(ranks):
    assert_every_check_passed(launch(ranks))


def test_ring_of_3_ranks_over_gloo_matches_one_process(run_of_3):
    assert_every_check_passed(run_of_3[0])


# --- errors agreed across 3 ranks ----------------------------------------------------------------


@pytest.fixture(scope="module")
def error_run(run_of_3):
    """{rank: {case: the message it raised, or None}} of the 3-rank run's error cases."""
    result, directory = run_of_3
    assert result.returncode == 0, result.stdout + result.stderr
    return {rank: json.loads((directory / f"rank{rank}.json").read_text()) for rank in range(3)}


def agreed(error_run, case):
    """The message every rank raised in ``case`` (all three must have raised the same)."""
    messages = [error_run[rank][case] for rank in range(3)]
    assert messages[0] is not None, f"{case}: rank 0 raised nothing"
    assert messages == [messages[0]] * 3, f"{case}: the ranks raised different errors: {messages}"
    return messages[0]


def test_a_bad_shape_on_one_rank_raises_on_every_rank(error_run):
    assert agreed(error_run, "bad shape") == (
        "ring_attention: rank 1 of 3: q has shape [4, 12, 8]; expected [B,Hq,nq,D]")


def test_an_error_inside_the_ring_raises_on_every_rank_after_the_last_step(error_run):
    assert re.fullmatch(r"ring_attention: rank 2 of 3: bias shape \[1,1,37,38\] does not "
                        r"broadcast to scores \[2,4,37,37\].*", agreed(error_run, "during the ring"))


# --- the plan against the C++ ring's counts ------------------------------------------------------


def bytes_and_calls(mask, layout, length=16384, world=4, heads=8, dim=64):
    """Per rank: MiB of K/V sent (f32) and calls made, over one forward of the plan."""
    plan = _ring_plan.make_plan(mask, 1, heads, length, length, layout, world, False)
    bytes_per_row = 2 * heads * dim * 4
    sent, calls = [], []
    for rank in range(world):
        steps = [plan.step(rank, s) for s in range(world)]
        rows = sum(plan.k_blocks[step.origin][b].size for step in steps for b in step.forwarded)
        sent.append(rows * bytes_per_row / 2**20)
        calls.append(sum(len(step.calls) for step in steps))
    return sent, calls


def test_the_plan_sends_what_the_cpp_ring_sends():
    """docs/distributed.md, "Bytes per rank": MiB each rank of the MPI ring sent (RingStats) for
    N = 16384, H = 8, D = 64, f32, np = 4; the Python ring walks the same plan."""
    causal, window = maskattn.Mask().causal(), maskattn.Mask().sliding_window(512)
    assert bytes_and_calls(None, "zigzag") == ([48] * 4, [14, 14, 14, 7])
    assert bytes_and_calls(causal, "zigzag") == ([40, 40, 40, 48], [8, 8, 8, 4])
    assert bytes_and_calls(causal, "contiguous") == ([16, 32, 48, 0], [1, 2, 3, 4])
    assert bytes_and_calls(window, "contiguous")[0] == [16, 16, 16, 0]
    assert bytes_and_calls(window, "zigzag")[0] == [32, 32, 24, 32]


def test_sinks_are_counted_in_one_call_per_query_block():
    """Each query block's call on its own first key block at step 0 counts the sinks, even when
    the mask hides the pair: with every key hidden, those are the only calls."""
    for mask, hidden in ((maskattn.Mask().key_lengths([0]), True), (None, False)):
        plan = _ring_plan.make_plan(mask, 1, 1, 20, 20, "zigzag", 3, True)
        for rank in range(3):
            calls = [(s, c) for s in range(3) for c in plan.step(rank, s).calls]
            sink_calls = [(s, tuple(c)) for s, c in calls if c.count_sinks]
            assert sink_calls == [(0, (a, 0, True)) for a in range(len(plan.q_blocks[rank]))]
            every_pair = sum(len(plan.q_blocks[rank]) * len(plan.k_blocks[origin])
                             for origin in range(3))
            assert len(calls) == (len(sink_calls) if hidden else every_pair)


# --- catalogue rows, in this process -------------------------------------------------------------


@pytest.fixture
def one_rank_group():
    """A gloo group of this process alone (torch.distributed is left uninitialised after)."""
    tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
    try:
        yield tdist.group.WORLD
    finally:
        if tdist.is_initialized():
            tdist.destroy_process_group()


def tensors(rows=8):
    generator = torch.Generator().manual_seed(0)
    return [torch.rand((1, 2, rows, 8), generator=generator) for _ in range(3)]


def test_comm_none_is_the_default_group_once_torch_distributed_is_initialised(one_rank_group):
    q, k, v = tensors()
    out = dist.ring_attention(q, k, v, maskattn.Mask().causal())  # comm=None
    torch.testing.assert_close(out, maskattn.attention(q, k, v, maskattn.Mask().causal()),
                               rtol=0, atol=0)
    # The torch transport was chosen: it takes torch tensors only (P76).
    with pytest.raises(maskattn.Error, match="q is a numpy.ndarray; over a torch.distributed"):
        dist.ring_attention(q.numpy(), k.numpy(), v.numpy())
    assert dist.local_ranges(10) == [(0, 10)]


def test_P74_torch_distributed_not_initialised_or_not_a_member(one_rank_group):
    q, k, v = tensors()
    with pytest.raises(maskattn.Error, match="ring_attention: this process is not a member of "
                                             "comm's process group"):
        dist.ring_attention(q, k, v, comm=tdist.GroupMember.NON_GROUP_MEMBER)
    tdist.destroy_process_group()
    with pytest.raises(maskattn.Error, match="ring_attention_backward: comm is a torch.distributed "
                                             "process group but torch.distributed is not "
                                             "initialised; call torch.distributed.init_process"):
        dist.ring_attention_backward(q, k, v, q, q[..., 0], q, comm=one_rank_group)
    tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
    with pytest.raises(maskattn.Error, match="shard: comm is not a process group of the current "
                                             "torch.distributed world"):
        dist.shard(q, one_rank_group)  # a group of the world destroyed above


@pytest.mark.parametrize("backend", ["nccl", "cuda:nccl"])
def test_P75_a_process_group_that_cannot_carry_cpu_tensors(one_rank_group, monkeypatch, backend):
    # No NCCL group can be made without a GPU: the group reports the backend an NCCL group would.
    monkeypatch.setattr(tdist, "get_backend", lambda group=None: backend)
    q, k, v = tensors()
    with pytest.raises(maskattn.Error, match=f"ring_attention: comm's process group has backend "
                                             f"'{backend}', which cannot carry CPU tensors; .*"
                                             r"new_group\(backend='gloo'\)"):
        dist.ring_attention(q, k, v, comm=one_rank_group)


def test_P76_arrays_that_are_not_torch_cpu_tensors(one_rank_group, error_run):
    q, k, v = tensors()
    meta = torch.empty(q.shape, device="meta")
    with pytest.raises(maskattn.Error, match=r"ring_attention: rank 0 of 1: k \(shape \[1, 2, 8, "
                                             r"8\]\) is on device 'meta', not in CPU memory"):
        dist.ring_attention(q, meta, v, comm=one_rank_group)
    with pytest.raises(maskattn.Error, match="v has dtype torch.bfloat16 but q has torch.float32"):
        dist.ring_attention(q, k, v.bfloat16(), comm=one_rank_group)
    assert agreed(error_run, "numpy") == (
        "ring_attention_backward: rank 0 of 3: out is a numpy.ndarray; over a torch.distributed "
        "process group the ring takes torch tensors (torch.from_numpy makes one of a NumPy array "
        "without a copy)")


def test_P77_ranks_that_describe_different_problems(error_run):
    assert agreed(error_run, "other problem") == (
        "ring_attention: rank 2 of 3: value dim = 4 differs from rank 0's 8; every rank must "
        "describe the same global problem")
    assert agreed(error_run, "other dropout") == (
        "ring_attention: rank 1 of 3: dropout = (0.2, 2, 0) differs from rank 0's (0.2, 1, 0); "
        "every rank must describe the same global problem")


def test_P78_rows_that_are_not_the_ranks_local_ranges(one_rank_group, error_run):
    assert agreed(error_run, "rows") == (
        "ring_attention: rank 0 of 3: q holds 12 rows but this rank's query rows are 13: "
        "local_ranges(37, 'zigzag', rank=0, world=3) = [(0, 6), (30, 37)]")
    q, k, v = tensors()
    with pytest.raises(maskattn.Error, match=r"rank 0 of 1: q_len must be None \(the sum of every "
                                             r"rank's rows\) or an int >= 1, got 8.0"):
        dist.ring_attention(q, k, v, comm=one_rank_group, q_len=8.0)
    with pytest.raises(maskattn.Error, match=r"rank 0 of 1: lse has shape \[1, 2, 8, 1\]; "
                                             r"expected \[B,Hq,nq\]"):
        dist.ring_attention_backward(q, k, v, q, q[..., :1], q, comm=one_rank_group)
    with pytest.raises(maskattn.Error, match="rank 0 of 1: k holds 7 rows but this rank's key "
                                             r"rows are 8: local_ranges\(8, 'contiguous'"):
        dist.ring_attention(q, k[:, :, 1:], v, comm=one_rank_group, layout="contiguous", k_len=8)
    np.testing.assert_array_equal(dist.local_ranges(8, "contiguous", comm=one_rank_group),
                                  [(0, 8)])
