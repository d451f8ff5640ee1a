"""What the attention probes share: error summaries and the comparisons their checks make. Imported by the probes
run as ``python tools/probe_x.py`` (their folder is first on sys.path, and their spawned workers inherit it)."""

from __future__ import annotations

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
