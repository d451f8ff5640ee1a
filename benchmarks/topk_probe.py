"""Time merge variants of softmax_topk (two-level tree merge, exact path apart, warps) against the default plan,
with stage 1 alone and torch.topk in the same run; every variant checked against the stable-sort torch path.

Run on the GPU machine: ``PYTHONPATH=src python benchmarks/topk_probe.py --out DIR [--jobs 12]``. The variants'
kernels are compiled first in parallel processes (each runs every variant of its shape once), then timed in one
process: ``do_bench`` medians, inputs rotated past L2, the default timed twice (first and last) for the spread.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time

# (B, V, k): variants as select_path overrides; the default plan is always timed first and last.
# Run 14 (commit 036428f) timed the two-level merge and the exact path apart against the one-level merge
# (benchmarks/results/topk/probe-run14.log); RUN14 keeps that set. Run 15: the defaults chosen from it.
T1 = dict(exact_apart=True)
RUN14 = {
    (256, 128256, 50): [T1, dict(tree=16, tree_warps=2), dict(tree=16, tree_warps=1, **T1),
                        dict(tree=8, tree_warps=1, **T1), dict(tree=32, tree_warps=2, **T1),
                        dict(tree=16, tree_warps=2, **T1)],
    (256, 262144, 50): [dict(tree=16, tree_warps=2), dict(tree=16, tree_warps=1, **T1),
                        dict(tree=32, tree_warps=2, **T1), dict(tree=64, tree_warps=4, **T1)],
    (1, 128256, 50): [dict(tree=16, tree_warps=2), dict(tree=8, tree_warps=1, **T1),
                      dict(tree=16, tree_warps=2, **T1)],
    (256, 128256, 8): [dict(tree=32, tree_warps=1, **T1), dict(tree=64, tree_warps=2, **T1)],
    (32, 151936, 256): [T1, dict(tree=4, tree_warps=4, **T1), dict(tree=8, tree_warps=8, **T1)],
    (256, 262144, 256): [T1, dict(tree=4, tree_warps=4, **T1), dict(tree=8, tree_warps=8, **T1)],
    (1, 128256, 1024): [T1, dict(tree=2, tree_warps=4, **T1), dict(tree=2, tree_warps=8, **T1)],
    (1, 262144, 1024): [T1, dict(tree=4, tree_warps=8, **T1), dict(tree=4, tree_warps=16, **T1),
                        dict(tree=2, tree_warps=8, **T1)],
    (32, 151936, 1024): [T1, dict(tree=4, tree_warps=8, **T1), dict(tree=4, tree_warps=16, **T1)],
    (256, 128256, 1024): [T1, dict(tree=2, tree_warps=4, **T1), dict(tree=4, tree_warps=8, **T1)],
    (256, 262144, 1024): [T1, dict(tree=4, tree_warps=8, **T1), dict(tree=4, tree_warps=4, **T1),
                          dict(tree=2, tree_warps=8, **T1)],
}
ONE = dict(tree=0)          # the one-level merge (streams its slots where they pass MERGE_TILE)
# Run 15 (commit e872dd2): the defaults of 17c8ca9 against the one-level merge (probe-run15.log); --run15.
RUN15 = {
    (256, 128256, 1024): [ONE], (1, 262144, 1024): [], (32, 151936, 1024): [], (256, 262144, 1024): [],
    (1, 128256, 1024): [], (256, 262144, 50): [ONE], (1, 262144, 50): [ONE], (256, 128256, 50): [],
    (32, 262144, 50): [],
}
# Run 17 (commit aa556ad, probe-run17b.log): stage 1's 1-bit bisection (radix 0) and the merge's row bound, each
# alone and together, against run 16's plan, and stage-1 register caps; --run17.
NEW = dict(radix=0, row_bound=True)
SORT = dict(path="sort")
RUN17 = {
    (256, 128256, 50): [NEW, dict(radix=0), dict(row_bound=True), dict(NEW, maxnreg=144), dict(NEW, maxnreg=128),
                        dict(NEW, merge_warps=8)],
    (256, 128256, 8): [NEW],
    (256, 128256, 1): [NEW],
    (32, 128256, 50): [NEW],
    (256, 262144, 50): [dict(radix=0), dict(NEW, tree=0)],     # one level: streamed tiles, but no narrowing pass
    (256, 151936, 50): [dict(radix=0), dict(NEW, tree=0)],
    (1, 128256, 50): [NEW],
    (1, 262144, 50): [dict(radix=0), dict(NEW, tree=0)],
    (1, 128256, 1024): [SORT],
    (1, 151936, 1024): [SORT],
    (1, 262144, 1024): [SORT],
}
# Run 18 (commit 127d714, probe-run18.log) timed a persistent stage 1 and programmatic dependent launch of the
# merges: no gain, both removed (git show 127d714).
# Run 19 (commit e70f46e, probe-run19.log): the narrow merge (stage 1 aims at rank kb < k, the merge reads `width`
# slots per chunk), radix 0; --run19.
N8 = dict(radix=0, kb=8, width=32)
RUN19 = {
    (256, 128256, 50): [dict(radix=0), N8, dict(N8, width=16), dict(N8, kb=16), dict(N8, merge_warps=2),
                        dict(N8, merge_warps=1)],
    (32, 128256, 50): [dict(radix=0), N8],
    (1, 128256, 50): [dict(radix=0), N8],
    (256, 128256, 8): [dict(radix=0)],
    (256, 151936, 50): [dict(radix=0)],
}
# Run 20 (commit 2438060, probe-run20.log): the defaults against the same without the narrow merge; --run20.
WIDE = dict(kb=0, width=0)
RUN20 = {(256, 128256, 50): [WIDE], (256, 151936, 50): [WIDE], (256, 262144, 50): [WIDE],
         (32, 262144, 50): [WIDE], (1, 262144, 50): [WIDE]}
# Run 21: stage 1's t_c by peeling 8 warp maxima instead of 16 bisection steps (narrow merge).
PEEL = dict(peel=8)
VARIANTS = {(256, 128256, 50): [PEEL], (256, 151936, 50): [PEEL], (256, 262144, 50): [PEEL],
            (32, 128256, 50): [PEEL], (1, 128256, 50): [PEEL]}
SMOKE = {(2, 5000, 13): [dict(block=512, tree=3, tree_warps=1, **T1),      # --smoke: CPU, the interpreter
                         dict(block=512, radix=0, kb=4, width=16)]}


def configs(B, V, k, variants=None):
    from onlinesoftmax.kernels import topk as kt

    variants = VARIANTS[(B, V, k)] if variants is None else variants
    return [kt.select_path(B, V, k)] + [kt.select_path(B, V, k, **o) for o in variants]




def _run(x, k, cfg):
    """The op under ``cfg``: the kernels, or the sort path (a stable torch sort + logsumexp)."""
    from onlinesoftmax.kernels import topk as kt
    from onlinesoftmax.ops.topk import _torch_2d

    return _torch_2d(x, k) if cfg.path == "sort" else kt.softmax_topk_2d(x, k, cfg)


def _compile(job):
    import torch


    (B, V, k), variants = job      # one job per variant (None: the default plan), so they compile in parallel
    shape = (B, V, k)
    x = torch.randn(B, V, device=DEV)
    t0 = time.time()
    errs = []
    for cfg in configs(B, V, k, [] if variants is None else variants)[0 if variants is None else 1:]:
        try:
            _run(x, k, cfg)
        except Exception as e:  # reported again when timed
            errs.append(f"{cfg}: {type(e).__name__}: {str(e)[:200]}")
    return shape, time.time() - t0, errs


DEV = "cuda"


def _check(x, k, cfg):
    """The variant's answer equals the stable-sort torch path's: indices exactly, values and lse closely."""
    import torch

    from onlinesoftmax import softmax_topk

    ref = softmax_topk(x, k, backend="torch")
    v, i, lse = _run(x, k, cfg)
    finite = ref.lse[ref.lse.isfinite()]                     # (a NaN row's lse would make the bound NaN)
    rtol = 2e-5 * max(1.0, float(finite.abs().max()) if finite.numel() else 1.0)   # exp(x - lse) errs by |lse|·eps
    return bool(torch.equal(i, ref.indices) and torch.allclose(v, ref.values, rtol=rtol, atol=1e-8, equal_nan=True)
                and torch.allclose(lse, ref.lse, rtol=2e-6, atol=2e-6, equal_nan=True))


def _special(x):
    import torch

    V = x.shape[1]
    x = x.clone()
    x[0, : V // 2] = torch.arange(V // 2, device=x.device, dtype=torch.float32)   # the exact path in most chunks
    x[x.shape[0] - 1, ::3] = float("-inf")
    if x.shape[0] >= 4:     # negative denormal maxima (flushed to zero in base 2), a NaN
        x[1] = -1e-40 * (1 + torch.arange(V, device=x.device) % 7)
        x[2, 5] = float("nan")
    return x


def smoke():
    global DEV
    import os

    os.environ["TRITON_INTERPRET"] = "1"
    import torch

    DEV = "cpu"
    for (B, V, k), over in SMOKE.items():
        x = _special(torch.randn(B, V))
        for cfg in configs(B, V, k, over):
            print(cfg, _check(x, k, cfg), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (interpreter), nothing timed")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--run14", action="store_true", help="run 14's variant set")
    ap.add_argument("--run15", action="store_true", help="run 15's variant set")
    ap.add_argument("--run17", action="store_true", help="run 17's variant set")
    ap.add_argument("--run19", action="store_true", help="run 19's variant set")
    ap.add_argument("--run20", action="store_true", help="run 20's variant set")
    ap.add_argument("--only", action="append", default=[], metavar="B,V,k", help="time only these shapes")
    args = ap.parse_args()
    runs = {"run14": RUN14, "run15": RUN15, "run17": RUN17, "run19": RUN19, "run20": RUN20}
    for name, run in runs.items():
        if getattr(args, name):
            VARIANTS.clear()
            VARIANTS.update(run)
    if args.only:
        keep = {tuple(int(v) for v in o.split(",")) for o in args.only}
        for shape in [sh for sh in VARIANTS if sh not in keep]:
            del VARIANTS[shape]
    if args.smoke:
        return smoke()
    t0 = time.time()
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        jobs = [(sh, None) for sh in VARIANTS] + [(sh, [v]) for sh, vs in VARIANTS.items() for v in vs]
        for shape, dt, errs in pool.imap_unordered(_compile, jobs):
            print(f"compiled {shape}: {dt:.1f} s {errs}", flush=True)
    print(f"compile: {time.time() - t0:.1f} s", flush=True)
    if args.compile_only:
        return

    import torch
    from triton.testing import do_bench

    from onlinesoftmax.kernels import topk as kt

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows, lines = [], []
    for (B, V, k) in VARIANTS:
        n_sets = max(1, min(16, (3 * l2) // (B * V * 4) + 1))
        xs = [torch.randn(B, V, device="cuda") for _ in range(n_sets)]
        st = {"i": 0}

        def rot(fn, xs=xs, n_sets=n_sets):
            def call():
                st["i"] += 1
                return fn(xs[st["i"] % n_sets])
            return call

        def bench(fn):
            return do_bench(rot(fn), return_mode="median") * 1e3

        t_topk = bench(lambda x: torch.topk(x, k, -1))
        t_sm = bench(lambda x: torch.softmax(x, -1).topk(k, -1))
        cfg0 = kt.plan(B, V, k, torch.float32)
        s1 = {}

        def t_stage1(cfg, xs=xs):     # stage 1 alone, once per distinct stage-1 configuration
            key = (cfg.radix, cfg.maxnreg, cfg.kb, cfg.peel)
            if cfg.path == "filter" and key not in s1:
                ws = kt.workspaces(B, cfg, xs[0].device)[0]
                s1[key] = bench(lambda x: kt.stage1(x, ws, k, cfg, True))
            return s1.get(key, float("nan"))

        def t_merge(cfg, xs=xs):      # the launches after stage 1 alone, on the workspace a stage 1 call left
            if cfg.path != "filter":
                return float("nan")
            ws, ws2 = kt.workspaces(B, cfg, xs[0].device)
            out = (torch.empty(B, k, device="cuda"), torch.empty(B, k, device="cuda", dtype=torch.int64),
                   torch.empty(B, device="cuda"))
            kt.stage1(xs[0], ws, k, cfg, True)
            return do_bench(lambda: kt.merge(xs[0], ws, ws2, out, k, cfg, True), return_mode="median") * 1e3

        def t_graph(cfg, xs=xs):      # one call replayed from a CUDA graph: GPU time, no host in the way
            _run(xs[0], k, cfg)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                _run(xs[0], k, cfg)
            return do_bench(g.replay, return_mode="median") * 1e3

        t_s1 = t_stage1(cfg0)
        x = _special(xs[0])
        cfgs = configs(B, V, k) + [cfg0]
        for n, cfg in enumerate(cfgs):
            try:
                ok = _check(x, k, cfg) and _check(xs[1 % n_sets], k, cfg)
                us = bench(lambda x, cfg=cfg: _run(x, k, cfg))
                t_s1 = t_stage1(cfg)
                t_m = t_merge(cfg)
                t_g = t_graph(cfg)
                err = ""
            except Exception as e:  # report, keep going
                ok, us, t_m, t_g, err = False, None, float("nan"), float("nan"), f"{type(e).__name__}: {str(e)[:300]}"
            tag = "default" if n in (0, len(cfgs) - 1) else str(VARIANTS[(B, V, k)][n - 1])
            r = dict(B=B, V=V, k=k, variant=tag, cfg=repr(cfg), ok=ok, us=us, graph_us=t_g, stage1_us=t_s1,
                     merge_us=t_m,
                     torch_topk_us=t_topk,
                     torch_softmax_topk_us=t_sm,
                     floor_us=B * V * 4 / 4.25e12 * 1e6, err=err)
            rows.append(r)
            line = (f"B{B:4d} V{V:7d} k{k:5d} | {tag:58s} | ok={ok!s:5s} {us if us is None else round(us, 1)!s:>8s} us"
                    f" graph {t_g:6.1f} | stage1 {t_s1:6.1f} merge {t_m:6.1f} topk {t_topk:7.1f}"
                    f" sm→topk {t_sm:7.1f} {err}")
            lines.append(line)
            print(line, flush=True)
            with open(f"{args.out}/probe.json", "w") as f:
                json.dump(rows, f, indent=1)
        del xs
        torch.cuda.empty_cache()
    print("\n".join(["== summary"] + lines), flush=True)


if __name__ == "__main__":
    main()
