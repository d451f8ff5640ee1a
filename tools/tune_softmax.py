"""Time softmax-family plans on the GPU side by side: the default plan, knob variants, torch, the copy ceiling.

Each variant is a set of plan knobs (``onlinesoftmax.softmax.plan.Knobs``: path, smem, chunk, num_warps, reg, ...),
checked against torch before it is timed; inputs rotate past L2, do_bench medians. Prints one line per variant
(µs, GB/s counted over the bytes the op must move, % of the copy ceiling measured in the same run) and writes JSON.

    PYTHONPATH=src python tools/tune_softmax.py OP DTYPE M N [VARIANT ...] [--out FILE]

OP: softmax, log_softmax, logsumexp, softmax_backward, log_softmax_backward; DTYPE: float32, bfloat16, float16;
M = 0 sizes the rows to 1 GiB per tensor; VARIANT: ``name:key=value,key=value`` (e.g.
``smem16k:path=coop,smem=1,chunk=16384,num_warps=8,reg=4``). The plan each variant ran is printed beside it.
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.testing import do_bench

from onlinesoftmax.bench.harness import copy_ceiling_gbps, environment
from onlinesoftmax.softmax import launch as L
from onlinesoftmax.softmax.geometry import row_geometry
from onlinesoftmax.softmax.plan import LOG_SOFTMAX, LOGSUMEXP, SOFTMAX, Knobs

L2_ROTATE = 240 << 20          # inputs rotated over at least 4x the H200's 60 MB of L2
MODES = {"softmax": SOFTMAX, "log_softmax": LOG_SOFTMAX, "logsumexp": LOGSUMEXP}


def parse_variant(text: str) -> tuple[str, Knobs]:
    name, _, spec = text.partition(":")
    values = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        values[key] = value.lower() in ("1", "true") if value.lower() in ("0", "1", "true", "false") and key in (
            "smem", "pipe", "stream", "bf16x2", "prefetch", "keep_e") else (value if key == "path" else int(value))
    return name, Knobs.of(**values)


def runner(op: str, knobs: Knobs | None):
    """A callable running ``op`` on its inputs through the plan ``knobs`` give, and the plan it ran."""
    ran = {}
    if op.endswith("_backward"):
        log = op.startswith("log")

        def run(y, dy):
            dx = torch.empty_like(y)
            m, n, inner, geos = row_geometry([y, dy, dx], 1)
            ran["plan"] = L.backward(y, dy, dx, *geos, m, n, inner, log, knobs)
            return dx
        return run, ran
    mode = MODES[op]

    def run(x):
        out = torch.empty(x.shape[0], device=x.device, dtype=x.dtype) if mode == LOGSUMEXP else torch.empty_like(x)
        m, n, inner, (gx, gy) = row_geometry([x, out if mode != LOGSUMEXP else x], 1)
        ran["plan"] = L.forward(x, out, gx, gy, m, n, inner, mode, knobs)
        return out
    return run, ran


def torch_op(op: str):
    return {"softmax": lambda x: torch.softmax(x, -1), "log_softmax": lambda x: torch.log_softmax(x, -1),
            "logsumexp": lambda x: torch.logsumexp(x, -1),
            "softmax_backward": lambda y, dy: torch._softmax_backward_data(dy, y, -1, y.dtype),
            "log_softmax_backward": lambda y, dy: torch._log_softmax_backward_data(dy, y, -1, y.dtype)}[op]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("op", choices=[*MODES, "softmax_backward", "log_softmax_backward"])
    ap.add_argument("dtype", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("m", type=int)
    ap.add_argument("n", type=int)
    ap.add_argument("variants", nargs="*")
    ap.add_argument("--out")
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    bwd = a.op.endswith("_backward")
    m = a.m or (1 << 30) // (a.n * dtype.itemsize)
    per = m * a.n * dtype.itemsize
    sets = []
    for _ in range(max(1, min(8, L2_ROTATE // per))):
        x = (torch.randn(m, a.n, device="cuda") * 3).to(dtype)
        sets.append((torch.softmax(x.float(), -1).to(dtype), torch.randn_like(x)) if bwd else (x,))
    moved = per * (3 if bwd else 1 if a.op == "logsumexp" else 2)
    ceiling = copy_ceiling_gbps(torch.device("cuda"))
    ref = torch_op(a.op)
    rows = []
    for name, knobs in [("default", None), *map(parse_variant, a.variants), ("torch", "torch")]:
        fn, ran = (ref, {}) if knobs == "torch" else runner(a.op, knobs)
        got, want = fn(*sets[0]), ref(*sets[0])
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=1e-3)     # a wrong variant is not timed
        i = [0]

        def call(fn=fn):
            i[0] += 1
            return fn(*sets[i[0] % len(sets)])

        us = do_bench(call, warmup=25, rep=100, return_mode="median") * 1e3
        gbps = moved / us / 1e3
        row = dict(variant=name, us=us, gbps=gbps, pct_copy=100 * gbps / ceiling, plan=str(ran.get("plan", "torch")))
        rows.append(row)
        print(f"{a.op} {a.dtype} {m}x{a.n} {name:16} {us:9.2f} us {gbps:7.0f} GB/s {row['pct_copy']:5.1f} % | "
              f"{row['plan']}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(env=environment(), ceiling_gbps=ceiling, op=a.op, dtype=a.dtype, m=m, n=a.n, rows=rows), f,
                      indent=1)


if __name__ == "__main__":
    main()
