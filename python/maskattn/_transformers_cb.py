"""transformers' continuous batching (``generate_batch``, ``init_continuous_batching``) with the
maskattn attention backend. docs/python.md ("Continuous batching") is the guide.

How transformers 5.24 calls attention there (read from transformers/generation/continuous_batching):
every forward packs the new tokens of all scheduled requests into one row, query
``[1, Hq, T_q, D]``, and hands the attention function ``cu_seq_lens_q`` / ``cu_seq_lens_k``
(int32 [n + 1], FlashAttention's varlen form), ``max_length_q/k``, and one of two cache forms:

* **index form** (prefill and mixed batches): ``PagedAttentionCache.update`` has already written
  the new keys at ``write_index`` and gathered every request's whole history at ``read_index``
  with ``index_select``, so key/value are packed ``[1, Hkv, T_k, D]`` copies;
* **block-table form** (the "decode fast path": every request brings one token): key/value are
  only the new rows ``[1, Hkv, n, D]``, nothing is written yet, and the kwargs carry
  ``k_cache``/``v_cache`` (the layer's pages ``[num_pages, page_size, Hkv, D]``, views of the
  one cache tensor) and ``block_table`` [n, max_blocks] (int32, −1 past the end): the call is
  expected to write the rows and attend, as ``flash_attn_with_kvcache`` does.

The attention function answers with ``[1, T_q, Hq, Dv]``. There is no attention mask for
implementations other than ``paged|eager`` and ``sdpa`` (those get a ``[T_q, T_k]`` float mask).

Two things stand in the way of a registered implementation, and this module handles both:
``ContinuousBatchingManager.switch_to_cb_friendly_attn`` accepts only ``paged|eager``, ``sdpa``
and names containing "flash" (and a "flash" name must load a FlashAttention package or hub
kernel), so :func:`init_continuous_batching` builds the manager while the model stands in as
sdpa and switches the model back to maskattn before any batch runs; and the decode fast path is
switched off on the CPU when the configuration is resolved (only FlashAttention on CUDA/XPU
serves block tables), so it sets ``max_blocks_per_request`` again on the resolved configuration,
before the cache is created. Both use only public methods and the manager's public
configuration object.
"""

from __future__ import annotations

import copy
import math

import torch

from ._core import Error, Mask
from ._varlen import attention_varlen as _attention_varlen
from ._torch_kvcache import attention_with_kvcache

try:
    from transformers import ContinuousBatchingConfig as _CBConfig
except ImportError:  # pragma: no cover - an older transformers: init_continuous_batching says so
    _CBConfig = None
try:
    from transformers.generation.continuous_batching.utils import WorkloadHints as _Hints
except ImportError:  # pragma: no cover - hints only size the defaults
    _Hints = None

__all__ = ["init_continuous_batching", "generate_batch", "continuous_batching_forward",
           "REGISTERED_NAMES"]

# The names maskattn.transformers.register() gave maskattn: init_continuous_batching accepts a
# model using one of them (the function behind the name may be wrapped, e.g. timed).
REGISTERED_NAMES: set = set()


# ---------------------------------------------------------------------------------------------
# The attention call
# ---------------------------------------------------------------------------------------------

def _boundaries(cu_seq_lens, name):
    if isinstance(cu_seq_lens, dict):
        raise Error(
            f"maskattn attention backend: {name} is a dict by layer type {sorted(cu_seq_lens)}; "
            f"a continuous-batching call gets one tensor after PagedAttentionCache.update (was the "
            f"model's attention layer given the cache?)")
    return [int(x) for x in torch.as_tensor(cu_seq_lens).tolist()]


def _decode(query, key, value, scaling, window, mods, kwargs):
    """The block-table form: write each request's new row, attend over its pages in place."""
    table = kwargs["block_table"]
    cu_k = _boundaries(kwargs["cu_seq_lens_k"], "cu_seq_lens_k")
    count = table.shape[0]
    if query.shape[2] != count or len(cu_k) < count + 1:
        raise Error(
            f"maskattn attention backend: a block-table call needs one query per request, got "
            f"query {list(query.shape)} for block_table {list(table.shape)} and cu_seq_lens_k "
            f"of {len(cu_k)} boundaries")
    seqlens = [cu_k[b + 1] - cu_k[b] - 1 for b in range(count)]
    q = query.transpose(1, 2).reshape(count, 1, query.shape[1], query.shape[3])
    k = key.transpose(1, 2).reshape(count, 1, key.shape[1], key.shape[3])
    v = value.transpose(1, 2).reshape(count, 1, value.shape[1], value.shape[3])
    out = attention_with_kvcache(q, kwargs["k_cache"], kwargs["v_cache"], k, v, seqlens, table,
                                 softmax_scale=scaling, causal=True, window_size=window,
                                 mods=mods)
    return out.reshape(1, count, query.shape[1], value.shape[3])


def _varlen(query, key, value, scaling, window, mods, kwargs):
    """The index form: one varlen call over the packed rows (views, no copies), each request's
    queries at the end of its keys (varlen's causal is bottom-right per sequence), bit for bit
    what one call per request gives (docs/semantics.md §19)."""
    cu_q = _boundaries(kwargs["cu_seq_lens_q"], "cu_seq_lens_q")
    cu_k = _boundaries(kwargs["cu_seq_lens_k"], "cu_seq_lens_k")
    if len(cu_q) != len(cu_k) or cu_q[-1] > query.shape[2] or cu_k[-1] > key.shape[2]:
        raise Error(
            f"maskattn attention backend: cu_seq_lens_q {cu_q} and cu_seq_lens_k {cu_k} do not "
            f"describe query {list(query.shape)} and key {list(key.shape)}")
    for s in range(len(cu_q) - 1):
        if cu_q[s + 1] - cu_q[s] > cu_k[s + 1] - cu_k[s]:
            raise Error(
                f"maskattn attention backend: request {s} has {cu_q[s + 1] - cu_q[s]} queries "
                f"but {cu_k[s + 1] - cu_k[s]} keys (cu_seq_lens_q {cu_q}, cu_seq_lens_k "
                f"{cu_k}); its keys include its queries' own")
    mask = Mask().causal()
    if window[0] >= 0:
        mask = mask & Mask().sliding_window(window[0] + 1)
    # [1, H, T, D] -> packed [T, H, D] views of the rows the boundaries cover.
    q, k, v = (x[0].transpose(0, 1)[:end] for x, end in
               ((query, cu_q[-1]), (key, cu_k[-1]), (value, cu_k[-1])))
    packed = _attention_varlen(q, k, v, cu_q, cu_k, mask=mask, mods=mods, scale=scaling)
    if cu_q[-1] == query.shape[2]:
        return packed.unsqueeze(0)
    out = torch.zeros((1, query.shape[2], query.shape[1], value.shape[3]), dtype=query.dtype)
    out[0, :cu_q[-1]] = packed
    return out


def continuous_batching_forward(query, key, value, scaling, sliding_window, mods, kwargs):
    """The backend's answer to a continuous-batching call (``attention_mask`` None,
    ``cu_seq_lens_q/k`` given): ``[1, T_q, Hq, Dv]``. ``mods`` are core ScoreMods or None."""
    window = (-1, -1) if not sliding_window else (int(sliding_window) - 1, -1)
    with torch.no_grad():
        if kwargs.get("block_table") is not None:
            return _decode(query, key, value, scaling, window, mods, kwargs)
        return _varlen(query, key, value, scaling, window, mods, kwargs)


# ---------------------------------------------------------------------------------------------
# The manager
# ---------------------------------------------------------------------------------------------

def _maskattn_name(model):
    """The model's attention implementation, checked to be a name register() gave maskattn."""
    name = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if not hasattr(model, "init_continuous_batching") or _CBConfig is None:
        raise Error(
            f"init_continuous_batching: {type(model).__name__} has no init_continuous_batching; "
            f"a transformers model (5.x, tested with 5.24) with continuous batching is needed")
    if name not in REGISTERED_NAMES:
        raise Error(
            f"init_continuous_batching: the model's attn_implementation is {name!r}, not a name "
            f"maskattn.transformers.register() registered; load the model with "
            f"attn_implementation=\"maskattn\" after register() (or call "
            f"model.set_attn_implementation(\"maskattn\"))")
    return name


def _fast_path_blocks(cb_config, requested, hints):
    """max_blocks_per_request for the decode fast path, as transformers resolves it on CUDA:
    the caller's value, else enough blocks for the hinted request length, else 32."""
    if requested is not None:
        return requested
    if hints is not None and hints.max_prompt_length + hints.max_generated_length > 0:
        blocks = math.ceil((hints.max_prompt_length + hints.max_generated_length)
                           / cb_config.page_size) + 1
        return blocks + blocks % 2
    return cb_config.fallback_max_blocks_per_request


def init_continuous_batching(model, generation_config=None, continuous_batching_config=None,
                             workload_hints=None, *, decode_fast_path=True):
    """``model.init_continuous_batching(...)`` for a model whose attention is maskattn: the
    returned ``ContinuousBatchingManager`` runs every batch through maskattn (``start()``,
    ``add_request(s)``, ``get_result()``, ``stop()`` as usual). ``decode_fast_path``: batches
    where every request decodes one token read the paged cache in place through block tables
    (attention_with_kvcache); False leaves transformers' CPU default (every batch gathers the
    cache). The configuration is copied, never changed."""
    name = _maskattn_name(model)
    cb_config = copy.copy(continuous_batching_config or _CBConfig())
    cb_config.auto_switch_to_flash = False  # the stand-in below must stay sdpa
    requested = cb_config.max_blocks_per_request
    stand_in = "sdpa" if getattr(model, "_supports_sdpa", True) else "paged|eager"
    model.set_attn_implementation(stand_in)
    try:
        manager = model.init_continuous_batching(
            generation_config=generation_config, continuous_batching_config=cb_config,
            workload_hints=workload_hints)
    finally:
        model.set_attn_implementation(name)
    # A manager without a batch processor has no cache yet: the setting applies when it starts.
    if decode_fast_path and manager.batch_processor is None and requested != 0:
        resolved = manager.continuous_batching_config
        resolved.max_blocks_per_request = _fast_path_blocks(resolved, requested, workload_hints)
    return manager


def _collect(manager, expected):
    results = {}
    while len(results) < expected:
        result = manager.get_result(timeout=1)
        if result is None:
            if not manager.is_running():
                break  # the loop failed: transformers has logged why
            continue
        if result.is_finished():
            results[result.request_id] = result
    return results


def generate_batch(model, inputs, generation_config=None, continuous_batching_config=None, *,
                   max_new_tokens=None, decode_fast_path=True):
    """``model.generate_batch(inputs, ...)`` with maskattn as the attention: the prompts
    (lists of token ids) are scheduled by transformers' continuous batching and the results
    come back as transformers returns them, a dict request id → GenerationOutput in the order of
    ``inputs`` (with ``num_return_sequences`` > 1, each request's children first)."""
    if not inputs:
        return {}
    gen = generation_config if generation_config is not None else model.generation_config
    copies = gen.num_return_sequences or 1
    max_new = gen.max_new_tokens if max_new_tokens is None else max_new_tokens
    hints = None if _Hints is None else _Hints(
        max_prompt_length=max(len(p) for p in inputs), max_generated_length=max_new or 0,
        num_requests=len(inputs) * copies)
    manager = init_continuous_batching(model, generation_config, continuous_batching_config,
                                       hints, decode_fast_path=decode_fast_path)
    manager.start()
    try:
        ids = manager.add_requests(inputs=inputs, max_new_tokens=max_new)
        results = _collect(manager, len(inputs) * copies)
    finally:
        manager.stop(block=True, timeout=30)
        manager.destroy()
    ordered = {}
    for request_id in ids:
        for key in [f"{request_id}__child#{i}" for i in range(copies - 1)] + [request_id]:
            if key in results:
                ordered[key] = results[key]
    return ordered
