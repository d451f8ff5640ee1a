"""Probe: cross-entropy forward + backward with the chunk in shared memory (path "smem", ``losses/smem.py``) against
the current default plan, the copy ceiling and F.cross_entropy, on the H200.

    PYTHONPATH=src python tools/probe_ce.py --out DIR

N = 8192 bf16 logits × V ∈ {32000, 128256, 151936, 262144}, 10 % of targets = ignore_index (-100). For each V:
1. checks, on fresh random logits per variant: (a) the kernel alone (``kernels.ce_rows``) into NaN-poisoned dx,
   per-row loss and lse, against F.cross_entropy(x.float(), reduction="none") / logsumexp; (b) the public op's
   loss and x.grad (loss.backward()) against F.cross_entropy(x.float()) and its gradient; (c) the smem variants
   with weight + label smoothing + z_loss + softcap (reduction "sum") and with smoothing alone (reduction "none",
   a non-unit upstream gradient) against the library's torch path on logits.float(). A wrong or failing variant
   is reported and not timed; the others go on.
2. times, with triton.testing.do_bench medians (L2 flushed before every call; each logits tensor is 0.5-4.3 GB,
   far past the 60 MB L2): fwd + bwd (``x.grad = None; loss = ce(x, t); loss.backward()``) for the default plan,
   the smem variants and F.cross_entropy on bf16; the kernel alone (``ce_rows`` with outputs allocated once) for
   ours; ``x.clone()`` (the floor: read + write of the logits' bytes at copy speed).
3. writes DIR/probe_ce.json and prints the table last.

A variant whose programs deadlocked would hang the GPU: a watchdog ends the process after STEP_LIMIT_S seconds in
one step, with what was measured written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback

import torch
import torch.nn.functional as F

import onlinesoftmax as oss
from onlinesoftmax.losses import CEKnobs, explain
from onlinesoftmax.losses import kernels as K
from onlinesoftmax.losses.cross_entropy import _plan_for, _reduction_coefs

N = 8192
VOCABS = (128256, 32000, 262144, 151936)     # the goal shape first
IGNORE = -100
STEP_LIMIT_S = 40
BUDGET_S = 150                 # option checks (c) only in the first 60 %; no new V past 85 %
# name -> knobs (None: the default plan). smem = chunk / warps / register sub-tiles; "keep" = KEEP_E; "nr" = the
# register bound (plan: 64 with register sub-tiles; 0 = the compiler's)
VARIANTS = {
    "default": None,
    "smem 16K/4w/r4": CEKnobs(path="smem"),
    "smem 16K/4w/r4 keep": CEKnobs(path="smem", keep_e=True),
    "smem 16K/4w/r4 keep nr0": CEKnobs(path="smem", keep_e=True, maxnreg=0),
    "smem 8K/2w/r0": CEKnobs(path="smem", chunk=8192, num_warps=2, reg=0),
    "smem 32K/8w/r2 keep": CEKnobs(path="smem", chunk=32768, num_warps=8, reg=2, keep_e=True, maxnreg=0),
}
OPTION_SETS = (dict(weight=True, label_smoothing=0.1, z_loss=1e-4, softcap=30.0, reduction="sum"),
               dict(label_smoothing=0.05, reduction="none"))
OPTION_VARIANTS = ("smem 16K/4w/r4", "smem 16K/4w/r4 keep")

T0 = time.time()
RESULTS: dict = {"rows": [], "errors": [], "env": {}}
OUT = "."
_step = {"name": "start", "since": time.time()}


def _save():
    with open(os.path.join(OUT, "probe_ce.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)


def _watchdog():
    while True:
        time.sleep(1)
        if time.time() - _step["since"] > STEP_LIMIT_S:
            msg = f"HANG: step {_step['name']!r} ran past {STEP_LIMIT_S} s; exiting"
            print(msg, flush=True)
            RESULTS["errors"].append(msg)
            _save()
            _table()
            os._exit(3)


def _begin(name):
    _step["name"], _step["since"] = name, time.time()


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def _inputs(V, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(N, V, device="cuda", generator=g) * 2).bfloat16()
    t = torch.randint(0, V, (N,), device="cuda", generator=g)
    t[torch.rand(N, device="cuda", generator=g) < 0.1] = IGNORE
    return x, t


def _fail(V, name, what, e):
    lines = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()
    msg = f"V={V} {name} {what}: " + " | ".join(lines[:4])[:600]
    print("FAIL " + msg, flush=True)
    RESULTS["errors"].append(msg)


def check_kernel(V, name, knobs, seed):
    """(a) ce_rows alone into poisoned outputs, against fp32 torch per row."""
    x, t = _inputs(V, seed)
    plan = _plan_for(x, True, knobs)
    coef = _reduction_coefs(t, None, IGNORE, "sum", V)
    loss = torch.full((N,), float("nan"), device="cuda")
    lse = torch.full((N,), float("nan"), device="cuda")
    dx = torch.full_like(x, float("nan"))
    K.ce_rows(plan, x, t, None, coef, loss, lse, dx, None, IGNORE, 0.0, 0.0, None)
    torch.cuda.synchronize()
    xf = x.float().requires_grad_()
    ref = F.cross_entropy(xf, t, ignore_index=IGNORE, reduction="none")
    ref.sum().backward()
    kept = t != IGNORE
    errs = {"loss": _rel(loss, ref.detach()), "lse": _rel(lse[kept], torch.logsumexp(x.float(), -1)[kept]),
            "dx": _rel(dx, xf.grad), "dx nan": int(torch.isnan(dx).sum()),
            "ignored dx != 0": int((dx[~kept] != 0).sum())}
    ok = errs["loss"] < 1e-5 and errs["lse"] < 1e-5 and errs["dx"] < 8e-3 and not errs["dx nan"] \
        and not errs["ignored dx != 0"]
    return ok, errs, plan


def check_op(V, name, knobs, seed):
    """(b) the public op, loss.backward(), against F.cross_entropy on logits.float()."""
    x, t = _inputs(V, seed)
    xl = x.clone().requires_grad_()
    poison = torch.full_like(x, float("nan"))      # the op's dx likely reuses this block: unwritten stays NaN
    del poison
    loss = oss.cross_entropy(xl, t, ignore_index=IGNORE, knobs=knobs)
    loss.backward()
    xf = x.float().requires_grad_()
    ref = F.cross_entropy(xf, t, ignore_index=IGNORE)
    ref.backward()
    errs = {"loss": _rel(loss.detach(), ref.detach()), "grad": _rel(xl.grad, xf.grad),
            "grad nan": int(torch.isnan(xl.grad).sum())}
    return errs["loss"] < 1e-5 and errs["grad"] < 8e-3 and not errs["grad nan"], errs


def check_options(V, name, knobs, seed, opts):
    """(c) weight / smoothing / z_loss / softcap / reductions against the library's torch path in fp32."""
    n = 1024
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(n, V, device="cuda", generator=g) * 3).bfloat16()
    x[0, :5] = 1e4
    t = torch.randint(0, V, (n,), device="cuda", generator=g)
    t[t % 10 == 3] = IGNORE
    t[1] = 8
    opts = dict(opts)
    if opts.pop("weight", False):
        opts["weight"] = torch.rand(V, device="cuda", generator=g) + 0.5
    xl = x.clone().requires_grad_()
    loss = oss.cross_entropy(xl, t, knobs=knobs, **opts)
    up = torch.rand_like(loss) + 0.5                # a non-unit upstream gradient: the backward's scale runs
    (loss * up).sum().backward()
    xf = x.float().requires_grad_()
    ref = oss.cross_entropy(xf, t, backend="torch", **opts)
    (ref * up).sum().backward()
    errs = {"loss": _rel(loss.detach(), ref.detach()), "grad": _rel(xl.grad, xf.grad),
            "grad nan": int(torch.isnan(xl.grad).sum())}
    return errs["loss"] < 1e-5 and errs["grad"] < 8e-3 and not errs["grad nan"], errs


def bench(fn):
    from triton.testing import do_bench
    return do_bench(fn, warmup=20, rep=80, return_mode="median")


def time_variants(V, names):
    x, t = _inputs(V, 1234)
    xl = x.clone().requires_grad_()
    del x
    out = {}

    def fwd_bwd(knobs):
        def run():
            xl.grad = None
            oss.cross_entropy(xl, t, ignore_index=IGNORE, knobs=knobs).backward()
        return run

    def kernel_only(knobs):
        plan = _plan_for(xl.detach(), True, knobs)
        coef = _reduction_coefs(t, None, IGNORE, "mean", V)
        loss, lse = torch.empty(N, device="cuda"), torch.empty(N, device="cuda")
        dx = torch.empty_like(xl)
        return lambda: K.ce_rows(plan, xl.detach(), t, None, coef, loss, lse, dx, None, IGNORE, 0.0, 0.0, None)

    for name in names:
        try:
            _begin(f"time V={V} {name}")
            ms = bench(fwd_bwd(VARIANTS[name]))
            _begin(f"time kernel V={V} {name}")
            us = bench(kernel_only(VARIANTS[name])) * 1e3
            out[name] = (ms, us)
        except Exception as e:
            _fail(V, name, "timing", e)
    try:
        _begin(f"time V={V} clone")
        xd = xl.detach()
        out["torch.clone (floor)"] = (bench(lambda: xd.clone()), None)
        _begin(f"time V={V} F.cross_entropy bf16")

        def torch_bf16():
            xl.grad = None
            F.cross_entropy(xl, t, ignore_index=IGNORE).backward()
        out["F.cross_entropy bf16"] = (bench(torch_bf16), None)
    except Exception as e:
        _fail(V, "peers", "timing", e)
    return out


def _table():
    lines = [f"probe_ce  N = {N} bf16, 10 % ignored, fwd + bwd (ms, do_bench median); kernel = ce_rows alone (us); "
             f"% floor = clone's ms / the row's ms; {time.time() - T0:.0f} s wall", ""]
    hdr = f"{'V':>7} {'variant':<26} {'fwd+bwd ms':>10} {'kernel us':>9} {'% floor':>7} {'vs dflt':>7}  check"
    lines.append(hdr)
    by_v: dict = {}
    for r in RESULTS["rows"]:
        by_v.setdefault(r["V"], []).append(r)
    for V, rows in by_v.items():
        floor = next((r["ms"] for r in rows if r["variant"] == "torch.clone (floor)"), None)
        dflt = next((r["ms"] for r in rows if r["variant"] == "default"), None)
        for r in rows:
            ms, us = r.get("ms"), r.get("kernel_us")
            pct = f"{100 * floor / ms:6.1f}%" if ms and floor else "-"
            vs = f"{dflt / ms:6.2f}x" if ms and dflt else "-"
            ms_s = "-" if ms is None else f"{ms:.3f}"
            us_s = "-" if us is None else f"{us:.1f}"
            lines.append(f"{V:>7} {r['variant']:<26} {ms_s:>10} {us_s:>9} {pct:>7} {vs:>7}  {r.get('check', '')}")
    best = []
    for V, rows in by_v.items():
        dflt = next((r.get("ms") for r in rows if r["variant"] == "default"), None)
        floor = next((r.get("ms") for r in rows if r["variant"] == "torch.clone (floor)"), None)
        smem = [r for r in rows if r["variant"].startswith("smem") and r.get("ms")]
        if smem and dflt and floor:
            r = min(smem, key=lambda r: r["ms"])
            best.append(f"  V={V}: {r['variant']} {r['ms']:.3f} ms = {dflt / r['ms']:.2f}x default "
                        f"({dflt:.3f} ms), {100 * floor / r['ms']:.1f} % of the floor ({floor:.3f} ms)")
    if best:
        lines += ["", "best smem variant per V:"] + best
    if RESULTS["errors"]:
        lines += ["", "errors:"] + ["  " + e[:300] for e in RESULTS["errors"][-12:]]
    print("\n".join(lines), flush=True)


def main():
    global OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--vocabs", default=",".join(map(str, VOCABS)))
    args = ap.parse_args()
    OUT = args.out
    os.makedirs(OUT, exist_ok=True)
    import triton
    RESULTS["env"] = dict(torch=torch.__version__, triton=triton.__version__, gpu=torch.cuda.get_device_name(),
                          cap=torch.cuda.get_device_capability(), python=sys.version.split()[0])
    threading.Thread(target=_watchdog, daemon=True).start()
    seed = 0
    for V in map(int, args.vocabs.split(",")):
        if time.time() - T0 > 0.85 * BUDGET_S:
            RESULTS["errors"].append(f"V={V} skipped: {time.time() - T0:.0f} s of the {BUDGET_S} s budget spent")
            continue
        good = []
        for name, knobs in VARIANTS.items():
            seed += 1
            row = {"V": V, "variant": name}
            try:
                _begin(f"check kernel V={V} {name}")
                ok_k, errs_k, plan = check_kernel(V, name, knobs, seed)
                _begin(f"check op V={V} {name}")
                ok_o, errs_o = check_op(V, name, knobs, seed + 1000)
                row.update(plan=str(plan), kernel_errs=errs_k, op_errs=errs_o)
                row["check"] = "ok" if ok_k and ok_o else f"WRONG kernel {errs_k} op {errs_o}"
                if not (ok_k and ok_o):
                    print(f"WRONG V={V} {name}: kernel {errs_k} op {errs_o}", flush=True)
                else:
                    good.append(name)
            except Exception as e:
                _fail(V, name, "check", e)
                row["check"] = "ERROR"
            if name in OPTION_VARIANTS and row.get("check") == "ok" and time.time() - T0 < BUDGET_S * 0.6:
                for i, opts in enumerate(OPTION_SETS):
                    try:
                        _begin(f"check options V={V} {name} {i}")
                        ok, errs = check_options(V, name, knobs, seed + 2000 + i, opts)
                        row[f"options{i}"] = errs
                        if not ok:
                            row["check"] = f"WRONG options {opts}: {errs}"
                            print(f"WRONG V={V} {name} options {opts}: {errs}", flush=True)
                            good.remove(name)
                            break
                    except Exception as e:
                        _fail(V, name, f"options {opts}", e)
                        row["check"] = "ERROR (options)"
                        good.remove(name)
                        break
            RESULTS["rows"].append(row)
            _save()
        timed = time_variants(V, good)
        for name, (ms, us) in timed.items():
            row = next((r for r in RESULTS["rows"] if r["V"] == V and r["variant"] == name), None)
            if row is None:
                row = {"V": V, "variant": name, "check": "(peer)"}
                RESULTS["rows"].append(row)
            row.update(ms=ms, kernel_us=us)
        _save()
        print(f"V={V} done at {time.time() - T0:.0f} s", flush=True)
        torch.cuda.empty_cache()
    _begin("end")
    RESULTS["plans"] = {V: str(explain(oss.cross_entropy, torch.empty(N, V, device="cuda", dtype=torch.bfloat16),
                                       torch.zeros(N, dtype=torch.int64, device="cuda"), need_grad=True))
                        for V in VOCABS}
    _save()
    _table()


if __name__ == "__main__":
    main()
