"""``sample``'s distribution and draw, NumPy, fp64: the oracle of ``onlinesoftmax.topk.sample``.

The row is ordered by (logit descending, index ascending). Filters, in order, each keep a prefix: top-k the first
k (``k <= 0`` or ``k >= V``: off); top-p the positions whose mass before them (among those top-k kept) is below
``top_p`` times the top-k's mass, the first always; min-p those with ``p >= min_p · p_max``. ``p`` is
``softmax(x / T)`` over the whole row; the kept ones are renormalised. The draw for a uniform ``u``: the first kept
token in index order whose running probability exceeds ``u``. T = 0: the first token of the order, probability 1.
A row with a NaN or ``+inf`` logit, or none above ``-inf``: no distribution (None).
``philox_uniform``: the uniform ``u`` an eager CUDA call draws in its kernels for a row (``draw="kernel"``).
"""

from __future__ import annotations

import numpy as np


def sample_distribution(x, temperature=1.0, top_k=None, top_p=None, min_p=None):
    """The kept probabilities of one row ``x`` ``[V]`` (zeros elsewhere, summing to 1), or None."""
    x = np.asarray(x, dtype=np.float64)
    V = x.shape[-1]
    if np.isnan(x).any() or np.isposinf(x).any() or not np.isfinite(x).any():
        return None
    order = np.lexsort((np.arange(V), -x))          # logit descending, then index ascending
    out = np.zeros(V)
    if temperature == 0:
        out[order[0]] = 1.0
        return out
    z = x[order] / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    keep = np.ones(V, dtype=bool)
    if top_k is not None and 0 < top_k < V:
        keep[top_k:] = False
    if top_p is not None and top_p < 1:
        w = np.where(keep, p, 0.0)
        keep &= (np.cumsum(w) - w) < top_p * w.sum()
        keep[0] = True
    if min_p is not None and min_p > 0:
        keep &= p >= min_p * p[0]
    w = np.where(keep, p, 0.0)
    out[order] = w / w.sum()
    return out


def sample_draw(probs, u):
    """The id drawn by uniform ``u`` from ``probs`` (``sample_distribution``): inverse CDF in index order, and the
    distance of ``u`` to the nearest boundary of that CDF (ids within rounding of a boundary may differ)."""
    cs = np.cumsum(probs)
    i = int(np.searchsorted(cs, u, side="right"))
    i = min(i, int(np.nonzero(probs > 0)[0].max()))
    edges = cs[probs > 0]
    return i, float(np.abs(edges - u).min()) if u > 0 else 1.0


def philox_uniform(seed: int, offset: int, row: int) -> float:
    """The u the sampling kernels draw for ``row``: Philox-4x32-10 (Random123's constants; key = the seed's two
    32-bit words, counter = (offset / 4 as two words, row, 0)), the first output word's top 24 bits · 2^-24."""
    c, (k0, k1) = [(offset >> 2) & 0xFFFFFFFF, offset >> 34, row, 0], (seed & 0xFFFFFFFF, seed >> 32)
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & 0xFFFFFFFF, p1 & 0xFFFFFFFF, ((p0 >> 32) ^ c[3] ^ k1) & 0xFFFFFFFF,
             p0 & 0xFFFFFFFF]
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return (c[0] >> 8) / 2**24
