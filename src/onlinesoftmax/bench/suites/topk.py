"""Suites ``topk`` (LLM decoding shapes) and ``topk-paper`` (paper §4's experiment): fused softmax + top-k.

``topk``: B ∈ {1, 32, 256} × V ∈ {128256, 151936, 262144} × k ∈ {1, 8, 50, 256, 1024}, fp32 logits. Peer:
``torch.softmax(x).topk(k)``; also ``torch.topk(x, k) + torch.logsumexp`` and ``torch.topk`` alone.
``topk-paper``: K = 5, batch 4000 and 10, V from 100 to 10^6; peer: unfused safe softmax (``torch.softmax``)
then ``topk``. ``benchmarks/topk_paper_plot.py`` turns its JSON into the speed-up plot.
"""

from __future__ import annotations

import torch

from ...topk.api import TopK, softmax_topk
from ..harness import BenchContext, Case, register_suite


def _probs(out):
    """Probabilities of an implementation's output, or None where it has none (``torch.topk`` alone)."""
    if isinstance(out, TopK):
        return out.values
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.return_types.topk):
        return torch.exp(out[0].values.float() - out[1].unsqueeze(-1))
    return None


def _check(out, ref):
    p, r = _probs(out), ref.values.float()
    if p is None:
        return
    # values only: indices of equal probabilities may differ (torch.topk does not fix the order of ties)
    torch.testing.assert_close(p.float(), r, rtol=2e-5, atol=1e-7)


def _impls():
    return {
        "torch.softmax→topk": lambda x, k: torch.softmax(x.float(), dim=-1).topk(k, dim=-1),
        "torch.topk+logsumexp": lambda x, k: (torch.topk(x, k, dim=-1), torch.logsumexp(x.float(), dim=-1)),
        "torch.topk": lambda x, k: torch.topk(x, k, dim=-1),
        "softmax_topk": lambda x, k: softmax_topk(x, k),
    }


def _case(ctx, B, V, k, dtype, group, x_axis):
    esize = torch.finfo(dtype).bits // 8
    # I/O: read x once (B·V) + write values (fp32), indices (int64) and lse (fp32)
    nbytes = B * V * esize + B * k * 12 + B * 4
    impls = _impls()
    return Case(label=f"B{B} V{V} k{k}", shape=(B, V, k), dtype=dtype, x=x_axis, group=group, bytes=nbytes,
                make_inputs=lambda: (torch.randn(B, V, device=ctx.device, dtype=dtype), k),
                impls=impls, peer="torch.softmax→topk", check=_check)


@register_suite("topk", x_label="k")
def suite(ctx: BenchContext):
    if ctx.is_cuda:
        Bs, Vs, ks = [1, 32, 256], [128256, 151936, 262144], [1, 8, 50, 256, 1024]
        if ctx.quick:
            Bs, Vs, ks = [1, 256], [128256], [8, 50]
    else:
        Bs, Vs, ks = [1, 8], [4096], [8, 50]
    dtype = torch.float32
    if not ctx.want(dtype):
        return
    for B in Bs:
        for V in Vs:
            for k in ks:
                yield _case(ctx, B, V, k, dtype, f"B={B}, V={V}", k)


@register_suite("topk-paper", x_label="V")
def paper_suite(ctx: BenchContext):
    dtype = torch.float32
    if not ctx.want(dtype):
        return
    if ctx.is_cuda:
        Vs = [100, 300, 1000, 3000, 10000, 30000, 100000, 300000, 1000000]
        Bs = [4000, 10]
        if ctx.quick:
            Vs = [1000, 100000]
    else:
        Vs, Bs = [100, 1000, 10000], [64, 4]
    for B in Bs:
        for V in Vs:
            k = 5
            esize = torch.finfo(dtype).bits // 8
            nbytes = B * V * esize + B * k * 12 + B * 4
            yield Case(label=f"B{B} V{V} K5", shape=(B, V, k), dtype=dtype, x=V, group=f"batch {B}",
                       bytes=nbytes,
                       make_inputs=lambda B=B, V=V: (torch.randn(B, V, device=ctx.device, dtype=dtype), 5),
                       impls={"safe softmax→topk (unfused)":
                              lambda x, k: torch.softmax(x, dim=-1).topk(k, dim=-1),
                              "softmax_topk (fused)": lambda x, k: softmax_topk(x, k)},
                       peer="safe softmax→topk (unfused)", check=_check)
