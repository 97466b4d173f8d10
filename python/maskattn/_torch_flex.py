"""``torch.nn.attention.flex_attention``'s ``create_block_mask`` and ``flex_attention`` on maskattn.

Design:

* ``mask_mod`` and ``score_mod`` are **traced** (_torch_trace: called once with symbolic b, h,
  q_idx, kv_idx and score) into maskattn programs, which the kernels evaluate a 64 × 64 tile at a
  time: no dense keep mask and no bias, O(tiles + captured tensors) memory at any length. The
  tensors a mod indexes (``document_id[q_idx]``, ``rel[h, q_idx - kv_idx + L]``) are the
  programs' tables, read in place; a float32 table that requires grad (a learned relative-position
  bias, a per-head gate) is an input of the autograd Function and receives its gradient.
* ``create_block_mask`` makes a maskattn ``Mask`` holding the mask program; its block map (empty /
  full / partial tiles) is computed once, from the program, and cached in the Mask.
* A PyTorch ``BlockMask`` given to ``flex_attention`` becomes one program as well: its traced
  mask_mod inside its listed partial blocks, every pair of its full blocks (block tables of
  ⌈Q/BLOCK⌉ × ⌈KV/BLOCK⌉ entries, read by the program) — what PyTorch's compiled kernel computes.
* Positions are indices here (FlexAttention's q_idx, kv_idx): a program's q and kv are rows,
  top-left, whatever the lengths.
"""

from __future__ import annotations

import threading
import weakref

import torch

from . import _api, _core
from ._torch_autograd import Call, attention_and_lse, check_tensors, core_mods_of
from ._torch_trace import trace_mask_mod, trace_score_mod

Error = _core.Error

__all__ = ["BlockMask", "create_block_mask", "flex_attention"]


class BlockMask:
    """A mask built by :func:`create_block_mask`: ``.mask`` is the maskattn Mask inside (a mask
    program), ``.shape`` is (B, H, Q_LEN, KV_LEN) with 1 for a broadcast B or H (as in PyTorch)."""

    def __init__(self, mask, shape, block_size, mask_mod, program=None):
        self.mask = mask
        self.shape = tuple(shape)
        self.BLOCK_SIZE = tuple(block_size)
        self.mask_mod = mask_mod
        self.program = program  # the traced TracedProgram (None: every pair)

    @property
    def seq_lengths(self):
        return self.shape[2], self.shape[3]

    def allowed(self) -> torch.Tensor:
        """The element-level mask [B, H, Q_LEN, KV_LEN] (bool, True = attend): Q_LEN × KV_LEN
        bytes per (b, h), for inspection."""
        pairs = _api.allowed_pairs(self.mask, *self.shape)
        return torch.from_numpy(pairs).to(torch.bool)

    def to_dense(self) -> torch.Tensor:
        """The block-level mask [B, H, ⌈Q_LEN/BLOCK⌉, ⌈KV_LEN/BLOCK⌉] (int32, 1 = the block holds
        an allowed pair), like PyTorch's ``BlockMask.to_dense()``; from the tile scan, with no
        element-level mask. Blocks of a multiple of 64 are read from the 64 × 64 tile scan the
        Mask caches (and the kernels use), so inspecting costs no second scan."""
        block_q, block_k = self.BLOCK_SIZE
        tile_q = 64 if block_q % 64 == 0 else block_q
        tile_k = 64 if block_k % 64 == 0 else block_k
        tiles = torch.from_numpy(
            _api.block_map(self.mask, *self.shape, tile_q=tile_q, tile_k=tile_k) != 0)
        group_q, group_k = block_q // tile_q, block_k // tile_k
        batch, heads, rows, cols = tiles.shape
        padded = torch.zeros(batch, heads, -(-rows // group_q) * group_q,
                             -(-cols // group_k) * group_k, dtype=torch.bool)
        padded[:, :, :rows, :cols] = tiles
        blocks = padded.reshape(batch, heads, padded.shape[2] // group_q, group_q,
                                padded.shape[3] // group_k, group_k)
        return blocks.any(dim=5).any(dim=3).to(torch.int32)

    def sparsity(self) -> float:
        """The percentage of blocks with no allowed pair (skipped), as PyTorch reports it."""
        dense = self.to_dense()
        return 100.0 * (1.0 - dense.sum().item() / dense.numel())

    def to_string(self, grid_size=(20, 20)) -> str:
        dense = self.to_dense()[0, 0]
        rows, cols = min(dense.shape[0], grid_size[0]), min(dense.shape[1], grid_size[1])
        lines = ["".join("█" if dense[i, j] else "░" for j in range(cols)) for i in range(rows)]
        return "\n".join(lines)

    def __repr__(self):
        name = getattr(self.mask_mod, "__name__", repr(self.mask_mod))
        return (f"maskattn.torch.BlockMask(shape={self.shape}, sparsity={self.sparsity():.2f}%, "
                f"mask_mod={name})")


def _check_dimension(value, name: str, allow_none: bool):
    if value is None and allow_none:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        allowed = "None or " if allow_none else ""
        raise Error(f"create_block_mask: {name} must be {allowed}an int >= 1, got {value!r}")
    return value


def _block_size(block_size):
    sizes = (block_size, block_size) if isinstance(block_size, int) else tuple(block_size)
    if len(sizes) != 2 or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                              for n in sizes):
        raise Error(f"create_block_mask: BLOCK_SIZE must be an int >= 1 or a pair of them, "
                    f"got {block_size!r}")
    return sizes


def _program_mask(program, shape) -> _core.Mask:
    """The Mask of a compiled mask program, checked (E128) against the whole problem."""
    program.check(*shape)
    return _core.Mask().program(program).set_alignment("top_left")


@torch.compiler.disable(reason="create_block_mask traces mask_mod in Python")
def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device="cpu", BLOCK_SIZE=128,
                      _compile=False):
    """``torch.nn.attention.flex_attention.create_block_mask`` for maskattn: ``mask_mod(b, h,
    q_idx, kv_idx) → bool`` traced once into a mask program, in a reusable :class:`BlockMask`.
    ``B``/``H`` None broadcast. ``_compile`` is accepted and ignored (nothing is evaluated here
    but the tile scan)."""
    batch = _check_dimension(B, "B", True)
    heads = _check_dimension(H, "H", True)
    q_len = _check_dimension(Q_LEN, "Q_LEN", False)
    kv_len = _check_dimension(KV_LEN, "KV_LEN", False)
    block_size = _block_size(BLOCK_SIZE)
    shape = (batch, heads, q_len, kv_len)
    if device is not None and torch.device(device).type != "cpu":
        raise Error(f"create_block_mask: device={device!r}; maskattn computes on the CPU "
                    f"(device='cpu')")
    if mask_mod is None:
        return BlockMask(_core.Mask().set_alignment("top_left"), shape, block_size, None)
    if not callable(mask_mod):
        raise Error(f"create_block_mask: mask_mod must be callable, got {type(mask_mod).__name__}")
    traced = trace_mask_mod(mask_mod)
    mask = _program_mask(traced.program(), shape)
    return BlockMask(mask, shape, block_size, mask_mod, traced)


class _TorchBlockMasks:
    """PyTorch BlockMasks given to maskattn's flex_attention, converted once and remembered
    while they live."""

    def __init__(self):
        self._entries = {}
        self._lock = threading.Lock()

    def get(self, torch_block_mask):
        key = id(torch_block_mask)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0]() is torch_block_mask:
                return entry[1]
        converted = _convert_torch_block_mask(torch_block_mask)
        ref = weakref.ref(torch_block_mask, lambda dead, key=key: self._entries.pop(key, None))
        with self._lock:
            self._entries[key] = (ref, converted)
        return converted


def _block_table(num_blocks, indices, rows, cols):
    """PyTorch's per-row block lists (the first num_blocks[b, h, r] entries of indices[b, h, r]
    are the key blocks of query block r) as a bool table [b·h, rows, cols] (b, h ∈ {1, B}, {1, H}),
    and (b, h) sizes; None when there are no lists."""
    if num_blocks is None or indices is None:
        return None
    listed = torch.arange(indices.shape[-1]) < num_blocks.unsqueeze(-1).long()
    # Unlisted entries go to a spare column, dropped afterwards, so that scatter never clears.
    columns = torch.where(listed, indices.long().clamp(0, cols - 1), torch.tensor(cols))
    grid = torch.zeros(*indices.shape[:-1], cols + 1, dtype=torch.bool)
    grid.scatter_(-1, columns, True)
    grid = grid[..., :rows, :cols]
    table_batch, table_heads = grid.shape[0], grid.shape[1]
    table = grid.reshape(table_batch * table_heads, rows, cols).contiguous()
    return table, table_batch, table_heads


def _block_read(name, table, block_size):
    """The program text reading a block table at the pair's block: name[b·H + h, q // BQ, …]."""
    _, table_batch, table_heads = table
    b = "b" if table_batch > 1 else "0"
    h = "h" if table_heads > 1 else "0"
    row = f"{b} * {table_heads} + {h}" if table_batch > 1 else h
    return f"{name}[{row}, q // {block_size[0]}, kv // {block_size[1]}]"


def _convert_torch_block_mask(torch_block_mask):
    """A PyTorch BlockMask as the pairs PyTorch's compiled flex_attention computes, in one
    program: mask_mod inside the listed partial blocks, every pair of the full blocks, nothing
    elsewhere. (Through mask_mod alone, a BlockMask made by BlockMask.from_kv_blocks, whose
    mask_mod allows everything, would lose its block sparsity.)"""
    shape = tuple(int(n) for n in torch_block_mask.shape)
    block_size = tuple(int(n) for n in torch_block_mask.BLOCK_SIZE)
    rows, cols = -(-shape[2] // block_size[0]), -(-shape[3] // block_size[1])
    mask_mod = torch_block_mask.mask_mod
    traced = trace_mask_mod(mask_mod) if mask_mod is not None else None
    text = traced.text if traced is not None else "(0 == 0)"
    tables = dict(traced.tables) if traced is not None else {}
    partial = _block_table(torch_block_mask.kv_num_blocks, torch_block_mask.kv_indices, rows,
                           cols)
    full = _block_table(getattr(torch_block_mask, "full_kv_num_blocks", None),
                        getattr(torch_block_mask, "full_kv_indices", None), rows, cols)
    for name, table, combine in (("partial_blocks", partial, "&"), ("full_blocks", full, "|")):
        if table is None:
            continue
        while name in tables:
            name += "_"
        tables[name] = table[0]
        text = f"({text}) {combine} {_block_read(name, table, block_size)}"
    program = _core.Program.mask(text, **{n: t.detach() for n, t in tables.items()})
    return BlockMask(_program_mask(program, shape), shape, block_size, mask_mod, traced)


_torch_block_masks = _TorchBlockMasks()


def _our_block_mask(block_mask):
    """None, a BlockMask, or a maskattn.Mask (used as it is); a PyTorch BlockMask is converted."""
    if block_mask is None or isinstance(block_mask, (BlockMask, _core.Mask)):
        return block_mask
    if type(block_mask).__name__ == "BlockMask" and hasattr(block_mask, "mask_mod"):
        return _torch_block_masks.get(block_mask)
    raise Error(f"block_mask must be None, a BlockMask from create_block_mask or a "
                f"maskattn.Mask, got {type(block_mask).__name__}")


def _check_flex_shapes(query, key, value, block_mask, enable_gqa):
    q_shape, k_shape = query.shape, key.shape  # each read makes a torch.Size: read once
    if len(q_shape) != 4 or len(k_shape) != 4 or value.dim() != 4:
        for name, x in (("query", query), ("key", key), ("value", value)):
            if x.dim() != 4:
                raise Error(f"flex_attention: {name} has shape {list(x.shape)}; expected 4 axes "
                            f"[B, H, L, E]")
    heads_q, heads_kv = q_shape[1], k_shape[1]
    if not enable_gqa and heads_q != heads_kv:
        raise Error(f"flex_attention: query has {heads_q} heads but key has {heads_kv}; set "
                    f"enable_gqa=True for grouped-query attention")
    if not isinstance(block_mask, BlockMask):
        return
    batch, heads, q_len, kv_len = block_mask.shape
    want = (q_shape[0], heads_q, q_shape[2], k_shape[2])
    if (batch not in (1, want[0]) or heads not in (1, want[1]) or q_len != want[2]
            or kv_len != want[3]):
        raise Error(f"flex_attention: block_mask shape {list(block_mask.shape)} does not fit "
                    f"query {list(query.shape)} and key {list(key.shape)}: expected "
                    f"[1 or {want[0]}, 1 or {want[1]}, {want[2]}, {want[3]}]")


def _lse_request(return_lse, return_aux):
    if return_aux is None:
        return bool(return_lse)
    if return_lse:
        raise Error("flex_attention: give return_lse or return_aux, not both")
    if getattr(return_aux, "max_scores", False):
        raise Error("flex_attention: return_aux=AuxRequest(max_scores=True) is not supported "
                    "by maskattn; request lse only")
    return bool(getattr(return_aux, "lse", False))


def _aux_output(lse):
    from torch.nn.attention.flex_attention import AuxOutput

    return AuxOutput(lse=lse, max_scores=None)


def _score_program(score_mod, query, key):
    """(C++ ScoreMods holding the traced program, the names and tensors of its tables)."""
    if not callable(score_mod):
        raise Error(f"flex_attention: score_mod must be callable, got {type(score_mod).__name__}")
    traced = trace_score_mod(score_mod)
    program = traced.program()
    program.check(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    names = tuple(name for name, _ in traced.tables)
    return _core.ScoreMods(program=program), names, [tensor for _, tensor in traced.tables]


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, kernel_options=None, *, return_aux=None,
                   mods=None):
    """``torch.nn.attention.flex_attention.flex_attention`` computed by maskattn, with autograd.

    ``score_mod(score, b, h, q_idx, kv_idx)``: traced into a score program evaluated per tile
    in the kernels, with its derivative; the float32 tensors it indexes get gradients.
    ``block_mask``: from :func:`create_block_mask`, a PyTorch BlockMask (converted once to a
    program), or a :class:`maskattn.Mask` (its own alignment, bottom-right by default, applies).
    ``return_lse``: also the natural-log LSE [B, Hq, L] (float32, −inf for a row with no allowed
    key, whose output is 0). ``kernel_options`` only tune PyTorch's kernels: ignored.
    """
    if torch.compiler.is_compiling():  # a graph break: this call again, eager, outside the graph
        return _flex_outside_graph(query, key, value, score_mod, block_mask, scale, enable_gqa,
                                   return_lse, kernel_options, return_aux=return_aux, mods=mods)
    check_tensors(query, key, value)
    block_mask = _our_block_mask(block_mask)
    _check_flex_shapes(query, key, value, block_mask, enable_gqa)
    want_lse = _lse_request(return_lse, return_aux)
    if score_mod is not None and mods is not None:
        raise Error("flex_attention: give score_mod or mods, not both (mods= takes maskattn's "
                    "modifiers for what score_mod cannot express)")
    if isinstance(block_mask, BlockMask):
        mask = block_mask.mask
    elif isinstance(block_mask, _core.Mask):
        mask = block_mask
    else:
        mask = _core.Mask().set_alignment("top_left")
    names, tables = (), []
    if score_mod is not None:
        core_mods, names, tables = _score_program(score_mod, query, key)
        bias = sinks = None
    else:
        core_mods, bias, sinks = core_mods_of(mods)
    call = Call(mask, core_mods, scale, "bhld", None, names)
    out, lse = attention_and_lse(query, key, value, call, bias, sinks, want_lse, tables)
    if return_aux is not None:
        return out, _aux_output(lse if want_lse else None)
    return (out, lse) if want_lse else out


# torch.compiler.disable's wrapper costs more than the eager check above, so eager calls skip it.
_flex_outside_graph = torch.compiler.disable(
    flex_attention, reason="maskattn's flex_attention traces score_mod in Python and takes a "
    "BlockMask holding a maskattn.Mask: it runs outside graphs")
