"""Probe of ``sample`` under CUDA-graph replay (issue 28): the default (fused merge, fixed masses, the kernel's
draw eager and captured: ``graph_draw="kernel"``, no ``torch.rand`` node per replay) against a captured
``torch.rand`` (``SampleKnobs(graph_draw="torch")``, the default before) and ``softmax_topk`` alone, in one process.
Reuses tools/probe_sample.py's harness (imported). Each variant's captured kernels are compiled before its capture
by ``sampling._warm_capture_draw`` (as ``onlinesoftmax.warmup`` does).

    PYTHONPATH=src python tools/probe_sample3.py --out DIR

Variants: ``default`` (SampleKnobs()), ``gtorch`` (graph_draw="torch"). 1. checks of ``default`` at 8 x 128256 fp32:
a call captured with a generator at (seed 1234, offset 28), replayed 6 times with per-row temperature / top_p /
min_p changed in place before each replay (ids poisoned before each), with ``set_sync_debug_mode("error")`` around
capture and replays: replay n equals the eager call with ``uniform=`` the Python Philox at (seed, 28 + 4n, row) (so
distinct uniforms per replay), the generator's offset moved by 4·2^32 at capture; χ² of 8 replays of 25000 copies
of a 64-token row. 2. graph replay (do_bench median of a 20-call graph over inputs rotated past L2) and eager µs
per call at B = 1 / 8 / 64 / 256, V = 128256 (then B = 8 at V = 151936 / 262144 while the budget lasts), T = 0.8,
top_k = 50, top_p = 0.9; ratio = sample graph / softmax_topk graph (goal <= 1.3 at B = 8). 3. DIR/probe_sample3.json,
the table last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import probe_sample as PS
import torch

from onlinesoftmax.reference import philox_uniform, sample_distribution
from onlinesoftmax.topk import sample, softmax_topk
from onlinesoftmax.topk.plan import SampleKnobs, sample_graph_draw_of
from onlinesoftmax.topk.sampling import _warm_capture_draw

T, K, P = PS.T, PS.K, PS.P
VARIANTS = {"default": SampleKnobs(), "gtorch": SampleKnobs(graph_draw="torch")}
SHAPES = [(1, 128256), (8, 128256), (64, 128256), (256, 128256), (8, 151936), (8, 262144)]
BUDGET_S = 120
T0 = time.time()
DEV = "cuda"
say, err = PS.say, PS.err


def _logits(B, Vn, kind="peaked"):
    x = torch.randn(B, Vn, device=DEV)
    if kind == "peaked":
        x.scatter_add_(1, torch.randint(0, Vn, (B, 20), device=DEV), 8 + 4 * torch.rand(B, 20, device=DEV))
    return x


def graph_draw_checks(name, knobs) -> bool:
    ok = True
    B, seed, off, R = 8, 1234, 28, 6
    try:
        x = _logits(B, PS.V, "flat")
        t, p, q = (torch.full((B,), 0.8, device=DEV), torch.full((B,), 0.9, device=DEV),
                   torch.zeros(B, device=DEV))
        kw = dict(temperature=t, top_k=K, top_p=p, min_p=q)
        g = torch.Generator(device=DEV).manual_seed(seed)
        _warm_capture_draw(x, knobs=knobs, **kw)
        g.set_offset(off)
        gr = torch.cuda.CUDAGraph()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.cuda.graph(gr):
                gi, gl = sample(x, generator=g, knobs=knobs, **kw)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        if g.get_offset() != off + (4 << 32):
            ok = False
            say(f"  WRONG {name}: generator offset {g.get_offset()} after capture, want {off + (4 << 32)}")
        seen = set()
        for n in range(R):
            t.copy_(torch.rand(B, device=DEV) + 0.3)
            t[0] = 0.0
            p.copy_(torch.rand(B, device=DEV) * 0.9 + 0.1)
            q.copy_(torch.rand(B, device=DEV) * 0.05)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                gi.fill_(-7)
                gr.replay()
            finally:
                torch.cuda.set_sync_debug_mode(0)
            u = torch.tensor([philox_uniform(seed, off + 4 * n, r) for r in range(B)], device=DEV)
            ei, el = sample(x, uniform=u, knobs=knobs, **kw)
            torch.cuda.synchronize()
            seen.add(tuple(u.tolist()))
            if not (torch.equal(gi, ei) and torch.equal(gl.nan_to_num(-9), el.nan_to_num(-9))):
                ok = False
                say(f"  WRONG {name}: replay {n} != eager with the Philox u of counter base + {n} "
                    f"({gi.tolist()} vs {ei.tolist()})")
                break
        # χ²: 8 replays of 25000 copies of a 64-token row
        row = torch.randn(64, device=DEV) * 1.5
        n_rows, reps = 25000, 8
        xs = row.expand(n_rows, -1).contiguous()
        _warm_capture_draw(xs, knobs=knobs, temperature=0.9, top_k=20, top_p=0.95)
        g2 = torch.Generator(device=DEV).manual_seed(11)     # a generator cannot be made during a capture
        gr2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr2):
            ci, _ = sample(xs, temperature=0.9, top_k=20, top_p=0.95, knobs=knobs, generator=g2)
        ids, firsts = [], set()
        for _ in range(reps):
            gr2.replay()
            torch.cuda.synchronize()
            ids.append(ci.cpu().numpy().copy())
            firsts.add(tuple(ids[-1][:64].tolist()))
        if len(firsts) != reps:
            ok = False
            say(f"  WRONG {name}: replays repeat draws ({len(firsts)} distinct of {reps})")
        ids = np.concatenate(ids)
        probs = sample_distribution(row.double().cpu().numpy(), 0.9, 20, 0.95, None)
        cnt, exp = np.bincount(ids, minlength=64), probs * ids.size
        keep = exp > 0
        chi2 = float((((cnt - exp) ** 2)[keep] / exp[keep]).sum())
        dof = int(keep.sum()) - 1
        z = (chi2 - dof) / math.sqrt(2 * dof)
        if cnt[~keep].sum() or z > 5:
            ok = False
            say(f"  WRONG {name}: replays' chi2 {chi2:.1f} dof {dof} (z {z:.1f}), {int(cnt[~keep].sum())} not kept")
        else:
            say(f"  {name} replays' chi2 {chi2:.1f} dof {dof} z {z:.2f}")
    except Exception as e:
        ok = False
        err(name, "graph draw", e)
    return ok


def time_shape(B, Vn, good, res):
    n_sets = max(2, min(16, -(-2 * 60 * 2**20 // (B * Vn * 4))))
    sets = [_logits(B, Vn) for _ in range(n_sets)]
    row = dict(B=B, V=Vn)
    try:
        row["softmax_topk graph"] = PS.graph_us(lambda x: softmax_topk(x, K), sets)
        row["softmax_topk eager"] = PS.eager_us(lambda x: softmax_topk(x, K), sets)
    except Exception as e:
        err("softmax_topk", f"B={B} V={Vn}", e)
    for name, knobs in VARIANTS.items():
        if not good.get(name):
            continue

        def fn(x, knobs=knobs):
            return sample(x, temperature=T, top_k=K, top_p=P, knobs=knobs)
        try:
            _warm_capture_draw(sets[0], knobs=knobs, temperature=T, top_k=K, top_p=P)
            row[f"{name} graph"] = PS.graph_us(fn, sets)
            if name == "default":       # eager: gtorch's eager launches are the default's
                row[f"{name} eager"] = PS.eager_us(fn, sets)
            if row.get("softmax_topk graph"):
                row[f"{name} ratio"] = row[f"{name} graph"] / row["softmax_topk graph"]
        except Exception as e:
            err(name, f"B={B} V={Vn}", e)
    res["rows"].append(row)
    say(f"B={B} V={Vn}: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items() if isinstance(v, float))
        + f" ({time.time() - T0:.0f} s)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, checks={}, rows=[])
    good = {}
    for name, knobs in VARIANTS.items():
        try:
            ok = graph_draw_checks(name, knobs) if sample_graph_draw_of(knobs) == "kernel" else True
        except Exception as e:
            err(name, "checks", e)
            ok = False
        good[name] = res["checks"][name] = ok
        say(f"check {name}: {'ok' if ok else 'WRONG'} ({time.time() - T0:.0f} s)")
    for B, Vn in SHAPES:
        if time.time() - T0 > BUDGET_S:
            say(f"budget: stopping before B={B} V={Vn}")
            break
        time_shape(B, Vn, good, res)
    with open(os.path.join(args.out, "probe_sample3.json"), "w") as f:
        json.dump(res, f, indent=1)
    names = list(VARIANTS)
    cols = ["softmax_topk graph", *(f"{n} graph" for n in names), *(f"{n} ratio" for n in names),
            "softmax_topk eager", "default eager"]
    short = ["stk g", *(f"{n[:6]} g" for n in names), *(f"{n[:6]} r" for n in names), "stk e", "dflt e"]
    say("")
    say(f"probe_sample3  T = {T}, top_k = {K}, top_p = {P}, fp32; us per call (g: graph replay, do_bench median / "
        f"calls; e: eager mean); r = sample graph / softmax_topk graph (goal <= 1.3 at B = 8); default = fuse + "
        f"fixed + kernel draw eager and captured; gtorch = torch.rand captured")
    say(f"checks: {res['checks']}")
    say(f"{'B':>4}{'V':>8} " + "".join(f"{s:>9}" for s in short))
    for row in res["rows"]:
        say(f"{row['B']:>4}{row['V']:>8} " + "".join(f"{row[c]:9.2f}" if c in row else f"{'-':>9}" for c in cols))
    say(f"total {time.time() - T0:.0f} s")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
