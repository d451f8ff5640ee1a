"""Softmax references from the seeds, NumPy, vectorised over every axis but the reduced one.

Memory accesses per element (the paper's count, x read or y written once = 1 access):

=========================  ======  ========  ====================================================
algorithm                  passes  accesses  source
=========================  ======  ========  ====================================================
naive softmax              2       3         paper Alg. 1 (load, load, store)
safe softmax               3       4         paper Alg. 2 (load, load, load, store)
online softmax             2       3         paper Alg. 3 (load, load, store)
chunked online softmax     2       3         course lesson 7, ``online_softmax_numpy_simulate``
tree reduction of states   -       -         paper §3 / tutorial V1: ⊕ is associative
=========================  ======  ========  ====================================================

Every function takes ``axis`` and computes in ``dtype`` (fp64 by default, so results are exact to
the rounding of fp64). Semantics for special values follow ``torch.softmax``: a row with NaN gives NaN,
an all ``-inf`` row gives NaN, a row holding ``+inf`` gives NaN (``inf - inf``).
"""

from __future__ import annotations

import numpy as np

_NEG_INF = -np.inf


def _prepare(x, axis, dtype):
    x = np.asarray(x, dtype=dtype)
    return np.moveaxis(x, axis, -1)


def _finish(y, axis):
    return np.moveaxis(y, -1, axis)


def _rescale(m_i, m):
    """e^(m_i - m), taken as 1 where m_i == m (no NaN from -inf - -inf). Same rule as ``state.py``."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(m_i == m, 1.0, np.exp(m_i - m))


def _torch_inf_rule(m, d):
    """A row holding +inf has softmax NaN everywhere in torch (its d is ``sum e^(inf - inf)``); the
    state keeps ``logsumexp = +inf`` for it, so the output pass marks such rows NaN explicitly."""
    return np.where(m == np.inf, np.nan, d)


def naive_softmax(x, axis=-1, dtype=np.float64):
    """Paper Algorithm 1: ``d = sum e^x`` then ``y = e^x / d``. Overflows for large x (that is its defect)."""
    x = _prepare(x, axis, dtype)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        d = np.zeros(x.shape[:-1], dtype=dtype)
        for j in range(x.shape[-1]):          # pass 1: load x_j
            d = d + np.exp(x[..., j])
        y = np.exp(x) / d[..., None]         # pass 2: load x_j, store y_j
    return _finish(y, axis)


def safe_softmax(x, axis=-1, dtype=np.float64):
    """Paper Algorithm 2: ``m = max x``; ``d = sum e^(x - m)``; ``y = e^(x - m) / d`` (three passes).

    This is what ``torch.softmax`` computes, so it is the oracle for special values as well.
    """
    x = _prepare(x, axis, dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.full(x.shape[:-1], _NEG_INF, dtype=dtype)
        for j in range(x.shape[-1]):          # pass 1: load x_j
            m = np.maximum(m, x[..., j])            # NaN propagates
        d = np.zeros(x.shape[:-1], dtype=dtype)
        for j in range(x.shape[-1]):          # pass 2: load x_j
            d = d + np.exp(x[..., j] - m)
        y = np.exp(x - m[..., None]) / d[..., None]   # pass 3: load x_j, store y_j
    return _finish(y, axis)


def online_normalizer(x, axis=-1, dtype=np.float64):
    """Paper Algorithm 3, lines 1-6: the state ``(m, d)`` in one pass over x.

    ``m_j = max(m_{j-1}, x_j)``; ``d_j = d_{j-1}·e^(m_{j-1} - m_j) + e^(x_j - m_j)``.
    """
    x = _prepare(x, axis, dtype)
    m = np.full(x.shape[:-1], _NEG_INF, dtype=dtype)
    d = np.zeros(x.shape[:-1], dtype=dtype)
    for j in range(x.shape[-1]):              # pass 1: load x_j
        xj = x[..., j]
        m_new = np.maximum(m, xj)
        d = d * _rescale(m, m_new) + _rescale(xj, m_new)
        m = m_new
    return m, d


def online_softmax(x, axis=-1, dtype=np.float64):
    """Paper Algorithm 3: the online normalizer, then ``y = e^(x - m) / d`` (two passes, 3 accesses)."""
    m, d = online_normalizer(x, axis, dtype)
    xs = _prepare(x, axis, dtype)
    d = _torch_inf_rule(m, d)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.exp(xs - m[..., None]) / d[..., None]  # pass 2: load x_j, store y_j
    return _finish(y, axis)


def chunked_online_softmax(x, chunk_size=32, axis=-1, dtype=np.float64):
    """The course's ``online_softmax_numpy_simulate`` (seed 003): the row in chunks, each merged by ⊕.

    ``new_m = max(m, max(chunk))``; ``d = d·e^(m - new_m) + sum e^(chunk - new_m)``.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    xs = _prepare(x, axis, dtype)
    m = np.full(xs.shape[:-1], _NEG_INF, dtype=dtype)
    d = np.zeros(xs.shape[:-1], dtype=dtype)
    for start in range(0, xs.shape[-1], chunk_size):
        chunk = xs[..., start:start + chunk_size]
        new_m = np.maximum(m, chunk.max(axis=-1))
        d = d * _rescale(m, new_m) + _rescale(chunk, new_m[..., None]).sum(axis=-1)
        m = new_m
    d = _torch_inf_rule(m, d)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.exp(xs - m[..., None]) / d[..., None]
    return _finish(y, axis)


def state_combine(a, b):
    """⊕ on NumPy states ``(m, d)``: ``m = max(m1, m2)``, ``d = d1·e^(m1-m) + d2·e^(m2-m)``."""
    (m1, d1), (m2, d2) = a, b
    m = np.maximum(m1, m2)
    return m, d1 * _rescale(m1, m) + d2 * _rescale(m2, m)


def tree_reduce_states(x, leaf_size=1, axis=-1, dtype=np.float64):
    """Parallel tree reduction (tutorial V1's warp shuffle, paper §3): leaves of ``leaf_size`` elements
    each give a state; pairs merge level by level (``log2`` levels) until one state per row is left."""
    xs = _prepare(x, axis, dtype)
    n = xs.shape[-1]
    states = []
    for start in range(0, n, leaf_size):
        states.append(online_normalizer(xs[..., start:start + leaf_size], axis=-1, dtype=dtype))
    if not states:
        shape = xs.shape[:-1]
        return np.full(shape, _NEG_INF, dtype=dtype), np.zeros(shape, dtype=dtype)
    while len(states) > 1:
        nxt = [state_combine(states[i], states[i + 1]) for i in range(0, len(states) - 1, 2)]
        if len(states) % 2:
            nxt.append(states[-1])
        states = nxt
    return states[0]


def softmax(x, axis=-1, dtype=np.float64):
    """The oracle: fp64 safe softmax (torch's semantics for special values)."""
    return safe_softmax(x, axis, dtype)


def logsumexp(x, axis=-1, dtype=np.float64):
    """``m + log d``: ``-inf`` for empty and all ``-inf`` rows, ``+inf`` for a row holding ``+inf``."""
    m, d = online_normalizer(x, axis, dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        return m + np.log(d)


def log_softmax(x, axis=-1, dtype=np.float64):
    """``x - m - log d`` (torch's semantics: NaN for all ``-inf`` rows and rows holding ``+inf``)."""
    xs = _prepare(x, axis, dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = xs.max(axis=-1, keepdims=True) if xs.shape[-1] else np.zeros(xs.shape[:-1] + (1,), dtype)
        y = (xs - m) - np.log(np.exp(xs - m).sum(axis=-1, keepdims=True))
    return _finish(y, axis)
