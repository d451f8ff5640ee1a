"""fp64 references for decoding attention over a KV cache and the (o, lse) merge: the tests' oracle.

Written from the definitions, key by key: the logical keys of sequence b are gathered one index at a time
(``j -> block_table[b, j // page], j % page``), only for ``j < cache_seqlens[b]``, then explicit scores, the masks,
and a softmax in fp64. Runs on any device (torch fp64), so the GPU tests check real sizes against it.
"""

from __future__ import annotations

import torch


def logical_kv(k_cache, v_cache, cache_seqlens, block_table, b: int):
    """K and V ``[Hkv, L, D]`` of sequence b in fp64: its first ``cache_seqlens[b]`` keys, nothing past them."""
    L = int(cache_seqlens[b])
    j = torch.arange(L, device=k_cache.device)
    if block_table is None:
        return k_cache[b][:, j].double(), v_cache[b][:, j].double()
    page = k_cache.shape[2]
    pages = block_table[b].long()[j // page]
    slots = j % page
    return k_cache[pages, :, slots].transpose(0, 1).double(), v_cache[pages, :, slots].transpose(0, 1).double()


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table=None, causal=True, scale=None,
                           window=None, softcap=None):
    """(o, lse) in fp64: o ``[B, H, Sq, D]``, lse ``[B, H, Sq]``; rows without a key give 0 and -inf."""
    B, H, Sq, D = q.shape
    Hkv = k_cache.shape[1]
    scale = D ** -0.5 if scale is None else scale
    left, right = window if window is not None else (-1, -1)
    o = torch.zeros((B, H, Sq, D), dtype=torch.float64, device=q.device)
    lse = torch.full((B, H, Sq), float("-inf"), dtype=torch.float64, device=q.device)
    for b in range(B):
        K, V = logical_kv(k_cache, v_cache, cache_seqlens, block_table, b)
        L = K.shape[1]
        if L == 0:
            continue
        kv_head = torch.arange(H, device=q.device) // (H // Hkv)
        s = torch.einsum("hqd,hkd->hqk", q[b].double(), K[kv_head]) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        j = torch.arange(L, device=q.device)[None, :]
        p = (L - Sq + torch.arange(Sq, device=q.device))[:, None]
        keep = torch.ones((Sq, L), dtype=torch.bool, device=q.device)
        if causal:
            keep &= j <= p
        if left >= 0:
            keep &= j >= p - left
        if right >= 0:
            keep &= j <= p + right
        s = torch.where(keep, s, float("-inf"))
        m = s.amax(-1, keepdim=True)
        m = torch.where(torch.isinf(m), 0.0, m)
        e = torch.exp(s - m)
        d = e.sum(-1, keepdim=True)
        o[b] = torch.where(d > 0, (e @ V[kv_head]) / torch.where(d > 0, d, 1.0), 0.0)
        lse[b] = (m + torch.log(d)).squeeze(-1)
    return o, lse


def merge_attention_states(o_a, lse_a, o_b, lse_b):
    """(o_a, lse_a) ⊕ (o_b, lse_b) in fp64, an empty side (lse -inf) weighing exactly 0."""
    la, lb = lse_a.double(), lse_b.double()
    lse = torch.logaddexp(la, lb)
    # weights from the inputs' difference, not from the rounded lse: w_x = e^(lse_x − m) / W, m = max
    m = torch.maximum(la, lb)
    ref = torch.where(torch.isinf(m), 0.0, m)
    ea = torch.where(la == float("-inf"), 0.0, torch.exp(la - ref))
    eb = torch.where(lb == float("-inf"), 0.0, torch.exp(lb - ref))
    W = torch.where(ea + eb > 0, ea + eb, 1.0)
    wa, wb = (ea / W)[..., None], (eb / W)[..., None]
    o = torch.where(wa > 0, wa * o_a.double(), 0.0) + torch.where(wb > 0, wb * o_b.double(), 0.0)
    return o, lse
