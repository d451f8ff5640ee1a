"""Probe of the decode split-KV kernels on the H200 (issue 26): the current default plan against knob variants and
SDPA cuDNN / flash, bf16, D = 128, Sq = 1.

    PYTHONPATH=src python tools/probe_decode.py --out DIR       # on the GPU: checks, timings, DIR/probe_decode.json

The kernels' compile reports (registers, spills, shared memory, no GPU): tools/decode_compile.py.

GB/s counts K and V read once: 2·B·Hkv·Sk·D·2 bytes (variable lengths: valid keys only). Every KV cache is >= 1 GiB
(L2 is 60 MB), so no rotation is needed. Sections, in order (a time budget cuts the tail, never the table):
1. dense at the four goal shapes: tiles (block_n, num_warps, num_stages) at the default split count, then split
   counts with the best tiles; do_bench and CUDA-graph replay; SDPA cuDNN and flash beside them.
2. paged, page 16 and 256, pages shuffled: ahead 0 (today) / 1 (page numbers by ld.global.nc, K as rows) / 2 (also
   one tile ahead) x tiles, at the default split count and at the best dense one; against our dense default.
3. variable lengths (1..Sk): bound (equal chunks of [0, s_max), programs past the end exit) x split counts, dense
   and paged 16, against the default's GB/s at uniform lengths.
Each variant is first checked on fresh inputs (lengths odd, NaN in every unused slot and page, output poisoned)
against an fp32 torch reference on the same bf16 inputs; a wrong or failing variant is reported and skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import probe_util as pu
import torch
from probe_util import err_lines, log

from onlinesoftmax.decode.api import explain
from onlinesoftmax.decode.plan import Knobs

D = 128
GOAL = [(8, 32, 32, 32768), (1, 32, 32, 131072), (8, 32, 8, 32768), (64, 32, 8, 4096)]
TILES = [(64, 8, 3), (64, 8, 4), (64, 4, 3), (128, 8, 3), (128, 4, 2), (128, 8, 2)]   # (block_n, warps, stages)
PAGED_TILES = [(64, 8, 3), (64, 8, 4), (128, 8, 3)]
SPLITS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
CHECK_S = (512, 4096)    # key slots of the check problems: (fewest, most)
DEV = "cuda"
T0 = time.time()
ROWS: list[dict] = []
ERRORS: list[str] = []


def over(budget: float) -> bool:
    return time.time() - T0 > budget


# ---- inputs and the reference -----------------------------------------------------------------------------------
def paged_copy(k, v, page, gen, spare=3):
    """Dense [B, Hkv, S, D] caches as shuffled pages [B·S/page + spare, Hkv, page, D] (spare pages NaN) and the
    block table."""
    B, Hkv, S, _ = k.shape
    n = S // page
    perm = torch.randperm(B * n, generator=gen).to(k.device)
    out = []
    for c in (k, v):
        pages = torch.full((B * n + spare, Hkv, page, D), float("nan"), dtype=c.dtype, device=c.device)
        pages[perm] = c.reshape(B, Hkv, n, page, D).permute(0, 2, 1, 3, 4).reshape(B * n, Hkv, page, D)
        out.append(pages)
    return out[0], out[1], perm.int().reshape(B, n).contiguous()


def reference(q, k, v, lens):
    """o, lse in fp32 from the dense bf16 caches: keys j < lens[b] only (the NaN past them never enter)."""
    B, H, _, _ = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    valid = torch.arange(S, device=q.device)[None, :] < lens[:, None].long()            # [B, S]
    kf = torch.where(valid[:, None, :, None], k.float(), 0.0).repeat_interleave(H // Hkv, 1)
    vf = torch.where(valid[:, None, :, None], v.float(), 0.0).repeat_interleave(H // Hkv, 1)
    s = torch.matmul(q.float(), kf.transpose(-1, -2)) * D ** -0.5                        # [B, H, 1, S]
    s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.matmul(torch.softmax(s, -1), vf), lse


def run_plan(plan, q, k, v, sl, bt):
    from onlinesoftmax.decode.launch import attention_split_kv

    return attention_split_kv(q, k, v, sl, bt, True, D ** -0.5, -1, -1, 0.0, plan)


def check(B, H, Hkv, page, knobs, gen=None):
    """Error of the variant (knobs) on fresh inputs shaped like the goal problem but S keys: lengths odd / 1 / full,
    NaN in every slot past them and in spare pages, o poisoned with NaN before the call. Raises on a mismatch."""
    dev = DEV
    S = max(CHECK_S[0], min(CHECK_S[1], (1 << 21) // (B * Hkv)))       # the fp32 reference holds B·H·S·D floats twice
    q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16)
    lens = torch.randint(1, S + 1, (B,), generator=gen).tolist()
    lens[0] = S - 1 if S > 2 else S
    if B > 1:
        lens[1] = 1
    if B > 2:
        lens[2] = S
    lens = [n | 1 if n < S else n for n in lens]                  # odd, or full
    sl = torch.tensor(lens, dtype=torch.int32, device=dev)
    for b, n in enumerate(lens):
        k[b, :, n:] = float("nan")
        v[b, :, n:] = float("nan")
    bt = None
    kc, vc = k, v
    if page:
        kc, vc, bt = paged_copy(k, v, page, gen)
    plan = explain(q, kc, vc, sl, block_table=bt, backend="triton", knobs=knobs)
    poison = torch.full((B, H, 1, D), float("nan"), device=dev, dtype=torch.bfloat16)
    del poison                                      # the caching allocator hands this block to o
    o, lse = run_plan(plan, q, kc, vc, sl, bt)
    sync()
    ro, rl = reference(q, k, v, sl)
    if torch.isnan(o).any() or torch.isnan(lse).any():
        raise AssertionError(f"NaN in the output (unwritten or a poisoned slot read); lens {lens[:4]}")
    rel = ((o.float() - ro).norm() / ro.norm()).item()
    lerr = (lse - rl).abs().max().item()
    if not rel < 1e-2 or not lerr < 1e-2:
        raise AssertionError(f"rel err {rel:.3g}, lse err {lerr:.3g}; lens {lens[:4]}")
    return rel


# ---- timing ----------------------------------------------------------------------------------------------------
def sync():
    pu.sync(DEV)


def bench(fn):
    return pu.bench(fn, DEV, 5, 40)


def bench_graph(fn):
    """fn captured once into a CUDA graph, its replays timed."""
    return pu.bench_graph(fn, DEV, bench)


def record(section, shape, name, ms, nbytes, plan=None, graph_ms=None, ok=None, extra=None):
    row = dict(section=section, shape=shape, impl=name, ms=ms, gbs=nbytes / ms / 1e6 if ms else None,
               graph_ms=graph_ms, graph_gbs=nbytes / graph_ms / 1e6 if graph_ms else None, check=ok,
               plan=plan_str(plan) if plan is not None else None, **(extra or {}))
    ROWS.append(row)
    g = f" graph {row['graph_gbs']:6.0f}" if graph_ms else ""
    log(f"  {section:6} {shape:22} {name:44} {ms * 1e3:8.1f} us {row['gbs']:6.0f} GB/s{g}")
    return row


def plan_str(p):
    return (f"s{p.splits} bn{p.block_n} w{p.num_warps} st{p.num_stages} bm{p.block_m}"
            + (f" ahead{p.ahead}" if p.ahead else "") + (" bound" if p.bound else ""))


def knobs_of(tiles=None, **kw) -> Knobs:
    if tiles:
        kw.update(block_n=tiles[0], num_warps=tiles[1], num_stages=tiles[2])
    return Knobs.of(**kw)


def name_of(kw: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in kw.items()) or "default"


def try_variant(section, shape, kw, q, kc, vc, sl, bt, nbytes, check_args, graph, gen, checked):
    """Check (once per distinct kernel and split count) and time the variant of knobs ``kw``; None on failure."""
    label = name_of(kw)
    try:
        plan = explain(q, kc, vc, sl, block_table=bt, backend="triton", knobs=Knobs.of(**kw))
        key = (check_args, plan.block_n, plan.num_warps, plan.num_stages, plan.ahead, plan.bound, plan.splits)
        if key not in checked:
            checked[key] = check(*check_args, Knobs.of(**{**kw, "splits": plan.splits}), gen=gen)
        fn = lambda: run_plan(plan, q, kc, vc, sl, bt)      # noqa: E731
        ms = bench(fn)
        gms = bench_graph(fn) if graph else None
        return record(section, shape, label, ms, nbytes, plan, gms, ok=True, extra=dict(knobs=kw))
    except Exception as e:            # a variant that fails to compile or is wrong must not stop the others
        msg = f"{section} {shape} {label}: {err_lines(e)}"
        ERRORS.append(msg)
        log("  FAIL", msg)
        return None


def sdpa_rows(shape, q, k, v, nbytes):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gqa = q.shape[1] != k.shape[1]
    for name, be in (("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa-flash", SDPBackend.FLASH_ATTENTION)):
        def fn(be=be):
            with sdpa_kernel([be]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
        try:
            ms = bench(fn)
            try:
                gms = bench_graph(fn)
            except Exception:
                gms = None
            record("dense", shape, name, ms, nbytes, graph_ms=gms)
        except Exception as e:
            ERRORS.append(f"dense {shape} {name}: {err_lines(e)}")
            log("  FAIL", name, err_lines(e))


# ---- sections --------------------------------------------------------------------------------------------------
def best(rows, key="ms"):
    rows = [r for r in rows if r is not None and r.get(key)]
    return min(rows, key=lambda r: r[key]) if rows else None


def split_candidates(B, Hkv, s_max, block_n, default):
    """Split counts from one program per (b, kv head) up to ~24 per SM, each split at least 4 tiles."""
    most = max(1, s_max // (block_n * 4))
    return sorted({s for s in SPLITS + [default] if s <= most and B * Hkv * s <= 132 * 24})


def caches(B, H, Hkv, S):
    q = torch.randn(B, H, 1, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, S, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, S, D, device=DEV, dtype=torch.bfloat16)
    return q, k, v


def entry(default, rows, ref_gbs, ref_name, key="ms"):
    b = best([default] + rows, key)
    return dict(default=default, best=b, ref_gbs=ref_gbs, ref=ref_name)


def dense_section(B, H, Hkv, S, gen, checked, budget, summary):
    """Tiles at the default split count, then split counts with the best tiles; do_bench and graph replay."""
    shape = f"B{B} H{H}/{Hkv} Sk{S}"
    q, k, v = caches(B, H, Hkv, S)
    sl = torch.full((B,), S, dtype=torch.int32, device=DEV)
    nbytes = 2 * B * Hkv * S * D * 2
    sdpa_rows(shape, q, k, v, nbytes)
    default = explain(q, k, v, sl, backend="triton")
    ca = (B, H, Hkv, 0)

    def run(kw):
        return try_variant("dense", shape, kw, q, k, v, sl, None, nbytes, ca, True, gen, checked)
    d = run({})
    from onlinesoftmax.decode import attention_with_kvcache
    try:                                 # the public entry point, host path included
        record("dense", shape, "attention_with_kvcache (public)",
               bench(lambda: attention_with_kvcache(q, k, v, sl)), nbytes)
    except Exception as e:
        ERRORS.append(f"dense {shape} public: {err_lines(e)}")
    here = (default.block_n, default.num_warps, default.num_stages)
    rows = [run(dict(block_n=t[0], num_warps=t[1], num_stages=t[2])) for t in TILES
            if t != here and not over(budget)]
    top = best([d] + rows)
    kw = dict(top["knobs"]) if top else {}
    kw.pop("splits", None)
    for s in split_candidates(B, Hkv, S, kw.get("block_n", default.block_n), default.splits):
        if not over(budget) and not (s == default.splits and not kw):
            rows.append(run({"splits": s, **kw}))
    for pps in (3, 4):                  # what the occupancy-based split count (plan.num_splits_waves) picks
        if not over(budget):
            rows.append(run({"programs_per_sm": pps}))
    cud = next((r for r in ROWS if r["shape"] == shape and r["impl"] == "sdpa-cudnn"), None)
    summary[shape] = {"dense": entry(d, rows, cud and cud["gbs"], "cuDNN"),
                      "graph": entry(d, rows, cud and (cud["graph_gbs"] or cud["gbs"]), "cuDNN", "graph_ms")}


def paged_section(B, H, Hkv, S, gen, checked, budget, summary):
    """Page 16 and 256 (shuffled): the default, then ahead 1 / 2 x tiles x {default, best dense} split counts."""
    shape = f"B{B} H{H}/{Hkv} Sk{S}"
    q, k, v = caches(B, H, Hkv, S)
    sl = torch.full((B,), S, dtype=torch.int32, device=DEV)
    nbytes = 2 * B * Hkv * S * D * 2
    dense = summary.get(shape, {}).get("dense", {})
    ref = dense.get("best")
    default_splits = explain(q, k, v, sl, backend="triton").splits
    splits = {default_splits}
    if ref and ref.get("plan"):
        splits.add(int(ref["plan"].split()[0][1:]))
    for page in (16, 256):
        if over(budget):
            break
        kc, vc, bt = paged_copy(k, v, page, gen, spare=0)
        ca = (B, H, Hkv, page)

        def run(kw):
            return try_variant(f"page{page}", shape, kw, q, kc, vc, sl, bt, nbytes, ca, False, gen, checked)
        d = run({})
        rows = [run(dict(ahead=a, block_n=t[0], num_warps=t[1], num_stages=t[2], splits=s))
                for a in (1, 2) for t in PAGED_TILES for s in sorted(splits) if not over(budget)]
        rows += [run(dict(ahead=a, programs_per_sm=3)) for a in (1, 2) if not over(budget)]
        summary.setdefault(shape, {})[f"page{page}"] = entry(d, rows, ref and ref["gbs"], "our best dense")


def varlen_section(B, H, Hkv, S, gen, checked, budget, summary):
    """Lengths drawn from 1..S: bound x split counts (dense), then paged 16 with the best of them and ahead."""
    shape = f"B{B} H{H}/{Hkv} Sk{S}"
    lens = torch.randint(1, S + 1, (B,), generator=gen).tolist()
    q, k, v = caches(B, H, Hkv, S)
    sl = torch.tensor(lens, dtype=torch.int32, device=DEV)
    nbytes = 2 * Hkv * sum(lens) * D * 2
    default = explain(q, k, v, sl, backend="triton")
    uni = summary.get(shape, {}).get("dense", {}).get("default")

    def run(kw, page=0, kc=k, vc=v, bt=None):
        return try_variant("var" if not page else f"var{page}", shape, kw, q, kc, vc, sl, bt, nbytes,
                           (B, H, Hkv, page), False, gen, checked)
    d = run({})
    rows = [run(dict(bound=bound, splits=s)) for bound in (False, True)
            for s in sorted({default.splits, 2 * default.splits, 4 * default.splits, 8, 16, 32, 64})
            if s <= S // (default.block_n * 2) and not over(budget)]
    rows += [run(dict(bound=True, programs_per_sm=3))] if not over(budget) else []
    summary.setdefault(shape, {})["var"] = e = entry(d, rows, uni and uni["gbs"], "default, uniform lengths")
    if over(budget):
        return
    kc, vc, bt = paged_copy(k, v, 16, gen, spare=0)
    top = dict(e["best"]["knobs"]) if e["best"] else {}
    kws = [{}, dict(ahead=2), dict(ahead=1)] + ([{**top, "ahead": a} for a in (0, 1, 2)] if top else [])
    prow = [run(kw, 16, kc, vc, bt) for kw in kws if not over(budget)]
    summary[shape]["var16"] = entry(prow[0] if prow else None, prow[1:], uni and uni["gbs"],
                                    "default, uniform lengths")


def copy_ceiling():
    return pu.copy_ceiling(DEV, bench, 20)


def table(summary, ceiling):
    out = [f"copy ceiling {ceiling:.0f} GB/s; {len(ROWS)} rows; {len(ERRORS)} failures; {time.time() - T0:.0f} s",
           f"{'shape':22} {'case':7} {'default':>8} {'best':>6} {'ref':>6} {'x ref':>6}  best plan (ref)"]
    for shape, ents in summary.items():
        for case, e in ents.items():
            gkey = "graph_gbs" if case == "graph" else "gbs"
            d, b, ref = e.get("default"), e.get("best"), e.get("ref_gbs")
            dg = d[gkey] if d and d.get(gkey) else float("nan")
            bg = b[gkey] if b and b.get(gkey) else float("nan")
            x = bg / ref if ref else float("nan")
            out.append(f"{shape:22} {case:7} {dg:8.0f} {bg:6.0f} {(ref or float('nan')):6.0f} {x:6.3f}  "
                       f"{b['plan'] if b else '-'} ({e['ref']})")
    out.append("GB/s of K and V read once (valid keys for var). Goals: dense and graph >= 1.0 x cuDNN; page16 / page256"
               " >= 0.95 x our best dense; var >= 0.85 x the default at uniform lengths")
    out += ["FAIL " + e[:220] for e in ERRORS[-8:]]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="probe_out")
    ap.add_argument("--budget", type=float, default=112.0, help="seconds after which remaining variants are skipped")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU, kernels in Triton's interpreter")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    global DEV, GOAL, TILES, PAGED_TILES, SPLITS, CHECK_S
    if a.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        DEV, CHECK_S = "cpu", (256, 256)
        GOAL = [(2, 4, 4, 512), (1, 4, 4, 1024), (2, 8, 2, 512), (3, 8, 2, 256)]
        TILES, PAGED_TILES, SPLITS = [(16, 4, 1), (32, 4, 1)], [(16, 4, 1)], [1, 2, 3]
    import triton

    gen = torch.Generator().manual_seed(26)
    torch.manual_seed(26)
    ceiling = copy_ceiling()
    name = torch.cuda.get_device_name() if DEV == "cuda" else "cpu"
    log(f"{name} torch {torch.__version__} triton {triton.__version__}; copy {ceiling:.0f}")
    summary, checked = {}, {}
    # dense gets the first 50 % of the budget, paged up to 80 %, variable lengths the rest
    sections = [(dense_section, GOAL, 0.5), (paged_section, GOAL, 0.8), (varlen_section, GOAL[2:] + GOAL[:1], 1.0)]
    for fn, shapes, share in sections:
        for B, H, Hkv, S in shapes:
            try:
                fn(B, H, Hkv, S, gen, checked, a.budget * share, summary)
            except Exception as e:
                ERRORS.append(f"{fn.__name__} {B, H, Hkv, S}: {err_lines(e)}")
                log("  FAIL", ERRORS[-1])
            torch.cuda.empty_cache()
    text = table(summary, ceiling)
    with open(os.path.join(a.out, "probe_decode.json"), "w") as f:
        json.dump(dict(device=name, torch=torch.__version__, triton=triton.__version__,
                       ceiling_gbs=ceiling, seconds=time.time() - T0, rows=ROWS, errors=ERRORS,
                       checked={str(k): v for k, v in checked.items()},
                       summary={sh: {c: {k: (v.get("impl") if isinstance(v, dict) else v) for k, v in e.items()}
                                     for c, e in ents.items()} for sh, ents in summary.items()}),
                  f, indent=1, default=str)
    log("\n" + text)
    return 0 if math.isfinite(ceiling) else 1


if __name__ == "__main__":
    main()
