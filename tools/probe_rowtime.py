"""Where a ``sample`` call's GPU time goes, kernel by kernel (torch.profiler's CUDA activity): top_p alone on flat
rows (the row kernel's rows) and top_k 50 + top_p 0.9 (step 1 decides every row), fp32, V = 128256, B = 1 / 8 / 64,
for each ``SampleKnobs(row=...)``. H200, <= 60 s.

    PYTHONPATH=src python tools/probe_rowtime.py --out DIR
"""

from __future__ import annotations

import argparse
import collections
import json
import os

import torch
from torch.profiler import ProfilerActivity, profile

from onlinesoftmax.topk.plan import ROWS, SampleKnobs
from onlinesoftmax.topk.sampling import sample

CALLS = 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    torch.manual_seed(0)
    res = {}
    for B in (1, 8, 64):
        x = torch.randn(B, 128256, device="cuda")
        for label, kw in (("top_p 0.9", dict(temperature=0.8, top_p=0.9)),
                          ("top_k 50 + top_p 0.9", dict(temperature=0.8, top_k=50, top_p=0.9))):
            for row in ROWS:
                knobs = SampleKnobs(row=row)
                for _ in range(3):
                    sample(x, knobs=knobs, **kw)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(CALLS):
                        sample(x, knobs=knobs, **kw)
                    torch.cuda.synchronize()
                per = collections.defaultdict(float)
                for e in prof.events():
                    if e.device_type == torch.autograd.DeviceType.CUDA:
                        per[e.name[:60]] += (e.time_range.end - e.time_range.start) / CALLS
                key = f"B{B} {label} row={row}"
                res[key] = {k: round(v, 1) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}
                print(key, res[key], flush=True)
    with open(os.path.join(args.out, "probe_rowtime.json"), "w") as f:
        json.dump(dict(us_per_call=res, commit=os.environ.get("ONLINESOFTMAX_COMMIT", "")), f, indent=1)


if __name__ == "__main__":
    main()
