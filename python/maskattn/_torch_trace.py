"""FlexAttention's ``mask_mod`` and ``score_mod`` traced into maskattn programs.

maskattn evaluates a mask or a score modifier inside its kernels, a 64 × 64 tile at a time, as
an expression program (include/maskattn/program.h: b, h, q, kv, s, literals, tables indexed by
1 to 3 integer expressions, Python's operators, where/min/max/abs/exp/log/tanh/sigmoid/floor).
This module turns the Python function into one, as torch.compile's tracing does for PyTorch's
own kernels: the function is called **once**, with traced values in place of b, h, q_idx,
kv_idx (and the score), and every operation on them records its program text instead of
computing (_torch_trace_values has the values, _torch_trace_ops the operations). Real tensors the function indexes with a traced
value (``document_id[q_idx]``, ``rel[h, q_idx - kv_idx + L]``) are captured as the program's
tables, by reference: named after the variable that holds them where the indexing happens
(else t0, t1, …), one table per tensor however often it is read.

What cannot be traced raises maskattn.Error naming the construct and the line: Python control
flow on a traced value (``if``, ``and``, ``or``, ``not``: the value is symbolic), converting one
to a Python number, a torch function the language lacks, a captured tensor of another device or
dtype, or indexing that is not one index per dimension of a 1-3-D tensor.
"""

from __future__ import annotations

import dis
import linecache
import os
import re
import sys
from typing import List, NamedTuple, Tuple

import torch

from . import _core
from . import _torch_trace_ops  # noqa: F401  (registers the operations in values.HANDLERS)
from . import _torch_trace_values as values

Error = _core.Error

__all__ = ["TracedProgram", "trace_mask_mod", "trace_score_mod"]

_TABLE_DTYPES = (torch.int64, torch.int32, torch.float32, torch.bool)
_RESERVED = frozenset({"b", "h", "q", "kv", "s", "where", "min", "max", "abs", "exp", "log",
                       "tanh", "sigmoid", "floor"})
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLUMBING = {os.path.abspath(m.__file__) for m in (sys.modules[__name__], values,
                                                    _torch_trace_ops)} | {
    os.path.join(os.path.dirname(torch.__file__), name) for name in ("_tensor.py", "overrides.py")}
_ADVICE = ("maskattn traces it once with symbolic b, h, q_idx, kv_idx (and score), as "
           "torch.compile does")


class TracedProgram(NamedTuple):
    """A traced mod: the program's kind ("mask"/"score"), its text, and its tables as
    (name, tensor) in first-use order (the tensors as the function captured them)."""

    kind: str
    text: str
    tables: List[Tuple[str, torch.Tensor]]

    def program(self) -> _core.Program:
        """The compiled program, reading each table in place (through .detach()). It is
        compiled from its canonical text (the traced text has a parenthesis per operation), so
        that the library's messages quote the readable form."""
        compile_as = _core.Program.mask if self.kind == "mask" else _core.Program.score
        tables = {name: tensor.detach() for name, tensor in self.tables}
        return compile_as(compile_as(self.text, **tables).text, **tables)


def trace_mask_mod(mask_mod) -> TracedProgram:
    """``mask_mod(b, h, q_idx, kv_idx) → bool`` as a mask program."""
    trace = Trace(mask_mod, "mask_mod")
    result = trace.call(*(values.Traced(trace, name, "int") for name in ("b", "h", "q", "kv")))
    if result.kind != "bool":
        raise Error(f"mask_mod returned an {result.kind} value ({result.text}); it must return "
                    f"a bool tensor (True = attend)")
    return TracedProgram("mask", result.text, trace.tables)


def trace_score_mod(score_mod) -> TracedProgram:
    """``score_mod(score, b, h, q_idx, kv_idx) → score`` as a score program."""
    trace = Trace(score_mod, "score_mod")
    args = [values.Traced(trace, "s", "float")]
    args += [values.Traced(trace, name, "int") for name in ("b", "h", "q", "kv")]
    result = trace.call(*args)
    if result.kind == "bool":
        raise Error(f"score_mod returned a bool value ({result.text}); it must return the "
                    f"(modified) score, a floating tensor (hide a pair with "
                    f"torch.where(condition, score, -float('inf')))")
    return TracedProgram("score", result.text, trace.tables)


def _user_frame():
    """The innermost frame of the traced function's own code (not this tracer's, nor torch's
    operator plumbing)."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename) in _PLUMBING:
        frame = frame.f_back
    return frame


def _location(frame) -> str:
    if frame is None:
        return ""
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    return f" at {where}" + (f" `{line}`" if line else "")


def _truth_construct(frame) -> str:
    """Which Python construct asked for a traced value's truth, from the instruction running
    in ``frame`` (CPython's bytecode: `and`/`or` jump keeping the value, `not` negates, `if`
    and `while` pop and jump, a call is bool() or a builtin like min)."""
    if frame is None:
        return "a Python truth test"
    instructions = list(dis.get_instructions(frame.f_code))
    at = next((n for n, i in enumerate(instructions) if i.offset == frame.f_lasti), None)
    if at is None:
        return "a Python truth test"
    names = [i.opname for i in instructions[max(at - 1, 0):at + 3]]
    previous, current = (names[0], names[1:]) if at > 0 else ("", names)
    if current[0] == "TO_BOOL":
        current = current[1:] or [""]
    if current[0] == "UNARY_NOT":
        return "Python's `not`"
    if current[0].startswith("JUMP_IF_") or (previous == "COPY" and "POP_JUMP" in current[0]):
        return "Python's `and`" if "FALSE" in current[0] else "Python's `or`"
    if "POP_JUMP" in current[0]:
        return "a Python `if` (or `while`, `assert`, `x if c else y`, `and`/`or` in a condition)"
    if "CALL" in current[0]:
        return "bool() or a Python builtin that compares (min, max, sorted, any, all)"
    return "a Python truth test"


class Trace:
    """One tracing call: the captured tables, and the errors naming what cannot be traced."""

    def __init__(self, function, role: str):
        if not callable(function):
            raise Error(f"{role} must be callable, got {type(function).__name__}")
        self.function, self.role = function, role
        self.tables: List[Tuple[str, torch.Tensor]] = []
        self._names = {}  # id(tensor) → table name
        self._captured = []  # the tensors, alive while tracing so that ids stay unique

    def call(self, *args) -> values.Traced:
        try:
            result = self.function(*args)
        except Error:
            raise
        except Exception as error:
            raise Error(f"{self.role} raised {type(error).__name__}: {error}"
                        f"{_location(_innermost_user_frame(error))} while traced; {_ADVICE}, "
                        f"so it must be written with torch operations on its arguments") from error
        if isinstance(result, torch.Tensor) and result.dim() != 0:
            kind = "bool" if self.role == "mask_mod" else "floating"
            raise Error(f"{self.role} returned a tensor of shape {list(result.shape)}; it must "
                        f"return one {kind} value per (b, h, q_idx, kv_idx), a 0-d tensor")
        if not isinstance(result, (values.Traced, torch.Tensor, bool, int, float)):
            raise Error(f"{self.role} returned {type(result).__name__}; it must return a tensor")
        return values.value(self, result)

    # ---- tables ---------------------------------------------------------------------------------

    def check_table(self, tensor):
        what = f"a tensor of shape {list(tensor.shape)}"
        if tensor.device.type != "cpu":
            self.fail(f"captures {what} on {tensor.device}",
                      "program tables are read in CPU memory: move it with .cpu() once, "
                      "outside the function")
        if tensor.dtype not in _TABLE_DTYPES:
            self.fail(f"captures {what} of dtype {tensor.dtype}",
                      "program tables are torch.int64, torch.int32, torch.float32 or torch.bool: "
                      "convert it (tensor.float() inside the function keeps its gradient, or "
                      ".long() / .float() once outside)")
        if tensor.dim() > 3:
            self.fail(f"indexes {what}, {tensor.dim()} dimensions",
                      "program tables have 1 to 3 dimensions: flatten the others into one "
                      "(t.reshape(B * H, L, L)[b * H + h, q_idx, kv_idx])")

    def table(self, tensor, stored=None) -> str:
        """The table name of ``tensor`` (read as ``stored``, a view of it, when given)."""
        name = self._names.get(id(tensor))
        if name is not None:
            return name
        stored = tensor if stored is None else stored
        self.check_table(stored)
        name = self._fresh_name(_variable_name(tensor))
        self._names[id(tensor)] = name
        self._captured.append(tensor)
        self.tables.append((name, stored))
        return name

    def _fresh_name(self, name) -> str:
        taken = {existing for existing, _ in self.tables}
        if name is None or not _IDENTIFIER.match(name) or not name.isascii():
            name = "t"
            number = len(self.tables)
            while f"t{number}" in taken:
                number += 1
            return f"t{number}"
        if name in _RESERVED:
            name += "_"
        base, number = name, 2
        while name in taken:
            name, number = f"{base}_{number}", number + 1
        return name

    # ---- errors ---------------------------------------------------------------------------------

    def fail(self, what: str, advice: str):
        raise Error(f"{self.role} {what}{_location(_user_frame())}; {advice}")

    def truth_test(self):
        frame = _user_frame()
        raise Error(f"{self.role} uses {_truth_construct(frame)} on a traced value"
                    f"{_location(frame)}: {_ADVICE}, so it cannot take a Python branch on "
                    f"them; write it with & | ~ and torch.where (e.g. (q_idx >= kv_idx) & "
                    f"(doc[q_idx] == doc[kv_idx]); torch.minimum for min)")

    def conversion(self, construct: str):
        self.fail(f"converts a traced value to a Python number ({construct})",
                  f"{_ADVICE}: keep them tensors (compare them, index a captured tensor with "
                  f"them, torch.where) instead of Python numbers")

    def unsupported(self, construct: str):
        self.fail(f"uses {construct}",
                  "maskattn's programs do not have it: they have + - * / // % (// and % on "
                  "integers), comparisons, & | ~ (on "
                  "bools), torch.where, abs, exp, exp2, log, tanh, sigmoid, floor, ceil, trunc, "
                  "minimum/maximum/clamp, .to()/.long()/.float() and indexing a captured "
                  "tensor; compute anything else into a captured tensor outside the function")

    def unindexed(self, tensor):
        self.fail(f"uses a captured tensor of shape {list(tensor.shape)} without indexing it",
                  "index it with traced values (e.g. slopes[h], doc[q_idx]): the function "
                  "computes one value per (b, h, q_idx, kv_idx)")

    def bad_index(self, tensor, what: str):
        self.fail(f"indexes a tensor of shape {list(tensor.shape)} with {what}",
                  "a captured tensor of 1 to 3 dimensions takes one integer index per "
                  "dimension (traced or constant): doc[q_idx], rel[h, q_idx - kv_idx + L], "
                  "bias[b, h]")

    def partial_index(self, rows):
        self.fail(f"uses {rows.text}, a tensor of shape {list(rows.tensor.shape)} indexed in "
                  f"{len(rows.indices)} of its {rows.tensor.dim()} dimensions",
                  "index every dimension (rel[h, q_idx - kv_idx] or rel[h][q_idx - kv_idx])")


def _innermost_user_frame(error):
    traceback, frame = error.__traceback__, None
    while traceback is not None:
        if os.path.abspath(traceback.tb_frame.f_code.co_filename) not in _PLUMBING:
            frame = traceback.tb_frame
        traceback = traceback.tb_next
    return frame


def _variable_name(tensor):
    """The name the traced function's code gives ``tensor`` where it indexes it: a local, a
    closure variable or a global, or a parameter/buffer of a module held in one."""
    frame = _user_frame()
    if frame is None:
        return None
    for scope in (frame.f_locals, frame.f_globals):
        for name, held in scope.items():
            if held is tensor:
                return name
    for held in frame.f_locals.values():
        if isinstance(held, torch.nn.Module):
            for name, member in (*held.named_parameters(recurse=False),
                                 *held.named_buffers(recurse=False)):
                if member is tensor:
                    return name
    return None
