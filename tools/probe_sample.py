"""Probe of ``sample`` on the H200 (issue 28): the default plan (step 1 its own launch) against the fused variant
(step 1 in the last top-k merge's epilogue: ``SampleKnobs(fuse=True)``), beside ``softmax_topk`` alone and torch's
chain, with the host path of ``topk/sampling_launch.py`` (bound ``SampleCall``, raw C launches).

    PYTHONPATH=src python tools/probe_sample.py --out DIR

1. checks, per variant, on fresh logits (fp32 and bf16, B = 8 x V = 128256): ids equal to the fp64 reference's
   inverse-CDF draw for the given ``uniform=`` (rows whose u lies within 2e-6 of a CDF step only checked to draw a
   kept token), log-probabilities to 2e-5, outputs poisoned (-7 / NaN) before the call; the fused and the default
   variant bit-equal; a CUDA graph of the call with per-row tensors changed between replays equals the eager call.
   A wrong or failing variant is reported and not timed.
2. times at B in {1, 8, 64, 256} x V = 128256, fp32 and bf16, T = 0.8, top_k = 50, top_p = 0.9: eager per call
   (mean over EAGER_CALLS calls after warm-up, perf_counter around the loop, one sync at the end: what a decode
   loop pays, host- or device-bound), graph replay per call (do_bench median of a graph of GRAPH_CALLS calls over
   input sets rotated past the 60 MB L2), the same for ``softmax_topk(x, 50)`` alone; the ratio sample graph /
   softmax_topk graph (goal <= 1.3 at 8 x 128256 fp32) and eager (goal <= 25 us). Also: top_p = 0.9 alone (default
   only), torch's chain eager, and the host's own speed (torch.softmax 4 x 1024 eager, torch.rand + 2 empty).
3. writes DIR/probe_sample.json and prints the table last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import traceback

import numpy as np
import torch

from onlinesoftmax.reference import sample_distribution, sample_draw
from onlinesoftmax.topk import sample, softmax_topk
from onlinesoftmax.topk.plan import SampleKnobs

V = 128256
BATCHES = (1, 8, 64, 256)
DTYPES = (torch.float32, torch.bfloat16)
T, K, P = 0.8, 50, 0.9
EAGER_CALLS = 600
GRAPH_CALLS = 20
BUDGET_S = 140
VARIANTS = {"default": SampleKnobs(fuse=False), "fused": SampleKnobs(fuse=True)}
T0 = time.time()
DEV = "cuda"


def say(*a):
    print(*a, flush=True)


def err(name, what, e):
    lines = [ln for ln in (traceback.format_exception_only(type(e), e)[-1]).strip().splitlines() if ln]
    say(f"  FAIL {name} {what}: " + " | ".join(lines[:3])[:500])


def _logits(B, dtype, kind="peaked"):
    x = torch.randn(B, V, device=DEV)
    if kind == "peaked":
        hot = torch.randint(0, V, (B, 20), device=DEV)
        x.scatter_add_(1, hot, 8 + 4 * torch.rand(B, 20, device=DEV))
    return x.to(dtype)


def _poisoned_call(fn, B):
    """fn() after freeing blocks of the outputs' sizes filled with -7 / NaN (the allocator hands them out again)."""
    a = torch.full((B,), -7, dtype=torch.int64, device=DEV)
    b = torch.full((B,), float("nan"), dtype=torch.float32, device=DEV)
    del a, b
    return fn()


def check_ref(x, u, kw, knobs, gap=2e-6):
    """(bad rows, near rows) of sample(x, uniform=u, **kw) against the fp64 reference."""
    ids, logp = _poisoned_call(lambda: sample(x, uniform=u, knobs=knobs, **kw), x.shape[0])
    ids, logp = ids.cpu().numpy(), logp.cpu().numpy()
    xs = x.double().cpu().numpy()
    bad, near = [], 0
    for r in range(x.shape[0]):
        def per_row(v, cast=float):
            return None if v is None else cast(v[r]) if isinstance(v, torch.Tensor) else v
        t = per_row(kw.get("temperature", 1.0))
        probs = sample_distribution(xs[r], t, per_row(kw.get("top_k"), int), per_row(kw.get("top_p")),
                                    per_row(kw.get("min_p")))
        want, dist = sample_draw(probs, float(u[r]))
        got = int(ids[r])
        if not (0 <= got < V) or probs[got] <= 0:
            bad.append((r, got, "not kept"))
            continue
        if dist > gap and got != want:
            bad.append((r, got, want))
        near += dist <= gap
        lp = 0.0 if t == 0 else math.log(probs[got])
        if not abs(float(logp[r]) - lp) <= 2e-5 + 2e-5 * abs(lp):
            bad.append((r, "logp", float(logp[r]), lp))
    return bad, near


def checks(name, knobs) -> bool:
    ok = True
    B = 8
    cases = [dict(temperature=T, top_k=K, top_p=P), dict(top_k=K), dict(temperature=0.0),
             dict(temperature=1.3, top_k=K, top_p=0.95, min_p=0.05), dict(top_k=1)]
    for dtype in DTYPES:
        for kind in ("peaked", "flat"):
            x = _logits(B, dtype, kind)
            u = torch.rand(B, device=DEV)
            rows_t = dict(temperature=torch.rand(B, device=DEV) + 0.3, top_k=K, top_p=torch.rand(B, device=DEV) * 0.9
                          + 0.1, min_p=torch.rand(B, device=DEV) * 0.05)
            rows_t["temperature"][0] = 0.0
            for kw in cases + [rows_t] + ([dict(top_p=P)] if name == "default" else []):
                label = f"{str(dtype)[6:]} {kind} {sorted(k for k in kw)} "
                try:
                    bad, near = check_ref(x, u, kw, knobs)
                    if bad or near > B // 2:
                        ok = False
                        say(f"  WRONG {name} {label}: {bad[:3]} near={near}")
                    if name != "default":
                        a = sample(x, uniform=u, knobs=knobs, **kw)
                        b = sample(x, uniform=u, knobs=VARIANTS["default"], **kw)
                        if not (torch.equal(a[0], b[0]) and torch.equal(a[1].nan_to_num(-9), b[1].nan_to_num(-9))):
                            ok = False
                            say(f"  WRONG {name} {label}: not bit-equal to the default")
                except Exception as e:
                    ok = False
                    err(name, label, e)
    try:       # a graph with per-row tensors changed between replays
        x = _logits(16, torch.float32)
        t, p = torch.full((16,), 0.8, device=DEV), torch.full((16,), 0.9, device=DEV)
        q, u = torch.zeros(16, device=DEV), torch.rand(16, device=DEV)
        kw = dict(temperature=t, top_k=K, top_p=p, min_p=q, uniform=u, knobs=knobs)
        sample(x, **kw)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            gi, gl = sample(x, **kw)
        for _ in range(3):
            t.copy_(torch.rand(16, device=DEV) + 0.3)
            t[0] = 0.0
            p.copy_(torch.rand(16, device=DEV) * 0.9 + 0.1)
            q.copy_(torch.rand(16, device=DEV) * 0.1)
            u.copy_(torch.rand(16, device=DEV))
            g.replay()
            ei, el = sample(x, **kw)
            torch.cuda.synchronize()
            if not (torch.equal(gi, ei) and torch.equal(gl, el)):
                ok = False
                say(f"  WRONG {name}: graph replay with changed per-row tensors differs from the eager call")
                break
    except Exception as e:
        ok = False
        err(name, "graph per-row", e)
    say(f"check {name}: {'ok' if ok else 'WRONG'} ({time.time() - T0:.0f} s)")
    return ok


def eager_us(fn, sets, calls=EAGER_CALLS):
    for i in range(20):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    n = len(sets)
    t0 = time.perf_counter()
    for i in range(calls):
        fn(sets[i % n])
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def graph_us(fn, sets):
    from triton.testing import do_bench

    calls = max(GRAPH_CALLS, len(sets))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for a in sets:
            fn(a)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in range(calls):
            fn(sets[c % len(sets)])
    g.replay()
    torch.cuda.synchronize()
    return do_bench(g.replay, warmup=5, rep=40, return_mode="median") * 1e3 / calls


def torch_chain(x):
    v, i = torch.topk(x.float() / T, K, dim=-1)
    q = torch.softmax(v, dim=-1)
    keep = (torch.cumsum(q, -1) - q) < P
    q = torch.where(keep, q, torch.zeros_like(q))
    return i.gather(-1, torch.multinomial(q, 1)).squeeze(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, checks={}, rows=[], host={})
    x4 = torch.randn(4, 1024, device=DEV)
    res["host"]["torch.softmax 4x1024 eager us"] = eager_us(lambda x: torch.softmax(x, -1), [x4], 2000)
    res["host"]["torch.rand + 2 empty us"] = eager_us(
        lambda x: (torch.rand(8, device=DEV), torch.empty(8, device=DEV, dtype=torch.int64),
                   torch.empty(8, device=DEV)), [x4], 2000)
    say(f"host: {res['host']}")
    good = {}
    for name, knobs in VARIANTS.items():
        try:
            good[name] = checks(name, knobs)
        except Exception as e:
            err(name, "checks", e)
            good[name] = False
        res["checks"][name] = good[name]
    for dtype in DTYPES:
        for B in BATCHES:
            if time.time() - T0 > BUDGET_S:
                say(f"budget: stopping before {str(dtype)[6:]} B={B}")
                break
            n_sets = max(2, min(16, -(-2 * 60 * 2**20 // (B * V * dtype.itemsize))))
            sets = [_logits(B, dtype) for _ in range(n_sets)]
            row = dict(dtype=str(dtype)[6:], B=B)
            try:
                row["softmax_topk graph"] = graph_us(lambda x: softmax_topk(x, K), sets)
                row["softmax_topk eager"] = eager_us(lambda x: softmax_topk(x, K), sets)
            except Exception as e:
                err("softmax_topk", f"B={B}", e)
            for name, knobs in VARIANTS.items():
                if not good[name]:
                    continue
                def fn(x, knobs=knobs):
                    return sample(x, temperature=T, top_k=K, top_p=P, knobs=knobs)
                try:
                    row[f"{name} eager"] = eager_us(fn, sets)
                    row[f"{name} graph"] = graph_us(fn, sets)
                    if row.get("softmax_topk graph"):
                        row[f"{name} ratio"] = row[f"{name} graph"] / row["softmax_topk graph"]
                except Exception as e:
                    err(name, f"{row['dtype']} B={B}", e)
            try:
                def top_p(x):
                    return sample(x, temperature=T, top_p=P)
                row["top_p only eager"] = eager_us(top_p, sets, 300)
                row["top_p only graph"] = graph_us(top_p, sets)
                row["torch chain eager"] = eager_us(torch_chain, sets, 200)
            except Exception as e:
                err("peers", f"B={B}", e)
            res["rows"].append(row)
            say(f"{row['dtype']} B={B}: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()
                                                      if isinstance(v, float)) + f" ({time.time() - T0:.0f} s)")
    with open(os.path.join(args.out, "probe_sample.json"), "w") as f:
        json.dump(res, f, indent=1)
    cols = ["softmax_topk graph", "default graph", "fused graph", "default ratio", "fused ratio", "softmax_topk eager",
            "default eager", "fused eager", "top_p only graph", "top_p only eager", "torch chain eager"]
    short = ["stk g", "def g", "fus g", "def r", "fus r", "stk e", "def e", "fus e", "topp g", "topp e", "torch e"]
    say("")
    say(f"probe_sample  V = {V}, T = {T}, top_k = {K}, top_p = {P}; us per call (graph: do_bench median of replays "
        f"/ calls; eager: mean of {EAGER_CALLS}); r = sample graph / softmax_topk graph (goal <= 1.3 at fp32 B=8; "
        f"eager goal <= 25 us)")
    say(f"checks: {res['checks']}   host: " + ", ".join(f"{k} {v:.2f}" for k, v in res["host"].items()))
    say(f"{'dtype':9}{'B':>5} " + "".join(f"{s:>8}" for s in short))
    for row in res["rows"]:
        say(f"{row['dtype']:9}{row['B']:>5} " + "".join(f"{row[c]:8.2f}" if c in row else f"{'-':>8}" for c in cols))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
