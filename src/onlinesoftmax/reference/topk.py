"""Fused softmax + top-k, the paper's §4 (Milakov & Gimelshein 2018, arXiv 1805.02867), NumPy, fp64.

One pass over x, 1 memory access per element (the unfused safe softmax → top-k takes 5: 3 reads and a write
for softmax, a read for top-k). For j = 1..V, vectorised over every other axis:

1. the online normalizer: ``m_j = max(m_{j-1}, x_j)``, ``d_j = d_{j-1}·e^(m_{j-1} − m_j) + e^(x_j − m_j)``;
2. ``x_j`` and ``j`` go into slot K+1 of the arrays ``u`` (values) and ``p`` (indices), whose first K slots
   are sorted descending; one insertion pass moves it up past every slot it ranks before.

Then ``v_i = e^(u_i − m_V) / d_V`` for the K slots only. Ranking: descending value, NaN above every number,
ties to the lower index (an element never passes an equal one that came earlier). Special rows as torch:
NaN anywhere → NaN values and NaN lse; all ``-inf`` → NaN values, lse ``-inf``; ``+inf`` present → NaN values,
lse ``+inf``.
"""

from __future__ import annotations

import numpy as np

from .softmax import _rescale


def _ranks_before(a, b):
    """True where value ``a`` (earlier) ranks before or level with ``b`` (later): a >= b, NaN highest."""
    with np.errstate(invalid="ignore"):
        return np.isnan(a) | (~np.isnan(b) & (a >= b))


def softmax_topk(x, k, axis=-1, dtype=np.float64):
    """Paper §4: returns ``(values, indices, lse)``; values/indices have ``axis`` of size ``k``."""
    xs = np.moveaxis(np.asarray(x, dtype=dtype), axis, -1)
    n = xs.shape[-1]
    if not 1 <= k <= n:
        raise ValueError(f"k={k} is out of range for a dimension of size {n}")
    lead = xs.shape[:-1]
    m = np.full(lead, -np.inf, dtype=dtype)
    d = np.zeros(lead, dtype=dtype)
    u = np.full(lead + (k + 1,), np.nan, dtype=dtype)   # slots filled so far: `filled`
    p = np.full(lead + (k + 1,), -1, dtype=np.int64)
    filled = 0
    nan_seen = np.zeros(lead, dtype=bool)
    for j in range(n):
        xj = xs[..., j]                                  # the one load of x_j
        # 1. online normalizer (NaN tracked separately: np.maximum propagates it, _rescale keeps d finite)
        nan_seen |= np.isnan(xj)
        m_new = np.fmax(m, xj)
        d = d * _rescale(m, m_new) + np.where(np.isnan(xj), 0.0, _rescale(xj, m_new))
        m = m_new
        # 2. put x_j in slot `filled` (slot K+1 once full), then one insertion pass towards the front
        slot = min(filled, k)
        u[..., slot] = xj
        p[..., slot] = j
        for i in range(slot, 0, -1):
            move = ~_ranks_before(u[..., i - 1], u[..., i])
            if not move.any():
                break
            a, b = u[..., i - 1].copy(), p[..., i - 1].copy()
            u[..., i - 1] = np.where(move, u[..., i], a)
            p[..., i - 1] = np.where(move, p[..., i], b)
            u[..., i] = np.where(move, a, u[..., i])
            p[..., i] = np.where(move, b, p[..., i])
        filled = min(filled + 1, k)
    m = np.where(nan_seen, np.nan, m)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lse = m + np.log(d)
        v = np.exp(u[..., :k] - m[..., None]) / d[..., None]
    v = np.where(np.isfinite(m)[..., None], v, np.nan)
    return np.moveaxis(v, -1, axis), np.moveaxis(p[..., :k], -1, axis), lse
