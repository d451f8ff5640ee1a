"""Probe of decoding over batches of varied lengths on the H200 (issue 26, variable-lengths goal: >= 0.85x the
GB/s of uniform lengths counting valid keys): the current default plan, the ``bound`` knob, and the balanced
schedule (``Knobs(balanced=True)``: the key tiles of all sequences laid end to end per kv head, cut into equal
chunks on the device) at 1 / 2 / 4 programs per SM, beside SDPA cuDNN over the padded dense cache.

    PYTHONPATH=src python tools/probe_decode_varlen.py --out DIR       # the GPU: checks, timings, JSON, table
    PYTHONPATH=src python tools/probe_decode_varlen.py --smoke --out DIR   # here: tiny, Triton's interpreter

The kernels' compile reports (registers, spills, shared memory, no GPU): tools/decode_compile.py.

bf16, D = 128, Sq = 1; (B, H/Hkv) in {8, 32, 64} x {32/32, 32/8}; lengths in [1, S] (S = 32K, 16K for B = 64):
- ``full``: every sequence S keys (the uniform batch of the old probe),
- ``uni``: uniform in [1, S],   ``skew``: B/8 sequences of S keys, the rest uniform in [1, S/16],
- ``uni=`` / ``skew=``: the uniform batch with the same total keys as ``uni`` / ``skew`` (each sum/B).
GB/s counts the valid K and V bytes, 2·Hkv·Σ len_b·D·2 (SDPA reads all B·S, and is charged only the valid ones).
``x=``: a batch's GB/s over the default's at the same total uniform (the goal's ratio); ``xfull``: over the
default's at ``full``. Every variant is first checked on fresh inputs (lengths 0 / 1 / odd / full, NaN in every
unused slot and page, o poisoned) against the fp64 reference; a wrong or failing one is reported and skipped.
CUDA-graph replay is timed at ``uni`` (dense). The table comes last.
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
SHAPES = [(8, 32, 32, 32768), (8, 32, 8, 32768), (64, 32, 8, 16384), (32, 32, 8, 32768), (64, 32, 32, 16384),
          (32, 32, 32, 32768)]
VARIANTS = {"default": {}, "bound s16": dict(bound=True, splits=16), "bal p1": dict(balanced=True, programs_per_sm=1),
            "bal p2": dict(balanced=True, programs_per_sm=2), "bal p4": dict(balanced=True, programs_per_sm=4)}
DISTS = ("full", "uni", "uni=", "skew", "skew=")
DEV = "cuda"
T0 = time.time()
ROWS: list[dict] = []
ERRORS: list[str] = []
BAD: set = set()            # (variant, paged) that failed a check: not timed


def sync():
    pu.sync(DEV)


def run_plan(plan, q, k, v, sl, bt, window=(-1, -1)):
    from onlinesoftmax.decode.launch import attention_split_kv

    return attention_split_kv(q, k, v, sl, bt, True, D ** -0.5, window[0], window[1], 0.0, plan)


# ---- checks ----------------------------------------------------------------------------------------------------
def paged_cache(B, Hkv, S, page, dtype, gen, nan_free=True):
    """k, v ``[B·S/page + 3, Hkv, page, D]`` and a shuffled block table; the 3 spare pages NaN."""
    return pu.paged_cache(B, Hkv, S, page, D, dtype, gen, DEV, nan_free)


def check(name, kw, page, G, Sq=1, window=(-1, -1), gen=None):
    """The variant on fresh inputs: B = 8, Hkv = 4, S = 2048 (page 16 shuffled), lengths 0 / 1 / odd / full and
    random; NaN in every slot past a length (every unused page); o poisoned; against the fp64 reference."""
    from onlinesoftmax.reference import decode as ref

    B, Hkv, S = 8, 4, 64 if DEV == "cpu" else 2048
    lens, sl, q, k, v, bt = pu.decode_check_inputs(B, Hkv, S, G, Sq, page, D, gen, DEV)
    plan = explain(q, k, v, sl, block_table=bt, backend="triton", knobs=Knobs.of(**kw))
    poison = torch.full((B, G * Hkv, Sq, D), float("nan"), device=DEV, dtype=torch.bfloat16)
    del poison                                      # the caching allocator hands this block to o
    o, lse = run_plan(plan, q, k, v, sl, bt, window)
    sync()
    ro, rl = ref.attention_with_kvcache(q, k, v, sl, bt, window=window if window[0] >= 0 else None)
    if torch.isnan(o).any() or torch.isnan(lse).any():
        raise AssertionError(f"NaN in the output; lens {lens}")
    err = (o.double() - ro).abs().max().item()
    fin = torch.isfinite(rl)
    lerr = (lse.double() - rl)[fin].abs().max().item()
    if not err < 2.5e-2 or not lerr < 1e-3 or not torch.equal(torch.isinf(lse), ~fin):
        raise AssertionError(f"o err {err:.3g}, lse err {lerr:.3g}; lens {lens}")
    return err


def checks(gen):
    for name, kw in VARIANTS.items():
        for page in (0, 16):
            cases = [dict(G=1), dict(G=4)]
            if kw.get("balanced"):
                cases.append(dict(G=4, Sq=4, window=(300 if DEV == "cuda" else 20, -1)))
            for c in cases:
                try:
                    err = check(name, kw, page, gen=gen, **c)
                    log(f"  check {name:10} page {page:3} {c}: max err {err:.2e}")
                except Exception as e:
                    BAD.add((name, page))
                    ERRORS.append(f"check {name} page {page} {c}: {err_lines(e)}")
                    log("  FAIL", ERRORS[-1])


# ---- timing ----------------------------------------------------------------------------------------------------
def bench(fn, rep=25):
    return pu.bench(fn, DEV, 3, rep)


def bench_graph(fn):
    return pu.bench_graph(fn, DEV, bench)


def shape_section(B, H, Hkv, S, gen, budget):
    shape = f"B{B} H{H}/{Hkv} S{S // 1024}K"
    q = torch.randn(B, H, 1, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, S, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    base = {}
    for dist in DISTS:
        base[dist] = lengths(dist, B, S, gen, base)
    for page in (0, 16):
        if time.time() - T0 > budget:
            return
        if page:
            kc, vc, bt = paged_cache(B, Hkv, S, page, torch.bfloat16, gen, nan_free=False)
        else:
            kc, vc, bt = k, v, None
        for dist in DISTS:
            lens = base[dist]
            sl = torch.tensor(lens, dtype=torch.int32, device=DEV)
            nbytes = 2 * Hkv * sum(lens) * D * 2
            for name, kw in VARIANTS.items():
                if (name, page) in BAD or time.time() - T0 > budget:
                    continue
                try:
                    plan = explain(q, kc, vc, sl, block_table=bt, backend="triton", knobs=Knobs.of(**kw))
                    fn = lambda: run_plan(plan, q, kc, vc, sl, bt)      # noqa: E731
                    ms = bench(fn)
                    gms = bench_graph(fn) if dist == "uni" and not page else None
                    record(shape, page, dist, name, ms, nbytes, plan.splits, gms)
                except Exception as e:
                    ERRORS.append(f"{shape} p{page} {dist} {name}: {err_lines(e)}")
                    log("  FAIL", ERRORS[-1])
            if not page and DEV == "cuda":
                sdpa(shape, dist, q, k, v, nbytes)
    torch.cuda.empty_cache() if DEV == "cuda" else None


def sdpa(shape, dist, q, k, v, nbytes):
    """SDPA cuDNN over the padded cache (all S keys of every sequence; no per-sequence length)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if dist not in ("full", "uni", "skew"):
        return
    gqa = q.shape[1] != k.shape[1]

    def fn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    try:
        record(shape, 0, dist, "sdpa-cudnn (padded)", bench(fn), nbytes, 0, None)
    except Exception as e:
        ERRORS.append(f"{shape} {dist} cudnn: {err_lines(e)}")


def record(shape, page, dist, name, ms, nbytes, splits, graph_ms):
    row = dict(shape=shape, page=page, dist=dist, impl=name, ms=ms, gbs=nbytes / ms / 1e6, splits=splits,
               graph_gbs=nbytes / graph_ms / 1e6 if graph_ms else None)
    ROWS.append(row)
    g = f" graph {row['graph_gbs']:6.0f}" if graph_ms else ""
    log(f"  {shape:18} p{page:<3} {dist:5} {name:20} s{splits:<4} {ms * 1e3:8.1f} us {row['gbs']:6.0f} GB/s{g}")


def table(ceiling):
    def gbs(shape, page, dist, name, key="gbs"):
        r = next((r for r in ROWS if (r["shape"], r["page"], r["dist"], r["impl"]) == (shape, page, dist, name)),
                 None)
        return r[key] if r and r.get(key) else float("nan")
    out = [f"copy ceiling {ceiling:.0f} GB/s; {len(ROWS)} rows; {len(ERRORS)} failures; {time.time() - T0:.0f} s",
           "GB/s of valid K/V; x= : over the default at the uniform batch of the same total keys (goal >= 0.85); "
           "xfull: over the default at full lengths",
           f"{'shape':18} {'pg':>3} {'impl':20} {'full':>6} {'uni':>6} {'uni=':>6} {'x=':>5} {'xfull':>5} "
           f"{'skew':>6} {'skew=':>6} {'x=':>5} {'xfull':>5} {'graph':>6}"]
    shapes = list(dict.fromkeys(r["shape"] for r in ROWS))
    for shape in shapes:
        for page in (0, 16):
            for name in [*VARIANTS, "sdpa-cudnn (padded)"]:
                vals = {d: gbs(shape, page, d, name) for d in DISTS}
                if all(x != x for x in vals.values()):
                    continue
                full = gbs(shape, page, "full", "default")
                xu, xs = (vals["uni"] / gbs(shape, page, "uni=", "default"),
                          vals["skew"] / gbs(shape, page, "skew=", "default"))
                out.append(f"{shape:18} {page:3} {name:20} {vals['full']:6.0f} {vals['uni']:6.0f} {vals['uni=']:6.0f} "
                           f"{xu:5.2f} {vals['uni'] / full:5.2f} {vals['skew']:6.0f} {vals['skew=']:6.0f} {xs:5.2f} "
                           f"{vals['skew'] / full:5.2f} {gbs(shape, page, 'uni', name, 'graph_gbs'):6.0f}")
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
    global DEV, SHAPES
    if a.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        DEV = "cpu"
        SHAPES = [(8, 2, 2, 64)]
        a.budget = 1e9
    import triton

    gen = torch.Generator().manual_seed(26)
    torch.manual_seed(26)
    ceiling = copy_ceiling()
    name = torch.cuda.get_device_name() if DEV == "cuda" else "cpu"
    log(f"{name} torch {torch.__version__} triton {triton.__version__}; copy {ceiling:.0f} GB/s")
    checks(gen)
    log(f"checks done at {time.time() - T0:.0f} s")
    for B, H, Hkv, S in SHAPES:
        try:
            shape_section(B, H, Hkv, S, gen, a.budget)
        except Exception as e:
            ERRORS.append(f"shape {B, H, Hkv, S}: {err_lines(e)}")
            log("  FAIL", ERRORS[-1])
        if DEV == "cuda":
            torch.cuda.empty_cache()
    text = table(ceiling)
    with open(os.path.join(a.out, "probe_decode_varlen.json"), "w") as fh:
        json.dump(dict(device=name, torch=torch.__version__, triton=triton.__version__, ceiling_gbs=ceiling,
                       seconds=time.time() - T0, rows=ROWS, errors=ERRORS, variants=VARIANTS), fh, indent=1,
                  default=str)
    log("\n" + text)


if __name__ == "__main__":
    main()
