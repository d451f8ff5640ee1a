"""Probe of issue 26's speculative-decoding goal on paged caches (Sq = 4 >= 0.9x the GB/s of Sq = 1): `bench decode`
at 565ffee measured Sq = 4 on page-16 caches at 0.65-0.70x our dense Sq = 1 at B >= 8 (0.97x at B = 1), where
Sq = 1 on the same pages runs 0.92-0.97x. Which part of the paged balanced plan (64-key tiles, 4 warps, 3 stages,
page numbers a tile ahead) Sq = 4 slows: the causal mask (timed without it), the tiles, the schedule.

    PYTHONPATH=src python tools/probe_sq4.py --out DIR          # the GPU: checks, timings, JSON, table last
    PYTHONPATH=src python tools/probe_sq4.py --smoke --out DIR  # here: tiny, Triton's interpreter

bf16, D = 128, pages shuffled, full lengths; GB/s counts K and V once. Each Sq = 4 variant is first checked
(probe_decode2.check: GQA 4 with Sq 4 and a window, lengths 0 / 1 / odd / full, NaN in unused slots and pages)
against the fp64 reference; a wrong one is not timed (``no mask`` is timed only: it drops the causal mask).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe_decode2 as pd2  # noqa: E402

from onlinesoftmax.decode.api import explain  # noqa: E402
from onlinesoftmax.decode.plan import Knobs  # noqa: E402

SHAPES = [(8, 32, 8, 32768), (64, 32, 8, 4096), (8, 32, 32, 32768), (1, 32, 32, 131072)]
VARIANTS = {"default": {}, "per-seq": dict(balanced=False), "w8": dict(num_warps=8), "s4": dict(num_stages=4),
            "s2": dict(num_stages=2), "ahead3": dict(ahead=3), "ahead1": dict(ahead=1),
            "dense_tiles": dict(dense_tiles=True), "bm32": dict(block_m=32)}
T0 = time.time()
ROWS: list[dict] = []
ERRORS: list[str] = []
BAD: set = set()
log = pd2.log


def run(plan, q, k, v, sl, bt, causal=True):
    from onlinesoftmax.decode.launch import attention_split_kv

    return attention_split_kv(q, k, v, sl, bt, causal, pd2.D ** -0.5, -1, -1, 0.0, plan)


def timed(shape, sq, page, name, kw, q, k, v, sl, bt, nbytes, causal=True):
    if name in BAD and sq == 4:
        return
    try:
        plan = explain(q, k, v, sl, block_table=bt, backend="triton", knobs=Knobs.of(**kw))
        ms = pd2.bench(lambda: run(plan, q, k, v, sl, bt, causal))
        row = dict(shape=shape, sq=sq, page=page, impl=name, ms=ms, gbs=nbytes / ms / 1e6, splits=plan.splits,
                   block_n=plan.block_n, block_m=plan.block_m, warps=plan.num_warps, stages=plan.num_stages,
                   ahead=plan.ahead, balanced=plan.balanced)
        ROWS.append(row)
        log(f"  {shape:18} Sq{sq} p{page:<3} {name:12} s{plan.splits:<4} {ms * 1e3:8.1f} us {row['gbs']:6.0f} GB/s")
    except Exception as e:
        ERRORS.append(f"{shape} Sq{sq} p{page} {name}: {pd2.err_lines(e)}")
        log("  FAIL", ERRORS[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="probe_out")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU, kernels in Triton's interpreter")
    ap.add_argument("--variants", default="", help="comma-separated names of VARIANTS to run (default: all)")
    a = ap.parse_args()
    if a.variants:
        for name in set(VARIANTS) - set(a.variants.split(",")):
            del VARIANTS[name]
    os.makedirs(a.out, exist_ok=True)
    shapes = SHAPES
    if a.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        pd2.DEV = "cpu"
        shapes = [(2, 4, 1, 512)]
    gen = torch.Generator().manual_seed(0)
    win = (300 if pd2.DEV == "cuda" else 40, -1)
    pd2.check_variants(VARIANTS, 16, (dict(G=4, Sq=4, window=win),), gen, BAD, ERRORS)
    ceiling = pd2.copy_ceiling()
    D, dev = pd2.D, pd2.DEV
    for B, H, Hkv, S in shapes:
        shape = f"B{B} H{H}/{Hkv} S{S // 1024}K"
        sl = torch.full((B,), S, dtype=torch.int32, device=dev)
        nbytes = 2 * Hkv * B * S * D * 2
        q1 = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
        q4 = torch.randn(B, H, 4, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        timed(shape, 1, 0, "default", {}, q1, k, v, sl, None, nbytes)
        timed(shape, 4, 0, "default", {}, q4, k, v, sl, None, nbytes)
        timed(shape, 4, 0, "no mask", {}, q4, k, v, sl, None, nbytes, causal=False)
        k = v = None
        kp, vp, bt = pd2.paged_cache(B, Hkv, S, 16, gen, nan_spare=False)
        timed(shape, 1, 16, "default", {}, q1, kp, vp, sl, bt, nbytes)
        timed(shape, 1, 16, "no mask", {}, q1, kp, vp, sl, bt, nbytes, causal=False)
        timed(shape, 4, 16, "no mask", {}, q4, kp, vp, sl, bt, nbytes, causal=False)
        for name, kw in VARIANTS.items():
            timed(shape, 4, 16, name, kw, q4, kp, vp, sl, bt, nbytes)
        kp = vp = bt = None
        kp, vp, bt = pd2.paged_cache(B, Hkv, S, 256, gen, nan_spare=False)
        timed(shape, 1, 256, "default", {}, q1, kp, vp, sl, bt, nbytes)
        timed(shape, 4, 256, "default", {}, q4, kp, vp, sl, bt, nbytes)
        kp = vp = bt = None
        if dev == "cuda":
            torch.cuda.empty_cache()
    with open(os.path.join(a.out, "probe_sq4.json"), "w") as f:
        json.dump(dict(rows=ROWS, errors=ERRORS, ceiling=ceiling, seconds=time.time() - T0), f, indent=1)
    log(f"copy ceiling {ceiling:.0f} GB/s; {len(ROWS)} rows; {len(ERRORS)} failures; {time.time() - T0:.0f} s")
    for shape in dict.fromkeys(r["shape"] for r in ROWS):
        base = next((r["gbs"] for r in ROWS if r["shape"] == shape and r["sq"] == 1 and r["page"] == 0), float("nan"))
        for r in ROWS:
            if r["shape"] == shape:
                log(f"{shape:18} Sq{r['sq']} p{r['page']:<3} {r['impl']:12} {r['gbs']:6.0f} GB/s "
                    f"{r['gbs'] / base:5.3f}x dense Sq1  (s{r['splits']} n{r['block_n']} m{r['block_m']} "
                    f"w{r['warps']} st{r['stages']} a{r['ahead']} bal{int(r['balanced'])})")
    for e in ERRORS:
        log("FAIL", e[:300])


if __name__ == "__main__":
    main()
