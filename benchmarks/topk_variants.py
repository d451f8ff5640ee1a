"""Time softmax_topk kernel variants (chunk size, group size, warps) for a few shapes; one JSON + a table.

Run on the GPU machine: ``PYTHONPATH=src python benchmarks/topk_variants.py --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from triton.testing import do_bench

from onlinesoftmax.kernels import topk as kt

SHAPES = [(256, 128256, 50), (1, 128256, 50), (32, 151936, 50), (256, 262144, 8), (1, 262144, 1024),
          (256, 262144, 256), (256, 151936, 1024), (4000, 10000, 5)]


def variants(B, V, k):
    """The default configuration, then one change at a time: chunk ½ and 2×, other warps, other paths."""
    base = kt.select_path(B, V, k)
    cands = [base]
    for blk in (base.block // 2, base.block * 2):
        if kt.MIN_BLOCK <= blk <= kt.MAX_BLOCK:
            cands.append(kt.select_path(B, V, k, path=base.path, block=blk))
    for w in ((8,) if base.num_warps == 16 else (16,) if base.num_warps == 8 else (8,)):
        cands.append(kt.select_path(B, V, k, path=base.path, block=base.block, group=base.group, num_warps=w))
    for p in ("filter", "grouped", "direct")[:2]:
        if p != base.path:
            cands.append(kt.select_path(B, V, k, path=p))
    out, seen = [], set()
    for c in cands:
        key = (c.path, c.block, c.group, c.num_warps)
        if key in seen or c.path == "sort" or kt._pow2(c.splits) * c.cap > kt.STAGE2_MAX_CANDIDATES:
            continue
        if c.block * 1 < c.num_warps * 32 * 4:
            continue
        seen.add(key)
        out.append(c)
    return out[:5]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    rows = []
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for B, V, k in SHAPES:
        n_sets = max(1, min(16, (3 * l2) // (B * V * 4) + 1))
        xs = [torch.randn(B, V, device="cuda") for _ in range(n_sets)]
        ref = torch.softmax(xs[0], -1).topk(k, -1)
        st = {"i": 0}

        def rot(fn, xs=xs):
            def call():
                st["i"] += 1
                return fn(xs[st["i"] % n_sets])
            return call

        t_topk = do_bench(rot(lambda x: torch.topk(x, k, -1)), return_mode="median")
        t_sm = do_bench(rot(lambda x: torch.softmax(x, -1).topk(k, -1)), return_mode="median")
        floor_us = B * V * 4 / 4.0e12 * 1e6
        for cfg in variants(B, V, k):
            t0 = time.time()
            try:
                v, i, lse = kt.softmax_topk_2d(xs[0], k, cfg)
                torch.cuda.synchronize()
                ok = bool(torch.allclose(v, ref.values, rtol=2e-5, atol=1e-7))
                ms = do_bench(rot(lambda x, cfg=cfg: kt.softmax_topk_2d(x, k, cfg)), return_mode="median")
                err = ""
            except Exception as e:  # report, keep going
                ok, ms, err = False, None, f"{type(e).__name__}: {str(e)[:200]}"
            r = dict(B=B, V=V, k=k, path=cfg.path, block=cfg.block, group=cfg.group, warps=cfg.num_warps,
                     merge_warps=cfg.merge_warps, splits=cfg.splits, ok=ok,
                     us=None if ms is None else ms * 1e3,
                     torch_topk_us=t_topk * 1e3, torch_softmax_topk_us=t_sm * 1e3, floor_us_at_4TBps=floor_us,
                     default=cfg == kt.select_path(B, V, k), err=err, compile_s=time.time() - t0)
            rows.append(r)
            with open(f"{args.out}/variants.json", "w") as f:
                json.dump(rows, f, indent=1)
            print(f"B{B:5d} V{V:8d} k{k:5d} {cfg.path:8s} blk{cfg.block:6d} G{cfg.group:3d} "
                  f"w{cfg.num_warps:2d} "
                  f"S{cfg.splits:4d} ok={ok} {'%.1f' % (ms * 1e3) if ms else '-':>8s} us  "
                  f"topk {t_topk * 1e3:.1f} sm→topk {t_sm * 1e3:.1f} floor {floor_us:.1f} "
                  f"{'DEFAULT' if r['default'] else ''} {err}", flush=True)
        del xs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
