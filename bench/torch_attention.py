#!/usr/bin/env python3
"""One PyTorch attention case, the way users run masked attention on CPU with PyTorch 1.13.

PyTorch 1.13 (Debian's python3-torch) has no scaled_dot_product_attention, so this is the math
path every model used then: S = Q·Kᵀ·scale + M (an additive -inf mask), softmax, P·V. Prints one
line of key=value pairs like attention_run: median_ms, min_ms, max_ms, peak_rss_mib, blas_core.
Run by bench/compare with the environment that gives PyTorch its best footing (see there).

--pass forward (the default) times that forward under torch.no_grad().
--pass backward times autograd's backward through the same math path: Q, K and V require grad;
each repeat runs the forward (untimed; autograd keeps S's softmax P, Lq×Lk per head, for the
backward), clears the gradients, then times only out.backward(dO), which computes dV = Pᵀ·dO,
dP = dO·Vᵀ, dS = softmax backward (another Lq×Lk), dQ = dS·K·scale, dK = dSᵀ·Q·scale. dO is fixed
random values. peak_rss_mib then includes the forward's saved tensors.
"""
import argparse
import ctypes
import math
import resource
import time


def blas_core():
    """The OpenBLAS kernel that runs (e.g. Cooperlake, Haswell), read from the loaded library."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "openblas" in line and "/" in line}
    for path in sorted(paths):
        try:
            library = ctypes.CDLL(path)
            library.openblas_get_corename.restype = ctypes.c_char_p
            return library.openblas_get_corename().decode()
        except (OSError, AttributeError):
            continue
    return "unknown"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--lq", type=int, default=2048)
    parser.add_argument("--lk", type=int, default=2048)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--mask", default="none", help="none | causal | window:W | padded")
    parser.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pass", dest="pass_", default="forward", choices=["forward", "backward"])
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.dtype == "f32" else torch.bfloat16
    generator = torch.Generator().manual_seed(0)
    shape_q = (args.batch, args.heads, args.lq, args.dim)
    shape_k = (args.batch, args.heads, args.lk, args.dim)
    q = (torch.rand(shape_q, generator=generator) * 2 - 1).to(dtype)
    k = (torch.rand(shape_k, generator=generator) * 2 - 1).to(dtype)
    v = (torch.rand(shape_k, generator=generator) * 2 - 1).to(dtype)
    scale = 1.0 / math.sqrt(args.dim)

    # The additive mask, bottom-right aligned like maskattn's (the last query at the last key).
    mask = None
    rows = torch.arange(args.lq).unsqueeze(1) + (args.lk - args.lq)
    cols = torch.arange(args.lk).unsqueeze(0)
    if args.mask == "causal":
        mask = torch.zeros(args.lq, args.lk).masked_fill(cols > rows, float("-inf"))
    elif args.mask.startswith("window:"):
        width = int(args.mask.split(":")[1])
        hidden = (cols > rows) | (cols <= rows - width)
        mask = torch.zeros(args.lq, args.lk).masked_fill(hidden, float("-inf"))
    elif args.mask == "padded":
        low = args.lk // 4
        lengths = [low + (args.lk - low) * b // max(args.batch - 1, 1) for b in range(args.batch)]
        keep = torch.arange(args.lk).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
        mask = torch.zeros(args.batch, 1, 1, args.lk).masked_fill(
            ~keep.view(args.batch, 1, 1, args.lk), float("-inf"))
    if mask is not None:
        mask = mask.to(dtype)

    def forward():
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale
        if mask is not None:
            scores = scores + mask
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    def attend():
        with torch.no_grad():
            forward()

    if args.pass_ == "backward":
        for tensor in (q, k, v):
            tensor.requires_grad_(True)
        shape_o = (args.batch, args.heads, args.lq, args.dim)
        dout = (torch.rand(shape_o, generator=generator) * 2 - 1).to(dtype)

    def timed():
        """Runs one repeat and returns the milliseconds of its timed part."""
        if args.pass_ == "forward":
            start = time.perf_counter()
            attend()
            return (time.perf_counter() - start) * 1e3
        out = forward()  # untimed: builds the autograd graph
        for tensor in (q, k, v):
            tensor.grad = None
        start = time.perf_counter()
        out.backward(dout)
        return (time.perf_counter() - start) * 1e3

    for _ in range(2):  # warm-up: allocator pools, thread pool, BLAS buffers
        timed()
    times = [timed() for _ in range(args.repeat)]
    times.sort()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"median_ms={times[len(times) // 2]:.3f} min_ms={times[0]:.3f} max_ms={times[-1]:.3f} "
          f"peak_rss_mib={peak:.1f} blas_core={blas_core()} torch={torch.__version__}")


if __name__ == "__main__":
    main()
