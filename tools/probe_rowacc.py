"""A/B of the sample row kernel (``sampling_kernels._sample_row_kernel``, step 3 of ``sample``: top-p / min-p /
top-k past the candidates) of this tree against another tree's, in one process on the same inputs. H200, <= 90 s
(<= 150 s with ``--wide``).

    git show 6163761:src/onlinesoftmax/topk/sampling_kernels.py > /tmp/old_sk.py
    PYTHONPATH=src python tools/probe_rowacc.py --old /tmp/old_sk.py --out DIR [--wide] [--name FILE]

``sample(x, temperature=0.8, top_p=0.9)`` (fp32; every row takes the row kernel on flat N(0, 1) logits; peaked
rows, 20 tokens 8-12 above the floor, at V = 262144 where the nucleus often leaves the 64 candidates): do_bench
medians, best of two rounds, and whether four draws from the same generator state give the same ids (the two
kernels sum in different orders: a draw at a boundary may differ by rounding).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os

import torch
from triton.testing import do_bench

from onlinesoftmax.topk import sampling_launch as SL
from onlinesoftmax.topk.plan import SampleKnobs
from onlinesoftmax.topk.sampling import sample

CASES = (("flat", 1, 128256), ("flat", 8, 128256), ("flat", 64, 128256), ("flat", 256, 128256),
         ("flat", 8, 262144), ("peaked", 8, 262144), ("peaked", 64, 262144))
# --wide: the radix select's passes too (count histograms for a per-row top_k past the 64 candidates; mass
# histograms with SampleKnobs(row="radix"))
WIDE = (("flat", 8, 128256, "topk1000"), ("flat", 64, 128256, "topk1000"), ("flat", 8, 128256, "radix"),
        ("flat", 64, 128256, "radix"))


def row_kernel_of(path: str, tag: str):
    """``_sample_row_kernel`` of the ``sampling_kernels.py`` copy at ``path``, loaded as a module of the package
    (its relative imports resolve) named after ``tag``."""
    spec = importlib.util.spec_from_file_location(f"onlinesoftmax.topk._ab_{tag}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._sample_row_kernel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="another tree's topk/sampling_kernels.py")
    ap.add_argument("--out", default=".")
    ap.add_argument("--name", default="probe_rowacc.json", help="the JSON file's name under --out")
    ap.add_argument("--wide", action="store_true", help="the radix select's cases too (WIDE)")
    args = ap.parse_args()
    kernels = {"new": SL._sample_row_kernel, "old": row_kernel_of(args.old, "old")}
    torch.manual_seed(0)
    cases = []
    for kind, B, V, *how in CASES + (WIDE if args.wide else ()):
        x = torch.randn(B, V, device="cuda")
        if kind == "peaked":
            hot = torch.randint(0, V, (B, 20), device="cuda")
            x.scatter_add_(1, hot, 8 + 4 * torch.rand(B, 20, device="cuda"))
        kw = dict(temperature=0.8, top_p=0.9)
        if how == ["topk1000"]:
            kw["top_k"] = torch.full((B,), 1000, device="cuda")
        elif how == ["radix"]:
            kw["knobs"] = SampleKnobs(row="radix")
        cases.append((" ".join([f"{kind} B{B} V{V}", *how]), x, kw))
    res, ids = {}, {}
    for rnd in range(2):
        for name, kern in kernels.items():
            SL._sample_row_kernel = kern
            SL._calls.clear()
            for label, x, kw in cases:
                g = torch.Generator(device="cuda").manual_seed(5)
                ids.setdefault(label, {})[name] = torch.stack(
                    [sample(x, generator=g, **kw)[0] for _ in range(4)])
                ms = do_bench(lambda: sample(x, **kw), warmup=10, rep=100)
                res.setdefault(label, {}).setdefault(name, []).append(ms)
                print(rnd, name, label, f"{ms * 1e3:.1f} us", flush=True)
    summary = {}
    for label, d in res.items():
        n, o = min(d["new"]), min(d["old"])
        summary[label] = dict(new_us=round(n * 1e3, 1), old_us=round(o * 1e3, 1), speedup=round(o / n, 2),
                              same_ids=bool(torch.equal(ids[label]["new"], ids[label]["old"])))
        print(label, summary[label], flush=True)
    with open(os.path.join(args.out, args.name), "w") as f:
        json.dump(dict(summary=summary, raw=res, commit=os.environ.get("ONLINESOFTMAX_COMMIT", ""),
                       old=args.old), f, indent=1)


if __name__ == "__main__":
    main()
