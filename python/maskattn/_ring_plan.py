"""The ring's plan, for the rings written in Python (maskattn.dist over torch.distributed).

It mirrors the C++ ring's schedule (src/ring/ring_schedule.h), so that both rings make the same
calls in the same order and send the same blocks. Every rank computes the whole plan from the
global problem, the same on every rank, so no rank ever waits for a message that is not coming.

Rank r holds at step s the key blocks of origin o = (r − s) mod P. Block b of origin o is useful
to rank o + t when one of that rank's query blocks has an allowed pair with it (``any_allowed``
on the global frame); it travels o → o+1 → … up to its last hop, the largest such t, and no
further. A (query block, key block) pair the mask hides entirely is not computed. With sinks,
each query block also calls its own first key block at step 0 (even if the mask hides it) with
``count_sinks=True``, so that every row counts the sinks exactly once.
"""

from __future__ import annotations

from typing import NamedTuple

from . import _api, _core
from ._arrays import Error

LAYOUTS = ("zigzag", "contiguous")


def checked_layout(layout) -> str:
    """``layout`` if it is one the rings know, else maskattn.Error (catalogue P65)."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise Error(f"layout must be 'zigzag' or 'contiguous', got {layout!r}")
    return layout


class RowRange(NamedTuple):
    """Global rows [first, end)."""

    first: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.first


def row_ranges(length: int, layout: str, rank: int, world: int) -> list[RowRange]:
    """The global rows rank ``rank`` of ``world`` holds, in the order it stacks them."""
    return [RowRange(*r) for r in _core.local_ranges(int(length), layout, int(rank), int(world))]


class PairCall(NamedTuple):
    q_block: int  # index into the rank's query blocks
    k_block: int  # index into the origin's key blocks
    count_sinks: bool  # the one part per query row whose softmax counts mods.sinks


class RingStep(NamedTuple):
    origin: int  # whose key/value blocks the rank holds
    held: tuple  # the origin's blocks held, ascending (step 0: all of them)
    calls: tuple  # PairCalls, in the fixed order the parts are merged in
    forwarded: tuple  # held blocks sent on to rank + 1 for the next step
    skipped: int  # (query block, origin's block) pairs the mask hides


class RingPlan:
    """Every rank's blocks and steps for one ring run (see the module's docstring)."""

    def __init__(self, q_len, k_len, layout, world, allowed, with_sinks):
        """``allowed(q_rows, k_rows)``: whether the mask allows any pair of the two RowRanges."""
        self.world = world
        self.q_blocks = [row_ranges(q_len, layout, rank, world) for rank in range(world)]
        self.k_blocks = [row_ranges(k_len, layout, rank, world) for rank in range(world)]
        # allowed_pair[rank][a][origin][b]: query block a of rank against block b of origin.
        allowed_pair = [[[[allowed(q, k) for k in self.k_blocks[origin]] for origin in range(world)]
                         for q in self.q_blocks[rank]] for rank in range(world)]
        self._last_hop = [[0] * len(blocks) for blocks in self.k_blocks]
        for rank in range(world):
            for per_origin in allowed_pair[rank]:
                for origin in range(world):
                    hop = (rank - origin) % world
                    for b, yes in enumerate(per_origin[origin]):
                        if yes and hop > self._last_hop[origin][b]:
                            self._last_hop[origin][b] = hop
        self._steps = [[self._plan_step(rank, s, allowed_pair[rank], with_sinks)
                        for s in range(world)] for rank in range(world)]

    def _plan_step(self, rank, step, allowed_here, with_sinks) -> RingStep:
        origin = (rank - step) % self.world
        hops = self._last_hop[origin]
        blocks = range(len(self.k_blocks[origin]))
        held = tuple(b for b in blocks if step == 0 or hops[b] >= step)
        forwarded = tuple(b for b in blocks if hops[b] > step)
        calls, skipped = [], 0
        for a in range(len(self.q_blocks[rank])):
            for b in blocks:
                allowed = allowed_here[a][origin][b]
                skipped += not allowed  # held or not: the mask hides the pair
                sink_part = with_sinks and step == 0 and b == 0
                if allowed or sink_part:
                    calls.append(PairCall(a, b, sink_part))
        return RingStep(origin, held, tuple(calls), forwarded, skipped)

    def step(self, rank: int, step: int) -> RingStep:
        return self._steps[rank][step]

    def last_hop(self, origin: int, block: int) -> int:
        """The last step at which block ``block`` of ``origin`` is held (0: it never leaves)."""
        return self._last_hop[origin][block]


def make_plan(mask, batch, q_heads, q_len, k_len, layout, world, with_sinks) -> RingPlan:
    """The plan of a problem with this mask: pairs tested with any_allowed on the global frame."""

    def allowed(q: RowRange, k: RowRange) -> bool:
        return _api.any_allowed(mask, batch, q_heads, q.size, k.size,
                                frame=(q.first, k.first, q_len, k_len))

    return RingPlan(q_len, k_len, layout, world, allowed, with_sinks)
