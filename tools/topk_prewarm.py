"""Compile the kernels of the ``topk`` (and ``topk-paper``) bench suites before they run, in parallel processes.

Cold, the suite's 21 distinct kernels take about 86 s of one CPU core to compile (4 k = 1024 merges 50 s of it,
with an empty Triton cache on the development machine), all inside the suite's
first calls. Here each worker process calls ``softmax_topk`` once per shape of its share, so Triton's on-disk cache
holds every kernel, with the very specialisations of the suite's calls, when the suite starts.

``PYTHONPATH=src python tools/topk_prewarm.py [--jobs 12] [--paper] [--dry-run]``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

TOPK_SHAPES = [(B, V, k) for B in (1, 32, 256) for V in (128256, 151936, 262144) for k in (1, 8, 50, 256, 1024)]
PAPER_SHAPES = [(B, V, 5) for B in (4000, 10) for V in (100, 300, 1000, 3000, 10000, 30000, 100000, 300000, 1000000)]


SAMPLE_SHAPES = [(B, V, 50) for B in (1, 8, 64, 256) for V in (128256, 151936, 262144)]


def launch_key(B: int, V: int, k: int):
    """What decides which compiled kernels a call needs: the plan, and whether V is 1 or divisible by 16 (Triton
    specialises on both; k, B and the chunk counts are not specialised)."""
    from onlinesoftmax.target import H200
    from onlinesoftmax.topk.plan import topk_plan

    cfg = topk_plan(B, V, k, 4, H200)
    return cfg, (V == 1, V % 16 == 0)


def groups(shapes):
    """Shapes with the same launch key compile the same kernels: one shape per key."""
    first = {}
    for s in shapes:
        first.setdefault(launch_key(*s), s)
    # the slowest compiles (large CAP) first, so the parallel run is not left waiting on one of them at the end
    return sorted(first.values(), key=lambda s: -launch_key(*s)[0].cap)


def _work(job):
    import torch

    from onlinesoftmax import softmax_topk

    (B, V, k), device, sampling = job
    t0 = time.time()
    x = torch.randn(B, V, device=device)
    if sampling:        # sample's launches: the temperature folded in, 64 candidates for top-p alone, the row kernel
        from onlinesoftmax import sample

        sample(x, temperature=0.8, top_k=k, top_p=0.9, backend="triton")
        sample(x, temperature=0.8, top_p=0.9, backend="triton")
    else:
        softmax_topk(x, k, backend="triton")
    if device == "cuda":
        torch.cuda.synchronize()
    return (B, V, k), time.time() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--paper", action="store_true", help="also the topk-paper suite's shapes")
    ap.add_argument("--sample", action="store_true", help="also the sample suite's launches")
    ap.add_argument("--dry-run", action="store_true", help="list the shapes, compile nothing")
    ap.add_argument("--shapes", help="'B,V,k;B,V,k' instead of the suites' (a smoke test on CPU: --device cpu)")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    shapes = TOPK_SHAPES + (PAPER_SHAPES if args.paper else [])
    if args.shapes:
        shapes = [tuple(int(n) for n in s.split(",")) for s in args.shapes.split(";")]
    todo = [(s, False) for s in groups(shapes)]
    if args.sample:
        todo += [(s, True) for s in groups(SAMPLE_SHAPES)]
    print(f"{len(todo)} launch configurations to compile", flush=True)
    if args.dry_run:
        for s, sampling in todo:
            print(s, "sample" if sampling else "", launch_key(*s)[0])
        return
    t0 = time.time()
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        for (B, V, k), dt in pool.imap_unordered(_work, [(s, args.device, sampling) for s, sampling in todo]):
            print(f"  B{B} V{V} k{k}: {dt:.1f} s", flush=True)
    print(f"prewarm: {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
