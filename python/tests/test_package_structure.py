"""The package's internal structure: no import cycle among its modules, and no private name used
across them.

* Importing any module first, in a fresh interpreter, and then all the others works, whatever the
  order (a cycle hidden in a function-level import shows up only in some orders, or at run time).
* A static check reads every module with ``ast`` and builds the graph of the package's own
  imports, function-level ones included: it must have no cycle.
* A name starting with ``_`` belongs to its module: another module of the package may not import
  it (``from ._api import _inputs``) nor read it (``_api._inputs``). Modules themselves may be
  underscore-private (``from . import _core``); dunder names (``__version__``) are not private.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

import maskattn

PACKAGE = "maskattn"
PACKAGE_DIR = pathlib.Path(maskattn.__file__).resolve().parent
SOURCES = {path.stem: path for path in sorted(PACKAGE_DIR.glob("*.py"))}
# Every module of the package: its Python files (the package itself is "__init__") and the C++
# extension, which has no Python source.
MODULES = set(SOURCES) | {"_core"}


def _importable(module: str) -> bool:
    """Whether this environment has what ``module`` needs besides NumPy: torch for maskattn.torch
    and its _torch_* modules, transformers (and torch) for maskattn.transformers."""
    needed = []
    if module == "torch" or module.startswith("_torch") or module == "transformers":
        needed.append("torch")
    if module == "transformers" or module.startswith("_transformers"):
        needed += ["torch", "transformers"]
    return all(importlib.util.find_spec(name) is not None for name in needed)


def _dotted(module: str) -> str:
    return PACKAGE if module == "__init__" else f"{PACKAGE}.{module}"


# ---------------------------------------------------------------------------------------------
# Reading the imports
# ---------------------------------------------------------------------------------------------

def _package_module(node: ast.ImportFrom):
    """The package module a ``from … import`` names ("__init__" for the package), or None when it
    imports from outside the package."""
    if node.level == 0:
        parts = (node.module or "").split(".")
        if parts[0] != PACKAGE:
            return None
        return parts[1] if len(parts) > 1 else "__init__"
    if node.level > 1:  # the package has no subpackages: nothing above it is ours
        return None
    return node.module.split(".")[0] if node.module else "__init__"


class _Imports(ast.NodeVisitor):
    """One module's imports of the package's modules (edges) and uses of private names across
    modules (violations), at any depth (function-level imports too)."""

    def __init__(self):
        self.edges = set()
        self.violations = []
        self.module_aliases = {}  # a local name → the package module it is bound to

    def visit_Import(self, node: ast.Import):
        for alias in node.names:
            parts = alias.name.split(".")
            if parts[0] == PACKAGE and len(parts) > 1 and parts[1] in MODULES:
                self.edges.add(parts[1])
                if alias.asname:
                    self.module_aliases[alias.asname] = parts[1]
            elif parts[0] == PACKAGE:
                self.edges.add("__init__")

    def visit_ImportFrom(self, node: ast.ImportFrom):
        source = _package_module(node)
        if source is None:
            return
        for alias in node.names:
            local = alias.asname or alias.name
            if source == "__init__" and alias.name in MODULES:  # from . import _api
                self.edges.add(alias.name)
                self.module_aliases[local] = alias.name
                continue
            self.edges.add(source)
            if _is_private(alias.name):
                self.violations.append(
                    f"line {node.lineno}: imports {alias.name} from {_dotted(source)}")

    def visit_Attribute(self, node: ast.Attribute):
        if (isinstance(node.value, ast.Name) and node.value.id in self.module_aliases
                and _is_private(node.attr)):
            module = self.module_aliases[node.value.id]
            self.violations.append(f"line {node.lineno}: reads {module}.{node.attr}")
        self.generic_visit(node)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _read_imports():
    """{module: _Imports} for every Python module of the package."""
    result = {}
    for module, path in SOURCES.items():
        imports = _Imports()
        imports.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        imports.edges.discard(module)
        result[module] = imports
    return result


def _find_cycle(edges):
    """One cycle of the graph {module: set of modules} as a list of modules, or None."""
    state = {}  # module → "open" while on the current path, "done" when fully explored
    path = []

    def visit(module):
        state[module] = "open"
        path.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(edges):
        if module not in state:
            cycle = visit(module)
            if cycle:
                return cycle
    return None


# ---------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------

def test_the_static_check_finds_a_cycle_and_a_private_name():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    code = ("from . import _api\n"
            "from ._tools import _seed, audit_mask\n"
            "def f():\n"
            "    from .dist import ring_attention\n"
            "    return _api._inputs\n")
    imports = _Imports()
    imports.visit(ast.parse(code))
    assert imports.edges == {"_api", "_tools", "dist"}
    assert imports.violations == ["line 2: imports _seed from maskattn._tools",
                                  "line 5: reads _api._inputs"]


def test_no_import_cycle_among_the_package_modules():
    edges = {module: imports.edges for module, imports in _read_imports().items()}
    cycle = _find_cycle(edges)
    assert cycle is None, "import cycle: " + " → ".join(_dotted(m) for m in cycle)


def test_no_private_name_is_used_across_modules():
    violations = [f"{_dotted(module)} {violation}"
                  for module, imports in _read_imports().items()
                  for violation in imports.violations]
    assert not violations, "private names used across modules:\n" + "\n".join(violations)


def _import_in_fresh_interpreter(order):
    code = "import importlib\nfor name in %r:\n    importlib.import_module(name)\n" % (order,)
    # The package this test imported, whatever put it on sys.path (PYTHONPATH, an install).
    path = os.pathsep.join(filter(None, (str(PACKAGE_DIR.parent), os.environ.get("PYTHONPATH"))))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=path))
    assert result.returncode == 0, f"importing {order} failed:\n{result.stderr}"


_ORDERABLE = sorted(m for m in SOURCES if m != "__init__" and _importable(m))
# transformers takes seconds to import, and the package's transformers module is a leaf (no
# module imports it: the static check sees every edge), so it is left out of the others imported
# after the first module; it is imported first in its own case and in the reversed order.
_SLOW_LEAVES = {"transformers"}


@pytest.mark.parametrize("first", _ORDERABLE)
def test_every_module_imports_first_then_the_others(first):
    order = [_dotted(first)] + [_dotted(m) for m in _ORDERABLE
                                if m != first and m not in _SLOW_LEAVES]
    _import_in_fresh_interpreter(order)


def test_every_module_imports_in_reversed_order():
    _import_in_fresh_interpreter([_dotted(m) for m in reversed(_ORDERABLE)])
