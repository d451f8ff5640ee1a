"""``sample`` on the kernels: candidates by ``softmax_topk`` (temperature folded in), the filters and the draw in
one program per row, the exact row kernel for rows the candidates cannot decide. Launches bound once per problem."""

from __future__ import annotations

import torch

from .._triton.launch import BoundKernel, cached, pow2, stream_scratch
from ..target import Target, target_of
from .launch import cached_plan, softmax_topk_2d
from .plan import MIN_KP
from .sampling_kernels import _sample_kernel, _sample_row_kernel

FREE_K = 64                 # candidates when top_k is not a Python int (the bucket of k = 50: one compile)
ROW_BLOCK = 1024                # elements per step of the row kernel's passes over x
ROW_WARPS = 8                   # (1024 x 4 warps spills: 255 registers, 160 bytes of stack)
ROW_MIN_CHUNK = 2048            # the row kernel's chunks hold at least this many elements


def row_chunks(B: int, V: int, target: Target) -> tuple[int, int, int]:
    """(C, CH, CP): the row kernel's programs per row, elements per chunk (a multiple of ROW_BLOCK), and the
    power of two its per-chunk tables are read with (the same for every B and V of a target: one compile). All
    B·C programs wait for each other row by row, so B·C stays within what is surely resident
    (``programs_resident``); the interpreter runs programs one after another: C = 1 there."""
    if target.interpret:
        C, cp = 1, 1
    else:
        C = max(1, min(target.programs_resident() // max(B, 1), -(-V // ROW_MIN_CHUNK)))
        cp = pow2(target.programs_resident())
    per = -(-V // C)
    ch = -(-per // ROW_BLOCK) * ROW_BLOCK
    return -(-V // ch), ch, cp


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
    device) on the kernels, or None where ``softmax_topk`` would
    take its sort path (``top_k`` above the fused kernels' range): the caller runs torch's path then."""
    B, V = x.shape
    dev = x.device
    if x.dtype == torch.float64:
        x = x.float()
    greedy = not isinstance(t, torch.Tensor) and t == 0
    if greedy:                                      # every row greedy: the first candidate
        kk = pp = qq = None
    K = 1 if greedy else kk if isinstance(kk, int) else min(V, FREE_K)
    cfg = cached_plan(B, V, K, x.dtype, dev)
    if cfg.path == "sort":
        return None
    row = not isinstance(kk, int) and K < V and not greedy
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
    C, CH, CP = row_chunks(B, V, target_of(dev)) if row else (0, 0, 0)
    one, two = _launches(B, V, K, C, CP)
    kt, pt, qt = _param(kk, 0, inds), _param(pp, 1.0, vals), _param(qq, 0.0, vals)
    params = (*tt, kt[0], int(kt[1]), kt[2], *pt, *qt)
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
