"""``sample`` on the kernels: candidates by ``softmax_topk`` (temperature folded in), the filters and the draw in
one program per row, the exact row kernel for rows the candidates cannot decide. Launches bound once per problem."""

from __future__ import annotations

import torch

from .._triton.launch import BoundKernel, cached, pow2, stream_scratch
from ..target import target_of
from .launch import softmax_topk_2d
from .plan import MIN_KP, ROW_BLOCK, ROW_WARPS, SamplePlan, sample_plan
from .sampling_kernels import _sample_kernel, _sample_row_kernel


@cached
def cached_sample_plan(B: int, V: int, dtype: torch.dtype, device: torch.device, greedy: bool, top_k) -> SamplePlan:
    """:func:`sample_plan` for x's device (fp32 / fp16 / bf16: fp64 logits are read as fp32), cached per problem."""
    return sample_plan(B, V, dtype.itemsize, target_of(device), greedy=greedy, top_k=top_k)


def _param(v, off, dummy: torch.Tensor) -> tuple:
    """(pointer, scalar, stride) of a parameter for the kernels (``kernels._param``): a ``[B, 1]`` tensor (stride 0
    when broadcast), or the Python value (``off`` for None) with stride -1 and a dummy pointer."""
    if isinstance(v, torch.Tensor):
        return v, 0.0, v.stride(0)
    return dummy, off if v is None else v, -1


@cached
def _launches(B: int, V: int, K: int, C: int, CP: int):
    """The sampling kernels after ``softmax_topk``: step 1 (B programs) and, where some row may need it (C > 0),
    step 2 (B·C programs)."""
    one = BoundKernel(_sample_kernel, (B,), dict(KP=max(MIN_KP, pow2(K)), num_warps=1 if K <= 256 else 4))
    two = None
    if C:
        two = BoundKernel(_sample_row_kernel, (B * C,), dict(BLOCK=ROW_BLOCK, CP=CP, num_warps=ROW_WARPS))
    return one, two


def sample_2d(x: torch.Tensor, t, kk, pp, qq, u: torch.Tensor):
    """``(ids [B], logp [B])`` for ``x`` ``[B, V]`` (B >= 1) and the rows' uniforms ``u`` (float32 ``[B]`` on x's
    device; None for an all-greedy call) on the kernels, or None where ``softmax_topk`` would
    take its sort path (``top_k`` above the fused kernels' range): the caller runs torch's path then."""
    B, V = x.shape
    dev = x.device
    if x.dtype == torch.float64:
        x = x.float()
    greedy = not isinstance(t, torch.Tensor) and t == 0
    if greedy:                                      # every row greedy: the first candidate
        kk = pp = qq = None
    plan = cached_sample_plan(B, V, x.dtype, dev, greedy, kk if isinstance(kk, int) else None)
    if plan.path != "kernels":
        return None
    K, cfg, C, CH, CP = plan.k, plan.topk, plan.row_chunks, plan.chunk, plan.table
    vals, inds, lse, flag = stream_scratch("sample", dev, ((B * K, torch.float32), (B * K, torch.int64),
                                                           (B, torch.float32), (B, torch.int32)), zeroed=0)
    vals, inds, lse, flag = vals[:B * K].view(B, K), inds[:B * K].view(B, K), lse[:B], flag[:B]
    # parameters: a [B, 1] tensor (float32; top_k int64) or a scalar with a dummy pointer of that same dtype, so
    # every call of one (B, V, K) runs one compiled kernel
    tt = _param(t, 1.0, vals)
    t_mode = 0 if tt[2] < 0 and tt[1] == 1.0 else 1
    softmax_topk_2d(x, K, cfg, (vals, inds, lse), t_mode, (tt[0], float(tt[1]), tt[2]))
    ids = torch.empty(B, device=dev, dtype=torch.int64)
    logp = torch.empty(B, device=dev, dtype=torch.float32)
    one, two = _launches(B, V, K, C, CP)
    kt, pt, qt = _param(kk, 0, inds), _param(pp, 1.0, vals), _param(qq, 0.0, vals)
    params = (*tt, kt[0], int(kt[1]), kt[2], *pt, *qt)
    if u is None:                                   # all greedy: nothing is drawn
        u = vals
    check = (x, u, tt[0], kt[0], pt[0], qt[0])
    one((vals, inds, lse, u, ids, logp, flag, *params, K, V), check, dev)
    if two is not None:
        BC = B * C
        # barrier words (zeroed, left as found), the levels' histograms (two buffers), tie counts and cuts, then
        # per chunk: the kept mass, the row's mass, (count, mass) above and at a boundary
        ws = stream_scratch("sample-row", dev, ((B, torch.int32), (B, torch.int32), (32 * BC, torch.int32),
                                                (32 * BC, torch.float32), (BC + B, torch.int32),
                                                (6 * BC, torch.float32)), zeroed=2)
        two((x, x.stride(0), x.stride(1), V, inds, lse, u, ids, logp, flag, *params, K, *ws, C, CH), check, dev)
    return ids, logp
