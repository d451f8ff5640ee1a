"""``sample``'s distribution and draw, NumPy, fp64: the oracle of ``onlinesoftmax.topk.sample``.

The row is ordered by (logit descending, index ascending). Filters, in order, each keep a prefix: top-k the first
k (``k <= 0`` or ``k >= V``: off); top-p the positions whose mass before them (among those top-k kept) is below
``top_p`` times the top-k's mass, the first always; min-p those with ``p >= min_p · p_max``. ``p`` is
``softmax(x / T)`` over the whole row; the kept ones are renormalised. The draw for a uniform ``u``: the first kept
token in index order whose running probability exceeds ``u``. T = 0: the first token of the order, probability 1.
A row with a NaN or ``+inf`` logit, or none above ``-inf``: no distribution (None).
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
