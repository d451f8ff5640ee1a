"""Where an attention backward's time goes on the H200: torch.profiler's CUDA kernel times per backward call, ours
(through autograd: Δ with the dQ accumulator's zeroing, the dK / dV / dQ kernel, the dQ cast) beside SDPA cuDNN's.

    PYTHONPATH=src python tools/probe_attn_prof.py --out DIR

bf16, D = 128 unless said; 10 backward calls profiled after warm-up (retain_graph), µs per call by kernel name."""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_util import kernel_times  # noqa: E402

import onlinesoftmax as oss  # noqa: E402

SHAPES = [(16, 32, 1024, 128, True), (16, 32, 1024, 128, False), (4, 32, 4096, 128, False),
          (4, 32, 4096, 128, True), (8, 16, 2048, 64, True)]
N = 10


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="probe_out")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for B, H, S, D, causal in SHAPES:
        shape = f"{B}x{H}x{S}x{D}{' causal' if causal else ''}"
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        do = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
        o_ours = oss.attention(q, k, v, causal=causal)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            o_cudnn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        for name, o in (("ours", o_ours), ("cudnn", o_cudnn)):
            def fn(o=o, inputs=(q, k, v), do=do):
                torch.autograd.grad(o, inputs, do, retain_graph=True)
            kt = kernel_times(fn, N, 70)
            tot = sum(kt.values())
            rows.append(dict(shape=shape, impl=name, kernels=kt, total_us=tot))
            print(f"{shape:24} {name:6} {tot:8.1f} us  " + "  ".join(
                f"{n}: {t:.1f}" for n, t in sorted(kt.items(), key=lambda x: -x[1])), flush=True)
        torch.cuda.empty_cache()
    with open(os.path.join(a.out, "probe_attn_prof.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
