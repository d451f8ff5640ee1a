"""Probe of the attention backward's knob-only tiles on the H200: the sm90 (Gluon) kernel at D = 256 (SPLIT_D),
retuned tl.dot tiles at D = 256, more ring slots and 128 query rows per step at D = 64; beside the current default
and SDPA's cuDNN and flash backwards.

    PYTHONPATH=src python tools/probe_attnbwd3.py --out DIR          # on the GPU machine, < 150 s
    PYTHONPATH=src python tools/probe_attnbwd3.py --compile-only     # here, no GPU: every launch's sm_90a
                                                                     # registers / stack / shared memory

Steps:
1. compile and run every variant once in its own worker process (all at once; a variant whose worker fails or
   does not report within the deadline, a hang, is dropped), at the check shapes below, so that the main process
   finds every kernel in Triton's disk cache;
2. check each variant against an fp32 torch backward on fresh random inputs, outputs poisoned with NaN first:
   causal and not, GQA 16 / 4, a window, Sq != Sk and ragged lengths, packed sequences with empty ones (causal;
   a window) at each head dim the variant runs; a variant that fails is not timed;
3. at the goal shapes: the variant must agree with the default (rel. err < 1e-2), then ``do_bench`` medians (the
   L2 cleared before every repetition; each call reads > 60 MB).
TFLOP/s = 2.5 · 4·B·H·S²·D / t, halved when causal. Writes DIR/probe_attnbwd3.json, prints the table last.
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
    print_rows_x_cudnn,
    record_check,
    ref_backward,
    rel_norm,
    sdpa_backward_ms,
    varlen_backward,
)

T0 = time.time()
BUDGET_S = 135          # stop timing past this (the whole run must end within 150 s)

# name -> (BackwardPlan knobs, the head dims it runs at); "default" is whatever the plan picks today
VARIANTS = {
    "default": ({}, (64, 256)),
    # D = 256, Gluon: 64 keys per program, S / dP split by keys and dK / dV / dQ by columns between the warpgroups
    "sm90": ({"kernel": "sm90"}, (256,)),
    # D = 256, tl.dot retunes without spills at sm_90a (today: dK/dV 32 x 64, 4 warps, 1 stage: a 1368-byte stack
    # frame; dQ 64 x 32, 4 warps, 1 stage: 360 bytes)
    "tl 32x64w8": ({"kernel": "triton", "block_m": 32, "block_n": 64, "num_warps": 8, "num_stages": 2,
                    "block_m_dq": 64, "block_n_dq": 64, "num_warps_dq": 8, "num_stages_dq": 2}, (256,)),
    "tl 16x64w8": ({"kernel": "triton", "block_m": 16, "block_n": 64, "num_warps": 8, "num_stages": 2,
                    "block_m_dq": 128, "block_n_dq": 32, "num_warps_dq": 8, "num_stages_dq": 2}, (256,)),
    # D = 64, Gluon: ring slots (default 2), 128 query rows per step (default 64)
    "sm90 s3": ({"num_stages": 3}, (64,)),
    "sm90 s4": ({"num_stages": 4}, (64,)),
    "sm90 m128": ({"block_m": 128}, (64,)),
    "sm90 m128 s3 atom": ({"block_m": 128, "num_stages": 3, "dq_tma": False}, (64,)),
}

# (B, H, Hkv, S, D, causal)
SHAPES = [(2, 16, 16, 4096, 256, False), (2, 16, 16, 4096, 256, True),
          (8, 16, 16, 2048, 64, False), (8, 16, 16, 2048, 64, True),
          (4, 32, 32, 4096, 64, False)]
# (B, H, Hkv, Sq, Sk, causal, window) at each D: square, GQA 4 with Sq < Sk / Sq > Sk (odd sizes), a window
CHECKS = [(1, 16, 16, 1024, 1024, False, None), (1, 16, 16, 1024, 1024, True, None),
          (1, 16, 4, 777, 1500, True, None), (1, 16, 4, 1500, 777, False, None),
          (1, 8, 2, 1000, 1000, False, (200, 30))]
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
    if name.startswith("sm90"):
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
    compile_backward(VARIANTS, SHAPES, backward)


# ---- the device -----------------------------------------------------------------------------------------------
def _warm(name):
    """Worker: one variant's backward (or the default forward) at the check shapes and on packed sequences:
    compiles, and finds a kernel that fails or hangs before the main process runs it."""
    import torch
    t0 = time.time()
    errors = []
    dims = (64, 256) if name == "forward" else VARIANTS[name][1]
    for D in dims:
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
    return name, time.time() - t0, errors


def device_run(out_dir):
    import multiprocessing as mp

    import torch
    import triton
    from triton.testing import do_bench

    report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  variants={n: dict(knobs=k, dims=d) for n, (k, d) in VARIANTS.items()}, warm={}, check={},
                  rows=[], plans={})

    # 1. compile (and run once, small) in parallel worker processes
    jobs = ["forward"] + list(VARIANTS)
    bad = set()
    ctx = mp.get_context("spawn")
    with ctx.Pool(len(jobs)) as pool:
        it = pool.imap_unordered(_warm, jobs)
        deadline = time.time() + 75
        for _ in jobs:
            try:
                name, secs, errors = it.next(timeout=max(1.0, deadline - time.time()))
            except Exception as e:
                print(f"warm-up incomplete: {err_line(e)}", flush=True)
                break
            report["warm"][name] = dict(s=round(secs, 1), errors=errors)
            if errors and name != "forward":
                bad.add(name)
            print(f"warm {name:18} {secs:5.1f} s {'; '.join(errors)[:300]}", flush=True)
        pool.terminate()
    for name in VARIANTS:
        if name not in report["warm"]:
            bad.add(name)
            report["warm"][name] = "no report within the deadline (hung?)"
            print(f"warm {name:18} did not report: not run here", flush=True)
    print(f"[{time.time() - T0:5.1f} s] compiled; skipped: {sorted(bad)}", flush=True)

    report["matmul_tflops"] = mm = matmul_tflops(100)

    # 2. correctness against fp32 torch, fresh inputs, poisoned outputs
    for D in (64, 256):
        for ci, (B, H, Hkv, Sq, Sk, causal, window) in enumerate(CHECKS):
            q, k, v, do = inputs(B, H, Hkv, Sq, Sk, D, "cuda", seed=100 + ci + D)
            g_ref = ref_backward(q, k, v, do, causal, window)
            o, lse = forward(q, k, v, causal, window)
            shapes = [(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype), ((B, H, Sq, D), torch.float32)]
            for name in VARIANTS:
                if name in bad or not runs(name, D):
                    continue
                record_check(report, bad, f"{name} | D{D} H{H}/{Hkv} {Sq}x{Sk} causal={causal} window={window}", name,
                             lambda: (poisoned(lambda: backward(name, q, k, v, do, o, lse, causal, window), shapes),
                                      g_ref))
        for ci, (H, Hkv, kw) in enumerate(VARLEN_CASES):
            for name in VARIANTS:
                if name in bad or not runs(name, D):
                    continue
                record_check(report, bad, f"{name} | D{D} varlen H{H}/{Hkv} {kw}", name,
                             lambda: varlen_case(name, H, Hkv, D, kw, 7 + ci))
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
        row = dict(shape=(B, H, Hkv, S, D), causal=causal, ms={}, tflops={}, err={})
        sdpa_backward_ms(q, k, v, do, causal, row, 100)
        for name in VARIANTS:
            if name in bad or not runs(name, D) or time.time() - T0 > BUDGET_S:
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
                    if e > 1e-2:
                        raise RuntimeError(f"differs from the default by {e:.2e}")
                g = None
                row["ms"][name] = do_bench(lambda: backward(name, q, k, v, do, o, lse, causal), rep=100,
                                           return_mode="median")
            except Exception as e:
                row["err"][name] = err_line(e)
                print(f"FAILED {name} at {row['shape']} causal={causal}: {err_line(e)}", flush=True)
        row["tflops"] = {n: fl / ms / 1e9 for n, ms in row["ms"].items()}
        report["rows"].append(row)
        print(f"[{time.time() - T0:5.1f} s] {row['shape']} causal={causal}: "
              + " ".join(f"{n.replace(' ', '_')}={t:.0f}" for n, t in row["tflops"].items()), flush=True)
        q = k = v = do = o = lse = base = None
        torch.cuda.empty_cache()

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "probe_attnbwd3.json"), "w") as fh:
        json.dump(report, fh, indent=1, default=str)
    table(report, mm)


def table(report, mm):
    print(f"\n== attention backward, bf16, TFLOP/s (2.5x fwd flops, causal halved); bf16 matmul {mm:.0f}; "
          f"{report['device']}, torch {report['torch']}, triton {report['triton']}")
    print_rows_x_cudnn(report)
    print_check_summary(report, VARIANTS, 18)


def main():
    compile_or_run(__doc__, compile_only, device_run)


if __name__ == "__main__":
    sys.exit(main())
