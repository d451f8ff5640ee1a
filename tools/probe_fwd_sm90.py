"""The sm90 attention forward's variants on the device, in one call (<= 150 s): D = 64 on the Gluon kernel, the
folded scale (one FFMA per score), the persistent grid (one program per SM looping over tiles, host descriptors,
O's store overlapping the next tile), beside the default plan, SDPA cuDNN and flash.

1. each variant runs in its own worker process (compiles, then checks against fp32 torch on odd shapes: causal,
   window, softcap, GQA, Sq != Sk, [B, S, H, D] strides, varlen with empty sequences; fresh inputs, outputs
   poisoned with NaN); a worker that errs or does not report within 75 s (a hung barrier) is not timed;
2. TFLOP/s (do_bench medians; every shape's q, k, v exceed the 60 MB L2) at the goal shapes, causal and not, bf16.
Table last; JSON to ``--out``.   ``PYTHONPATH=src python tools/probe_fwd_sm90.py --out DIR``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time

from probe_util import (
    check_case,
    err_head,
    poison,
    print_checks,
    print_tflops_x_cudnn,
    ref_attention,
    rel,
    run_checks,
    run_main,
)

T0 = time.time()
D128, D64 = (128,), (64,)
VARIANTS = {  # name: (forward knobs, head dims)
    "fold": ({"kernel": "sm90", "fold": True}, D128),
    "pers": ({"kernel": "sm90", "programs": -1, "num_stages": 2}, D128),
    "pers fold": ({"kernel": "sm90", "programs": -1, "num_stages": 2, "fold": True}, D128),
    "ws64 s3": ({"kernel": "sm90"}, D64),
    "ws64 fold s3": ({"kernel": "sm90", "fold": True}, D64),
    "ws64 fold s4": ({"kernel": "sm90", "fold": True, "num_stages": 4}, D64),
    "pers64 fold s4": ({"kernel": "sm90", "programs": -1, "num_stages": 4, "fold": True}, D64),
    "ws64 bn256 fold": ({"kernel": "sm90", "block_n": 256, "overlap": False, "num_stages": 2, "fold": True}, D64),
}
SHAPES = [(4, 32, 32, 4096, 64), (8, 16, 16, 2048, 64), (16, 32, 32, 1024, 128), (16, 32, 32, 1024, 64),
          (4, 32, 32, 4096, 128)]
CASES = [  # name, B, H, Hkv, Sq, Sk, causal, window, softcap, dtype, layout
    ("nc 1024", 1, 16, 16, 1024, 1024, False, (-1, -1), None, "bfloat16", "bhsd"),   # the timed specialisations
    ("causal 1024", 1, 16, 16, 1024, 1024, True, (-1, -1), None, "bfloat16", "bhsd"),
    ("causal gqa4 257", 2, 8, 2, 257, 257, True, (-1, -1), None, "bfloat16", "bhsd"),
    ("causal Sq<Sk", 1, 4, 4, 100, 333, True, (-1, -1), None, "bfloat16", "bhsd"),
    ("causal Sq>Sk", 1, 4, 4, 333, 100, True, (-1, -1), None, "bfloat16", "bhsd"),
    ("window 30/20", 1, 4, 4, 400, 450, False, (30, 20), None, "bfloat16", "bhsd"),
    ("softcap", 2, 4, 4, 300, 300, True, (-1, -1), 30.0, "bfloat16", "bhsd"),
    ("fp16 gqa nc", 2, 4, 1, 129, 257, False, (-1, -1), None, "float16", "bhsd"),
    ("bshd causal", 2, 8, 8, 384, 384, True, (-1, -1), None, "bfloat16", "bshd"),
    ("sq1", 2, 4, 4, 1, 5, False, (-1, -1), None, "bfloat16", "bhsd"),
]


def forward(q, k, v, causal, window, softcap, knobs, cu=None, max_q=0, max_k=0):
    """(o, lse) of the plan with ``knobs`` (None: the default plan)."""
    import torch

    from onlinesoftmax.attention import api
    from onlinesoftmax.attention.plan import Knobs, plan_forward
    from onlinesoftmax.target import target_of
    left, right = window
    if causal:
        right = 0
    D = q.shape[-1]
    if cu is None:
        p = api._problem(q, k, causal, (left, right), v)
    else:
        p = api._varlen_problem(q, k, v, cu[0], max_q, max_k, causal, left, right, softcap or 0.0)
    p = dataclasses.replace(p, softcap=bool(softcap))
    plan = plan_forward(p, target_of(torch.device("cuda")), Knobs(forward=knobs or {}))
    return api._forward_triton(q, k, v, p, plan, D ** -0.5, softcap or 0.0, cu)


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
        if knobs and knobs.get("programs"):
            continue                           # the persistent grid takes dense inputs only
        try:                                   # packed sequences, empty ones among them, GQA 4
            lq, lk = [0, 1, 7, 130, 257, 64, 0], [5, 0, 7, 200, 257, 300, 3]
            H, Hkv = 8, 2
            cu_q = torch.tensor([0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int32, device="cuda")
            cu_k = torch.tensor([0] + list(torch.tensor(lk).cumsum(0)), dtype=torch.int32, device="cuda")
            q = torch.randn(sum(lq), H, D, device="cuda", dtype=torch.bfloat16, generator=g)
            k = torch.randn(sum(lk), Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
            v = torch.randn(sum(lk), Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
            poison()
            o, lse = forward(q, k, v, True, (-1, -1), None, knobs, (cu_q, cu_k), max(lq), max(lk))
            torch.cuda.synchronize()
            e = 0.0
            for b in range(len(lq)):
                a0, a1, c0, c1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
                if a1 == a0:
                    continue
                if c1 == c0:
                    e = max(e, float(o[a0:a1].abs().max()), 0.0 if bool((lse[:, a0:a1] == -math.inf).all())
                            else math.inf)
                    continue
                ro, rl = ref_attention(*(t.transpose(0, 1)[None] for t in (q[a0:a1], k[c0:c1], v[c0:c1])), True,
                                       (-1, -1), None)
                e = max(e, rel(o[a0:a1], ro[0].transpose(0, 1)), rel(lse[:, a0:a1], rl[0]))
            out[f"D{D} varlen causal"] = (e, e)
        except Exception as ex:  # noqa: BLE001
            out[f"D{D} varlen causal"] = err_head(ex)
    return name, round(time.time() - t0, 1), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()

    import torch
    import triton
    from triton.testing import do_bench

    from onlinesoftmax.bench.suites.attention import sdpa

    report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  variants={k: v[0] for k, v in VARIANTS.items()}, checks={}, rows=[])
    jobs = [("default D64", None, (64,)), ("default D128", None, (128,))]
    jobs += [(n, kn, dims) for n, (kn, dims) in VARIANTS.items()]
    ok = run_checks(_check, jobs, 75, report, 16)
    print(f"[{time.time() - T0:5.1f} s] checked; timed: {sorted(ok)}", flush=True)

    for B, H, Hkv, S, D in SHAPES:
        q, k, v = (torch.randn(B, h, S, D, device="cuda", dtype=torch.bfloat16) for h in (H, Hkv, Hkv))
        for causal in (False, True):
            flops = 4 * B * H * S * S * D / (2 if causal else 1)
            row = {"shape": f"{B}x{H}x{S}x{D}", "causal": causal}
            fns = {f"sdpa {n}": (lambda f=sdpa(n), c=causal, q=q, k=k, v=v: f(q, k, v, c)) for n in ("cudnn", "flash")}
            fns["default"] = lambda c=causal, q=q, k=k, v=v: forward(q, k, v, c, (-1, -1), None, None)[0]
            for n, (kn, dims) in VARIANTS.items():
                if D in dims and n in ok:
                    fns[n] = lambda kn=kn, c=causal, q=q, k=k, v=v: forward(
                        q, k, v, c, (-1, -1), None, kn)[0]
            for n, fn in fns.items():
                try:
                    ms = do_bench(fn, warmup=10, rep=60, return_mode="median")
                    row[n] = round(flops / ms / 1e9, 1)
                except Exception as e:  # noqa: BLE001
                    row[n] = err_head(e)
            report["rows"].append(row)
            print(f"[{time.time() - T0:5.1f} s] {row}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "probe_fwd_sm90.json"), "w") as f:
        json.dump(report, f, indent=1)
    print_checks(report, 16)
    print_tflops_x_cudnn(report)
    print(f"[{time.time() - T0:5.1f} s] done")


if __name__ == "__main__":
    run_main(main)
