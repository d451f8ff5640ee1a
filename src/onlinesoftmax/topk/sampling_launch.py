"""``sample`` on the kernels: candidates by ``softmax_topk`` (temperature folded in), the filters and the draw in
one program per row, the exact row kernel for rows the candidates cannot decide. Launches bound once per problem."""

from __future__ import annotations

import torch

from .._triton.launch import BoundKernel, cached, pow2, stream_scratch
from .launch import cached_plan, softmax_topk_2d
from .plan import MIN_KP
from .sampling_kernels import _sample_kernel, _sample_row_kernel

FREE_K = 64                 # candidates when top_k is not a Python int (the bucket of k = 50: one compile)
ROW_BLOCK = 1024                # elements per step of the row kernel's passes over x
ROW_WARPS = 4


def _mode(v, off) -> tuple[int, object, float, int]:
    """(MODE, pointer tensor or None, scalar, stride) of a parameter: 0 off (None or the value ``off``), 1 a
    Python scalar, 2 a ``[B, 1]`` tensor (stride 0 when broadcast)."""
    if v is None or (not isinstance(v, torch.Tensor) and v == off):
        return 0, None, 0.0, 0
    if isinstance(v, torch.Tensor):
        return 2, v, 0.0, v.stride(0)
    return 1, None, v, 0


@cached
def _launches(B: int, V: int, K: int, modes: tuple, row: bool):
    """The sampling kernels after ``softmax_topk``: step 1 (B programs) and, where some row may need it, step 2."""
    meta = dict(T_MODE=modes[0], K_MODE=modes[1], P_MODE=modes[2], Q_MODE=modes[3])
    one = BoundKernel(_sample_kernel, (B,), dict(meta, KP=max(MIN_KP, pow2(K)), num_warps=1 if K <= 256 else 4))
    two = BoundKernel(_sample_row_kernel, (B,), dict(meta, BLOCK=ROW_BLOCK, num_warps=ROW_WARPS)) if row else None
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
    tm = _mode(t, 1.0)
    km = (1, None, 0.0, 0) if isinstance(kk, int) else _mode(kk, None)
    if km[0] == 1:
        km = (1, None, kk, 0)
    pm, qm = _mode(pp, 1.0), _mode(qq, 0.0)
    modes = (tm[0], km[0], pm[0], qm[0])
    row = km[0] != 1 and K < V and not greedy
    vals, inds, lse, flag = stream_scratch("sample", dev, ((B * K, torch.float32), (B * K, torch.int64),
                                                           (B, torch.float32), (B, torch.int32)), zeroed=0)
    vals, inds, lse, flag = vals[:B * K].view(B, K), inds[:B * K].view(B, K), lse[:B], flag[:B]
    softmax_topk_2d(x, K, cfg, (vals, inds, lse), tm[0], (tm[1], float(tm[2]), tm[3]))
    ids = torch.empty(B, device=dev, dtype=torch.int64)
    logp = torch.empty(B, device=dev, dtype=torch.float32)
    one, two = _launches(B, V, K, modes, row)
    params = []
    check = [x, u]
    for _, ptr, val, stride in (tm, km, pm, qm):
        params += [ptr if ptr is not None else vals, val, stride]
        if ptr is not None:
            check.append(ptr)
    params[4] = int(params[4])                      # top_k's scalar is an int
    check = tuple(check)
    one((vals, inds, lse, u, ids, logp, flag, *params, K, V), check, dev)
    if two is not None:
        two((x, x.stride(0), x.stride(1), V, inds, lse, u, ids, logp, flag, *params, K), check, dev)
    return ids, logp
