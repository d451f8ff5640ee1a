"""How the tensor size moves the % of copy: a fixed cost (ramp and tail) against a steady rate.

Times the device copy and our kernels at 256 MB, 512 MB, 1 GiB, 2 GiB and 4 GiB per tensor (do_bench medians,
the same bytes for the copy as for the op) and fits t = c + bytes / rate by least squares for each: `rate` is the
steady rate (GB/s, bytes read + written), `c` the fixed cost per call (µs). If our steady rate matches the copy's
and only `c` differs, a shape misses the goal through its ramp and tail, not its steady state.

    PYTHONPATH=$PWD/src python benchmarks/size_probe.py [OUT_DIR] [quick] [rows]
"""

from __future__ import annotations

import json
import sys

import torch
from triton.testing import do_bench
from tune_softmax import bwd_variant

import onlinesoftmax as oss
from onlinesoftmax.bench.harness import environment

SIZES_MB = (256, 512, 1024, 2048, 4096)
FORWARD = [(torch.float32, 32768), (torch.float32, 131072), (torch.float32, 262144),
           (torch.bfloat16, 32768), (torch.bfloat16, 131072), (torch.bfloat16, 262144)]
BACKWARD = [(torch.float32, 262144), (torch.bfloat16, 262144)]
# `rows`: the shared-memory rows kernel (16-bit N = 4K-32K) against the fp32 register kernel, by size
ROWS = [(torch.float32, 16384), (torch.bfloat16, 4096), (torch.bfloat16, 16384), (torch.bfloat16, 32768),
        (torch.float16, 16384)]


def bench(fn):
    return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3  # µs


def time_copy(mb):
    src = torch.empty((mb << 20) // 4, device="cuda").uniform_()
    dst = torch.empty_like(src)
    return bench(lambda: dst.copy_(src))


def time_forward(mb, dtype, n):
    x = (torch.randn((mb << 20) // (n * dtype.itemsize), n, device="cuda") * 3).to(dtype)
    torch.testing.assert_close(oss.softmax(x, -1).float(), torch.softmax(x.float(), -1), atol=2e-3, rtol=2e-2)
    return bench(lambda: oss.softmax(x, -1))


def time_backward(mb, dtype, n):
    y = torch.softmax(torch.randn((mb << 20) // (n * dtype.itemsize), n, device="cuda") * 3, -1).to(dtype)
    dy = torch.randn_like(y)
    run = bwd_variant(None)                     # our default plan, as tune_softmax.py times it
    return bench(lambda: run(y, dy))


def fit(points):
    """Least squares t = c + b / rate over (bytes, µs) points: (rate GB/s, c µs, max relative residual)."""
    n = len(points)
    mb = sum(b for b, _ in points) / n
    mt = sum(t for _, t in points) / n
    slope = sum((b - mb) * (t - mt) for b, t in points) / sum((b - mb) ** 2 for b, _ in points)
    c = mt - slope * mb
    resid = max(abs(c + slope * b - t) / t for b, t in points)
    return 1e-3 / slope, c, resid


def main(out_dir=None, quick=False, rows_set=False):
    sizes = SIZES_MB[:3] if quick else SIZES_MB
    forward, backward = (ROWS, []) if rows_set else (FORWARD, BACKWARD)
    rows = []

    def record(name, dtype, n, tensors, mb, us):
        nbytes = tensors * (mb << 20)
        rows.append(dict(name=name, dtype=str(dtype)[6:], n=n, mb=mb, bytes=nbytes, us=us,
                         gbps=nbytes / us / 1e3))
        print(f"{name:14} {str(dtype)[6:]:9} N={n:<7} {mb:5} MB/tensor {us:9.1f} us {nbytes / us / 1e3:7.0f} GB/s",
              flush=True)

    for mb in sizes:
        record("copy", torch.float32, 0, 2, mb, time_copy(mb))
        for dtype, n in forward:
            record("softmax", dtype, n, 2, mb, time_forward(mb, dtype, n))
        for dtype, n in backward:
            record("backward", dtype, n, 3, mb, time_backward(mb, dtype, n))
        torch.cuda.empty_cache()

    fits = []
    copy = fit([(r["bytes"], r["us"]) for r in rows if r["name"] == "copy"])
    print(f"\ncopy: steady {copy[0]:.0f} GB/s, fixed {copy[1]:.1f} us (max residual {copy[2] * 100:.2f} %)")
    fits.append(dict(name="copy", rate_gbps=copy[0], fixed_us=copy[1], resid=copy[2]))
    for name, shapes in (("softmax", forward), ("backward", backward)):
        for dtype, n in shapes:
            pts = [(r["bytes"], r["us"]) for r in rows
                   if r["name"] == name and r["n"] == n and r["dtype"] == str(dtype)[6:]]
            rate, c, resid = fit(pts)
            at_1g = [r["gbps"] for r in rows if r["name"] == name and r["n"] == n and r["dtype"] == str(dtype)[6:]
                     and r["mb"] == 1024]
            print(f"{name:9} {str(dtype)[6:]:9} N={n:<7} steady {rate:5.0f} GB/s = {rate / copy[0] * 100:5.1f} % "
                  f"of the copy's steady rate; fixed {c:6.1f} us (copy {copy[1]:.1f}); "
                  f"at 1 GiB {at_1g[0] / copy[0] * 100 if at_1g else float('nan'):5.1f} %; "
                  f"max residual {resid * 100:.2f} %")
            fits.append(dict(name=name, dtype=str(dtype)[6:], n=n, rate_gbps=rate, fixed_us=c, resid=resid))
    if out_dir:
        with open(f"{out_dir}/size-probe{'-rows' if rows_set else ''}.json", "w") as f:
            json.dump(dict(environment=environment(), rows=rows, fits=fits), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None, "quick" in sys.argv[2:], "rows" in sys.argv[2:])
