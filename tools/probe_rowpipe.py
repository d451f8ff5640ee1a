"""The row kernel's passes with blocks of x in flight (``SampleKnobs(row_stages=S, row_block=N)``: a pipelined loop,
cp.async into shared memory) against one block at a time (S = 1), in one process on the same inputs. H200.

    PYTHONPATH=src python tools/probe_rowpipe.py --out DIR [--variants 1024x1,1024x4,512x4,512x8]

``sample(x, temperature=T, top_p=P)`` on flat N(0, 1) rows (every row takes the row kernel; fp32, and bf16 at B = 8),
``row="radix"`` at B = 8 too; do_bench medians (µs), best of two rounds; whether four draws from one generator
state give the same ids as the first variant (another block size sums in another order: a draw at a boundary may
move by rounding), and every variant's ids against torch's sort chain on the same uniforms (``backend="torch"``).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from triton.testing import do_bench

from onlinesoftmax.topk.plan import SampleKnobs
from onlinesoftmax.topk.sampling import sample

CASES = (("bins", 1, 128256, torch.float32), ("bins", 8, 128256, torch.float32), ("bins", 64, 128256, torch.float32),
         ("bins", 256, 128256, torch.float32), ("bins", 8, 262144, torch.float32), ("bins", 8, 128256, torch.bfloat16),
         ("radix", 8, 128256, torch.float32), ("radix", 64, 128256, torch.float32))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--variants", default="1024x1,1024x2,1024x4,512x4,512x8")
    ap.add_argument("--cases", default="", help="indices into CASES, comma-separated (default: all)")
    args = ap.parse_args()
    picked = [CASES[int(i)] for i in args.cases.split(",")] if args.cases else CASES
    variants = [tuple(int(a) for a in v.split("x")) for v in args.variants.split(",")]
    torch.manual_seed(0)
    res, agree, exact = {}, {}, {}
    inputs = []
    for row, B, V, dtype in picked:
        x = torch.randn(B, V, device="cuda").to(dtype)
        u = torch.rand(4, B, device="cuda")
        ref = torch.stack([sample(x, temperature=0.8, top_p=0.9, uniform=u[i], backend="torch")[0] for i in range(4)])
        inputs.append((f"{row} B{B} V{V} {str(dtype)[6:]}", row, x, u, ref))
    for rnd in range(2):
        for block, stages in variants:
            name = f"{block}x{stages}"
            for label, row, x, u, ref in inputs:
                knobs = SampleKnobs(row=row, row_block=block, row_stages=stages)
                got = torch.stack([sample(x, temperature=0.8, top_p=0.9, uniform=u[i], knobs=knobs)[0]
                                   for i in range(4)])
                first = agree.setdefault(label, {}).setdefault("ids", got)
                agree[label][name] = bool(torch.equal(first, got))
                exact.setdefault(label, {})[name] = int((got == ref).sum())
                ms = do_bench(lambda: sample(x, temperature=0.8, top_p=0.9, knobs=knobs), warmup=10, rep=100)
                res.setdefault(label, {}).setdefault(name, []).append(ms)
                print(rnd, name, label, f"{ms * 1e3:.1f} us", flush=True)
    summary = {}
    for label, d in res.items():
        summary[label] = {name: dict(us=round(min(v) * 1e3, 1), same_ids_as_first=agree[label][name],
                                     ids_equal_torch_of_4B=exact[label][name]) for name, v in d.items()}
        print(label, summary[label], flush=True)
    with open(os.path.join(args.out, "probe_rowpipe.json"), "w") as f:
        json.dump(dict(summary=summary, raw=res, commit=os.environ.get("ONLINESOFTMAX_COMMIT", "")), f, indent=1)


if __name__ == "__main__":
    main()
