"""Top-p without top-k on the grid of launches (``SampleKnobs(grid=True)``, ``topk/sampling_grid.py``) against the
row kernel's barriers (the default below ``GRID_MIN_ROWS`` rows), in one process on the same inputs (issue 28:
``sample(x, top_p=0.9)`` at <= 2x ``softmax_topk``'s graph replay).

    PYTHONPATH=src python tools/probe_samplegrid.py --out DIR [--variant NAME=key=value,...] [--compile-only]
    (--only NAMES, --cases BxV,..., --warm-jobs 8: compile every variant first in parallel processes,
     --fp32-check, --graph-only, --profile NAMES)

Variants: ``row`` (``grid=False``: the row kernel at every B), ``grid`` (its default chunks, 256-element steps,
4 warps) and the ones given (``--variant g512=grid_block=512,grid_warps=8``, ``--variant c4k=grid_chunk=4096``:
SampleKnobs fields, ``grid=True`` implied); the default set is in ``VARIANTS``.

1. Checks, each case's before its first round of times (fp32 flat N(0, 1) rows, T = 0.8, top_p = 0.9, and per
   case a bf16 copy): with u in the middle of a kept token's interval of the fp64 distribution (``_mid_uniforms``:
   a draw that fp32 sums cannot move), every variant's ids equal the reference's inverse-CDF draw, its
   log-probabilities within 2e-5; outputs poisoned first (``--fp32-check``: the fp32 rows only). A wrong or
   failing variant is reported and not timed.
2. Times per case (B, V) in ``CASES``: a CUDA graph of ``GRAPH_CALLS`` calls over input sets rotated past the
   60 MB L2, replayed under ``do_bench`` (median per call), for every variant and for ``softmax_topk(x, 50)``
   alone (the goal's denominator); then the eager call (do_bench over the same rotation). Two rounds, the best
   of each kept.
3. ``--compile-only`` (no GPU): every variant's launches at every case compiled for sm_90a, registers, stack,
   shared memory and SASS instructions per kernel.

Writes DIR/probe_samplegrid.json and prints a table: µs per call and the ratio to softmax_topk's graph replay.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))

from onlinesoftmax.reference import sample_distribution  # noqa: E402
from onlinesoftmax.topk import sample, softmax_topk  # noqa: E402
from onlinesoftmax.topk.plan import SampleKnobs  # noqa: E402

CASES = ((1, 128256), (8, 128256), (64, 128256), (256, 128256), (8, 262144))
T, P = 0.8, 0.9
GRAPH_CALLS = 8
ROTATE_BYTES = 256 * 2**20
BF16_CHECK = True       # each variant also checked on a bf16 copy (--fp32-check: not)
PARTIAL = ""            # the checks and times so far, rewritten after every case of a round
GRAPH_ONLY = False      # --graph-only
T0 = time.time()        # (each line of the log says the seconds since the start)
VARIANTS = {"row": SampleKnobs(grid=False), "grid": SampleKnobs(grid=True),
            "g128": SampleKnobs(grid=True, grid_block=128),
            "g512w4": SampleKnobs(grid=True, grid_block=512),
            "g512w8": SampleKnobs(grid=True, grid_block=512, grid_warps=8),
            "g1024w8": SampleKnobs(grid=True, grid_block=1024, grid_warps=8),
            "c2k": SampleKnobs(grid=True, grid_chunk=2048), "c4k": SampleKnobs(grid=True, grid_chunk=4096),
            "l2k": SampleKnobs(grid=True, grid_list=2048), "l4k": SampleKnobs(grid=True, grid_list=4096),
            "g512l4k": SampleKnobs(grid=True, grid_block=512, grid_list=4096),
            "lanes": SampleKnobs(grid=True, grid_lane_counts=True),
            "l4k lanes": SampleKnobs(grid=True, grid_list=4096, grid_lane_counts=True),
            "pdl": SampleKnobs(grid=True, pdl=True), "row pdl": SampleKnobs(grid=False, pdl=True),
            "l4k pdl": SampleKnobs(grid=True, grid_list=4096, pdl=True),
            "c1k": SampleKnobs(grid=True, grid_chunk=1024)}


def parse_variant(spec: str) -> tuple[str, SampleKnobs]:
    name, _, rest = spec.partition("=")
    kw = {"grid": True}
    for item in filter(None, rest.split(",")):
        k, v = item.split("=")
        kw[k] = int(v) if re.fullmatch(r"-?\d+", v) else {"True": True, "False": False}.get(v, v)
    return name, SampleKnobs(**kw)


def mid_uniforms(x: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Per row, u in the middle of a kept token's interval (the largest p of 64 kept tokens drawn at random)."""
    xs, rng, u = x.double().cpu().numpy(), np.random.default_rng(seed), []
    for r in range(x.shape[0]):
        probs = sample_distribution(xs[r], T, None, P, None)
        kept = np.nonzero(probs > 0)[0]
        pick = rng.choice(kept, min(64, kept.size), replace=False)
        j = int(pick[np.argmax(probs[pick])])
        u.append(np.cumsum(probs)[j] - probs[j] / 2)
    return torch.tensor(u, dtype=torch.float32, device=x.device)


def reference_ids(x: torch.Tensor, u: torch.Tensor) -> tuple[list, list]:
    xs, ids, logp = x.double().cpu().numpy(), [], []
    for r in range(x.shape[0]):
        probs = sample_distribution(xs[r], T, None, P, None)
        j = int(np.searchsorted(np.cumsum(probs), float(u[r]), side="right"))
        ids.append(j)
        logp.append(float(np.log(probs[j])))
    return ids, logp


def check(x, u, want, knobs) -> str:
    ids, logp = sample(x, temperature=T, top_p=P, uniform=u, knobs=knobs)
    ids, logp = ids.tolist(), logp.tolist()
    bad = [r for r in range(len(ids)) if ids[r] != want[0][r] or abs(logp[r] - want[1][r]) > 2e-5 + 2e-5 * abs(
        want[1][r])]
    return "ok" if not bad else f"WRONG rows {bad[:4]} (got {[ids[r] for r in bad[:4]]}, want " \
                                f"{[want[0][r] for r in bad[:4]]})"


def graph_us(fn, sets, rep=50) -> float:
    from triton.testing import do_bench

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for x in sets[:2]:
            fn(x)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(GRAPH_CALLS):
            fn(sets[i % len(sets)])
    return do_bench(g.replay, warmup=5, rep=rep) * 1e3 / GRAPH_CALLS


def eager_us(fn, sets) -> float:
    from triton.testing import do_bench

    it = iter(range(10**9))
    return do_bench(lambda: fn(sets[next(it) % len(sets)]), warmup=10, rep=60) * 1e3


def compile_only(variants) -> dict:
    from probe_util import compile_launches, record_launches

    from onlinesoftmax import target as targets
    from onlinesoftmax.topk import sampling_launch as SL

    recorded = record_launches()
    SL.target_of = lambda device: targets.H200
    out, seen = {}, set()
    for name, knobs in variants.items():
        for B, V in CASES:
            recorded.clear()
            SL._calls.clear()
            SL.cached_sample_plan.cache_clear()
            x = torch.empty(B, V)
            SL.sample_2d(x, T, None, P, None, torch.empty(B), knobs, capturing=False)
            for kname, res in compile_launches(recorded, seen):
                out[f"{name} B{B} V{V} {kname}"] = res
                print(f"{name:8} B{B:<4} V{V:<7} {kname:24} {res}", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--variant", action="append", default=[], help="NAME=field=value,... (grid=True implied)")
    ap.add_argument("--only", default="", help="comma-separated variant names to keep")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--cases", default="", help="comma-separated BxV (default: CASES)")
    ap.add_argument("--profile", default="", help="comma-separated variant names: per-kernel µs (torch.profiler)")
    ap.add_argument("--fp32-check", action="store_true", help="check in fp32 only (no bf16 copy: fewer compiles)")
    ap.add_argument("--warm-jobs", type=int, default=0, help="compile every variant's launches first, in parallel "
                    "processes (one per variant: the checks' u, the eager kernel draw, a graph capture)")
    ap.add_argument("--graph-only", action="store_true", help="no checks, no eager times: graph replays only "
                    "(no compile for u given; for a short run after the same kernels were checked)")
    args = ap.parse_args()
    global CASES, BF16_CHECK, PARTIAL, GRAPH_ONLY
    GRAPH_ONLY = args.graph_only
    BF16_CHECK = not args.fp32_check
    PARTIAL = os.path.join(args.out, "probe_samplegrid.partial.json")
    if args.cases:
        CASES = tuple(tuple(int(v) for v in c.split("x")) for c in args.cases.split(","))
    variants = dict(VARIANTS)
    variants.update(parse_variant(s) for s in args.variant)
    if args.only:
        variants = {k: v for k, v in variants.items() if k in args.only.split(",")}
    if args.warm_jobs:
        warm_parallel(variants, args.warm_jobs, GRAPH_ONLY)
    if args.compile_only:
        res = dict(compile=compile_only(variants))
    else:
        res = run(variants)
        if args.profile:
            res["profile_us"] = profile({k: variants[k] for k in args.profile.split(",") if k in variants})
    res.update(commit=os.environ.get("ONLINESOFTMAX_COMMIT", ""), variants={k: str(v) for k, v in variants.items()})
    with open(os.path.join(args.out, "probe_samplegrid.json"), "w") as f:
        json.dump(res, f, indent=1)


def warm(job) -> tuple:
    """A ``--warm-jobs`` worker (a spawned process): one variant's compiled forms at one case (the kernels do not
    specialise on B), into Triton's disk cache: u given (the checks), u drawn by the kernel (eager), u drawn under
    a capture (graph); with ``graph_only`` the last two (a capture's warm-up calls are eager); and softmax_topk's
    graph (the denominator). Returns (name, seconds, the error or "")."""
    name, knobs, (B, V), graph_only = job
    t0 = time.time()
    try:
        x = torch.randn(B, V, device="cuda")
        if not graph_only:
            sample(x, temperature=T, top_p=P, uniform=torch.rand(B, device="cuda"), knobs=knobs)
            sample(x, temperature=T, top_p=P, knobs=knobs)
        graph_us(lambda x: sample(x, temperature=T, top_p=P, knobs=knobs), [x, x.clone()], rep=1)
        graph_us(lambda x: softmax_topk(x, 50), [x, x.clone()], rep=1)
        torch.cuda.synchronize()
    except Exception as e:      # noqa: BLE001 (reported; the variant's checks then say what fails)
        return name, time.time() - t0, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return name, time.time() - t0, ""


def warm_parallel(variants, jobs: int, graph_only: bool) -> None:
    """``warm`` for every variant at the first case, ``jobs`` spawned processes at once (as the attention probes'
    ``probe_util.run_checks``), so the run finds every kernel compiled; prints each worker's seconds."""
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(jobs) as pool:
        for name, secs, err in pool.imap_unordered(warm, [(n, k, CASES[0], graph_only) for n, k in variants.items()]):
            print(f"warm {name}: {secs:.0f} s {err or 'ok'}", flush=True)


def rotated_sets(B: int, V: int) -> list:
    """Enough fp32 [B, V] inputs (at least 2) that cycling through them reads past the L2 between reuses."""
    return [torch.randn(B, V, device="cuda") for _ in range(max(2, -(-ROTATE_BYTES // (B * V * 4))))]


def profile(variants) -> dict:
    """Per case and variant, each kernel's mean µs over 20 eager calls (torch.profiler's CUDA times), inputs
    rotated past the L2: which launch the time goes to."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    out = {}
    for B, V in CASES:
        sets = rotated_sets(B, V)
        n = len(sets)
        for name, knobs in variants.items():
            for i in range(3):
                sample(sets[i % n], temperature=T, top_p=P, knobs=knobs)
            torch.cuda.synchronize()
            with prof(activities=[ProfilerActivity.CUDA]) as p:
                for i in range(20):
                    sample(sets[i % n], temperature=T, top_p=P, knobs=knobs)
                torch.cuda.synchronize()
            per = {}
            for ev in p.events():
                if ev.device_type.name == "CUDA":
                    per.setdefault(ev.name, []).append(ev.device_time)
            # a kernel launched m times a call (the grid's four passes share a name): its i-th launch of each call
            # as "name#i", in launch order
            rows = {}
            for k, v in per.items():
                m = max(1, len(v) // 20)
                for i in range(m):
                    rows[f"{k[:40]}#{i}" if m > 1 else k[:40]] = round(sum(v[i::m]) / 20, 2)
            out[f"B{B} V{V} {name}"] = rows
            print("profile", f"B{B} V{V}", name, " ".join(f"{k}={v}" for k, v in rows.items()), flush=True)
        del sets
    return out


def run(variants) -> dict:
    """Per case: the checks, then the first round of times (so a run cut short keeps whole cases); then a second
    round over every case, the best of the two kept."""
    torch.manual_seed(0)
    checks, times = {}, {}
    wrong = set()

    def time_case(rnd, B, V):
        label = f"B{B} V{V}"
        sets = rotated_sets(B, V)
        row = times.setdefault(label, {})
        t = graph_us(lambda x: softmax_topk(x, 50), sets)
        row["softmax_topk graph"] = min(row.get("softmax_topk graph", 1e9), t)
        for name, knobs in variants.items():
            if name in wrong:
                continue
            g = graph_us(lambda x, k=knobs: sample(x, temperature=T, top_p=P, knobs=k), sets)
            row[f"{name} graph"] = min(row.get(f"{name} graph", 1e9), g)
            if not GRAPH_ONLY:
                e = eager_us(lambda x, k=knobs: sample(x, temperature=T, top_p=P, knobs=k), sets)
                row[f"{name} eager"] = min(row.get(f"{name} eager", 1e9), e)
            print(rnd, label, name, f"graph {g:.1f} us", "" if GRAPH_ONLY else f"eager {e:.1f} us",
                  f"[{time.time() - T0:.0f} s]", flush=True)
            with open(PARTIAL, "w") as f:      # (what a run cut short still leaves)
                json.dump(dict(checks=checks, times_us=times), f, indent=1)

    for B, V in CASES:
        if GRAPH_ONLY:
            time_case(0, B, V)
            continue
        label = f"B{B} V{V}"
        x = torch.randn(B, V, device="cuda")
        u = mid_uniforms(x)
        want = reference_ids(x, u)
        if BF16_CHECK:
            xb = x.bfloat16()
            ub = mid_uniforms(xb, 1)
            want_b = reference_ids(xb, ub)
        for name, knobs in variants.items():
            try:
                r = check(x, u, want, knobs)
                if r == "ok" and BF16_CHECK:
                    r = check(xb, ub, want_b, knobs)
            except Exception as e:      # noqa: BLE001 (a failing variant is reported, the others go on)
                r = f"FAILED {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            checks.setdefault(label, {})[name] = r
            if r != "ok":
                wrong.add(name)
            print(label, name, r, f"[{time.time() - T0:.0f} s]", flush=True)
        del x
        time_case(0, B, V)
    for B, V in CASES:
        time_case(1, B, V)
    for label, row in times.items():
        base = row["softmax_topk graph"]
        print(label, f"softmax_topk {base:.1f} us |", "  ".join(
            f"{k.replace(' graph', '')} {v:.1f} ({v / base:.2f}x)" for k, v in row.items() if k.endswith("graph")
            and not k.startswith("softmax_topk")))
    return dict(checks=checks, times_us={k: {n: round(v, 2) for n, v in r.items()} for k, r in times.items()},
                device=torch.cuda.get_device_name(), torch=torch.__version__)


if __name__ == "__main__":
    main()
