"""Probe of issue 26's dense goal (>= 1.0x SDPA cuDNN) on the H200 with the balanced schedule at more than one
program per SM, now that the plan caps registers at what its programs per SM allow (`Plan.maxnreg`): before the
cap, 8-warp 128-key tiles took 158-160 registers, so a grid sized for 2 programs per SM ran in two waves.

    PYTHONPATH=src python tools/probe_decode_occ.py --out DIR          # the GPU: checks, timings, JSON, table last
    PYTHONPATH=src python tools/probe_decode_occ.py --smoke --out DIR  # here: tiny, Triton's interpreter

Variants (``Knobs``; the compiled sm_90a resources in the table of docs/tuning.md): ``default`` (128-key tiles, 8
warps, 3 stages, 1 program per SM: 160 registers, 136 KB), ``p2 st2`` (2 per SM, 2 stages: 128 registers, 72 KB),
``p2 n64`` (2 per SM, 64-key tiles, 3 stages: 128 registers, 70 KB), ``p3 n64 w4`` (3 per SM of 4 warps, 64-key
tiles: 168 registers, 70 KB). bf16, D = 128, Sq = 1, full lengths; GB/s counts K and V once; SDPA cuDNN (dense) in
the same run. Each variant is first checked (probe_decode2.check: lengths 0 / 1 / odd / full, NaN in unused slots,
G 1 and G 4 with Sq 4 and a window) against the fp64 reference; a wrong one is not timed.
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

SHAPES = [(8, 32, 32, 32768), (1, 32, 32, 131072), (8, 32, 8, 32768), (64, 32, 8, 4096), (8, 32, 8, 16384)]
VARIANTS = {"default": {}, "p2 st2": dict(programs_per_sm=2, num_stages=2),
            "p2 n64": dict(programs_per_sm=2, block_n=64),
            "p3 n64 w4": dict(programs_per_sm=3, block_n=64, num_warps=4)}
T0 = time.time()
ROWS: list[dict] = []
ERRORS: list[str] = []
BAD: set = set()
log = pd2.log


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="probe_out")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU, kernels in Triton's interpreter")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    shapes = SHAPES
    if a.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        pd2.DEV = "cpu"
        shapes = [(2, 4, 1, 512)]
    gen = torch.Generator().manual_seed(0)
    win = (300 if pd2.DEV == "cuda" else 40, -1)
    pd2.check_variants(VARIANTS, 0, (dict(G=1), dict(G=4, Sq=4, window=win)), gen, BAD, ERRORS)
    ceiling = pd2.copy_ceiling()
    D, dev = pd2.D, pd2.DEV
    for B, H, Hkv, S in shapes:
        shape = f"B{B} H{H}/{Hkv} S{S // 1024}K"
        sl = torch.full((B,), S, dtype=torch.int32, device=dev)
        nbytes = 2 * Hkv * B * S * D * 2
        q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        if dev == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            def cudnn():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=H != Hkv)
            ms = pd2.bench(cudnn)
            ROWS.append(dict(shape=shape, impl="cudnn", ms=ms, gbs=nbytes / ms / 1e6))
        for name, kw in VARIANTS.items():
            if name in BAD:
                continue
            try:
                plan = explain(q, k, v, sl, backend="triton", knobs=Knobs.of(**kw))
                ms = pd2.bench(lambda: pd2.run_plan(plan, q, k, v, sl, None))
                ROWS.append(dict(shape=shape, impl=name, ms=ms, gbs=nbytes / ms / 1e6, splits=plan.splits,
                                 maxnreg=plan.maxnreg))
            except Exception as e:
                ERRORS.append(f"{shape} {name}: {pd2.err_lines(e)}")
                log("  FAIL", ERRORS[-1])
        k = v = None
        if dev == "cuda":
            torch.cuda.empty_cache()
    with open(os.path.join(a.out, "probe_decode_occ.json"), "w") as f:
        json.dump(dict(rows=ROWS, errors=ERRORS, ceiling=ceiling, seconds=time.time() - T0), f, indent=1)
    log(f"copy ceiling {ceiling:.0f} GB/s; {len(ROWS)} rows; {len(ERRORS)} failures; {time.time() - T0:.0f} s")
    for shape in dict.fromkeys(r["shape"] for r in ROWS):
        ref = next((r["gbs"] for r in ROWS if r["shape"] == shape and r["impl"] == "cudnn"), float("nan"))
        log(shape + "  " + "  ".join(f"{r['impl']} {r['gbs']:.0f} ({r['gbs'] / ref:.3f})" for r in ROWS
                                     if r["shape"] == shape))
    for e in ERRORS:
        log("FAIL", e[:300])


if __name__ == "__main__":
    main()
