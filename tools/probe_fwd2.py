"""The persistent sm90 attention forward's new knobs on the device, and the causal D = 64 puzzle, in one call
(<= 150 s): ``pairs`` (a program's work unit is query blocks i and n_m − 1 − i of one head: equal key counts
under a causal mask, so the round-robin over the SMs is balanced) and ``o_direct`` (O stored from registers, no
staging buffer: a third K / V slot fits at D = 128), beside the default plan, the public ``oss.attention`` and
SDPA cuDNN / flash.

1. each variant runs in its own worker process (compiles, then checks against fp32 torch on odd shapes: causal
   with an odd number of query blocks, window, softcap, GQA, Sq != Sk, [B, S, H, D] strides; fresh inputs,
   outputs poisoned with NaN); a worker that errs or does not report within 60 s (a hung barrier) is not timed;
2. TFLOP/s (do_bench medians, two input sets rotated) at the goal shapes, bf16;
3. the puzzle (bench at d8f0334: causal 8 × 16 × 2048 × 64 on the persistent grid 0.2996 ms in the bench, 0.209 in
   tools/probe_fwd_sm90.py): with the plan of d8f0334 restored for D = 64 (persistent, s4, folded), the same call
   timed four ways: the bench's own harness and case, do_bench of oss.attention, CUDA-graph replay (device time
   only), the knob call of the old probe; host µs per eager call; the bound launch (constexprs, grid, compiled
   kernel hash) each call replays, causal and not.
Table last; JSON to ``--out``.   ``PYTHONPATH=src python tools/probe_fwd2.py --out DIR``
"""

from __future__ import annotations

import argparse
import json
import os
import time

from probe_util import (
    bench_ms,
    check_case,
    err_head,
    print_checks,
    print_tflops_x_cudnn,
    run_checks,
    run_main,
)

T0 = time.time()
D128, D64 = (128,), (64,)
PERS = {"kernel": "sm90", "programs": -1, "fold": True}
VARIANTS = {  # name: (forward knobs, head dims)
    "pers": (dict(PERS, num_stages=2), D128),
    "pers pairs": (dict(PERS, num_stages=2, pairs=True), D128),
    "pers od3": (dict(PERS, num_stages=3, o_direct=True), D128),
    "pers od3 pairs": (dict(PERS, num_stages=3, o_direct=True, pairs=True), D128),
    "pers64": (dict(PERS, num_stages=4), D64),
    "pers64 pairs": (dict(PERS, num_stages=4, pairs=True), D64),
    "pers64 od5 pairs": (dict(PERS, num_stages=5, o_direct=True, pairs=True), D64),
}
SHAPES = [  # (B, H, Hkv, S, D, causal)
    (8, 16, 16, 2048, 64, True), (8, 16, 16, 2048, 64, False), (4, 32, 32, 4096, 64, True),
    (16, 32, 32, 1024, 128, True), (16, 32, 32, 1024, 128, False), (4, 32, 32, 4096, 128, True),
    (2, 32, 32, 8192, 128, True), (1, 32, 32, 16384, 128, True),
]
CASES = [  # name, B, H, Hkv, Sq, Sk, causal, window, softcap, dtype, layout
    ("nc 1024", 1, 16, 16, 1024, 1024, False, (-1, -1), None, "bfloat16", "bhsd"),   # the timed specialisations
    ("causal 1024", 1, 16, 16, 1024, 1024, True, (-1, -1), None, "bfloat16", "bhsd"),
    ("causal odd n_m 640", 2, 3, 3, 640, 640, True, (-1, -1), None, "bfloat16", "bhsd"),
    ("causal gqa4 257", 2, 8, 2, 257, 257, True, (-1, -1), None, "bfloat16", "bhsd"),
    ("causal Sq<Sk", 1, 4, 4, 100, 333, True, (-1, -1), None, "bfloat16", "bhsd"),
    ("causal Sq>Sk", 1, 4, 4, 333, 100, True, (-1, -1), None, "bfloat16", "bhsd"),
    ("window 30/20", 1, 4, 4, 400, 450, False, (30, 20), None, "bfloat16", "bhsd"),
    ("softcap", 2, 4, 4, 300, 300, True, (-1, -1), 30.0, "bfloat16", "bhsd"),
    ("fp16 gqa nc", 2, 4, 1, 129, 257, False, (-1, -1), None, "float16", "bhsd"),
    ("bshd causal", 2, 8, 8, 384, 384, True, (-1, -1), None, "bfloat16", "bshd"),
    ("sq1", 2, 4, 4, 1, 5, False, (-1, -1), None, "bfloat16", "bhsd"),
]
PUZZLE = (8, 16, 16, 2048, 64)


def forward(q, k, v, causal, window, softcap, knobs):
    """(o, lse) of the plan with ``knobs`` (None: the default plan), launched as oss.attention's op does."""
    import torch

    from onlinesoftmax.attention import api
    from onlinesoftmax.attention.plan import Knobs, plan_forward
    from onlinesoftmax.target import target_of
    left, right = window
    p = api._op_problem(q, k, v, causal, left, right, softcap or 0.0)
    plan = plan_forward(p, target_of(torch.device("cuda")), Knobs(forward=knobs or {}))
    return api._forward_triton(q, k, v, p, plan, q.shape[-1] ** -0.5, softcap or 0.0)


def _check(job):
    """Worker: one variant (or the default) on every check case of its head dims: compiles and checks."""
    import torch
    name, knobs, dims = job
    t0 = time.time()
    out = {}
    g = torch.Generator(device="cuda").manual_seed(hash(name) & 0xFFFF)
    for D in dims:
        for case in CASES:
            out[f"D{D} {case[0]}"] = check_case(case, D, g, forward, knobs)
    return name, round(time.time() - t0, 1), out


def puzzle(report):
    """The causal D = 64 puzzle with d8f0334's D = 64 plan (persistent, s4, folded) patched into oss.attention."""
    import torch

    from onlinesoftmax.attention import api
    from onlinesoftmax.attention.plan import Knobs
    from onlinesoftmax.bench.harness import BenchContext, _timed
    from onlinesoftmax.bench.suites.attention import _case
    from onlinesoftmax.target import target_of

    orig = api.plan_attention
    old_d64 = Knobs(forward=VARIANTS["pers64"][0])

    def patched(p, target, backend, knobs=Knobs()):
        if p.D == 64 and not p.varlen and p.tma and knobs == Knobs():
            knobs = old_d64
        return orig(p, target, backend, knobs)

    out = {}
    B, H, Hkv, S, D = PUZZLE
    api.plan_attention = patched
    try:
        ctx = BenchContext(torch.device("cuda"))
        for causal in (False, True):
            r = out["causal" if causal else "nc"] = {}
            try:
                res, _ = _timed(_case(ctx, B, H, Hkv, S, D, causal, "fwd"), ctx)
                r["bench harness"] = {n: (None if v[0] is None else round(v[0], 4), v[1], v[2][:80])
                                      for n, v in res.items()}
            except Exception as e:  # noqa: BLE001
                r["bench harness"] = err_head(e)
            q, k, v = (torch.randn(B, h, S, D, device="cuda", dtype=torch.bfloat16) for h in (H, Hkv, Hkv))
            sets = [(q, k, v), tuple(torch.randn_like(t) for t in (q, k, v))]
            fns = {"public": lambda q, k, v, c=causal: api.attention(q, k, v, causal=c),
                   "knob call": lambda q, k, v, c=causal: forward(q, k, v, c, (-1, -1), None,
                                                                  VARIANTS["pers64"][0])[0]}
            for n, fn in fns.items():
                try:
                    r[n + " ms"] = round(bench_ms(fn, sets, 25, 100), 4)
                except Exception as e:  # noqa: BLE001
                    r[n + " ms"] = err_head(e)
            try:        # device time only: CUDA-graph replay of the public call
                api.attention(q, k, v, causal=causal)
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    api.attention(q, k, v, causal=causal)
                torch.cuda.current_stream().wait_stream(s)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    api.attention(q, k, v, causal=causal)
                from triton.testing import do_bench
                r["graph ms"] = round(do_bench(graph.replay, warmup=25, rep=100, return_mode="median"), 4)
            except Exception as e:  # noqa: BLE001
                r["graph ms"] = err_head(e)
            try:        # host time per eager call (enqueue only; the device runs behind)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(20):
                    api.attention(q, k, v, causal=causal)
                r["host us"] = round((time.perf_counter() - t0) / 20 * 1e6, 1)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                r["host us"] = err_head(e)
            try:        # the bound launch the public call replays
                p = api._op_problem(q, k, v, causal, -1, -1, 0.0)
                plan = api.plan_attention(p, target_of(q.device), "triton").forward
                o, lse = torch.empty_like(q), torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
                strides = (*api._strides(q), *api._strides(k), *api._strides(v), *api._strides(o),
                           *api._lse_strides(p, lse))
                bk = api._caches()[0](p, plan, strides)
                r["plan"] = str(plan)
                r["launch"] = dict(compiled=[f"{e[2].hash[:12]} shared {e[2].metadata.shared}"
                                             for e in bk._compiled.values()], grid=list(bk.grid),
                                   meta={a: bk.meta[a] for a in ("HEAD_DIM", "STAGES", "HAS_RIGHT", "REVERSE",
                                                                 "FOLD", "PAIRS", "O_DIRECT") if a in bk.meta})
            except Exception as e:  # noqa: BLE001
                r["launch"] = err_head(e)
            print(f"[{time.time() - T0:5.1f} s] puzzle {'causal' if causal else 'nc'} "
                  f"{ {a: b for a, b in r.items() if a not in ('launch', 'plan')} }", flush=True)
            del q, k, v, sets
    finally:
        api.plan_attention = orig
    report["puzzle"] = out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()

    import torch
    import triton

    from onlinesoftmax.attention import api
    from onlinesoftmax.bench.suites.attention import sdpa

    report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  variants={k: v[0] for k, v in VARIANTS.items()}, checks={}, rows=[])
    jobs = [("default D64", None, D64), ("default D128", None, D128)]
    jobs += [(n, kn, dims) for n, (kn, dims) in VARIANTS.items()]
    ok = run_checks(_check, jobs, 60, report, 18)
    print(f"[{time.time() - T0:5.1f} s] checked; timed: {sorted(ok)}", flush=True)

    try:
        puzzle(report)
    except Exception as e:  # noqa: BLE001
        report["puzzle"] = err_head(e)
        print(f"puzzle failed: {err_head(e)}", flush=True)

    for B, H, Hkv, S, D, causal in SHAPES:
        if time.time() - T0 > 135:
            print(f"[{time.time() - T0:5.1f} s] out of time before {B}x{H}x{S}x{D}", flush=True)
            break
        sets = [tuple(torch.randn(B, h, S, D, device="cuda", dtype=torch.bfloat16) for h in (H, Hkv, Hkv))
                for _ in range(2)]
        flops = 4 * B * H * S * S * D / (2 if causal else 1)
        row = {"shape": f"{B}x{H}x{S}x{D}", "causal": causal}
        fns = {f"sdpa {n}": (lambda q, k, v, f=sdpa(n), c=causal: f(q, k, v, c)) for n in ("cudnn", "flash")}
        fns["default"] = lambda q, k, v, c=causal: forward(q, k, v, c, (-1, -1), None, None)[0]
        fns["public"] = lambda q, k, v, c=causal: api.attention(q, k, v, causal=c)
        for n, (kn, dims) in VARIANTS.items():
            if D in dims and n in ok:
                fns[n] = lambda q, k, v, kn=kn, c=causal: forward(q, k, v, c, (-1, -1), None, kn)[0]
        for n, fn in fns.items():
            try:
                row[n] = round(flops / bench_ms(fn, sets) / 1e9, 1)
            except Exception as e:  # noqa: BLE001
                row[n] = err_head(e)
        report["rows"].append(row)
        print(f"[{time.time() - T0:5.1f} s] {row}", flush=True)
        del sets
        torch.cuda.empty_cache()

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "probe_fwd2.json"), "w") as f:
        json.dump(report, f, indent=1)
    print_checks(report, 18)
    print(f"\n== puzzle {PUZZLE} (D = 64 patched to d8f0334's plan: persistent s4 folded), ms")
    if isinstance(report.get("puzzle"), dict):
        for c, r in report["puzzle"].items():
            print(f"  {c:6} " + " | ".join(f"{a} {str(b)[:200]}" for a, b in r.items() if a != "plan"))
    else:
        print(f"  {report.get('puzzle')}")
    print_tflops_x_cudnn(report)
    print(f"[{time.time() - T0:5.1f} s] done")


if __name__ == "__main__":
    run_main(main)
