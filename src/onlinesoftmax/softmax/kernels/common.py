"""The softmax family's own Triton blocks, shared by its kernels: step 3 of the forward from registers
(``_normalise``) and the backward's row sum and gradient (``_grad_sum``, ``_grad``)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..._triton.online import _alpha


@triton.jit
def _normalise(x, e, m_c, m, d, MODE: tl.constexpr):
    """3. y from registers. e = e^(x - m_c) for this tile's own max m_c; (m, d) is the merged row state.
    softmax: y = e · e^(m_c - m) / d;  log-softmax: y = (x - m) - log d. A row holding +inf is NaN, as torch."""
    if MODE == 0:
        return e * tl.where(m == float("inf"), float("nan"), _alpha(m_c, m) / d)
    else:
        log_d = tl.where(m == float("inf"), float("nan"), tl.log(d))
        return (x - m) - log_d            # x - m first: exact near the max, as torch


@triton.jit
def _grad(y, dy, s, LOG: tl.constexpr, LIBDEVICE: tl.constexpr):
    if LOG:
        # log-softmax: dx = dy - e^y · sum(dy). For fp32/fp64 dx (LIBDEVICE) libdevice's exp, as torch's expf:
        # e^y · sum(dy) reaches ~4 at N = 3000 (|sum(dy)| ~ 55), where the fast 2^(y·log2 e)'s few-ulp error is
        # several of dx's ulps; for 16-bit dx the fast exp's error is far below an ulp. The interpreter has no
        # libdevice; its tl.exp is numpy's, exact.
        return dy - (libdevice.exp(y) if LIBDEVICE else tl.exp(y)) * s
    else:
        return y * (dy - s)                # softmax:     dx = y · (dy - sum(y · dy))


@triton.jit
def _grad_sum(y, dy, axis: tl.constexpr, LOG: tl.constexpr, SUM: tl.constexpr):
    """sum(dy) or sum(y · dy), accumulated in SUM: fp64 for fp32 tensors. The terms have both signs, so the
    sum cancels (|sum| ~ sqrt(N) of sum|terms| ~ N): an fp32 tree's error, times e^y, measured 7x torch's in
    dx on the H200 (N = 3000), and was as large whether y came from this library, torch or fp64."""
    if LOG:
        return tl.sum(dy.to(SUM), axis=axis)
    else:
        return tl.sum((y * dy).to(SUM), axis=axis)
