"""``sample``: temperature / top-k / top-p sampling from logits, with no host synchronisation.

Every step is a tensor op whose shapes depend only on the input's shape and on Python arguments, so a call
can be captured in a CUDA graph and never waits for the device. Randomness comes from
``torch.Tensor.exponential_`` with the given ``generator`` (same generator state → same ids), through the
exponential race: with ``E_i ~ Exp(1)``, ``argmax_i w_i / E_i`` is ``i`` with probability ``w_i / Σ w``.

* ``top_k`` a Python int: the candidates are ``softmax_topk(logits / T, top_k)`` (one read of the logits, the
  fused kernel on CUDA; an exact ``torch.topk`` on the CPU); a per-row integer tensor (0 or less: no top-k on
  that row): a full sort of each row (sync-free, but V log V).
* ``top_p``: after top-k, keep the shortest prefix of the descending probabilities whose mass reaches
  ``top_p`` (the first token always stays), then renormalise.
* ``temperature``: a float or a per-row tensor; 0 means greedy (argmax, lowest index among ties).

Arguments are checked where that needs no host synchronisation: Python values always (``temperature`` finite and
``>= 0``, ``top_p`` in ``(0, 1]``, ``top_k`` an int ``>= 1``), a tensor's dtype and size always, and a tensor's
values when it is on the CPU (``ValueError``). The values of a tensor on another device are not read by the host
(the call stays sync-free and graph-safe): a row whose ``temperature`` or ``top_p`` is out of range there gets
the result of a row with no distribution, below.

A row with no distribution (after temperature: a NaN logit, a ``+inf`` logit or no logit above ``-inf``, where
``torch.softmax`` is NaN) gets id ``-1`` and log-probability NaN, greedy or not.
"""

from __future__ import annotations

import math
from numbers import Real

import torch

from .._checks import check_float_tensor
from .api import softmax_topk

__all__ = ["sample"]


def _number(v, name: str, ok, rule: str):
    """A Python real (bool excluded) that satisfies ``ok``, or TypeError / ValueError naming ``sample``."""
    if isinstance(v, bool) or not isinstance(v, Real):
        raise TypeError(f"sample: {name} must be a float or a tensor, got {type(v).__name__}")
    if not ok(float(v)):
        raise ValueError(f"sample: {name} must be {rule}, got {v!r}")
    return float(v)


def _per_row(v: torch.Tensor, B: int, device, dtype, name: str, ok=None, rule: str = "") -> torch.Tensor:
    """A tensor of B (or 1) values as a ``[B, 1]`` tensor on ``device`` (no sync). ``ok`` (a predicate on the
    values) is checked where ``v`` is on the CPU: reading it there costs no synchronisation."""
    if v.dtype == torch.bool or v.is_complex() or (not dtype.is_floating_point and v.is_floating_point()):
        want = "an int or an integer" if not dtype.is_floating_point else "a float or a real"
        raise TypeError(f"sample: {name} must be {want} tensor, got a {str(v.dtype)[6:]} tensor")
    if v.numel() not in (1, B):
        raise ValueError(f"sample: {name} must hold 1 or {B} values (one per row), got shape {tuple(v.shape)}")
    if ok is not None and v.device.type == "cpu" and v.numel() and not bool(ok(v.to(torch.float64)).all()):
        bad = v.reshape(-1)[~ok(v.reshape(-1).to(torch.float64))][:4].tolist()
        raise ValueError(f"sample: {name} must be {rule} on every row, got {bad}")
    return v.to(device=device, dtype=dtype).reshape(-1, 1).expand(B, 1)


def _t_ok(t):
    return torch.isfinite(t) & (t >= 0)


def _p_ok(p):
    return (p > 0) & (p <= 1)


def _race(w: torch.Tensor, generator) -> torch.Tensor:
    """Index of ``argmax w / E`` per row, ``E ~ Exp(1)``: a draw from ``w / Σ w`` (w >= 0, Σ w > 0)."""
    e = torch.empty_like(w).exponential_(generator=generator)
    return torch.argmax(w / e.clamp_min(torch.finfo(w.dtype).tiny), dim=-1, keepdim=True)


def sample(logits: torch.Tensor, *, temperature=1.0, top_k=None, top_p=None,
           generator: torch.Generator | None = None):
    """Draw one token id per row of ``logits`` (``[..., V]``). Returns ``(ids, logprobs)``: int64 ids of shape
    ``logits.shape[:-1]`` and float32 log-probabilities of those ids under the distribution sampled from
    (after temperature, top-k, top-p and renormalisation; 0 for greedy rows). A row with no distribution (a
    NaN or ``+inf`` logit, or every logit ``-inf``), or with a parameter out of range on a device tensor, gets
    id -1 and log-probability NaN (see the module's docstring for what is checked where).
    """
    check_float_tensor(logits, "sample: logits")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError("sample: logits must have a non-empty last dimension")
    lead, V = logits.shape[:-1], logits.shape[-1]
    x = logits.reshape(-1, V).float()
    B, dev = x.shape[0], x.device
    per_row_t = isinstance(temperature, torch.Tensor)
    if not per_row_t:
        temperature = _number(temperature, "temperature", lambda v: math.isfinite(v) and v >= 0,
                              "finite and >= 0")
    if top_p is not None and not isinstance(top_p, torch.Tensor):
        top_p = _number(top_p, "top_p", lambda v: 0 < v <= 1, "in (0, 1]")
    if top_k is not None and not isinstance(top_k, torch.Tensor):
        if isinstance(top_k, bool) or not isinstance(top_k, int):
            raise TypeError(f"sample: top_k must be an int or an integer tensor, got {type(top_k).__name__}")
        if top_k < 1:
            raise ValueError(f"sample: top_k must be >= 1 (or a per-row tensor, 0 for no top-k), got {top_k}")
        top_k = min(top_k, V)
    bad = None                                              # rows whose device-tensor parameters are out of range
    if per_row_t:
        t = _per_row(temperature, B, dev, torch.float32, "temperature", _t_ok, "finite and >= 0")
        bad = ~_t_ok(t)
        greedy = t == 0
        z = x / torch.where(greedy, torch.ones_like(t), t)
    elif temperature == 0:                                  # every row greedy: the argmax, nothing drawn
        ids = torch.argmax(x, dim=-1, keepdim=True)
        undefined = ~torch.isfinite(x.gather(-1, ids))
        return _result(ids, torch.zeros_like(ids, dtype=torch.float32), undefined, None, lead)
    else:
        z = x if temperature == 1 else x / temperature
    if isinstance(top_k, torch.Tensor):
        kk = _per_row(top_k, B, dev, torch.int64, "top_k")
    if isinstance(top_p, torch.Tensor):
        pp = _per_row(top_p, B, dev, torch.float32, "top_p", _p_ok, "in (0, 1]")
        bad = ~_p_ok(pp) if bad is None else bad | ~_p_ok(pp)
    elif top_p is not None:
        pp = top_p

    if top_k is None and top_p is None:
        # the whole row: no sort, no top-k. log p = (z - m) - log d, exact at any magnitude of z
        m, top = torch.max(z, dim=-1, keepdim=True)          # NaN if the row holds one
        p = torch.softmax(z, dim=-1)
        pick = _race(p, generator)
        logp = (z.gather(-1, pick) - m) + torch.log(p.gather(-1, top))     # p(argmax) = 1 / d
        ids = pick
        undefined = ~torch.isfinite(m)
    else:
        if isinstance(top_k, int):
            probs, cand, lse = softmax_topk(z, top_k)       # sorted descending, ties to the lower index
            undefined = ~torch.isfinite(lse).unsqueeze(-1)
            keep = None
        else:
            zs, cand = torch.sort(z, dim=-1, descending=True, stable=True)
            probs = torch.softmax(zs, dim=-1)
            undefined = ~torch.isfinite(zs[:, :1])          # NaN sorts first: the row's maximum, or NaN
            keep = None
            if top_k is not None:
                kk = torch.where(kk < 1, torch.full_like(kk, V), kk)     # 0 (or less) disables top-k on a row
                keep = torch.arange(V, device=dev).unsqueeze(0) < kk
        w = probs if keep is None else torch.where(keep, probs, torch.zeros_like(probs))
        if top_p is not None:
            before = torch.cumsum(w, dim=-1) - w                         # mass strictly before each position
            cut = before < pp * w.sum(-1, keepdim=True)
            cut[:, :1] = True
            w = torch.where(cut, w, torch.zeros_like(w))
            keep = cut if keep is None else keep & cut
        if keep is not None and dev.type == "cpu" and w.shape[-1] > 256:
            # the kept positions are a prefix of each row: on the CPU (reading its length is free) the race runs
            # over the longest one, not over V (Exp(1) draws for every entry: most of the sort path's time after
            # the sort)
            n = max(int(keep.sum(-1).max()) if keep.numel() else 1, 1)
            w, cand = w[:, :n], cand[:, :n]
        total = w.sum(-1, keepdim=True)
        pos = _race(w, generator)
        ids = cand.gather(-1, pos)
        logp = torch.log(w.gather(-1, pos) / total)
    # greedy rows: argmax of the logits (lowest index among ties), probability 1
    if per_row_t:
        first = torch.argmax(x, dim=-1, keepdim=True)
        ids = torch.where(greedy, first, ids)
        logp = torch.where(greedy, torch.zeros_like(logp), logp)
    return _result(ids, logp, undefined, bad, lead)


def _result(ids, logp, undefined, bad, lead):
    """``(ids, logp)`` shaped ``lead``: -1 and NaN on rows with no distribution or a parameter out of range."""
    if bad is not None:
        undefined = undefined | bad
    ids = torch.where(undefined, torch.full_like(ids, -1), ids)
    logp = torch.where(undefined, torch.full_like(logp, float("nan")), logp.float())
    return ids.reshape(lead), logp.reshape(lead)
