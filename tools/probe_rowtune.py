"""The row kernel's (``sampling_kernels._sample_row_kernel``) size choices, timed in one process on the same
inputs: the plan's ``ROW_MIN_CHUNK`` (the fewest elements per chunk: fewer, longer chunks per row at small B, so
fewer programs meet at each barrier) and other copies of the kernel module (e.g. another ``THIRD_MAX_CH``). H200,
about 20 s of compiles per kernel module and 10 s per variant.

    sed 's/^THIRD_MAX_CH = tl.constexpr([0-9]*)/THIRD_MAX_CH = tl.constexpr(131072)/' \
        src/onlinesoftmax/topk/sampling_kernels.py > /tmp/third.py
    PYTHONPATH=src python tools/probe_rowtune.py --min-chunk 2048,4096,8192 --kernel third=/tmp/third.py --out DIR

``sample(x, temperature=0.8, top_p=0.9)`` on flat N(0, 1) fp32 rows (every row takes the row kernel), do_bench
medians (µs), best of two rounds, and whether four draws from one generator state give the ids of the first
variant (this tree's kernel at the first ``--min-chunk``; another order of the sums moves W_kept and the chunks'
masses by ulps, and so a draw whose u · W_kept lies that close to a token's edge: with ~10^5 kept tokens, by estimate
about one draw in a hundred).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from probe_rowacc import row_kernel_of
from triton.testing import do_bench

from onlinesoftmax.topk import plan as P
from onlinesoftmax.topk import sampling_launch as SL
from onlinesoftmax.topk.sampling import sample

CASES = ((1, 128256), (2, 128256), (4, 128256), (8, 128256), (64, 128256), (256, 128256), (8, 262144))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-chunk", default=str(P.ROW_MIN_CHUNK), help="comma-separated ROW_MIN_CHUNK values")
    ap.add_argument("--kernel", action="append", default=[], help="NAME=PATH of another sampling_kernels.py")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    kernels = {"tree": SL._sample_row_kernel}
    for spec in args.kernel:
        name, path = spec.split("=", 1)
        kernels[name] = row_kernel_of(path, name)
    chunks = [int(c) for c in args.min_chunk.split(",")]
    torch.manual_seed(0)
    cases = [(f"flat B{B} V{V}", torch.randn(B, V, device="cuda")) for B, V in CASES]
    res, ids, base = {}, {}, {}
    for rnd in range(2):
        for kname, kern in kernels.items():
            for ch in chunks:
                SL._sample_row_kernel = kern
                P.ROW_MIN_CHUNK = ch
                SL._calls.clear()
                SL.cached_sample_plan.cache_clear()
                variant = f"{kname} min_chunk={ch}"
                for label, x in cases:
                    g = torch.Generator(device="cuda").manual_seed(5)
                    got = torch.stack([sample(x, temperature=0.8, top_p=0.9, generator=g)[0] for _ in range(4)])
                    base.setdefault(label, got)
                    ids.setdefault(label, {})[variant] = bool(torch.equal(got, base[label]))
                    ms = do_bench(lambda: sample(x, temperature=0.8, top_p=0.9), warmup=10, rep=100)
                    res.setdefault(label, {}).setdefault(variant, []).append(ms)
                    print(rnd, variant, label, f"{ms * 1e3:.1f} us", flush=True)
    summary = {label: {v: dict(us=round(min(t) * 1e3, 1), same_ids=ids[label][v]) for v, t in d.items()}
               for label, d in res.items()}
    for label, d in summary.items():
        print(label, "  ".join(f"{v}: {r['us']}{'' if r['same_ids'] else ' (ids differ)'}" for v, r in d.items()))
    with open(os.path.join(args.out, "probe_rowtune.json"), "w") as f:
        json.dump(dict(summary=summary, raw=res, commit=os.environ.get("ONLINESOFTMAX_COMMIT", ""),
                       kernels=args.kernel), f, indent=1)


if __name__ == "__main__":
    main()
