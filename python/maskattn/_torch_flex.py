"""``torch.nn.attention.flex_attention``'s ``create_block_mask`` and ``flex_attention`` on maskattn.

Design:

* ``create_block_mask`` calls ``mask_mod`` **once per row chunk** (not once per pair), on
  broadcast index tensors b [B,1,1,1], h [1,H,1,1], q_idx [1,1,rows,1], kv_idx [1,1,1,KV_LEN], so
  a mask_mod written with torch operations (``&``, ``|``, ``torch.where``, indexing a
  ``document_id`` tensor) is evaluated vectorised, with memory bounded by the chunk size. The
  result is a dense keep mask that keeps the broadcast axes mask_mod did not use (a causal
  mask_mod gives [1,1,Q,KV] whatever B and H are), stored in a maskattn ``Mask`` whose tile scan
  (done once, then cached in the Mask) lets the kernels skip hidden tiles: the BlockMask.
* ``score_mod`` cannot be called per pair from the C++ kernels at any useful speed, and maskattn
  must never compute something else silently. So it is *probed*: evaluated on the index grid
  with constant scores s ∈ {0, 1, −3, 37.5, ±1e6} (float64). If score_mod(s) − s is the same
  for every probe, it only adds a term t(b,h,q,kv): t becomes a bias (differentiable when it
  depends on tensors that require grad, e.g. a learned relative-position table). If instead
  score_mod(s) − t = cap·tanh(s/cap) for one cap, it is a softcap (plus a bias t). A bias
  t = −m_h·|q−kv| (or m_h·(kv−q) under a mask that hides every kv > q) is recognised as ALiBi and
  given to maskattn as slopes, so no L×KV bias is stored. Anything else raises maskattn.Error,
  and ``mods=`` takes maskattn's modifiers directly.
* Positions are indices here (FlexAttention's q_idx, kv_idx), so the mask is top-left aligned.
"""

from __future__ import annotations

import threading
import weakref

import torch

from . import _api, _core
from ._torch_autograd import Call, attention_and_lse, check_tensors, core_mods_of
from ._torch_score_mods import analyse_score_mod, call_index_function, index_grid, row_chunks

Error = _core.Error

__all__ = ["BlockMask", "create_block_mask", "flex_attention"]

_MASK_ELEMENTS_PER_CHUNK = 1 << 22  # bounds mask_mod's intermediates (int64: 32 MiB each)


class BlockMask:
    """A mask built by :func:`create_block_mask`: ``.mask`` is the maskattn Mask inside,
    ``.shape`` is (B, H, Q_LEN, KV_LEN) with 1 for a broadcast B or H (as in PyTorch)."""

    def __init__(self, mask, shape, block_size, mask_mod, hides_future):
        self.mask = mask
        self.shape = tuple(shape)
        self.BLOCK_SIZE = tuple(block_size)
        self.mask_mod = mask_mod
        self.hides_future = hides_future  # no allowed pair has kv_idx > q_idx

    @property
    def seq_lengths(self):
        return self.shape[2], self.shape[3]

    def allowed(self) -> torch.Tensor:
        """The element-level mask [B, H, Q_LEN, KV_LEN] (bool, True = attend)."""
        pairs = _api.allowed_pairs(self.mask, *self.shape)
        return torch.from_numpy(pairs).to(torch.bool)

    def to_dense(self) -> torch.Tensor:
        """The block-level mask [B, H, ⌈Q_LEN/BLOCK⌉, ⌈KV_LEN/BLOCK⌉] (int32, 1 = the block holds
        an allowed pair), like PyTorch's ``BlockMask.to_dense()``."""
        block_q, block_k = self.BLOCK_SIZE
        allowed = self.allowed()
        batch, heads, q_len, kv_len = allowed.shape
        rows, cols = -(-q_len // block_q), -(-kv_len // block_k)
        padded = torch.zeros(batch, heads, rows * block_q, cols * block_k, dtype=torch.bool)
        padded[:, :, :q_len, :kv_len] = allowed
        blocks = padded.reshape(batch, heads, rows, block_q, cols, block_k)
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


def evaluate_mask_mod(mask_mod, batch, heads, q_len, kv_len):
    """The keep mask [b, h, Q_LEN, KV_LEN] (b ∈ {1, B}, h ∈ {1, H}) and whether it hides every
    kv_idx > q_idx."""
    b, h, kv = index_grid(batch, heads, kv_len)
    parts, hides_future = [], True
    for q in row_chunks(q_len, batch, heads, kv_len, _MASK_ELEMENTS_PER_CHUNK):
        target = (batch, heads, q.shape[2], kv_len)
        allowed = call_index_function(mask_mod, "mask_mod", (b, h, q, kv), target, True)
        hides_future = hides_future and not bool((allowed & (kv > q)).any())
        parts.append(allowed.expand(-1, -1, q.shape[2], kv_len))
    keep_batch = max(p.shape[0] for p in parts)
    keep_heads = max(p.shape[1] for p in parts)
    keep = torch.cat([p.expand(keep_batch, keep_heads, -1, -1) for p in parts], dim=2)
    return keep, hides_future


@torch.compiler.disable(reason="create_block_mask evaluates mask_mod on real tensors")
def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device="cpu", BLOCK_SIZE=128,
                      _compile=False):
    """``torch.nn.attention.flex_attention.create_block_mask`` for maskattn: ``mask_mod(b, h,
    q_idx, kv_idx) → bool`` evaluated once into a reusable :class:`BlockMask`. ``B``/``H`` None
    broadcast. ``_compile`` is accepted and ignored (the evaluation is already vectorised)."""
    batch = _check_dimension(B, "B", True)
    heads = _check_dimension(H, "H", True)
    q_len = _check_dimension(Q_LEN, "Q_LEN", False)
    kv_len = _check_dimension(KV_LEN, "KV_LEN", False)
    block_size = _block_size(BLOCK_SIZE)
    if device is not None and torch.device(device).type != "cpu":
        raise Error(f"create_block_mask: device={device!r}; maskattn computes on the CPU "
                    f"(device='cpu')")
    if mask_mod is None:
        mask = _core.Mask().set_alignment("top_left")
        return BlockMask(mask, (batch, heads, q_len, kv_len), block_size, None, False)
    if not callable(mask_mod):
        raise Error(f"create_block_mask: mask_mod must be callable, got {type(mask_mod).__name__}")
    keep, hides_future = evaluate_mask_mod(mask_mod, batch, heads, q_len, kv_len)
    mask = _core.Mask().keep(keep.numpy()).set_alignment("top_left")
    return BlockMask(mask, (batch, heads, q_len, kv_len), block_size, mask_mod, hides_future)


class _TorchBlockMasks:
    """PyTorch BlockMasks given to maskattn's flex_attention, converted once (by their
    mask_mod) and remembered while they live."""

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


def _block_lists_to_pairs(num_blocks, indices, block_size, q_len, kv_len):
    """PyTorch's per-row block lists (the first num_blocks[b, h, r] entries of indices[b, h, r]
    are the key blocks of query block r) as a bool [b, h, Q_LEN, KV_LEN] of the pairs they
    cover; None when there are no lists."""
    if num_blocks is None or indices is None:
        return None
    block_q, block_k = block_size
    rows, cols = -(-q_len // block_q), -(-kv_len // block_k)
    listed = torch.arange(indices.shape[-1]) < num_blocks.unsqueeze(-1).long()
    # Unlisted entries go to a spare column, dropped afterwards, so that scatter never clears.
    columns = torch.where(listed, indices.long().clamp(0, cols - 1), torch.tensor(cols))
    grid = torch.zeros(*indices.shape[:-1], cols + 1, dtype=torch.bool)
    grid.scatter_(-1, columns, True)
    grid = grid[..., :rows, :cols]
    pairs = grid.repeat_interleave(block_q, dim=-2).repeat_interleave(block_k, dim=-1)
    return pairs[..., :q_len, :kv_len]


def _convert_torch_block_mask(torch_block_mask):
    """A PyTorch BlockMask as the pairs PyTorch's compiled flex_attention computes: mask_mod
    inside the listed partial blocks, every pair of the full blocks, nothing elsewhere. (Through
    mask_mod alone, a BlockMask made by BlockMask.from_kv_blocks, whose mask_mod allows
    everything, would lose its block sparsity.)"""
    batch, heads, q_len, kv_len = (int(n) for n in torch_block_mask.shape)
    block_size = tuple(int(n) for n in torch_block_mask.BLOCK_SIZE)
    mask_mod = torch_block_mask.mask_mod
    keep, _ = (evaluate_mask_mod(mask_mod, batch, heads, q_len, kv_len) if mask_mod is not None
               else (torch.ones(1, 1, q_len, kv_len, dtype=torch.bool), False))
    partial = _block_lists_to_pairs(torch_block_mask.kv_num_blocks, torch_block_mask.kv_indices,
                                    block_size, q_len, kv_len)
    full = _block_lists_to_pairs(getattr(torch_block_mask, "full_kv_num_blocks", None),
                                 getattr(torch_block_mask, "full_kv_indices", None), block_size,
                                 q_len, kv_len)
    if partial is not None:
        keep = keep & partial
    if full is not None:
        keep = keep | full
    hides_future = not bool((keep & torch.ones(q_len, kv_len, dtype=torch.bool).triu(1)).any())
    mask = _core.Mask().keep(keep.contiguous().numpy()).set_alignment("top_left")
    return BlockMask(mask, (batch, heads, q_len, kv_len), block_size, mask_mod, hides_future)


_torch_block_masks = _TorchBlockMasks()


def _our_block_mask(block_mask):
    """None, a BlockMask, or a maskattn.Mask (used as it is: structured masks need no dense
    keep mask); a PyTorch BlockMask is converted through its mask_mod."""
    if block_mask is None or isinstance(block_mask, (BlockMask, _core.Mask)):
        return block_mask
    if type(block_mask).__name__ == "BlockMask" and hasattr(block_mask, "mask_mod"):
        return _torch_block_masks.get(block_mask)
    raise Error(f"block_mask must be None, a BlockMask from create_block_mask or a "
                f"maskattn.Mask, got {type(block_mask).__name__}")


def _check_flex_shapes(query, key, value, block_mask, enable_gqa):
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.dim() != 4:
            raise Error(f"flex_attention: {name} has shape {list(x.shape)}; expected 4 axes "
                        f"[B, H, L, E]")
    heads_q, heads_kv = query.shape[1], key.shape[1]
    if not enable_gqa and heads_q != heads_kv:
        raise Error(f"flex_attention: query has {heads_q} heads but key has {heads_kv}; set "
                    f"enable_gqa=True for grouped-query attention")
    if not isinstance(block_mask, BlockMask):
        return
    batch, heads, q_len, kv_len = block_mask.shape
    want = (query.shape[0], heads_q, query.shape[2], key.shape[2])
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


@torch.compiler.disable(reason="maskattn's flex_attention evaluates score_mod on real tensors "
                        "and takes a BlockMask holding a maskattn.Mask: it runs outside graphs")
def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, kernel_options=None, *, return_aux=None,
                   mods=None):
    """``torch.nn.attention.flex_attention.flex_attention`` computed by maskattn, with autograd.

    ``block_mask``: from :func:`create_block_mask` (a PyTorch BlockMask is converted through
    its mask_mod), or a :class:`maskattn.Mask` (structured, with no dense keep mask; its own
    alignment, bottom-right by default, applies). ``score_mod``: an additive term, a softcap or ALiBi (recognised by probing;
    anything else raises maskattn.Error — give maskattn's modifiers as ``mods=`` instead).
    ``return_lse``: also the natural-log LSE [B, Hq, L] (float32, −inf for a row with no allowed
    key, whose output is 0). ``kernel_options`` only tune PyTorch's kernels: ignored.
    """
    check_tensors((("query", query), ("key", key), ("value", value)))
    block_mask = _our_block_mask(block_mask)
    _check_flex_shapes(query, key, value, block_mask, enable_gqa)
    want_lse = _lse_request(return_lse, return_aux)
    if score_mod is not None and mods is not None:
        raise Error("flex_attention: give score_mod or mods, not both (mods= takes maskattn's "
                    "modifiers for what score_mod cannot express)")
    own_mask = isinstance(block_mask, _core.Mask)  # its positions need not be the indices
    if isinstance(block_mask, BlockMask):
        mask, hides_future = block_mask.mask, block_mask.hides_future
    elif own_mask:
        mask, hides_future = block_mask, False
    else:
        mask, hides_future = _core.Mask().set_alignment("top_left"), False
    if score_mod is not None:
        mods = analyse_score_mod(score_mod, query.shape[0], query.shape[1], query.shape[2],
                                 key.shape[2], hides_future, positions_are_indices=not own_mask)
    core_mods, bias, sinks = core_mods_of(mods)
    call = Call(mask, core_mods, scale, "bhld", None)
    out, lse = attention_and_lse(query, key, value, call, bias, sinks, want_lse)
    if return_aux is not None:
        return out, _aux_output(lse if want_lse else None)
    return (out, lse) if want_lse else out

