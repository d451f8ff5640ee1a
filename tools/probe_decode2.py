"""Probe of issue 26's decode goals on the H200 after the decode2 branch: the dense balanced schedule over one line
of all kv heads (``Knobs(cross=True)``: 132 chunks at one program per SM, not 16 x 8 = 128 at Hkv = 8) and the
balanced schedule for paged caches at other tiles / warps / programs per SM, beside the defaults, the per-sequence
splits and SDPA cuDNN (dense, padded).

    PYTHONPATH=src python tools/probe_decode2.py --out DIR          # the GPU: checks, timings, JSON, table last
    PYTHONPATH=src python tools/probe_decode2.py --smoke --out DIR  # here: tiny, Triton's interpreter

The kernels' compile reports (registers, spills, shared memory, no GPU): tools/decode_compile.py.

bf16, D = 128, Sq = 1. Part 1, the goal shapes (B, H, Hkv, S) = (8, 32, 32, 32K), (1, 32, 32, 128K),
(8, 32, 8, 32K), (64, 32, 8, 4K) at full lengths: dense (goal >= 1.0x cuDNN) and paged 16 / 256 (shuffled pages;
goal >= 0.95x our dense default). Part 2, variable lengths at B 8 / 32 / 64 x H 32/32, 32/8 (S 32K, 16K at B 64):
``uni`` (lengths uniform in [1, S]), ``skew`` (B/8 sequences of S, the rest uniform in [1, S/16]) and ``uni=`` /
``skew=`` (uniform batches of the same total keys): ``x=`` = GB/s over the same variant at the uniform batch
(goal >= 0.85). GB/s counts valid K and V bytes once. Every call moves >= 1 GB (past the 60 MB L2). CUDA-graph
replay at (64, 32, 8, 4K) uni. Each variant is first checked on fresh inputs (lengths 0 / 1 / odd / full, NaN in
every unused slot and page, o poisoned, pages 16 and 256) against the fp64 reference; a wrong one is not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import probe_util as pu
import torch
from probe_util import err_lines, lengths, log

from onlinesoftmax.decode.api import explain
from onlinesoftmax.decode.plan import Knobs

D = 128
GOAL = [(8, 32, 32, 32768), (1, 32, 32, 131072), (8, 32, 8, 32768), (64, 32, 8, 4096)]
VARLEN = [(8, 32, 32, 32768), (8, 32, 8, 32768), (32, 32, 8, 32768), (32, 32, 32, 32768), (64, 32, 8, 16384),
          (64, 32, 32, 16384)]
DENSE = {"default": {}, "per-seq": dict(balanced=False), "xh p1": dict(balanced=True, cross=True),
         "xh p2": dict(balanced=True, cross=True, programs_per_sm=2)}
PAGED = {"default": {}, "bal p2": dict(balanced=True, programs_per_sm=2),
         "bal p1 n128": dict(balanced=True, programs_per_sm=1, block_n=128, num_stages=3),
         "xh p1 n128": dict(balanced=True, cross=True, programs_per_sm=1, block_n=128, num_stages=3),
         "bal p3 w4s3": dict(balanced=True, programs_per_sm=3, num_warps=4, num_stages=3),
         "bal p2 s3": dict(balanced=True, programs_per_sm=2, num_stages=3)}
DEV = "cuda"
T0 = time.time()
ROWS: list[dict] = []
ERRORS: list[str] = []
BAD: set = set()


def sync():
    pu.sync(DEV)


def run_plan(plan, q, k, v, sl, bt, window=(-1, -1)):
    from onlinesoftmax.decode.launch import attention_split_kv

    return attention_split_kv(q, k, v, sl, bt, True, D ** -0.5, window[0], window[1], 0.0, plan)


def paged_cache(B, Hkv, S, page, gen, nan_spare=True):
    """k, v ``[B·S/page + 3, Hkv, page, D]`` and a shuffled block table; the 3 spare pages NaN."""
    return pu.paged_cache(B, Hkv, S, page, D, torch.bfloat16, gen, DEV, nan_spare)


# ---- checks ----------------------------------------------------------------------------------------------------
def check(kw, page, G, Sq=1, window=(-1, -1), gen=None):
    """B = 8, Hkv = 4, S = 2048: lengths 0 / 1 / odd / full and random; NaN past every length (and in the
    workspace); o poisoned; against the fp64 reference."""
    from onlinesoftmax._triton.launch import stream_scratch
    from onlinesoftmax.reference import decode as ref

    B, Hkv, S = 8, 4, 256 if DEV == "cpu" else 2048
    lens, sl, q, k, v, bt = pu.decode_check_inputs(B, Hkv, S, G, Sq, page, D, gen, DEV)
    plan = explain(q, k, v, sl, block_table=bt, backend="triton", knobs=Knobs.of(**kw))
    rows = G * Hkv * Sq * (plan.splits + B)
    layout = ((rows * D, torch.float32), (rows, torch.float32), (B * G * Hkv * Sq, torch.float32))  # launch.py's
    for t in stream_scratch("decode", q.device, layout, zeroed=0):
        t.fill_(float("nan"))
    poison = torch.full((B, G * Hkv, Sq, D), float("nan"), device=DEV, dtype=torch.bfloat16)
    del poison                                      # the caching allocator hands this block to o
    o, lse = run_plan(plan, q, k, v, sl, bt, window)
    sync()
    ro, rl = ref.attention_with_kvcache(q, k, v, sl, bt, window=window if window[0] >= 0 else None)
    if torch.isnan(o).any() or torch.isnan(lse).any():
        raise AssertionError(f"NaN in the output; lens {lens}")
    err = ((o.double() - ro).abs() / (1 + ro.abs())).max().item()     # bf16 o: a one-key row is v itself
    fin = torch.isfinite(rl)
    lerr = (lse.double() - rl)[fin].abs().max().item()
    if not err < 1.6e-2 or not lerr < 1e-3 or not torch.equal(torch.isinf(lse), ~fin):
        raise AssertionError(f"o err {err:.3g}, lse err {lerr:.3g}; lens {lens}")
    return err


def checks(gen):
    win = (300 if DEV == "cuda" else 40, -1)
    cases = {0: (dict(G=1), dict(G=4, Sq=4, window=win)), 16: (dict(G=4, Sq=4, window=win),), 256: (dict(G=1),)}
    for kind, variants, pages in (("dense", DENSE, (0,)), ("paged", PAGED, (16, 256))):
        for name, kw in variants.items():
            for page in pages:
                for c in cases[page]:
                    try:
                        err = check(kw, page, gen=gen, **c)
                        log(f"  check {kind} {name:12} page {page:3} {c}: max err {err:.2e}")
                    except Exception as e:
                        BAD.add((kind, name))
                        ERRORS.append(f"check {kind} {name} page {page} {c}: {err_lines(e)}")
                        log("  FAIL", ERRORS[-1])


def check_variants(variants: dict, page: int, cases: tuple, gen, bad: set, errors: list) -> None:
    """Each variant (a name -> Knobs fields) checked by :func:`check` on each case (its keywords) at ``page``: a
    failing variant's name goes to ``bad`` (not timed), its error to ``errors``."""
    for name, kw in variants.items():
        for c in cases:
            try:
                err = check(kw, page, gen=gen, **c)
                log(f"  check {name:12} page {page:3} {c}: max err {err:.2e}")
            except Exception as e:
                bad.add(name)
                errors.append(f"check {name} page {page} {c}: {err_lines(e)}")
                log("  FAIL", errors[-1])


# ---- timing ----------------------------------------------------------------------------------------------------
def bench(fn, rep=20):
    return pu.bench(fn, DEV, 3, rep)


def bench_graph(fn):
    return pu.bench_graph(fn, DEV, bench)


def record(part, shape, page, dist, name, ms, nbytes, splits, graph_ms=None):
    row = dict(part=part, shape=shape, page=page, dist=dist, impl=name, ms=ms, gbs=nbytes / ms / 1e6, splits=splits,
               graph_gbs=nbytes / graph_ms / 1e6 if graph_ms else None)
    ROWS.append(row)
    g = f" graph {row['graph_gbs']:6.0f}" if graph_ms else ""
    log(f"  {shape:18} p{page:<3} {dist:5} {name:14} s{splits:<4} {ms * 1e3:8.1f} us {row['gbs']:6.0f} GB/s{g}")


def sdpa(part, shape, dist, q, k, v, nbytes):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gqa = q.shape[1] != k.shape[1]

    def fn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    try:
        record(part, shape, 0, dist, "sdpa-cudnn", bench(fn), nbytes, 0)
    except Exception as e:
        ERRORS.append(f"{shape} {dist} cudnn: {err_lines(e)}")


def section(part, B, H, Hkv, S, dists, pages, gen, budget, graph=False):
    shape = f"B{B} H{H}/{Hkv} S{S // 1024}K"
    q = torch.randn(B, H, 1, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, S, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    base = {}
    for dist in dists:
        base[dist] = lengths(dist, B, S, gen, base)
    for page in (0, *pages):
        if time.time() - T0 > budget:
            return
        kind, variants = ("paged", PAGED) if page else ("dense", DENSE)
        if page:
            k = v = None
            torch.cuda.empty_cache() if DEV == "cuda" else None
            kc, vc, bt = paged_cache(B, Hkv, S, page, gen, nan_spare=False)
        else:
            kc, vc, bt = k, v, None
        for dist in dists:
            lens = base[dist]
            sl = torch.tensor(lens, dtype=torch.int32, device=DEV)
            nbytes = 2 * Hkv * sum(lens) * D * 2
            for name, kw in variants.items():
                if (kind, name) in BAD or time.time() - T0 > budget:
                    continue
                try:
                    plan = explain(q, kc, vc, sl, block_table=bt, backend="triton", knobs=Knobs.of(**kw))
                    fn = lambda: run_plan(plan, q, kc, vc, sl, bt)      # noqa: E731
                    ms = bench(fn)
                    gms = bench_graph(fn) if graph and dist == "uni" and not page else None
                    record(part, shape, page, dist, name, ms, nbytes, plan.splits, gms)
                except Exception as e:
                    ERRORS.append(f"{shape} p{page} {dist} {name}: {err_lines(e)}")
                    log("  FAIL", ERRORS[-1])
            if not page and DEV == "cuda" and dist in ("full", "uni", "skew"):
                sdpa(part, shape, dist, q, k, v, nbytes)
        kc = vc = bt = None
    if DEV == "cuda":
        torch.cuda.empty_cache()


def gbs(shape, page, dist, name):
    r = next((r for r in ROWS if (r["shape"], r["page"], r["dist"], r["impl"]) == (shape, page, dist, name)), None)
    return r["gbs"] if r else float("nan")


def table(ceiling):
    out = [f"copy ceiling {ceiling:.0f} GB/s; {len(ROWS)} rows; {len(ERRORS)} failures; {time.time() - T0:.0f} s",
           "GOAL SHAPES (full lengths): GB/s; /cudnn: over SDPA cuDNN (dense goal >= 1.0); /dense: over our dense "
           "default (paged goal >= 0.95)",
           f"{'shape':18} {'pg':>3} {'impl':14} {'GB/s':>6} {'/cudnn':>6} {'/dense':>6} {'/def':>6} {'graph':>6}"]
    for shape in dict.fromkeys(r["shape"] for r in ROWS if r["part"] == "goal"):
        cud = gbs(shape, 0, "full", "sdpa-cudnn")
        dd = gbs(shape, 0, "full", "default")
        for page in (0, 16, 256):
            dp = gbs(shape, page, "full", "default")
            for name in [*(PAGED if page else DENSE), *(() if page else ("sdpa-cudnn",))]:
                x = gbs(shape, page, "full", name)
                if x == x:
                    out.append(f"{shape:18} {page:3} {name:14} {x:6.0f} {x / cud:6.3f} {x / dd:6.3f} {x / dp:6.3f}")
    g = [r for r in ROWS if r.get("graph_gbs")]
    out += [f"graph replay {r['shape']} {r['dist']} {r['impl']}: {r['graph_gbs']:.0f} GB/s (stream {r['gbs']:.0f})"
            for r in g]
    out += ["VARIABLE LENGTHS: GB/s of valid keys; x=: over the same impl at the uniform batch of the same keys "
            "(goal >= 0.85); /def: over the default at the same lengths",
            f"{'shape':18} {'pg':>3} {'impl':14} {'uni':>6} {'x=':>5} {'/def':>5} {'skew':>6} {'x=':>5} {'/def':>5}"]
    for shape in dict.fromkeys(r["shape"] for r in ROWS if r["part"] == "varlen"):
        for page in (0, 16):
            for name in [*(PAGED if page else DENSE), *(() if page else ("sdpa-cudnn",))]:
                u, s = gbs(shape, page, "uni", name), gbs(shape, page, "skew", name)
                if u != u and s != s:
                    continue
                ue = gbs(shape, page, "uni=", name if name != "sdpa-cudnn" else "default")
                se = gbs(shape, page, "skew=", name if name != "sdpa-cudnn" else "default")
                ud, sd = gbs(shape, page, "uni", "default"), gbs(shape, page, "skew", "default")
                out.append(f"{shape:18} {page:3} {name:14} {u:6.0f} {u / ue:5.2f} {u / ud:5.2f} {s:6.0f} "
                           f"{s / se:5.2f} {s / sd:5.2f}")
    out += ["FAIL " + e[:220] for e in ERRORS[-8:]]
    return "\n".join(out)


def copy_ceiling():
    return pu.copy_ceiling(DEV, bench, 16)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="probe_out")
    ap.add_argument("--budget", type=float, default=125.0, help="seconds after which remaining timings are skipped")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU, kernels in Triton's interpreter")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    global DEV, GOAL, VARLEN
    if a.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        DEV = "cpu"
        GOAL, VARLEN = [(2, 2, 1, 64)], [(8, 2, 2, 64)]
        a.budget = 1e9
    import triton

    gen = torch.Generator().manual_seed(26)
    torch.manual_seed(26)
    ceiling = copy_ceiling()
    name = torch.cuda.get_device_name() if DEV == "cuda" else "cpu"
    log(f"{name} torch {torch.__version__} triton {triton.__version__}; copy {ceiling:.0f} GB/s")
    checks(gen)
    log(f"checks done at {time.time() - T0:.0f} s")
    for part, shapes, dists, pages in (("goal", GOAL, ("full",), (16, 256)),
                                       ("varlen", VARLEN, ("uni", "uni=", "skew", "skew="), (16,))):
        for B, H, Hkv, S in shapes:
            try:
                section(part, B, H, Hkv, S, dists, pages, gen, a.budget, graph=part == "varlen" and B == 64
                        and Hkv == 8)
            except Exception as e:
                ERRORS.append(f"{part} {B, H, Hkv, S}: {err_lines(e)}")
                log("  FAIL", ERRORS[-1])
    text = table(ceiling)
    with open(os.path.join(a.out, "probe_decode2.json"), "w") as fh:
        json.dump(dict(device=name, torch=torch.__version__, triton=triton.__version__, ceiling_gbs=ceiling,
                       seconds=time.time() - T0, rows=ROWS, errors=ERRORS, dense=DENSE, paged=PAGED), fh, indent=1,
                  default=str)
    log("\n" + text)


if __name__ == "__main__":
    main()
