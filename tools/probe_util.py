"""What the probes share: error summaries, the comparisons their checks make, their inputs, references, timer and CUDA
kernel times per call (``kernel_times``). Imported by the probes run as ``python tools/probe_x.py`` (their folder is
first on sys.path, and their spawned workers inherit it)."""

from __future__ import annotations

import math
import traceback


def err_head(e: BaseException) -> str:
    """The first three lines of ``repr(e)``, at most 240 characters."""
    return " | ".join(repr(e).splitlines()[:3])[:240]


def err_line(e: BaseException) -> str:
    """The first three non-blank lines of the exception's last traceback line, at most 300 characters."""
    lines = [ln for ln in traceback.format_exception_only(type(e), e)[-1].splitlines() if ln.strip()]
    return " | ".join(lines[:3])[:300]


def rel(a, b) -> float:
    """max |a − b| / max |b| over b's finite entries; inf when the finite patterns differ (a NaN: unwritten)."""
    import torch
    a, b = a.float(), b.float()
    fin = torch.isfinite(b)
    if not torch.equal(torch.isfinite(a), fin):
        return float("inf")
    if not fin.any():
        return 0.0
    return ((a[fin] - b[fin]).abs().max() / b[fin].abs().max().clamp_min(1e-6)).item()


def rel_norm(a, b) -> float:
    """‖a − b‖ / ‖b‖."""
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def poisoned(fn, shapes):
    """fn() after NaN-filled blocks of the outputs' sizes went back to the caching allocator (its torch.empty
    outputs reuse them); raises if any of its outputs (dq, dk, dv) has a NaN / inf."""
    import torch
    junk = [torch.full(s, float("nan"), device="cuda", dtype=dt) for s, dt in shapes]
    del junk
    out = fn()
    for name, t in zip(("dq", "dk", "dv"), out):
        if not torch.isfinite(t).all():
            raise RuntimeError(f"{name} has NaN / inf (unwritten or wrong)")
    return out


def inputs(B, H, Hkv, Sq, Sk, D, device, seed=0):
    """bf16 q, k, v, dO ([B, H, S, D] / [B, Hkv, S, D]) from a seeded generator on ``device``."""
    import torch
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, H, Sq, D, device=device, dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Hkv, Sk, D, device=device, dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Hkv, Sk, D, device=device, dtype=torch.bfloat16, generator=g)
    do = torch.randn(B, H, Sq, D, device=device, dtype=torch.bfloat16, generator=g)
    return q, k, v, do


def forward(q, k, v, causal, window=None):
    """(o, lse) by the public call (whatever forward the plan picks: only the backward is probed)."""
    import onlinesoftmax as oss
    return oss.attention(q, k, v, causal=causal, window=window, return_lse=True, backend="triton")


def ref_backward(q, k, v, do, causal, window=None):
    """fp32 torch backward from the bf16 inputs (GQA by repeating k / v; the band aligned bottom-right)."""
    import torch
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    s = (qf @ kf.repeat_interleave(g, 1).transpose(-1, -2)) * q.shape[-1] ** -0.5
    Sq, Sk = q.shape[2], k.shape[2]
    i = torch.arange(Sq, device=q.device)[:, None] + (Sk - Sq)
    j = torch.arange(Sk, device=q.device)[None, :]
    keep = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    if causal:
        keep &= j <= i
    if window is not None:
        left, right = window
        if left >= 0:
            keep &= j >= i - left
        if right >= 0:
            keep &= j <= i + right
    s = s.masked_fill(~keep, -math.inf)
    o = torch.softmax(s, -1).nan_to_num(0.0) @ vf.repeat_interleave(g, 1)
    return torch.autograd.grad(o, (qf, kf, vf), do.float())


def ref_attention(q, k, v, causal, window, softcap):
    """(o, lse) of the torch path in fp32 from the inputs (the forward probes' reference)."""
    from onlinesoftmax.attention import api
    left, right = window
    return api._torch_attention(q.float(), k.float(), v.float(), q.shape[-1] ** -0.5, left, 0 if causal else right,
                                softcap)


def bad_result(r) -> bool:
    """A check's result is an error text or a relative error above 2e-2."""
    return isinstance(r, str) or not (max(r) <= 2e-2)


def poison():
    """NaN through the caching allocator's free blocks: an output the kernel leaves unwritten shows."""
    import torch
    x = torch.full((96 << 20,), float("nan"), dtype=torch.float32, device="cuda")
    del x


def bench_ms(fn, sets, warmup=10, rep=40):
    """do_bench median (ms) of fn over the input sets in turn (eager: host and device time)."""
    from triton.testing import do_bench
    state = [0]

    def call():
        state[0] += 1
        return fn(*sets[state[0] % len(sets)])
    return do_bench(call, warmup=warmup, rep=rep, return_mode="median")


def kernel_times(fn, calls: int = 10, width: int = 70) -> dict:
    """µs of CUDA time per call of ``fn`` by kernel name (its first ``width`` characters), from torch.profiler over
    ``calls`` calls after one warm-up call."""
    from collections import defaultdict

    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out[e.name[:width]] += e.device_time / calls
    return dict(out)
