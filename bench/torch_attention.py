#!/usr/bin/env python3
"""One PyTorch attention case on the CPU, for bench/compare (which runs it with PyTorch 2.x).

--impl picks how PyTorch computes it:
  sdpa   torch.nn.functional.scaled_dot_product_attention with PyTorch's own choice of backend
         (on the CPU its flash kernel whenever the inputs allow it, else the math path); the
         backend it chose is printed;
  flash  the same call inside torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION), so a
         case the flash kernel cannot take fails instead of quietly running another backend;
  math   S = Q·Kᵀ·scale + M (an additive -inf mask), softmax, P·V: what models ran before SDPA
         (PyTorch 1.13, Debian's python3-torch, has no scaled_dot_product_attention).
Masks are bottom-right aligned like maskattn's (the last query sees the last key): a causal mask
with Lq = Lk is SDPA's is_causal, any other mask a boolean attn_mask.

Prints one line of key=value pairs like attention_run: median_ms, min_ms, max_ms, peak_rss_mib,
blas (the OpenBLAS kernel that ran, or MKL), torch (the version) and backend (sdpa's choice).
Run by bench/compare with the environment that gives PyTorch its best footing (see there).

--pass forward (the default) times the forward under torch.no_grad().
--pass backward times autograd's backward: Q, K and V require grad; each repeat runs the forward
(untimed; it records what the backward needs: the math path keeps S's softmax P, Lq×Lk per head,
the flash kernel only O and the log-sum-exp), clears the gradients, then times only
out.backward(dO). dO is fixed random values. peak_rss_mib then includes the forward's saved
tensors.
--pass forward+backward times both, the forward with the graph recorded, as one training step of
the layer runs them; median_ms is the sum's median, forward_ms and backward_ms the parts' medians.
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


def blas_name(torch):
    """blas_core(), or MKL when PyTorch carries it linked in (the PyPI wheels for x86-64)."""
    core = blas_core()
    if core == "unknown" and torch.backends.mkl.is_available():
        return "MKL"
    return core


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--lq", type=int, default=2048)
    parser.add_argument("--lk", type=int, default=2048)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--mask", default="none", help="none | causal | window:W | padded")
    parser.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    parser.add_argument("--impl", default="sdpa", choices=["sdpa", "flash", "math"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pass", dest="pass_", default="forward",
                        choices=["forward", "backward", "forward+backward"])
    return parser.parse_args()


def keep_mask(torch, args):
    """Which pairs take part, bottom-right aligned, as a boolean tensor that broadcasts against
    [B, H, Lq, Lk]; None for no mask and for a causal Lq = Lk (then SDPA's is_causal)."""
    rows = torch.arange(args.lq).unsqueeze(1) + (args.lk - args.lq)
    cols = torch.arange(args.lk).unsqueeze(0)
    if args.mask == "causal":
        return None if args.lq == args.lk else cols <= rows
    if args.mask.startswith("window:"):
        width = int(args.mask.split(":")[1])
        return (cols <= rows) & (cols > rows - width)
    if args.mask == "padded":
        low = args.lk // 4
        lengths = [low + (args.lk - low) * b // max(args.batch - 1, 1) for b in range(args.batch)]
        keep = torch.arange(args.lk).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
        return keep.view(args.batch, 1, 1, args.lk)
    if args.mask != "none":
        raise SystemExit(f"torch_attention: unknown mask {args.mask}")
    return None


def attention_function(torch, args, q, k, v):
    """The forward as a function of no arguments, and the name of the backend it runs."""
    import torch.nn.functional as F

    keep = keep_mask(torch, args)
    is_causal = args.mask == "causal" and keep is None
    if args.impl == "math":
        scale = 1.0 / math.sqrt(args.dim)
        if is_causal:
            keep = torch.ones(args.lq, args.lk, dtype=torch.bool).tril()
        additive = None
        if keep is not None:
            additive = torch.zeros(keep.shape).masked_fill(~keep, float("-inf")).to(q.dtype)

        def forward():
            scores = torch.matmul(q, k.transpose(-1, -2)) * scale
            if additive is not None:
                scores = scores + additive
            return torch.matmul(torch.softmax(scores, dim=-1), v)
        return forward, "math"

    def forward():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=is_causal)
    if args.impl == "flash":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def flash():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return forward()
        return flash, "flash"
    from torch.nn.attention import SDPBackend
    choice = SDPBackend(torch._fused_sdp_choice(q, k, v, keep, 0.0, is_causal))
    return forward, choice.name.lower().replace("_attention", "")


def main():
    args = parse_args()
    import torch

    torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.dtype == "f32" else torch.bfloat16
    generator = torch.Generator().manual_seed(0)
    shape_q = (args.batch, args.heads, args.lq, args.dim)
    shape_k = (args.batch, args.heads, args.lk, args.dim)
    q = (torch.rand(shape_q, generator=generator) * 2 - 1).to(dtype)
    k = (torch.rand(shape_k, generator=generator) * 2 - 1).to(dtype)
    v = (torch.rand(shape_k, generator=generator) * 2 - 1).to(dtype)
    forward, backend = attention_function(torch, args, q, k, v)
    if args.pass_ != "forward":
        for tensor in (q, k, v):
            tensor.requires_grad_(True)
        dout = (torch.rand(shape_q, generator=generator) * 2 - 1).to(dtype)

    def timed():
        """One repeat: the milliseconds of its forward and backward parts (0 when not timed)."""
        if args.pass_ == "forward":
            start = time.perf_counter()
            with torch.no_grad():
                forward()
            return (time.perf_counter() - start) * 1e3, 0.0
        for tensor in (q, k, v):
            tensor.grad = None
        start = time.perf_counter()
        out = forward()  # records the autograd graph
        middle = time.perf_counter()
        out.backward(dout)
        end = time.perf_counter()
        forward_ms = (middle - start) * 1e3 if args.pass_ == "forward+backward" else 0.0
        return forward_ms, (end - middle) * 1e3

    for _ in range(2):  # warm-up: allocator pools, thread pool, BLAS buffers
        timed()
    parts = [timed() for _ in range(args.repeat)]
    times = sorted(f + b for f, b in parts)

    def median(values):
        return sorted(values)[len(values) // 2]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"median_ms={median(times):.3f} min_ms={times[0]:.3f} max_ms={times[-1]:.3f} "
          f"forward_ms={median([f for f, _ in parts]):.3f} "
          f"backward_ms={median([b for _, b in parts]):.3f} peak_rss_mib={peak:.1f} "
          f"blas={blas_name(torch)} torch={torch.__version__} backend={backend}")


if __name__ == "__main__":
    main()
