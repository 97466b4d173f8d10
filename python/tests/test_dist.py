"""maskattn.dist: ring attention over MPI (docs/distributed.md).

The ring itself runs in other processes: ``mpirun -np P python dist_ring_script.py``, which
compares every rank's rows against one-process maskattn and the float64 formula and exits 1 on a
mismatch. Here: that run for P = 1, 2 and 3, local_ranges, shard, and the catalogue rows P64–P66.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import maskattn
from maskattn import dist

SCRIPT = Path(__file__).resolve().parent / "dist_ring_script.py"


def mpirun_available() -> bool:
    if not dist.has_mpi or shutil.which("mpirun") is None:
        return False
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def run_script(ranks):
    package = Path(maskattn.__file__).resolve().parent.parent
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none",
               PYTHONPATH=os.pathsep.join([str(package), os.environ.get("PYTHONPATH", "")]))
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
               "--mca", "btl", "self,vader", "-x", "OMP_NUM_THREADS=1", "-x", "PYTHONPATH",
               "-np", str(ranks), sys.executable, str(SCRIPT)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED" not in result.stdout
    return result.stdout


RUNS = {}  # ranks → the script's output, shared by the tests that read it


@pytest.mark.skipif(not mpirun_available(), reason="needs maskattn built with MPI, mpirun and mpi4py")
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_ring_under_mpirun_matches_one_process(ranks):
    RUNS[ranks] = run_script(ranks)
    assert RUNS[ranks].count(" ok") >= 20, RUNS[ranks]  # every case ran, the dropout case too
    assert "dropout causal zigzag GQA dv vs attention_backward(): np=" in RUNS[ranks]


@pytest.mark.skipif(not mpirun_available(), reason="needs maskattn built with MPI, mpirun and mpi4py")
def test_P79_ring_ranks_with_different_dropout():
    output = RUNS.get(2) or run_script(2)  # rank r passes dropout_seed=r: both raise, none waits
    assert "P79 on rank 0: ok" in output and "P79 on rank 1: ok" in output, output


def test_local_ranges_cover_the_sequence_once():
    for layout in ("zigzag", "contiguous"):
        for world in (1, 2, 3, 4):
            rows = []
            for rank in range(world):
                for first, end in dist.local_ranges(37, layout, rank=rank, world=world):
                    rows.extend(range(first, end))
            assert sorted(rows) == list(range(37)), (layout, world)
    assert dist.local_ranges(16, "zigzag", rank=0, world=4) == [(0, 2), (14, 16)]
    assert dist.local_ranges(16, "zigzag", rank=3, world=4) == [(6, 10)]  # chunks 3 and 4 touch


class FakeComm:
    """What dist needs of an mpi4py communicator, for one rank of `size` (no MPI)."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def py2f(self):
        return 0

    def allreduce(self, value):
        return value


def test_shard_takes_this_ranks_rows_in_order():
    x = np.arange(2 * 1 * 8 * 1).reshape(2, 1, 8, 1)
    part = dist.shard(x, FakeComm(1, 2), layout="zigzag")  # chunks 1 and 2 of 4: rows 2-5
    np.testing.assert_array_equal(part, x[:, :, 2:6])
    part = dist.shard(x, FakeComm(0, 2), layout="zigzag")  # chunks 0 and 3: rows 0-1, 6-7
    np.testing.assert_array_equal(part, np.concatenate([x[:, :, 0:2], x[:, :, 6:8]], axis=2))


def test_P64_comm_not_an_mpi4py_communicator():
    q = np.zeros((1, 1, 4, 8), np.float32)
    with pytest.raises(maskattn.Error, match="comm must be an mpi4py communicator .* got int"):
        dist.ring_attention(q, q, q, comm=5)
    with pytest.raises(maskattn.Error, match="comm must be an mpi4py communicator"):
        dist.ring_attention_backward(q, q, q, q, np.zeros((1, 1, 4), np.float32), q, comm="world")


def test_P65_layout_not_zigzag_or_contiguous():
    with pytest.raises(maskattn.Error, match="layout must be 'zigzag' or 'contiguous', got 'stripe'"):
        dist.local_ranges(16, "stripe", rank=0, world=2)
    q = np.zeros((1, 1, 4, 8), np.float32)
    with pytest.raises(maskattn.Error, match="layout must be 'zigzag' or 'contiguous', got 1"):
        dist.ring_attention(q, q, q, comm=FakeComm(0, 1), layout=1)


def test_P66_ring_without_mpi_in_this_build():
    if dist.has_mpi:
        pytest.skip("this build has MPI; the error is for builds without it")
    q = np.zeros((1, 1, 4, 8), np.float32)
    with pytest.raises(maskattn.Error, match="ring_attention needs maskattn built with MPI"):
        dist.ring_attention(q, q, q, comm=FakeComm(0, 1))
