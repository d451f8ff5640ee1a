"""Probe of issue 26's dense decode at many (sequence, kv head) units on the H200: the balanced schedule (the
default up to 256 sequences) against the per-sequence splits, which at 64 x 8 units and more need no split and no
merge launch (a6f537c's profile at (64, 32/8, 4K): per-sequence kernel 245.0 us, balanced 252.8 + a 5.9 us merge,
cuDNN 242.9).

    PYTHONPATH=src python tools/probe_decode_units.py --out DIR          # the GPU: checks, timings, JSON, table last
    PYTHONPATH=src python tools/probe_decode_units.py --smoke --out DIR  # here: tiny, Triton's interpreter

bf16, D = 128, Sq = 1, dense caches. Shapes (B, H, Hkv, S) with B · Hkv from 128 to 2048; lengths ``full``,
``uni`` (uniform in [1, S]), ``skew`` (B/8 sequences of S, the rest uniform in [1, S/16]) and ``uni=`` / ``skew=``
(uniform batches of the same total keys). GB/s counts valid K and V bytes once; SDPA cuDNN (padded to S) at full
lengths in the same run. Variants: ``default``, ``per-seq`` (``Knobs(balanced=False)``), ``per-seq bound``
(programs past a sequence's end exit). Each variant is first checked against the fp64 reference
(probe_decode2.check: lengths 0 / 1 / odd / full, NaN in unused slots, G 1 and G 4 with Sq 4 and a window).
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

SHAPES = [(64, 32, 8, 4096), (32, 32, 8, 4096), (32, 32, 8, 8192), (16, 32, 8, 16384), (128, 32, 8, 2048),
          (128, 32, 8, 4096), (256, 32, 8, 1024), (64, 32, 32, 4096), (16, 32, 32, 8192), (8, 32, 32, 16384)]
VARIANTS = {"default": {}, "per-seq": dict(balanced=False), "per-seq bound": dict(balanced=False, bound=True)}
DISTS = ("full", "uni", "uni=", "skew", "skew=")
# --paged: page-16 caches (shuffled pages) beside our dense default at the same lengths (goal >= 0.95x)
PAGED_SHAPES = [(64, 32, 8, 4096), (128, 32, 8, 4096), (256, 32, 8, 1024), (64, 32, 32, 4096), (64, 32, 8, 16384),
                (32, 32, 8, 8192)]
PAGED = {"default": {}, "per-seq": dict(balanced=False), "per-seq ahead3": dict(balanced=False, ahead=3),
         "bal p2": dict(balanced=True, programs_per_sm=2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="probe_out")
    ap.add_argument("--budget", type=float, default=200.0, help="seconds after which remaining timings are skipped")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU, kernels in Triton's interpreter")
    ap.add_argument("--paged", action="store_true", help="page-16 variants beside the dense default")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    shapes = PAGED_SHAPES if a.paged else SHAPES
    if a.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        pd2.DEV = "cpu"
        shapes = [(8, 2, 1, 64)]
        a.budget = 1e9
    import triton

    pd2.DENSE = {"default": {}} if a.paged else VARIANTS
    pd2.PAGED = PAGED
    gen = torch.Generator().manual_seed(26)
    torch.manual_seed(26)
    ceiling = pd2.copy_ceiling()
    name = torch.cuda.get_device_name() if pd2.DEV == "cuda" else "cpu"
    pd2.log(f"{name} torch {torch.__version__} triton {triton.__version__}; copy {ceiling:.0f} GB/s")
    win = (300 if pd2.DEV == "cuda" else 40, -1)
    bad: set = set()
    pd2.check_variants(pd2.DENSE, 0, (dict(G=1), dict(G=4, Sq=4, window=win)), gen, bad, pd2.ERRORS)
    pd2.BAD.update(("dense", n) for n in bad)
    if a.paged:
        bad = set()
        pd2.check_variants(PAGED, 16, (dict(G=1), dict(G=4, Sq=4, window=win)), gen, bad, pd2.ERRORS)
        pd2.BAD.update(("paged", n) for n in bad)
    for B, H, Hkv, S in shapes:
        try:
            pd2.section("units", B, H, Hkv, S, ("full", "uni") if a.paged else DISTS, (16,) if a.paged else (), gen,
                        a.budget)
        except Exception as e:
            pd2.ERRORS.append(f"{B, H, Hkv, S}: {pd2.err_lines(e)}")
            pd2.log("  FAIL", pd2.ERRORS[-1])
    out = [f"copy ceiling {ceiling:.0f} GB/s; {len(pd2.ROWS)} rows; {len(pd2.ERRORS)} failures; "
           f"{time.time() - pd2.T0:.0f} s",
           "GB/s of valid keys; /cud: full lengths over SDPA cuDNN; x=: over the same variant at the uniform batch of "
           "the same keys (goal >= 0.85); /def: over the default at the same lengths",
           f"{'shape':18} {'impl':14} {'full':>6} {'/cud':>5} {'uni':>6} {'x=':>5} {'/def':>5} {'skew':>6} {'x=':>5} "
           f"{'/def':>5}"]
    g = pd2.gbs
    for shape in dict.fromkeys(r["shape"] for r in pd2.ROWS if a.paged):
        df, du = g(shape, 0, "full", "default"), g(shape, 0, "uni", "default")
        out.append(f"{shape:18} dense default  {df:6.0f} {df / g(shape, 0, 'full', 'sdpa-cudnn'):5.3f} {du:6.0f}")
        for v in PAGED:
            f, u = g(shape, 16, "full", v), g(shape, 16, "uni", v)
            out.append(f"{shape:18} p16 {v:14} {f:6.0f} x dense {f / df:5.3f}  uni {u:6.0f} x dense {u / du:5.3f}")
    for shape in dict.fromkeys(r["shape"] for r in pd2.ROWS if not a.paged):
        cud = g(shape, 0, "full", "sdpa-cudnn")
        for v in VARIANTS:
            f, u, s = g(shape, 0, "full", v), g(shape, 0, "uni", v), g(shape, 0, "skew", v)
            ue, se = g(shape, 0, "uni=", v), g(shape, 0, "skew=", v)
            ud, sd = g(shape, 0, "uni", "default"), g(shape, 0, "skew", "default")
            out.append(f"{shape:18} {v:14} {f:6.0f} {f / cud:5.3f} {u:6.0f} {u / ue:5.2f} {u / ud:5.2f} {s:6.0f} "
                       f"{s / se:5.2f} {s / sd:5.2f}")
    out += ["FAIL " + e[:220] for e in pd2.ERRORS[-8:]]
    with open(os.path.join(a.out, "probe_decode_units.json"), "w") as fh:
        json.dump(dict(device=name, torch=torch.__version__, triton=triton.__version__, ceiling_gbs=ceiling,
                       seconds=time.time() - pd2.T0, rows=pd2.ROWS, errors=pd2.ERRORS, variants=VARIANTS), fh,
                  indent=1, default=str)
    pd2.log("\n" + "\n".join(out))


if __name__ == "__main__":
    main()
