"""The Hugging Face transformers attention backend: ``attn_implementation="maskattn"``.

::

    import maskattn.transformers
    maskattn.transformers.register()
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="maskattn")

Design. transformers (5.x; tested with 5.24) looks attention up in two registries, and
:func:`register` adds ``"maskattn"`` to both:

* ``AttentionMaskInterface``: the function ``masking_utils.create_causal_mask`` (and its sliding
  window, chunked and bidirectional siblings) calls once per forward with the 2-D padding mask,
  the sizes and offsets the KV cache reports, and a *mask function* composed from a handful of
  named closures (causal, sliding-window overlay, chunked overlay, packed sequences, …). Its
  result reaches every attention layer as ``attention_mask``. sdpa's builds a ``[B, 1, Lq, Lk]``
  bool tensor; ours (:func:`prepare_mask`) reads the structure of the composed function and
  returns a :class:`PreparedMask` holding a :class:`maskattn.Mask` with one component per piece,
  so no ``Lq × Lk`` tensor exists. A piece it does not know (a model's own overlay, e.g. for
  image tokens) is evaluated by transformers' ``sdpa_mask`` into a dense bool tensor that becomes
  ``Mask.keep``: exact, only not structured (``PreparedMask.structured`` says which).
* ``AttentionInterface``: the function every attention layer calls with query ``[B, Hq, Lq, D]``
  and key/value ``[B, Hkv, Lk, D]`` (after the cache update), returning ``[B, Lq, Hq, Dv]``.
  :func:`attention_forward` runs ``maskattn.torch.attention`` (autograd-aware) on the
  ``PreparedMask``'s Mask. A 4-D tensor mask (a caller's own, which transformers passes through
  untouched) keeps SDPA's meaning: bool → ``Mask.keep`` (True attends), float → a bias added to
  the scores (with gradients); ``None`` means sdpa's ``is_causal`` rule. Softcap, sinks
  (``s_aux``) and ``position_bias`` become ``maskattn.torch.ScoreMods``. ``dropout`` (the
  attention dropout rate transformers passes in training mode, 0 in eval mode) is maskattn's
  attention dropout, with one seed per call drawn from PyTorch's default generator.

Positions. transformers evaluates its mask functions at absolute indices ``q = i + q_offset``,
``kv = j + kv_offset``; causal and window pieces depend only on ``d = q − kv`` and become one
``Mask.window`` in the alignment that makes maskattn's positions equal those (bottom-right for
the dynamic caches, where ``q_offset − kv_offset = Lk − Lq``; top-left otherwise, e.g. a static
cache). Padding keeps positions as indices (``key_keep``), exactly as transformers does, and
padded *queries* are not hidden (transformers does not hide them either), so every allowed pair
is the same as sdpa's. docs/python.md ("Hugging Face") has the full table.

Continuous batching: :func:`generate_batch` and :func:`init_continuous_batching` stand in for
the model's own (which refuse registered implementations); see _transformers_cb.py.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import torch

from ._core import Error, Mask
from ._dropout import checked_dropout, torch_seed
# Continuous batching (generate_batch, init_continuous_batching) lives in _transformers_cb.py.
from ._transformers_cb import REGISTERED_NAMES, generate_batch, init_continuous_batching
from ._torch_autograd import COMPUTE_DTYPES
from ._transformers_packed import packed_call
from ._transformers_parts import Chunk, KeyKeep, Remapped, Segments, Spans, Window

try:
    import transformers as _transformers
    from transformers import modeling_utils as _hf_models
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "maskattn.transformers needs the transformers package (pip install transformers)"
    ) from _error
try:
    from transformers import masking_utils as _hf_masks
except ImportError:  # an older transformers: register() says what is missing
    _hf_masks = None

__all__ = ["register", "attention_forward", "prepare_mask", "PreparedMask", "NAME",
           "init_continuous_batching", "generate_batch"]

NAME = "maskattn"
_INF = math.inf
# transformers' own implementations: registering under one of these names would replace it.
_BUILT_IN = ("eager", "sdpa", "flex_attention", "paged|eager", "flash_attention_2",
             "flash_attention_3", "flash_attention_4")


class PreparedMask:
    """What the ``"maskattn"`` mask function hands every attention layer of one forward.

    ``mask`` is the :class:`maskattn.Mask` for scores ``[batch, heads, q_len, kv_len]``;
    ``structured`` is False when a piece of transformers' mask function was not recognised and
    the mask is a dense ``keep`` tensor. ``shape`` and ``ndim`` mimic the ``[B, 1, Lq, Lk]`` tensor
    it replaces, for code that inspects masks (generate() passes it back in with static caches).
    """

    ndim = 4

    def __init__(self, mask: Mask, batch: int, q_len: int, kv_len: int, structured: bool,
                 parts=None, offsets=(0, 0)):
        self.mask = mask
        self.batch, self.q_len, self.kv_len = batch, q_len, kv_len
        self.structured = structured
        # The recognised pieces (None for a dense mask) and (q_offset, kv_offset): what a packed
        # batch's varlen call reads (_transformers_packed).
        self.parts = parts
        self.offsets = offsets

    @property
    def shape(self):
        return torch.Size((self.batch, 1, self.q_len, self.kv_len))

    def __repr__(self):
        kind = "structured" if self.structured else "dense"
        return (f"PreparedMask([{self.batch}, 1, {self.q_len}, {self.kv_len}], {kind}: "
                f"{self.mask.describe()})")


# ---------------------------------------------------------------------------------------------
# Reading transformers' mask functions
# ---------------------------------------------------------------------------------------------

def _cells(fn) -> dict:
    closure = fn.__closure__ or ()
    return dict(zip(fn.__code__.co_freevars, (cell.cell_contents for cell in closure)))


def _maker(fn) -> str:
    """The masking_utils function that built ``fn`` ("" for anything else)."""
    if getattr(fn, "__module__", None) != _hf_masks.__name__ or not hasattr(fn, "__code__"):
        return ""
    return fn.__qualname__.split(".<locals>.")[0]


def _parts_of_all(functions):
    parts = [_parts_of(fn) for fn in functions]
    return None if any(p is None for p in parts) else [piece for p in parts for piece in p]


def _parts_of_union(functions):
    """or_masks: only "windows OR same block" (blockwise_overlay) is a maskattn structure: spans
    relax exactly what windows hide."""
    blocks = [fn for fn in functions if _maker(fn) == "blockwise_overlay"]
    base = _parts_of_all([fn for fn in functions if _maker(fn) != "blockwise_overlay"])
    if len(blocks) != 1 or base is None:
        return None
    if not all(isinstance(p, (Window, Remapped)) for p in base):
        return None
    return base + [Spans(_cells(blocks[0])["block_sequence_ids"])]


def _parts_of_remapped(cells):
    inner = _parts_of(cells["mask_function"])
    if inner is None or not all(isinstance(p, Window) for p in inner):
        return None
    return inner + [Remapped()]


_READERS = {
    "and_masks": lambda c: _parts_of_all(c["mask_functions"]),
    "or_masks": lambda c: _parts_of_union(c["mask_functions"]),
    "sliding_window_overlay": lambda c: [Window(-_INF, c["sliding_window"] - 1)],
    "sliding_window_bidirectional_overlay": lambda c: [
        Window(-c["sliding_window"], c["sliding_window"])],
    "chunked_overlay": lambda c: [Chunk(int(c["chunk_size"]), c["left_padding"])],
    "padding_mask_function": lambda c: [KeyKeep(c["padding_mask"])],
    "packed_sequence_mask_function": lambda c: [Segments(c["packed_sequence_mask"])],
    "remap_positions_for_packed_sequence": _parts_of_remapped,
}


def _parts_of(fn):
    """The pieces of a masking_utils mask function, or None when one of them is not known."""
    if fn is _hf_masks.causal_mask_function:
        return [Window(0, _INF)]
    if fn is _hf_masks.bidirectional_mask_function:
        return []
    reader = _READERS.get(_maker(fn))
    return reader(_cells(fn)) if reader else None


# ---------------------------------------------------------------------------------------------
# Building the Mask
# ---------------------------------------------------------------------------------------------

def _columns(values: torch.Tensor, offset: int, length: int, fill):
    """values[:, offset : offset + length] as int64 NumPy, padded on the right with ``fill``."""
    values = values.detach().to("cpu", torch.int64)
    if values.ndim != 2:
        return None
    part = values[:, offset:offset + length]
    if part.shape[1] < length:
        pad = torch.full((part.shape[0], length - part.shape[1]), int(fill), dtype=torch.int64)
        part = torch.cat([part, pad], dim=1)
    return part.numpy()


def _window_sides(windows, shift):
    """The (left, right) of maskattn's window for ``lo ≤ d ≤ hi`` when qpos − kpos = d + shift;
    None if a side would be negative (not expressible)."""
    lo = max((w.lo for w in windows), default=-_INF)
    hi = min((w.hi for w in windows), default=_INF)
    left, right = hi + shift, -(lo + shift)
    if left < 0 or right < 0:
        return None
    return (None if left == _INF else int(left)), (None if right == _INF else int(right))


def _add_windows(mask, windows, absolute, sizes):
    """Causal/window pieces as one window component, in an alignment whose positions reproduce
    transformers' indices. ``absolute``: positions themselves matter (chunks), not only q − kv.
    Returns False when no alignment can express the pieces."""
    q_len, kv_len, q_offset, kv_offset = sizes
    delta = q_offset - kv_offset
    # qpos − kpos = i − j + (Lk − Lq) bottom-right, i − j top-left; transformers' d = i − j + delta
    bottom_right_shift = kv_len - q_len - delta
    if absolute and bottom_right_shift != 0:
        return False
    if not windows:
        return True
    for alignment, shift in (("bottom_right", bottom_right_shift), ("top_left", -delta)):
        sides = _window_sides(windows, shift)
        if sides is None:
            continue
        left, right = sides
        if right == 0 and left is None:
            mask.causal()
        elif right == 0:
            mask.sliding_window(left + 1)  # the same pairs, named as transformers names them
        elif sides != (None, None):
            mask.window(left, right)
        if alignment == "top_left" and len(mask):
            mask.set_alignment("top_left")
        return True
    return False


def _add_chunks(mask, chunks, batch, kv_len, kv_offset):
    """chunked_overlay: ⌊(q − lp[b]) / C⌋ == ⌊(kv − lp[b]) / C⌋. Key starts lp − kv_offset make
    maskattn's positions exactly those (they also hide keys before lp, which are padding)."""
    for chunk in chunks:
        starts = chunk.left_padding.detach().to("cpu", torch.int64).reshape(-1) - kv_offset
        if starts.numel() != batch or bool((starts < 0).any()) or bool((starts > kv_len).any()):
            return False
        if bool((starts != 0).any()):
            mask.key_starts(starts.numpy())
        mask.chunk(chunk.size)
    return True


def _structured_mask(parts, batch, q_len, kv_len, q_offset, kv_offset):
    """The Mask for recognised pieces, or None when one of them cannot be expressed."""
    windows = [p for p in parts if isinstance(p, Window)]
    chunks = [p for p in parts if isinstance(p, Chunk)]
    segments = [p for p in parts if isinstance(p, Segments)]
    if any(isinstance(p, Remapped) for p in parts) and not segments:
        return None
    mask = Mask()
    if not _add_windows(mask, windows, bool(chunks), (q_len, kv_len, q_offset, kv_offset)):
        return None
    if chunks and not _add_chunks(mask, chunks, batch, kv_len, kv_offset):
        return None
    for part in parts:
        if isinstance(part, KeyKeep):
            keep = _columns(part.keep, kv_offset, kv_len, 0)
            if keep is None or keep.shape[0] != batch:
                return None
            if not keep.all():
                mask.key_keep(keep)
        elif isinstance(part, Segments):
            if part.ids.ndim != 2 or part.ids.shape[1] < max(q_offset + q_len, kv_offset + kv_len):
                return None
            q_ids = _columns(part.ids, q_offset, q_len, 0)
            k_ids = _columns(part.ids, kv_offset, kv_len, 0)
            mask.segments(q_ids, k_ids)
        elif isinstance(part, Spans):
            # span ids: block + 1, and 0 (no span) for −1
            q_ids = _columns(part.block_ids + 1, q_offset, q_len, 0)
            k_ids = _columns(part.block_ids + 1, kv_offset, kv_len, 0)
            if q_ids is None:
                return None
            mask.spans(np.maximum(q_ids, 0), np.maximum(k_ids, 0))
    return mask


def _dense_mask(batch, q_len, kv_len, q_offset, kv_offset, mask_function, attention_mask,
                use_vmap, local_size):
    """transformers' own evaluation of the mask function, [B, 1, Lq, Lk] bool, as Mask.keep."""
    dense = _hf_masks.sdpa_mask(
        batch_size=batch, q_length=q_len, kv_length=kv_len, q_offset=q_offset,
        kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
        local_size=local_size, allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
        use_vmap=use_vmap, device="cpu")
    return Mask().keep(dense.to("cpu").contiguous().numpy())


def prepare_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function=None,
    attention_mask=None,
    local_size=None,
    use_vmap: bool = False,
    **kwargs,
) -> PreparedMask:
    """The ``"maskattn"`` entry of ``AttentionMaskInterface`` (same arguments as
    ``masking_utils.sdpa_mask``): the mask of one forward as a :class:`PreparedMask`."""
    if isinstance(attention_mask, PreparedMask):  # generate() built it ahead (static caches)
        if (attention_mask.batch, attention_mask.q_len, attention_mask.kv_len) != (
                batch_size, q_length, kv_length):
            raise Error(
                f"attention_mask: a maskattn PreparedMask for [B, Lq, Lk] = "
                f"[{attention_mask.batch}, {attention_mask.q_len}, {attention_mask.kv_len}] "
                f"cannot serve a forward of "
                f"[{batch_size}, {q_length}, {kv_length}]")
        return attention_mask
    q_offset, kv_offset = int(q_offset), int(kv_offset)  # static caches give tensors
    mask_function = mask_function or _hf_masks.causal_mask_function
    parts = _parts_of(mask_function)
    if parts is not None and attention_mask is not None:
        parts = parts + [KeyKeep(attention_mask)]
    mask = None
    if parts is not None:
        mask = _structured_mask(parts, batch_size, q_length, kv_length, q_offset, kv_offset)
    structured = mask is not None
    if not structured:
        mask = _dense_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function,
                           attention_mask, use_vmap, local_size)
    return PreparedMask(mask, batch_size, q_length, kv_length, structured,
                        parts if structured else None, (q_offset, kv_offset))


# ---------------------------------------------------------------------------------------------
# The attention function
# ---------------------------------------------------------------------------------------------

def _check_tensors(query, key, value):
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, torch.Tensor) or tensor.ndim != 4:
            is_tensor = isinstance(tensor, torch.Tensor)
            shape = list(tensor.shape) if is_tensor else type(tensor).__name__
            raise Error(f"maskattn attention backend: {name} is {shape}; expected a 4-D torch "
                        f"tensor [B, H, L, D]")
        if tensor.device.type != "cpu":
            raise Error(
                f"maskattn attention backend: {name} {list(tensor.shape)} is on device "
                f"{tensor.device}; maskattn runs on the CPU (move the model with model.to('cpu'))")
        if tensor.dtype not in COMPUTE_DTYPES:
            raise Error(
                f"maskattn attention backend: {name} {list(tensor.shape)} has dtype "
                f"{tensor.dtype}; maskattn computes in float32, float16 or bfloat16 (load the "
                f"model with dtype=torch.float32)")


def _score_mods(softcap, bias, kwargs):
    """Score modifiers: Gemma-2's softcap, gpt-oss's sinks (``s_aux``), T5's ``position_bias``
    plus a float mask (both added to the scores, as sdpa adds them); None when there are none.
    Tensors keep their autograd link (maskattn.torch.ScoreMods passes gradients back)."""
    sinks = kwargs.get("s_aux")
    position_bias = kwargs.get("position_bias")
    if position_bias is not None:
        bias = position_bias if bias is None else position_bias + bias
    if softcap is None and sinks is None and bias is None:
        return None
    from .torch import ScoreMods as TorchScoreMods  # noqa: PLC0415 - maskattn.torch needs torch

    return TorchScoreMods(softcap=softcap, bias=bias,
                          sinks=None if sinks is None else sinks.reshape(-1))


def _mask_for(attention_mask, query, key, is_causal, module):
    """(Mask or None, float bias tensor or None) for what the model passed as attention_mask."""
    batch, _, q_len, _ = query.shape
    kv_len = key.shape[2]
    if isinstance(attention_mask, PreparedMask):
        if (attention_mask.batch, attention_mask.q_len, attention_mask.kv_len) != (
                batch, q_len, kv_len):
            raise Error(
                f"maskattn attention backend: attention_mask was prepared for [B, Lq, Lk] = "
                f"[{attention_mask.batch}, {attention_mask.q_len}, {attention_mask.kv_len}] but "
                f"query {list(query.shape)} and key {list(key.shape)} need [{batch}, {q_len}, "
                f"{kv_len}]")
        return attention_mask.mask, None
    if attention_mask is None:
        # No mask creation reached us: sdpa's rule, causal (top-left) for more than one query.
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        return (Mask().causal("top_left") if causal and q_len > 1 else None), None
    if isinstance(attention_mask, torch.Tensor) and attention_mask.ndim == 4:
        if attention_mask.dtype == torch.bool:  # SDPA's meaning: True attends
            return Mask().keep(attention_mask.detach().cpu().numpy()), None
        if attention_mask.is_floating_point():  # added to the scores, −inf hides
            return None, attention_mask
    kind = (f"a {attention_mask.ndim}-D {attention_mask.dtype} tensor {list(attention_mask.shape)}"
            if isinstance(attention_mask, torch.Tensor) else f"a {type(attention_mask).__name__}")
    raise Error(
        f"maskattn attention backend: attention_mask is {kind}; expected the maskattn "
        f"PreparedMask from the model's mask creation, a 4-D bool or float mask "
        f"[B|1, H|1, Lq, Lk] or None (query {list(query.shape)}, key {list(key.shape)})")


def _weights(query, key, mask, mods, scaling, dropout, seed):
    """``output_attentions=True``: the softmax weights (float32 math, no gradient through them);
    with dropout, the dropped and rescaled weights the output was computed with, as eager
    returns them."""
    from . import attention_weights  # noqa: PLC0415

    core_mods = mods.core() if mods is not None else None
    return attention_weights(query, key, mask, core_mods, scale=scaling, dropout_p=dropout,
                             dropout_seed=seed).to(query.dtype)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      is_causal=None, sliding_window=None, softcap=None, **kwargs):
    """The ``"maskattn"`` entry of ``AttentionInterface``.

    query [B, Hq, Lq, D], key/value [B, Hkv, Lk, D] (GQA when Hq > Hkv, without repeating
    heads); returns (output [B, Lq, Hq, Dv], weights or None). ``sliding_window`` is already
    part of the prepared mask (transformers builds the window into the mask of sliding layers),
    except under continuous batching, which sends no mask: ``cu_seq_lens_q/k`` then describe
    packed requests and this answers as :func:`continuous_batching_forward` does.
    ``dropout`` is the attention dropout rate (transformers passes the config's rate in training
    mode and 0.0 in eval mode); its seed is drawn from PyTorch's default generator, so
    ``torch.manual_seed`` reproduces a training run.
    """
    _check_tensors(query, key, value)
    if attention_mask is None and kwargs.get("cu_seq_lens_q") is not None and \
            kwargs.get("cu_seq_lens_k") is not None:
        # Continuous batching (packed requests; the paged cache's block tables on decode steps):
        # no mask reaches us, the windows come as sliding_window (_transformers_cb.py).
        from ._transformers_cb import continuous_batching_forward  # noqa: PLC0415

        mods = _score_mods(softcap, None, kwargs)
        return continuous_batching_forward(query, key, value, scaling, sliding_window,
                                           None if mods is None else mods.core(), kwargs), None
    from . import torch as maskattn_torch  # noqa: PLC0415 - maskattn.torch needs torch

    mask, bias = _mask_for(attention_mask, query, key, is_causal, module)
    mods = _score_mods(softcap, bias, kwargs)
    dropout = checked_dropout(dropout, None, 0, "maskattn attention backend: dropout").p
    # One seed for the output and the weights below, so that both drop the same pairs.
    seed = torch_seed() if dropout > 0 else None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    packed = packed_call(query, attention_mask, bias, kwargs, causal, PreparedMask, _add_windows)
    if packed is not None:  # a padding-free batch: each document alone (_transformers_packed)
        return _packed_forward(maskattn_torch, query, key, value, packed, mods, scaling,
                               dropout, seed), None
    # blhd views of transformers' [B, H, L, D] tensors: the output is allocated [B, Lq, Hq, Dv]
    # and contiguous, which is what the model reshapes next.
    out = maskattn_torch.attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), mask, mods,
        scale=scaling, layout="blhd", dropout_p=dropout, dropout_seed=seed)
    weights = _weights(query, key, mask, mods, scaling, dropout, seed) \
        if kwargs.get("output_attentions") else None
    return out, weights


def _packed_forward(maskattn_torch, query, key, value, packed, mods, scaling, dropout, seed):
    """attention_varlen over the flattened [B·L, H, D] tokens; the output [B, L, Hq, Dv]."""
    batch, heads, length, _ = query.shape
    flat = [x.transpose(1, 2).reshape(batch * x.shape[2], x.shape[1], x.shape[3])
            for x in (query, key, value)]
    out = maskattn_torch.attention_varlen(*flat, *packed, mods, scale=scaling, dropout_p=dropout,
                                          dropout_seed=seed)
    return out.view(batch, length, heads, value.shape[3])


def _mask_interface_takes_offsets() -> bool:
    """Older releases passed ``cache_position`` to mask functions instead of q_length/q_offset."""
    parameters = inspect.signature(_hf_masks.sdpa_mask).parameters
    return "q_length" in parameters and "q_offset" in parameters


def register(name: str = NAME) -> str:
    """Register maskattn with transformers under ``name`` (default "maskattn"): the attention
    function and the mask function. Idempotent; returns the name."""
    if not isinstance(name, str) or not name or name in _BUILT_IN or "sdpa" in name or \
            "flash" in name or "flex" in name:
        raise Error(
            f"register: name {name!r} must be a non-empty string that is not one of "
            f"transformers' built-in implementations {list(_BUILT_IN)} and does not contain "
            f"'sdpa', 'flash' or 'flex' (transformers dispatches on those substrings)")
    interfaces = (getattr(_hf_models, "AttentionInterface", None),
                  getattr(_hf_masks, "AttentionMaskInterface", None))
    if None in interfaces or not _mask_interface_takes_offsets():
        raise Error(
            f"register: transformers {_transformers.__version__} lacks the interface the "
            f"maskattn backend uses (AttentionInterface, and AttentionMaskInterface functions "
            f"taking q_length and q_offset, as in transformers 5.24)")
    interfaces[0].register(name, attention_forward)
    interfaces[1].register(name, prepare_mask)
    REGISTERED_NAMES.add(name)  # init_continuous_batching accepts models using these names
    return name
