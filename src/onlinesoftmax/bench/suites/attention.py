"""Suite ``attention``: ``oss.attention`` forward and backward beside SDPA's cuDNN and flash backends, bf16.

TFLOP/s = 4·B·H·Sq·Sk·D / t (the two matmuls), halved when causal; the backward counts 2.5× the forward
(FlashAttention's convention: five matmuls of which two are recomputation-free). The ceiling: a bf16 8192³
matmul (``torch.matmul``) timed in the same run, as its own case. The backward is timed alone: the forward graph of
each input set is built once (outside the timing), then ``torch.autograd.grad(o, (q, k, v), do)`` is timed.

SDPA's ``is_causal`` aligns top-left and ours bottom-right: the cases have Sq == Sk, where they agree.
"""

from __future__ import annotations

import torch

from ...attention import attention, attention_varlen
from ..harness import BenchContext, Case, register_suite

SHAPES = [  # (B, H, Hkv, S, D): the list (ANCHORS.md's cuDNN figures)
    (4, 32, 32, 4096, 128),
    (1, 32, 32, 16384, 128),
    (2, 32, 32, 8192, 128),
    (16, 32, 32, 1024, 128),
    (8, 16, 16, 2048, 64),
    (4, 32, 8, 4096, 128),      # GQA 32 / 8
    (2, 16, 16, 4096, 256),     # D = 256
]
QUICK = [(4, 32, 32, 4096, 128), (8, 16, 16, 2048, 64)]
CPU_SHAPES = [(1, 2, 2, 128, 32)]


def sdpa(backend_name):
    """SDPA restricted to one backend ("cudnn", "flash", "math"): ``run(q, k, v, causal)``; the tools use it too."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}[
        backend_name]

    def run(q, k, v, causal):
        with sdpa_kernel(be):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                    enable_gqa=k.shape[1] != q.shape[1])
    return run


def _ours(q, k, v, causal):
    return attention(q, k, v, causal=causal)


def _impls(ctx):
    impls = {"oss.attention": _ours}
    if ctx.is_cuda:
        impls = {"sdpa cudnn": sdpa("cudnn"), "sdpa flash": sdpa("flash"), **impls}
    else:
        impls = {"sdpa math": sdpa("math"), **impls}
    return impls


def _close(out, ref):
    """Relative error of the norm (bf16 inputs: both sides err by ~4e-3 against fp64)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    for o, r in zip(outs, refs):
        rel = ((o.float() - r.float()).norm() / r.float().norm().clamp_min(1e-30)).item()
        if not rel <= 2e-2:
            raise AssertionError(f"relative error {rel:.3e} > 2e-2")


def _backward(fn):
    """The gradients of fn's output against do; the forward graph of each input set is built on its first call."""
    def run(q, k, v, do, causal, graphs):
        key = (id(q), id(fn))
        if key not in graphs:
            graphs[key] = fn(q, k, v, causal)
        return torch.autograd.grad(graphs[key], (q, k, v), do, retain_graph=True)
    return run


def _case(ctx, B, H, Hkv, S, D, causal, direction):
    dt = torch.bfloat16
    flops = 4 * B * H * S * S * D // (2 if causal else 1)
    if direction == "bwd":
        flops = int(flops * 2.5)
    graphs: dict = {}

    def make():
        q = torch.randn(B, H, S, D, device=ctx.device, dtype=dt)
        k = torch.randn(B, Hkv, S, D, device=ctx.device, dtype=dt)
        v = torch.randn(B, Hkv, S, D, device=ctx.device, dtype=dt)
        if direction == "fwd":
            return q, k, v, causal
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        return q, k, v, torch.randn_like(q), causal, graphs

    impls = _impls(ctx)
    if direction == "bwd":
        impls = {n: _backward(f) for n, f in impls.items()}
    peer = "sdpa cudnn" if ctx.is_cuda else "sdpa math"
    gqa = f" GQA {H}/{Hkv}" if Hkv != H else ""
    label = f"{direction} {B}x{H}x{S}x{D}{gqa}{' causal' if causal else ''}"
    return Case(label=label, shape=(B, H, Hkv, S, D), dtype=dt, make_inputs=make, impls=impls, peer=peer,
                flops=flops, x=S, group=f"{direction}, D={D}{', causal' if causal else ''}{gqa}", check=_close,
                bytes=0)


def _matmul_case(ctx):
    n = 8192 if ctx.is_cuda else 512
    return Case(label=f"bf16 matmul {n}^3 (ceiling)", shape=(n, n, n), dtype=torch.bfloat16,
                make_inputs=lambda: (torch.randn(n, n, device=ctx.device, dtype=torch.bfloat16),
                                     torch.randn(n, n, device=ctx.device, dtype=torch.bfloat16)),
                impls={"torch.matmul": torch.matmul}, peer="torch.matmul", flops=2 * n ** 3, x=None,
                group="ceiling", unchecked=("torch.matmul",))


VARLEN_LENS = [1024, 7168, 2048, 5120, 512, 8192, 3072, 5632]     # 8 sequences, 32768 tokens


def _varlen_case(ctx, lens, H, D, causal, direction):
    """Packed sequences beside the same sequences one dense call each (the peer: same outputs)."""
    dt = torch.bfloat16
    T = sum(lens)
    flops = sum(4 * H * n * n * D for n in lens) // (2 if causal else 1)
    if direction == "bwd":
        flops = int(flops * 2.5)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=ctx.device)
    graphs: dict = {}

    def packed(q, k, v, causal):
        return attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal)

    def loop(q, k, v, causal):
        outs, a = [], 0
        for n in lens:
            sl = slice(a, a + n)
            outs.append(attention(*(t[sl].transpose(0, 1).unsqueeze(0) for t in (q, k, v)),
                                  causal=causal)[0].transpose(0, 1))
            a += n
        return torch.cat(outs, 0)

    def make():
        q, k, v = (torch.randn(T, H, D, device=ctx.device, dtype=dt) for _ in range(3))
        if direction == "fwd":
            return q, k, v, causal
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        return q, k, v, torch.randn_like(q), causal, graphs

    impls = {"oss.attention per sequence": loop, "oss.attention_varlen": packed}
    if direction == "bwd":
        impls = {n: _backward(f) for n, f in impls.items()}
    label = f"{direction} varlen {len(lens)} seqs {T} tokens H{H} D{D}{' causal' if causal else ''}"
    return Case(label=label, shape=(len(lens), H, H, T, D), dtype=dt, make_inputs=make, impls=impls,
                peer="oss.attention per sequence", flops=flops, x=T, group=f"varlen {direction}", check=_close)


@register_suite("attention", x_label="S")
def suite(ctx: BenchContext):
    if not ctx.want(torch.bfloat16):
        return
    yield _matmul_case(ctx)
    shapes = (QUICK if ctx.quick else SHAPES) if ctx.is_cuda else CPU_SHAPES
    for direction in ("fwd", "bwd"):
        for B, H, Hkv, S, D in shapes:
            for causal in (False, True):
                if Hkv != H and not causal:
                    continue
                yield _case(ctx, B, H, Hkv, S, D, causal, direction)
        lens = VARLEN_LENS if ctx.is_cuda else [3, 0, 17, 9]
        yield _varlen_case(ctx, lens, 32 if ctx.is_cuda else 2, 128 if ctx.is_cuda else 16, True, direction)
