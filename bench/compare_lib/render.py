"""bench/compare's results as Markdown: docs/benchmarks.md's generated block and README's figures.
Saved results of older runs (no path, no matrix-unit peaks, PyTorch 1.13) still render."""
import sys
import textwrap

from compare_lib import amx_cases
from compare_lib.measure import gflops

NAN = float("nan")


def find(results, label, impl="maskattn fused", dtype="f32", threads=None, pass_="forward"):
    threads = threads or results["threads"]
    return next((r for r in results["rows"] if r["label"] == label
                 and r["impl"].startswith(impl) and r["dtype"] == dtype
                 and r["threads"] == threads and r.get("pass", "forward") == pass_), None)


def wrap(paragraph):
    """Prose of the generated blocks, wrapped at 100 columns like the hand-written docs."""
    return textwrap.fill(paragraph, 100, break_on_hyphens=False, break_long_words=False)


def per_threads(values, unit):
    return ", ".join(f"{values[k]:.{1 if unit == 'GB/s' else 0}f} {unit} ({k} "
                     f"thread{'s' * (k > 1)})" for k in sorted(values))


def peer_text(results):
    """Which PyTorch ran, or why none did."""
    if not results.get("have_torch"):
        return f"PyTorch not run: {results.get('torch_skip_reason') or 'not installed'}"
    version = results.get("torch_version")
    if version is None:  # a run of the PyTorch 1.13 era: the version is in the rows' names
        return "PyTorch as named in the rows"
    return (f"PyTorch {version} (`torch.nn.functional.scaled_dot_product_attention`, the backend "
            f"it chose named per row) at {results['threads']} threads")


def machine_line(results):
    """The peaks header: the machine, its measured peaks and bandwidths, the peer, the command."""
    units = []
    for unit, name in (("amx", "AMX `tdpbf16ps`"), ("bf16_dot", "AVX512-BF16 `vdpbf16ps`")):
        if results.get(unit):
            units.append(f"{name} peak {per_threads(results[unit], 'GF/s')}")
        elif results.get(f"{unit}_unavailable"):
            units.append(f"{name} unavailable ({results[f'{unit}_unavailable']})")
    flags = ", ".join(results.get("flags") or []) or "no AVX-512"
    return wrap(
        f"Machine: {results['model']}, {results['cores']} cores ({flags}), {results['system']}; "
        f"SIMD target {results['target']}; measured FMA peak "
        f"{per_threads(results['fma'], 'GF/s')}"
        + "".join(f"; {text}" for text in units)
        + f"; STREAM triad {per_threads(results['triad'], 'GB/s')}; read "
        f"{per_threads(results['read'], 'GB/s')}. Peer: {peer_text(results)}. Run "
        f"{results['date']}: `{results['command']}`" + load_text(results) + ".")


def load_text(results):
    """The share of the CPUs other processes took during the run (measured since 2026-12-01)."""
    if "others_busy" not in results:
        return ""
    return (f"; other processes used {100 * results['others_busy']:.0f} % of the CPUs during "
            f"the run (hypervisor steal {100 * results['steal']:.0f} %)")


def main_table(results):
    fma = results["fma"]
    peak = fma[max(fma)]
    lines = ["| case | implementation | path | dtype | threads | median ms | GF/s allowed | "
             "GF/s dense-eq. | % FMA peak | peak RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in results["rows"]:
        allowed = gflops(row, row["allowed"])
        lines.append(f"| {row['label']} | {row['impl']} | {row.get('path', '—')} | "
                     f"{row['dtype']} | {row['threads']} | {row['ms']:.2f} | {allowed:.1f} | "
                     f"{gflops(row, row['dense']):.1f} | "
                     f"{100 * allowed / fma.get(row['threads'], peak):.0f} % | {row['rss']:.0f} |")
    return lines


def backward_section(results):
    fma, t = results["fma"], results["threads"]
    peak = fma[max(fma)]
    lines = ["", wrap(
        f"Backward pass, B=1, H=8, D=64, f32, {t} threads: `attention_backward` (dQ, dK, dV "
        "from dO, O and the LSE) against our forward and, where installed, PyTorch's "
        "autograd backward (`out.backward(dO)` only; the forward that records the graph is not "
        "timed); the three run round-robin, medians of 5. GF/s count the backward's five "
        "products, 2.5× the forward's flops per pair."), ""]
    lines.append("| case | path | forward ms | backward ms | backward / forward | PyTorch "
                 "backward ms | PyTorch / ours | backward GF/s allowed | GF/s dense-eq. | "
                 "% FMA peak | peak RSS MiB, ours / PyTorch |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, (fwd, bwd, pt) in results["backward"].items():
        allowed = gflops(bwd, bwd["allowed"])
        lines.append(f"| {label} | {bwd.get('path', '—')} | {fwd['ms']:.2f} | {bwd['ms']:.2f} | "
                     f"{bwd['ms'] / fwd['ms']:.2f}× | {pt['ms'] if pt else NAN:.2f} | "
                     f"{(pt['ms'] if pt else NAN) / bwd['ms']:.2f}× | {allowed:.1f} | "
                     f"{gflops(bwd, bwd['dense']):.1f} | "
                     f"{100 * allowed / fma.get(bwd['threads'], peak):.0f} % | "
                     f"{bwd['rss']:.0f} / {pt['rss'] if pt else NAN:.0f} |")
    memory = results["backward_memory"]
    n_squared = memory["dense"] * 4 / 2**20  # one f32 Lq×Lk buffer over all heads
    lines += ["", wrap(
        f"Backward memory, causal N=8192: peak RSS {memory['rss']:.0f} MiB for "
        f"{memory['io']:.0f} MiB of inputs and outputs (Q, K, V, O, dO, LSE, dQ, "
        f"dK, dV); one f32 Lq×Lk buffer for the 8 heads would alone be "
        f"{n_squared:.0f} MiB ({memory['ms']:.0f} ms per backward).")]
    return lines


def forward_checks(results, check):
    fma, t, rows = results["fma"], results["threads"], results["rows"]
    peak = fma[max(fma)]

    def ours(label, **kw):
        return find(results, label, **kw)
    for n in (2048, 4096):
        share = gflops(ours(f"dense N={n}"), ours(f"dense N={n}")["dense"]) / peak
        check(f"dense N={n}: share of FMA peak", f"{100 * share:.1f} %", "≥ 70 %", share >= 0.70)
    causal_ratio = ours("causal N=2048")["ms"] / ours("dense N=2048")["ms"]
    check("causal N=2048 time / dense time", f"{causal_ratio:.3f}", "≤ 0.55", causal_ratio <= 0.55)
    if results["have_torch"]:
        for n in (2048, 4096):
            speedup = ours(f"dense N={n}", impl="PyTorch")["ms"] / ours(f"dense N={n}")["ms"]
            check(f"dense N={n}: PyTorch time / ours", f"{speedup:.2f}×", "≥ 2×", speedup >= 2)
        speedup = ours("causal N=2048", impl="PyTorch")["ms"] / ours("causal N=2048")["ms"]
        check("causal N=2048: PyTorch time / ours", f"{speedup:.2f}×", "≥ 4×", speedup >= 4)
    window, dense_big = ours("window 256 N=16384"), ours("dense N=16384")
    if window is not None and dense_big is not None:
        # At the dense rate per allowed pair: (allowed / dense pairs) · dense time, 10 % slack.
        at_dense_rate = window["allowed"] / dense_big["dense"] * dense_big["ms"]
        check("window 256, N=16384: time vs 1.1·(allowed/dense)·dense time",
              f"{window['ms']:.1f} ms vs {1.1 * at_dense_rate:.1f} ms "
              f"({window['ms'] / at_dense_rate:.2f}× the dense rate)", "≤",
              window["ms"] <= 1.1 * at_dense_rate)
    padded = ours("padded B=8 N=2048")
    unpadded = sum(r["ms"] for r in rows if r["label"].startswith("unpadded L="))
    check("padded B=8 vs the sum of 8 unpadded runs", f"{padded['ms'] / unpadded:.2f}×", "≤ 1.2×",
          padded["ms"] <= 1.2 * unpadded)
    f32, bf16, f16 = (ours("dense N=2048", dtype=d) for d in ("f32", "bf16", "f16"))
    check("bf16 / f32 throughput, dense N=2048", f"{f32['ms'] / bf16['ms']:.2f}×", "≥ 1.5×",
          f32["ms"] / bf16["ms"] >= 1.5)
    check("f16 / f32 throughput, dense N=2048", f"{f32['ms'] / f16['ms']:.2f}×", "≥ 1.0×",
          f32["ms"] / f16["ms"] >= 1.0)
    for dtype in ("f32", "bf16"):
        row = ours("decode Lq=1 Lk=32768", dtype=dtype)
        rate = row["io"] * 2**20 / 1e9 / (row["ms"] / 1e3)  # GB/s, as the triad is counted
        check(f"decode {row['dtype']}: share of memory bandwidth",
              f"{rate:.1f} GB/s = {100 * rate / results['bandwidth']:.0f} %", "≥ 60 %",
              rate >= 0.6 * results["bandwidth"])
    one_thread = ours("dense N=2048", threads=1)
    if one_thread is not None and t > 1:
        scaling = one_thread["ms"] / f32["ms"]
        check(f"{t} threads / 1 thread, dense N=2048", f"{scaling:.2f}×", "≥ 1.8×",
              scaling >= 1.8)


def memory_and_backward_checks(results, check):
    causal_big = find(results, "causal N=32768")
    if causal_big is not None:
        check("peak RSS, causal N=32768", f"{causal_big['rss']:.0f} MiB",
              f"≤ inputs+outputs ({causal_big['io']:.0f} MiB) + 64 MiB",
              causal_big["rss"] <= causal_big["io"] + 64)
    cli = results.get("cli_memory")
    if cli:
        limit = cli["io"] + 64 + cli["baseline"]
        check("maskattn attend (CLI, .npy), causal N=32768: peak RSS", f"{cli['big']:.0f} MiB",
              f"≤ inputs+outputs ({cli['io']:.0f} MiB) + 64 MiB + baseline "
              f"({cli['baseline']:.0f} MiB)", cli["big"] <= limit)
    backward = results["backward"]
    for name in ("dense", "causal"):
        fwd, bwd, pt = backward[f"{name} N=2048"]
        ratio = bwd["ms"] / fwd["ms"]
        check(f"backward {name} N=2048: time / our forward", f"{ratio:.2f}×", "≤ 2.5×",
              ratio <= 2.5)
    if results["have_torch"]:
        for name, goal in (("dense", 2), ("causal", 4)):
            fwd, bwd, pt = backward[f"{name} N=2048"]
            speedup = pt["ms"] / bwd["ms"]
            check(f"backward {name} N=2048: PyTorch autograd time / ours", f"{speedup:.2f}×",
                  f"≥ {goal}×", speedup >= goal)
    memory = results["backward_memory"]
    check("peak RSS, backward causal N=8192", f"{memory['rss']:.0f} MiB",
          f"≤ inputs+outputs ({memory['io']:.0f} MiB) + 64 MiB",
          memory["rss"] <= memory["io"] + 64)


def render(results):
    """The generated part of docs/benchmarks.md: machine, main table, backward table, targets,
    and the AMX acceptance cases."""
    lines = [machine_line(results), ""] + main_table(results) + backward_section(results)
    checks = []

    def check(name, value, goal, passed):
        checks.append(f"| {name} | {value} | {goal} | {'met' if passed else 'MISSED'} |")
    forward_checks(results, check)
    memory_and_backward_checks(results, check)
    lines += ["", "| target | measured | goal | |", "|---|---|---|---|"] + checks
    return "\n".join(lines + amx_cases.render(results))


def torch_name(results):
    """The peer as the README names it: the PyTorch version and how it computed attention."""
    row = find(results, "dense N=2048", impl="PyTorch")
    if row is None:
        return None
    return row["impl"].split(" (")[0]  # 1.13-era names carried the BLAS kernel in parentheses


def versus(theirs, ours, name=None):
    """"2.5× faster than NAME" or, when PyTorch wins, "1.3× slower than NAME"."""
    ratio = theirs["ms"] / ours["ms"]
    text = f"{ratio:.2f}× faster" if ratio >= 1 else f"{1 / ratio:.2f}× slower"
    return f"{text} than {name}" if name else text


def readme_block(results):
    """The headline figures README.md shows, from the same results as docs/benchmarks.md."""
    fma = results["fma"]
    t = results["threads"]
    peak = fma.get(t, fma[max(fma)])

    def ours(label, **kw):
        return find(results, label, **kw)

    def share(row):
        return 100 * gflops(row, row["allowed"]) / fma.get(row["threads"], peak)

    flags = ", ".join(results.get("flags") or []) or "no AVX-512"
    dense, causal = ours("dense N=2048"), ours("causal N=2048")
    bf16 = ours("dense N=2048", dtype="bf16")
    torch_dense = ours("dense N=2048", impl="PyTorch")
    torch_causal = ours("causal N=2048", impl="PyTorch")
    peer = torch_name(results)
    threads = f"{t} thread{'s' * (t > 1)}"
    out = [f"Measured by `{results['command']}` on {results['date']}: {results['model']} "
           f"({results['cores']} cores; {flags}; SIMD target {results['target']}), "
           f"B=1, H=8, D=64, f32, {threads}, medians; the full tables and the mechanisms are in "
           "[docs/benchmarks.md](docs/benchmarks.md).", ""]
    out.append(f"- **Dense N=2048 forward**: {dense['ms']:.1f} ms, {share(dense):.0f} % of the "
               "measured FMA peak" + (f", {versus(torch_dense, dense, peer)}" if torch_dense
                                      else "") + ".")
    out.append(f"- **Causal N=2048 forward**: {causal['ms']:.1f} ms, "
               f"{causal['ms'] / dense['ms']:.2f}× the dense time (the hidden half is skipped)"
               + (f", {versus(torch_causal, causal, peer)}" if torch_causal else "") + ".")
    if bf16:
        out.append(f"- **bf16**: {dense['ms'] / bf16['ms']:.2f}× the f32 throughput "
                   f"(dense N=2048, {bf16['ms']:.1f} ms"
                   + (f", {bf16['path']} products" if bf16.get("path") else "") + ").")
    out += amx_cases.readme_lines(results)
    window, dense_big = ours("window 256 N=16384"), ours("dense N=16384")
    if window and dense_big:
        out.append(f"- **Sliding window** of 256 keys at N=16384: {window['ms']:.1f} ms, "
                   f"{dense_big['ms'] / window['ms']:.0f}× faster than dense attention at the same "
                   f"N ({dense_big['ms']:.0f} ms).")
    out.append(backward_bullet(results, share, peer))
    out.append(memory_bullet(results))
    # Wrapped at 100 columns like the rest of the README; bullets continue indented.
    return "\n".join(textwrap.fill(par, 100, subsequent_indent="  " if par.startswith("- ") else "",
                                   break_on_hyphens=False, break_long_words=False)
                     if par else "" for par in out if par is not None)


def backward_bullet(results, share, peer):
    backward = results["backward"].get("dense N=2048")
    backward_causal = results["backward"].get("causal N=2048")
    if not backward:
        return None
    fwd, bwd, pt = backward
    text = (f"- **Backward** dense N=2048: {bwd['ms']:.1f} ms, {bwd['ms'] / fwd['ms']:.2f}× "
            f"our forward, {share(bwd):.0f} % of the FMA peak")
    if pt:
        autograd = f"{peer or 'PyTorch'}'s autograd"
        text += f", {versus(pt, bwd, autograd)}"
    if backward_causal and backward_causal[2]:
        text += f"; causal {versus(backward_causal[2], backward_causal[1])}"
    return text + "."


def memory_bullet(results):
    causal_big = find(results, "causal N=32768")
    memory = results["backward_memory"]
    text = "- **Memory**: O(tiles) per call, never O(Lq·Lk)"
    if causal_big:
        text += (f": causal N=32768 forward peaks at {causal_big['rss']:.0f} MiB of RSS for "
                 f"{causal_big['io']:.0f} MiB of inputs and outputs")
    text += (f"; the causal N=8192 backward at {memory['rss']:.0f} MiB for "
             f"{memory['io']:.0f} MiB.")
    cli = results.get("cli_memory")
    if cli:
        text += (f" The command line maps its .npy inputs and writes its output in place: "
                 f"`maskattn attend` at causal N=32768 peaks at {cli['big']:.0f} MiB.")
    return text


def write_block(path, name, text):
    with open(path) as doc:
        content = doc.read()
    start, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if start not in content or end not in content:
        sys.exit(f"compare: {path} lacks the {start} / {end} markers")
    head, rest = content.split(start, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as doc:
        doc.write(f"{head}{start}\n{text}\n{end}{tail}")
    print(f"compare: wrote {path}")
