"""One launch each of the long-row kernels, for Nsight Compute (the warm-up launches are not profiled):

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section MemoryWorkloadAnalysis python benchmarks/ncu_coop.py [M N dtype]

Variants: the forward's default plan (the shared-memory coop kernel, kernels/softmax_smem.py) and its register
kernels, then the softmax backward's default plan at the same shape (its shared-memory kernel with REG reaches
96-99 % of the copy ceiling where the forward's stays at 91-94 % on the same row barrier: the comparison the docs
name as the next measurement).
"""

from __future__ import annotations

import sys

import torch

from onlinesoftmax.kernels import softmax as K
from onlinesoftmax.ops.softmax import row_geometry

VARIANTS = {"default": None,
            "registers": {"path": "coop", "smem": False}}


def main(m=1024, n=262144, dtype="float32"):
    x = torch.randn(m, n, device="cuda").to(getattr(torch, dtype)) * 3
    out = torch.empty_like(x)
    M, N, inner, (gx, gy) = row_geometry([x, out], 1)
    plans = {name: K._forward_plan(dict(cfg), x, out, gx, gy, M, N, inner, K.SOFTMAX) if cfg else None
             for name, cfg in VARIANTS.items()}

    def run(name):
        if plans[name] is None:
            K.forward(x, out, gx, gy, M, N, inner, K.SOFTMAX)
        else:
            K._run(plans[name], (x, out), x.device)

    for name in VARIANTS:                      # compile and warm
        run(name)
        torch.testing.assert_close(out, torch.softmax(x, -1))
    y, dy, dx = torch.softmax(x.float(), -1).to(x.dtype), torch.randn_like(x), torch.empty_like(x)
    _, _, _, bgeo = row_geometry([y, dy, dx], 1)
    K.backward(y, dy, dx, *bgeo, M, N, inner, False)
    # 16-bit dx: torch's default bf16 tolerance (atol 1e-5) is below one rounding of dx where y·(dy - Σ y·dy)
    # cancels (a bf16 run of this script stopped here on 33 of 5.4e8 elements, 1.3e-4 apart)
    tol = {} if x.dtype == torch.float32 else dict(atol=1e-3, rtol=2e-2)
    torch.testing.assert_close(dx, torch._softmax_backward_data(dy, y, -1, x.dtype), **tol)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name in VARIANTS:
        run(name)
        print("profiled:", name, K.last_launch(), flush=True)
    K.backward(y, dy, dx, *bgeo, M, N, inner, False)
    print("profiled: backward", K.last_launch(), flush=True)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    a = sys.argv[1:]
    main(*(int(v) for v in a[:2]), *a[2:3])
