"""A/B of two versions of the softmax kernel module in one process, same inputs: the tree's
``onlinesoftmax.kernels.softmax`` (new) against an older copy of it (old).

    git show REV:src/onlinesoftmax/kernels/softmax.py > src/onlinesoftmax/kernels/softmax_old.py   # not committed
    PYTHONPATH=src python benchmarks/ab_kernels.py $OUT [softmax_old[,softmax_other...] [forward|backward|coop|all]]

forward: softmax, log-softmax and logsumexp at the 12 goal shapes (1 GiB per tensor) and decode sizes (softmax;
do_bench and CUDA-graph replay); backward: softmax backward at the long-row shapes; coop: what the row barrier
touches (forward at N = 32K-256K, the nine decode shapes, backward). Each row prints new, the old module(s),
then new again (the drift between the two new timings is the run's noise). Outputs are checked against torch
first. Writes ab_kernels.json to the folder given.
"""

from __future__ import annotations

import importlib
import json
import sys

import torch
from triton.testing import do_bench
from tune_softmax import GIB, inputs, timed

from onlinesoftmax.bench.harness import copy_ceiling_gbps, environment
from onlinesoftmax.kernels import _launch
from onlinesoftmax.kernels import softmax as K_new
from onlinesoftmax.ops.softmax import row_geometry


def fwd(K, mode):
    def run(x):
        out = torch.empty_like(x)
        m, n, inner, (gx, gy) = row_geometry([x, out], 1)
        K.forward(x, out, gx, gy, m, n, inner, mode)
        return out
    return run


def lse(K):
    def run(x):
        out = torch.empty(x.shape[0], device=x.device, dtype=x.dtype)
        m, n, inner, (gx, gy) = row_geometry([x, x], 1)
        K.forward(x, out, gx, gy, m, n, inner, K.LOGSUMEXP)
        return out
    return run


def bwd(K, log):
    def run(y, dy):
        dx = torch.empty_like(y)
        m, n, inner, (g1, g2, g3) = row_geometry([y, dy, dx], 1)
        K.backward(y, dy, dx, g1, g2, g3, m, n, inner, log)
        return dx
    return run


def graph_us(fn, x):
    fn(x)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(x)
    return do_bench(g.replay, warmup=25, rep=100, return_mode="median") * 1e3


def main(out_dir, old_names, which):
    olds = []
    for name in old_names.split(","):
        K_old = importlib.import_module(f"onlinesoftmax.kernels.{name}")
        # its own workspace: the versions may lay their scratch out differently
        K_old.stream_scratch = lambda tag, device, layout, zeroed=None, name=name: _launch.stream_scratch(
            (name, tag), device, layout, zeroed)
        olds.append((name, K_old))
    env = environment()
    ceiling = copy_ceiling_gbps(torch.device("cuda"))
    print(f"{env['device']}  torch {env['torch']}  triton {env['triton']}  copy ceiling {ceiling:.0f} GB/s")
    rows = []

    def line(kind, m, n, dtype, impls, sets, nbytes, ref, graph=False):
        cells = []
        for name, fn in impls:
            err = (fn(*sets[0]).float() - ref.float()).abs().max().item()
            us = timed(fn, sets) * 1e3
            r = dict(kind=kind, m=m, n=n, dtype=str(dtype), impl=name, us=us, pct=100 * nbytes / (us * 1e3) / ceiling,
                     max_err=err)
            if graph:
                r["graph_us"] = graph_us(fn, sets[0][0])
            rows.append(r)
            cells.append(f"{name} {us:8.1f} us {r['pct']:5.1f}%" + (f" graph {r['graph_us']:6.1f}" if graph else "")
                         + f" err {err:.0e}")
        print(f"{kind:4} {m:>6}x{n:<7} {str(dtype)[6:]:9} | " + " | ".join(cells), flush=True)

    lengths = (32768, 131072, 262144) if which == "coop" else (1024, 4096, 16384, 32768, 131072, 262144)
    decode = tuple((m, n) for m in (1, 8, 32) for n in (128256, 151936, 262144)) if which == "coop" else (
        (1, 262144), (8, 151936), (32, 128256))
    if which in ("forward", "all", "coop"):   # softmax, log-softmax, logsumexp at the goal shapes
        for dtype in (torch.float32, torch.bfloat16):
            for n in lengths:
                size = torch.finfo(dtype).bits // 8
                m = GIB // (n * size)
                sets = inputs(m, n, dtype)
                for kind, mode, tfn in (("fwd", K_new.SOFTMAX, torch.softmax),
                                        ("log", K_new.LOG_SOFTMAX, torch.log_softmax)):
                    line(kind, m, n, dtype, (("torch", lambda x, f=tfn: f(x, -1)), ("new", fwd(K_new, mode)),
                                             *((o, fwd(K, mode)) for o, K in olds), ("new", fwd(K_new, mode))),
                         sets, 2 * m * n * size, tfn(sets[0][0], -1))
                line("lse", m, n, dtype, (("torch", lambda x: torch.logsumexp(x, -1)),
                                          ("new", lse(K_new)), *((o, lse(K)) for o, K in olds), ("new", lse(K_new))),
                     sets, m * n * size, torch.logsumexp(sets[0][0].float(), -1))
                del sets
    if which in ("forward", "all", "coop"):   # decode sizes
        for dtype in (torch.float32, torch.bfloat16):
            for m, n in decode:
                size = torch.finfo(dtype).bits // 8
                sets = inputs(m, n, dtype)
                line("dec", m, n, dtype, (("torch", lambda x: torch.softmax(x, -1)), ("new", fwd(K_new, 0)),
                                          *((o, fwd(K, 0)) for o, K in olds), ("new", fwd(K_new, 0))),
                     sets, 2 * m * n * size, torch.softmax(sets[0][0], -1), graph=True)
    if which in ("backward", "all", "coop"):  # backward, long rows (coop)
        for dtype, n in ((torch.float32, 131072), (torch.float32, 262144), (torch.bfloat16, 32768),
                         (torch.bfloat16, 131072), (torch.bfloat16, 262144)):
            size = torch.finfo(dtype).bits // 8
            m = GIB // (n * size)
            bsets = inputs(m, n, dtype, bwd=True)
            ref = torch._softmax_backward_data(bsets[0][1], bsets[0][0], -1, dtype)
            line("bwd", m, n, dtype, (("torch", lambda y, dy: torch._softmax_backward_data(dy, y, -1, y.dtype)),
                                      ("new", bwd(K_new, False)), *((o, bwd(K, False)) for o, K in olds),
                                      ("new", bwd(K_new, False))), bsets, 3 * m * n * size, ref)
            del bsets
    with open(f"{out_dir}/ab_kernels.json", "w") as f:
        json.dump({"env": env, "copy_ceiling_gbps": ceiling, "old_modules": old_names, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".", sys.argv[2] if len(sys.argv) > 2 else "softmax_old",
         sys.argv[3] if len(sys.argv) > 3 else "all")
