"""Suite ``sample``: the decode loop's sampling step, B ∈ {1, 8, 64, 256} × V ∈ {128256, 151936, 262144}, fp32
logits, T = 0.8.

Mixes: ``top_k=50, top_p=0.9``; ``top_p=0.9`` alone on peaked logits (an LM's: 20 tokens 8-12 above a N(0, 1)
floor, the nucleus inside the 64 candidates) and on flat N(0, 1) logits (a nucleus of ~10^5 tokens: the exact row
kernel). Times, each in ms per call, the same inputs (enough sets to rotate past L2) in one process:

* ``sample eager``: a Python loop of eager calls (host-bound or device-bound, whichever is slower: what a decode
  loop pays), ``sample graph``: replays of a CUDA graph of such calls (the device time);
* ``softmax_topk graph`` / ``eager``: ``softmax_topk(x, 50)`` alone, the bar of the goal (sample ≤ 1.3× its graph
  replay);
* ``torch chain eager``: torch's top-k → top-p → ``multinomial`` (sort → top-p → ``multinomial`` without top-k).

Every sampled id is checked to lie in the kept set's support (top-50 for the top-k mix). Each eager figure's info
holds the host's speed measured just before the case (µs per ``as_strided``: ``_host_us``).
"""

from __future__ import annotations

import time

import torch

from ...topk.api import softmax_topk
from ...topk.sampling import _warm_capture_draw, sample
from ..harness import BenchContext, Case, Skip, cache_bytes, register_suite

T = 0.8
GRAPH_CALLS = 20
EAGER_CALLS = 50            # eager calls per sample (the device synchronised before and after), 5 samples


def _eager_ms(call, samples: int = 5) -> float:
    """ms per call of a Python loop of eager calls, median of ``samples`` loops of EAGER_CALLS calls."""
    for _ in range(5):
        call()
    times = []
    for _ in range(samples):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(EAGER_CALLS):
            call()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / EAGER_CALLS * 1e3)
    return sorted(times)[samples // 2]


def _host_us(n: int = 20000) -> float:
    """The host's own speed beside the eager loops: µs per ``as_strided`` of a small tensor (no device work). The
    H200 machine's host drifts by up to 2x over seconds (tools/probe_tf_decode2.py: 1.06-2.31 µs), which moves every
    host-bound eager figure with it."""
    x = torch.empty(64, 64)
    t0 = time.perf_counter()
    for _ in range(n):
        x.as_strided((32, 32), (64, 1))
    return (time.perf_counter() - t0) / n * 1e6


def _torch_chain(x, k, p):
    z = x / T
    if k is not None:
        v, i = torch.topk(z, k, dim=-1)
    else:
        v, i = torch.sort(z, dim=-1, descending=True)
    q = torch.softmax(v, dim=-1)
    keep = (torch.cumsum(q, -1) - q) < p
    q = torch.where(keep, q, torch.zeros_like(q))
    return i.gather(-1, torch.multinomial(q, 1)).squeeze(-1)


def _graph_ms(fn, sets, reps: int = 5) -> float:
    """ms per call by replaying a CUDA graph of ``fn`` over every input set (GRAPH_CALLS calls at least)."""
    calls = max(GRAPH_CALLS, len(sets))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for a in sets:
            fn(*a)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in range(calls):
            fn(*sets[c % len(sets)])
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]


def _logits(B, V, kind, device):
    x = torch.randn(B, V, device=device)
    if kind == "peaked":
        hot = torch.randint(0, V, (B, 20), device=device)
        x.scatter_add_(1, hot, 8 + 4 * torch.rand(B, 20, device=device))
    return x


@register_suite("sample", x_label="B")
def suite(ctx: BenchContext):
    if not ctx.is_cuda:
        raise Skip("the fused sampling kernels against torch need a CUDA GPU (the CPU's rows: `bench cpu`)")
    Bs, Vs = [1, 8, 64, 256], [128256, 151936, 262144]
    if ctx.quick:
        Bs, Vs = [1, 8], [128256]
    dev = ctx.device
    mixes = [("top_k=50 top_p=0.9", "peaked", 50, 0.9), ("top_p=0.9", "peaked", None, 0.9),
             ("top_p=0.9", "flat", None, 0.9)]
    for label, kind, k, p in mixes:
        for V in Vs:
            for B in Bs:
                n_sets = max(1, min(16, -(-2 * cache_bytes(dev) // (B * V * 4))))
                sets = [(_logits(B, V, kind, dev),) for _ in range(n_sets)]
                state = {"i": 0}

                def rotate(fn):
                    def call():
                        state["i"] += 1
                        return fn(*sets[state["i"] % n_sets])
                    return call

                def ours(x):
                    return sample(x, temperature=T, top_k=k, top_p=p)[0]

                ids = ours(sets[0][0])
                _warm_capture_draw(sets[0][0], temperature=T, top_k=k, top_p=p)    # the captured call's kernels
                support = torch.topk(sets[0][0], k or 64, dim=-1).indices
                inside = bool((support == ids.unsqueeze(-1)).any(-1).all()) if kind == "peaked" or k else True
                ok = bool((ids >= 0).all()) and inside
                host = _host_us()
                times = {
                    "sample eager": _eager_ms(rotate(ours)),
                    "sample graph": _graph_ms(ours, sets),
                    "softmax_topk eager": _eager_ms(rotate(lambda x: softmax_topk(x, 50))),
                    "softmax_topk graph": _graph_ms(lambda x: softmax_topk(x, 50), sets),
                    "torch chain eager": _eager_ms(rotate(lambda x: _torch_chain(x, k, p))),
                }
                info = {n: {"ids in support": "yes" if ok or not n.startswith("sample") else "NO"} for n in times}
                for n in times:
                    if n.endswith("eager"):
                        info[n]["host as_strided us"] = f"{host:.2f}"
                yield Case(label=f"{label} {kind} B{B} V{V}", shape=(B, V), dtype=torch.float32,
                           make_inputs=lambda: (), impls=times, peer="softmax_topk graph", timing="given",
                           impl_info=info, group=f"{label}, {kind}", x=B)
