#!/usr/bin/env python3
"""Golden CLI outputs: run one maskattn binary over a fixed set of commands and record a SHA-256 of
every output file and of stdout, so that a refactoring can be shown to change no bit.

    scripts/golden.py build/release/maskattn > before.txt     # on the old tree
    scripts/golden.py build/release/maskattn > after.txt      # on the new tree
    diff before.txt after.txt                                 # empty: bitwise identical

The inputs are made here from a fixed linear congruential generator (no NumPy needed), so both
runs see the same bytes. The set covers forward and backward, every mask SPEC kind, f32/f16/bf16,
both kernels, tile edges (lengths 1..257), grouped heads, decode shapes (Lq 1..8 against long
caches), the multi-head layer (full and incremental) and the text commands. Hashes are of one
machine's dispatch target: compare runs on the same CPU.
"""
import hashlib
import os
import struct
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Lcg:
    def __init__(self, seed):
        self.state = seed & 0xFFFFFFFFFFFFFFFF

    def uniform(self):  # in [-1, 1)
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        return ((self.state >> 40) / float(1 << 24)) * 2.0 - 1.0


def write_npy(path, descr, shape, values):
    fmt = {"<f4": "f", "<f2": "e", "<i8": "q", "|u1": "B"}[descr]
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, "".join(f"{s}, " for s in shape) if len(shape) != 1 else f"{shape[0]},")
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * pad + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%d%s" % (len(values), fmt), *values))


def count(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def make_inputs(d, seed, b, hq, hkv, lq, lk, dim, descr):
    rng = Lcg(seed)
    files = {}
    for name, shape in (("q", (b, hq, lq, dim)), ("k", (b, hkv, lk, dim)), ("v", (b, hkv, lk, dim)),
                        ("dout", (b, hq, lq, dim))):
        path = os.path.join(d, f"{name}_{seed}.npy")
        write_npy(path, descr, shape, [rng.uniform() * 2 for _ in range(count(shape))])
        files[name] = path
    return files


def make_mask_files(d, rng, b, hq, lq, lk):
    def npy(name, descr, shape, values):
        path = os.path.join(d, name)
        write_npy(path, descr, shape, values)
        return path

    lens_k = [max(0, lk - 3 * i - 1) for i in range(b)]
    lens_q = [max(0, lq - 2 * i) for i in range(b)]
    keep = [1 if rng.uniform() > -0.6 else 0 for _ in range(b * lk)]
    ids = [0 if rng.uniform() > 0.5 else 7 for _ in range(b * lk)]
    segs = [min(3, (j * 4) // max(1, lk)) for _ in range(b) for j in range(lk)]
    spans = [1 if j < 3 else 0 for _ in range(b) for j in range(lk)]
    return {
        "key-lengths": npy("klen.npy", "<i8", (b,), lens_k),
        "key-starts": npy("kstart.npy", "<i8", (b,), [min(lk, 2 * i + 1) for i in range(b)]),
        "key-keep": npy("kkeep.npy", "|u1", (b, lk), keep),
        "key-blocked": npy("kblocked.npy", "|u1", (b, lk), [1 - x for x in keep]),
        "pad-id": npy("ids.npy", "<i8", (b, lk), ids),
        "query-lengths": npy("qlen.npy", "<i8", (b,), lens_q),
        "query-starts": npy("qstart.npy", "<i8", (b,), [min(lq, i) for i in range(b)]),
        "segments": npy("segs.npy", "<i8", (b, lk), segs),
        "spans": npy("spans.npy", "<i8", (b, lk), spans),
        "keep": npy("keep.npy", "|u1", (lq, lk),
                    [1 if rng.uniform() > -0.5 else 0 for _ in range(lq * lk)]),
        "blocked": npy("blocked.npy", "|u1", (b, 1, lq, lk),
                       [1 if rng.uniform() > 0.7 else 0 for _ in range(b * lq * lk)]),
        "additive": npy("additive.npy", "<f4", (lq, lk),
                        [float("-inf") if rng.uniform() > 0.8 else rng.uniform()
                         for _ in range(lq * lk)]),
        "bias": npy("bias.npy", "<f4", (1, hq, lq, lk),
                    [rng.uniform() for _ in range(hq * lq * lk)]),
        "alibi": npy("alibi.npy", "<f4", (hq,), [0.5 ** (h + 1) for h in range(hq)]),
        "sinks": npy("sinks.npy", "<f4", (hq,), [rng.uniform() for _ in range(hq)]),
    }


def mask_specs(files, lq, lk):
    same = lq == lk
    specs = [[], ["causal"], ["causal:top-left"], ["window:5:2"], ["sliding-window:16"],
             ["chunk:8"], ["prefix:4", "causal"],
             ["key-lengths:" + files["key-lengths"], "causal"],
             ["key-starts:" + files["key-starts"]], ["key-keep:" + files["key-keep"]],
             ["key-blocked:" + files["key-blocked"]], ["pad-id:7:" + files["pad-id"]],
             ["query-lengths:" + files["query-lengths"], "key-lengths:" + files["key-lengths"]],
             ["query-starts:" + files["query-starts"]],
             ["keep:" + files["keep"]], ["blocked:" + files["blocked"]],
             ["additive:" + files["additive"]], ["alibi:" + files["alibi"], "causal"],
             ["softcap:5"], ["sinks:" + files["sinks"], "causal"], ["threshold:-0.5"],
             ["bias:" + files["bias"]],
             ["softcap:3", "alibi:" + files["alibi"], "bias:" + files["bias"], "threshold:-1",
              "sinks:" + files["sinks"], "causal"]]
    if same:
        specs += [["segments:" + files["segments"]], ["spans:" + files["spans"], "causal"]]
    return specs


class Runner:
    def __init__(self, binary, work):
        self.binary = binary
        self.work = work
        self.lines = []

    def run(self, label, args, outputs=()):
        result = subprocess.run([self.binary] + args, capture_output=True, cwd=self.work)
        digest = hashlib.sha256(result.stdout)
        digest.update(str(result.returncode).encode())
        for out in outputs:
            path = os.path.join(self.work, out)
            digest.update(open(path, "rb").read() if os.path.exists(path) else b"<missing>")
            if os.path.exists(path):
                os.remove(path)
        self.lines.append(f"{digest.hexdigest()[:32]}  rc={result.returncode}  {label}")


def shapes():
    # (B, Hq, Hkv, Lq, Lk, D): tile edges, grouped heads, decode rows against long caches.
    return [(2, 4, 2, 7, 7, 16), (2, 2, 2, 64, 64, 32), (1, 2, 1, 130, 257, 64),
            (2, 4, 4, 1, 300, 64), (1, 4, 2, 8, 2048, 64), (1, 2, 2, 3, 129, 128)]


def attention_cases(r, d):
    for si, (b, hq, hkv, lq, lk, dim) in enumerate(shapes()):
        rng = Lcg(100 + si)
        sub = os.path.join(d, f"shape{si}")
        os.makedirs(sub, exist_ok=True)
        files = make_mask_files(sub, rng, b, hq, lq, lk)
        for descr, dtypes in (("<f4", ["", "bf16"]), ("<f2", [""])):
            io = make_inputs(sub, si * 10 + len(descr), b, hq, hkv, lq, lk, dim, descr)
            for dtype in dtypes:
                for mi, specs in enumerate(mask_specs(files, lq, lk)):
                    mask = [a for s in specs for a in ("--mask", s)]
                    common = ["--q", io["q"], "--k", io["k"], "--v", io["v"]] + mask
                    if dtype:
                        common += ["--dtype", dtype]
                    tag = f"shape{si} {descr} {dtype or 'file'} mask{mi}={'+'.join(s.split(':')[0] for s in specs)}"
                    kernels = ["auto", "reference"] if mi % 4 == 0 else ["auto"]
                    for kernel in kernels:
                        for threads in (["1", "2"] if kernel == "auto" else ["2"]):
                            r.run(f"attend {tag} {kernel} t{threads}",
                                  ["attend"] + common + ["--kernel", kernel, "--threads", threads,
                                                         "--out", "o.npy", "--lse", "lse.npy"]
                                  + (["--weights", "p.npy"] if lk <= 300 else []),
                                  ["o.npy", "lse.npy", "p.npy"])
                        if lq * lk <= 64 * 300 or mi % 3 == 0:
                            r.run(f"grad {tag} {kernel}",
                                  ["grad"] + common + ["--dout", io["dout"], "--kernel", kernel,
                                                       "--dq", "dq.npy", "--dk", "dk.npy",
                                                       "--dv", "dv.npy"],
                                  ["dq.npy", "dk.npy", "dv.npy"])


def layer_cases(r):
    data = os.path.join(REPO, "tests", "data", "pytorch_mha")
    x = os.path.join(data, "x.npy")
    for weights in ("packed", "separate"):
        for extra in ([], ["--mask", "causal"], ["--incremental"], ["--dtype", "bf16"],
                      ["--incremental", "--dtype", "bf16"], ["--kv-heads", "2", "--mask", "causal"]):
            if weights == "separate" and "--kv-heads" in extra:
                continue
            r.run(f"mha {weights} {' '.join(extra)}",
                  ["mha", "--query", x, "--weights", os.path.join(data, weights), "--heads", "4",
                   "--out", "mha.npy"] + extra, ["mha.npy"])


def text_cases(r):
    r.run("example", ["example"])
    r.run("demo", ["demo", "--heatmaps", "demo"])  # its files are hashed at the end
    for specs in (["causal"], ["sliding-window:3", "chunk:4"], ["prefix:3", "causal"]):
        r.run(f"mask {' '.join(specs)}", ["mask"] + specs + ["--lq", "9", "--lk", "9"])
    for args in (["--mask", "causal"], ["--mask", "window:3:0", "--dtype", "bf16"],
                 ["--mask", "causal", "--kernel", "reference", "--kv-heads", "1"]):
        r.run(f"gradcheck {' '.join(args)}", ["gradcheck"] + args)
    r.run("audit causal", ["audit", "--mask", "causal", "--expect", "causal", "--lq", "12",
                           "--lk", "12"])


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: scripts/golden.py MASKATTN_BINARY > hashes.txt")
    binary = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as work:
        r = Runner(binary, work)
        attention_cases(r, work)
        layer_cases(r)
        text_cases(r)
        if os.path.isdir(os.path.join(work, "demo")):
            for name in sorted(os.listdir(os.path.join(work, "demo"))):
                data = open(os.path.join(work, "demo", name), "rb").read()
                r.lines.append(f"{hashlib.sha256(data).hexdigest()[:32]}  demo file {name}")
    print("\n".join(r.lines))


if __name__ == "__main__":
    main()
