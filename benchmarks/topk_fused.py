"""Time softmax_topk's one-launch ("fused") and two-launch ("filter") paths side by side, with peers; one JSON.

Run on the GPU machine: ``PYTHONPATH=src python benchmarks/topk_fused.py --out DIR [--quick]``.
fp32 logits, ``do_bench`` medians, inputs rotated past L2; every variant checked against ``torch.softmax → topk``
(values) and the stable-sort torch path (indices) before it is timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch
from triton.testing import do_bench

from onlinesoftmax import softmax_topk
from onlinesoftmax.kernels import topk as kt

SHAPES = [(256, 128256, 50), (256, 128256, 8), (1, 128256, 50), (256, 262144, 50), (32, 151936, 256),
          (256, 151936, 1024), (1, 262144, 1024)]


BENCH = dict(return_mode="median", warmup=10, rep=40)     # 40 ms: hundreds of calls at these sizes


def variants(B, V, k):
    """The two-launch path, then the fused kernel: merge tiles of 16 / 8 slots per thread, with and without
    the register cap."""
    out = [("filter", kt.select_path(B, V, k, path="filter"))]
    base = kt.select_path(B, V, k, path="fused")
    w = base.num_warps
    for per, cap in ((16, base.maxnreg), (8, base.maxnreg), (16, 0)):
        c = dataclasses.replace(base, tile=per * 32 * w, maxnreg=cap)
        if (f"fused t{per} r{cap}", c) not in out:
            out.append((f"fused t{per} r{cap}", c))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rows = []
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for B, V, k in (SHAPES[:3] if args.quick else SHAPES):
        n_sets = max(1, min(16, (3 * l2) // (B * V * 4) + 1))
        xs = [torch.randn(B, V, device="cuda") for _ in range(n_sets)]
        st = {"i": 0}

        def rot(fn, xs=xs):
            def call():
                st["i"] += 1
                return fn(xs[st["i"] % n_sets])
            return call

        ref = torch.softmax(xs[0], -1).topk(k, -1)
        ref_i = softmax_topk(xs[0], k, backend="torch").indices
        t_topk = do_bench(rot(lambda x: torch.topk(x, k, -1)), **BENCH) * 1e3
        t_sm = do_bench(rot(lambda x: torch.softmax(x, -1).topk(k, -1)), **BENCH) * 1e3
        floor_us = B * V * 4 / 4.25e12 * 1e6          # read x once at the measured copy ceiling (run 10)
        default = kt.plan(B, V, k, torch.float32)
        print(f"B{B:4d} V{V:7d} k{k:5d} | torch.topk {t_topk:7.1f} softmax→topk {t_sm:7.1f} floor {floor_us:6.1f} "
              f"| default {default.path}", flush=True)
        for name, cfg in variants(B, V, k):
            t0 = time.time()
            try:
                v, i, lse = kt.softmax_topk_2d(xs[0], k, cfg)
                v2, i2, _ = kt.softmax_topk_2d(xs[0], k, cfg)        # again: the arrival counters were reset
                torch.cuda.synchronize()
                ok = (bool(torch.allclose(v, ref.values, rtol=2e-5, atol=1e-7)) and bool(torch.equal(i, ref_i))
                      and bool(torch.equal(i2, i)))
                us = do_bench(rot(lambda x, cfg=cfg: kt.softmax_topk_2d(x, k, cfg)), **BENCH) * 1e3
                us2 = do_bench(rot(lambda x, cfg=cfg: kt.softmax_topk_2d(x, k, cfg)), **BENCH) * 1e3
                err = ""
            except Exception as e:  # report, keep going
                ok, us, us2, err = False, None, None, f"{type(e).__name__}: {str(e)[:300]}"
            r = dict(B=B, V=V, k=k, variant=name, block=cfg.block, cols=cfg.cols, warps=cfg.num_warps,
                     splits=cfg.splits, cap=cfg.cap, tile=cfg.tile, maxnreg=cfg.maxnreg, ok=ok, us=us, us_again=us2,
                     torch_topk_us=t_topk, torch_softmax_topk_us=t_sm, floor_us=floor_us,
                     default=(cfg == default), err=err, compile_s=time.time() - t0)
            rows.append(r)
            with open(f"{args.out}/fused.json", "w") as f:
                json.dump(rows, f, indent=1)
            print(f"   {name:16s} ok={ok} {f'{us:.1f}' if us else '-':>8s} / {f'{us2:.1f}' if us2 else '-':>8s} us"
                  f"{f'  x{t_sm / us:5.2f} vs softmax→topk, x{t_topk / us:5.2f} vs topk' if us else ''} "
                  f"{'DEFAULT' if r['default'] else ''} {err}", flush=True)
        del xs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
