"""Cross-entropy references in fp64: the losses tests' oracle, written from the definitions, not from
``F.cross_entropy`` (torch ops on fp64 tensors, so autograd gives the reference gradients too).

Class dim last: ``logits [..., V]``, ``target [...]``. Per non-ignored token with class weights w (1 without),
smoothing ε, z-loss λ, softcap c (z = c·tanh(x/c), else z = x), lse = log Σ_j e^(z_j):

    ce = (1−ε)·w_t·(lse − z_t) + (ε/V)·Σ_j w_j·(lse − z_j),     zl = λ·lse²

"none": ce + zl per token (0 where ignored); "sum": Σ ce + Σ zl; "mean": Σ ce / Σ w_t + Σ zl / (tokens kept)
(the first term is torch's weighted mean; NaN when every token is ignored).
"""

from __future__ import annotations

import torch

__all__ = ["cross_entropy", "linear_cross_entropy"]


def cross_entropy(logits, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                  z_loss=0.0, softcap=None) -> torch.Tensor:
    x = torch.as_tensor(logits)
    x = x.to(torch.float64)
    V = x.shape[-1]
    x2 = x.reshape(-1, V)
    t = torch.as_tensor(target).reshape(-1).to(x2.device)
    z = softcap * torch.tanh(x2 / softcap) if softcap is not None else x2
    m = z.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    lse = (m + torch.log(torch.exp(z - m).sum(-1, keepdim=True)))[:, 0]
    valid = t != ignore_index
    tc = torch.where(valid, t, torch.zeros_like(t))
    w = (torch.as_tensor(weight).to(x2.device, torch.float64) if weight is not None
         else torch.ones(V, dtype=torch.float64, device=x2.device))
    zt = z.gather(1, tc[:, None])[:, 0]
    wt = w[tc]
    ce = wt * (lse - zt)
    if label_smoothing:
        eps = float(label_smoothing)
        ce = (1 - eps) * ce + (eps / V) * (w * (lse[:, None] - z)).sum(-1)
    zero = torch.zeros((), dtype=torch.float64, device=x2.device)
    ce = torch.where(valid, ce, zero)
    zl = torch.where(valid, z_loss * lse * lse, zero) if z_loss else None
    if reduction == "none":
        out = ce + zl if zl is not None else ce
        return out.reshape(torch.as_tensor(target).shape)
    if reduction == "sum":
        return ce.sum() + (zl.sum() if zl is not None else 0.0)
    if reduction == "mean":
        out = ce.sum() / torch.where(valid, wt, zero).sum()
        return out + zl.sum() / valid.sum() if zl is not None else out
    raise ValueError(f"reduction must be 'none', 'mean' or 'sum', got {reduction!r}")


def linear_cross_entropy(hidden, weight, target, bias=None, **kw) -> torch.Tensor:
    """``cross_entropy(hidden @ weightᵀ + bias, target, **kw)`` in fp64."""
    logits = hidden.to(torch.float64) @ weight.to(torch.float64).T
    if bias is not None:
        logits = logits + bias.to(torch.float64)
    return cross_entropy(logits, target, **kw)
