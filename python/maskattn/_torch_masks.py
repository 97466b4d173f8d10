"""SDPA's masks as maskattn takes them: the one place where ``attn_mask``, ``is_causal`` and
``mask=`` become a maskattn Mask (and a float mask that requires grad a bias), for the eager
call (_torch_sdpa) and the custom ops that torch.compile traces (_torch_compile) alike.

* ``split_attn_mask`` decides what a (folded) attn_mask is: a bool mask is a keep mask (True =
  attend); a float mask that requires grad, with grad enabled, is a bias that receives ∂L/∂mask;
  any other float mask is an additive mask (−inf hides; the kernels skip its fully hidden tiles).
* ``core_mask`` converts the keep or additive mask tensor to a ``Mask`` (through the cache
  below) and intersects it with ``mask=`` and ``is_causal`` (top-left, PyTorch's alignment).
* ``mods_with_bias`` adds the bias to the caller's ``mods=``.

Converting an L×S mask copies it into the C++ Mask, and the Mask then caches which tiles it
hides. Repeated calls with the same mask tensor (every layer of a model, every step of a loop)
reuse the converted Mask from a small LRU keyed by the tensor's id and checked against a weak
reference to the tensor itself and its (data_ptr, shape, stride, dtype, _version), so a new tensor
that happens to reuse a freed one's id or memory is never mistaken for it, and an in-place change
(which bumps _version) is seen.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections import OrderedDict

import torch

from . import _core
from ._torch_autograd import ScoreMods

Error = _core.Error

__all__ = ["ConvertedMasks", "check_causal_alignment", "converted_masks", "core_mask",
           "intersect", "mods_with_bias", "split_attn_mask", "top_left_causal"]


class ConvertedMasks:
    """A small, thread-safe LRU: attn_mask tensor → the maskattn.Mask made from it.

    An entry is found by (id(tensor), folding context) and then checked: its weak reference must
    still be that very tensor, and the tensor's state (data_ptr, shape, stride, dtype, _version)
    the one it was converted in. A hit on the newest entry (one mask for every layer of a model)
    changes nothing, so it takes no lock: a decoding step's lookup is a dict read and a compare."""

    def __init__(self, capacity: int = 8):
        self._capacity = capacity
        # key → [weakref to the tensor, state, Mask, the caller's slot (peek)]
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.RLock()  # re-entrant: a weakref callback may run inside a lookup
        self._newest = None  # the entry last converted or moved to the end
        self.conversions = 0  # how many masks were converted (tests read it)

    @staticmethod
    def _state(tensor: torch.Tensor):
        try:
            version = tensor._version  # inference-mode tensors have no version counter
        except RuntimeError:
            return None
        # shape (a torch.Size) compares as the tuple it is; stride() is a tuple.
        return (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype, version)

    def peek(self, tensor: torch.Tensor, context):
        """The entry already made for ``tensor`` in the folding ``context``, [weakref, state,
        Mask, slot] (None on a miss): the slot is the caller's, for what it derives from the
        Mask, and goes with the entry. The state is
        compared a field at a time, the version first (what an in-place change moves), without
        building it: at Lk = 1 this lookup is a tenth of an SDPA call."""
        entry = self._entries.get((id(tensor), context))  # one dict read: atomic under the GIL
        if entry is None or entry[0]() is not tensor:
            return None
        known = entry[1]
        try:
            version = tensor._version
        except RuntimeError:  # an inference-mode tensor: never cached
            return None
        if (known[4] != version or known[0] != tensor.data_ptr() or known[1] != tensor.shape
                or known[2] != tensor.stride() or known[3] is not tensor.dtype):
            return None
        if entry is not self._newest:
            with self._lock:
                key = (id(tensor), context)
                if self._entries.get(key) is entry:
                    self._entries.move_to_end(key)
                    self._newest = entry
        return entry

    def get(self, tensor: torch.Tensor, context, convert):
        """The Mask for ``tensor`` (in the folding ``context``), converting it on a miss."""
        entry = self.peek(tensor, context)
        if entry is not None:
            return entry[2]
        state = self._state(tensor)
        key = (id(tensor), context)
        mask = convert()
        with self._lock:
            self.conversions += 1
            if state is None:
                return mask
            ref = weakref.ref(tensor, lambda dead, key=key: self._forget(key, dead))
            entry = [ref, state, mask, None]
            self._entries[key] = entry
            self._entries.move_to_end(key)
            self._newest = entry
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
        return mask

    def _forget(self, key, dead_ref):
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] is dead_ref:
                del self._entries[key]

    def clear(self):
        with self._lock:
            self._entries.clear()
            self._newest = None

    def __len__(self):
        return len(self._entries)


converted_masks = ConvertedMasks()

_causal_masks = {}  # "top_left" → the Mask of is_causal, made once


def top_left_causal():
    """``Mask().causal("top_left")``: is_causal, in PyTorch's alignment (made once)."""
    mask = _causal_masks.get("top_left")
    if mask is None:
        mask = _causal_masks["top_left"] = _core.Mask().causal("top_left")
    return mask


@atexit.register
def _release_masks():
    # The custom ops' functions, which torch keeps until after the extension is torn down, reach
    # this module's globals (through core_mask); Masks still held here then would be reported as
    # leaked by nanobind. Dropped at exit (a later call makes them again).
    _causal_masks.clear()
    converted_masks.clear()


def split_attn_mask(attn_mask):
    """(mask tensor, bias tensor) for a folded attn_mask (either or both None): a float mask
    that requires grad, with grad enabled, is a bias (it receives ∂L/∂mask); a bool mask (keep)
    or any other float mask (additive) stays a mask."""
    if (attn_mask is not None and attn_mask.dtype is not torch.bool and attn_mask.requires_grad
            and torch.is_grad_enabled()):
        return None, attn_mask
    return attn_mask, None


def _converted(mask_tensor):
    """A bool tensor as ``Mask.keep`` (True = attend), a float one as ``Mask.additive``."""
    if mask_tensor.dtype == torch.bool:
        return _core.Mask().keep(mask_tensor.detach().cpu().numpy())
    return _core.Mask().additive(mask_tensor.detach().to("cpu", torch.float32).numpy())


def intersect(masks):
    """The intersection of maskattn Masks (None for none)."""
    combined = None
    for mask in masks:
        if mask is not None:
            combined = mask if combined is None else combined & mask
    return combined


def core_mask(mask, is_causal, mask_tensor, cached_as, context):
    """The Mask of one call: ``mask=`` (a maskattn.Mask or None), the top-left causal mask when
    ``is_causal``, and ``mask_tensor`` (from split_attn_mask) converted, intersected. The
    conversion is cached under the tensor ``cached_as`` (the caller's attn_mask, or
    ``mask_tensor`` itself) and ``context`` (how it was folded)."""
    if mask_tensor is None:
        if mask is None:  # is_causal alone, or no mask at all
            return top_left_causal() if is_causal else None
        return intersect([mask, top_left_causal() if is_causal else None])
    converted = converted_masks.get(cached_as, context, lambda: _converted(mask_tensor))
    if mask is None and not is_causal:  # attn_mask alone
        return converted
    return intersect([mask, top_left_causal() if is_causal else None, converted])


def mods_with_bias(mods, bias):
    """``mods`` with the float mask that requires grad added to its bias (as torch tensors, so
    both receive their gradients)."""
    if mods is None:
        return ScoreMods(bias=bias)
    if isinstance(mods, ScoreMods):
        total = bias if mods.bias is None else torch.as_tensor(mods.bias) + bias
        return ScoreMods(softcap=mods.softcap, alibi_slopes=mods.alibi_slopes, bias=total,
                         score_fn=mods.score_fn, threshold=mods.threshold, sinks=mods.sinks,
                         program=mods.program)
    if isinstance(mods, _core.ScoreMods):
        if mods.has_score_fn:
            raise Error(
                "a float attn_mask that requires grad becomes a bias, which cannot be added to a "
                "maskattn.ScoreMods with a score_fn; give mods as maskattn.torch.ScoreMods"
            )
        core_bias = mods.bias  # a read-only view: torch.tensor copies it without a warning
        total = bias if core_bias is None else torch.tensor(core_bias) + bias
        return ScoreMods(softcap=mods.softcap, alibi_slopes=list(mods.alibi_slopes) or None,
                         bias=total, threshold=mods.threshold, sinks=list(mods.sinks) or None,
                         program=mods.program)
    return mods  # core_mods_of names the bad type


def check_causal_alignment(mask, q_len: int, k_len: int):
    """is_causal with ``mask=``: refused when L ≠ S would re-align a bottom-right mask."""
    if mask is not None and q_len != k_len and mask.alignment != "top_left":
        raise Error(
            f"is_causal=True is top-left aligned, and with L={q_len} != S={k_len} it would "
            f"re-align mask={mask.describe()} (bottom-right by default); call "
            f"mask.set_alignment('top_left'), or add mask.causal() (bottom-right) instead of "
            f"is_causal"
        )
