"""Ring (context-parallel) attention over MPI or torch.distributed: ``maskattn.dist``
(docs/distributed.md).

Each MPI process (rank) holds its rows of the sequence — the rows :func:`local_ranges` gives it,
stacked in that order — and calls :func:`ring_attention` with the same mask and modifiers as
every other rank; K/V travel around the ring and each rank gets its rows of the output, exactly
the attention of the whole sequence::

    from mpi4py import MPI
    import maskattn
    from maskattn import dist

    comm = MPI.COMM_WORLD
    q_local = dist.shard(q, comm)            # this rank's rows of a global [B, H, N, D] array
    out_local = dist.ring_attention(q_local, dist.shard(k, comm), dist.shard(v, comm),
                                    maskattn.Mask().causal(), comm=comm, layout="zigzag")

Run it with ``mpirun -np P python script.py``. ``comm`` is an mpi4py communicator, passed to C
as ``MPI_Comm_f2c(comm.py2f())``: maskattn needs no mpi4py headers, only the same MPI library
(Debian's Open MPI; ``pip install mpi4py`` builds against it). Tensors are [B, H, n, D]
("bhld"); NumPy arrays and PyTorch CPU tensors are read in place, as by :func:`maskattn.attention`,
and the outputs are allocated in the caller's framework. :class:`RingAttention` is the PyTorch
autograd Function.

``comm`` may also be a ``torch.distributed`` ProcessGroup (gloo) — run with ``torchrun
--nproc-per-node P script.py`` —: the same ring, written in Python over point-to-point
``torch.distributed`` messages (_torch_ring), on torch CPU tensors. ``comm=None`` is the default
group when torch.distributed is initialised, else mpi4py's COMM_WORLD.
"""

from __future__ import annotations

import sys

from . import _api, _core
from ._dropout import Dropout, backward_seed, checked_dropout, seed_for
from ._arrays import Error, core_view, empty_like_framework, is_torch, new_output, threads_arg
from ._ring_plan import LAYOUTS, checked_layout  # noqa: F401  (LAYOUTS: dist.LAYOUTS)

__all__ = [
    "local_ranges",
    "shard",
    "ring_attention",
    "ring_attention_backward",
    "RingAttention",
    "has_mpi",
]

#: Whether this build of maskattn has the MPI ring (``local_ranges`` and ``shard`` work without).
has_mpi = bool(_core.has_mpi)


def _layout(layout) -> str:
    return checked_layout(layout)


def _torch_distributed_initialised() -> bool:
    # Only a process that imported torch.distributed can have initialised it: maskattn does not
    # import torch for MPI users.
    module = sys.modules.get("torch.distributed")
    return module is not None and module.is_available() and module.is_initialized()


def _is_torch_group(comm) -> bool:
    if sys.modules.get("torch.distributed") is None:
        return False
    from . import _torch_dist

    return _torch_dist.is_process_group(comm) or _torch_dist.is_non_member(comm)


def _transport(comm):
    """("torch", a torch.distributed ProcessGroup) or ("mpi", an mpi4py communicator), by the
    type of ``comm``. ``comm=None``: torch.distributed's default group when it is initialised
    (under torchrun, mpi4py's COMM_WORLD would be a world of one), else mpi4py's COMM_WORLD."""
    if comm is None and _torch_distributed_initialised():
        from . import _torch_dist

        return "torch", _torch_dist.default_group()
    if comm is not None and _is_torch_group(comm):
        return "torch", comm
    return "mpi", _communicator(comm)


def _communicator(comm):
    """``comm`` (None: mpi4py's COMM_WORLD) checked to be an mpi4py intracommunicator."""
    if comm is None:
        try:
            from mpi4py import MPI
        except ImportError as missing:
            raise Error(
                "comm=None needs mpi4py (pip install mpi4py) for MPI.COMM_WORLD, or "
                "torch.distributed initialised (init_process_group) for its default group; pass "
                "an mpi4py communicator or a torch.distributed ProcessGroup"
            ) from missing
        return MPI.COMM_WORLD
    for method in ("py2f", "Get_rank", "Get_size", "allreduce"):
        if not callable(getattr(comm, method, None)):
            raise Error(f"comm must be an mpi4py communicator (mpi4py.MPI.Comm) or a "
                        f"torch.distributed ProcessGroup, got {type(comm).__name__}")
    return comm


def _rank_and_world(comm, who: str):
    transport, comm = _transport(comm)
    if transport == "torch":
        from . import _torch_dist

        return _torch_dist.rank_and_world(comm, who)
    return comm.Get_rank(), comm.Get_size()


def _require_mpi(function: str) -> None:
    if not has_mpi:
        raise Error(
            f"{function} needs maskattn built with MPI: install Open MPI (Debian: libopenmpi-dev "
            "openmpi-bin) and reinstall maskattn (MASKATTN_WITH_MPI is on when MPI is found)"
        )


def local_ranges(length, layout="zigzag", *, rank=None, world=None, comm=None):
    """The global rows [(first, end), ...] rank ``rank`` of ``world`` holds of a sequence of
    ``length`` rows: one range (contiguous) or two (zigzag: chunks r and 2P-1-r of 2P), in the
    order they are stacked locally. Use them to place RoPE positions. ``rank`` and ``world``
    default to ``comm``'s (an mpi4py communicator or a torch.distributed ProcessGroup; None: as
    for :func:`ring_attention`)."""
    layout = _layout(layout)
    if rank is None or world is None:
        comm_rank, comm_world = _rank_and_world(comm, "local_ranges")
        rank = comm_rank if rank is None else rank
        world = comm_world if world is None else world
    return [tuple(r) for r in _core.local_ranges(int(length), layout, int(rank), int(world))]


def shard(x, comm=None, *, layout="zigzag", axis=2):
    """This rank's rows of a global array ``x`` along ``axis`` (2: L of [B, H, L, D]), stacked as
    :func:`ring_attention` expects them. A copy when the rows are two ranges (zigzag)."""
    rank, world = _rank_and_world(comm, "shard")
    ranges = local_ranges(x.shape[axis], layout, rank=rank, world=world)
    index = [slice(None)] * x.ndim
    pieces = []
    for first, end in ranges:
        index[axis] = slice(first, end)
        pieces.append(x[tuple(index)])
    if len(pieces) == 1:
        return pieces[0]
    if is_torch(x):
        import torch

        return torch.cat(pieces, dim=axis)
    import numpy as np

    return np.concatenate(pieces, axis=axis)


def _agreed(comm, prepare, q_len, k_len, dropout):
    """Runs this rank's argument checks (``prepare`` returns its local q and k row counts and
    whatever the call needs; ``dropout`` the call's resolved dropout, or raises) and agrees with
    every rank, in one allgather, on the global lengths (given, or the sum of every rank's rows)
    and the dropout — or, if any rank's checks failed, raises the first failing rank's error on
    every rank, so that no rank is left waiting in the ring."""
    try:
        rows_q, rows_k, prepared = prepare()
        local = (None, rows_q, rows_k, tuple(dropout()))
    except Error as error:
        prepared, local = None, (str(error), 0, 0, None)
    gathered = comm.allgather(local)
    for rank, (message, _, _, _) in enumerate(gathered):
        if message is not None:
            raise Error(message if rank == comm.Get_rank() else f"rank {rank}: {message}")
    _same_dropout([entry[3] for entry in gathered], "ring_attention")
    q_len = sum(entry[1] for entry in gathered) if q_len is None else int(q_len)
    k_len = sum(entry[2] for entry in gathered) if k_len is None else int(k_len)
    return q_len, k_len, prepared, gathered[0][3]


def _same_dropout(dropouts, function):
    """Every rank's (p, seed, offset) must be rank 0's: the dropped pairs are the seed's (P79)."""
    for rank, theirs in enumerate(dropouts):
        if theirs != dropouts[0]:
            raise Error(
                f"{function}: rank {rank} drops with (dropout_p, dropout_seed, dropout_offset) = "
                f"{theirs} but rank 0 with {dropouts[0]}; every rank must give the same dropout "
                f"(draw the seed on one rank and broadcast it, or seed every rank's generator "
                f"alike with torch.manual_seed)")


def ring_attention(q, k, v, mask=None, mods=None, *, comm=None, layout="zigzag", q_len=None,
                   k_len=None, scale=None, dtype=None, threads=None, return_lse=False,
                   kernel="auto", products="auto", dropout_p=0.0, dropout_seed=None,
                   dropout_offset=0):
    """This rank's rows of attention over the whole sequence, computed around the ring.

    q [B, Hq, nq, D], k [B, Hkv, nk, D], v [B, Hkv, nk, Dv]: this rank's rows (local_ranges).
    ``mask`` and ``mods`` describe the whole problem and must be the same on every rank.
    ``q_len``/``k_len``: the global lengths (default: the sum over ranks, one allreduce).
    Returns out [B, Hq, nq, Dv] (and lse [B, Hq, nq] float32 with ``return_lse``). Collective:
    every rank of ``comm`` must call it; an error on any rank is raised on every rank. ``comm``:
    an mpi4py communicator, or a torch.distributed ProcessGroup (gloo; torch CPU tensors).
    ``dropout_p``, ``dropout_seed``, ``dropout_offset``: attention dropout as in
    :func:`maskattn.attention`, the pairs keyed on their global rows, so the ring drops exactly
    the pairs one call over the whole sequence drops; every rank must give the same values (a
    seed drawn from PyTorch's generator when none is given: seed every rank's alike).
    """
    transport, comm = _transport(comm)

    def dropout():
        return seed_for(checked_dropout(dropout_p, dropout_seed, dropout_offset), is_torch(q),
                        "ring_attention")

    if transport == "torch":
        from . import _torch_ring

        return _torch_ring.ring_attention(
            comm, q, k, v, mask, mods, layout=layout, q_len=q_len, k_len=k_len, scale=scale,
            dtype=dtype, threads=threads, return_lse=return_lse, kernel=kernel, products=products,
            dropout=dropout)
    layout = _layout(layout)
    _require_mpi("ring_attention")

    def prepare():
        checked_scale = _api.check_mask_mods_scale(mask, mods, scale)
        (qb, kb, vb), element = _api.input_views((q, k, v), ("q", "k", "v"), dtype, "bhld")
        _api.rank4_shape(qb, "q", "[B,Hq,nq,D]")
        _api.rank4_shape(kb, "k", "[B,Hkv,nk,D]")
        _api.rank4_shape(vb, "v", "[B,Hkv,nk,Dv]")
        return qb.shape[2], kb.shape[2], (checked_scale, qb, kb, vb, element)

    q_len, k_len, (checked_scale, qb, kb, vb, element), agreed_dropout = _agreed(
        comm, prepare, q_len, k_len, dropout)
    batch, heads, rows, _ = qb.shape
    result, out_view = new_output(q, (batch, heads, rows, vb.shape[3]), "bhld")
    lse = lse_view = None
    if return_lse:
        lse = empty_like_framework(q, (batch, heads, rows), "float32")
        lse_view = core_view(lse, "lse", "")[0]
    _core.ring_attention(
        comm.py2f(), q_len, k_len, qb, kb, vb, out_view, mask, mods, lse_view, checked_scale,
        threads_arg(threads), kernel, products, layout, element,
        **Dropout(*agreed_dropout).core_args(),
    )
    return (result, lse) if return_lse else result


def ring_attention_backward(q, k, v, out, lse, dout, mask=None, mods=None, *, comm=None,
                            layout="zigzag", q_len=None, k_len=None, scale=None, dtype=None,
                            threads=None, kernel="auto", products="auto", dropout_p=0.0,
                            dropout_seed=None, dropout_offset=0):
    """(dq, dk, dv) of this rank's rows, given dout = ∂L/∂O of its rows and the ``out`` and
    ``lse`` that :func:`ring_attention` returned for them. dk and dv are the gradients of this
    rank's key rows, summed over every rank's queries. Collective, like the forward. With
    dropout, the forward's ``dropout_p``, ``dropout_seed`` (required) and ``dropout_offset``."""
    transport, comm = _transport(comm)

    def dropout():
        return backward_seed(checked_dropout(dropout_p, dropout_seed, dropout_offset),
                             "ring_attention_backward")

    if transport == "torch":
        from . import _torch_ring

        return _torch_ring.ring_attention_backward(
            comm, q, k, v, out, lse, dout, mask, mods, layout=layout, q_len=q_len, k_len=k_len,
            scale=scale, dtype=dtype, threads=threads, kernel=kernel, products=products,
            dropout=dropout)
    layout = _layout(layout)
    _require_mpi("ring_attention_backward")

    def prepare():
        checked_scale = _api.check_mask_mods_scale(mask, mods, scale)
        views, element = _api.input_views(
            (q, k, v, out, dout), ("q", "k", "v", "out", "dout"), dtype, "bhld"
        )
        lse_view, _ = core_view(lse, "lse", "")
        shapes = [_api.rank4_shape(x, n, a) for x, n, a in zip(
            views[:3], ("q", "k", "v"), ("[B,Hq,nq,D]", "[B,Hkv,nk,D]", "[B,Hkv,nk,Dv]"))]
        return shapes[0][2], shapes[1][2], (checked_scale, views, lse_view, shapes, element)

    q_len, k_len, (checked_scale, views, lse_view, shapes, element), agreed_dropout = _agreed(
        comm, prepare, q_len, k_len, dropout)
    qb, kb, vb, ob, db = views
    grads, grad_views = zip(*(new_output(like, shape, "bhld")
                              for like, shape in zip((q, k, v), shapes)))
    _core.ring_attention_backward(
        comm.py2f(), q_len, k_len, qb, kb, vb, ob, lse_view, db, *grad_views, mask, mods,
        checked_scale, threads_arg(threads), kernel, products, layout, element,
        **Dropout(*agreed_dropout).core_args(),
    )
    return tuple(grads)


def _make_autograd_function():
    import torch

    class RingAttention(torch.autograd.Function):
        """``out = RingAttention.apply(q, k, v, mask, mods, comm, layout, dropout_p, dropout_seed,
        dropout_offset)`` on this rank's rows (torch tensors, [B, H, n, D]; the last three
        optional); ``out.backward()`` runs :func:`ring_attention_backward` around the same ring,
        with the same dropped pairs. ``comm``: an mpi4py communicator or a torch.distributed
        ProcessGroup. Every rank must run the forward and the backward. Without a seed, each rank
        draws one from PyTorch's generator: seed every rank's generator alike (P79 otherwise)."""

        @staticmethod
        def forward(ctx, q, k, v, mask=None, mods=None, comm=None, layout="zigzag", dropout_p=0.0,
                    dropout_seed=None, dropout_offset=0):
            dropout = seed_for(checked_dropout(dropout_p, dropout_seed, dropout_offset), True,
                               "RingAttention")
            out, lse = ring_attention(q.detach(), k.detach(), v.detach(), mask, mods, comm=comm,
                                      layout=layout, return_lse=True, dropout_p=dropout.p,
                                      dropout_seed=dropout.seed, dropout_offset=dropout.offset)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.ring = (mask, mods, comm, layout, dropout)
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse = ctx.saved_tensors
            mask, mods, comm, layout, dropout = ctx.ring
            dq, dk, dv = ring_attention_backward(
                q.detach(), k.detach(), v.detach(), out, lse, dout.contiguous(), mask, mods,
                comm=comm, layout=layout, dropout_p=dropout.p, dropout_seed=dropout.seed,
                dropout_offset=dropout.offset)
            return dq, dk, dv, None, None, None, None, None, None, None

    return RingAttention


def __getattr__(name):
    # RingAttention needs torch; import it only when asked for.
    if name == "RingAttention":
        function = _make_autograd_function()
        globals()["RingAttention"] = function
        return function
    raise AttributeError(f"module 'maskattn.dist' has no attribute {name!r}")
