"""The Python error catalogue and its tests stay in step.

docs/errors.md's "Python (maskattn.Error)" table has rows P01–P99; every row needs a pytest in
python/tests whose name starts with ``test_Pnn_``, and every such test needs its row. The
sources are scanned as text (every test file, whoever wrote it), so that a row whose test was
renamed, or a test whose row was never written, fails here.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ERRORS_MD = TESTS.parent.parent / "docs" / "errors.md"
SECTION = "## Python (maskattn.Error)"

ROW = re.compile(r"^\|\s*(P\d{2})\s*\|(.*)\|\s*$")
TEST = re.compile(r"^\s*(?:async\s+)?def\s+(test_(P\d{2})_\w+)\s*\(", re.MULTILINE)


def catalogue_rows(markdown: str) -> list[str]:
    """The ids of the Python section's table rows, in order (each row must have 4 cells)."""
    assert SECTION in markdown, f"docs/errors.md has no '{SECTION}' section"
    section = markdown.split(SECTION, 1)[1].split("\n## ", 1)[0]
    ids = []
    for line in section.splitlines():
        match = ROW.match(line)
        if match:
            cells = [cell.strip() for cell in match.group(2).split(" | ")]
            assert len(cells) == 3 and all(cells), f"row {match.group(1)} needs 4 filled cells"
            ids.append(match.group(1))
    return ids


def row_tests(sources: dict[str, str]) -> dict[str, list[str]]:
    """id → the test functions (file::name) named after it."""
    found: dict[str, list[str]] = {}
    for file, text in sources.items():
        for name, row in TEST.findall(text):
            found.setdefault(row, []).append(f"{file}::{name}")
    return found


def mismatches(rows: list[str], tests: dict[str, list[str]]) -> list[str]:
    problems = [f"{row} appears {count} times in the table"
                for row, count in Counter(rows).items() if count > 1]
    if rows != sorted(rows):
        problems.append(f"rows are not in increasing order: {rows}")
    problems += [f"{row} has no test named test_{row}_…" for row in rows if row not in tests]
    problems += [f"{', '.join(names)} has no row {row} in docs/errors.md"
                 for row, names in sorted(tests.items()) if row not in rows]
    return problems


def test_every_python_error_row_has_a_test_and_every_test_a_row():
    rows = catalogue_rows(ERRORS_MD.read_text(encoding="utf-8"))
    sources = {path.name: path.read_text(encoding="utf-8") for path in TESTS.glob("*.py")}
    assert rows, "the Python table has no rows"
    problems = mismatches(rows, row_tests(sources))
    assert not problems, "\n".join(problems)


def test_the_checker_finds_both_kinds_of_gap():
    markdown = (f"# Errors\n| E01 | a | b | c |\n\n{SECTION}\n\n| id | where | bad | message |\n"
                "|---|---|---|---|\n| P01 | `f` | x | `m` |\n| P02 | `g` | y | `n` |\n\n## Next\n"
                "| P07 | not | in the | section |\n")
    rows = catalogue_rows(markdown)
    assert rows == ["P01", "P02"]
    tests = row_tests({"t.py": "def test_P01_x():\n    pass\ndef test_P03_y(rng):\n    pass\n"})
    assert tests == {"P01": ["t.py::test_P01_x"], "P03": ["t.py::test_P03_y"]}
    assert mismatches(rows, tests) == ["P02 has no test named test_P02_…",
                                       "t.py::test_P03_y has no row P03 in docs/errors.md"]
    assert mismatches(["P02", "P01", "P01"], {"P01": ["a"], "P02": ["b"]}) == [
        "P01 appears 2 times in the table",
        "rows are not in increasing order: ['P02', 'P01', 'P01']",
    ]
