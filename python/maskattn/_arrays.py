"""How the NumPy-level API reads and allocates arrays of any framework.

Attention tensors are passed to the C++ core in place (DLPack or the buffer protocol: NumPy
arrays, PyTorch tensors, anything else with either). Two cases need help first:

* ``ml_dtypes.bfloat16`` (and other custom NumPy dtypes) cannot be described by either
  protocol, so such arrays go in as a ``uint16`` view of the same bits with an element tag;
* PyTorch tensors that require grad refuse DLPack export, so they are detached (the autograd
  layer is ``maskattn.torch``).

Outputs are allocated in the caller's framework and dtype, in the caller's layout.
"""

from __future__ import annotations

import sys

import numpy as np

from . import _core

Error = _core.Error

_ELEMENT_NAMES = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "f16": "f16",
    "float16": "f16",
    "half": "f16",
}


def element_tag(dtype) -> str:
    """The core's element tag for the ``dtype=`` argument: how to read raw 16-bit arrays."""
    if dtype is None:
        return ""
    if isinstance(dtype, str):
        key = dtype
    else:
        try:  # np.float16, ml_dtypes.bfloat16 (types, not dtypes), np.dtype("float16")
            key = np.dtype(dtype).name
        except TypeError:  # torch.float16, torch.bfloat16
            key = str(dtype).replace("torch.", "")
    if key not in _ELEMENT_NAMES:
        raise Error(
            f'dtype must be None, "bfloat16" or "float16" (how to read uint16 arrays), got {dtype!r}'
        )
    return _ELEMENT_NAMES[key]


# dtypes both protocols describe: checked by a set lookup (dtype.name builds a string each time).
_NATIVE_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float16, np.float64))


def is_torch(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def dtype_name(x) -> str:
    """NumPy's name for ``x``'s element type ("float32", "bfloat16", …) in either framework."""
    return str(getattr(x, "dtype", "")).replace("torch.", "")


def core_view(x, name: str, element: str):
    """``x`` as the core reads it, and the element tag it needs."""
    if type(x) is np.ndarray:  # the common case first: this runs on every call
        if x.dtype in _NATIVE_DTYPES:
            return x, element
        if x.dtype.name == "bfloat16":
            return x.view(np.uint16), "bf16"
        return x, element
    if x is None:
        raise Error(f"{name} is None; it needs an array")
    torch = sys.modules.get("torch")  # a tensor's module is imported already
    if torch is not None and type(x) is torch.Tensor and x.is_cpu and not x.requires_grad:
        dtype = x.dtype  # the common torch case first, as torch_as_numpy would take it
        if dtype is torch.float32 or dtype is torch.float16:
            try:
                return x.numpy(), element
            except (RuntimeError, TypeError):  # a negative-bit view; a sparse or MKL-DNN layout
                pass
        return torch_as_numpy(strided_values(x, name), element)
    if is_torch(x):
        if not x.is_cpu:  # a meta tensor has no DLPack export at all
            raise Error(
                f"{name} (shape {list(x.shape)}) is on device '{x.device}', not in CPU memory; "
                "maskattn computes on the CPU: move it with .cpu()"
            )
        return torch_as_numpy(strided_values(x.detach() if x.requires_grad else x, name), element)
    if isinstance(x, np.ndarray):
        if x.dtype.name == "bfloat16":
            return x.view(np.uint16), "bf16"
        return x, element
    if hasattr(x, "__dlpack__"):
        return _numpy_from_dlpack(x, name), element
    if hasattr(x, "__array_interface__") or hasattr(x, "__array__"):
        return np.asarray(x), element  # a view where the object allows it
    return np.asarray(x, dtype=np.float32), element  # nested lists, scalars: a copy


def strided_values(x, name: str):
    """A CPU tensor whose values NumPy can view: a negative-bit view (torch._neg_view, which
    .numpy() refuses and a DLPack capsule describes un-negated) resolved into a copy, and a
    tensor without strided storage (a sparse or MKL-DNN layout) refused by name (P96)."""
    torch = sys.modules["torch"]
    if x.layout is not torch.strided:
        raise Error(f"{name} (shape {list(x.shape)}) has layout {x.layout}; maskattn reads "
                    "strided tensors: convert it with .to_dense()")
    return x.resolve_neg() if x.is_neg() else x


def plain_views(arrays):
    """The core's views of ``arrays`` when each is a NumPy array of a dtype both protocols
    describe or a plain float32/float16 CPU torch.Tensor that needs no grad — what core_view
    makes of them, with no element tag, in one pass (the common case of every call) — else
    None."""
    torch = sys.modules.get("torch")
    tensor = torch.Tensor if torch is not None else None
    views = []
    for x in arrays:
        cls = type(x)
        if cls is np.ndarray:
            if x.dtype not in _NATIVE_DTYPES:
                return None
            views.append(x)
        elif cls is tensor and x.is_cpu and not x.requires_grad and (
                x.dtype is torch.float32 or x.dtype is torch.float16):
            try:
                views.append(x.numpy())
            except (RuntimeError, TypeError):  # a negative-bit view, a sparse layout: core_view
                return None
        else:
            return None
    return views


def torch_call_arrays(q, k, v, return_lse: bool, checked: bool = False):
    """What an attention call hands the binding when q, k and v are plain CPU torch.Tensors of 4
    axes — strided, with no negative bit, all of one dtype that maskattn computes in: (their
    DLPack capsules, the element tag, O (new, [B, Hq, Lq, Dv] in q's dtype), O's capsule, and with
    ``return_lse`` LSE (new, [B, Hq, Lq] float32) and its capsule, else None, None) — what
    core_view, rank4_shape and output_views make of them, in one pass. Else None: core_view's
    path then reads the inputs and names what is wrong.

    The binding reads a capsule (torch.utils.dlpack.to_dlpack: 0.17 µs a tensor here) as it
    reads any array, for a third of what .numpy() costs and a tenth of the tensor's own
    __dlpack__; at Lk = 1 that is a fifth of a call. The capsule describes the tensor as
    .numpy() would — its data, sizes and strides, whether or not it requires grad (the core only
    reads the inputs) — except for a negative-bit view (torch._neg_view), whose capsule holds the
    values un-negated, so such tensors take core_view's path (and its error). The tag is
    core_view's: "bf16" for bfloat16 (which the capsule describes itself). A tensor without
    strided storage (sparse, MKL-DNN) cannot be exported: that is how its layout is told apart.

    ``checked``: the caller (maskattn.torch's check_tensors) has made sure that q, k and v are
    CPU tensors of one dtype that maskattn computes in, so that is not tested again (six
    attribute reads, a tenth of the Python layer's cost at Lk = 1)."""
    torch = sys.modules.get("torch")
    if torch is None or type(q) is not torch.Tensor:
        return None
    dtype = q.dtype
    if dtype is torch.float32 or dtype is torch.float16:
        element = ""
    elif dtype is torch.bfloat16:
        element = "bf16"
    else:
        return None
    tensor = torch.Tensor
    if type(k) is not tensor or type(v) is not tensor:
        return None
    if not checked and not (q.is_cpu and k.is_cpu and v.is_cpu and k.dtype is dtype
                            and v.dtype is dtype):
        return None
    if q.is_neg() or k.is_neg() or v.is_neg():
        return None
    q_shape, v_shape = q.shape, v.shape
    if len(q_shape) != 4 or k.dim() != 4 or len(v_shape) != 4:
        return None
    export = torch.utils.dlpack.to_dlpack
    try:
        inputs = export(q), export(k), export(v)
    except RuntimeError:  # no strided storage (a sparse or MKL-DNN layout): core_view names it
        return None
    batch, heads, q_len = q_shape[0], q_shape[1], q_shape[2]
    out = torch.empty(batch, heads, q_len, v_shape[3], dtype=dtype)
    lse = torch.empty(batch, heads, q_len, dtype=torch.float32) if return_lse else None
    return (*inputs, element, out, export(out), lse, None if lse is None else export(lse))


def torch_as_numpy(x, element: str):
    """A CPU tensor as a NumPy view of its memory (no copy; any strides): .numpy() costs a
    fraction of a DLPack export, which dominated small calls. bfloat16, which NumPy lacks,
    goes as its int16 bits with the "bf16" tag."""
    torch = sys.modules["torch"]  # imported already: x is a tensor
    dtype = x.dtype
    if dtype is torch.float32 or dtype is torch.float16:
        return x.numpy(), element
    if dtype is torch.bfloat16:
        return x.view(torch.int16).numpy(), "bf16"
    return x, element  # other dtypes: the core names them in its error


_DLPACK_CPU = 1  # DLDeviceType kDLCPU


def _numpy_from_dlpack(x, name: str):
    """A NumPy view (no copy) of another framework's CPU array, so that the rest of this layer
    sees .shape, .ndim and .dtype; arrays on another device are refused by name."""
    device = x.__dlpack_device__() if hasattr(x, "__dlpack_device__") else (_DLPACK_CPU, 0)
    if int(device[0]) != _DLPACK_CPU:
        raise Error(
            f"{name} ({type(x).__name__}) is not in CPU memory (DLPack device type "
            f"{int(device[0])}); maskattn computes on the CPU: move it to the CPU first"
        )
    try:
        return np.from_dlpack(x)
    except (TypeError, BufferError, RuntimeError, ValueError) as error:
        raise Error(f"{name} ({type(x).__name__}) cannot be read through DLPack: {error}") from None


def check_element(x, name: str, element: str, dtype) -> None:
    """``dtype=`` says how to read 16-bit integer arrays; on any other float type it would be
    silently ignored, so a conflict is an error."""
    if not element:  # nothing to conflict with (and a dict less per call)
        return
    readable_as = {"bf16": "bfloat16", "f16": "float16"}.get(element)
    if readable_as and dtype_name(x) not in ("uint16", "int16", readable_as):
        raise Error(
            f"{name} has dtype {dtype_name(x)} but dtype={dtype!r} was given; dtype= only says "
            "how to read uint16 arrays holding bfloat16 or float16 bits"
        )


def writable_output(x, name: str):
    """``x`` if the core can write into it in place, else maskattn.Error (not a copy that the
    caller would never see)."""
    if not (is_torch(x) or isinstance(x, np.ndarray) or hasattr(x, "__dlpack__")):
        raise Error(
            f"{name} must be an array to write into (NumPy, PyTorch or DLPack), "
            f"got {type(x).__name__}"
        )
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        raise Error(f"{name} (shape {list(x.shape)}) is read-only; it must be a writable array")
    return x


def to_bhld(x, layout: str):
    """A [B, L, H, D] array viewed as [B, H, L, D] (no copy); "bhld" passes through."""
    if layout == "bhld":
        return x
    if layout == "blhd":
        if x.ndim != 4:
            raise Error(f'layout="blhd" needs 4-axis arrays [B, L, H, D], got shape {tuple(x.shape)}')
        return x.permute(0, 2, 1, 3) if is_torch(x) else x.transpose(0, 2, 1, 3)
    raise Error(f'layout must be "bhld" or "blhd", got {layout!r}')


def empty_like_framework(x, shape, dtype=None):
    """An uninitialised array of ``shape`` in ``x``'s framework, with ``x``'s dtype by default
    ("float32" names float32 in either framework)."""
    if type(x) is np.ndarray:
        return np.empty(shape, dtype=np.float32 if dtype == "float32" else (dtype or x.dtype))
    if is_torch(x):  # a CPU tensor (core_view refused the others)
        torch = sys.modules["torch"]
        dtype = torch.float32 if dtype == "float32" else (dtype or x.dtype)
        # The sizes as arguments: a third cheaper than a tuple, which PyTorch parses slowly.
        return torch.empty(*shape, dtype=dtype) if shape else torch.empty(shape, dtype=dtype)
    np_dtype = np.float32 if dtype == "float32" else (dtype or getattr(x, "dtype", np.float32))
    return np.empty(shape, dtype=np_dtype)


def new_output(like, shape_bhld, layout: str, dtype=None):
    """A fresh output of logical shape [B, H, L, D] in ``like``'s framework and dtype (or
    ``dtype``): (the array the caller gets, stored in ``layout``; the core's [B, H, L, D] view)."""
    batch, heads, length, dim = shape_bhld
    if layout == "blhd":
        user = empty_like_framework(like, (batch, length, heads, dim), dtype)
        view = user.permute(0, 2, 1, 3) if is_torch(user) else user.transpose(0, 2, 1, 3)
    else:
        user = view = empty_like_framework(like, tuple(shape_bhld), dtype)
    if type(view) is np.ndarray:
        if view.dtype not in _NATIVE_DTYPES and view.dtype.name == "bfloat16":
            view = view.view(np.uint16)
    else:  # a tensor, as the inputs were
        view = torch_as_numpy(view, "")[0]
    return user, view


def threads_arg(threads) -> int:
    if threads is None:
        return 0
    if type(threads) is int and threads >= 0:
        return threads
    if not isinstance(threads, (int, np.integer)) or isinstance(threads, bool) or threads < 0:
        raise Error(f"threads must be None (all cores) or an int >= 0, got {threads!r}")
    return int(threads)
