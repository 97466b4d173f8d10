#!/usr/bin/env python3
"""Lists C++ and Python functions longer than a limit, and files longer than a limit.

    scripts/function_sizes.py [--max-function 80] [--max-file 600] DIR_OR_FILE...

The project's size rule (docs/design.md §4): no function over 80 lines, no file over 600, in
src/, tools/, bench/, python/ and fuzz/; the test command runs this script over them (ctest:
code_sizes) and fails on anything over. Tests are exempt: a test file lists cases and may be
longer, and so is python/tests/. There is no exceptions list.

C++ (.cc, .h): a function is a top-level or namespace-level brace block whose opening line (or the lines just
before it) looks like a signature: it ends in `)`, `) const`, `) override`, `-> T` or an
initialiser list, and is not a control statement, a class/struct/namespace/enum or a lambda
inside another function (those count towards their enclosing function). Lines are counted from
the signature's first line to the closing brace. Comments and strings are blanked first, so
braces inside them do not count.

Python (.py, and scripts without an extension whose first line names python): every function
and method, nested ones included, from its `def` line (decorators excluded) to its last line,
read with the ast module. Exit status 1 when anything is over a limit.
"""
import ast
import argparse
import os
import re
import sys

CONTROL = re.compile(r"^\s*(if|for|while|switch|catch|do|else)\b")
TYPE_BLOCK = re.compile(r"\b(namespace|class|struct|union|enum)\b[^;()]*$")


def strip_comments_and_strings(text):
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"' or c == "'":
            if c == '"' and i > 0 and text[i - 1] == "R":  # raw string R"(...)"
                k = text.find("(", i)
                delim = text[i + 1:k]
                j = text.find(")" + delim + '"', k)
                j = n if j < 0 else j + len(delim) + 2
            else:
                j = i + 1
                while j < n and text[j] != c:
                    j += 2 if text[j] == "\\" else 1
                j += 1
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:j - 1]) + c if j - i >= 2 else text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    text = strip_comments_and_strings(open(path, encoding="utf-8").read())
    lines = text.split("\n")
    results = []
    depth = 0
    stack = []  # (kind, start line, name) per open brace
    for number, line in enumerate(lines, 1):
        for pos, c in enumerate(line):
            if c == "{":
                head = " ".join(l.strip() for l in lines[max(0, number - 4):number - 1])
                head = (head + " " + line[:pos]).strip()
                inside_function = any(kind == "function" for kind, _, _ in stack)
                kind = "block"
                if not inside_function and not TYPE_BLOCK.search(line[:pos] or head):
                    tail = head.rstrip()
                    last_statement = re.split(r"[;{}]", tail)[-1]
                    if (re.search(r"\)\s*(const|override|noexcept|final|\s)*$", tail)
                            or re.search(r"->\s*[\w:<>,\s*&]+$", tail)
                            or re.search(r"\)\s*:\s*\w", last_statement)
                            or re.search(r"\w\s*\([^()]*\)\s*,?$", tail)) \
                            and not CONTROL.match(last_statement.strip()) \
                            and "=" not in last_statement.split("(")[0]:
                        kind = "function"
                        start = number
                        # the signature may start a few lines up
                        for back in range(number - 1, max(0, number - 6), -1):
                            prev = lines[back - 1].strip()
                            if prev == "" or prev.endswith((";", "}", "{")) or prev.startswith("#"):
                                break
                            start = back
                        name_match = re.findall(r"([\w:~<>]+)\s*\(", last_statement)
                        stack.append((kind, start, name_match[0] if name_match else "?"))
                        depth += 1
                        continue
                stack.append((kind, number, ""))
                depth += 1
            elif c == "}" and stack:
                kind, start, name = stack.pop()
                depth -= 1
                if kind == "function":
                    results.append((number - start + 1, name, start))
    return results, len(lines) - (1 if text.endswith("\n") else 0)


def python_functions(path):
    text = open(path, encoding="utf-8").read()
    results = []
    for node in ast.walk(ast.parse(text, filename=path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            results.append((node.end_lineno - node.lineno + 1, node.name, node.lineno))
    return results, text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def is_python(path):
    if path.endswith(".py"):
        return True
    if os.path.splitext(path)[1]:
        return False
    try:
        with open(path, encoding="utf-8") as script:
            first = script.readline()
    except (OSError, UnicodeDecodeError):
        return False
    return first.startswith("#!") and "python" in first


def sources(paths):
    files = []
    for path in paths:
        if not os.path.isdir(path):
            files.append(path)
            continue
        for root, folders, names in os.walk(path):
            folders[:] = [f for f in folders if f not in ("tests", "__pycache__")]
            for name in names:
                full = os.path.join(root, name)
                if name.endswith((".cc", ".h")) or is_python(full):
                    files.append(full)
    return sorted(files)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--max-function", type=int, default=80)
    parser.add_argument("--max-file", type=int, default=600)
    args = parser.parse_args()
    files = sources(args.paths)
    over = 0
    longest = []
    for path in files:
        found, line_count = python_functions(path) if is_python(path) else functions(path)
        if line_count > args.max_file:
            print(f"file {line_count:5d} lines  {path}")
            over += 1
        for length, name, start in found:
            longest.append((length, f"{path}:{start}", name))
            if length > args.max_function:
                print(f"function {length:4d} lines  {path}:{start}  {name}")
                over += 1
    longest.sort(reverse=True)
    print(f"{len(files)} files, {len(longest)} functions; longest: " +
          ", ".join(f"{n} {where} {name}" for n, where, name in longest[:3]))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
