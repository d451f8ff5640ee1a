"""The row kernel's top-p boundary without top-k: ``SampleKnobs(row="bins")`` (two levels of fine bins of x, the
boundary bin's list sorted: three passes and barriers) against the default radix select (8 levels, then the count
and mass at the boundary: nine), in one process on the same inputs. H200, <= 120 s.

    PYTHONPATH=src python tools/probe_rowbins.py --out DIR

``sample(x, temperature=T, top_p=P)`` (fp32 and bf16 logits): flat N(0, 1) rows (every row takes the row kernel)
and peaked rows at V = 262144; do_bench medians (µs), best of two rounds; whether four draws from one generator
state give the same ids with both (they sum in different orders: a draw at a boundary may differ by rounding).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from triton.testing import do_bench

from onlinesoftmax.topk.plan import SampleKnobs
from onlinesoftmax.topk.sampling import sample

CASES = (("flat", 1, 128256, 0.8, 0.9), ("flat", 2, 128256, 0.8, 0.9), ("flat", 4, 128256, 0.8, 0.9),
         ("flat", 8, 128256, 0.8, 0.9), ("flat", 64, 128256, 0.8, 0.9),
         ("flat", 256, 128256, 0.8, 0.9), ("flat", 8, 262144, 0.8, 0.9), ("flat", 8, 128256, 1.5, 0.99),
         ("flat", 8, 128256, 0.5, 0.5), ("peaked", 8, 262144, 0.8, 0.9), ("peaked", 64, 262144, 0.8, 0.9),
         ("peaked", 256, 151936, 0.8, 0.9))
VARIANTS = {"radix": SampleKnobs(row="radix"), "bins": SampleKnobs(row="bins")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    torch.manual_seed(0)
    cases = []
    for kind, B, V, T, P in CASES:
        for dtype in (torch.float32, torch.bfloat16):
            if dtype == torch.bfloat16 and (kind, B, V) != ("flat", 8, 128256):
                continue
            x = torch.randn(B, V, device="cuda")
            if kind == "peaked":
                hot = torch.randint(0, V, (B, 20), device="cuda")
                x.scatter_add_(1, hot, 8 + 4 * torch.rand(B, 20, device="cuda"))
            cases.append((f"{kind} B{B} V{V} T{T} p{P} {str(dtype)[6:]}", x.to(dtype), T, P))
    res, ids = {}, {}
    for rnd in range(2):
        for name, knobs in VARIANTS.items():
            for label, x, T, P in cases:
                g = torch.Generator(device="cuda").manual_seed(5)
                ids.setdefault(label, {})[name] = torch.stack(
                    [sample(x, temperature=T, top_p=P, generator=g, knobs=knobs)[0] for _ in range(4)])
                ms = do_bench(lambda: sample(x, temperature=T, top_p=P, knobs=knobs), warmup=10, rep=100)
                res.setdefault(label, {}).setdefault(name, []).append(ms)
                print(rnd, name, label, f"{ms * 1e3:.1f} us", flush=True)
    summary = {}
    for label, d in res.items():
        r, b = min(d["radix"]), min(d["bins"])
        summary[label] = dict(radix_us=round(r * 1e3, 1), bins_us=round(b * 1e3, 1), speedup=round(r / b, 2),
                              same_ids=bool(torch.equal(ids[label]["radix"], ids[label]["bins"])))
        print(label, summary[label], flush=True)
    with open(os.path.join(args.out, "probe_rowbins.json"), "w") as f:
        json.dump(dict(summary=summary, raw=res, commit=os.environ.get("ONLINESOFTMAX_COMMIT", "")), f, indent=1)


if __name__ == "__main__":
    main()
