"""The sm90 (Gluon, TMA + wgmma + producer warp) attention forward on the device, in one call: correctness against
the fp32 torch path on odd shapes (then the old Triton kernel's error beside it), then TFLOP/s of plan variants
beside the Triton kernel, SDPA cuDNN and flash, and the bf16 matmul ceiling. Table last; JSON to ``--out``.

``PYTHONPATH=src python tools/attention_sm90_probe.py [--out DIR] [--quick]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
import traceback

import torch
from probe_util import rel
from triton.testing import do_bench

from onlinesoftmax.attention import api
from onlinesoftmax.attention.plan import ForwardPlan, Problem, plan_attention
from onlinesoftmax.bench.suites.attention import sdpa
from onlinesoftmax.target import target_of

DEV = "cuda"


def poison():
    """Leave NaN in the caching allocator's free blocks: an output the kernel does not write shows up."""
    x = torch.full((96 << 20,), float("nan"), dtype=torch.float32, device=DEV)
    del x


def problem_of(q, k, v, causal, window, softcap, cu=None, max_q=0, max_k=0):
    left, right = window
    if cu is None:
        p = api._problem(q, k, causal, window, v)
    else:
        p = api._varlen_problem(q, k, v, cu[0], max_q, max_k, causal, left, right, softcap or 0.0)
    return dataclasses.replace(p, softcap=bool(softcap))


def run(q, k, v, p: Problem, plan: ForwardPlan, scale, softcap, cu=None):
    return api._forward_triton(q, k, v, p, plan, scale, softcap or 0.0, cu)


def default_plans(p: Problem):
    plan = plan_attention(p, target_of(torch.device(DEV)), "triton").forward
    old = plan_attention(dataclasses.replace(p, tma=False), target_of(torch.device(DEV)), "triton").forward
    return plan, old


def ref_dense(q, k, v, scale, causal, window, softcap):
    left, right = window
    right = 0 if causal else right
    return api._torch_attention(q.float(), k.float(), v.float(), scale, left, right, softcap)


def ref_varlen(q, k, v, cu_q, cu_k, scale, causal, window, softcap):
    H = q.shape[1]
    os_, ls = [], []
    for b in range(len(cu_q) - 1):
        a0, a1, c0, c1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        qb = q[a0:a1].transpose(0, 1)[None]
        kb = k[c0:c1].transpose(0, 1)[None]
        vb = v[c0:c1].transpose(0, 1)[None]
        if a1 == a0:
            os_.append(torch.zeros(0, H, q.shape[2], device=DEV))
            ls.append(torch.zeros(H, 0, device=DEV))
            continue
        if c1 == c0:
            os_.append(torch.zeros(a1 - a0, H, q.shape[2], device=DEV))
            ls.append(torch.full((H, a1 - a0), -math.inf, device=DEV))
            continue
        o, lse = ref_dense(qb, kb, vb, scale, causal, window, softcap)
        os_.append(o[0].transpose(0, 1))
        ls.append(lse[0])
    return torch.cat(os_), torch.cat(ls, 1)


CASES = [  # name, B, H, Hkv, Sq, Sk, D, causal, window, softcap, dtype, layout
    ("nc 300", 2, 4, 4, 300, 300, 128, False, (-1, -1), None, torch.bfloat16, "bhsd"),
    ("causal gqa4 257", 2, 8, 2, 257, 257, 128, True, (-1, -1), None, torch.bfloat16, "bhsd"),
    ("causal Sq<Sk d64", 1, 4, 4, 100, 333, 64, True, (-1, -1), None, torch.bfloat16, "bhsd"),
    ("causal Sq>Sk", 1, 4, 4, 333, 100, 128, True, (-1, -1), None, torch.bfloat16, "bhsd"),
    ("window causal", 1, 4, 4, 500, 500, 128, True, (50, -1), None, torch.bfloat16, "bhsd"),
    ("window 30/20", 1, 4, 4, 400, 450, 128, False, (30, 20), None, torch.bfloat16, "bhsd"),
    ("softcap", 2, 4, 4, 300, 300, 128, True, (-1, -1), 30.0, torch.bfloat16, "bhsd"),
    ("d256 causal", 1, 4, 4, 200, 200, 256, True, (-1, -1), None, torch.bfloat16, "bhsd"),
    ("fp16 d64", 2, 4, 1, 129, 257, 64, False, (-1, -1), None, torch.float16, "bhsd"),
    ("bshd causal", 2, 8, 8, 384, 384, 128, True, (-1, -1), None, torch.bfloat16, "bshd"),
    ("sq1", 2, 4, 4, 1, 5, 128, False, (-1, -1), None, torch.bfloat16, "bhsd"),
    ("big causal", 2, 16, 4, 2048, 2048, 128, True, (-1, -1), None, torch.bfloat16, "bhsd"),
]


def make(B, H, Hkv, Sq, Sk, D, dtype, layout):
    if layout == "bshd":
        q = torch.randn(B, Sq, H, D, device=DEV, dtype=dtype).transpose(1, 2)
        k = torch.randn(B, Sk, Hkv, D, device=DEV, dtype=dtype).transpose(1, 2)
        v = torch.randn(B, Sk, Hkv, D, device=DEV, dtype=dtype).transpose(1, 2)
    else:
        q = torch.randn(B, H, Sq, D, device=DEV, dtype=dtype)
        k = torch.randn(B, Hkv, Sk, D, device=DEV, dtype=dtype)
        v = torch.randn(B, Hkv, Sk, D, device=DEV, dtype=dtype)
    return q, k, v


def check_all(variants):
    rows = []
    for name, B, H, Hkv, Sq, Sk, D, causal, window, softcap, dtype, layout in CASES:
        try:
            q, k, v = make(B, H, Hkv, Sq, Sk, D, dtype, layout)
            scale = D ** -0.5
            p = problem_of(q, k, v, causal, window, softcap)
            plan, old = default_plans(p)
            ro, rl = ref_dense(q, k, v, scale, causal, window, softcap)
            poison()
            oo, ol = run(q, k, v, p, old, scale, softcap)
            row = {"case": name, "plan": plan.kernel, "old_o": rel(oo, ro), "old_lse": rel(ol, rl)}
            base = ForwardPlan("sm90", 128, 128 if D <= 128 else 64, 4, 2)
            for vname, kn in variants.items():
                vp = dataclasses.replace(base, **kn)
                try:
                    poison()
                    o, lse = run(q, k, v, p, vp, scale, softcap)
                    torch.cuda.synchronize()
                    row[vname] = (rel(o, ro), rel(lse, rl))
                except Exception as e:  # noqa: BLE001
                    row[vname] = repr(e)[:120]
            rows.append(row)
        except Exception as e:  # noqa: BLE001
            rows.append({"case": name, "error": repr(e)[:300]})
            traceback.print_exc()
    # varlen with empty sequences
    try:
        lq = [0, 1, 7, 130, 257, 64, 0]
        lk = [5, 0, 7, 200, 257, 300, 3]
        H, Hkv, D = 8, 2, 128
        cu_q = torch.tensor([0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int32, device=DEV)
        cu_k = torch.tensor([0] + list(torch.tensor(lk).cumsum(0)), dtype=torch.int32, device=DEV)
        q = torch.randn(sum(lq), H, D, device=DEV, dtype=torch.bfloat16)
        k = torch.randn(sum(lk), Hkv, D, device=DEV, dtype=torch.bfloat16)
        v = torch.randn(sum(lk), Hkv, D, device=DEV, dtype=torch.bfloat16)
        for causal in (False, True):
            p = problem_of(q, k, v, causal, (-1, -1), None, (cu_q, cu_k), max(lq), max(lk))
            plan, old = default_plans(p)
            ro, rl = ref_varlen(q, k, v, cu_q, cu_k, D ** -0.5, causal, (-1, -1), None)
            poison()
            oo, ol = run(q, k, v, p, old, D ** -0.5, None, (cu_q, cu_k))
            row = {"case": f"varlen causal={causal}", "plan": plan.kernel, "old_o": rel(oo, ro),
                   "old_lse": rel(ol, rl)}
            for vname, kn in variants.items():
                vp = dataclasses.replace(ForwardPlan("sm90", 128, 128, 4, 2), **kn)
                poison()
                o, lse = run(q, k, v, p, vp, D ** -0.5, None, (cu_q, cu_k))
                torch.cuda.synchronize()
                row[vname] = (rel(o, ro), rel(lse, rl))
            rows.append(row)
    except Exception as e:  # noqa: BLE001
        rows.append({"case": "varlen", "error": repr(e)[:300]})
        traceback.print_exc()
    return rows


SHAPES = [  # B, H, Hkv, S, D
    (4, 32, 32, 4096, 128), (8, 16, 16, 2048, 64), (4, 32, 8, 4096, 128), (1, 32, 32, 16384, 128),
    (16, 32, 32, 1024, 128), (2, 32, 32, 8192, 128), (2, 16, 16, 4096, 256),
]


def matmul_ceiling() -> float:
    """bf16 8192³ matmul TFLOP/s (random inputs), the ceiling of the run."""
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    ms = do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    return 2 * 8192 ** 3 / ms / 1e9


def time_all(variants, quick, budget=1e9):
    out = [{"shape": "matmul 8192^3", "tflops": matmul_ceiling()}]
    shapes = SHAPES[:2] if quick else SHAPES
    t0 = time.time()
    for B, H, Hkv, S, D in shapes:
        if time.time() - t0 > budget:
            out.append({"shape": f"{B}x{H}/{Hkv}x{S}x{D}", "skipped": "time budget"})
            continue
        q, k, v = make(B, H, Hkv, S, S, D, torch.bfloat16, "bhsd")
        scale = D ** -0.5
        for causal in (False, True):
            if Hkv != H and not causal:
                continue
            flops = 4 * B * H * S * S * D / (2 if causal else 1)
            row = {"shape": f"{B}x{H}/{Hkv}x{S}x{D}", "causal": causal}
            p = problem_of(q, k, v, causal, (-1, -1), None)
            plan, old = default_plans(p)
            fns = {name: (lambda f=sdpa(name), q=q, k=k, v=v, c=causal: f(q, k, v, c)) for name in ("cudnn", "flash")}
            fns["triton"] = lambda q=q, k=k, v=v, p=p, old=old, scale=scale: run(q, k, v, p, old, scale, None)
            base = ForwardPlan("sm90", 128, 128 if D <= 128 else 64, 4, 2)
            for vname, kn in variants.items():
                vp = dataclasses.replace(base, **kn)
                fns[vname] = (lambda vp=vp, q=q, k=k, v=v, p=p, scale=scale: run(q, k, v, p, vp, scale, None))
            ref = None
            for name, fn in fns.items():
                try:
                    o = fn()
                    o = o[0] if isinstance(o, tuple) else o
                    if ref is None:
                        ref = o.float()
                    e = rel(o, ref)
                    ms = do_bench(fn, warmup=25, rep=100 if quick else 200, return_mode="median")
                    row[name] = round(flops / ms / 1e9, 1)
                    if e > 2e-2:
                        row[name + "_err"] = e
                except Exception as ex:  # noqa: BLE001
                    row[name] = None
                    row[name + "_error"] = repr(ex)[:200]
            out.append(row)
            print(row, flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return out


VARIANTS = {  # knob variants of the sm90 plan (docs/tuning.md has what each measured)
    "ws": {},
    "ws s3": {"num_stages": 3},
    "ws nooverlap": {"overlap": False},
    "ws bn64s4": {"block_n": 64, "num_stages": 4},
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget", type=float, default=1e9, help="seconds of timing after which no new shape starts")
    args = ap.parse_args()
    torch.manual_seed(0)
    checks = check_all({k: v for k, v in VARIANTS.items() if k in ("ws", "ws s3", "ws nooverlap")})
    timings = time_all(VARIANTS, args.quick, args.budget)
    with open(os.path.join(args.out, "attention_sm90_probe.json"), "w") as f:
        json.dump({"checks": checks, "timings": timings, "device": torch.cuda.get_device_name()}, f, indent=1)
    print("\n== checks (relative max error of o, lse vs fp32 torch; old = the tl.dot kernel)")
    for r in checks:
        print(r)
    print("\n== TFLOP/s")
    for r in timings:
        print(r)


if __name__ == "__main__":
    main()
