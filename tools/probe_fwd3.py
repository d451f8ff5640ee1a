"""The sm90 attention forward at D = 256 on the persistent grid, by knob, in one call (<= 150 s): ``o_direct``
(O stored from registers: q 64 KB + two ring slots of k, v 128 KB leave no room for O's 64 KB staging buffer),
with ``fold`` (the row max over q kᵀ, p = 2^(qk·c − m) one FFMA per score) and ``pairs`` (query blocks i and
n_m − 1 − i per work unit: equal causal key counts, a balanced round-robin), beside the default (per tile,
unfolded), the per-tile kernel folded, and SDPA cuDNN / flash.

1. each variant runs in its own worker process (compiles, then checks against fp32 torch: causal with an odd
   number of query blocks, window, softcap, GQA, Sq != Sk both ways, fp16, [B, S, H, D] strides; fresh inputs,
   outputs poisoned with NaN); a worker that errs or does not report within 75 s (a hung barrier) is not timed;
2. TFLOP/s (bf16) at 2 × 16 × 4096 × 256 causal / not and 4 × 16 × 2048 × 256 causal / not: do_bench medians
   over two input sets (384 MB, past the 60 MB L2) eagerly, and of a CUDA graph replaying one call on each set
   (device time only: eager − graph is the host's share).
Table last; JSON to ``--out``.   ``PYTHONPATH=src python tools/probe_fwd3.py --out DIR``
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
    run_checks,
    run_main,
)

T0 = time.time()
SM90 = {"kernel": "sm90"}
PERS = {"kernel": "sm90", "programs": -1, "o_direct": True}
VARIANTS = {  # name: forward knobs (None: the default plan, per tile, unfolded)
    "default": None,
    "tile fold": dict(SM90, fold=True),
    "pers od": dict(PERS),
    "pers od fold": dict(PERS, fold=True),
    "pers od pairs": dict(PERS, pairs=True),
    "pers od fold pairs": dict(PERS, fold=True, pairs=True),
}
SHAPES = [  # (B, H, S, causal), D = 256
    (2, 16, 4096, True), (2, 16, 4096, False), (4, 16, 2048, True), (4, 16, 2048, False),
]
D = 256
CASES = [  # name, B, H, Hkv, Sq, Sk, causal, window, softcap, dtype, layout
    ("nc 1024", 1, 4, 4, 1024, 1024, False, (-1, -1), None, "bfloat16", "bhsd"),     # the timed specialisations
    ("causal 1024", 1, 4, 4, 1024, 1024, True, (-1, -1), None, "bfloat16", "bhsd"),
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
    """Worker: one variant on every check case: compiles and checks (o and lse)."""
    import torch
    name, knobs = job
    t0 = time.time()
    out = {}
    g = torch.Generator(device="cuda").manual_seed(hash(name) & 0xFFFF)
    for case in CASES:
        out[case[0]] = check_case(case, D, g, forward, knobs)
    return name, round(time.time() - t0, 1), out


def graph_ms(fn, sets, warmup=10, rep=40):
    """do_bench median (ms per call) of a CUDA graph holding one call of fn on each input set (device time)."""
    import torch
    from triton.testing import do_bench
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for x in sets:
            fn(*x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for x in sets:
            fn(*x)
    ms = do_bench(graph.replay, warmup=warmup, rep=rep, return_mode="median") / len(sets)
    del graph
    return ms


def plan_of(knobs, causal):
    """The plan a variant runs at the timed shapes (str), or the error of its plan."""
    import torch

    from onlinesoftmax.attention import api
    from onlinesoftmax.attention.plan import Knobs, plan_forward
    from onlinesoftmax.target import target_of
    try:
        q = torch.empty(2, 16, 4096, D, device="cuda", dtype=torch.bfloat16)
        p = api._op_problem(q, q, q, causal, -1, -1, 0.0)
        f = plan_forward(p, target_of(q.device), Knobs(forward=knobs or {}))
        return (f"{f.kernel} bn{f.block_n} s{f.num_stages} fold={int(f.fold)} programs={f.programs} "
                f"pairs={int(f.pairs)} od={int(f.o_direct)}")
    except Exception as e:  # noqa: BLE001
        return err_head(e)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()

    import torch
    import triton

    from onlinesoftmax.bench.suites.attention import sdpa

    report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  variants=dict(VARIANTS), plans={n: [plan_of(kn, c) for c in (False, True)]
                                                  for n, kn in VARIANTS.items()}, checks={}, rows=[])
    for n, pl in report["plans"].items():
        print(f"plan {n:18} nc: {pl[0]} | causal: {pl[1]}", flush=True)
    jobs = list(VARIANTS.items())
    ok = run_checks(_check, jobs, 75, report, 18)
    print(f"[{time.time() - T0:5.1f} s] checked; timed: {sorted(ok)}", flush=True)

    for B, H, S, causal in SHAPES:
        if time.time() - T0 > 132:
            print(f"[{time.time() - T0:5.1f} s] out of time before {B}x{H}x{S}x{D}", flush=True)
            break
        sets = [tuple(torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                for _ in range(2)]
        flops = 4 * B * H * S * S * D / (2 if causal else 1)
        row = {"shape": f"{B}x{H}x{S}x{D}", "causal": causal, "eager": {}, "graph": {}}
        fns = {f"sdpa {n}": (lambda q, k, v, f=sdpa(n), c=causal: f(q, k, v, c)) for n in ("cudnn", "flash")}
        for n, kn in VARIANTS.items():
            if n in ok:
                fns[n] = lambda q, k, v, kn=kn, c=causal: forward(q, k, v, c, (-1, -1), None, kn)[0]
        for n, fn in fns.items():
            for mode, timer in (("eager", bench_ms), ("graph", graph_ms)):
                try:
                    row[mode][n] = round(flops / timer(fn, sets) / 1e9, 1)
                except Exception as e:  # noqa: BLE001
                    row[mode][n] = err_head(e)
        report["rows"].append(row)
        print(f"[{time.time() - T0:5.1f} s] {row}", flush=True)
        del sets
        torch.cuda.empty_cache()

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "probe_fwd3.json"), "w") as f:
        json.dump(report, f, indent=1)
    print_checks(report, 18)
    print("\n== TFLOP/s, bf16, D = 256: graph replay (device time) / eager do_bench; x cuDNN (graph) in brackets")
    for r in report["rows"]:
        cud = r["graph"].get("sdpa cudnn")
        print(f"  {r['shape']:14} {'causal' if r['causal'] else 'nc'}")
        for n, g in r["graph"].items():
            e = r["eager"].get(n)
            if isinstance(g, float):
                x = f"({g / cud:.2f})" if isinstance(cud, float) else ""
                print(f"    {n:18} {g:6.0f} {x:6} / {e if isinstance(e, str) else f'{e:.0f}'}")
            else:
                print(f"    {n:18} {str(g)[:100]} / {str(e)[:60]}")
    print(f"[{time.time() - T0:5.1f} s] done")


if __name__ == "__main__":
    run_main(main)
