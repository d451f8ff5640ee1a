"""One call each of softmax_topk's launches under several plans, for Nsight Compute (warm-up calls are not
profiled):

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats --section SchedulerStats python benchmarks/ncu_topk.py [B V k]

Plans: the default, and the variants named in ``VARIANTS`` (``select_path`` overrides).
"""

from __future__ import annotations

import sys

import torch

from onlinesoftmax.kernels import topk as kt

VARIANTS = {"default": {}, "wide": dict(kb=0, width=0), "radix3": dict(radix=3)}


def main(B=256, V=128256, k=50):
    x = torch.randn(B, V, device="cuda")
    ref = torch.sort(x, dim=-1, descending=True, stable=True)[1][:, :k]
    cfgs = {name: kt.select_path(B, V, k, **over) for name, over in VARIANTS.items()}
    for cfg in cfgs.values():                  # compile, warm and check
        assert torch.equal(kt.softmax_topk_2d(x, k, cfg)[1], ref)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, cfg in cfgs.items():
        kt.softmax_topk_2d(x, k, cfg)
        print("profiled:", name, cfg, flush=True)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main(*(int(v) for v in sys.argv[1:4]))
