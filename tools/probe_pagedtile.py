"""Probe of issue 26's paged goal (paged >= 0.95x our dense GB/s) on the H200: one page number per page (``ahead=3``)
on the paged tiles and on the dense cache's tiles (``dense_tiles``), beside the dense and paged defaults.

    PYTHONPATH=src python tools/probe_pagedtile.py --out DIR          # the GPU: checks, timings, JSON, table last
    PYTHONPATH=src python tools/probe_pagedtile.py --compile-only     # here: the variants' tile loops on sm_90a
    PYTHONPATH=src python tools/probe_pagedtile.py --smoke --out DIR  # here: tiny, Triton's interpreter

Variants (``Knobs``): paged ``default`` (ahead 2: one page number per key, read a tile ahead; 64-key tiles, 4 warps,
3 programs per SM), ``ahead3`` (one page number per page on those tiles; page 16 only: at page 256 it takes 242
registers, 2 programs per SM), ``ahead3 p2`` (the same at 2 programs per SM), ``dense_tiles`` (the dense cache's
plan: 128-key tiles, 8 warps, one program per SM, one page number per page: one per tile at page 256). bf16,
D = 128, Sq = 1, shapes (B, H, Hkv, S) = (8, 32, 8, 16K), (8, 32, 8, 32K), (8, 32, 32, 32K), (64, 32, 8, 4K),
(32, 32, 8, 32K), full lengths and lengths uniform in [1, S]; pages shuffled. GB/s counts valid K and V bytes once;
every call moves >= 268 MB (past the 60 MB L2). Each variant is first checked (probe_decode2.check: lengths
0 / 1 / odd / full, NaN in every unused slot and page and the workspace, o poisoned, GQA 4 with Sq 4 and a window,
and G 1) against the fp64 reference at pages 16 and 256; a wrong one is not timed.
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

SHAPES = [(8, 32, 8, 16384), (8, 32, 8, 32768), (8, 32, 32, 32768), (64, 32, 8, 4096), (32, 32, 8, 32768)]
DISTS = ("full", "uni")
VARIANTS = {16: {"default": {}, "ahead3": dict(ahead=3), "ahead3 p2": dict(ahead=3, programs_per_sm=2),
                 "dense_tiles": dict(dense_tiles=True)},
            256: {"default": {}, "ahead3 p2": dict(ahead=3, programs_per_sm=2), "dense_tiles": dict(dense_tiles=True)}}
T0 = time.time()
ROWS: list[dict] = []
ERRORS: list[str] = []
BAD: set = set()
log = pd2.log


def checks(gen):
    win = (300 if pd2.DEV == "cuda" else 40, -1)
    for page, variants in VARIANTS.items():
        for name, kw in variants.items():
            for c in (dict(G=4, Sq=4, window=win), dict(G=1)):
                try:
                    err = pd2.check(kw, page, gen=gen, **c)
                    log(f"  check page {page:3} {name:12} {c}: max err {err:.2e}")
                except Exception as e:
                    BAD.add((page, name))
                    ERRORS.append(f"check page {page} {name} {c}: {pd2.err_lines(e)}")
                    log("  FAIL", ERRORS[-1])


def timed(shape, page, dist, name, kw, q, k, v, sl, bt, nbytes, budget):
    if (page, name) in BAD or time.time() - T0 > budget:
        return
    try:
        plan = explain(q, k, v, sl, block_table=bt, backend="triton", knobs=Knobs.of(**kw))
        ms = pd2.bench(lambda: pd2.run_plan(plan, q, k, v, sl, bt))
        row = dict(shape=shape, page=page, dist=dist, impl=name, ms=ms, gbs=nbytes / ms / 1e6, splits=plan.splits,
                   block_n=plan.block_n, warps=plan.num_warps, ahead=plan.ahead)
        ROWS.append(row)
        log(f"  {shape:18} p{page:<3} {dist:4} {name:12} s{plan.splits:<4} {ms * 1e3:8.1f} us {row['gbs']:6.0f} GB/s")
    except Exception as e:
        ERRORS.append(f"{shape} p{page} {dist} {name}: {pd2.err_lines(e)}")
        log("  FAIL", ERRORS[-1])


def section(B, H, Hkv, S, gen, budget):
    shape = f"B{B} H{H}/{Hkv} S{S // 1024}K"
    D, dev = pd2.D, pd2.DEV
    q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
    lens = {d: pd2.lengths(d, B, S, gen, {}) for d in DISTS}
    for page in (0, *VARIANTS):
        if time.time() - T0 > budget:
            return
        if page:
            k, v, bt = pd2.paged_cache(B, Hkv, S, page, gen, nan_spare=False)
        else:
            k = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16)
            v, bt = torch.randn_like(k), None
        for dist in DISTS:
            sl = torch.tensor(lens[dist], dtype=torch.int32, device=dev)
            nbytes = 2 * Hkv * sum(lens[dist]) * D * 2
            for name, kw in (VARIANTS[page] if page else {"default": {}}).items():
                timed(shape, page, dist, name, kw, q, k, v, sl, bt, nbytes, budget)
        k = v = bt = None
        if dev == "cuda":
            torch.cuda.empty_cache()


def gbs(shape, page, dist, name):
    r = next((r for r in ROWS if (r["shape"], r["page"], r["dist"], r["impl"]) == (shape, page, dist, name)), None)
    return r["gbs"] if r else float("nan")


def table(ceiling):
    names = [f"{p}:{n}" for p, vs in VARIANTS.items() for n in vs]
    out = [f"copy ceiling {ceiling:.0f} GB/s; {len(ROWS)} rows; {len(ERRORS)} failures; {time.time() - T0:.0f} s",
           "GB/s of our dense default, then paged variant GB/s / dense (goal >= 0.95); p:name = page:variant",
           f"{'shape':18} {'dist':4} {'dense':>6} " + " ".join(f"{n:>15}" for n in names)]
    for shape in dict.fromkeys(r["shape"] for r in ROWS):
        for dist in DISTS:
            dd = gbs(shape, 0, dist, "default")
            cells = []
            for n in names:
                page, name = n.split(":")
                x = gbs(shape, int(page), dist, name)
                cells.append(f"{x:6.0f} {x / dd:5.3f}  " if x == x else f"{'-':>15}")
            out.append(f"{shape:18} {dist:4} {dd:6.0f} " + " ".join(f"{c:>15}" for c in cells))
    out += ["FAIL " + e[:220] for e in ERRORS[-8:]]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="probe_out")
    ap.add_argument("--budget", type=float, default=125.0, help="seconds after which remaining timings are skipped")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU, kernels in Triton's interpreter")
    a = ap.parse_args()
    if a.compile_only:
        import decode_compile

        rows = decode_compile.paged_report()
        sys.exit(1 if any(r["stack"] and r["variant"] != "ahead3" for r in rows) else 0)
    os.makedirs(a.out, exist_ok=True)
    global SHAPES
    if a.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        pd2.DEV = "cpu"
        SHAPES = [(2, 4, 1, 512)]
        a.budget = 1e9
    import triton

    gen = torch.Generator().manual_seed(26)
    torch.manual_seed(26)
    ceiling = pd2.copy_ceiling()
    name = torch.cuda.get_device_name() if pd2.DEV == "cuda" else "cpu"
    log(f"{name} torch {torch.__version__} triton {triton.__version__}; copy {ceiling:.0f} GB/s")
    checks(gen)
    log(f"checks done at {time.time() - T0:.0f} s")
    for B, H, Hkv, S in SHAPES:
        try:
            section(B, H, Hkv, S, gen, a.budget)
        except Exception as e:
            ERRORS.append(f"{B, H, Hkv, S}: {pd2.err_lines(e)}")
            log("  FAIL", ERRORS[-1])
    text = table(ceiling)
    with open(os.path.join(a.out, "probe_pagedtile.json"), "w") as fh:
        json.dump(dict(device=name, torch=torch.__version__, triton=triton.__version__, ceiling_gbs=ceiling,
                       seconds=time.time() - T0, rows=ROWS, errors=ERRORS,
                       variants={str(p): v for p, v in VARIANTS.items()}), fh, indent=1, default=str)
    log("\n" + text)


if __name__ == "__main__":
    main()
