"""Running things for bench/compare: the machine's peaks, our cases, PyTorch's cases."""
import os
import re
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# PyTorch's best footing (docs/benchmarks.md, Method): a huge-page, memory-retaining allocator and
# worker threads that sleep between parallel regions. PASSIVE was the best wait policy for 1.13's
# OpenBLAS path; for 2.x's SDPA (flash bf16 dense/causal N=4096, forward+backward and f32 N=2048,
# decoding) PASSIVE and libgomp's default were within run-to-run noise, each ahead on three of six
# cases (5 round-robin rounds on the quiet Xeon VM, 2026-12-01), so it stays.
TORCH_ENV = {
    "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=33554432:"
                      "glibc.malloc.trim_threshold=4294967296",
    "OMP_WAIT_POLICY": "PASSIVE",
}
# Where bench/compare looks for a Python with PyTorch 2.x when --torch-python is not given.
TORCH_PYTHONS = (os.path.join(ROOT, ".venv", "bin", "python"), "/work/benchvenv/bin/python")


def parse_pairs(line):
    return {key: value for key, value in re.findall(r"(\w+)=(\S+)", line)}


def run(command, env=None):
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"compare: {' '.join(command)} failed:\n{result.stderr}")
    return result.stdout


def machine_peaks(build):
    """bench/machine_peaks' figures: {threads: value} per measurement, and for the matrix units
    ('amx', 'bf16_dot') either figures or, under '<unit>_unavailable', the reason it printed."""
    peaks = run([os.path.join(build, "bench", "machine_peaks")])

    def per_threads(pattern):
        return {int(m.group(1)): float(m.group(2)) for m in re.finditer(pattern, peaks)}
    result = {"fma": per_threads(r"fma_peak .*threads=(\d+) gflops=(\S+)"),
              "triad": per_threads(r"triad threads=(\d+) gbs=(\S+)"),
              "read": per_threads(r"read threads=(\d+) gbs=(\S+)"),
              "target": re.search(r"target=(\S+)", peaks).group(1)}
    for unit in ("amx", "bf16_dot"):
        result[unit] = per_threads(rf"(?m)^{unit}_peak threads=(\d+) gflops=(\S+)$")
        missing = re.search(rf"(?m)^{unit}_peak unavailable reason=(\S+)", peaks)
        result[f"{unit}_unavailable"] = missing.group(1) if missing else None
    result["model"] = "unknown CPU"
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                result["model"] = line.split(":", 1)[1].strip()
                break
    return result


def machine(build):
    """(fma, triad, read, target, model), as bench/decode_compare uses it."""
    p = machine_peaks(build)
    return p["fma"], p["triad"], p["read"], p["target"], p["model"]


def torch_environment(threads):
    """The environment of PyTorch's runs: ours without OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (set
    for this project's tests; they pin OpenBLAS to a slower kernel), plus TORCH_ENV, and the
    OpenMP pool sized to our thread count from the start."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env.update(TORCH_ENV)
    env["OMP_NUM_THREADS"] = str(threads)
    return env


def torch_version(python):
    """PyTorch's version as `python` imports it, or None (no such file, no torch)."""
    if not os.path.exists(python):
        return None
    probe = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True, env=torch_environment(1))
    return probe.stdout.strip() if probe.returncode == 0 else None


def find_torch(explicit):
    """(python, version, None) for the PyTorch 2.x to compare with, or (None, None, reason).
    An explicit --torch-python must work; the defaults are tried in order."""
    def major(version):
        match = re.match(r"(\d+)\.", version or "")
        return int(match.group(1)) if match else 0
    if explicit:
        version = torch_version(explicit)
        if major(version) < 2:
            sys.exit(f"compare: --torch-python {explicit} does not import PyTorch 2.x "
                     f"(found {version or 'no torch'})")
        return explicit, version, None
    tried = []
    for python in TORCH_PYTHONS:
        version = torch_version(python)
        if major(version) >= 2:
            return python, version, None
        tried.append(f"{python}: {version or 'missing or no torch'}")
    return None, None, "no Python with PyTorch ≥ 2 (" + "; ".join(tried) + ")"


def install_torch():
    """.venv with PyTorch 2.x from PyPI and the maskattn package, as the test command makes it
    (scripts/python-env.sh --test; only PyPI is reachable here, so the wheel carries CUDA
    libraries this benchmark never uses)."""
    subprocess.run([os.path.join(ROOT, "scripts", "python-env.sh"), "--test"], check=True)


class ProductPaths:
    """The product unit a run of ours used: the "path" column. `maskattn info` says which unit
    the tile kernel's bf16 products take here, automatically or as MASKATTN_PRODUCTS forces it;
    the rest mirrors the library (update it with the kernels): the reference kernel computes in
    f64; decoding (Lq ≤ 8, src/kernels/fused.cc kRowModeQueries) runs the row kernel, f32
    arithmetic on its inputs as stored; f32/f16 tiles take f32; attention_backward takes AMX
    where the forward's tiles would (and Dv is a multiple of 32: always here, D = Dv = 64), else
    f32 products (it has no vdpbf16ps path; src/kernels/fused_backward.cc)."""
    ROW_KERNEL_QUERIES = 8

    def __init__(self, build):
        self.binary = os.path.join(build, "maskattn")
        self.units = {}

    def tile_units(self, products):
        if products not in self.units:
            env = dict(os.environ, MASKATTN_PRODUCTS=products)
            info = run([self.binary, "info"], env)
            line = re.search(r"(?m)^products (.*)$", info)
            units = parse_pairs(line.group(1)) if line else {}
            forced = re.search(r"(?m)^MASKATTN_PRODUCTS=\S+: bf16 calls use (\S+)", info)
            if forced:
                units["bf16"] = forced.group(1)
            self.units[products] = units
        return self.units[products]

    def path(self, kernel, pass_, lq, dtype, products):
        if kernel == "reference":
            return "f64"
        unit = self.tile_units(products).get(dtype, "?")
        if pass_ == "backward":
            return "amx" if unit == "amx" else "f32"
        if lq <= self.ROW_KERNEL_QUERIES:
            return "rows"
        return unit


class Bench:
    def __init__(self, build, threads, torch_python=None):
        self.build = build
        self.threads = threads
        self.torch_python = torch_python
        self.paths = ProductPaths(build)
        self.rows = []

    def ours(self, label, lq, lk, mask="none", dtype="f32", batch=1, heads=8, kernel="fused",
             threads=None, repeat=5, pass_="forward", products="auto"):
        """One attention_run process; `products` reaches the library as MASKATTN_PRODUCTS (set
        even for auto, so that a value left in the caller's shell cannot change the run)."""
        command = [os.path.join(self.build, "bench", "attention_run"), "--batch", str(batch),
                   "--heads", str(heads), "--kv-heads", str(heads), "--lq", str(lq), "--lk",
                   str(lk), "--mask", mask, "--dtype", dtype, "--kernel", kernel, "--threads",
                   str(threads or self.threads), "--repeat", str(repeat), "--pass", pass_]
        result = parse_pairs(run(command, dict(os.environ, MASKATTN_PRODUCTS=products)))
        row = {"label": label, "impl": f"maskattn {kernel}", "threads": threads or self.threads,
               "dtype": dtype, "ms": float(result["median_ms"]),
               "allowed": float(result["allowed_pairs"]), "dense": float(result["dense_pairs"]),
               "rss": float(result["peak_rss_mib"]), "io": float(result["io_mib"]), "dim": 64,
               "pass": pass_, "products": products,
               "path": self.paths.path(kernel, pass_, lq, dtype, products)}
        self.rows.append(row)
        return row

    def alternating(self, cases, rounds=3, record=True):
        """Runs the cases round-robin `rounds` times and keeps each one's median run: ratios
        between them then see the same drift of this shared machine. A case with torch=True runs
        PyTorch (Bench.torch), the others ours. With record=False the chosen runs are returned
        but not added to the main table."""
        trials = [[] for _ in cases]
        for _ in range(rounds):
            for n, case in enumerate(cases):
                case = dict(case)
                trials[n].append(self.torch(**case) if case.pop("torch", False)
                                 else self.ours(**case))
                self.rows.pop()
        chosen = []
        for runs in trials:
            runs.sort(key=lambda row: row["ms"])
            chosen.append(runs[len(runs) // 2])
        for row in chosen:
            if row["allowed"] != row["allowed"]:  # a PyTorch run: count the pairs ours allowed
                row["allowed"] = next((r["allowed"] for r in chosen if r["label"] == row["label"]
                                       and r["impl"].startswith("maskattn")), row["allowed"])
            if record:
                self.rows.append(row)
        return chosen

    def torch(self, label, lq, lk, mask="none", dtype="f32", batch=1, heads=8, repeat=5,
              pass_="forward", impl="sdpa"):
        """One bench/torch_attention.py process with the PyTorch 2.x of --torch-python, at our
        thread count. impl: sdpa (PyTorch's own backend choice), flash (forced) or math."""
        command = [self.torch_python, os.path.join(ROOT, "bench", "torch_attention.py"),
                   "--batch", str(batch), "--heads", str(heads), "--lq", str(lq), "--lk", str(lk),
                   "--mask", mask, "--dtype", dtype, "--threads", str(self.threads), "--repeat",
                   str(repeat), "--pass", pass_, "--impl", impl]
        result = parse_pairs(run(command, torch_environment(self.threads)))
        ours = next((r for r in self.rows if r["label"] == label and r["dtype"] == dtype
                     and r["pass"] == pass_), None)
        name = (f"PyTorch {result['torch']} math ({result['blas']})" if impl == "math"
                else f"PyTorch {result['torch']} SDPA {result['backend']}")
        row = {"label": label, "impl": name, "threads": self.threads, "dtype": dtype,
               "ms": float(result["median_ms"]), "forward_ms": float(result["forward_ms"]),
               "backward_ms": float(result["backward_ms"]),
               "allowed": ours["allowed"] if ours else float("nan"),
               "dense": float(batch) * heads * lq * lk, "rss": float(result["peak_rss_mib"]),
               "io": float("nan"), "dim": 64, "pass": pass_, "path": "—"}
        self.rows.append(row)
        return row


def gflops(row, pairs):
    """GF/s at 2·(D + Dv) flops per pair for the forward; the backward's five products (S, dP,
    dV, dK, dQ) count 2·(3D + 2Dv), 2.5× that, and a forward+backward step 3.5×."""
    factor = {"backward": 2.5, "forward+backward": 3.5}.get(row["pass"], 1.0)
    return factor * pairs * 2 * (row["dim"] + row["dim"]) / (row["ms"] * 1e6)


class OtherLoad:
    """How much of the CPUs went to anything but this run since `start`: all busy time
    (/proc/stat) less this process's and its finished children's (getrusage), over the wall time
    and the cores, plus the hypervisor's steal. On a 2-core VM shared with builds and test
    suites, a run with others at more than a few per cent has timings and peaks to distrust."""

    def __init__(self):
        self.start = self.sample()

    @staticmethod
    def sample():
        with open("/proc/stat") as stat:
            ticks = [int(x) for x in stat.readline().split()[1:9]]
        user, nice, system, idle, iowait, irq, softirq, steal = ticks
        ours = sum(getattr(resource.getrusage(who), field)
                   for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
                   for field in ("ru_utime", "ru_stime"))
        hz = os.sysconf("SC_CLK_TCK")
        return {"wall": time.monotonic(), "busy": (user + nice + system + irq + softirq) / hz,
                "steal": steal / hz, "ours": ours}

    def shares(self):
        """(others, steal): fractions of wall time × cores since the start."""
        now = self.sample()
        capacity = (now["wall"] - self.start["wall"]) * os.cpu_count()
        others = (now["busy"] - self.start["busy"]) - (now["ours"] - self.start["ours"])
        return (max(0.0, others / capacity) if capacity > 0 else 0.0,
                (now["steal"] - self.start["steal"]) / capacity if capacity > 0 else 0.0)
