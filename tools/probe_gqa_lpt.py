"""The causal GQA backward's ``lpt_heads`` default, A/B through autograd as ``bench attention`` times it (issue 25:
``probe_bwdpers`` measured 455 TFLOP/s with lpt_heads 132 against cuDNN's 443 calling the launches directly; the
bench's row stays at 410-422). H200, <= 90 s. (4, 32/8, 4096, 128) bf16 causal: ``torch.autograd.grad(o, (q, k,
v), do)`` on a forward graph built once per input set, four input sets rotated, do_bench medians, variants
interleaved over three rounds, SDPA's cuDNN beside.

    PYTHONPATH=src python tools/probe_gqa_lpt.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import onlinesoftmax as oss
from onlinesoftmax.attention import api
from onlinesoftmax.attention.plan import Knobs

VARIANTS = {"default": None, "lpt0": {"lpt_heads": 0}, "lpt16": {"lpt_heads": 16},
            "pers_pairs": {"programs": -1, "pairs": True}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    B, H, Hkv, S, D = 4, 32, 8, 4096, 128
    flops = 4 * B * H * S * S * D / 2 * 2.5
    base = api.plan_attention
    sets = []
    for _ in range(4):
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        sets.append((q, k, v, torch.randn_like(q)))

    def ours(knobs):
        def plan(p, t, b, kn=Knobs()):
            return base(p, t, b, Knobs(backward=knobs) if knobs else kn)
        api.plan_attention = plan
        outs = [oss.attention(q, k, v, causal=True) for q, k, v, _ in sets]
        api.plan_attention = base
        return outs

    def cudnn():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return [F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) for q, k, v, _ in sets]

    ref = None
    res = {}
    for rnd in range(3):
        for name, knobs in [*VARIANTS.items(), ("cudnn", "cudnn")]:
            outs = cudnn() if knobs == "cudnn" else ours(knobs)
            i = [0]

            def step():
                j = i[0] % 4
                i[0] += 1
                return torch.autograd.grad(outs[j], sets[j][:3], sets[j][3], retain_graph=True)
            if ref is None:
                ref = step()
            elif rnd == 0:
                got = step()
                err = max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(got, ref))
                print(name, "rel err vs first", f"{err:.2e}", flush=True)
            if knobs == "cudnn":
                plan = "cudnn"
            else:
                plan = str(api.explain(sets[0][0], sets[0][1], sets[0][2], causal=True,
                                       knobs=Knobs(backward=knobs or {})).backward)
            ms = do_bench(step, warmup=50, rep=300)
            res.setdefault(name, []).append(flops / ms / 1e9)
            print(f"round {rnd} {name}: {ms:.3f} ms {flops / ms / 1e9:.1f} TFLOP/s  {plan[:200]}", flush=True)
    summary = {n: round(sorted(v)[len(v) // 2], 1) for n, v in res.items()}
    print("median TFLOP/s:", summary)
    with open(os.path.join(args.out, "probe_gqa_lpt.json"), "w") as f:
        json.dump(dict(shape=[B, H, Hkv, S, D], causal=True, tflops=res, median=summary,
                       commit=os.environ.get("ONLINESOFTMAX_COMMIT", "")), f, indent=1)


if __name__ == "__main__":
    main()
