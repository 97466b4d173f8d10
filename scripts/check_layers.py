#!/usr/bin/env python3
"""The layers of maskattn's sources, and a check that no #include crosses one upward.

    scripts/check_layers.py [--root DIR] [--stamp FILE] [--graph]
    scripts/check_layers.py --self-test

Every file under src/ and include/maskattn/ belongs to one layer (OWNERS: the longest path prefix
wins). A layer may include only itself and the layers MAY_INCLUDE lists; the lists follow the
build targets (docs/design.md §4):

    maskattn (the attention library)   interface ← core ← program ← mask ← kernels ← api ← layer,
                                        diagnostics, ring; io and data on core
    maskattn_viz                        heatmaps and plots, on the library
    maskattn_model                      the tiny GPT, on the library
    maskattn_distributed                the ring over MPI, on the library's ring

so nothing in the library can include a header of the GPT, the plots or MPI, and inside the
library a mask file cannot reach into the kernels. The build runs this script before compiling
the library (CMakeLists.txt: maskattn_layers): an upward include fails the build with the file,
the line and the rule. --graph prints the layer graph as it is (who includes whom, how often).
Exit status 1 on any violation, or on an include of a project header that does not exist.
--self-test plants upward includes in a scratch tree and fails unless each one is caught (ctest:
layer_check_catches_upward_includes).
"""
import argparse
import collections
import os
import re
import sys
import tempfile

# Which layer a file belongs to: the longest matching prefix of its path from the repository root.
OWNERS = {
    "include/maskattn/": "interface",  # the library's public types and declarations
    "include/maskattn/heatmap.h": "viz",
    "include/maskattn/plot.h": "viz",
    "include/maskattn/model/": "model",
    "include/maskattn/dist/": "distributed",
    "src/core/": "core",
    "src/io/": "io",
    "src/data/": "data",
    "src/mask/": "mask",
    "src/program/": "program",
    "include/maskattn/program.h": "interface",
    "src/kernels/": "kernels",
    "src/attention.cc": "api",
    "src/attention_backward.cc": "api",
    "src/paged_attention.cc": "api",
    "src/paged_run.cc": "api",
    "src/paged_run.h": "api",
    "src/paged_tensors.cc": "api",
    "src/gradcheck.cc": "api",
    "src/validate.cc": "api",
    "src/validate.h": "api",
    "src/layer/": "layer",
    "src/diagnostics/": "diagnostics",
    "src/ring/": "ring",
    "src/varlen/": "varlen",
    "src/ring/agreement_mpi": "distributed",
    "src/ring/ring_mpi": "distributed",
    "src/viz/": "viz",
    "src/model/": "model",
}

LIBRARY = {"interface", "core", "io", "data", "mask", "program", "kernels", "api", "layer", "diagnostics",
           "ring", "varlen"}

# What each layer may include besides itself. The public interface is a layer of declarations
# under everything; the private layers stack as the data flows: a mask is resolved (mask) before a
# kernel reads it (kernels), the kernels run behind the validated entry points (api), and the
# layer, the diagnostics and the ring emulator call those entry points.
MAY_INCLUDE = {
    "interface": set(),
    "core": {"interface"},
    "io": {"interface", "core"},
    "data": {"interface", "core"},
    "program": {"interface", "core"},
    "mask": {"interface", "core", "program"},
    "kernels": {"interface", "core", "mask", "program"},
    "api": {"interface", "core", "mask", "kernels", "program"},
    "layer": {"interface", "core", "mask", "kernels", "api", "program"},
    "diagnostics": {"interface", "core", "mask", "kernels", "api", "program"},
    "ring": {"interface", "core", "mask", "kernels", "api", "program"},
    "varlen": {"interface", "core", "mask", "kernels", "api", "program"},
    "viz": LIBRARY,
    "model": LIBRARY,
    "distributed": LIBRARY,
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def owner(path):
    best = None
    for prefix, layer in OWNERS.items():
        if path.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, layer)
    return best[1] if best else None


def layered_files(root):
    for top in ("src", "include/maskattn"):
        for folder, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if name.endswith((".h", ".cc")):
                    yield os.path.relpath(os.path.join(folder, name), root)


def resolve(root, including, target):
    """The repository path an #include "target" in `including` names, as the compiler's search
    order finds it (the including file's folder, then include/, then src/); None for headers of
    other projects (hwy/..., fmt/...)."""
    for base in (os.path.dirname(including), "include", "src"):
        candidate = os.path.normpath(os.path.join(base, target))
        if os.path.isfile(os.path.join(root, candidate)):
            return candidate
    return None


def includes(root, path):
    with open(os.path.join(root, path), encoding="utf-8") as source:
        for number, line in enumerate(source, 1):
            match = INCLUDE.match(line)
            if match:
                yield number, match.group(1)


def check(root):
    problems, edges = [], collections.Counter()
    for path in layered_files(root):
        layer = owner(path)
        if layer is None:
            problems.append(f"{path}: in no layer; add its folder to OWNERS in scripts/check_layers.py")
            continue
        for number, target in includes(root, path):
            resolved = resolve(root, path, target)
            if resolved is None:
                if target.startswith("maskattn/") or target.split("/")[0] in ("core", "mask"):
                    problems.append(f"{path}:{number}: #include \"{target}\" names no file")
                continue
            used = owner(resolved)
            edges[(layer, used)] += 1
            if used != layer and used not in MAY_INCLUDE[layer]:
                allowed = ", ".join(sorted(MAY_INCLUDE[layer])) or "nothing else"
                problems.append(f"{path}:{number}: #include \"{target}\" reaches layer '{used}' "
                                f"from layer '{layer}', which may include only: {allowed} "
                                "(scripts/check_layers.py)")
    return problems, edges


def self_test():
    """Each planted include must be caught, and the clean scratch tree must pass."""
    planted = {
        "src/mask/planted.cc": '#include "maskattn/model/gpt.h"',     # library -> the GPT
        "src/kernels/planted.cc": '#include "maskattn/heatmap.h"',    # library -> plots
        "src/mask/planted2.cc": '#include "kernels/fused.h"',         # mask -> kernels
        "src/core/planted.cc": '#include "mask/block_map.h"',         # core -> mask
        "src/viz/planted.cc": '#include "maskattn/dist/ring_mpi.h"',  # viz -> MPI
    }
    headers = ["include/maskattn/model/gpt.h", "include/maskattn/heatmap.h",
               "include/maskattn/dist/ring_mpi.h", "include/maskattn/mask.h",
               "src/kernels/fused.h", "src/mask/block_map.h", "src/core/element.h"]
    with tempfile.TemporaryDirectory() as root:
        def write(path, text):
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w", encoding="utf-8") as out:
                out.write(text + "\n")
        for header in headers:
            write(header, "#pragma once")
        write("src/kernels/fused.cc", '#include "mask/block_map.h"\n#include "maskattn/mask.h"')
        clean, _ = check(root)
        if clean:
            print("self-test: the clean scratch tree was refused:", *clean, sep="\n  ")
            return 1
        for path, line in planted.items():
            write(path, line)
        problems, _ = check(root)
        missed = [p for p in planted if not any(problem.startswith(p + ":") for problem in problems)]
        if missed:
            print("self-test: upward includes not caught in", ", ".join(missed))
            return 1
    print(f"self-test: {len(planted)} planted upward includes caught, the clean tree passed")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--root", default=os.path.dirname(here), help="the repository")
    parser.add_argument("--stamp", help="a file to touch when the check passes (for the build)")
    parser.add_argument("--graph", action="store_true", help="print the layer graph")
    parser.add_argument("--self-test", action="store_true", help="test the check itself")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    problems, edges = check(args.root)
    if args.graph:
        for (source, target), count in sorted(edges.items()):
            if source != target:
                print(f"{source:12} -> {target:12} {count}")
    for problem in problems:
        print(f"layer check: {problem}", file=sys.stderr)
    if problems:
        return 1
    if args.stamp:
        with open(args.stamp, "w", encoding="utf-8") as stamp:
            stamp.write("layers checked\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
