"""Vocabulary-parallel softmax, log-softmax, logsumexp, softmax + top-k and cross-entropy (Megatron-LM's tensor-
parallel LM head): rank r of ``group`` holds a contiguous slice of the last dim, slices in rank order, any sizes.
The row count, and fp64 or not, must be the same on every rank (not checked: docs/distributed.md).

Every op gathers per-row states, never the logits:
    1. each rank: its shard's (m_r, d_r) per row;
    2. one all_gather of the states (8 bytes per row per rank; cross-entropy 16: also its target logit and sum of
       logits), merged with ⊕ into the full row's (m, d), the same on every rank;
    3. each rank normalises its own slice: y = e^(x - m) / d, x - m - log d, lse = m + log d.
The backwards of softmax and log-softmax need the full row's Σ y·dy (Σ dy): one all_reduce of 4 bytes per row.
Cross-entropy's backward needs nothing beyond what its forward saved. The slices' offsets are found by one
all_gather of the widths (8 bytes per rank). Special values follow the single-GPU ops (a row holding NaN or +inf,
or only -inf, normalises to NaN).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.distributed as dist

from .._checks import as_float, as_int, check_bool, check_float_tensor, no_double_backward
from ..state import accumulation_dtype
from ..topk.api import first_k
from .state import gather_rows, local_state, merge_gathered, slices, world

__all__ = ["TopK", "cross_entropy", "log_softmax", "logsumexp", "softmax", "softmax_topk"]


class TopK(NamedTuple):
    values: torch.Tensor
    indices: torch.Tensor
    lse: torch.Tensor


def _2d(x: torch.Tensor) -> torch.Tensor:
    """[rows, width] view of x (class dim last); a shard of width 0 included (reshape(-1, 0) is ambiguous)."""
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def _rows(name: str, x: torch.Tensor) -> torch.Tensor:
    check_float_tensor(x, f"{name}: x_shard")
    if x.dim() == 0:
        raise ValueError(f"{name}: x_shard must have a last (vocabulary) dim")
    return _2d(x)


def _row_state(x2: torch.Tensor, group):
    """(m, d) of the full rows, [rows] each, the same on every rank."""
    s = local_state(x2)
    return merge_gathered(gather_rows(torch.stack([s.m, s.d]), group))


def _normalise(x2, m, d, log: bool):
    """y of this rank's slice from the full row's (m, d): NaN where the row holds NaN or +inf or only -inf."""
    acc = accumulation_dtype(x2.dtype)
    bad = ~torch.isfinite(m)
    m_, d_ = m.unsqueeze(-1), d.unsqueeze(-1)
    xf = x2.to(acc)
    y = (xf - m_) - torch.log(d_) if log else torch.exp(xf - m_) / d_
    return torch.where(bad.unsqueeze(-1), torch.full_like(y, float("nan")), y)


def _row_sum(t: torch.Tensor, group) -> torch.Tensor:
    s = t.sum(-1)
    dist.all_reduce(s, group=group)
    return s


# create_graph=True: these backwards are torch ops, but a graph through them would miss terms (second-order
# gradients silently wrong, as a collective has no autograd and the full row's (m, d) enters as a constant)
_ROW_SUM = "(the backward's all_reduce of Σ y·dy has no autograd)"
_STATE = "(the backward takes the full row's gathered (m, d) as constants)"


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, log, group):
        x2 = _2d(x)
        m, d = _row_state(x2, group)
        y = _normalise(x2, m, d, log).to(x.dtype).reshape(x.shape)
        ctx.save_for_backward(y)
        ctx.log, ctx.group = log, group
        return y

    @staticmethod
    def backward(ctx, dy):
        no_double_backward("distributed.log_softmax" if ctx.log else "distributed.softmax", _ROW_SUM)
        (y,) = ctx.saved_tensors
        acc = accumulation_dtype(y.dtype)
        yf, dyf = y.to(acc), dy.to(acc)
        if ctx.log:                                 # dx = dy - e^y · Σ_row dy
            dx = dyf - torch.exp(yf) * _row_sum(dyf, ctx.group).unsqueeze(-1)
        else:                                       # dx = y · (dy - Σ_row y·dy)
            dx = yf * (dyf - _row_sum(yf * dyf, ctx.group).unsqueeze(-1))
        return dx.to(y.dtype), None, None


def softmax(x_shard: torch.Tensor, *, group=None) -> torch.Tensor:
    """This rank's slice of ``softmax(x, -1)`` of the full rows. Communication: 8 bytes per row per rank (all_gather
    of (m, d)); the backward one all_reduce of 4 bytes per row."""
    _rows("distributed.softmax", x_shard)
    return _Softmax.apply(x_shard, False, group)


def log_softmax(x_shard: torch.Tensor, *, group=None) -> torch.Tensor:
    """This rank's slice of ``log_softmax(x, -1)``; communication as :func:`softmax`."""
    _rows("distributed.log_softmax", x_shard)
    return _Softmax.apply(x_shard, True, group)


class _Logsumexp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x2 = _2d(x)
        m, d = _row_state(x2, group)
        lse = m + torch.log(d)                    # -inf for all -inf rows, +inf with +inf, NaN with NaN
        ctx.save_for_backward(x, lse)
        return lse.reshape(x.shape[:-1])

    @staticmethod
    def backward(ctx, g):
        no_double_backward("distributed.logsumexp", _STATE)
        x, lse = ctx.saved_tensors             # d lse / dx = e^(x - lse): local
        dx = g.reshape(-1, 1).to(lse.dtype) * torch.exp(_2d(x).to(lse.dtype) - lse[:, None])
        return dx.to(x.dtype).reshape(x.shape), None


def logsumexp(x_shard: torch.Tensor, *, keepdim: bool = False, group=None) -> torch.Tensor:
    """The full row's logsumexp in x_shard's dtype (computed in fp32, fp64 for fp64), the same on every rank.
    Communication: 8 bytes per row per rank; the backward none."""
    _rows("distributed.logsumexp", x_shard)
    check_bool(keepdim, "distributed.logsumexp: keepdim")
    out = _Logsumexp.apply(x_shard, group)
    out = out if out.dtype == x_shard.dtype else out.to(x_shard.dtype)
    return out.unsqueeze(-1) if keepdim else out


# ---- softmax + top-k ---------------------------------------------------------------------------------------------
class _SoftmaxTopK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k, total, offsets, group):
        ctx.set_materialize_grads(False)
        rank, P = world(group)
        x2 = _2d(x)
        rows, w = x2.shape
        xf = x2.to(accumulation_dtype(x2.dtype))      # fp64 stays fp64, as onlinesoftmax.softmax_topk
        kl = min(k, w)
        idx = torch.arange(w, device=x2.device).expand(rows, w)
        pos = first_k(xf, idx, kl) if kl else idx[:, :0]
        cand = torch.full((rows, k), float("-inf"), device=x2.device, dtype=xf.dtype)
        cidx = torch.full((rows, k), total, dtype=torch.int64, device=x2.device)      # pads: after every real index
        cand[:, :kl] = xf.gather(-1, pos)
        cidx[:, :kl] = pos + offsets[rank]
        s = local_state(xf)
        g_vals = gather_rows(torch.cat([torch.stack([s.m, s.d]), cand.t()]), group)  # [P, 2 + k, rows]
        g_idx = gather_rows(cidx.t().contiguous(), group)                          # [P, k, rows]
        m, d = merge_gathered(g_vals[:, :2])
        vals = g_vals[:, 2:].permute(2, 0, 1).reshape(rows, P * k)
        inds = g_idx.permute(2, 0, 1).reshape(rows, P * k)
        best = first_k(vals, inds, k)
        top, top_i = vals.gather(-1, best), inds.gather(-1, best)
        p = torch.exp(top - m.unsqueeze(-1)) / d.unsqueeze(-1)                     # e^(x - m) / d: exact at large x
        p = torch.where(torch.isfinite(m).unsqueeze(-1), p, torch.full_like(p, float("nan")))
        lse = m + torch.log(d)
        ctx.mark_non_differentiable(top_i)
        ctx.save_for_backward(x, p, top_i - offsets[rank], m, d)
        lead = x.shape[:-1]
        return p.float().reshape(*lead, k), top_i.reshape(*lead, k), lse.float().reshape(lead)

    @staticmethod
    def backward(ctx, dvalues, _dindices, dlse):
        # as onlinesoftmax.softmax_topk's: dx = scatter(dv·v) − p·(Σ dv·v − dlse), on this rank's slice of p and of
        # the indices; no communication (the outputs' gradients are the same on every rank)
        no_double_backward("distributed.softmax_topk", _STATE)
        x, v, local, m, d = ctx.saved_tensors
        x2 = _2d(x)
        rows, w = x2.shape
        c = torch.zeros(rows, device=x2.device, dtype=m.dtype)
        if dvalues is not None:
            c = c + (dvalues.reshape(rows, -1).to(m.dtype) * v).sum(-1)
        if dlse is not None:
            c = c - dlse.reshape(-1).to(m.dtype)
        dx = torch.exp(x2.to(m.dtype) - m.unsqueeze(-1)) / d.unsqueeze(-1) * -c.unsqueeze(-1)
        if dvalues is not None and w:
            mine = (local >= 0) & (local < w)
            dx.scatter_add_(-1, local.clamp(0, w - 1), torch.where(mine, v * dvalues.reshape(rows, -1).to(m.dtype), 0))
        return dx.to(x.dtype).reshape(x.shape), None, None, None, None


def softmax_topk(x_shard: torch.Tensor, k: int, *, group=None) -> TopK:
    """The k largest probabilities of the full rows' softmax, their indices into the full vocabulary (ties to the
    lowest global index) and the rows' logsumexp, the same on every rank; ``k`` may exceed a shard's width.
    Communication: (m, d) (8 bytes per row per rank) and each rank's best k (value and index: 12·k bytes per row
    per rank), one all_gather each. Values float32 (fp64 inputs selected and normalised in fp64), indices int64, as
    ``onlinesoftmax.softmax_topk``; autograd to ``x_shard`` through values and lse with no communication in the
    backward."""
    x2 = _rows("distributed.softmax_topk", x_shard)
    k = as_int(k, "distributed.softmax_topk: k")        # an int as torch takes one
    offsets, total = slices(x2.shape[-1], x2.device, group)
    total = int(total)                          # k's range check needs it on the host
    if not 1 <= k <= total:
        raise ValueError(f"distributed.softmax_topk: k={k} is out of range for a vocabulary of {total} (need 1 <= k "
                         f"<= {total})")
    return TopK(*_SoftmaxTopK.apply(x_shard, k, total, offsets, group))


# ---- cross-entropy -----------------------------------------------------------------------------------------------
class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, target, ignore_index, reduction, eps, group):
        rank, P = world(group)
        x2 = _2d(x)
        t = target.reshape(-1)
        rows, w = x2.shape
        offsets, V = slices(w, x2.device, group)
        xf = x2.to(accumulation_dtype(x2.dtype))
        local = t - offsets[rank]
        mine = (local >= 0) & (local < w) & (t != ignore_index)
        zeros = torch.zeros(rows, device=x2.device, dtype=xf.dtype)
        z_t = torch.where(mine, xf.gather(-1, local.clamp(0, max(w - 1, 0)).unsqueeze(-1)).squeeze(-1)
                          if w else zeros, zeros)
        s = local_state(xf)
        g = gather_rows(torch.stack([s.m, s.d, z_t, xf.sum(-1)]), group)       # [P, 4, rows]: 16 bytes per row
        m, d = merge_gathered(g[:, :2])
        z_t, z_sum = g[:, 2].sum(0), g[:, 3].sum(0)
        keep = t != ignore_index
        outside = keep & ((t < 0) | (t >= V))
        if x2.device.type == "cpu" and bool(outside.any()):
            bad = int(t[outside][0])
            raise IndexError(f"distributed.cross_entropy: target {bad} is out of bounds for a vocabulary of {int(V)} "
                             f"(and is not ignore_index={ignore_index})")
        z_t = torch.where(outside, float("nan"), z_t)     # (on a GPU, no host check: that row's loss is NaN)
        # +inf in the row: NaN, as F.cross_entropy's log_softmax (inf − inf); the loss and the whole gradient row
        lse = torch.where(m == float("inf"), float("nan"), m + torch.log(d))
        loss = lse - (1 - eps) * z_t                                              # per token
        if eps:         # (left out at ε = 0: a −inf logit off the target would make it 0 · −inf)
            loss = loss - eps * z_sum / V
        loss = torch.where(keep, loss, torch.zeros_like(loss))
        n = keep.sum()
        if reduction == "mean":
            out, scale = loss.sum() / n, 1.0 / n.clamp_min(1).to(xf.dtype)   # all ignored: NaN, grads 0
        elif reduction == "sum":
            out, scale = loss.sum(), torch.ones((), device=x2.device, dtype=xf.dtype)
        else:
            out, scale = loss.reshape(target.shape), None
        ctx.save_for_backward(x, t, offsets, torch.where(torch.isnan(lse), lse, m), d,
                              scale if scale is not None else torch.ones(()), V)
        ctx.ignore_index, ctx.reduction, ctx.eps, ctx.rank = ignore_index, reduction, eps, rank
        return out

    @staticmethod
    def backward(ctx, g):
        no_double_backward("distributed.cross_entropy", _STATE)
        x, t, offsets, m, d, scale, V = ctx.saved_tensors
        x2 = _2d(x)
        rows, w = x2.shape
        keep = (t != ctx.ignore_index).to(m.dtype)
        coef = (g.reshape(-1) if ctx.reduction == "none" else g * scale) * keep    # per row
        p = torch.exp(x2.to(m.dtype) - m.unsqueeze(-1)) / d.unsqueeze(-1)
        dx = p - ctx.eps / V.to(m.dtype)
        local = t - offsets[ctx.rank]
        mine = (local >= 0) & (local < w) & (t != ctx.ignore_index)
        if w:
            hot = torch.zeros_like(dx).scatter_(-1, local.clamp(0, w - 1).unsqueeze(-1),
                                                mine.to(dx.dtype).unsqueeze(-1))
            dx = dx - (1 - ctx.eps) * hot
        dx = torch.where(keep.unsqueeze(-1) > 0, dx * coef.unsqueeze(-1), 0.0)     # ignored rows: 0, NaN rows too
        return dx.to(x.dtype).reshape(x.shape), None, None, None, None, None


def cross_entropy(logits_shard: torch.Tensor, target: torch.Tensor, *, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0, group=None) -> torch.Tensor:
    """The loss of the full logits (``F.cross_entropy(full_logits.float(), target, ...)`` with the class dim last),
    float32 (fp64 for fp64 logits), the same on every rank; autograd to ``logits_shard`` with no communication in
    the backward. ``target`` (int64, ``logits_shard.shape[:-1]``) is the same on every rank. Communication: one
    all_gather of 16 bytes per row per rank ((m, d), the target's logit where this rank holds it, the sum of the
    logits for smoothing), and one of the widths. All targets ignored: mean is NaN, sum 0, gradients 0 (as torch)."""
    x2 = _rows("distributed.cross_entropy", logits_shard)
    if not isinstance(target, torch.Tensor) or target.dtype != torch.int64:
        raise TypeError("distributed.cross_entropy: target must be an int64 tensor")
    if target.shape != logits_shard.shape[:-1]:
        raise ValueError(f"distributed.cross_entropy: target must have shape {tuple(logits_shard.shape[:-1])}, got "
                         f"{tuple(target.shape)}")
    ignore_index = as_int(ignore_index, "distributed.cross_entropy: ignore_index")      # (as torch takes one)
    if not -2**63 <= ignore_index < 2**63:
        raise ValueError(f"distributed.cross_entropy: ignore_index must fit int64 (the targets' dtype), got "
                         f"{ignore_index}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"distributed.cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    label_smoothing = as_float(label_smoothing, "distributed.cross_entropy: label_smoothing")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"distributed.cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    del x2
    return _CrossEntropy.apply(logits_shard, target, ignore_index, reduction, label_smoothing, group)
