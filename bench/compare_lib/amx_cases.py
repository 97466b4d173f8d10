"""The AMX acceptance cases (issue 14), run only where bench/machine_peaks measured an AMX peak:
B=1, H=8, D=64 at the run's thread count (2 on the Xeon they were set for),

- bf16 dense N=4096 forward on each product unit (MASKATTN_PRODUCTS = amx, bf16-dot, f32) and
  f32 dense, bf16 causal (automatic unit) and PyTorch's bf16 SDPA with the flash backend forced
  on both, round-robin;
- bf16 and f32 backward, dense N=4096, and PyTorch's flash forward+backward, round-robin;
- decoding, Lq=1 against Lk=32768 bf16 keys, ours and PyTorch's flash, round-robin, judged
  against the read bandwidth measured in the same run;

and the acceptance targets, each printed PASS or MISS with its ratio."""
import textwrap

from compare_lib.measure import gflops

N = 4096
DENSE, CAUSAL = f"dense N={N}", f"causal N={N}"
DECODE = "decode Lq=1 Lk=32768"
ROUNDS = 3


def run_decode(bench, have_torch):
    """The decoding pair; bench/compare runs it next to its own decoding cases, so that the
    bandwidth measured right after them is the yardstick for this one too."""
    cases = [dict(label=DECODE, lq=1, lk=32768, dtype="bf16", repeat=20)]
    if have_torch:
        cases.append(dict(cases[0], torch=True, impl="flash"))
    return bench.alternating(cases, rounds=ROUNDS, record=False)


def run(bench, peaks, have_torch):
    """The forward and backward groups; the bf16-dot row only where vdpbf16ps exists."""
    units = ["amx"] + (["bf16-dot"] if peaks.get("bf16_dot") else []) + ["f32"]
    forward = [dict(label=DENSE, lq=N, lk=N, dtype="bf16", products=unit) for unit in units]
    forward += [dict(label=DENSE, lq=N, lk=N),
                dict(label=CAUSAL, lq=N, lk=N, mask="causal", dtype="bf16")]
    if have_torch:
        forward += [dict(label=DENSE, lq=N, lk=N, dtype="bf16", torch=True, impl="flash"),
                    dict(label=CAUSAL, lq=N, lk=N, mask="causal", dtype="bf16", torch=True,
                         impl="flash")]
    backward = [dict(label=DENSE, lq=N, lk=N, dtype="bf16", pass_="backward"),
                dict(label=DENSE, lq=N, lk=N, pass_="backward")]
    if have_torch:
        backward.append(dict(label=DENSE, lq=N, lk=N, dtype="bf16", pass_="forward+backward",
                             torch=True, impl="flash"))
    return {"auto_bf16": bench.paths.tile_units("auto").get("bf16"),
            "forward": bench.alternating(forward, rounds=ROUNDS, record=False),
            "backward": bench.alternating(backward, rounds=ROUNDS, record=False)}


def pick(rows, label, dtype, pass_="forward", path=None, torch=False):
    return next((r for r in rows if r["label"] == label and r["dtype"] == dtype
                 and r["pass"] == pass_ and r["impl"].startswith("PyTorch") == torch
                 and (path is None or r.get("path") == path)), None)


def unit_peak(results, row):
    """The peak of the unit that did a row's products, at its thread count (None: no such)."""
    peaks = {"amx": results.get("amx"), "bf16-dot": results.get("bf16_dot"),
             "f32": results["fma"]}.get(row.get("path"))
    return peaks.get(row["threads"]) if peaks else None


def table(results, rows):
    lines = ["| case | implementation | path | dtype | pass | median ms | GF/s allowed | "
             "% of its unit's peak | peak RSS MiB |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        allowed = gflops(row, row["allowed"])
        peak = unit_peak(results, row) if row["label"] != DECODE else None
        share = f"{100 * allowed / peak:.0f} %" if peak else "—"
        lines.append(f"| {row['label']} | {row['impl']} | {row.get('path', '—')} | "
                     f"{row['dtype']} | {row['pass']} | {row['ms']:.2f} | {allowed:.1f} | "
                     f"{share} | {row['rss']:.0f} |")
    return lines


def checks(results, amx):
    """(target, measured, goal, passed) per acceptance target that could be measured."""
    rows = amx["forward"] + amx["backward"] + amx["decode"]
    out = []

    def ratio(name, part, whole, goal, limit):
        if part and whole:
            value = part["ms"] / whole["ms"]
            out.append((name, f"{value:.2f}× ({part['ms']:.1f} / {whole['ms']:.1f} ms)", goal,
                        value <= limit))
    bf16 = pick(rows, DENSE, "bf16", path=amx["auto_bf16"])
    ratio(f"bf16 dense forward ({amx['auto_bf16']}) / our f32 forward", bf16,
          pick(rows, DENSE, "f32"), "≤ 0.3×", 0.3)
    ratio("bf16 causal / bf16 dense forward", pick(rows, CAUSAL, "bf16"), bf16, "≤ 0.55×", 0.55)
    bf16_backward = pick(rows, DENSE, "bf16", "backward")
    ratio("bf16 backward / our f32 backward", bf16_backward, pick(rows, DENSE, "f32", "backward"),
          "≤ 0.35×", 0.35)
    decode = pick(rows, DECODE, "bf16")
    if decode:
        threads = decode["threads"]
        bandwidth = results["read"].get(threads, results["read"][max(results["read"])])
        rate = decode["io"] * 2**20 / 1e9 / (decode["ms"] / 1e3)  # GB/s, as machine_peaks
        out.append((f"decode bf16 {DECODE[7:]}: share of the read bandwidth "
                    f"({bandwidth:.1f} GB/s, {threads} threads)",
                    f"{rate:.1f} GB/s = {100 * rate / bandwidth:.0f} %", "≥ 70 %",
                    rate >= 0.7 * bandwidth))
    ours_step = None
    if bf16 and bf16_backward:  # one training step: our forward and backward, medians summed
        ours_step = dict(bf16_backward, ms=bf16["ms"] + bf16_backward["ms"])
    for name, ours, theirs in (
            ("dense forward", bf16, pick(rows, DENSE, "bf16", torch=True)),
            ("causal forward", pick(rows, CAUSAL, "bf16"), pick(rows, CAUSAL, "bf16", torch=True)),
            ("forward+backward", ours_step, pick(rows, DENSE, "bf16", "forward+backward",
                                                 torch=True)),
            ("decode", decode, pick(rows, DECODE, "bf16", torch=True))):
        if ours and theirs:
            speedup = theirs["ms"] / ours["ms"]
            out.append((f"PyTorch SDPA flash bf16 time / ours: {name}",
                        f"{speedup:.2f}× ({theirs['ms']:.1f} / {ours['ms']:.1f} ms)", "> 1×",
                        speedup > 1))
    return out


def render(results):
    """The AMX section of the generated block: nothing for results saved before it existed."""
    if "amx" not in results:
        return []
    amx = results.get("amx_cases")
    if amx is None:
        reason = results.get("amx_unavailable") or "no AMX peak measured"
        return ["", f"AMX acceptance cases: not run ({reason})."]
    t = results["threads"]
    peer = (f"PyTorch {results['torch_version']}'s bf16 `scaled_dot_product_attention` with the "
            "flash backend forced (`sdpa_kernel(SDPBackend.FLASH_ATTENTION)`)"
            if results.get("have_torch") else "PyTorch not run")
    lines = ["", textwrap.fill(
        f"AMX acceptance cases: B=1, H=8, D=64, {t} threads; each group (forward, backward, "
        f"decoding) runs round-robin, {ROUNDS} rounds, medians. The three bf16 dense rows force "
        "the product unit with MASKATTN_PRODUCTS, the others take the automatic one (bf16: "
        f"{amx['auto_bf16']}). Peer: {peer}. Its forward+backward times both passes; ours is "
        "the sum of our forward and backward medians. % of its unit's peak: AMX, vdpbf16ps or "
        "FMA peak, as machine_peaks measured them.", 100, break_on_hyphens=False,
        break_long_words=False), ""]
    lines += table(results, amx["forward"] + amx["backward"] + amx["decode"])
    lines += ["", "| AMX target | measured | goal | |", "|---|---|---|---|"]
    lines += [f"| {name} | {value} | {goal} | {'PASS' if passed else 'MISS'} |"
              for name, value, goal, passed in checks(results, amx)]
    return lines


def readme_lines(results):
    """One README bullet with the AMX headline, when the cases ran."""
    amx = results.get("amx_cases")
    if not amx:
        return []
    rows = amx["forward"]
    bf16 = pick(rows, DENSE, "bf16", path=amx["auto_bf16"])
    f32, causal = pick(rows, DENSE, "f32"), pick(rows, CAUSAL, "bf16")
    torch = pick(rows, DENSE, "bf16", torch=True)
    if not (bf16 and f32 and causal):
        return []
    unit = {"amx": "AMX", "bf16-dot": "vdpbf16ps", "f32": "f32 FMA"}.get(amx["auto_bf16"],
                                                                        amx["auto_bf16"])
    text = (f"- **bf16 on {unit}** (dense N={N}): {bf16['ms']:.1f} ms, "
            f"{bf16['ms'] / f32['ms']:.2f}× our f32 time; causal {causal['ms']:.1f} ms")
    if torch:
        text += (f"; PyTorch's bf16 SDPA flash takes {torch['ms'] / bf16['ms']:.2f}× our dense "
                 "time")
    return [text + "."]
