"""What the ring over a torch.distributed process group needs of the group: checking it, its
point-to-point messages, and the ranks' agreement on errors (_torch_ring has the ring itself).

Errors. Before the first message every rank checks its arguments and the ranks agree in one
``all_gather_object``: on the checks' results, on the global problem (lengths, batch, heads,
dims, dtype, …) and on each rank's rows against local_ranges; an error anywhere raises the
lowest failing rank's message on every rank, as ``"<who>: rank r of P: <message>"`` (the MPI
ring's C++ agreement words it the same way). An error during the ring (from one slice's call)
does not stop the messages, whose sizes depend only on the plan; the ranks agree on it after the
last step. So bad input never leaves a rank waiting. What makes the group itself unusable (not
initialised, NCCL) is raised on the calling rank alone: there is no one to agree with.
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch
import torch.distributed as tdist

from ._arrays import Error, is_torch
from ._ring_plan import checked_layout, row_ranges

# Backends whose process groups carry CPU tensors.
CPU_BACKENDS = ("gloo", "mpi")


def is_process_group(comm) -> bool:
    return isinstance(comm, tdist.ProcessGroup)


def is_non_member(comm) -> bool:
    """Whether ``comm`` is what ``new_group`` returns on a rank outside the group."""
    return comm is tdist.GroupMember.NON_GROUP_MEMBER


def is_initialised() -> bool:
    return tdist.is_available() and tdist.is_initialized()


def default_group():
    return tdist.group.WORLD


def _cpu_backend(group) -> str:
    """The backend that carries ``group``'s CPU tensors ("gloo" for "cpu:gloo,cuda:nccl")."""
    name = str(tdist.get_backend(group))
    if ":" not in name:
        return name
    devices = dict(part.split(":", 1) for part in name.split(","))
    return devices.get("cpu", "none")


def rank_and_world(group, who: str = "comm") -> tuple[int, int]:
    """This process's rank in ``group`` and the group's size, after checking that the group can
    run a ring here (catalogue P74, P75). Raised on the calling rank only: without a working
    group there is no one to agree with."""
    if is_non_member(group):
        raise Error(f"{who}: this process is not a member of comm's process group (new_group "
                    "returned GroupMember.NON_GROUP_MEMBER here); only its members call the ring")
    if not is_initialised():
        raise Error(f"{who}: comm is a torch.distributed process group but torch.distributed is "
                    "not initialised; call torch.distributed.init_process_group first")
    try:
        rank, world = tdist.get_rank(group), tdist.get_world_size(group)
    except (ValueError, RuntimeError) as error:  # a group of a world destroyed since
        raise Error(f"{who}: comm is not a process group of the current torch.distributed "
                    f"world ({error})") from None
    backend = _cpu_backend(group)
    if backend not in CPU_BACKENDS:
        raise Error(f"{who}: comm's process group has backend '{tdist.get_backend(group)}', which "
                    "cannot carry CPU tensors; maskattn computes on the CPU: use a gloo group "
                    "(torch.distributed.new_group(backend='gloo'))")
    return rank, world


class Ring:
    """The calling rank's place in a process group."""

    def __init__(self, group, who: str):
        self.group, self.who = group, who
        self.rank, self.world = rank_and_world(group, who)
        self.left = (self.rank - 1) % self.world
        self.right = (self.rank + 1) % self.world

    def global_rank(self, group_rank: int) -> int:
        return tdist.get_global_rank(self.group, group_rank)

    def failure(self, messages):
        """The Error every rank raises: the lowest failing rank's message, or None."""
        for rank, message in enumerate(messages):
            if message is not None:
                return Error(f"{self.who}: rank {rank} of {self.world}: {message}")
        return None


class Exchange:
    """One step's non-blocking messages: posted, then waited for together."""

    def __init__(self, ring: Ring):
        self.ring = ring
        self.works = []
        self.buffers = []  # a send's tensor must live until it is done

    def send(self, tensor, peer: int, tag: int):
        self.works.append(tdist.isend(tensor, self.ring.global_rank(peer), self.ring.group, tag))
        self.buffers.append(tensor)

    def receive(self, tensor, peer: int, tag: int):
        self.works.append(tdist.irecv(tensor, self.ring.global_rank(peer), self.ring.group, tag))

    def wait(self):
        for work in self.works:
            work.wait()
        self.works, self.buffers = [], []


# ---------------------------------------------------------------------------------------------
# Agreeing on the problem
# ---------------------------------------------------------------------------------------------

def require_cpu_tensors(named) -> None:
    """The ring sends torch tensors: every array must be one, in CPU memory (catalogue P76)."""
    for name, x in named:
        if not is_torch(x):
            raise Error(f"{name} is a {type(x).__module__}.{type(x).__name__}; over a "
                        "torch.distributed process group the ring takes torch tensors "
                        "(torch.from_numpy makes one of a NumPy array without a copy)")
        if not x.is_cpu:
            raise Error(f"{name} (shape {list(x.shape)}) is on device '{x.device}', not in CPU "
                        "memory; maskattn computes on the CPU: move it with .cpu()")


def _length(value, name: str):
    if value is None:
        return None
    try:
        length = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        length = None
    if length is None or length < 1:
        raise Error(f"{name} must be None (the sum of every rank's rows) or an int >= 1, "
                    f"got {value!r}")
    return length


def problem_parameters(q, k, v, mask, mods, scale, dropout) -> dict:
    """What every rank must give alike, by name: the global problem, its dropout (the pairs
    dropped are the seed's) and the message sizes."""
    return {"batch": q.shape[0], "q heads": q.shape[1], "kv heads": k.shape[1],
            "head dim": q.shape[3], "value dim": v.shape[3], "dtype": str(q.dtype),
            "mask": None if mask is None else mask.describe(),
            "sinks": 0 if mods is None else len(mods.sinks),
            "bias given": mods is not None and mods.bias is not None, "scale": scale,
            "dropout": tuple(dropout)}


class Problem(NamedTuple):
    """The global problem every rank agreed on."""

    q_len: int
    k_len: int
    layout: str


def agree_on_problem(ring: Ring, prepare, layout, q_len, k_len) -> Problem:
    """Runs this rank's checks (``prepare`` returns ({array name: (its local rows, "q" or "k")},
    problem_parameters(…)); the names "q" and "k" are required) and agrees with every rank, in one
    all_gather_object, on success, the global parameters and each rank's rows; raises the same
    Error on every rank otherwise (catalogue P77, P78, and every error of the checks)."""
    try:
        local_rows, parameters = prepare()
        parameters = dict(parameters, layout=checked_layout(layout),
                          q_len=_length(q_len, "q_len"), k_len=_length(k_len, "k_len"))
        local = (None, local_rows, parameters)
    except Error as error:
        local = (str(error), None, None)
    gathered = [None] * ring.world
    tdist.all_gather_object(gathered, local, group=ring.group)
    failure = ring.failure([message for message, _, _ in gathered])
    if failure is None:
        failure = ring.failure(_disagreements([entry[2] for entry in gathered]))
    if failure is not None:
        raise failure
    given = gathered[0][2]
    lengths = {}
    for side in ("q", "k"):  # given, or the sum of every rank's q (k) rows
        total = sum(entry[1][side][0] for entry in gathered)
        lengths[side] = given[f"{side}_len"] if given[f"{side}_len"] is not None else total
    failure = ring.failure([_rows_mismatch(entry[1], lengths, given["layout"], rank, ring.world)
                            for rank, entry in enumerate(gathered)])
    if failure is not None:
        raise failure
    return Problem(lengths["q"], lengths["k"], given["layout"])


def _disagreements(parameters):
    """Per rank: None, or the first parameter that differs from rank 0's."""
    messages = []
    for theirs in parameters:
        differs = [name for name in parameters[0] if theirs[name] != parameters[0][name]]
        messages.append(None if not differs else
                        f"{differs[0]} = {theirs[differs[0]]!r} differs from rank 0's "
                        f"{parameters[0][differs[0]]!r}; every rank must describe the same "
                        "global problem")
    return messages


def _rows_mismatch(local_rows, lengths, layout, rank, world):
    """None, or why rank ``rank``'s arrays do not hold the rows local_ranges gives it."""
    expected = {}
    for side in ("q", "k"):
        try:
            ranges = row_ranges(lengths[side], layout, rank, world)
        except Error as error:
            return str(error)
        expected[side] = (sum(r.size for r in ranges), [tuple(r) for r in ranges])
    for name, (rows, side) in local_rows.items():
        count, ranges = expected[side]
        if rows != count:
            return (f"{name} holds {rows} rows but this rank's {'query' if side == 'q' else 'key'}"
                    f" rows are {count}: local_ranges({lengths[side]}, {layout!r}, rank={rank}, "
                    f"world={world}) = {ranges}")
    return None


def agree_after_ring(ring: Ring, error) -> None:
    """After the last message: raises the lowest failing rank's error on every rank, if any rank
    recorded one during the ring (a flag all_reduce, and the messages only then)."""
    flag = torch.tensor([0 if error is None else 1], dtype=torch.int64)
    tdist.all_reduce(flag, group=ring.group)
    if int(flag.item()) == 0:
        return
    messages = [None] * ring.world
    tdist.all_gather_object(messages, error, group=ring.group)
    raise ring.failure(messages)


def recorded(compute, error):
    """``error`` if one was recorded already (the rank then only relays messages), else the
    message of the Error ``compute()`` raises, or None."""
    if error is not None:
        return error
    try:
        compute()
    except Error as failure:
        return str(failure)
    return None
