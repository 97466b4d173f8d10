"""The values of a traced ``mask_mod``/``score_mod`` (_torch_trace calls the function once with
these in place of its arguments; _torch_trace_ops says what each operation on them means in
maskattn's program language, include/maskattn/program.h).

A :class:`Traced` stands for one 0-d tensor, as FlexAttention's vmap gives a mod: b, h, q_idx,
kv_idx (int64) and the score (float32). It carries the program text computing it and its type,
``"bool"``, ``"int"`` (int64) or ``"float"`` (float32). Python operators reach it directly; torch
functions (``torch.where(q_idx >= kv_idx, score, -inf)``) and a real tensor indexed with it
(``document_id[q_idx]``) reach it through ``__torch_function__``; tensor methods
(``q_idx.clamp(0, 7)``) through ``__getattr__``. Every operation is looked up by its PyTorch name
in ``HANDLERS``, which _torch_trace_ops fills when it is imported (_torch_trace imports both).
This module also has what every operation needs: constants as program text, real tensors met as
operands (0-d ones) or indexed (the captured tables), and PyTorch's conversions between the three
types. Anything outside the language raises maskattn.Error naming the construct (the Trace's
methods, in _torch_trace, have the messages).
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

_DTYPES = {"bool": torch.bool, "int": torch.int64, "float": torch.float32}
_KIND_OF_DTYPE = {torch.bool: "bool", torch.int64: "int", torch.int32: "int",
                  torch.float32: "float", torch.float64: "float"}
_INT64 = (-(1 << 63), (1 << 63) - 1)

# PyTorch's operation names → handler(trace, *args, **kwargs) (filled by _torch_trace_ops).
HANDLERS = {}
# torch functions that are not tensor methods of the same meaning.
NOT_METHODS = frozenset({"zeros_like", "ones_like", "full_like", "__getitem__"})


class Traced:
    """One traced 0-d value: ``text`` in the program language, ``kind`` bool / int / float."""

    __slots__ = ("trace", "text", "kind")

    def __init__(self, trace, text: str, kind: str):
        self.trace, self.text, self.kind = trace, text, kind

    def __repr__(self):
        return f"<maskattn traced {self.kind}: {self.text}>"

    __hash__ = object.__hash__

    # What code may ask of the 0-d tensor this stands for.
    @property
    def dtype(self):
        return _DTYPES[self.kind]

    @property
    def device(self):
        return torch.device("cpu")

    @property
    def shape(self):
        return torch.Size([])

    ndim = 0
    requires_grad = False
    is_cuda = False

    def dim(self):
        return 0

    def size(self, dim=None):
        if dim is not None:
            self.trace.unsupported(".size(dim) of a 0-d value")
        return torch.Size([])

    def numel(self):
        return 1

    def is_floating_point(self):
        return self.kind == "float"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name, swapped = _torch_name(func)
        if swapped:
            args = (args[1], args[0], *args[2:])
        trace = next(a.trace for a in _flat(args, kwargs) if isinstance(a, Traced))
        handler = HANDLERS.get(name)
        if handler is None:
            trace.unsupported(f"torch.{name}" if not name.startswith("_") else name)
        return handler(trace, *args, **(kwargs or {}))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        handler = HANDLERS.get(name)
        if handler is None or name in NOT_METHODS:
            self.trace.unsupported(f".{name}()")
        return lambda *args, **kwargs: handler(self.trace, self, *args, **kwargs)

    def __getitem__(self, index):
        self.trace.unsupported("indexing a traced value (it is one number, not a tensor)")

    def __setitem__(self, index, value):
        self.trace.unsupported("assigning into a traced value")

    # Python's truth tests and conversions: the value is symbolic.
    def __bool__(self):
        self.trace.truth_test()

    def __int__(self):
        self.trace.conversion("int()")

    def __float__(self):
        self.trace.conversion("float()")

    def __complex__(self):
        self.trace.conversion("complex()")

    def __index__(self):
        self.trace.conversion("a Python index, range() or slice (__index__)")

    def __len__(self):
        self.trace.conversion("len()")

    def __iter__(self):
        self.trace.conversion("iteration")

    def item(self):
        self.trace.conversion(".item()")

    def tolist(self):
        self.trace.conversion(".tolist()")

    def __round__(self, digits=None):
        self.trace.unsupported("round()")

    def __pow__(self, other):
        self.trace.unsupported("** (torch.pow)")

    __rpow__ = __pow__

    def where(self, condition, other):  # x.where(c, y) is torch.where(c, x, y)
        return HANDLERS["where"](self.trace, condition, self, other)

    def __floor__(self):  # math.floor
        return HANDLERS["floor"](self.trace, self)

    def __ceil__(self):
        return HANDLERS["ceil"](self.trace, self)

    def __trunc__(self):
        return HANDLERS["trunc"](self.trace, self)


class TableRows(Traced):
    """A captured table indexed in fewer dimensions than it has (``rel[h]``): only indexing it
    further (``rel[h][q_idx - kv_idx]``) is allowed."""

    __slots__ = ("tensor", "name", "indices")

    def __init__(self, trace, tensor, name, indices):
        super().__init__(trace, f"{name}[{', '.join(indices)}]", "rows")
        self.tensor, self.name, self.indices = tensor, name, indices

    def __getitem__(self, index):
        items = index if isinstance(index, tuple) else (index,)
        return index_table(self.trace, self.tensor, self.indices, items)


def _flat(args, kwargs):
    for a in (*args, *(kwargs or {}).values()):
        if isinstance(a, (tuple, list)):
            yield from a
        else:
            yield a


def _torch_name(func):
    """PyTorch's name of ``func`` (torch.add, Tensor.add and Tensor.__add__ are all "add") and
    whether its first two arguments are swapped (Tensor.__rsub__(a, b) is b - a)."""
    name = getattr(func, "__name__", repr(func))
    if name.startswith("__") and name.endswith("__") and name != "__getitem__":
        name = name[2:-2]
        if name.startswith("r") and name[1:] in _REVERSIBLE:
            return _REVERSIBLE[name[1:]], True
        return _REVERSIBLE.get(name, name), False
    return name, False


_REVERSIBLE = {"add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "div": "div",
               "floordiv": "floor_divide", "mod": "remainder", "and": "bitwise_and",
               "or": "bitwise_or", "xor": "bitwise_xor", "pow": "pow", "matmul": "matmul"}


# ---- values ------------------------------------------------------------------------------------

def int_text(trace, number: int) -> str:
    if not _INT64[0] <= number <= _INT64[1]:
        trace.unsupported(f"the constant {number}, which does not fit int64")
    return str(number) if number >= 0 else f"({number})"


def float_text(number: float) -> str:
    """The language's f32 literal of ``number`` rounded to float32, as PyTorch rounds a Python
    float meeting a float32 tensor."""
    if math.isnan(number):
        return "(0.0 / 0.0)"
    with np.errstate(over="ignore"):
        single = np.float32(number)
    if math.isinf(single):
        return "1e39" if single > 0 else "(-1e39)"
    text = str(single)  # the shortest text that reads back as this float32
    return f"({text})" if text.startswith("-") else text


def constant(trace, number) -> Traced:
    if isinstance(number, (bool, np.bool_)):
        return Traced(trace, "(0 == 0)" if number else "(0 != 0)", "bool")
    if isinstance(number, numbers.Integral):
        return Traced(trace, int_text(trace, int(number)), "int")
    return Traced(trace, float_text(float(number)), "float")


def value(trace, x) -> Traced:
    """``x`` (a traced value, a Python or NumPy number, a 0-d tensor) as a traced value."""
    if isinstance(x, TableRows):
        trace.partial_index(x)
    if isinstance(x, Traced):
        return x
    if isinstance(x, (numbers.Number, np.bool_)) and not isinstance(x, complex):
        return constant(trace, x)
    if isinstance(x, torch.Tensor):
        return tensor_value(trace, x)
    trace.unsupported(f"an operand of type {type(x).__name__}")


def tensor_value(trace, tensor) -> Traced:
    """A real tensor meeting traced values: a 0-d one is a constant, or a one-element table
    when it requires grad (a learned temperature gets its gradient); anything larger must be
    indexed."""
    if tensor.dim() != 0:
        trace.unindexed(tensor)
    if tensor.requires_grad:
        name = trace.table(tensor, tensor.reshape(1))
        return Traced(trace, f"{name}[0]", "float")
    trace.check_table(tensor)
    return constant(trace, tensor.item())


def index_table(trace, tensor, earlier, items) -> Traced:
    """``tensor[items]`` (after ``earlier`` index texts) with traced or constant indices: a
    read of a captured table, or TableRows while dimensions are left."""
    trace.check_table(tensor)
    indices = list(earlier)
    for item in items:
        axis = len(indices)
        if axis >= tensor.dim():
            trace.bad_index(tensor, f"{len(earlier) + len(items)} indices")
        indices.append(index_text(trace, tensor, axis, item))
    name = trace.table(tensor)
    if len(indices) < tensor.dim():
        return TableRows(trace, tensor, name, indices)
    return Traced(trace, f"{name}[{', '.join(indices)}]", _KIND_OF_DTYPE[tensor.dtype])


def index_text(trace, tensor, axis, item) -> str:
    if isinstance(item, TableRows):
        trace.partial_index(item)
    if isinstance(item, Traced):
        if item.kind != "int":
            trace.bad_index(tensor, f"a {item.kind} index ({item.text})")
        return item.text
    if isinstance(item, torch.Tensor) and item.dim() == 0 and not item.is_floating_point() \
            and item.dtype != torch.bool:
        item = int(item)
    if isinstance(item, numbers.Integral) and not isinstance(item, (bool, np.bool_)):
        size = tensor.shape[axis]
        if not -size <= item < size:
            trace.bad_index(tensor, f"the index {item} in dimension {axis} of size {size}")
        return str(item % size)
    trace.bad_index(tensor, describe_index(item))


def describe_index(item) -> str:
    if isinstance(item, slice):
        return "a slice (:)"
    if item is None or item is Ellipsis:
        return f"{item!r}"
    if isinstance(item, torch.Tensor):
        return f"a {item.dtype} tensor of shape {list(item.shape)}"
    return f"an index of type {type(item).__name__}"


# ---- conversions -------------------------------------------------------------------------------

def to_kind(trace, x: Traced, kind: str) -> Traced:
    """``x`` converted as ``.to(dtype)`` converts: bool → 0/1, float → int truncates toward
    zero (the language's floor rounds down, so negative values go through −floor(−x)), int →
    float explicitly (x + 0.0), anything → bool is x != 0."""
    if x.kind == kind:
        return x
    if kind == "bool":
        return Traced(trace, f"({x.text} != 0)", "bool")
    if x.kind == "bool":
        one, zero = ("1", "0") if kind == "int" else ("1.0", "0.0")
        return Traced(trace, f"where({x.text}, {one}, {zero})", kind)
    if kind == "float":
        return Traced(trace, f"({x.text} + 0.0)", "float")
    return Traced(trace, f"where({x.text} < 0, (-floor(-{x.text})), floor({x.text}))", "int")


def kind_of_dtype(trace, dtype) -> str:
    if dtype in _KIND_OF_DTYPE:
        return _KIND_OF_DTYPE[dtype]
    trace.unsupported(f"a conversion to {dtype} (programs compute in bool, int64 and float32; "
                      f"int32 and float64 are taken as those)")


def numeric(trace, x: Traced) -> Traced:
    """A bool operand of arithmetic as int64 (PyTorch promotes bool to the other operand's
    type; the language then promotes int64 to f32 where the other side is f32)."""
    return to_kind(trace, x, "int") if x.kind == "bool" else x


def result_kind(*operands) -> str:
    return "float" if any(x.kind == "float" for x in operands) else "int"


def _operator(name, swapped=False):
    """A Python operator of Traced: NotImplemented for operands no handler takes (so that
    Python tries the other side, or compares by identity for == and !=)."""
    def method(self, other):
        if not isinstance(other, (Traced, numbers.Number, np.bool_, torch.Tensor)):
            return NotImplemented
        args = (other, self) if swapped else (self, other)
        return HANDLERS[name](self.trace, *args)
    method.__name__ = f"__{'r' if swapped else ''}{name}__"
    return method


for _dunder, _name in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div"),
                       ("floordiv", "floor_divide"), ("mod", "remainder"),
                       ("and", "bitwise_and"), ("or", "bitwise_or"), ("xor", "bitwise_xor")):
    setattr(Traced, f"__{_dunder}__", _operator(_name))
    setattr(Traced, f"__r{_dunder}__", _operator(_name, swapped=True))
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(Traced, f"__{_name}__", _operator(_name))
Traced.__neg__ = lambda self: HANDLERS["neg"](self.trace, self)
Traced.__pos__ = lambda self: self
Traced.__abs__ = lambda self: HANDLERS["abs"](self.trace, self)
Traced.__invert__ = lambda self: HANDLERS["invert"](self.trace, self)
