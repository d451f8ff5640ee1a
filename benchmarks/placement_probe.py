"""Does the time of one kernel depend on where its tensors lie? Run-to-run spreads of 1-4 points (logsumexp bf16,
the 16-bit shared-memory rows kernel at N = 32K) with unchanged kernels suggest the placement of x and y.

For each shape: x fixed, y placed at several byte offsets inside one pool (do_bench medians, 1 GiB per tensor);
then several fresh allocations of x with y at offset 0; the copy the same way (dst offsets). Every output is
checked against torch once.

    PYTHONPATH=$PWD/src python benchmarks/placement_probe.py [OUT_DIR] [repeat]

`repeat`: three rounds over six offsets for three shapes, x fixed: does an offset stay slow when timed again?
"""

from __future__ import annotations

import json
import sys

import torch
from triton.testing import do_bench

from onlinesoftmax.bench.harness import environment
from onlinesoftmax.kernels import softmax as K
from onlinesoftmax.ops.softmax import row_geometry

GIB = 1 << 30
OFFSETS = (0, 4096, 65536, 1 << 20, (2 << 20) + 32768, 7 << 20, 48 << 20)  # bytes of y past the pool's start
SHAPES = [("softmax", torch.bfloat16, 32768), ("softmax", torch.bfloat16, 16384),
          ("softmax", torch.float32, 131072), ("softmax", torch.bfloat16, 131072),
          ("logsumexp", torch.bfloat16, 1024), ("logsumexp", torch.bfloat16, 32768)]
FRESH_X = 4
REPEAT_SHAPES = [("softmax", torch.bfloat16, 32768), ("logsumexp", torch.bfloat16, 1024),
                 ("softmax", torch.float32, 131072)]
REPEAT_OFFSETS = (0, 7 << 20, (2 << 20) + 32768, 6 << 20, 8 << 20, 3 << 20)


def bench(fn, *args):
    return do_bench(lambda: fn(*args), warmup=25, rep=150, return_mode="median") * 1e3  # µs


def case(name, dtype, n):
    """(mode, rows, bytes of the output) of a SHAPES entry at 1 GiB of x."""
    mode = K.LOGSUMEXP if name == "logsumexp" else K.SOFTMAX
    m = GIB // (n * dtype.itemsize)
    return mode, m, m * dtype.itemsize if mode == K.LOGSUMEXP else GIB


def out_at(pool, off, mode, dtype, m, n, out_bytes):
    """The output as a view of ``pool`` starting ``off`` bytes in."""
    return pool[off:off + out_bytes].view(dtype).view((m,) if mode == K.LOGSUMEXP else (m, n))


def runner(mode, x, y):
    m, n, inner, (gx, gy) = row_geometry([x, y if mode != K.LOGSUMEXP else x], 1)
    return lambda: K.forward(x, y, gx, gy, m, n, inner, mode)


def repeat():
    """Three rounds over REPEAT_OFFSETS for REPEAT_SHAPES (x fixed, y in the pool): µs per call per round."""
    pool = torch.empty(GIB + (64 << 20), dtype=torch.uint8, device="cuda")
    for name, dtype, n in REPEAT_SHAPES:
        mode, m, out_bytes = case(name, dtype, n)
        x = (torch.randn(m, n, device="cuda") * 3).to(dtype)
        res = {}
        for _ in range(3):
            for off in REPEAT_OFFSETS:
                y = out_at(pool, off, mode, dtype, m, n, out_bytes)
                res.setdefault(off, []).append(round(bench(runner(mode, x, y)), 1))
        for off, v in res.items():
            print(name, str(dtype)[6:], n, "y +", off, v, flush=True)


def main(out_dir=None):
    rows = []

    def record(name, dtype, n, how, us, nbytes):
        rows.append(dict(name=name, dtype=str(dtype)[6:], n=n, how=how, us=us, gbps=nbytes / us / 1e3))
        print(f"{name:10} {str(dtype)[6:]:9} N={n:<7} {how:22} {us:8.1f} us {nbytes / us / 1e3:6.0f} GB/s", flush=True)

    pool = torch.empty(GIB + (64 << 20), dtype=torch.uint8, device="cuda")
    src = torch.empty(GIB // 4, device="cuda").uniform_()
    for off in OFFSETS:
        dst = pool[off:off + GIB].view(torch.float32)
        record("copy", torch.float32, 0, f"dst +{off}", bench(dst.copy_, src), 2 * GIB)
    src = None
    for name, dtype, n in SHAPES:
        mode, m, out_bytes = case(name, dtype, n)
        nbytes = GIB + (out_bytes if mode != K.LOGSUMEXP else 0)
        kept = []                                   # earlier x stay allocated: each x gets new memory
        for i in range(FRESH_X):
            x = (torch.randn(m, n, device="cuda") * 3).to(dtype)
            kept.append(x)
            offsets = OFFSETS if i == 0 else (0,)
            for off in offsets:
                y = out_at(pool, off, mode, dtype, m, n, out_bytes)
                run = runner(mode, x, y)
                if off == 0:
                    run()
                    ref = (torch.logsumexp(x.float(), -1) if mode == K.LOGSUMEXP else torch.softmax(x.float(), -1))
                    torch.testing.assert_close(y.float(), ref, atol=2e-3, rtol=2e-2)
                    del ref
                record(name, dtype, n, f"x#{i} y +{off}", bench(run), nbytes)
        del kept, x
        torch.cuda.empty_cache()
    if out_dir:
        with open(f"{out_dir}/placement-probe.json", "w") as f:
            json.dump(dict(environment=environment(), rows=rows), f, indent=1)


if __name__ == "__main__":
    if "repeat" in sys.argv[2:]:
        repeat()
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else None)
