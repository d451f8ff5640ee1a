"""Probe of ``sample`` on the H200 (issue 28): the default plan (step 1 its own launch, fp32 masses, torch.rand)
against its variants, beside ``softmax_topk`` alone and torch's chain, with the host path of
``topk/sampling_launch.py`` (bound ``SampleCall``, raw C launches). Variants (``SampleKnobs``):

* ``fixed``: mass="fixed" (step 1 sums p in int64 fixed point: the same bits in every layout);
* ``fused``: fuse=True + mass="fixed" (step 1 in the last top-k merge's epilogue; must be bit-equal to ``fixed``);
* ``kdraw``: draw="kernel" (eager: u by Philox in the kernel from the generator's seed / offset, no torch.rand;
  a graph capture keeps torch.rand);
* ``both``: fuse + fixed + kernel draw;
* ``kd1buf``: kernel draw + one_buffer=True (ids and logprobs views of one allocation: host time only).

    PYTHONPATH=src python tools/probe_sample.py --out DIR

1. checks, first fp32 only (then bf16 and the rest after the first timings, budget permitting), B = 8 x V =
   128256: ids equal to the fp64 reference's inverse-CDF draw for the given ``uniform=`` (a row whose u lies
   within 2e-6 of a CDF step is drawn again with u in the middle of its largest kept token's step and checked
   strictly; "inconclusive", not WRONG, only where that step too is narrower), log-probabilities to 2e-5, outputs
   poisoned (-7 / NaN) before the call; ``fused`` bit-equal to ``fixed`` (``both`` to fixed + kernel draw, same
   generator seed); a CUDA graph with per-row tensors changed between replays equals the eager call. Kernel draw:
   the ids equal those of ``uniform=`` the Python Philox of (seed, offset, row), for a ``torch.Generator("cuda")``
   (device ``cuda``, no index: the H200 bug), a ``"cuda:0"`` one and the default generator, on peaked and flat
   rows; χ² of 200000 draws of a 64-token row against the exact
   distribution; the same ids for the same seed; a captured call draws anew on each replay. A wrong or failing
   variant is reported and not timed (a late check's failure marks its rows).
2. times at B = 8 and 1 fp32 first, then B = 64, 256 fp32, then bf16 while the budget lasts, T = 0.8, top_k = 50,
   top_p = 0.9: eager per call
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

from onlinesoftmax.reference import philox_uniform, sample_distribution, sample_draw
from onlinesoftmax.topk import sample, softmax_topk
from onlinesoftmax.topk.plan import SampleKnobs

V = 128256
ROWS = [(torch.float32, 8), (torch.float32, 1), (torch.float32, 64), (torch.float32, 256), (torch.bfloat16, 8),
        (torch.bfloat16, 1), (torch.bfloat16, 64), (torch.bfloat16, 256)]
T, K, P = 0.8, 50, 0.9
EAGER_CALLS = 600
GRAPH_CALLS = 20
BUDGET_S = 85           # no new row or late check starts past this (the probe must end under 100 s)
VARIANTS = {"default": SampleKnobs(fuse=False), "fixed": SampleKnobs(mass="fixed"),
            "fused": SampleKnobs(fuse=True, mass="fixed"), "kdraw": SampleKnobs(draw="kernel"),
            "both": SampleKnobs(fuse=True, mass="fixed", draw="kernel"),
            "kd1buf": SampleKnobs(draw="kernel", one_buffer=True)}
EQUAL_TO = {"fused": "fixed", "both": "fixed", "kd1buf": "default"}     # bit-equal partners (same uniforms)
KDRAW = ("kdraw", "both", "kd1buf")
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
    """(bad rows, inconclusive rows) of sample(x, uniform=u, **kw) against the fp64 reference. A row whose u lies
    within ``gap`` of a step of its CDF (flat bf16 rows of 128K tokens: p ~ 8e-6 a token) is drawn again with u at
    the middle of its largest kept token's step (p_max / 2 from either edge) and checked strictly; it is
    inconclusive only where even that step is narrower than 2 gap."""
    B = x.shape[0]
    xs = x.double().cpu().numpy()
    probs = []
    for r in range(B):
        def per_row(v, cast=float):
            return None if v is None else cast(v[r]) if isinstance(v, torch.Tensor) else v
        probs.append((per_row(kw.get("temperature", 1.0)),
                      sample_distribution(xs[r], per_row(kw.get("temperature", 1.0)), per_row(kw.get("top_k"), int),
                                          per_row(kw.get("top_p")), per_row(kw.get("min_p")))))
    bad, near = [], []
    rows = range(B)
    for attempt in range(2):
        ids, logp = _poisoned_call(lambda: sample(x, uniform=u, knobs=knobs, **kw), B)
        ids, logp, uc = ids.cpu().numpy(), logp.cpu().numpy(), u.cpu().numpy()
        again = []
        for r in rows:
            t, pr = probs[r]
            want, dist = sample_draw(pr, float(uc[r]))
            got = int(ids[r])
            if not (0 <= got < V) or pr[got] <= 0:
                bad.append((r, got, "not kept"))
                continue
            if dist <= gap:
                again.append(r)
            elif got != want:
                bad.append((r, got, want))
            lp = 0.0 if t == 0 else math.log(pr[got])
            if not abs(float(logp[r]) - lp) <= 2e-5 + 2e-5 * abs(lp):
                bad.append((r, "logp", float(logp[r]), lp))
        if not again or attempt:
            near = again
            break
        u = u.clone()
        for r in again:                 # the middle of the largest kept step: u' = cdf(i) - p_i / 2
            pr = probs[r][1]
            i = int(np.argmax(pr))
            u[r] = float(np.cumsum(pr)[i] - pr[i] / 2)
        rows = again
    return bad, len(near)


def kdraw_checks(name, knobs) -> bool:
    """The kernel draw: Philox's u, χ², reproducibility, graph replays draw anew; ``both`` bit-equal to fixed +
    kernel draw for the same seed."""
    from onlinesoftmax.reference import sample_distribution

    ok = True
    B = 8
    x = _logits(B, torch.float32)
    kw = dict(temperature=T, top_k=K, top_p=P)
    try:
        g = torch.Generator(device=DEV).manual_seed(1234)
        g.set_offset(4 * 7)
        ids, logp = _poisoned_call(lambda: sample(x, generator=g, knobs=knobs, **kw), B)
        u = torch.tensor([philox_uniform(1234, 28, r) for r in range(B)], device=DEV)
        ui, ul = sample(x, uniform=u, knobs=knobs, **kw)
        if not (torch.equal(ids, ui) and torch.equal(logp, ul)) or g.get_offset() != 32:
            ok = False
            say(f"  WRONG {name}: kernel draw != uniform= Philox u ({ids.tolist()} vs {ui.tolist()}), offset "
                f"{g.get_offset()}")
        # flat rows (every u matters) with a "cuda:0" generator and the default one (generator=None)
        y = _logits(B, torch.float32, "flat")
        for gname, gen in (("cuda:0", torch.Generator(device="cuda:0").manual_seed(77)), ("default", None)):
            gd = gen if gen is not None else torch.cuda.default_generators[torch.cuda.current_device()]
            seed, off = gd.initial_seed(), gd.get_offset()
            ids, logp = _poisoned_call(lambda: sample(y, generator=gen, knobs=knobs, **kw), B)
            u = torch.tensor([philox_uniform(seed, off, r) for r in range(B)], device=DEV)
            ui, ul = sample(y, uniform=u, knobs=knobs, **kw)
            if not (torch.equal(ids, ui) and torch.equal(logp, ul)) or gd.get_offset() != off + 4:
                ok = False
                say(f"  WRONG {name}: kernel draw ({gname} generator) != uniform= Philox u ({ids.tolist()} vs "
                    f"{ui.tolist()}), offset {gd.get_offset()} from {off}")
        a = sample(x, generator=torch.Generator(device=DEV).manual_seed(5), knobs=knobs, **kw)
        b = sample(x, generator=torch.Generator(device=DEV).manual_seed(5), knobs=knobs, **kw)
        if not (torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])):
            ok = False
            say(f"  WRONG {name}: same seed, other ids")
        if name in EQUAL_TO:
            ref = SampleKnobs(mass=knobs.mass, draw="kernel")
            c = sample(x, generator=torch.Generator(device=DEV).manual_seed(5), knobs=ref, **kw)
            if not (torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])):
                ok = False
                say(f"  WRONG {name}: not bit-equal to fixed + kernel draw")
        # chi-square: 200000 draws of one 64-token row, T = 0.9, top_k = 20, top_p = 0.95
        row = torch.randn(64, device=DEV) * 1.5
        n = 200000
        xs = row.expand(n, -1).contiguous()
        ids = sample(xs, temperature=0.9, top_k=20, top_p=0.95, knobs=knobs,
                     generator=torch.Generator(device=DEV).manual_seed(11))[0].cpu().numpy()
        probs = sample_distribution(row.double().cpu().numpy(), 0.9, 20, 0.95, None)
        cnt = np.bincount(ids, minlength=64)
        exp = probs * n
        keep = exp > 0
        chi2 = float((((cnt - exp) ** 2)[keep] / exp[keep]).sum())
        dof = int(keep.sum()) - 1
        z = (chi2 - dof) / math.sqrt(2 * dof)
        if cnt[~keep].sum() or z > 5:
            ok = False
            say(f"  WRONG {name}: chi2 {chi2:.1f} dof {dof} (z {z:.1f}), {int(cnt[~keep].sum())} draws not kept")
        else:
            say(f"  {name} chi2 {chi2:.1f} dof {dof} z {z:.2f}")
        # a captured call (torch.rand under capture) draws anew on every replay
        y = _logits(64, torch.float32, "flat")
        sample(y, top_k=K, knobs=knobs)
        torch.cuda.synchronize()
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            gi, _ = sample(y, top_k=K, knobs=knobs)
        seen = set()
        for _ in range(4):
            gr.replay()
            torch.cuda.synchronize()
            seen.add(tuple(gi.tolist()))
        if len(seen) != 4:
            ok = False
            say(f"  WRONG {name}: graph replays repeat draws ({len(seen)} distinct of 4)")
    except Exception as e:
        ok = False
        err(name, "kernel draw", e)
    return ok


def checks(name, knobs, dtypes=(torch.float32,), late=False) -> bool:
    ok = True
    B = 8
    if name in KDRAW and not late:
        ok = kdraw_checks(name, knobs)
    cases = [dict(temperature=T, top_k=K, top_p=P), dict(top_k=K),
             dict(temperature=1.3, top_k=K, top_p=0.95, min_p=0.05)]
    if late:
        cases = [dict(temperature=0.0), dict(top_k=1)] if dtypes == (torch.float32,) else cases + [
            dict(temperature=0.0), dict(top_k=1)]
    ref_check = name in ("default", "fixed")
    for dtype in dtypes:
        for kind in ("peaked", "flat"):
            x = _logits(B, dtype, kind)
            u = torch.rand(B, device=DEV)
            rows_t = dict(temperature=torch.rand(B, device=DEV) + 0.3, top_k=K, top_p=torch.rand(B, device=DEV) * 0.9
                          + 0.1, min_p=torch.rand(B, device=DEV) * 0.05)
            rows_t["temperature"][0] = 0.0
            extra = [rows_t] + ([dict(top_p=P)] if name in ("default", "kdraw") else []) if not late or \
                dtype != torch.float32 else []
            for kw in cases + extra:
                label = f"{str(dtype)[6:]} {kind} {sorted(k for k in kw)} "
                try:
                    if ref_check:
                        bad, near = check_ref(x, u, kw, knobs)
                        if bad:
                            ok = False
                            say(f"  WRONG {name} {label}: {bad[:3]} near={near}")
                        elif near:
                            say(f"  inconclusive {name} {label}: {near} rows within 2e-6 of a CDF step")
                    partner = EQUAL_TO.get(name, "default")
                    if name != "default":
                        a = _poisoned_call(lambda: sample(x, uniform=u, knobs=knobs, **kw), B)
                        b = sample(x, uniform=u, knobs=VARIANTS[partner], **kw)
                        if not (torch.equal(a[0], b[0]) and torch.equal(a[1].nan_to_num(-9), b[1].nan_to_num(-9))):
                            strict = name in EQUAL_TO or name == "kdraw"      # fixed vs default: rounding only
                            ok = ok and not strict
                            diff = "ids" if not torch.equal(a[0], b[0]) else "logprobs only"
                            say(f"  {'WRONG' if strict else 'note'} {name} {label}: not bit-equal to {partner} "
                                f"({diff})")
                except Exception as e:
                    ok = False
                    err(name, label, e)
    if late:
        say(f"late check {name} {[str(d)[6:] for d in dtypes]}: {'ok' if ok else 'WRONG'} ({time.time() - T0:.0f} s)")
        return ok
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


def time_row(dtype, B, good, res):
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
        if B == 8:
            row["torch chain eager"] = eager_us(torch_chain, sets, 100)
    except Exception as e:
        err("peers", f"B={B}", e)
    res["rows"].append(row)
    say(f"{row['dtype']} B={B}: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items() if isinstance(v, float))
        + f" ({time.time() - T0:.0f} s)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, checks={}, late_checks={}, rows=[],
               host={})
    x4 = torch.randn(4, 1024, device=DEV)
    res["host"]["torch.softmax 4x1024 eager us"] = eager_us(lambda x: torch.softmax(x, -1), [x4], 2000)
    res["host"]["torch.rand + 2 empty us"] = eager_us(
        lambda x: (torch.rand(8, device=DEV), torch.empty(8, device=DEV, dtype=torch.int64),
                   torch.empty(8, device=DEV)), [x4], 2000)
    res["host"]["torch.empty(12) us"] = eager_us(lambda x: torch.empty(12, device=DEV, dtype=torch.int64), [x4], 2000)
    say(f"host: {res['host']}")
    good = {}
    for name, knobs in VARIANTS.items():
        try:
            good[name] = checks(name, knobs)
        except Exception as e:
            err(name, "checks", e)
            good[name] = False
        res["checks"][name] = good[name]
    late = [(name, (torch.float32,)) for name in VARIANTS] + [(name, (torch.bfloat16,)) for name in VARIANTS]
    for i, (dtype, B) in enumerate(ROWS):
        if time.time() - T0 > BUDGET_S:
            say(f"budget: stopping before {str(dtype)[6:]} B={B}")
            break
        time_row(dtype, B, good, res)
        if i == 1:          # after the goal rows: the remaining checks while the budget lasts
            for name, dts in late:
                if time.time() - T0 > BUDGET_S - 10:
                    say(f"budget: late check {name} {dts} not run")
                    continue
                if good[name]:
                    ok = checks(name, VARIANTS[name], dts, late=True)
                    res["late_checks"][f"{name} {str(dts[0])[6:]}"] = ok
                    if not ok:
                        good[name] = False
                        res["checks"][name] = "WRONG in a late check (its timed rows above are void)"
    with open(os.path.join(args.out, "probe_sample.json"), "w") as f:
        json.dump(res, f, indent=1)
    names = list(VARIANTS)
    cols = ["softmax_topk graph", *(f"{n} graph" for n in names), *(f"{n} ratio" for n in names),
            "softmax_topk eager", *(f"{n} eager" for n in names), "top_p only graph", "top_p only eager",
            "torch chain eager"]
    short = ["stk g", *(f"{n[:5]} g" for n in names), *(f"{n[:5]} r" for n in names), "stk e",
             *(f"{n[:5]} e" for n in names), "topp g", "topp e", "torch e"]
    say("")
    say(f"probe_sample  V = {V}, T = {T}, top_k = {K}, top_p = {P}; us per call (graph: do_bench median of replays "
        f"/ calls; eager: mean of {EAGER_CALLS}); r = sample graph / softmax_topk graph (goal <= 1.3 at fp32 B=8; "
        f"eager goal <= 25 us); variants: default, fixed (mass), fused (+fixed), kdraw (Philox in kernel, eager), "
        f"both")
    say(f"checks: {res['checks']}  late: {res['late_checks']}")
    say("host: " + ", ".join(f"{k} {v:.2f}" for k, v in res["host"].items()))
    say(f"{'dtype':9}{'B':>4} " + "".join(f"{s:>8}" for s in short))
    for row in res["rows"]:
        say(f"{row['dtype']:9}{row['B']:>4} " + "".join(f"{row[c]:8.2f}" if c in row else f"{'-':>8}" for c in cols))
    say(f"total {time.time() - T0:.0f} s")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
