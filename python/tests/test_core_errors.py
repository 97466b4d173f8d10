"""Rows P01–P19 of docs/errors.md: the NumPy-level API's own checks, one test per row.

Each test feeds the bad input and expects ``maskattn.Error`` (a ValueError) with the row's
message, never another exception type or a crash. test_errors_catalogue.py ties rows and tests.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

import maskattn as ma
from maskattn import _core

Q = np.ones((1, 2, 3, 4), np.float32)


def raises(pattern):
    return pytest.raises(ma.Error, match=pattern)


class FakeDeviceArray:
    """A DLPack producer whose tensor claims to live on another device (CUDA by default) or to
    hold another element type; its data is a CPU buffer nobody should read."""

    class _Device(ctypes.Structure):
        _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]

    class _DType(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]

    class _Tensor(ctypes.Structure):
        pass

    _Tensor._fields_ = [
        ("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
        ("dtype", _DType), ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64),
        ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),  # DLManagedTensor
    ]

    def __init__(self, array, device_type=2, dtype_code=2):
        self.array = np.ascontiguousarray(array, np.float32)
        self.shape, self.ndim, self.device_type = self.array.shape, self.array.ndim, device_type
        self._shape = (ctypes.c_int64 * self.ndim)(*self.shape)
        self._strides = (ctypes.c_int64 * self.ndim)(*(s // 4 for s in self.array.strides))
        self._managed = self._Tensor(self.array.ctypes.data, self._Device(device_type, 0),
                                     self.ndim, self._DType(dtype_code, 32, 1), self._shape,
                                     self._strides, 0, None, None)

    def __dlpack_device__(self):
        return (self.device_type, 0)

    def __dlpack__(self, **_):
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.restype = ctypes.py_object
        new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new_capsule(ctypes.addressof(self._managed), b"dltensor", None)


def test_every_error_is_a_value_error():
    assert issubclass(ma.Error, ValueError)


def test_P01_dtype_not_float32_float16_bfloat16():
    for bad in (Q.astype(np.float64), Q.astype(np.int32), Q > 0, Q.view(np.uint16)[..., :4],
                torch.zeros(1, 2, 3, 4, dtype=torch.float64)):
        with raises(r"q has dtype \w+ \(shape \[1,2,3,4\]\); maskattn takes float32, float16"):
            ma.attention(bad, Q, Q)
    with raises(r"^v has dtype complex64"):
        ma.attention(Q, Q, Q.astype(np.complex64))
    with raises(r"dout has dtype float64"):
        ma.attention_backward(Q, Q, Q, Q, Q[..., 0], Q.astype(np.float64))
    with raises(r"q \(FakeDeviceArray\) cannot be read through DLPack"):
        ma.attention(FakeDeviceArray(Q, device_type=1, dtype_code=7), Q, Q)
    with raises(r"^q is None; it needs an array"):
        ma.attention(None, Q, Q)


def test_P02_array_not_in_cpu_memory():
    meta = torch.empty(1, 2, 3, 4, device="meta")
    with raises(r"q \(shape \[1, 2, 3, 4\]\) is on device 'meta', not in CPU memory; .*\.cpu\(\)"):
        ma.attention(meta, Q, Q)
    with raises(r"k \(shape \[1, 2, 3, 4\]\) is on device 'meta'"):
        ma.attention_weights(Q, meta)
    cuda = FakeDeviceArray(Q)
    with raises(r"q \(FakeDeviceArray\) is not in CPU memory \(DLPack device type 2\)"):
        ma.attention(cuda, Q, Q)
    with raises(r"out \(FakeDeviceArray\) is not in CPU memory"):
        ma.attention(Q, Q, Q, out=cuda)
    # The bindings check the device too (for producers the Python layer passes on as they are).
    with raises(r"q \(shape \[1,2,3,4\]\) is not in CPU memory \(DLPack device type 2\)"):
        _core.attention(cuda, Q, Q, np.empty_like(Q), None, None, None, None, 0, "auto", "auto",
                        False, "")


def test_P96_tensor_without_strided_storage():
    """Sparse and MKL-DNN tensors have no strides to read: refused by name in every torch path
    (the capsule path, the NumPy-view path, autograd), never torch's own TypeError."""
    import maskattn.torch as mt

    dense = torch.from_numpy(Q)
    tensors = [("torch.sparse_coo", dense.to_sparse())]
    if torch.backends.mkldnn.is_available():  # builds without MKL-DNN have no such layout
        tensors.append(("torch._mkldnn", dense.to_mkldnn()))
    for layout, tensor in tensors:
        message = rf"k \(shape \[1, 2, 3, 4\]\) has layout {layout}; .*\.to_dense\(\)"
        for call in (ma.attention, mt.attention, mt.scaled_dot_product_attention,
                     mt.flex_attention):
            with raises(message):
                call(dense, tensor, dense)
        with raises(message):
            mt.attention(dense.clone().requires_grad_(), tensor, dense)
    sparse_leaf = dense.to_sparse().requires_grad_()  # the autograd path reads it detached
    with raises(r"k \(shape \[1, 2, 3, 4\]\) has layout torch.sparse_coo"):
        mt.attention(dense, sparse_leaf, dense)
    # maskattn.torch.ScoreMods' tensors, copied for the C++ modifiers: by their names.
    bias = torch.zeros(3, 3)
    for name, mods in (("bias", mt.ScoreMods(bias=bias.to_sparse())),
                       ("bias", mt.ScoreMods(bias=bias.to_sparse().requires_grad_())),
                       ("sinks", mt.ScoreMods(sinks=torch.zeros(2).to_sparse())),
                       ("alibi_slopes", mt.ScoreMods(alibi_slopes=torch.ones(2).to_sparse()))):
        for call in (mt.attention, mt.scaled_dot_product_attention):
            with raises(rf"^mods\.{name} \(shape \[\d+(, \d+)*\]\) has layout torch.sparse_coo; "
                        r"maskattn reads strided tensors: convert it with \.to_dense\(\)"):
                call(dense, dense, dense, mods=mods)
    with raises(r"^mods\.bias \(shape \[3, 3\]\) is a meta tensor: it has no values to read"):
        mt.attention(dense, dense, dense, mods=mt.ScoreMods(bias=torch.zeros(3, 3, device="meta")))


def test_P03_attention_tensors_not_rank_4():
    with raises(r"^q has shape \[2, 3, 4\]; expected \[B,Hq,Lq,D\]"):
        ma.attention(Q[0], Q, Q)
    with raises(r"^v has shape \[1, 1, 2, 3, 4\]; expected \[B,Hkv,Lk,Dv\]"):
        ma.attention(Q, Q, Q[None])
    with raises(r"^k has shape \[3, 4\]; expected \[B,Hkv,Lk,D\]"):
        ma.attention_scores(Q, Q[0, 0])
    lse = np.zeros((1, 2, 3), np.float32)
    with raises(r"part 0 out has rank 5 \(shape \[1,1,2,3,4\]\); attention tensors have at most 4"):
        ma.merge_partials([(Q[None], lse)])


def test_P04_layout_name():
    with raises(r"""^layout must be "bhld" or "blhd", got 'bshd'"""):
        ma.attention(Q, Q, Q, layout="bshd")
    with raises(r"""^layout="blhd" needs 4-axis arrays \[B, L, H, D\], got shape \(2, 3, 4\)"""):
        ma.attention(Q[0], Q[0], Q[0], layout="blhd")


def test_P05_dtype_argument():
    with raises(r"""^dtype must be None, "bfloat16" or "float16" \(how to read uint16 arrays\)"""):
        ma.attention(Q, Q, Q, dtype="float64")
    with raises(r"^q has dtype float32 but dtype='bfloat16' was given; dtype= only says how"):
        ma.attention(Q, Q, Q, dtype="bfloat16")
    half = torch.zeros(1, 2, 3, 4, dtype=torch.float16)
    with raises(r"^q has dtype float16 but dtype=torch.bfloat16 was given"):
        ma.attention(half, half, half, dtype=torch.bfloat16)
    import ml_dtypes

    bf16 = Q.astype(ml_dtypes.bfloat16)
    with raises(r"^q holds bf16 but dtype='float16' was given"):
        ma.attention(bf16, bf16, bf16, dtype="float16")


def test_P06_threads_argument():
    for bad in (-1, 1.5, "2", True):
        with raises(r"^threads must be None \(all cores\) or an int >= 0, got"):
            ma.attention(Q, Q, Q, threads=bad)
    with raises(r"^threads = 100000 must be in \[0, 1024\]"):  # the C++ check, E20
        ma.attention(Q, Q, Q, threads=100000)


def test_P07_out_shape():
    with raises(r"^out has shape \[1, 2, 3, 5\] but must be \[1, 2, 3, 4\] \(bhld\)"):
        ma.attention(Q, Q, Q, out=np.empty((1, 2, 3, 5), np.float32))
    with raises(r"^out has shape \[1, 3, 2, 4\] but must be \[1, 2, 3, 4\] \(blhd\)"):
        ma.attention(Q, Q, Q, layout="blhd", out=np.empty((1, 3, 2, 4), np.float32))


def test_P08_out_not_a_writable_array():
    with raises(r"^out must be an array to write into \(NumPy, PyTorch or DLPack\), got list"):
        ma.attention(Q, Q, Q, out=Q.tolist())
    read_only = np.broadcast_to(np.zeros(1, np.float32), Q.shape)
    with raises(r"^out \(shape \[1, 2, 3, 4\]\) is read-only; it must be a writable array"):
        ma.attention(Q, Q, Q, out=read_only)
    out, lse = ma.attention(Q, Q, Q, return_lse=True)
    with raises(r"^out \(shape \[1, 2, 3, 4\]\) is read-only"):
        ma.merge_partials([(out, lse)], out=read_only)


def test_P09_kernel_and_products_names():
    # The library's parsers (errors.md E97): the same words as in C++ and on the command line.
    with raises(r"^kernel = 'fast' is not a kernel: use auto, reference or fused$"):
        ma.attention(Q, Q, Q, kernel="fast")
    with raises(r"^kernel = 'tiles' is not a kernel: use auto, reference or fused$"):
        ma.attention_weights(Q, Q, kernel="tiles")
    with raises(r"^products = 'xyz' is not a product unit: use auto, f32, bf16-dot or amx$"):
        ma.attention(Q, Q, Q, products="xyz")
    with raises(r"^kernel = 'Fused' is not a kernel"):  # names are exact
        ma.audit_mask(ma.Mask().causal(), q_len=4, kernel="Fused")


def test_P10_callback_not_callable():
    with raises(r"^expected a callable, got 3"):
        ma.Mask().predicate(3)
    with raises(r"^expected a callable, got 'abs'"):
        ma.ScoreMods(score_fn="abs")


def test_P11_callback_raised_or_returned_the_wrong_type():
    def boom(*_):
        raise KeyError("boom")

    with raises(r"^mask predicate raised KeyError: 'boom'"):
        ma.attention(Q, Q, Q, ma.Mask().predicate(boom))
    with raises(r"^score_fn raised ZeroDivisionError: division by zero"):
        ma.attention(Q, Q, Q, mods=ma.ScoreMods(score_fn=lambda s, b, h, i, j: 1 / 0))
    with raises(r"^mask predicate returned 1 \(int\); it must return a bool"):
        ma.attention(Q, Q, Q, ma.Mask().predicate(lambda b, h, i, j: 1))
    with raises(r"^score_fn returned 'x' \(str\); it must return a number"):
        ma.attention(Q, Q, Q, mods=ma.ScoreMods(score_fn=lambda s, b, h, i, j: "x"))
    with raises(r"^mask predicate raised"):  # also from the inspection calls, and many threads
        ma.allowed_pairs(ma.Mask().predicate(boom), 1, 2, 70, 70)
    with raises(r"^mask predicate raised"):
        ma.block_map(ma.Mask().predicate(boom), 1, 2, 70, 70)
    q = np.ones((2, 4, 130, 8), np.float32)
    with raises(r"^mask predicate raised KeyError"):
        ma.attention(q, q, q, ma.Mask().predicate(lambda b, h, i, j: i < 100 or boom()),
                     threads=2)


def test_P12_heads_and_window_sides_not_ints():
    for bad in ("ab", 1.5, True, [0, "x"], object()):
        with raises(r"^heads must be None, an int, a range or an iterable of ints, got"):
            ma.Mask().causal(heads=bad)
    with raises(r"^window side must be an int, got 'a'"):
        ma.Mask().window("a", 0)
    with raises(r"^window side must be an int, got 1.5"):
        ma.Mask().window(2, 1.5)


def test_P13_merge_partials_parts():
    out, lse = ma.attention(Q, Q, Q, return_lse=True)
    with raises(r"^merge_partials needs at least one \(out, lse\) part"):
        ma.merge_partials([])
    with raises(r"^merge_partials: part 0 must be an \(out, lse\) pair"):
        ma.merge_partials([(out, lse, lse)])
    with raises(r"^part 1 out has shape \[1,1,3,4\] but out is \[1,2,3,4\]"):  # C++ check
        ma.merge_partials([(out, lse), (out[:, :1], lse[:, :1])])
    with raises(r"^part 1 lse must be f32 \[1,2,3\], got f32 \[1,2,2\]"):
        ma.merge_partials([(out, lse), (out, lse[:, :, :2])])
    with raises(r"^merge_partials: 2 outputs but 1 lse arrays; each part needs both"):
        _core.merge_partials([out, out], [lse], np.empty_like(out), None, "")


def test_P14_inspection_sizes():
    with raises(r"^allowed_pairs needs q_len \(and k_len, default q_len\)"):
        ma.allowed_pairs(ma.Mask().causal())
    with raises(r"^block_map needs q_len \(and k_len, default q_len\)"):
        ma.block_map(ma.Mask().causal(), 1, 1)
    with raises(r"^allowed_pairs: give both b and h \(one panel\) or neither"):
        ma.allowed_pairs(ma.Mask(), 1, 1, 3, b=0)


def test_P15_scores_stage():
    with raises(r"""^stage must be "scaled" or "final", got 'raw'"""):
        ma.attention_scores(Q, Q, stage="raw")


def test_P16_mask_mods_scale_of_the_wrong_type():
    with raises(r"^mask must be a maskattn.Mask or None, got str"):
        ma.attention(Q, Q, Q, mask="causal")
    with raises(r"^mask must be a maskattn.Mask or None, got ScoreMods"):
        ma.allowed_pairs(ma.ScoreMods(), 1, 1, 3)
    with raises(r"^mods must be a maskattn.ScoreMods or None, got int"):
        ma.attention(Q, Q, Q, mods=3)
    with raises(r"^scale must be None \(1/sqrt\(D\)\) or a real number, got 'a'"):
        ma.attention(Q, Q, Q, scale="a")
    with raises(r"^scale must be None"):
        ma.attention_backward(Q, Q, Q, Q, Q[..., 0], Q, scale=torch.tensor(1.0))


def test_P17_unreadable_or_wrongly_shaped_mask_arrays():
    with raises(r"^lengths cannot be read as an array of int64: invalid literal"):
        ma.Mask().key_lengths("ab")
    with raises(r"^keep cannot be read as an array of float64: could not convert"):
        ma.Mask().keep([["a"]])
    with raises(r"^additive cannot be read as an array of float32"):
        ma.Mask().additive([object()])
    with raises(r"^keep is None; it needs values"):
        ma.Mask().keep(None)
    with raises(r"^lengths must be one value per sequence \(rank 1\), got shape \[1,1\]"):
        ma.Mask().key_lengths([[1]])
    with raises(r"^starts must be one value per sequence \(rank 1\), got shape \[2,1\]"):
        ma.Mask().query_starts(np.zeros((2, 1)))
    with raises(r"^alibi_slopes must be one value per query head \(rank 1\), got shape \[1,2\]"):
        ma.ScoreMods(alibi_slopes=[[1.0, 2.0]])
    with raises(r"^sinks must be one value per query head \(rank 1\)"):
        ma.ScoreMods(sinks=np.zeros((2, 2)))


def test_P18_integers_and_booleans_hold_what_they_say():
    with raises(r"^lengths must hold integers, found 2.7 at flat index 0"):
        ma.Mask().key_lengths([2.7])
    with raises(r"^ids must hold integers, found nan at flat index 1"):
        ma.Mask().segments(np.array([[0.0, np.nan]]))
    with raises(r"^keep must hold only 0 and 1 \(or bools\), found -inf at flat index 1"):
        ma.Mask().keep(np.array([0.0, -np.inf]))  # an additive mask given as a keep mask
    with raises(r"^blocked must hold only 0 and 1 \(or bools\), found 2 at flat index 1"):
        ma.Mask().blocked(np.array([0, 2], np.uint8))
    ma.Mask().keep(np.array([0.0, 1.0])).key_lengths(np.array([2.0]))  # exact values are fine


def test_P19_alignment_name():
    with raises(r"""^alignment must be "bottom_right" or "top_left", got "top\""""):
        ma.Mask().causal("top")
    with raises(r"""^alignment must be "bottom_right" or "top_left", got "left\""""):
        ma.Mask().set_alignment("left")


def test_P67_frame_not_four_integers_or_outside_its_totals():
    for frame in ((0, 1), (0, 0, 3, 3.0), "0033", (0, 0, True, 3)):
        with raises(r"^frame must be \(q_offset, k_offset, q_total, k_total\), four integers"):
            ma.attention(Q, Q, Q, frame=frame)
    with raises(r"^frame: rows \[q_offset, q_offset \+ Lq\) = \[2, 5\) are not inside \[0, q_total\)"):
        ma.attention(Q, Q, Q, frame=(2, 0, 4, 3))
    out, lse = ma.attention(Q, Q, Q, return_lse=True)
    with raises(r"^frame must be"):
        ma.attention_backward(Q, Q, Q, out, lse, np.ones_like(Q), frame=[0, 0])


def test_P73_program_arguments():
    doc = np.array([0, 0, 1], np.int64)
    compiled = ma.Program.mask("doc[q] == doc[kv]", doc=doc)
    with raises(r"^program must be the program's text \(a str\) or a maskattn.Program, got int"):
        ma.Mask().program(3)
    with raises(r"^a compiled maskattn.Program already holds its tables; give tables only with "
                r"the program's text"):
        ma.Mask().program(compiled, doc=doc)
    with raises(r"^program=\(text, tables\): tables must be a dict \{name: array\}, got list"):
        ma.ScoreMods(program=("s + x[q]", [doc]))
    with raises(r"^program must be a maskattn.Program, its text, or \(text, \{name: table\}\); "
                r"got a tuple of 3"):
        ma.ScoreMods(program=("s", {}, None))
    with raises(r"^ScoreMods: give score_fn or program, not both"):
        ma.ScoreMods(score_fn=lambda s, b, h, i, j: s, program="s")
    with raises(r"^program table 'x' = 'abc' is not an array of numbers or bools"):
        ma.Program.score("s", x="abc")
