"""Probe of the sm90 attention backward (Gluon, ``BackwardPlan(kernel="sm90")``) on the H200, beside the current
default backward and SDPA's cuDNN and flash backwards.

    PYTHONPATH=src python tools/probe_attnbwd_sm90.py --out DIR          # on the GPU machine, < 150 s
    PYTHONPATH=src python tools/probe_attnbwd_sm90.py --compile-only     # here, no GPU: the launches' sm_90a
                                                                         # registers / stack / shared memory

Steps:
1. compile every variant in worker processes (one per variant, at B = 1, S = 1024: the same Triton specialisations
   as the timed shapes, so the timed calls find every kernel in Triton's disk cache);
2. check each variant against an fp32 torch backward on fresh random inputs, outputs poisoned with NaN first:
   at (1, H, Hkv, 1024, D) for every (H / Hkv, D, causal) of the timed shapes, and on packed sequences with empty
   ones (causal; a window) — a variant that fails is not timed;
3. at the issue's shapes: the variant must agree with the default (rel. err < 1e-2), then ``do_bench`` medians
   (it clears the L2 before every repetition; every call also reads > 100 MB), per-kernel times (Δ, dK/dV or
   sm90, dQ or cast) at the first two shapes.
TFLOP/s = 2.5 · 4·B·H·S²·D / t, halved when causal. Writes DIR/probe_attnbwd_sm90.json, prints the table last.
"""

from __future__ import annotations

import json
import os
import sys
import time

from probe_util import (
    compile_backward,
    compile_or_run,
    err_line,
    forward,
    inputs,
    matmul_tflops,
    poisoned,
    print_check_summary,
    record_check,
    ref_backward,
    rel_norm,
    sdpa_backward_ms,
    varlen_backward,
)

T0 = time.time()
BUDGET_S = 135          # stop timing past this (the whole run must end within 150 s)

# sm90 knobs (BackwardPlan): stage_rows = lse / Δ staged by the producer (no global load on the consumers' path);
# dq_tma = dQ's partial tiles added by TMA reduce from shared memory (no fp32 atomics)
VARIANTS = {
    "default": {},
    "tl.dot": {"kernel": "triton"},       # the split kernels (kernels/bwd.py) as planned for the problem
    "sm90 s2": {"kernel": "sm90"},
    "sm90 rows": {"kernel": "sm90", "stage_rows": True},
    "sm90 rows+tma": {"kernel": "sm90", "stage_rows": True, "dq_tma": True},
}

# (B, H, Hkv, S, D, causal); the first two also get per-kernel times
SHAPES = [(4, 32, 32, 4096, 128, False), (4, 32, 32, 4096, 128, True),
          (1, 32, 32, 16384, 128, False), (1, 32, 32, 16384, 128, True),
          (16, 32, 32, 1024, 128, False), (16, 32, 32, 1024, 128, True),
          (8, 16, 16, 2048, 64, False), (8, 16, 16, 2048, 64, True),
          (4, 32, 8, 4096, 128, True), (4, 32, 8, 4096, 128, False)]
CHECK_S = 1024
VARLEN_LENS = [300, 0, 1000, 17, 1, 1500, 64]      # packed sequences: empty, tiny, ragged
VARLEN_CASES = [(8, 2, 128, dict(causal=True)), (8, 8, 64, dict(window=(200, 10)))]    # (H, Hkv, D, options)


def groups():
    """One small shape per Triton specialisation of SHAPES: (1, H, Hkv, CHECK_S, D, causal)."""
    return sorted({(1, H, Hkv, CHECK_S, D, c) for _, H, Hkv, _, D, c in SHAPES})


def problem(B, H, Hkv, S, D, causal, dtype="bfloat16"):
    from onlinesoftmax.attention.plan import Problem
    return Problem(B, H, Hkv, S, S, D, dtype, causal, (-1, 0) if causal else (-1, -1), tma=True)


def bwd_plan(p, knobs):
    from onlinesoftmax.attention.plan import Knobs, plan_backward
    from onlinesoftmax.target import H200
    return plan_backward(p, H200, Knobs(backward=knobs))


def backward(knobs, q, k, v, do, o, lse, causal):
    from onlinesoftmax.attention import api
    B, H, S, D = q.shape
    p = problem(B, H, k.shape[1], S, D, causal)
    return api._backward_triton(do, None, q, k, v, o, lse, p, bwd_plan(p, knobs), D ** -0.5, 0.0)


def varlen_case(knobs, H, Hkv, D, kw, seed):
    """(got, want) gradients on packed sequences: the variant's backward vs fp32 torch per sequence."""
    from onlinesoftmax.attention.plan import Problem
    causal = kw.get("causal", False)
    left, right = kw.get("window", (-1, -1))
    S = max(VARLEN_LENS)
    p = Problem(len(VARLEN_LENS), H, Hkv, S, S, D, "bfloat16", causal, (left, 0 if causal else right), varlen=True,
                tma=True)
    return varlen_backward(VARLEN_LENS, H, Hkv, D, kw, seed, p, bwd_plan(p, knobs))


# ---- compile-only (no GPU): sm_90a resources of every variant's launches, from the api's own arguments ------------
def compile_only():
    import re

    def atoms(c):
        return " ".join(sorted(set(re.findall(
            r"\b(?:red|atom)\.global[\w.]+|cp\.reduce\.async\.bulk\.tensor[\w.:]+", c.asm["ptx"]))))
    compile_backward({name: (knobs, (64, 128, 256)) for name, knobs in VARIANTS.items()}, SHAPES,
                     lambda name, *a: backward(VARIANTS[name], *a), descriptors=True, strict=True, extra=atoms)


# ---- the device -----------------------------------------------------------------------------------------------
def _warm(job):
    """Worker: run one variant's backward (or the default forward) at every group's small shape and on the packed
    sequences: compiles, and finds a kernel that fails or hangs before the main process runs it."""
    import torch
    name, knobs = job
    t0 = time.time()
    errors = []
    for B, H, Hkv, S, D, causal in groups():
        try:
            q, k, v, do = inputs(B, H, Hkv, S, S, D, "cuda")
            if name == "forward":
                forward(q, k, v, causal)
            else:
                o = torch.randn_like(q)
                lse = torch.randn(B, H, S, device="cuda", dtype=torch.float32)
                backward(knobs, q, k, v, do, o, lse, causal)
            torch.cuda.synchronize()
        except Exception as e:
            errors.append(f"D={D} causal={causal}: {err_line(e)}")
    if name != "forward":
        for ci, (H, Hkv, D, kw) in enumerate(VARLEN_CASES):
            try:
                varlen_case(knobs, H, Hkv, D, kw, ci)
                torch.cuda.synchronize()
            except Exception as e:
                errors.append(f"varlen D={D} {kw}: {err_line(e)}")
    return name, time.time() - t0, errors


def device_run(out_dir):
    import multiprocessing as mp

    import torch
    import triton
    from triton.testing import do_bench

    from onlinesoftmax._triton import launch
    from onlinesoftmax.attention import api

    report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  variants=VARIANTS, warm={}, check={}, rows=[])

    # 1. compile (and run once, small) in parallel worker processes; a variant whose worker fails or does not
    #    report within the deadline (a kernel that hangs: a barrier never completes) is not run in this process
    jobs = [("forward", None)] + list(VARIANTS.items())
    bad = set()
    ctx = mp.get_context("spawn")
    with ctx.Pool(len(jobs)) as pool:
        it = pool.imap_unordered(_warm, jobs)
        deadline = time.time() + 80
        for _ in jobs:
            try:
                name, secs, errors = it.next(timeout=max(1.0, deadline - time.time()))
            except Exception as e:
                print(f"warm-up incomplete: {err_line(e)}", flush=True)
                break
            report["warm"][name] = dict(s=round(secs, 1), errors=errors)
            if errors and name != "forward":
                bad.add(name)
            print(f"warm {name:10} {secs:5.1f} s {'; '.join(errors)[:300]}", flush=True)
        pool.terminate()
    for name in VARIANTS:
        if name not in report["warm"]:
            bad.add(name)
            report["warm"][name] = "no report within the deadline (hung?)"
            print(f"warm {name:10} did not report: not run here", flush=True)
    print(f"[{time.time() - T0:5.1f} s] compiled; skipped: {sorted(bad)}", flush=True)

    report["matmul_tflops"] = mm = matmul_tflops(100)

    # 2. correctness against fp32 torch, fresh inputs, poisoned outputs
    def record(key, name, fn):
        record_check(report, bad, key, name, fn)

    for B, H, Hkv, S, D, causal in groups():
        q, k, v, do = inputs(B, H, Hkv, S, S, D, "cuda", seed=1 + D + causal + Hkv)
        g_ref = ref_backward(q, k, v, do, causal)
        o, lse = forward(q, k, v, causal)
        shapes = [(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype), ((B, H, S, D), torch.float32)]
        for name, knobs in VARIANTS.items():
            if name in bad:
                continue
            record(f"{name} | H{H}/{Hkv} D{D} causal={causal}", name,
                   lambda: (poisoned(lambda: backward(knobs, q, k, v, do, o, lse, causal), shapes), g_ref))
    for ci, (H, Hkv, D, kw) in enumerate(VARLEN_CASES):
        for name, knobs in VARIANTS.items():
            if name in bad:
                continue
            record(f"{name} | varlen H{H}/{Hkv} D{D} {kw}", name, lambda: varlen_case(knobs, H, Hkv, D, kw, 7 + ci))
    q = k = v = do = o = lse = g_ref = None
    print(f"[{time.time() - T0:5.1f} s] checked; bad: {sorted(bad)}", flush=True)

    # 3. timings
    for si, (B, H, Hkv, S, D, causal) in enumerate(SHAPES):
        if time.time() - T0 > BUDGET_S:
            print(f"out of time: shapes from {SHAPES[si]} not timed", flush=True)
            break
        fl = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
        q, k, v, do = inputs(B, H, Hkv, S, S, D, "cuda", seed=si)
        o, lse = forward(q, k, v, causal)
        base = None
        row = dict(shape=(B, H, Hkv, S, D), causal=causal, ms={}, tflops={}, err={}, kernels_ms={})
        sdpa_backward_ms(q, k, v, do, causal, row, 100)
        for name, knobs in VARIANTS.items():
            if name in bad or time.time() - T0 > BUDGET_S:
                continue
            try:
                shapes = [(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype)]
                g = poisoned(lambda: backward(knobs, q, k, v, do, o, lse, causal), shapes)
                if base is None:
                    base = g
                else:
                    e = max(rel_norm(x, y) for x, y in zip(g, base))
                    row["err"][name] = e
                    if e > 1e-2:
                        raise RuntimeError(f"differs from the default by {e:.2e}")
                g = None
                f = lambda knobs=knobs: backward(knobs, q, k, v, do, o, lse, causal)  # noqa: E731
                row["ms"][name] = do_bench(f, rep=100, return_mode="median")
                if si < 2:      # per kernel: record the launches of one call, then time each alone
                    calls = []
                    real = launch.BoundKernel.__call__

                    def rec(self, args, check, device, real=real):
                        calls.append((self, args, check, device))
                        return real(self, args, check, device)
                    launch.BoundKernel.__call__ = rec
                    try:
                        f()
                    finally:
                        launch.BoundKernel.__call__ = real
                    row["kernels_ms"][name] = [
                        (c[0].fn.__name__.replace("attention_bwd_", ""),
                         do_bench(lambda c=c: c[0](c[1], c[2], c[3]), rep=40, return_mode="median"))
                        for c in calls]
            except Exception as e:
                row["err"][name] = err_line(e)
                print(f"FAILED {name} at {row['shape']} causal={causal}: {err_line(e)}", flush=True)
        row["tflops"] = {n: fl / ms / 1e9 for n, ms in row["ms"].items()}
        report["rows"].append(row)
        print(f"[{time.time() - T0:5.1f} s] {row['shape']} causal={causal}: "
              + " ".join(f"{n.replace(' ', '_')}={t:.0f}" for n, t in row["tflops"].items()), flush=True)
        q = k = v = do = o = lse = base = None
        torch.cuda.empty_cache()
    api._caches()

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "probe_attnbwd_sm90.json"), "w") as fh:
        json.dump(report, fh, indent=1, default=str)
    table(report, mm)


def table(report, mm):
    names = list(VARIANTS)
    print(f"\n== attention backward, bf16, TFLOP/s (2.5x fwd flops, causal halved); bf16 matmul {mm:.0f}; "
          f"{report['device']}, torch {report['torch']}, triton {report['triton']}")
    cols = ["cudnn", "flash"] + names
    print(f"{'shape':22} " + " ".join(f"{c:>8}" for c in cols) + "  sm90/default  best-sm90/cudnn")
    for r in report["rows"]:
        B, H, Hkv, S, D = r["shape"]
        t = r["tflops"]
        lab = f"{B},{H}/{Hkv},{S},{D}{' c' if r['causal'] else ''}"
        cells = [f"{t[n]:8.0f}" if n in t else f"{'x':>8}" for n in cols]
        sm = [n for n in names if n.startswith("sm90") and n in t]
        best = max(sm, key=t.get) if sm else None
        r1 = f"{t[best] / t['default']:.2f}" if best and "default" in t else "-"
        r2 = f"{t[best] / t['cudnn']:.2f} ({best})" if best and "cudnn" in t else "-"
        print(f"{lab:22} " + " ".join(cells) + f"  {r1:>12}  {r2}")
    for r in report["rows"]:
        if r["kernels_ms"]:
            print(f"per kernel ms at {r['shape']} causal={r['causal']}:")
            for n, ks in r["kernels_ms"].items():
                print(f"  {n:8} " + " + ".join(f"{k} {ms:.3f}" for k, ms in ks)
                      + f" = {sum(ms for _, ms in ks):.3f} (whole {r['ms'][n]:.3f})")
    print_check_summary(report, names, 0)


def main():
    compile_or_run(__doc__, compile_only, device_run)


if __name__ == "__main__":
    sys.exit(main())
