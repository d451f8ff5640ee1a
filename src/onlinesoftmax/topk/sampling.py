"""``sample``: temperature / top-k / top-p sampling from logits, with no host synchronisation.

Every step is a tensor op whose shapes depend only on the input's shape and on Python arguments, so a call
can be captured in a CUDA graph and never waits for the device. Randomness comes from
``torch.Tensor.exponential_`` with the given ``generator`` (same generator state → same ids), through the
exponential race: with ``E_i ~ Exp(1)``, ``argmax_i w_i / E_i`` is ``i`` with probability ``w_i / Σ w``.

* ``top_k`` a Python int: the candidates are ``softmax_topk(logits / T, top_k)`` (one read of the logits, the
  fused kernel on CUDA); a per-row tensor: a full sort of each row (sync-free, but V log V).
* ``top_p``: after top-k, keep the shortest prefix of the descending probabilities whose mass reaches
  ``top_p`` (the first token always stays), then renormalise.
* ``temperature``: a float or a per-row tensor; 0 means greedy (argmax, lowest index among ties).
"""

from __future__ import annotations

import torch

from .._checks import check_float_tensor
from .api import softmax_topk

__all__ = ["sample"]


def _per_row(v, B: int, device, dtype, name: str) -> torch.Tensor:
    """A float/int or a tensor of B (or 1) values, as a ``[B, 1]`` tensor on ``device`` (no sync)."""
    if isinstance(v, torch.Tensor):
        if v.numel() not in (1, B):
            raise ValueError(f"sample: {name} must hold 1 or {B} values (one per row), "
                             f"got shape {tuple(v.shape)}")
        return v.to(device=device, dtype=dtype).reshape(-1, 1).expand(B, 1)
    return torch.full((B, 1), v, device=device, dtype=dtype)


def _race(w: torch.Tensor, generator) -> torch.Tensor:
    """Index of ``argmax w / E`` per row, ``E ~ Exp(1)``: a draw from ``w / Σ w`` (w >= 0, Σ w > 0)."""
    e = torch.empty_like(w).exponential_(generator=generator)
    return torch.argmax(w / e.clamp_min(torch.finfo(w.dtype).tiny), dim=-1, keepdim=True)


def sample(logits: torch.Tensor, *, temperature=1.0, top_k=None, top_p=None,
           generator: torch.Generator | None = None):
    """Draw one token id per row of ``logits`` (``[..., V]``). Returns ``(ids, logprobs)``: int64 ids of shape
    ``logits.shape[:-1]`` and float32 log-probabilities of those ids under the distribution sampled from
    (after temperature, top-k, top-p and renormalisation; 0 for greedy rows).
    """
    check_float_tensor(logits, "logits")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError("sample: logits must have a non-empty last dimension")
    lead, V = logits.shape[:-1], logits.shape[-1]
    x = logits.reshape(-1, V).float()
    B, dev = x.shape[0], x.device
    if not isinstance(temperature, torch.Tensor) and temperature < 0:
        raise ValueError(f"sample: temperature must be >= 0, got {temperature}")
    if top_p is not None and not isinstance(top_p, torch.Tensor) and not 0 < top_p <= 1:
        raise ValueError(f"sample: top_p must be in (0, 1], got {top_p}")
    if top_k is not None and not isinstance(top_k, torch.Tensor):
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"sample: top_k must be a positive int or a tensor, got {top_k!r}")
        top_k = min(top_k, V)
    t = _per_row(temperature, B, dev, torch.float32, "temperature")
    greedy = t == 0
    z = x / torch.where(greedy, torch.ones_like(t), t)

    if top_k is None and top_p is None:
        # the whole row: no sort, no top-k
        lse = torch.logsumexp(z, dim=-1, keepdim=True)
        pick = _race(torch.exp(z - lse), generator)
        logp = z.gather(-1, pick) - lse
        ids = pick
    else:
        if isinstance(top_k, int):
            probs, cand, _ = softmax_topk(z, top_k)            # sorted descending, ties to the lower index
            keep = torch.ones_like(probs, dtype=torch.bool)
        else:
            zs, cand = torch.sort(z, dim=-1, descending=True, stable=True)
            probs = torch.softmax(zs, dim=-1)
            keep = torch.ones_like(probs, dtype=torch.bool)
            if top_k is not None:
                kk = _per_row(top_k, B, dev, torch.int64, "top_k")
                kk = torch.where(kk < 1, torch.full_like(kk, V), kk)     # 0 (or less) disables top-k on a row
                keep = torch.arange(V, device=dev).unsqueeze(0) < kk
        if top_p is not None:
            pp = _per_row(top_p, B, dev, torch.float32, "top_p")
            w = torch.where(keep, probs, torch.zeros_like(probs))
            before = torch.cumsum(w, dim=-1) - w                         # mass strictly before each position
            keep = keep & (before < pp * w.sum(-1, keepdim=True))
            keep[:, :1] = True
        w = torch.where(keep, probs, torch.zeros_like(probs))
        total = w.sum(-1, keepdim=True)
        pos = _race(w, generator)
        ids = cand.gather(-1, pos)
        logp = torch.log(w.gather(-1, pos) / total)
    # greedy rows: argmax of the logits (lowest index among ties), probability 1
    if isinstance(temperature, torch.Tensor) or temperature == 0:
        first = torch.argmax(x, dim=-1, keepdim=True)
        ids = torch.where(greedy, first, ids)
        logp = torch.where(greedy, torch.zeros_like(logp), logp)
    return ids.reshape(lead), logp.float().reshape(lead)
