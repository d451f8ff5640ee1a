"""How the L2 flush between timed calls moves the figures: triton's do_bench zeroes a 256 MB buffer before each
call, which leaves the L2 full of dirty lines that the timed kernel then pays to write back. A read-only kernel
(logsumexp: 1 GiB read in ~250 µs) pays that fixed cost against half the time of a copy of the same tensor.

Each case is timed three ways, same loop as do_bench (CUDA events around each call, median of REPS): the flush by
zeroing (do_bench's), a flush by reading the 256 MB buffer (the L2 left clean), and no flush. The copy ceiling
(2 GiB source) and a 1 GiB copy are timed the same three ways, so each op's % of copy is given per flush.

    PYTHONPATH=$PWD/src python benchmarks/flush_probe.py [OUT_DIR]
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

from onlinesoftmax.bench.harness import environment
from onlinesoftmax.kernels import softmax as K
from onlinesoftmax.ops.softmax import row_geometry

GIB = 1 << 30
REPS = 60
FLUSHES = ("zero", "read", "none")


def timed(fn, flush):
    cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    total = torch.empty((), dtype=torch.int64, device="cuda")
    for _ in range(5):
        fn()
    times = []
    for _ in range(REPS):
        if flush == "zero":
            cache.zero_()
        elif flush == "read":
            torch.sum(cache, 0, dtype=torch.int64, out=total)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        times.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in times) * 1e3     # µs


def cases():
    """(name, bytes moved, call)."""
    for nbytes in (2 * GIB, GIB):
        src = torch.empty(nbytes // 4, device="cuda").uniform_()
        dst = torch.empty_like(src)
        yield f"copy {nbytes >> 30} GiB", 2 * nbytes, dst.copy_, (src,)
    src = dst = None
    for mode, dtype, n in ((K.LOGSUMEXP, torch.bfloat16, 1024), (K.LOGSUMEXP, torch.bfloat16, 32768),
                           (K.LOGSUMEXP, torch.float32, 32768), (K.SOFTMAX, torch.float32, 32768),
                           (K.SOFTMAX, torch.bfloat16, 131072)):
        m = GIB // (n * dtype.itemsize)
        x = (torch.randn(m, n, device="cuda") * 3).to(dtype)
        y = torch.empty(m, dtype=dtype, device="cuda") if mode == K.LOGSUMEXP else torch.empty_like(x)
        mm, nn, inner, (gx, gy) = row_geometry([x, x if mode == K.LOGSUMEXP else y], 1)
        name = f"{'logsumexp' if mode == K.LOGSUMEXP else 'softmax'} {str(dtype)[6:]} N={n}"
        yield name, GIB * (1 if mode == K.LOGSUMEXP else 2), K.forward, (x, y, gx, gy, mm, nn, inner, mode)
        x = y = None


def main(out_dir=None):
    rows = []
    for name, nbytes, fn, args in cases():
        row = dict(case=name, bytes=nbytes)
        for flush in FLUSHES:
            us = timed(lambda: fn(*args), flush)
            row[flush] = dict(us=us, gbps=nbytes / us / 1e3)
        rows.append(row)
    ceiling = rows[0]
    print(f"{'case':26} " + " | ".join(f"{f:>5} flush: GB/s  % of 2 GiB copy" for f in FLUSHES))
    for row in rows:
        cells = [f"{row[f]['gbps']:6.0f} {row[f]['gbps'] / ceiling[f]['gbps'] * 100:6.1f} %" for f in FLUSHES]
        print(f"{row['case']:26} " + " | ".join(f"{c:>28}" for c in cells), flush=True)
    if out_dir:
        with open(f"{out_dir}/flush-probe.json", "w") as f:
            json.dump(dict(environment=environment(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
