"""Tile sweep for the tl.dot attention kernels on the device (one call; the sm90 forward's knobs are swept by
tools/attention_sm90_probe.py): forward and backward configurations of the plan's fields (through ``Knobs``) at
the issue's shapes, beside SDPA cuDNN / flash, with the bf16 matmul ceiling. Every configuration is checked
against cuDNN before it is timed. Prints a table; writes JSON to ``$OUT``.

``PYTHONPATH=src python tools/attention_sweep.py [--quick]``
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
from triton.testing import do_bench

from onlinesoftmax.attention import api
from onlinesoftmax.attention.plan import Knobs, plan_attention
from onlinesoftmax.bench.suites.attention import sdpa
from onlinesoftmax.target import target_of

FWD_CFGS = [  # (block_m, block_n, num_warps, num_stages)
    None, (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2),
]
BWD_CFGS = [  # (block_m, block_n, block_m_dq, block_n_dq, num_warps, num_stages)
    None, (32, 128, 128, 32, 4, 2), (64, 64, 64, 64, 4, 2),
]
SHAPES = [(4, 32, 32, 4096, 128), (16, 32, 32, 1024, 128), (8, 16, 16, 2048, 64), (4, 32, 8, 4096, 128)]


def ours(knobs):
    def f(q, k, v, causal):
        scale = q.shape[-1] ** -0.5
        p = api._problem(q, k, causal, (-1, -1))
        plan = plan_attention(p, target_of(q.device), "triton", knobs)
        if q.requires_grad:
            return Fn.apply(q, k, v, causal, p, plan, scale)
        return api._forward_triton(q, k, v, p, plan.forward, scale, 0.0)[0]
    return f


class Fn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, p, plan, scale):
        api._caches()
        o, lse = api._forward_triton(q, k, v, p, plan.forward, scale, 0.0)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.p, ctx.plan, ctx.scale = p, plan, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = api._backward_triton(do, None, q, k, v, o, lse, ctx.p, ctx.plan.backward, ctx.scale, 0.0)
        return dq, dk, dv, None, None, None, None


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main():
    quick = "--quick" in sys.argv
    out = os.environ.get("OUT", ".")
    dev = torch.device("cuda")
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    mm = 2 * 8192 ** 3 / (do_bench(lambda: a @ b, rep=200, return_mode="median") * 1e-3) / 1e12
    print(f"bf16 matmul 8192^3: {mm:.0f} TFLOP/s", flush=True)
    a = b = None    # free the 256 MB operands before the sweep
    rows = []
    for B, H, Hkv, S, D in SHAPES[:2] if quick else SHAPES:
        for causal in (False, True):
            if Hkv != H and not causal:
                continue
            q = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16)
            k = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16)
            v = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16)
            do = torch.randn_like(q)
            fl = 4 * B * H * S * S * D / (2 if causal else 1)
            ref = sdpa("cudnn")(q, k, v, causal)
            impls = {"cudnn": sdpa("cudnn"), "flash": sdpa("flash")}
            for cfg in FWD_CFGS:
                kn = Knobs() if cfg is None else Knobs(forward=dict(zip(("block_m", "block_n", "num_warps",
                                                                        "num_stages"), cfg), kernel="triton"))
                impls[f"ours {cfg or 'plan'}"] = ours(kn)
            for name, f in impls.items():
                try:
                    t0 = time.time()
                    o = f(q, k, v, causal)
                    e = rel(o, ref)
                    ms = do_bench(lambda f=f: f(q, k, v, causal), rep=100, return_mode="median")
                    rows.append(dict(dir="fwd", shape=(B, H, Hkv, S, D), causal=causal, impl=name, ms=ms,
                                     tflops=fl / ms / 1e9, err=e, first_s=time.time() - t0))
                except Exception as ex:  # a configuration that does not fit is reported, not fatal
                    rows.append(dict(dir="fwd", shape=(B, H, Hkv, S, D), causal=causal, impl=name, error=str(ex)[:200]))
                print(rows[-1], flush=True)
            # backward
            qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
            o_ref = sdpa("cudnn")(qg, kg, vg, causal)
            g_ref = torch.autograd.grad(o_ref, (qg, kg, vg), do)
            bimpls = {"cudnn": sdpa("cudnn"), "flash": sdpa("flash")}
            for cfg in BWD_CFGS:
                kn = Knobs() if cfg is None else Knobs(backward=dict(zip(
                    ("block_m", "block_n", "block_m_dq", "block_n_dq", "num_warps", "num_stages"), cfg),
                    num_warps_dq=cfg[4], num_stages_dq=cfg[5]))
                bimpls[f"ours {cfg or 'plan'}"] = ours(kn)
            for name, f in bimpls.items():
                try:
                    t0 = time.time()
                    og = f(qg, kg, vg, causal)
                    g = torch.autograd.grad(og, (qg, kg, vg), do, retain_graph=True)
                    e = max(rel(x, y) for x, y in zip(g, g_ref))
                    ms = do_bench(lambda og=og: torch.autograd.grad(og, (qg, kg, vg), do, retain_graph=True),
                                  rep=100, return_mode="median")
                    rows.append(dict(dir="bwd", shape=(B, H, Hkv, S, D), causal=causal, impl=name, ms=ms,
                                     tflops=2.5 * fl / ms / 1e9, err=e, first_s=time.time() - t0))
                except Exception as ex:
                    rows.append(dict(dir="bwd", shape=(B, H, Hkv, S, D), causal=causal, impl=name, error=str(ex)[:200]))
                print(rows[-1], flush=True)
                del f
            qg = kg = vg = o_ref = g_ref = bimpls = impls = None    # free this shape before the next
            torch.cuda.empty_cache()
    with open(os.path.join(out, "attention_sweep.json"), "w") as fh:
        json.dump(dict(matmul_tflops=mm, rows=rows, torch=torch.__version__,
                       device=torch.cuda.get_device_name()), fh, indent=1)
    print(f"\nbf16 matmul {mm:.0f} TFLOP/s")
    for r in rows:
        if "tflops" in r:
            print(f"{r['dir']} {r['shape']} causal={r['causal']!s:5} {r['impl']:28} {r['tflops']:6.0f} TFLOP/s "
                  f"err {r['err']:.1e}")
        else:
            print(f"{r['dir']} {r['shape']} causal={r['causal']!s:5} {r['impl']:28} ERROR {r['error'][:80]}")


if __name__ == "__main__":
    main()
