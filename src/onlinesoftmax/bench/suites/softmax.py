"""Suites ``softmax``, ``log_softmax``, ``logsumexp``, ``softmax_backward`` and ``log_softmax_backward``.

Shapes: N in {1K, 4K, 16K, 32K, 128K, 256K} with 1 GiB per tensor, and the decode shapes M in {1, 8, 32} x
N in {128256, 151936, 262144}. The issue's goal shapes ask >= 256 MB per tensor; at 256 MB a kernel's fixed ramp
and tail cost 3-4 % against the 2 GiB copy ceiling, and the peers' anchors were measured at 1 GiB
(``ONLINESOFTMAX_BENCH_TENSOR_MB=256`` runs the smaller size). Peers in the same run: torch eager, and
Liger-Kernel's Triton softmax where it is installed (N <= 65536, its limit), and torch.compile of the torch op
(softmax, log_softmax, logsumexp) with ``ONLINESOFTMAX_BENCH_COMPILE=1``.
"""

from __future__ import annotations

import functools
import os

import torch

from ...softmax.api import log_softmax, logsumexp, softmax
from ..harness import BenchContext, Case, register_suite

GOAL_NS = (1024, 4096, 16384, 32768, 131072, 262144)
DECODE_MS = (1, 8, 32)
DECODE_NS = (128256, 151936, 262144)
TENSOR_BYTES = int(os.environ.get("ONLINESOFTMAX_BENCH_TENSOR_MB", 1024)) << 20   # one x (and one y) per shape
QUICK_ELEMS_GPU = 1 << 22
QUICK_ELEMS_CPU = 1 << 18
COMPILE_RECOMPILE_LIMIT = 64   # torch.compile peer: recompiles allowed per op (one per shape and dtype, 30 at most)


def _liger_softmax():
    try:
        from liger_kernel.ops import LigerSoftmaxFunction
    except Exception:   # not installed, or fails to import on this machine: the peer is left out
        return None
    return LigerSoftmaxFunction.apply


def _graphed(fn):
    """``fn`` captured in a CUDA graph on the first input it is called with; later calls replay that graph
    (on the first input's buffers): the GPU time of a decode step without the host's launch cost."""
    state = {}

    def replay(x):
        if "graph" not in state:
            fn(x)
            state["graph"] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(state["graph"]):
                state["out"] = fn(x)
        state["graph"].replay()
        return state["out"]

    return replay


def _shapes(ctx: BenchContext, dtype: torch.dtype, decode: bool):
    """(M, N, group) for this run; decode shapes only for the softmax forward."""
    size = torch.finfo(dtype).bits // 8
    if ctx.quick:
        elems = QUICK_ELEMS_GPU if ctx.is_cuda else QUICK_ELEMS_CPU
        out = [(elems // n, n, "throughput") for n in (1024, 4096)]
        if ctx.is_cuda and decode:
            out.append((1, 262144, "decode"))
        return out
    out = [(TENSOR_BYTES // (n * size), n, "throughput") for n in GOAL_NS]
    if decode:
        out += [(m, n, "decode") for m in DECODE_MS for n in DECODE_NS]
    return out


def _dtypes(ctx):
    return [d for d in (torch.float32, torch.bfloat16) if ctx.want(d) and (ctx.is_cuda or d == torch.float32)]


def _compiled(fn):
    """``fn`` through torch.compile (inductor), one graph per shape (dynamic=False). Every shape of a suite is a
    recompile of the same code object: dynamo's limit is raised past the suite's shapes, and hitting it raises
    instead of falling back to eager in silence (which would time torch's eager kernel under this name)."""
    import torch._dynamo.config as dynamo

    dynamo.recompile_limit = max(dynamo.recompile_limit, COMPILE_RECOMPILE_LIMIT)
    dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 4 * COMPILE_RECOMPILE_LIMIT)
    dynamo.fail_on_recompile_limit_hit = True
    return torch.compile(fn, dynamic=False)


def _cases(ctx: BenchContext, op: str):
    compile_peer = os.environ.get("ONLINESOFTMAX_BENCH_COMPILE", "0") == "1" and not ctx.quick
    liger = _liger_softmax() if ctx.is_cuda else None
    for dtype in _dtypes(ctx):
        size = torch.finfo(dtype).bits // 8
        for m, n, group in _shapes(ctx, dtype, decode=op == "softmax"):
            dev = ctx.device

            def make(m=m, n=n, dtype=dtype):
                return (torch.randn(m, n, device=dev, dtype=torch.float32).mul_(3).to(dtype),)

            if op == "softmax":
                nbytes = 2 * m * n * size                                # I/O: read x + write y
                impls = {"onlinesoftmax": lambda x: softmax(x, -1), "torch": lambda x: torch.softmax(x, -1)}
                if liger is not None and n <= 65536:
                    impls["liger"] = liger
                if compile_peer:
                    impls["torch.compile"] = _compiled(lambda x: torch.softmax(x, -1))
                if group == "decode":   # launch-bound: also the GPU time alone, both sides replayed from graphs,
                    # and a copy of x timed the same way: the least time any op reading x and writing y takes here
                    impls["onlinesoftmax [graph]"] = _graphed(lambda x: softmax(x, -1))
                    impls["torch [graph]"] = _graphed(lambda x: torch.softmax(x, -1))
                    impls["copy of x"] = lambda x: x.clone()
            elif op == "log_softmax":
                nbytes = 2 * m * n * size
                impls = {"onlinesoftmax": lambda x: log_softmax(x, -1),
                         "torch": lambda x: torch.log_softmax(x, -1)}
                if compile_peer:
                    impls["torch.compile"] = _compiled(lambda x: torch.log_softmax(x, -1))
            elif op == "logsumexp":
                nbytes = m * n * size + m * size                         # I/O: read x + write lse
                impls = {"onlinesoftmax": lambda x: logsumexp(x, -1), "torch": lambda x: torch.logsumexp(x, -1)}
                if compile_peer:
                    impls["torch.compile"] = _compiled(lambda x: torch.logsumexp(x, -1))
            else:  # softmax_backward / log_softmax_backward: read y and dy, write dx
                nbytes = 3 * m * n * size
                log = op == "log_softmax_backward"

                def make(m=m, n=n, dtype=dtype, log=log):
                    y = (torch.log_softmax if log else torch.softmax)(torch.randn(m, n, device=dev) * 3, -1)
                    return y.to(dtype), torch.randn(m, n, device=dev).to(dtype)

                torch_bwd = torch._log_softmax_backward_data if log else torch._softmax_backward_data
                impls = {
                    "onlinesoftmax": lambda y, dy, log=log: torch.ops.onlinesoftmax.softmax_backward(
                        y, dy, 1, log, y.dtype, "triton" if y.is_cuda else "torch"),
                    "torch": lambda y, dy, f=torch_bwd: f(dy, y, -1, y.dtype),
                }
            yield Case(label=f"{m}x{n}", shape=(m, n), dtype=dtype, make_inputs=make, impls=impls,
                       peer="torch", bytes=nbytes, x=n if group == "throughput" else None,  # decode: table only
                       group=f"{str(dtype).replace('torch.', '')} {group}", unchecked=("copy of x",))


for _op in ("softmax", "log_softmax", "logsumexp", "softmax_backward", "log_softmax_backward"):
    register_suite(_op)(functools.partial(_cases, op=_op))
