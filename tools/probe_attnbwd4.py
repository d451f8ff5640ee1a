"""Probe of the sm90 (Gluon) attention backward's next knobs on the H200, beside the default and SDPA's cuDNN and
flash backwards:

* ``dq_slot``: dQ's fp32 partial tile written into the tile's Q / dO ring slot once both warpgroups' matmuls have
  read it and added by one TMA reduce per warpgroup; the slot goes back to the producer one tile later. D = 256:
  the TMA reduce instead of 32 two-wide fp32 atomics per thread and tile; D = 128: no dQ tiles of their own
  (32 KB), so a third ring slot fits (210 KB); and at D = 256 ``s1 tma``, one ring slot and dQ tiles of their own
  (FlashAttention-3's D = 256 layout) for comparison;
* ``lpt_heads``: programs launched longest first (every head's key block 0, then block 1, ...) within groups of
  that many heads, so the short programs of a causal band run last;
* ``dq_rows`` (D = 64, 128 query rows per step): the warpgroups split dQ by rows, each forming 64 rows over all 128
  keys from the shared dSᵀ ring: 32 KB of fp32 dQ reduced per tile, not 64 (with ``dq_slot``: no dQ tiles of their
  own, 194 KB).

    PYTHONPATH=src python tools/probe_attnbwd4.py --out DIR          # on the GPU machine, < 150 s
    PYTHONPATH=src python tools/probe_attnbwd4.py --compile-only     # here, no GPU: every launch's sm_90a
                                                                     # registers / stack / shared memory
    ONLY=preg24,slot PYTHONPATH=src python tools/probe_attnbwd4.py --out DIR     # those beside the default

Steps:
1. compile and run every (variant, head dim) once in its own worker process (all at once; a worker that fails or
   does not report within the deadline, a hang, drops its variant), at the check shapes below, so that the main
   process finds every kernel in Triton's disk cache;
2. check each variant against an fp32 torch backward on fresh random inputs, outputs poisoned with NaN first:
   causal and not, GQA 16 / 4, a window, a left-only window, Sq != Sk and ragged lengths, 36 heads (lpt groups
   of 16 with a partial last group), packed sequences with empty ones (causal; a window) at each head dim the
   variant runs; a variant that fails is not timed;
3. at the goal shapes: the variant must agree with the default (rel. err < 1e-2), then ``do_bench`` medians (the
   L2 cleared before every repetition; each call reads > 60 MB); for the default and a few variants also each of
   the three launches alone (Δ + zeroed dQ buffer, the Gluon kernel, dQ's cast), to show what the Gluon kernel
   itself reaches.
TFLOP/s = 2.5 · 4·B·H·S²·D / t, halved when causal. Writes DIR/probe_attnbwd4.json, prints the table last.
"""

from __future__ import annotations

import json
import os
import sys
import threading
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
    print_rows_x_cudnn,
    record_check,
    ref_backward,
    rel_norm,
    sdpa_backward_ms,
    varlen_backward,
)

T0 = time.time()
OUT_NAME = "probe_attnbwd4.json"     # (probes that reuse this harness set their own)
BUDGET_S = 138          # stop timing past this (the whole run must end within 150 s)
WARM_DEADLINE_S = 80
WATCHDOG_S = 146        # past this, write what was measured, print the table and exit

# name -> (BackwardPlan knobs, the head dims it runs at); "default" is whatever the plan picks today. Every other
# name runs the sm90 kernel (its table row, then these knobs).
VARIANTS = {
    "default": ({}, (64, 128, 256)),
    "lpt16": ({"lpt_heads": 16}, (64, 128)),
    "lpt132": ({"lpt_heads": 132}, (128,)),
    "slot": ({"dq_tma": True, "dq_slot": True}, (128, 256)),
    "slot s3": ({"dq_slot": True, "num_stages": 3}, (128,)),
    "slot s3 lpt16": ({"dq_slot": True, "num_stages": 3, "lpt_heads": 16}, (128,)),
    "slot lpt16": ({"dq_tma": True, "dq_slot": True, "lpt_heads": 16}, (256,)),
    "s1 tma": ({"dq_tma": True, "num_stages": 1}, (256,)),
    "rows": ({"dq_rows": True}, (64,)),
    "rows slot": ({"dq_rows": True, "dq_slot": True}, (64,)),
    "preg24": ({"producer_regs": 24}, (64, 128)),
}
BREAKDOWN = ("default", "slot", "slot s3", "rows")     # also timed launch by launch
if os.environ.get("ONLY"):      # ONLY=name,name: those variants beside the default (the workers see it too)
    VARIANTS = {n: v for n, v in VARIANTS.items() if n == "default" or n in os.environ["ONLY"].split(",")}

# (B, H, Hkv, S, D, causal)
SHAPES = [(16, 32, 32, 1024, 128, True), (16, 32, 32, 1024, 128, False),
          (2, 16, 16, 4096, 256, False), (2, 16, 16, 4096, 256, True),
          (4, 32, 32, 4096, 128, True), (4, 32, 8, 4096, 128, True), (4, 32, 32, 4096, 128, False),
          (8, 16, 16, 2048, 64, True), (8, 16, 16, 2048, 64, False),
          (1, 32, 32, 16384, 128, True)]
# (B, H, Hkv, Sq, Sk, causal, window) at each D: square, GQA 4 with Sq < Sk / Sq > Sk (odd sizes), windows, 36 heads
CHECKS = [(1, 16, 16, 1024, 1024, False, None), (1, 16, 16, 1024, 1024, True, None),
          (1, 16, 4, 777, 1500, True, None), (1, 16, 4, 1500, 777, False, None),
          (1, 8, 2, 1000, 1000, False, (200, 30)), (3, 12, 12, 1000, 1000, True, None),
          (2, 8, 4, 900, 1100, False, (300, -1))]
VARLEN_LENS = [300, 0, 1000, 17, 1, 1500, 64]      # packed sequences: empty, tiny, ragged
VARLEN_CASES = [(8, 2, dict(causal=True)), (8, 8, dict(window=(200, 10)))]    # (H, Hkv, options)


def runs(name, D):
    return D in VARIANTS[name][1]


def problem(B, H, Hkv, Sq, Sk, D, causal, window=None, varlen=False):
    from onlinesoftmax.attention.plan import Problem
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return Problem(B, H, Hkv, Sq, Sk, D, "bfloat16", causal, (left, right), varlen=varlen, tma=True)


def bwd_plan(p, name):
    from onlinesoftmax.attention.plan import Knobs, plan_backward
    from onlinesoftmax.target import H200
    knobs = dict(VARIANTS[name][0])
    if name != "default":
        knobs.setdefault("kernel", "sm90")
    return plan_backward(p, H200, Knobs(backward=knobs))


def backward(name, q, k, v, do, o, lse, causal, window=None):
    from onlinesoftmax.attention import api
    B, H, Sq, D = q.shape
    p = problem(B, H, k.shape[1], Sq, k.shape[2], D, causal, window)
    return api._backward_triton(do, None, q, k, v, o, lse, p, bwd_plan(p, name), D ** -0.5, 0.0)


def varlen_case(name, H, Hkv, D, kw, seed):
    """(got, want) gradients on packed sequences: the variant's backward vs fp32 torch per sequence."""
    S = max(VARLEN_LENS)
    p = problem(len(VARLEN_LENS), H, Hkv, S, S, D, kw.get("causal", False), kw.get("window"), varlen=True)
    return varlen_backward(VARLEN_LENS, H, Hkv, D, kw, seed, p, bwd_plan(p, name))


# ---- compile-only (no GPU): sm_90a resources of every variant's launches, from the api's own arguments ------------
def compile_only():
    compile_backward(VARIANTS, SHAPES, backward, descriptors=True)


# ---- the device -----------------------------------------------------------------------------------------------
def _warm(job):
    """Worker: one variant's backward (or the default forward) at one head dim, at the check shapes and on packed
    sequences: compiles, and finds a kernel that fails or hangs before the main process runs it."""
    import torch
    name, D = job
    t0 = time.time()
    errors = []
    for B, H, Hkv, Sq, Sk, causal, window in CHECKS:
        try:
            q, k, v, do = inputs(B, H, Hkv, Sq, Sk, D, "cuda")
            if name == "forward":
                forward(q, k, v, causal, window)
            else:
                o = torch.randn_like(q)
                lse = torch.randn(B, H, Sq, device="cuda", dtype=torch.float32)
                backward(name, q, k, v, do, o, lse, causal, window)
            torch.cuda.synchronize()
        except Exception as e:
            errors.append(f"D={D} {(Sq, Sk, causal, window)}: {err_line(e)}")
    if name != "forward":
        for ci, (H, Hkv, kw) in enumerate(VARLEN_CASES):
            try:
                varlen_case(name, H, Hkv, D, kw, ci)
                torch.cuda.synchronize()
            except Exception as e:
                errors.append(f"varlen D={D} {kw}: {err_line(e)}")
    return job, time.time() - t0, errors


def launch_times(name, q, k, v, do, o, lse, causal, do_bench):
    """(kernel name, ms) of each launch of one backward call, each timed alone (the Gluon kernel replayed adds
    into the same dQ buffer: its time, not its values, is what counts here)."""
    from onlinesoftmax._triton import launch
    rec = []
    orig = launch.BoundKernel.__call__

    def spy(self, args, check, device):
        rec.append((self, args, check, device))
        return orig(self, args, check, device)

    launch.BoundKernel.__call__ = spy
    try:
        backward(name, q, k, v, do, o, lse, causal)
    finally:
        launch.BoundKernel.__call__ = orig
    return [(bk.fn.__name__.replace("attention_bwd_", "").replace("_kernel", ""),
             do_bench(lambda bk=bk, a=a, c=c, d=d: bk(a, c, d), rep=50, return_mode="median"))
            for bk, a, c, d in rec]


def device_run(out_dir):
    import multiprocessing as mp

    import torch
    import triton
    from triton.testing import do_bench

    report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  variants={n: dict(knobs=k, dims=d) for n, (k, d) in VARIANTS.items()}, warm={}, check={},
                  rows=[], plans={})
    os.makedirs(out_dir, exist_ok=True)

    def save():
        with open(os.path.join(out_dir, OUT_NAME), "w") as fh:
            json.dump(report, fh, indent=1, default=str)

    def watchdog():         # a launch that never returns (a barrier deadlock) must not cost the partial results
        print(f"\nwatchdog: {time.time() - T0:.0f} s, the run has not finished (a hung launch?); partial results",
              flush=True)
        try:
            save()
            table(report, report.get("matmul_tflops", float("nan")))
        finally:
            sys.stdout.flush()
            os._exit(3)

    dog = threading.Timer(WATCHDOG_S - (time.time() - T0), watchdog)
    dog.daemon = True
    dog.start()

    # 1. compile (and run once, small) in parallel worker processes, one per (variant, head dim)
    dims = sorted({D for _, _, _, _, D, _ in SHAPES})
    jobs = [("forward", D) for D in dims] + [(n, D) for n in VARIANTS for D in dims if runs(n, D)]
    bad = set()             # (name, D) pairs not to run
    ctx = mp.get_context("spawn")
    with ctx.Pool(min(len(jobs), max(2, os.cpu_count() or 8))) as pool:
        it = pool.imap_unordered(_warm, jobs)
        deadline = time.time() + WARM_DEADLINE_S
        for _ in jobs:
            try:
                job, secs, errors = it.next(timeout=max(1.0, deadline - time.time()))
            except Exception as e:
                print(f"warm-up incomplete: {err_line(e)}", flush=True)
                break
            report["warm"][f"{job[0]} D{job[1]}"] = dict(s=round(secs, 1), errors=errors)
            if errors and job[0] != "forward":
                bad.add(job)
            print(f"warm {job[0]:14} D={job[1]:3} {secs:5.1f} s {'; '.join(errors)[:300]}", flush=True)
        pool.terminate()
    for job in jobs:
        if f"{job[0]} D{job[1]}" not in report["warm"]:
            bad.add(job)
            report["warm"][f"{job[0]} D{job[1]}"] = "no report within the deadline (hung?)"
            print(f"warm {job[0]:14} D={job[1]:3} did not report: not run here", flush=True)
    print(f"[{time.time() - T0:5.1f} s] compiled; skipped: {sorted(bad)}", flush=True)

    report["matmul_tflops"] = mm = matmul_tflops(50)

    # 2. correctness against fp32 torch, fresh inputs, poisoned outputs
    def record(key, job, fn):
        record_check(report, bad, key, job, fn, wrong=lambda m: not m < 2e-2)

    for D in dims:
        for ci, (B, H, Hkv, Sq, Sk, causal, window) in enumerate(CHECKS):
            try:
                q, k, v, do = inputs(B, H, Hkv, Sq, Sk, D, "cuda", seed=100 + ci + D)
                g_ref = ref_backward(q, k, v, do, causal, window)
                o, lse = forward(q, k, v, causal, window)
            except Exception as e:
                print(f"check D={D} {CHECKS[ci]}: reference / forward failed: {err_line(e)}", flush=True)
                continue
            shapes = [(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype), ((B, H, Sq, D), torch.float32)]
            for name in VARIANTS:
                if (name, D) in bad or not runs(name, D):
                    continue
                record(f"{name} | D{D} {B}x{H}/{Hkv} {Sq}x{Sk} causal={causal} window={window}", (name, D),
                       lambda: (poisoned(lambda: backward(name, q, k, v, do, o, lse, causal, window), shapes), g_ref))
        for ci, (H, Hkv, kw) in enumerate(VARLEN_CASES):
            for name in VARIANTS:
                if (name, D) in bad or not runs(name, D):
                    continue
                record(f"{name} | D{D} varlen H{H}/{Hkv} {kw}", (name, D),
                       lambda: varlen_case(name, H, Hkv, D, kw, 7 + ci))
    q = k = v = do = o = lse = g_ref = None
    print(f"[{time.time() - T0:5.1f} s] checked; bad: {sorted(bad)}", flush=True)

    # 3. timings, whole backward calls; then launch by launch
    for si, (B, H, Hkv, S, D, causal) in enumerate(SHAPES):
        if time.time() - T0 > BUDGET_S:
            print(f"out of time: shapes from {SHAPES[si]} not timed", flush=True)
            break
        fl = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
        try:
            q, k, v, do = inputs(B, H, Hkv, S, S, D, "cuda", seed=si)
            o, lse = forward(q, k, v, causal)
        except Exception as e:
            print(f"{SHAPES[si]}: inputs / forward failed: {err_line(e)}", flush=True)
            continue
        base = None
        row = dict(shape=(B, H, Hkv, S, D), causal=causal, ms={}, tflops={}, err={}, launches={})
        sdpa_backward_ms(q, k, v, do, causal, row, 60)
        for name in VARIANTS:
            if (name, D) in bad or not runs(name, D) or time.time() - T0 > BUDGET_S:
                continue
            try:
                report["plans"][f"{name} D{D} causal={causal}"] = str(bwd_plan(problem(B, H, Hkv, S, S, D, causal),
                                                                              name))
                shapes = [(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype)]
                g = poisoned(lambda: backward(name, q, k, v, do, o, lse, causal), shapes)
                if base is None:
                    base = g
                else:
                    e = max(rel_norm(x, y) for x, y in zip(g, base))
                    row["err"][name] = e
                    if not e < 1e-2:
                        raise RuntimeError(f"differs from the default by {e:.2e}")
                g = None
                row["ms"][name] = do_bench(lambda: backward(name, q, k, v, do, o, lse, causal), rep=60,
                                           return_mode="median")
            except Exception as e:
                row["err"][name] = err_line(e)
                print(f"FAILED {name} at {row['shape']} causal={causal}: {err_line(e)}", flush=True)
        for name in BREAKDOWN:
            if name not in row["ms"] or time.time() - T0 > BUDGET_S:
                continue
            try:
                row["launches"][name] = launch_times(name, q, k, v, do, o, lse, causal, do_bench)
            except Exception as e:
                row["err"][f"{name} launches"] = err_line(e)
        row["tflops"] = {n: fl / ms / 1e9 for n, ms in row["ms"].items()}
        report["rows"].append(row)
        print(f"[{time.time() - T0:5.1f} s] {row['shape']} causal={causal}: "
              + " ".join(f"{n.replace(' ', '_')}={t:.0f}" for n, t in row["tflops"].items()), flush=True)
        q = k = v = do = o = lse = base = None
        torch.cuda.empty_cache()

    dog.cancel()
    save()
    table(report, mm)


def table(report, mm):
    print(f"\n== attention backward, bf16, TFLOP/s (2.5x fwd flops, causal halved), (x cuDNN); bf16 matmul {mm:.0f}; "
          f"{report['device']}, torch {report['torch']}, triton {report['triton']}")
    print_rows_x_cudnn(report)
    print("launch by launch, µs (delta / sm90 / dq_cast; the Gluon kernel's TFLOP/s alone):")
    for r in report["rows"]:
        B, H, Hkv, S, D = r["shape"]
        fl = 2.5 * 4 * B * H * S * S * D / (2 if r["causal"] else 1)
        lab = f"{B},{H}/{Hkv},{S},{D}{' c' if r['causal'] else ''}"
        for name, ls in r["launches"].items():
            main = [ms for n, ms in ls if "sm90" in n]
            print(f"  {lab:20} {name:8} " + " / ".join(f"{ms * 1e3:.0f}" for _, ms in ls)
                  + (f"  sm90 {fl / main[0] / 1e9:.0f}" if main else ""))
    print_check_summary(report, VARIANTS, 14, wrong=lambda m: not m < 2e-2)


def main():
    compile_or_run(__doc__, compile_only, device_run)


if __name__ == "__main__":
    sys.exit(main())
