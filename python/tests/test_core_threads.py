"""Threads: results independent of the thread count, the GIL released while computing, and
concurrent calls from Python threads giving the serial results bit for bit.

No test measures speed. The GIL test counts how far a second Python thread gets while the main
thread is inside maskattn: with the GIL released it spins freely (hundreds of thousands of
iterations per call here); a call holding the GIL for as long lets it run only around the call's
Python parts (a few thousand iterations with the short switch interval set below).
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
import torch

import maskattn as ma
from conftest import random_inputs, round_to


def bits(x):
    """The raw bytes of an output, for bitwise comparisons across dtypes and frameworks."""
    x = x.numpy() if isinstance(x, torch.Tensor) and x.dtype != torch.bfloat16 else x
    if isinstance(x, torch.Tensor):
        x = x.view(torch.int16).numpy()
    return np.ascontiguousarray(x).view(np.uint8)


def forward_and_backward(q, k, v, dout, mask, threads):
    out, lse = ma.attention(q, k, v, mask, return_lse=True, threads=threads)
    grads = ma.attention_backward(q, k, v, out, lse, dout, mask, threads=threads)
    return [bits(x) for x in (out, lse, *grads)]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_forward_and_backward_do_not_depend_on_the_thread_count(rng, dtype):
    q, k, v = random_inputs(rng, 2, 4, 2, 150, 150, 32, dtype=dtype)
    dout = round_to(rng.standard_normal(q.shape), dtype)
    mask = ma.Mask().causal().key_lengths([150, 97])
    one = forward_and_backward(q, k, v, dout, mask, threads=1)
    for threads in (2, None):
        for got, want in zip(forward_and_backward(q, k, v, dout, mask, threads), one):
            np.testing.assert_array_equal(got, want)


def test_split_key_decoding_does_not_depend_on_the_thread_count(rng):
    # One (batch, kv head) pair and Lk > 4096: the row kernel splits the keys into chunks.
    q, k, v = random_inputs(rng, 1, 4, 1, 2, 9000, 32)
    mask = ma.Mask().key_lengths([8500])
    one, one_lse = ma.attention(q, k, v, mask, return_lse=True, threads=1)
    two, two_lse = ma.attention(q, k, v, mask, return_lse=True, threads=2)
    np.testing.assert_array_equal(one, two)
    np.testing.assert_array_equal(one_lse, two_lse)


def test_the_gil_is_released_while_computing(rng):
    q, k, v = random_inputs(rng, 1, 8, 8, 2048, 2048, 64)
    iterations, stop, started = [0], threading.Event(), threading.Event()

    def spin():
        started.set()
        while not stop.is_set():
            iterations[0] += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # bounds what the spinner gets around a GIL-holding call
    spinner = threading.Thread(target=spin)
    try:
        spinner.start()
        started.wait()
        during = 0
        for _ in range(3):
            before = iterations[0]
            ma.attention(q, k, v, threads=1)
            during += iterations[0] - before
    finally:
        stop.set()
        spinner.join()
        sys.setswitchinterval(interval)
    assert during > 20000, f"a Python thread made only {during} steps during 3 attention calls"


def test_concurrent_python_threads_give_the_serial_results(rng):
    keep = rng.random((1, 1, 256, 256)) < 0.7
    problems, masks = [], []
    for n, dtype in enumerate(["float32", "float16", "bfloat16", "float32"]):
        q, k, v = random_inputs(rng, 2, 4, 2 if n % 2 else 4, 256, 256, 32, dtype=dtype)
        dout = round_to(rng.standard_normal(q.shape), dtype)
        if n == 3:
            q, k, v, dout = (torch.from_numpy(x) for x in (q, k, v, dout))
        problems.append((q, k, v, dout))
        masks.append(lambda n=n: ma.Mask().sliding_window(90 + n).key_lengths([256, 200]))
    serial = [forward_and_backward(*problem, ma.Mask().keep(keep), threads=1)
              if n < 2 else forward_and_backward(*problem, masks[n](), threads=1)
              for n, problem in enumerate(problems)]

    shared = ma.Mask().keep(keep)  # fresh: threads 0 and 1 fill its scan cache concurrently
    concurrent_masks = [shared, shared, masks[2](), masks[3]()]
    results = [None] * len(problems)
    failures = []
    barrier = threading.Barrier(len(problems))

    def run(n):
        try:
            barrier.wait()
            results[n] = [forward_and_backward(*problems[n], concurrent_masks[n], threads=None)
                          for _ in range(3)]
        except Exception as error:  # reported below, not lost in the thread
            failures.append(error)

    workers = [threading.Thread(target=run, args=(n,)) for n in range(len(problems))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not failures, failures
    for n, repeats in enumerate(results):
        for repeat in repeats:
            for got, want in zip(repeat, serial[n]):
                np.testing.assert_array_equal(got, want)
