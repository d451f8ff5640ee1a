"""Context-parallel (ring) attention: each rank holds its part of the sequence of q, k and v, and the key/value
blocks travel around the ring while each rank attends its queries to the block in hand; the partial (o, lse) of the
blocks merge with ⊕ (``onlinesoftmax.merge_attention_states``: o = o_a·e^(lse_a − lse) + o_b·e^(lse_b − lse),
lse = logaddexp(lse_a, lse_b)).

Layouts of a sequence of S positions over P ranks:
    "contiguous": rank r holds positions [r·S/P, (r+1)·S/P);
    "zigzag":     the sequence cut into 2P equal chunks, rank r holds chunks r and 2P−1−r, concatenated: with
                  causal attention every rank then does the same work.
Forward, per rank: P steps; at step s it holds the k/v of rank r − s, already sending it on to rank r + 1 and
receiving the next from rank r − 1 (``batch_isend_irecv``) while it computes. Chunk pairs: a key chunk before the
query chunk is attended whole, the same chunk causally, a later one not at all (causal); everything whole otherwise.
Backward: a second ring carries k/v and their gradient accumulators (dK, dV) with them; each rank adds its block's
contribution (from the saved global o and lse: P = e^(s − lse)) and passes them on; after P steps each
accumulator is back with its owner. Traffic per step: the k/v block (2·B·Hkv·S_r·D elements); backward twice that.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .._checks import check_bool, no_double_backward
from ..attention.api import _prepare
from ..attention.api import attention as _attention
from ..decode.api import merge_attention_states
from .state import world

__all__ = ["attention"]


def _chunks(layout: str, rank: int, P: int, S_r: int):
    """(slice of the local sequence, global chunk id) of this rank's chunks; chunks are ordered along the sequence."""
    if layout == "contiguous":
        return [(slice(0, S_r), rank)]
    c = S_r // 2
    return [(slice(0, c), rank), (slice(c, S_r), 2 * P - 1 - rank)]


def _relation(qc: int, kc: int, causal: bool) -> str | None:
    if not causal or kc < qc:
        return "full"
    return "causal" if kc == qc else None


def _block_pairs(layout: str, rank: int, src: int, P: int, S_r: int, causal: bool):
    """(query slice, key slice, causal) of every chunk pair of this rank's queries and rank ``src``'s keys that
    attends anything."""
    for qs, qc in _chunks(layout, rank, P, S_r):
        for ks, kc in _chunks(layout, src, P, S_r):
            rel = _relation(qc, kc, causal)
            if rel is not None:
                yield qs, ks, rel == "causal"


class _Transfer:
    """A tensor sent to rank + 1 and the next one received from rank − 1, in flight while the caller computes.
    gloo moves CPU tensors: CUDA tensors on a gloo group travel through host copies."""

    def __init__(self, t: torch.Tensor, group):
        rank, P = world(group)
        self.device = t.device
        host = dist.get_backend(group) == "gloo" and t.is_cuda
        send = t.cpu() if host else t.contiguous()
        self.buf = torch.empty_like(send)
        grank = dist.get_global_rank if group is not None else (lambda g, r: r)
        nxt, prv = grank(group, (rank + 1) % P), grank(group, (rank - 1) % P)
        self.works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt, group),
                                             dist.P2POp(dist.irecv, self.buf, prv, group)])

    def wait(self) -> torch.Tensor:
        for w in self.works:
            w.wait()
        return self.buf.to(self.device)


def _block_fwd(q, k, v, causal, scale, backend):
    o, lse = _attention(q, k, v, causal=causal, scale=scale, return_lse=True, backend=backend)
    return o.float(), lse.float()


def _block_bwd(q, k, v, o, lse, do, causal, scale, backend):
    """(dq, dk, dv) of one block from the rows' global o and lse (P = e^(s − lse)), fp32; dk, dv summed over each
    GQA group."""
    if backend == "triton":
        left, right = -1, (0 if causal else -1)
        dq, dk, dv = torch.ops.onlinesoftmax.attention_bwd(do.to(q.dtype), None, q, k, v, o.to(q.dtype), lse,
                                                           causal, scale, left, right, 0.0)
        return dq.float(), dk.float(), dv.float()
    G = q.shape[1] // k.shape[1]
    qf, kf, vf, dof, of = q.float(), k.float(), v.float(), do.float(), o.float()
    ke, ve = kf.repeat_interleave(G, 1), vf.repeat_interleave(G, 1)
    s = scale * qf @ ke.transpose(-1, -2)
    p = torch.exp(s - lse.unsqueeze(-1))
    if causal:
        Sq, Sk = q.shape[2], k.shape[2]
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Sk, device=q.device)[None, :]
        p = torch.where(j <= i + (Sk - Sq), p, torch.zeros_like(p))
    p = torch.where(torch.isinf(lse).unsqueeze(-1), torch.zeros_like(p), p)
    dve = p.transpose(-1, -2) @ dof
    dp = dof @ ve.transpose(-1, -2)
    ds = p * (dp - (dof * of).sum(-1, keepdim=True))
    dq = scale * ds @ ke
    dke = scale * ds.transpose(-1, -2) @ qf
    B, Hkv, Sk, D = k.shape
    return dq, dke.reshape(B, Hkv, G, Sk, D).sum(2), dve.reshape(B, Hkv, G, Sk, D).sum(2)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, layout, group, backend):
        rank, P = world(group)
        B, H, S_r, D = q.shape
        o = torch.zeros(B, H, S_r, v.shape[-1], device=q.device, dtype=torch.float32)
        lse = torch.full((B, H, S_r), float("-inf"), device=q.device, dtype=torch.float32)
        kv = torch.stack([k, v])
        for step in range(P):
            src = (rank - step) % P
            nxt = _Transfer(kv, group) if step < P - 1 else None
            for qs, ks, diag in _block_pairs(layout, rank, src, P, S_r, causal):
                ob, lb = _block_fwd(q[:, :, qs], kv[0][:, :, ks], kv[1][:, :, ks], diag, scale, backend)
                o[:, :, qs], lse[:, :, qs] = merge_attention_states(o[:, :, qs], lse[:, :, qs], ob, lb)
            if nxt is not None:
                kv = nxt.wait()
        out = o.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (causal, scale, layout, group, backend)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        no_double_backward("distributed.attention", "(the ring's backward passes dK / dV between ranks, with no "
                           "autograd)")
        q, k, v, o, lse = ctx.saved_tensors
        causal, scale, layout, group, backend = ctx.args
        rank, P = world(group)
        S_r = q.shape[2]
        dq = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
        kv = torch.stack([k, v])
        dkv = torch.zeros(kv.shape, device=q.device, dtype=torch.float32)
        for step in range(P):
            src = (rank - step) % P
            nxt = _Transfer(kv, group) if step < P - 1 else None
            for qs, ks, diag in _block_pairs(layout, rank, src, P, S_r, causal):
                gq, gk, gv = _block_bwd(q[:, :, qs], kv[0][:, :, ks], kv[1][:, :, ks], o[:, :, qs], lse[:, :, qs],
                                        do[:, :, qs], diag, scale, backend)
                dq[:, :, qs] += gq
                dkv[0][:, :, ks] += gk
                dkv[1][:, :, ks] += gv
            if P > 1:
                dkv = _Transfer(dkv, group).wait()    # on to the next rank: after P passes, home
            if nxt is not None:
                kv = nxt.wait()
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None, None


def attention(q, k, v, *, causal: bool = False, scale: float | None = None, layout: str = "contiguous", group=None,
              return_lse: bool = False, backend: str | None = None):
    """Attention over a sequence split across the ranks of ``group`` (ring attention), in SDPA's layout: this rank's
    q ``[B, H, S_r, D]`` and k, v ``[B, Hkv, S_r, D]`` (GQA as ``onlinesoftmax.attention``), ``layout``
    "contiguous" or "zigzag" (module docstring); S_r the same on every rank (even for zigzag). Returns this rank's
    o (and lse, float32 ``[B, H, S_r]``, not differentiable). ``causal`` is over the full sequence's positions.
    Autograd to q, k, v. Traffic per call: P − 1 sends of this rank's k/v forward, P sends of k/v and dK/dV
    backward."""
    if layout not in ("contiguous", "zigzag"):
        raise ValueError(f"distributed.attention: layout must be 'contiguous' or 'zigzag', got {layout!r}")
    # every check of the blocks' attention, here: raised from a block, the ring's first transfer is already in flight
    _, which, scale, _ = _prepare(q, k, v, causal, scale, None, None, backend, "distributed.attention")
    check_bool(return_lse, "distributed.attention: return_lse")
    if k.shape[2] != q.shape[2]:
        raise ValueError("distributed.attention: q, k and v must hold the same S_r positions on this rank")
    if layout == "zigzag" and q.shape[2] % 2:
        raise ValueError(f"distributed.attention: layout 'zigzag' needs an even S_r, got {q.shape[2]}")
    o, lse = _RingAttention.apply(q, k, v, causal, scale, layout, group, which)
    return (o, lse) if return_lse else o
