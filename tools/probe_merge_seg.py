"""The balanced schedule's segment merge (``merge_segments_kernel``) at other row blocks and segments per step, on
the H200: its CUDA time per call (torch.profiler) with the kv kernel beside it, full lengths, bf16, D = 128, Sq = 1.

    PYTHONPATH=src python tools/probe_merge_seg.py --out DIR

Variants: (rows per program, segments per step) by ``launch.MERGE_TILE`` / ``launch.MERGE_SEGMENTS``; every variant
checked against the default's output (bitwise: the same partial states, the same ⊕ order per row up to the
step's sum)."""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe_decode2 as pd2  # noqa: E402
from probe_util import kernel_times  # noqa: E402

from onlinesoftmax.decode import launch  # noqa: E402
from onlinesoftmax.decode.api import explain  # noqa: E402
from onlinesoftmax.decode.plan import Knobs  # noqa: E402

SHAPES = [(64, 32, 8, 4096), (8, 32, 8, 32768), (1, 32, 32, 131072), (8, 32, 8, 4096)]
# (rows, segments per step)
VARIANTS = [(4, 4), (1, 4), (2, 4), (8, 4), (16, 4), (4, 2), (8, 2), (32, 1)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="probe_out")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows_out = []
    for B, H, Hkv, S in SHAPES:
        shape = f"B{B} H{H}/{Hkv} S{S // 1024}K"
        sl = torch.full((B,), S, dtype=torch.int32, device="cuda")
        q = torch.randn(B, H, 1, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, Hkv, S, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        ref = None
        for r, kk in VARIANTS:
            launch.MERGE_TILE, launch.MERGE_SEGMENTS = r * kk * 128, kk
            launch._bound_balanced.cache_clear()
            plan = explain(q, k, v, sl, backend="triton", knobs=Knobs.of(balanced=True, merge_rows=r))
            o, lse = pd2.run_plan(plan, q, k, v, sl, None)
            ok = ref is None or (torch.equal(o, ref[0]) and torch.equal(lse, ref[1]))
            if ref is None:
                ref = (o, lse)
            kt = kernel_times(lambda plan=plan: pd2.run_plan(plan, q, k, v, sl, None), 20, 60)
            merge = sum(t for n, t in kt.items() if "merge" in n)
            rows_out.append(dict(shape=shape, rows=r, segments=kk, merge_us=merge, kernels=kt, same=ok))
            pd2.log(f"{shape:18} rows {r:2} seg {kk}: merge {merge:5.1f} us  same {ok}  "
                    + " ".join(f"{n[:14]}={t:.1f}" for n, t in kt.items()))
        k = v = None
        torch.cuda.empty_cache()
    with open(os.path.join(a.out, "probe_merge_seg.json"), "w") as f:
        json.dump(rows_out, f, indent=1)


if __name__ == "__main__":
    main()
