"""Where the host time of an eager decode-sized call goes, layer by layer, against torch.

1. Layers at 1 x 128256 fp32: host µs per call of each layer of ours and of torch (2000 back-to-back calls of
   functions whose GPU work is shorter than their host work, or none).
2. Every decode shape: ``eager`` = wall time per call of 300 back-to-back calls then a sync (what a Python loop
   of eager calls gets: the larger of host and GPU time), do_bench's median (GPU time between events; the host
   runs ahead while do_bench clears L2) and the GPU time alone, replayed from a CUDA graph.
3. The decode path's GPU time per chunk size.
4. A cProfile of 1000 calls.

    PYTHONPATH=src python benchmarks/profile_launch.py [layers|shapes|sweep|profile]...
"""

import cProfile
import pstats
import time

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

import onlinesoftmax as oss
from onlinesoftmax.kernels import _launch
from onlinesoftmax.kernels import softmax as K
from onlinesoftmax.ops.softmax import _rows_or_copy


@triton.jit
def _noop(X, N, B: tl.constexpr):
    pass


def per_call_us(fn, calls):
    for _ in range(30):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def graph_us(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, warmup=25, rep=100, return_mode="median") * 1e3


def layers():
    x = torch.randn(1, 128256, device="cuda")
    y = torch.empty_like(x)
    (xv, yv), (M, N, inner, (gx, gy)) = _rows_or_copy([x, y], 1)
    dev = x.device
    small = torch.randn(4, device="cuda")
    items = {
        "torch.empty_like": lambda: torch.empty_like(x),
        "torch.neg (4 elements)": lambda: torch.neg(small),
        "triton noop kernel[grid]": lambda: _noop[(1,)](x, 5, B=4),
        "triton noop via _launch.launch": lambda: _launch.launch(_noop, (1,), (x, 5), dev, B=4),
        "K.forward (row view given)": lambda: K.forward(xv, yv, gx, gy, M, N, inner, K.SOFTMAX),
        "oss.softmax": lambda: oss.softmax(x),
    }
    print("layer (1 x 128256 fp32)              host us/call")
    for name, fn in items.items():
        print(f"{name:36} {per_call_us(fn, 2000):8.2f}")


def shapes():
    print(f"\n{'shape':>16} {'dtype':8} {'impl':16} {'eager':>9} {'do_bench':>9} {'graph':>8}  speed-up eager/graph")
    for dtype in (torch.float32, torch.bfloat16):
        for m in (1, 8, 32):
            for n in (128256, 151936, 262144):
                x = torch.randn(m, n, device="cuda", dtype=dtype)
                err = (oss.softmax(x).double() - torch.softmax(x.double(), -1)).abs().max().item()
                res = {}
                impls = (("torch.softmax", lambda: torch.softmax(x, -1)), ("oss.softmax", lambda: oss.softmax(x)))
                for name, fn in impls:
                    res[name] = (per_call_us(fn, 300), do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3,
                                 graph_us(fn))
                for name, (e, b, g) in res.items():
                    extra = ""
                    if name == "oss.softmax":
                        t = res["torch.softmax"]
                        extra = (f"  {t[0] / e:4.1f}x / {t[2] / g:4.1f}x  max|err| {err:.1e} "
                                 f"path {K.last_launch().get('path')}")
                    print(f"{m:>6}x{n:<9} {str(dtype)[6:]:8} {name:16} {e:7.1f}us {b:7.1f}us {g:6.1f}us{extra}")


def sweep():
    """GPU time (graph replay) of the decode path per chunk size (behind DECODE_MIN_CHUNK, DECODE_PROGRAMS_PER_SM)."""
    print("\nchunk sweep, graph replay us")
    for dtype in (torch.float32, torch.bfloat16):
        for m in (1, 8, 32):
            for n in (128256, 262144):
                x = torch.randn(m, n, device="cuda", dtype=dtype)
                y = torch.empty_like(x)
                (xv, yv), (M, N, inner, (gx, gy)) = _rows_or_copy([x, y], 1)
                row = []
                for path, chunk in (("coop", 2048), ("coop", 4096), ("coop", 8192), ("coop", 16384),
                                    ("split", 4096), ("split", 8192), ("split", 16384)):
                    cfg = dict(path=path, chunk=chunk)
                    t = graph_us(lambda: K.forward(xv, yv, gx, gy, M, N, inner, 0, cfg))
                    row.append(f"{path} {chunk}: {t:5.1f}")
                print(f"{m:>6}x{n:<9} {str(dtype)[6:]:8} " + "  ".join(row))


def profile():
    x = torch.randn(1, 128256, device="cuda")
    for _ in range(20):
        oss.softmax(x)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(1000):
        oss.softmax(x)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    import sys

    steps = sys.argv[1:] or ["layers", "shapes", "sweep", "profile"]
    for step in steps:
        {"layers": layers, "shapes": shapes, "sweep": sweep, "profile": profile}[step]()
