"""The ring over a torch.distributed process group: the forward and backward behind
``maskattn.dist`` when ``comm`` is a ProcessGroup (docs/distributed.md, "Over torch.distributed").

The MPI ring (src/ring/ring_rank.cc, ring_mpi.cc) written in Python with the public calls: the
same plan (_ring_plan), the same calls in the same order, the same float32 merges and sums, so the
results are the same bits as the MPI ring's. Each rank holds its rows (local_ranges); at step s it
holds the key/value blocks of rank (r − s) mod P, computes each query block against them with
``attention(frame=…)`` into a float32 part, and merges the parts with ``merge_partials`` in the
plan's order (step, then key block), rounding once at the end. The next step's blocks travel with
``isend``/``irecv`` — gloo moves them on its own threads — while this step computes (the calls
release the GIL). The backward walks the same ring: dQ accumulates at home in float32
(``float32_grads=True``), and the float32 dK/dV accumulator of a key block travels one step behind
the block; each rank adds its share and sends the sum on, or home to the block's owner after the
block's last hop. _torch_dist has the group, the messages and the agreement on errors.

Every per-slice call takes one ``slice_options`` dict built once per ring call (scale, dtype,
threads, kernel, products), so an option of attention/attention_backward reaches every slice by
being added to that dict alone.
"""

from __future__ import annotations

import torch

from . import _api
from ._arrays import Error
from ._ring_plan import make_plan
from ._torch_dist import (
    Exchange,
    Ring,
    agree_after_ring,
    agree_on_problem,
    problem_parameters,
    recorded,
    require_cpu_tensors,
)

# Tags of the ring's messages: a key block's K/V, its travelling dK/dV, its dK/dV going home
# (block 0 or 1: zigzag ranks hold two). Far from the small tags a caller's own point-to-point
# messages on the group would use.
_TAG_BASE = 0x6D61_0000


def kv_tag(block: int) -> int:
    return _TAG_BASE + block


def grad_tag(block: int) -> int:
    return _TAG_BASE + 2 + block


def home_tag(block: int) -> int:
    return _TAG_BASE + 4 + block


def slice_options(scale, dtype, threads, kernel, products, dropout) -> dict:
    """The keyword arguments every per-slice attention/attention_backward call takes. Dropout's
    pairs are keyed on their global rows (the slices' frames), so every slice drops the pairs one
    call over the whole sequence drops."""
    return {"scale": scale, "dtype": dtype, "threads": threads, "kernel": kernel,
            "products": products, "dropout_p": dropout.p, "dropout_seed": dropout.seed,
            "dropout_offset": dropout.offset}


def has_sinks(mods) -> bool:
    return mods is not None and len(mods.sinks) > 0


def local_blocks(x, ranges):
    """``x``'s local rows (axis 2) cut into the rank's blocks: views, no copy."""
    blocks, first = [], 0
    for rows in ranges:
        blocks.append(x[:, :, first:first + rows.size])
        first += rows.size
    return blocks


def stacked(blocks, dtype):
    """The blocks stacked along axis 2 again, in ``dtype`` (rounded once)."""
    whole = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2)
    return whole.to(dtype)


class KvPacking:
    """How a key block travels: its K [B,Hkv,rows,D] then V [B,Hkv,rows,Dv] as one byte buffer
    in the input dtype, and its dK/dV accumulator laid out alike as one float32 buffer."""

    def __init__(self, k, v):
        self.batch, self.kv_heads, _, self.head_dim = k.shape
        self.value_dim = v.shape[3]
        self.dtype = k.dtype

    def _counts(self, rows):
        per_row = self.batch * self.kv_heads * rows
        return per_row * self.head_dim, per_row * self.value_dim

    def pack(self, k, v, first, rows):
        parts = [x[:, :, first:first + rows].reshape(-1) for x in (k, v)]
        return torch.cat(parts).view(torch.uint8)

    def empty(self, rows):
        elements = sum(self._counts(rows))
        return torch.empty(elements * torch.empty((), dtype=self.dtype).element_size(),
                           dtype=torch.uint8)

    def _split(self, flat, rows):
        k_count, _ = self._counts(rows)
        shape = (self.batch, self.kv_heads, rows)
        return (flat[:k_count].view(*shape, self.head_dim),
                flat[k_count:].view(*shape, self.value_dim))

    def view(self, buffer, rows):
        """(k, v) of a packed block."""
        return self._split(buffer.view(self.dtype), rows)

    def zero_grads(self, rows):
        return torch.zeros(sum(self._counts(rows)), dtype=torch.float32)

    def empty_grads(self, rows):
        return torch.empty(sum(self._counts(rows)), dtype=torch.float32)

    def grad_view(self, buffer, rows):
        """(dk, dv) of a packed float32 accumulator."""
        return self._split(buffer, rows)


class KvTravel:
    """The K/V blocks this rank holds, step by step: its own at step 0, then what the left rank
    passes on. Each step receives the next step's blocks while it computes."""

    def __init__(self, ring, plan, packing, k, v):
        self.ring, self.plan, self.packing = ring, plan, packing
        own = plan.k_blocks[ring.rank]
        self.held, first = {}, 0
        for block, rows in enumerate(own):
            self.held[block] = packing.pack(k, v, first, rows.size)
            first += rows.size
        self.incoming = {}

    def _rows(self, step, block):
        return self.plan.k_blocks[self.plan.step(self.ring.rank, step).origin][block].size

    def post(self, step, exchange):
        """Receives of step + 1's blocks from the left; sends of the forwarded ones to the right."""
        self.incoming = {}
        if step + 1 < self.ring.world:
            for block in self.plan.step(self.ring.rank, step + 1).held:
                buffer = self.packing.empty(self._rows(step + 1, block))
                exchange.receive(buffer, self.ring.left, kv_tag(block))
                self.incoming[block] = buffer
        for block in self.plan.step(self.ring.rank, step).forwarded:
            exchange.send(self.held[block], self.ring.right, kv_tag(block))

    def views(self, step):
        """{block: (k, v)} of the blocks held at ``step``."""
        return {block: self.packing.view(buffer, self._rows(step, block))
                for block, buffer in self.held.items()}

    def advance(self):
        self.held = self.incoming


class _RankState:
    """What every call of one rank's ring shares: the plan, the global frame and the options."""

    def __init__(self, ring, plan, problem, mask, mods, options):
        self.rank = ring.rank
        self.plan, self.problem = plan, problem
        self.mask, self.mods, self.options = mask, mods, options
        self.q_ranges = plan.q_blocks[ring.rank]

    def calls(self, step):
        """(call, frame) for each call of ``step``, in the plan's order."""
        plan_step = self.plan.step(self.rank, step)
        k_ranges = self.plan.k_blocks[plan_step.origin]
        for call in plan_step.calls:
            yield call, (self.q_ranges[call.q_block].first, k_ranges[call.k_block].first,
                         self.problem.q_len, self.problem.k_len)


class ForwardRank(_RankState):
    """One rank's forward: float32 parts merged per query block in the plan's order."""

    def __init__(self, ring, plan, problem, mask, mods, options, q, value_dim):
        super().__init__(ring, plan, problem, mask, mods, options)
        self.q_blocks = local_blocks(q, self.q_ranges)
        self.value_dim = value_dim
        self.merged = [None] * len(self.q_blocks)  # (out, lse) so far, float32

    def run_step(self, step, held):
        for call, frame in self.calls(step):
            q = self.q_blocks[call.q_block]
            k, v = held[call.k_block]
            part_out = torch.empty((*q.shape[:3], self.value_dim), dtype=torch.float32)
            part = _api.attention(q, k, v, self.mask, self.mods, out=part_out, return_lse=True,
                                  frame=frame, count_sinks=call.count_sinks, **self.options)
            so_far = self.merged[call.q_block]
            self.merged[call.q_block] = part if so_far is None else _api.merge_partials(
                [so_far, part])

    def finish(self, dtype):
        """(out in ``dtype``, lse float32) of the rank's rows; a block no key reached: 0, −inf."""
        outs, lses = [], []
        for q, merged in zip(self.q_blocks, self.merged):
            if merged is None:
                merged = (torch.zeros((*q.shape[:3], self.value_dim), dtype=torch.float32),
                          torch.full(tuple(q.shape[:3]), -torch.inf, dtype=torch.float32))
            outs.append(merged[0])
            lses.append(merged[1])
        return stacked(outs, dtype), stacked(lses, torch.float32)


class BackwardRank(_RankState):
    """One rank's backward: dQ accumulates at home (float32); each step's dK/dV go into the
    shares of the held blocks that GradTravel hands out."""

    def __init__(self, ring, plan, problem, mask, mods, options, tensors):
        super().__init__(ring, plan, problem, mask, mods, options)
        self.blocks = [local_blocks(x, self.q_ranges) for x in tensors]  # q, out, lse, dout
        self.dq = [torch.zeros(q.shape, dtype=torch.float32) for q in self.blocks[0]]

    def run_step(self, step, held, shares):
        for call, frame in self.calls(step):
            q, out, lse, dout = (blocks[call.q_block] for blocks in self.blocks)
            k, v = held[call.k_block]
            dq, dk, dv = _api.attention_backward(q, k, v, out, lse, dout, self.mask, self.mods,
                                                 frame=frame, float32_grads=True, **self.options)
            self.dq[call.q_block] += dq
            share_dk, share_dv = shares[call.k_block]
            share_dk += dk
            share_dv += dv


class GradTravel:
    """The float32 dK/dV accumulators of one backward: each step adds this rank's share to what
    came from the left and sends the sum on, or home after the block's last hop; the own blocks'
    sums come home (their receives posted first, waited last)."""

    def __init__(self, ring, plan, packing):
        self.ring, self.plan, self.packing = ring, plan, packing
        own = plan.k_blocks[ring.rank]
        self.own = [packing.zero_grads(rows.size) for rows in own]
        self.home = Exchange(ring)
        for block in range(len(own)):
            hops = plan.last_hop(ring.rank, block)
            if hops > 0:
                self.home.receive(self.own[block], (ring.rank + hops) % ring.world,
                                  home_tag(block))
        self.incoming, self.shares = {}, {}

    def _rows(self, step, block):
        return self.plan.k_blocks[self.plan.step(self.ring.rank, step).origin][block].size

    def begin_step(self, step, exchange):
        """Posts the receives of the held blocks' accumulators (sent by the left rank after its
        step − 1) and returns {block: (dk, dv)}: this step's zeroed shares."""
        held = self.plan.step(self.ring.rank, step).held
        self.incoming = {}
        if step > 0:
            for block in held:
                self.incoming[block] = self.packing.empty_grads(self._rows(step, block))
                exchange.receive(self.incoming[block], self.ring.left, grad_tag(block))
        self.shares = {block: self.packing.zero_grads(self._rows(step, block)) for block in held}
        return {block: self.packing.grad_view(share, self._rows(step, block))
                for block, share in self.shares.items()}

    def end_step(self, step, exchange):
        """After the step's messages: accumulator = incoming + share, then on, home, or kept."""
        plan_step = self.plan.step(self.ring.rank, step)
        for block in plan_step.held:
            total = self.shares[block]
            if step > 0:
                total = self.incoming[block] + total
            if self.plan.last_hop(plan_step.origin, block) > step:
                exchange.send(total, self.ring.right, grad_tag(block))
            elif step > 0:
                exchange.send(total, plan_step.origin, home_tag(block))
            else:
                self.own[block] = total

    def finish(self, k_dtype, v_dtype):
        """(dk, dv) of the rank's own key rows, once every accumulator is home."""
        self.home.wait()
        own = self.plan.k_blocks[self.ring.rank]
        grads = [self.packing.grad_view(total, rows.size) for total, rows in zip(self.own, own)]
        return (stacked([dk for dk, _ in grads], k_dtype),
                stacked([dv for _, dv in grads], v_dtype))


# ---------------------------------------------------------------------------------------------
# The entry points
# ---------------------------------------------------------------------------------------------

def _checked(arrays, names, mask, mods, scale, dtype, axes):
    """This rank's checks of its arrays; returns the scale as the calls take it."""
    require_cpu_tensors(zip(names, arrays))
    checked_scale = _api.check_mask_mods_scale(mask, mods, scale)
    views, _ = _api.input_views(arrays, names, dtype, "bhld")
    for view, name, expected in zip(views, names, axes):
        _api.rank4_shape(view, name, expected)
    for name, x in zip(names[1:], arrays[1:]):
        if x.dtype != arrays[0].dtype:
            raise Error(f"{name} has dtype {x.dtype} but q has {arrays[0].dtype}; q, k, v "
                        "(and out, dout) share one element type")
    return checked_scale


def ring_attention(group, q, k, v, mask, mods, *, layout, q_len, k_len, scale, dtype, threads,
                   return_lse, kernel, products, dropout):
    """maskattn.dist.ring_attention over a torch.distributed process group. ``dropout()``: the
    call's checked dropout, its seed chosen (agreed between the ranks like the problem)."""
    ring = Ring(group, "ring_attention")
    resolved = []

    def prepare():
        checked_scale = _checked((q, k, v), ("q", "k", "v"), mask, mods, scale, dtype,
                                 ("[B,Hq,nq,D]", "[B,Hkv,nk,D]", "[B,Hkv,nk,Dv]"))
        resolved.append(dropout())
        rows = {"q": (q.shape[2], "q"), "k": (k.shape[2], "k"), "v": (v.shape[2], "k")}
        return rows, problem_parameters(q, k, v, mask, mods, checked_scale, resolved[0])

    problem = agree_on_problem(ring, prepare, layout, q_len, k_len)
    options = slice_options(scale, dtype, threads, kernel, products, resolved[0])
    plan = make_plan(mask, q.shape[0], q.shape[1], problem.q_len, problem.k_len, problem.layout,
                     ring.world, has_sinks(mods))
    forward = ForwardRank(ring, plan, problem, mask, mods, options, q, v.shape[3])
    travel = KvTravel(ring, plan, KvPacking(k, v), k, v)
    error = None
    for step in range(ring.world):
        exchange = Exchange(ring)
        travel.post(step, exchange)
        error = recorded(lambda: forward.run_step(step, travel.views(step)), error)
        exchange.wait()
        travel.advance()
    agree_after_ring(ring, error)
    out, lse = forward.finish(q.dtype)
    return (out, lse) if return_lse else out


def ring_attention_backward(group, q, k, v, out, lse, dout, mask, mods, *, layout, q_len, k_len,
                            scale, dtype, threads, kernel, products, dropout):
    """maskattn.dist.ring_attention_backward over a torch.distributed process group."""
    ring = Ring(group, "ring_attention_backward")
    resolved = []

    def prepare():
        checked_scale = _checked((q, k, v, out, dout), ("q", "k", "v", "out", "dout"), mask,
                                 mods, scale, dtype, ("[B,Hq,nq,D]", "[B,Hkv,nk,D]",
                                                      "[B,Hkv,nk,Dv]", "[B,Hq,nq,Dv]",
                                                      "[B,Hq,nq,Dv]"))
        require_cpu_tensors((("lse", lse),))
        if lse.dim() != 3:
            raise Error(f"lse has shape {list(lse.shape)}; expected [B,Hq,nq] (the merged LSE "
                        "the forward ring returned)")
        rows = {name: (x.shape[2], side) for name, x, side in (
            ("q", q, "q"), ("k", k, "k"), ("v", v, "k"), ("out", out, "q"), ("lse", lse, "q"),
            ("dout", dout, "q"))}
        resolved.append(dropout())
        return rows, problem_parameters(q, k, v, mask, mods, checked_scale, resolved[0])

    problem = agree_on_problem(ring, prepare, layout, q_len, k_len)
    options = slice_options(scale, dtype, threads, kernel, products, resolved[0])
    plan = make_plan(mask, q.shape[0], q.shape[1], problem.q_len, problem.k_len, problem.layout,
                     ring.world, has_sinks(mods))
    backward = BackwardRank(ring, plan, problem, mask, mods, options, (q, out, lse, dout))
    packing = KvPacking(k, v)
    travel = KvTravel(ring, plan, packing, k, v)
    grads = GradTravel(ring, plan, packing)
    error = None
    exchange = Exchange(ring)  # carries the accumulator sends of one step into the next
    for step in range(ring.world):
        travel.post(step, exchange)
        shares = grads.begin_step(step, exchange)
        error = recorded(lambda: backward.run_step(step, travel.views(step), shares), error)
        exchange.wait()
        exchange = Exchange(ring)
        travel.advance()
        grads.end_step(step, exchange)
    exchange.wait()  # the last step's sums, on their way home
    dk, dv = grads.finish(k.dtype, v.dtype)
    agree_after_ring(ring, error)
    return stacked(backward.dq, q.dtype), dk, dv
