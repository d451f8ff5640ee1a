"""Time softmax_topk kernel variants (chunk size, warps) and host cost for a few shapes; one JSON + a table.

Run on the GPU machine: ``PYTHONPATH=src python benchmarks/topk_variants.py --out DIR [--quick]``.
Peers in the same run: ``torch.topk`` and ``torch.softmax → topk``, inputs rotated past L2, medians.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from triton.testing import do_bench

from onlinesoftmax import softmax_topk
from onlinesoftmax.kernels import topk as kt

SHAPES = [(256, 128256, 50), (1, 128256, 50), (32, 151936, 256), (256, 262144, 50), (256, 262144, 8),
          (256, 151936, 1024), (1, 262144, 1024), (4000, 10000, 5)]


def variants(B, V, k):
    """The default configuration, then the chunk halved and doubled (warps scaled to keep 64 per thread)."""
    base = kt.select_path(B, V, k)
    out = [base]
    for f in (0.5, 2, 4):
        blk = int(base.block * f)
        w = max(1, base.num_warps * blk // base.block)
        c = kt.select_path(B, V, k, block=blk, num_warps=w)
        if c.path == "filter" and c.block >= c.cols and c not in out:
            out.append(c)
    return out


def host_us(fn, n=20):
    """Host time per call: the GPU is kept busy (a sleep kernel) so the loop measures only the CPU side (few
    calls, so the launch queue never fills and blocks the host)."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9 * 0.01))             # ~10 ms of GPU work queued ahead
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rows = []
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    shapes = SHAPES[:4] if args.quick else SHAPES
    for B, V, k in shapes:
        n_sets = max(1, min(16, (3 * l2) // (B * V * 4) + 1))
        xs = [torch.randn(B, V, device="cuda") for _ in range(n_sets)]
        st = {"i": 0}

        def rot(fn, xs=xs):
            def call():
                st["i"] += 1
                return fn(xs[st["i"] % n_sets])
            return call

        ref = torch.softmax(xs[0], -1).topk(k, -1)
        t_topk = do_bench(rot(lambda x: torch.topk(x, k, -1)), return_mode="median") * 1e3
        t_sm = do_bench(rot(lambda x: torch.softmax(x, -1).topk(k, -1)), return_mode="median") * 1e3
        t_op = do_bench(rot(lambda x: softmax_topk(x, k)), return_mode="median") * 1e3
        h_op = host_us(lambda x0=xs[0]: softmax_topk(x0, k))
        h_topk = host_us(lambda x0=xs[0]: torch.topk(x0, k, -1))
        floor_us = B * V * 4 / 4.25e12 * 1e6
        # stage 1 alone (the default configuration): the rest of the op's time is the merge and launches
        cfg0 = kt.plan(B, V, k, torch.float32)
        ws = kt._workspace(xs[0].device, kt.workspace_words(B, cfg0))[0]
        t_s1 = do_bench(rot(lambda x: kt.stage1(x, ws, k, cfg0, True)), return_mode="median") * 1e3
        print(f"B{B:5d} V{V:7d} k{k:5d} op {t_op:8.1f} us (host {h_op:5.1f}) | torch.topk {t_topk:7.1f} "
              f"(host {h_topk:4.1f}) softmax→topk {t_sm:7.1f} floor {floor_us:6.1f} | "
              f"x{t_sm / t_op:5.2f} vs softmax→topk, x{t_topk / t_op:5.2f} vs topk | stage 1 alone {t_s1:6.1f}",
              flush=True)
        for cfg in variants(B, V, k):
            t0 = time.time()
            try:
                v, i, lse = kt.softmax_topk_2d(xs[0], k, cfg)
                torch.cuda.synchronize()
                ok = bool(torch.allclose(v, ref.values, rtol=2e-5, atol=1e-7))
                us = do_bench(rot(lambda x, cfg=cfg: kt.softmax_topk_2d(x, k, cfg)), return_mode="median") * 1e3
                err = ""
            except Exception as e:  # report, keep going
                ok, us, err = False, None, f"{type(e).__name__}: {str(e)[:300]}"
            r = dict(B=B, V=V, k=k, block=cfg.block, cols=cfg.cols, warps=cfg.num_warps, merge_warps=cfg.merge_warps,
                     splits=cfg.splits, cap=cfg.cap, ok=ok, us=us, op_us=t_op, op_host_us=h_op, torch_topk_us=t_topk,
                     torch_topk_host_us=h_topk, torch_softmax_topk_us=t_sm, floor_us=floor_us, stage1_us=t_s1,
                     default=cfg == kt.select_path(B, V, k), err=err, compile_s=time.time() - t0)
            rows.append(r)
            with open(f"{args.out}/variants.json", "w") as f:
                json.dump(rows, f, indent=1)
            print(f"   blk{cfg.block:6d} R{cfg.cols:5d} w{cfg.num_warps:2d} mw{cfg.merge_warps:2d} S{cfg.splits:4d} "
                  f"ok={ok} {f'{us:.1f}' if us else '-':>8s} us {'DEFAULT' if r['default'] else ''} {err}",
                  flush=True)
        del xs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
