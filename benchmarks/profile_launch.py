"""Where the host time of an eager decode-sized call goes, layer by layer, against torch.

For each decode shape: host µs per call (the enqueue rate of 400 back-to-back calls; the GPU queue does not
fill, so this is host time), do_bench time of the eager call, and the GPU time alone (replayed from a CUDA
graph), for torch.softmax and onlinesoftmax.softmax; then the layers of ours (the op, the kernel launcher with
the row view given, the pre-bound launch alone); then a cProfile of 300 calls.

    PYTHONPATH=src python benchmarks/profile_launch.py
"""

import cProfile
import pstats
import time

import torch
from triton.testing import do_bench

import onlinesoftmax as oss
from onlinesoftmax.kernels import softmax as K
from onlinesoftmax.ops.softmax import _rows_or_copy


def host_us(fn, calls=400):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t / calls * 1e6


def graph_us(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, warmup=25, rep=100, return_mode="median") * 1e3


def main():
    print(f"{'shape':>16} {'dtype':8} {'impl':28} {'host/call':>10} {'do_bench':>10} {'graph':>8}")
    for dtype in (torch.float32, torch.bfloat16):
        for m in (1, 8, 32):
            for n in (128256, 151936, 262144):
                x = torch.randn(m, n, device="cuda", dtype=dtype)
                y = torch.empty_like(x)
                (xv, yv), (M, N, inner, (gx, gy)) = _rows_or_copy([x, y], 1)
                impls = {
                    "torch.softmax": lambda: torch.softmax(x, -1),
                    "oss.softmax": lambda: oss.softmax(x),
                    "oss.log_softmax": lambda: oss.log_softmax(x),
                    "oss.logsumexp": lambda: oss.logsumexp(x),
                    "torch.logsumexp": lambda: torch.logsumexp(x, -1),
                    "K.forward (row view given)": lambda: K.forward(xv, yv, gx, gy, M, N, inner, K.SOFTMAX),
                }
                ref = torch.softmax(x.double(), -1)
                err = (oss.softmax(x).double() - ref).abs().max().item()
                for name, fn in impls.items():
                    h = host_us(fn)
                    b = do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
                    g = graph_us(fn) if name in ("torch.softmax", "oss.softmax") else float("nan")
                    print(f"{m:>6}x{n:<9} {str(dtype)[6:]:8} {name:28} {h:8.1f}us {b:8.1f}us {g:6.1f}us"
                          + (f"  max|err| {err:.1e} path {K.last_launch.get('path')}" if name == "oss.softmax" else ""))
    x = torch.randn(1, 128256, device="cuda")
    for _ in range(20):
        oss.softmax(x)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        oss.softmax(x)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
