"""What PyTorch's operations mean on traced values (_torch_trace_values), in maskattn's program
language (include/maskattn/program.h): one handler per operation, registered under PyTorch's
names in ``HANDLERS`` when this module is imported. Each applies PyTorch's type promotion (bool →
int64 → float32; true division gives float32; ``.long()`` truncates toward zero) and emits the
language's spelling; what the language lacks is refused, naming the construct.
"""

from __future__ import annotations

import numbers

import torch

from ._torch_trace_values import (HANDLERS, Traced, index_table, kind_of_dtype, numeric,
                                  result_kind, to_kind, value)

_LN2 = "0.693147182"  # f32(ln 2): exp2(x) = exp(x · ln 2)


def arithmetic(trace, symbol, a, b) -> Traced:
    a, b = value(trace, a), value(trace, b)
    if a.kind == b.kind == "bool":  # as PyTorch: + of bools is or, * is and, - is an error
        if symbol == "-":
            trace.unsupported("- between two bools (PyTorch refuses it too)")
        return logical(trace, "|" if symbol == "+" else "&", a, b)
    a, b = numeric(trace, a), numeric(trace, b)
    return Traced(trace, f"({a.text} {symbol} {b.text})", result_kind(a, b))


def add(trace, a, b, *, alpha=1):
    return arithmetic(trace, "+", a, b if alpha == 1 else arithmetic(trace, "*", b, alpha))


def sub(trace, a, b, *, alpha=1):
    return arithmetic(trace, "-", a, b if alpha == 1 else arithmetic(trace, "*", b, alpha))


def rsub(trace, a, b, *, alpha=1):
    return sub(trace, b, a, alpha=alpha)


def mul(trace, a, b):
    return arithmetic(trace, "*", a, b)


def div(trace, a, b, *, rounding_mode=None):
    if rounding_mode == "floor":
        return floor_divide(trace, a, b)
    a, b = numeric(trace, value(trace, a)), numeric(trace, value(trace, b))
    quotient = Traced(trace, f"({a.text} / {b.text})", "float")
    if rounding_mode == "trunc":
        if a.kind == b.kind == "int":
            trace.unsupported("torch.div(..., rounding_mode='trunc') of integers")
        return trunc(trace, quotient)
    if rounding_mode is not None:
        trace.unsupported(f"torch.div(..., rounding_mode={rounding_mode!r})")
    return quotient


def integer_only(trace, symbol, a, b) -> Traced:
    a, b = numeric(trace, value(trace, a)), numeric(trace, value(trace, b))
    if "float" in (a.kind, b.kind):
        trace.unsupported(f"{symbol} of float values (the language has {symbol} on int64; "
                          f"torch.floor(a / b) gives a float floor division)")
    return Traced(trace, f"({a.text} {symbol} {b.text})", "int")


def floor_divide(trace, a, b):
    return integer_only(trace, "//", a, b)


def remainder(trace, a, b):
    return integer_only(trace, "%", a, b)


def compare(symbol):
    def handler(trace, a, b):
        a, b = value(trace, a), value(trace, b)
        if not (a.kind == b.kind == "bool" and symbol in ("==", "!=")):
            a, b = numeric(trace, a), numeric(trace, b)
        return Traced(trace, f"({a.text} {symbol} {b.text})", "bool")
    return handler


def logical(trace, symbol, a, b, bitwise=True) -> Traced:
    a, b = value(trace, a), value(trace, b)
    if a.kind != "bool" or b.kind != "bool":
        if bitwise:
            trace.unsupported(f"bitwise {symbol} on {a.kind}/{b.kind} values (the language has "
                              f"& | ~ on bools only)")
        a, b = to_kind(trace, a, "bool"), to_kind(trace, b, "bool")
    if symbol == "^":
        return Traced(trace, f"({a.text} != {b.text})", "bool")
    return Traced(trace, f"({a.text} {symbol} {b.text})", "bool")


def logical_not(trace, x, bitwise=False) -> Traced:
    x = value(trace, x)
    if x.kind != "bool":
        if bitwise:
            trace.unsupported(f"bitwise ~ on an {x.kind} value (the language has ~ on bools)")
        return Traced(trace, f"({x.text} == 0)", "bool")
    return Traced(trace, f"(~{x.text})", "bool")


def neg(trace, x):
    x = value(trace, x)
    if x.kind == "bool":
        trace.unsupported("unary - of a bool (PyTorch refuses it too; use ~)")
    return Traced(trace, f"(-{x.text})", x.kind)


def absolute(trace, x):
    x = value(trace, x)
    if x.kind == "bool":
        trace.unsupported("abs of a bool")
    return Traced(trace, f"abs({x.text})", x.kind)


def float_function(name):
    def handler(trace, x):
        x = numeric(trace, value(trace, x))
        return Traced(trace, f"{name}({x.text})", "float")
    return handler


def exp2(trace, x):
    x = numeric(trace, value(trace, x))
    return Traced(trace, f"exp({x.text} * {_LN2})", "float")


def floor(trace, x):
    x = value(trace, x)
    if x.kind == "bool":
        trace.unsupported("floor of a bool")
    return Traced(trace, f"floor({x.text})", "int") if x.kind == "float" else x


def ceil(trace, x):
    x = value(trace, x)
    if x.kind == "bool":
        trace.unsupported("ceil of a bool")
    return Traced(trace, f"(-floor(-{x.text}))", "int") if x.kind == "float" else x


def trunc(trace, x):
    x = value(trace, x)
    if x.kind == "bool":
        trace.unsupported("trunc of a bool")
    return to_kind(trace, x, "int")


def where(trace, condition, x=None, y=None):
    if x is None or y is None:
        trace.unsupported("torch.where(condition) with one argument (it returns indices)")
    condition, x, y = value(trace, condition), value(trace, x), value(trace, y)
    if condition.kind != "bool":
        trace.unsupported(f"torch.where with an {condition.kind} condition (it must be bool)")
    if not (x.kind == y.kind == "bool"):
        x, y = numeric(trace, x), numeric(trace, y)
    kind = "bool" if x.kind == "bool" else result_kind(x, y)
    return Traced(trace, f"where({condition.text}, {x.text}, {y.text})", kind)


def extreme(name, symbol):
    def handler(trace, a, b=None, *rest, **kwargs):
        dimension = isinstance(b, numbers.Integral) and name in ("min", "max")  # torch.max(x, 0)
        if b is None or rest or kwargs or dimension:
            trace.unsupported(f"torch.{name} as a reduction (over a dimension); the elementwise "
                              f"torch.{name}imum(a, b) is taken")
        a, b = value(trace, a), value(trace, b)
        if a.kind == b.kind == "bool":
            return logical(trace, symbol, a, b)
        a, b = numeric(trace, a), numeric(trace, b)
        return Traced(trace, f"{name[:3]}({a.text}, {b.text})", result_kind(a, b))
    return handler


_minimum, _maximum = extreme("minimum", "&"), extreme("maximum", "|")


def clamp(trace, x, min=None, max=None):
    if min is None and max is None:
        trace.unsupported("torch.clamp with neither min nor max")
    result = value(trace, x)
    if min is not None:
        result = _maximum(trace, result, min)
    if max is not None:
        result = _minimum(trace, result, max)
    return result


def clamp_min(trace, x, min):
    return clamp(trace, x, min=min)


def clamp_max(trace, x, max):
    return clamp(trace, x, max=max)


def to(trace, x, *args, **kwargs):
    """``.to(dtype)``, ``.to(device, dtype)``, ``.to(other)``, ``.type(dtype)``: the dtype
    matters; a device other than the CPU is refused."""
    x = value(trace, x)
    dtype = kwargs.get("dtype")
    for arg in (*args, kwargs.get("device")):
        if isinstance(arg, torch.dtype):
            dtype = arg
        elif isinstance(arg, (torch.Tensor, Traced)):
            dtype = arg.dtype
        elif isinstance(arg, (str, torch.device)) and torch.device(arg).type != "cpu":
            trace.unsupported(f".to({arg!r}) (programs run on the CPU)")
    return x if dtype is None else to_kind(trace, x, kind_of_dtype(trace, dtype))


def converter(kind):
    def handler(trace, x, *args, **kwargs):
        return to_kind(trace, value(trace, x), kind)
    return handler


def identity(trace, x, *args, **kwargs):
    return value(trace, x)


def like(fill):
    """torch.zeros_like / ones_like / full_like(x, v): a constant of x's type (or ``dtype``)."""
    def handler(trace, x, *args, dtype=None, **kwargs):
        x = value(trace, x)
        number = args[0] if fill is None else fill
        kind = x.kind if dtype is None else kind_of_dtype(trace, dtype)
        return to_kind(trace, value(trace, number), kind)
    return handler


def new(fill):
    """x.new_zeros(()), x.new_ones(()), x.new_full((), v): 0-d constants (and_masks and
    or_masks start from one)."""
    def handler(trace, x, size=(), *args, dtype=None, **kwargs):
        if isinstance(size, int) or tuple(size) != ():
            trace.unsupported(f".new_*() of size {tuple(size)} (a traced value is 0-d)")
        return like(fill)(trace, x, *args, dtype=dtype)
    return handler


def getitem(trace, tensor, index):
    if isinstance(tensor, Traced):
        return tensor[index]
    if not isinstance(tensor, torch.Tensor):
        trace.unsupported(f"indexing a {type(tensor).__name__} with a traced value")
    return index_table(trace, tensor, [], index if isinstance(index, tuple) else (index,))


HANDLERS.update({
    "add": add, "sub": sub, "subtract": sub, "rsub": rsub, "mul": mul, "multiply": mul,
    "div": div, "divide": div, "true_divide": div, "floor_divide": floor_divide,
    "remainder": remainder,
    "eq": compare("=="), "ne": compare("!="), "not_equal": compare("!="),
    "lt": compare("<"), "less": compare("<"), "le": compare("<="), "less_equal": compare("<="),
    "gt": compare(">"), "greater": compare(">"), "ge": compare(">="),
    "greater_equal": compare(">="),
    "bitwise_and": lambda t, a, b: logical(t, "&", a, b),
    "bitwise_or": lambda t, a, b: logical(t, "|", a, b),
    "bitwise_xor": lambda t, a, b: logical(t, "^", a, b),
    "logical_and": lambda t, a, b: logical(t, "&", a, b, bitwise=False),
    "logical_or": lambda t, a, b: logical(t, "|", a, b, bitwise=False),
    "logical_xor": lambda t, a, b: logical(t, "^", a, b, bitwise=False),
    "invert": lambda t, x: logical_not(t, x, bitwise=True),
    "bitwise_not": lambda t, x: logical_not(t, x, bitwise=True),
    "logical_not": logical_not,
    "neg": neg, "negative": neg, "pos": identity, "positive": identity,
    "abs": absolute, "absolute": absolute,
    "exp": float_function("exp"), "log": float_function("log"),
    "tanh": float_function("tanh"), "sigmoid": float_function("sigmoid"), "exp2": exp2,
    "floor": floor, "ceil": ceil, "trunc": trunc, "fix": trunc,
    "where": where, "minimum": _minimum, "maximum": _maximum,
    "min": extreme("min", "&"), "max": extreme("max", "|"),
    "clamp": clamp, "clip": clamp, "clamp_min": clamp_min, "clamp_max": clamp_max,
    "to": to, "type": to, "long": converter("int"), "int": converter("int"),
    "float": converter("float"), "double": converter("float"), "bool": converter("bool"),
    "detach": identity, "clone": identity, "contiguous": identity, "cpu": identity,
    "zeros_like": like(0), "ones_like": like(1), "full_like": like(None),
    "new_zeros": new(0), "new_ones": new(1), "new_full": new(None),
    "__getitem__": getitem,
})

