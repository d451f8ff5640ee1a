"""Attention references in fp64 torch: the tests' oracle for ``oss.attention`` and ``oss.attention_varlen``.

Two transcriptions of the same function, which the tests hold against each other:

* :func:`attention_scores`: explicit scores ``S = scale · Q Kᵀ`` (softcapped), the mask, a softmax that gives
  0 for a row with no attended key, ``O = P V``. Differentiable: the gradients' oracle is its autograd.
* :func:`attention_tiled`: the seeds' algorithm on the state ``(m, d, o)`` (tutorial §8.2): key/value tiles
  stream through, each tile's scores update ``m_new = max(m, max_j s_j)``, ``d ← d·e^(m − m_new) + Σ_j e^(s_j −
  m_new)``, ``o ← o·e^(m − m_new) + Σ_j e^(s_j − m_new) v_j``; at the end ``O = o / d``, ``lse = m + log d``. The
  S × S scores never exist at once.

Both take the SDPA layout (q ``[B, H, Sq, D]``, k / v ``[B, Hkv, Sk, D]``) and the semantics of
``oss.attention``: query head h reads kv head ``h // (H // Hkv)``; query i attends key j iff
``lo(i) <= j <= hi(i)`` with ``off = Sk − Sq``, ``lo = i + off − left`` (no bound for left = −1), ``hi = i + off +
right`` (no bound for right = −1), and ``hi <= i + off`` when causal (bottom-right aligned).
"""

from __future__ import annotations

import math

import torch

__all__ = ["attention_mask", "attention_scores", "attention_tiled", "attention_varlen"]


def attention_mask(Sq: int, Sk: int, causal: bool = False, window=None, device=None) -> torch.Tensor:
    """Boolean ``[Sq, Sk]``: True where query i attends key j."""
    i = torch.arange(Sq, device=device).unsqueeze(1)
    j = torch.arange(Sk, device=device).unsqueeze(0)
    off = Sk - Sq
    keep = torch.ones(Sq, Sk, dtype=torch.bool, device=device)
    left, right = window if window is not None else (-1, -1)
    if left >= 0:
        keep &= j >= i + off - left
    if right >= 0:
        keep &= j <= i + off + right
    if causal:
        keep &= j <= i + off
    return keep


def _expand_kv(k: torch.Tensor, H: int) -> torch.Tensor:
    """k ``[B, Hkv, S, D]`` -> ``[B, H, S, D]`` with query head h reading kv head h // (H // Hkv)."""
    return k.repeat_interleave(H // k.shape[1], dim=1)


def _scores(q, k, scale, softcap):
    s = scale * (q @ k.transpose(-1, -2))
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    return s


def attention_scores(q, k, v, *, causal=False, scale=None, window=None, softcap=None):
    """``(o, lse)`` in fp64 from the explicit scores; differentiable. o ``[B, H, Sq, D]``, lse ``[B, H, Sq]``."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    k, v = _expand_kv(k, H), _expand_kv(v, H)
    s = _scores(q, k, scale, softcap)
    keep = attention_mask(Sq, Sk, causal, window, device=q.device)
    s = s.masked_fill(~keep, -math.inf)
    m = s.amax(dim=-1, keepdim=True) if Sk else s.new_full((B, H, Sq, 1), -math.inf)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()   # a row with no key: m = 0, p = 0
    p = torch.exp(s - m)
    d = p.sum(dim=-1, keepdim=True)
    o = (p @ v) / torch.where(d > 0, d, torch.ones_like(d))
    lse = (m + torch.log(d)).squeeze(-1)
    return o, lse


def attention_tiled(q, k, v, *, causal=False, scale=None, window=None, softcap=None, block: int = 16):
    """``(o, lse)`` in fp64 by the tiled ``(m, d, o)`` recurrence over key tiles of ``block`` keys."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    k, v = _expand_kv(k, H), _expand_kv(v, H)
    keep = attention_mask(Sq, Sk, causal, window, device=q.device)
    m = q.new_full((B, H, Sq, 1), -math.inf)
    d = q.new_zeros((B, H, Sq, 1))
    o = q.new_zeros((B, H, Sq, v.shape[-1]))
    for j0 in range(0, Sk, block):
        s = _scores(q, k[:, :, j0:j0 + block], scale, softcap)
        s = s.masked_fill(~keep[:, j0:j0 + block], -math.inf)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))        # 1. m_new = max(m, max_j s_j)
        ref = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        alpha = torch.exp(m - ref)                                     # 2. e^(m - m_new), 0 while m = -inf
        p = torch.exp(s - ref)
        d = d * alpha + p.sum(dim=-1, keepdim=True)                    # 3. d <- d·alpha + Σ e^(s_j - m_new)
        o = o * alpha + p @ v[:, :, j0:j0 + block]                     # 4. o <- o·alpha + Σ e^(s_j - m_new) v_j
        m = m_new
    out = o / torch.where(d > 0, d, torch.ones_like(d))
    lse = torch.where(d > 0, m + torch.log(torch.where(d > 0, d, torch.ones_like(d))),
                      torch.full_like(d, -math.inf))
    return out, lse.squeeze(-1)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None, window=None,
                     softcap=None):
    """Packed sequences: q ``[total_q, H, D]``, k / v ``[total_k, Hkv, D]``; sequence b is rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of q and the same of k / v by ``cu_seqlens_k``. Returns fp64 ``(o
    [total_q, H, D], lse [H, total_q])`` (FlashAttention's varlen lse layout), differentiable."""
    cq, ck = [int(x) for x in cu_seqlens_q], [int(x) for x in cu_seqlens_k]
    H, D = q.shape[1], q.shape[2]
    os, lses = [], []
    for b in range(len(cq) - 1):
        qb = q[cq[b]:cq[b + 1]].transpose(0, 1).unsqueeze(0)
        kb = k[ck[b]:ck[b + 1]].transpose(0, 1).unsqueeze(0)
        vb = v[ck[b]:ck[b + 1]].transpose(0, 1).unsqueeze(0)
        o, lse = attention_scores(qb, kb, vb, causal=causal, scale=D ** -0.5 if scale is None else scale,
                                  window=window, softcap=softcap)
        os.append(o[0].transpose(0, 1))
        lses.append(lse[0])
    if not os:
        return q.new_zeros(q.shape, dtype=torch.float64), q.new_zeros((H, 0), dtype=torch.float64)
    return torch.cat(os, 0), torch.cat(lses, 1)
