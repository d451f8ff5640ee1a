"""Where the host time of one eager ``softmax`` / ``softmax_topk`` call on a 4 x 1024 fp32 tensor goes, on the GPU
machine (issue 28's host goals: softmax <= 1.3x torch.softmax, softmax_topk <= torch.topk), and the eager
``sample(temperature=0.8, top_k=50, top_p=0.9)`` at 8 x 128256 fp32 (goal <= 25 µs per call), through its fast path
and the checked one (``knobs=SampleKnobs()``), beside graph replays of it and of ``softmax_topk(x, 50)`` (the
device's time); the 8 x 128256 inputs rotate through 16 buffers (64 MB, past the L2).

Rows, µs per call (the bench's host timing: a loop of 200 eager calls between two synchronisations, median of 7
samples; the rows interleaved round by round, best round of three): torch's ops; ours through the public
function (the no-autograd fast path: one dict look-up, then the bound launch's C launcher with int pointers);
``backend="triton"`` (the checks, ``_prepare``, the layout look-up, the same launch); the bound launch alone
(``Launch.__call__`` on its lane; ``Launch.pair``, the fast path's inline call of the C launcher) and through
``BoundKernel`` with tensors (the lanes off); the pieces
(``torch.empty_like``, the stream and device look-ups, an empty Python loop). A canary (``torch.empty(1)`` on the
CPU) says how fast this host ran.

    PYTHONPATH=src python tools/probe_host.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

import onlinesoftmax as oss
from onlinesoftmax._triton import launch as TL
from onlinesoftmax.softmax import api
from onlinesoftmax.softmax import launch as SL
from onlinesoftmax.topk.plan import SampleKnobs

CALLS = 200


def host_us(fn, samples: int = 7) -> float:
    for _ in range(20):
        fn()
    out = []
    for _ in range(samples):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / CALLS * 1e6)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    x = torch.randn(4, 1024, device="cuda")
    y = torch.empty_like(x)
    torch.testing.assert_close(oss.softmax(x, -1), torch.softmax(x, -1))
    torch.testing.assert_close(oss.log_softmax(x, -1), torch.log_softmax(x, -1))
    launch = SL.forward_rows(x, y, 1, 0)
    lanes = dict(launch.lanes)
    assert lanes, "no lane bound after the first call"
    dev = x.device
    cpu = torch.device("cpu")

    def bound_path():                    # the launch through BoundKernel with tensors (as before the lanes)
        launch.lanes = {}
        launch((x, y), dev)
        launch.lanes = lanes

    big = [torch.randn(8, 128256, device="cuda") * 3 for _ in range(16)]
    turn = [0]

    def nxt():
        turn[0] = (turn[0] + 1) % 16
        return big[turn[0]]

    def replay_of(fn):
        static = big[0].clone()
        fn(static)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(static)
        return graph.replay

    knobs = SampleKnobs()
    mix = dict(temperature=0.8, top_k=50, top_p=0.9)
    rows = {
        "torch.softmax": lambda: torch.softmax(x, -1),
        "oss.softmax": lambda: oss.softmax(x, -1),
        "torch.log_softmax": lambda: torch.log_softmax(x, -1),
        "oss.log_softmax": lambda: oss.log_softmax(x, -1),
        "oss.softmax backend='triton'": lambda: oss.softmax(x, -1, backend="triton"),
        "Launch (lane)": lambda: launch((x, y), dev),
        "Launch.pair (inline C launcher)": lambda: launch.pair(x, y),
        "Launch (BoundKernel, tensors)": bound_path,
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "current_stream(current_device())": lambda: TL.current_stream(TL.current_device()),
        "torch.topk(x, 50)": lambda: torch.topk(x, 50, dim=-1),
        "oss.softmax_topk(x, 50)": lambda: oss.softmax_topk(x, 50),
        "sample 8x128256 k50 p.9 (fast path)": lambda: oss.sample(nxt(), **mix),
        "sample 8x128256 k50 p.9 (checked)": lambda: oss.sample(nxt(), knobs=knobs, **mix),
        "sample 8x128256 k50 p.9 graph replay": replay_of(lambda x: oss.sample(x, **mix)),
        "softmax_topk 8x128256 k50 eager": lambda: oss.softmax_topk(nxt(), 50),
        "softmax_topk 8x128256 k50 graph replay": replay_of(lambda x: oss.softmax_topk(x, 50)),
        "canary: torch.empty(1) on the CPU": lambda: torch.empty(1, device=cpu),
        "empty Python call": lambda: None,
    }
    assert api._fast, "the fast path holds no entry after the first calls"
    best = {k: float("inf") for k in rows}
    for _ in range(args.rounds):
        for name, fn in rows.items():
            best[name] = min(best[name], host_us(fn))
    res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
               commit=os.environ.get("ONLINESOFTMAX_COMMIT", "?"), shape=[4, 1024], dtype="float32", us=best,
               ratios={"softmax / torch": best["oss.softmax"] / best["torch.softmax"],
                       "log_softmax / torch": best["oss.log_softmax"] / best["torch.log_softmax"],
                       "softmax_topk / torch.topk": best["oss.softmax_topk(x, 50)"] / best["torch.topk(x, 50)"],
                       "sample eager / softmax_topk graph": best["sample 8x128256 k50 p.9 (fast path)"]
                       / best["softmax_topk 8x128256 k50 graph replay"]})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "probe_host.json"), "w") as f:
        json.dump(res, f, indent=1)
    for name, v in best.items():
        print(f"{name:36s} {v:7.2f} us")
    for name, v in res["ratios"].items():
        print(f"{name:36s} {v:7.2f}x")


if __name__ == "__main__":
    main()
