"""Where a dense decode call's time goes on the H200: torch.profiler's CUDA kernel times per call for the default
plan of ``attention_with_kvcache``, the per-sequence splits (``Knobs(balanced=False)``), the balanced schedule per kv
head and over one line of all kv heads (``cross``), and ``oss.attention``'s full-cache dispatch, beside SDPA
cuDNN's kernels, at issue 26's shapes.

    PYTHONPATH=src python tools/probe_decode_prof.py --out DIR

bf16, D = 128, Sq = 1, full lengths; 20 calls profiled after warm-up; µs per call by kernel name, and the wall
time per call by do_bench in the same run."""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe_decode2 as pd2  # noqa: E402
from probe_util import kernel_times  # noqa: E402

import onlinesoftmax as oss  # noqa: E402
from onlinesoftmax.decode.api import explain  # noqa: E402
from onlinesoftmax.decode.plan import Knobs  # noqa: E402

SHAPES = [(8, 32, 32, 32768), (1, 32, 32, 131072), (8, 32, 8, 32768), (64, 32, 8, 4096), (8, 32, 8, 16384),
          (8, 32, 8, 4096)]
N = 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="probe_out")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows = []
    D = pd2.D
    for B, H, Hkv, S in SHAPES:
        shape = f"B{B} H{H}/{Hkv} S{S // 1024}K"
        sl = torch.full((B,), S, dtype=torch.int32, device="cuda")
        nbytes = 2 * Hkv * B * S * D * 2
        q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def cudnn():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=H != Hkv)
        impls = {"cudnn": cudnn}
        for name, kw in {"default": {}, "per-seq": dict(balanced=False), "cross": dict(balanced=True, cross=True),
                         "balanced": dict(balanced=True)}.items():
            plan = explain(q, k, v, sl, backend="triton", knobs=Knobs.of(**kw))
            impls[name] = (lambda plan=plan: pd2.run_plan(plan, q, k, v, sl, None))
        impls["attention"] = lambda: oss.attention(q, k, v, causal=True)      # the full-cache dispatch
        for name, fn in impls.items():
            ms = pd2.bench(fn)
            kt = kernel_times(fn, N, 60)
            rows.append(dict(shape=shape, impl=name, us=ms * 1e3, gbs=nbytes / ms / 1e6, kernels=kt))
            pd2.log(f"{shape:18} {name:8} {ms * 1e3:8.1f} us {nbytes / ms / 1e6:6.0f} GB/s  "
                    + "  ".join(f"{n}: {t:.1f}" for n, t in sorted(kt.items(), key=lambda x: -x[1])))
        k = v = None
        torch.cuda.empty_cache()
    with open(os.path.join(a.out, "probe_decode_prof.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
