"""The transformers training step's loss (issue 30: ``causal_lm_loss`` 0.94x "sdpa" + the model's own loss, with 60 %
less peak memory): does a larger logits tile for ``linear_cross_entropy`` buy the step back? H200, allow 300 s
(a cold machine compiles each scheme's kernels; 120 s did not reach the first round).

The example's model (Llama-3-8B-shaped, 4 layers, bf16), 8 x 4096 tokens: one training step (forward + backward)
with "sdpa" attention and ``model(..., labels=...).loss``, and with "onlinesoftmax" attention and ``causal_lm_loss``
under several ``LCEKnobs`` (the default 60 MiB "vocab" scheme: 4 GEMMs, one recomputed; the "tokens" scheme with a
tile of 0.5 / 1 / 2 GiB: 3 GEMMs, grad_weight re-read per token chunk). Rounds interleave every variant; median ms
and the allocator's peak above the models and inputs; the losses' relative difference from the sdpa model's.

    PYTHONPATH=src python tools/probe_tf_train.py --out DIR
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

VARIANTS = {"vocab 60 MiB (default)": None, "tokens 512 MiB": dict(scheme="tokens", tile_bytes=512 << 20),
            "tokens 1 GiB": dict(scheme="tokens", tile_bytes=1 << 30),
            "tokens 2 GiB": dict(scheme="tokens", tile_bytes=2 << 30),
            "vocab 2 GiB": dict(scheme="vocab", tile_bytes=2 << 30)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="a smoke run: the tiny config on the CPU")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from transformers_llama import build

    from onlinesoftmax.integrations import transformers as osst
    from onlinesoftmax.losses.plan import LCEKnobs

    osst.register()
    dev = torch.device("cpu" if args.small else "cuda")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 512 if args.small else 128256, (2, 64) if args.small else (8, 4096), generator=g).to(dev)
    dtype = torch.float32 if args.small else torch.bfloat16
    models = {impl: build(impl, args.small, 4, dtype, dev).train() for impl in ("sdpa", "onlinesoftmax")}
    plain = osst._linear_cross_entropy

    def step(name):
        if name == "sdpa + model loss":
            loss = models["sdpa"](ids, labels=ids, use_cache=False).loss
            model = models["sdpa"]
        else:
            kn = VARIANTS[name]
            osst._linear_cross_entropy = functools.partial(plain, knobs=LCEKnobs(**kn)) if kn else plain
            loss = osst.causal_lm_loss(models["onlinesoftmax"], ids, ids, use_cache=False)
            model = models["onlinesoftmax"]
        loss.backward()
        model.zero_grad(set_to_none=True)
        osst._linear_cross_entropy = plain
        return loss.detach()

    names = ["sdpa + model loss", *VARIANTS]
    losses = {}
    for n in names:                                     # warm-up (compiles), and the values
        losses[n] = step(n).item()
        print(f"warm {n}: loss {losses[n]:.6f}", flush=True)
    sync()
    times = {n: [] for n in names}
    for r in range(args.rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            sync()
            t0 = time.perf_counter()
            step(n)
            sync()
            times[n].append((time.perf_counter() - t0) * 1e3)
            print(f"round {r} {n}: {times[n][-1]:.1f} ms", flush=True)
    rows = []
    for n in names:
        peak = 0.0
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step(n)
            sync()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        ms = statistics.median(times[n])
        rows.append(dict(variant=n, ms=round(ms, 1), times=[round(t, 1) for t in times[n]], peak_mib=round(peak),
                         loss=losses[n], loss_rel_diff=abs(losses[n] - losses[names[0]]) / abs(losses[names[0]])))
        print(rows[-1], flush=True)
    ref = rows[0]["ms"]
    for r in rows:
        print(f"{r['variant']:24s} {r['ms']:8.1f} ms  {ref / r['ms']:.3f}x  peak {r['peak_mib']} MiB", flush=True)
    with open(os.path.join(args.out, "probe_tf_train.json"), "w") as f:
        json.dump(dict(rows=rows, command="PYTHONPATH=src python tools/probe_tf_train.py",
                       commit=os.environ.get("ONLINESOFTMAX_COMMIT", "")), f, indent=1)


if __name__ == "__main__":
    main()
