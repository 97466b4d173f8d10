#!/usr/bin/env python3
"""One KV-cache decode step of a d_model-wide attention layer in PyTorch 1.13, as users wrote it.

PyTorch 1.13 (Debian's python3-torch) has no scaled_dot_product_attention and nn.MultiheadAttention
has no cache, so incremental decoding was written by hand; this is that step, with a preallocated
cache (no torch.cat per token), under torch.no_grad():

    qkv = F.linear(x, in_proj_weight, in_proj_bias)         # [B, 1, 3E]: the new token's packed
    q, k, v = qkv.split(E, -1)                              # projection, as nn.MultiheadAttention
    K[:, :, n] = k;  V[:, :, n] = v                         # preallocated caches [B, H, cap, D]
    scores = q @ K[:, :, :n+1].transpose(-1, -2) * scale    # [B, H, 1, n+1]
    out = softmax(scores) @ V[:, :, :n+1]                   # [B, H, 1, D]
    y = F.linear(out.transpose(1, 2).reshape(B, 1, E), out_proj.weight, out_proj.bias)

with nn.MultiheadAttention's weight shapes and initialisation (seeded), K and V filled to n by the
projections of random embeddings (untimed), the step's token random. For each cached length the step
runs --warmup times, then --repeat times timed; it always writes position n, so each timed step
sees n cached positions plus its own, as bench/decode_run's truncation does. --evict-mib reads that
many MiB between steps (untimed), as decode_run does. Timed interleaved with the steps, like
decode_run's attention() alone: the attention part alone (`scores` to `out`, on a random query),
and the packed q/k/v F.linear of the token alone.

Prints the lines bench/decode_run prints (see there): per length `cached=N median_us= min_us=
max_us= tokens_per_s= cache_mib= read_mib= gbs= attention_us=`, plus `qkv_linear_us=`, then the
least-squares `fit` line; `torch=` and `blas_core=` (the OpenBLAS kernel that ran) are on the
config line.

f32 only in bench/decode_compare. --dtype bf16 runs the whole step in bf16 (weights, cache, token),
but PyTorch 1.13's CPU bf16 matmuls are no fair peer for a bf16 cache: measured here (2 threads,
bench/compare's environment, both regimes, three runs each), its bf16 step took 1.0–2.9× the time
of its own f32 step from 256 to 4096 cached positions (its attention part alone 1.5–5×), then
0.6–0.9× at 8192, where it was also faster than its own bf16 step at 4096 (another kernel takes
over): it shows PyTorch's dispatch, not what halving the cache's bytes buys. Run by
bench/decode_compare with the environment that gives PyTorch its best footing (see bench/compare;
OMP_WAIT_POLICY=PASSIVE is also the best of PASSIVE, ACTIVE and unset for these steps: with the
other two, steps stalled for milliseconds).
"""
import argparse
import math
import time
import types

from torch_attention import blas_core  # bench/ is the script's directory, on sys.path


def parse_arguments():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--lengths", default="256,512,1024,2048,4096,8192")
    parser.add_argument("--dtype", default="f32", choices=["f32", "bf16"],
                        help="the cache's and the step's element type")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--evict-mib", type=float, default=0)
    return parser.parse_args()


def build_layer(args, capacity):
    """The layer in args.dtype: nn.MultiheadAttention's weights (seeded), caches [B, H, capacity,
    D], the step's token, a random query for attention alone, and the functions of the step (the
    timed code) over them."""
    import torch
    import torch.nn.functional as F

    dtype = torch.float32 if args.dtype == "f32" else torch.bfloat16
    batch, model, heads = args.batch, args.model, args.heads
    dim = model // heads
    scale = 1.0 / math.sqrt(dim)

    torch.manual_seed(0)
    layer = torch.nn.MultiheadAttention(model, heads, batch_first=True)
    in_weight = layer.in_proj_weight.detach().to(dtype)
    in_bias = layer.in_proj_bias.detach().to(dtype)
    out_weight = layer.out_proj.weight.detach().to(dtype)
    out_bias = layer.out_proj.bias.detach().to(dtype)
    keys = torch.zeros(batch, heads, capacity, dim, dtype=dtype)  # zeros: pages touched here
    values = torch.zeros(batch, heads, capacity, dim, dtype=dtype)
    token = (torch.rand(batch, 1, model) * 2 - 1).to(dtype)
    query = (torch.rand(batch, heads, 1, dim) * 2 - 1).to(dtype)
    eviction = torch.rand(int(args.evict_mib * 2**20 / 4)) if args.evict_mib > 0 else None

    def evict():
        if eviction is not None:
            eviction.sum()

    def attend(q, n):
        scores = torch.matmul(q, keys[:, :, :n + 1].transpose(-1, -2)) * scale
        return torch.matmul(torch.softmax(scores, dim=-1), values[:, :, :n + 1])

    def step(x, n):
        qkv = F.linear(x, in_weight, in_bias)
        q, k, v = qkv.split(model, dim=-1)
        keys[:, :, n] = k.view(batch, heads, dim)
        values[:, :, n] = v.view(batch, heads, dim)
        out = attend(q.view(batch, 1, heads, dim).transpose(1, 2), n)
        return F.linear(out.transpose(1, 2).reshape(batch, 1, model), out_weight, out_bias)

    weights_bytes = sum(t.numel() * t.element_size()
                        for t in (in_weight, in_bias, out_weight, out_bias))
    position_bytes = batch * heads * 2 * dim * keys.element_size()
    return types.SimpleNamespace(
        dtype=dtype, batch=batch, model=model, heads=heads, dim=dim, in_weight=in_weight,
        in_bias=in_bias, keys=keys, values=values, token=token, query=query, evict=evict,
        attend=attend, step=step, weights_bytes=weights_bytes, position_bytes=position_bytes)


def prefill(layer, filled, n, chunk):
    """Fills the caches from position ``filled`` to ``n`` with the projections of random
    embeddings, ``chunk`` positions at a time; returns n."""
    import torch
    import torch.nn.functional as F

    batch, model, heads, dim = layer.batch, layer.model, layer.heads, layer.dim
    keys, values = layer.keys, layer.values
    while filled < n:
        count = min(chunk, n - filled)
        x = (torch.rand(batch, count, model) * 2 - 1).to(layer.dtype)
        k, v = F.linear(x, layer.in_weight, layer.in_bias)[..., model:].split(model, dim=-1)
        keys[:, :, filled:filled + count] = k.view(batch, count, heads, dim).transpose(1, 2)
        values[:, :, filled:filled + count] = v.view(batch, count, heads,
                                                     dim).transpose(1, 2)
        filled += count
    return filled


def time_steps(layer, n, warmup, repeat):
    """(step, attention alone, q/k/v F.linear alone) times in µs, each sorted: ``repeat`` timed
    rounds after ``warmup``, the three interleaved, the eviction read before each."""
    import torch.nn.functional as F

    evict, step, attend = layer.evict, layer.step, layer.attend
    token, query, in_weight, in_bias = layer.token, layer.query, layer.in_weight, layer.in_bias
    times, attention_times, linear_times = [], [], []
    for r in range(warmup + repeat):
        evict()
        start = time.perf_counter()
        step(token, n)
        elapsed = (time.perf_counter() - start) * 1e6
        evict()
        start = time.perf_counter()
        attend(query, n)
        attention_elapsed = (time.perf_counter() - start) * 1e6
        evict()
        start = time.perf_counter()
        F.linear(token, in_weight, in_bias)
        linear_elapsed = (time.perf_counter() - start) * 1e6
        if r >= warmup:
            times.append(elapsed)
            attention_times.append(attention_elapsed)
            linear_times.append(linear_elapsed)
    for samples in (times, attention_times, linear_times):
        samples.sort()
    return times, attention_times, linear_times


def print_length(layer, n, times, attention_times, linear_times):
    """The line of one cached length (decode_run's fields, plus qkv_linear_us); returns the
    median step time."""
    median = times[len(times) // 2]
    read_bytes = layer.position_bytes * (n + 1) + layer.weights_bytes
    print(f"cached={n} median_us={median:.2f} min_us={times[0]:.2f} "
          f"max_us={times[-1]:.2f} tokens_per_s={layer.batch / median * 1e6:.1f} "
          f"cache_mib={layer.position_bytes * n / 2**20:.2f} "
          f"read_mib={read_bytes / 2**20:.2f} "
          f"gbs={read_bytes / median * 1e-3:.2f} "
          f"attention_us={attention_times[len(attention_times) // 2]:.2f} "
          f"qkv_linear_us={linear_times[len(linear_times) // 2]:.2f}", flush=True)
    return median


def print_fit(xs, ys):
    """The least-squares line time = intercept + slope · n over the medians."""
    count = len(xs)
    sx, sy = sum(xs), sum(ys)
    sxx = sum(x * x for x in xs)
    sxy = sum(x * y for x, y in zip(xs, ys))
    denominator = count * sxx - sx * sx
    slope = (count * sxy - sx * sy) / denominator if denominator > 0 else 0.0
    intercept = (sy - slope * sx) / count
    deviation = max(abs(y - (intercept + slope * x)) / y for x, y in zip(xs, ys))
    print(f"fit slope_us_per_1k={slope * 1000:.3f} intercept_us={intercept:.2f} "
          f"max_rel_dev={deviation:.4f}")


def main():
    args = parse_arguments()

    import torch

    torch.set_num_threads(args.threads)
    lengths = sorted(int(n) for n in args.lengths.split(","))
    layer = build_layer(args, lengths[-1] + 1)
    print(f"config model={layer.model} heads={layer.heads} kv_heads={layer.heads} "
          f"head_dim={layer.dim} batch={layer.batch} dtype={args.dtype} threads={args.threads} "
          f"repeat={args.repeat} evict_mib={args.evict_mib:.0f} "
          f"weights_mib={layer.weights_bytes / 2**20:.2f} "
          f"torch={torch.__version__} blas_core={blas_core()}", flush=True)

    xs, ys = [], []
    filled = 0
    with torch.no_grad():
        for n in lengths:
            filled = prefill(layer, filled, n, args.chunk)
            times, attention_times, linear_times = time_steps(layer, n, args.warmup, args.repeat)
            xs.append(n)
            ys.append(print_length(layer, n, times, attention_times, linear_times))
    print_fit(xs, ys)


if __name__ == "__main__":
    main()
