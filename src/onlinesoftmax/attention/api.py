"""``oss.attention``: argument checks, backend choice, plans, torch.library ops with fakes, autograd.

Layers, bottom up: the Triton launches (``kernels/fwd.py``, ``kernels/bwd.py``, imported lazily) and the portable
torch path -> custom ops ``onlinesoftmax::attention_fwd`` / ``::attention_bwd`` (so ``torch.compile(fullgraph=True)``
sees one op each way) -> autograd registration -> :func:`attention` and :func:`explain`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from .._autocast import any_autocast, autocast_boundary, autocast_on
from .._checks import (
    KERNEL_DTYPES,
    as_int,
    check_attention_scalars,
    check_bool,
    check_float_tensor,
    check_instance,
    check_kernel_inputs,
    check_window,
    fit_window,
    no_double_backward,
)
from .._triton.host import cached, wide_tiles
from ..backend import in_layout_of, raw_apply, resolve_backend, transforms_active
from ..target import target_of
from .plan import AttentionPlan, BackwardPlan, ForwardPlan, Knobs, Problem, backward_tl, decode_shape, plan_attention

__all__ = ["attention", "attention_varlen", "explain"]

TORCH_DTYPES = KERNEL_DTYPES + (torch.float64,)
MAX_HEAD_DIM = 256           # the kernels' register tiles (a [BLOCK_M, 256] fp32 accumulator per program)


# ---- arguments ----------------------------------------------------------------------------------------------
def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def _check_qkv(q, k, v, op: str, ndim: int, seq_dim: int, head_dim: int) -> None:
    """Shapes, dtypes and devices: q [..., S, D]-like of ``ndim`` dims with the head count at ``head_dim``."""
    Tensor = torch.Tensor
    if not (isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor) and q.dtype in TORCH_DTYPES
            and q.dim() == ndim and k.dim() == ndim and v.dim() == ndim):       # else: which one, in order
        for name, t in (("q", q), ("k", k), ("v", v)):
            check_float_tensor(t, f"{op}: {name}", TORCH_DTYPES)
            if t.dim() != ndim:
                raise ValueError(f"{op}: {name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    elif not (k.dtype in TORCH_DTYPES and v.dtype in TORCH_DTYPES):
        check_float_tensor(k, f"{op}: k", TORCH_DTYPES)
        check_float_tensor(v, f"{op}: v", TORCH_DTYPES)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{op}: q, k and v must share one dtype, got {_dtype_name(q.dtype)}, {_dtype_name(k.dtype)} "
                        f"and {_dtype_name(v.dtype)}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{op}: q, k and v must be on one device, got {q.device}, {k.device} and {v.device}")
    qs, ks = q.shape, k.shape
    if ks != v.shape:
        raise ValueError(f"{op}: k and v must have the same shape, got {tuple(ks)} and {tuple(v.shape)}")
    if qs[-1] != ks[-1]:
        raise ValueError(f"{op}: q and k must have the same head dim (last), got {qs[-1]} and {ks[-1]}")
    if qs[-1] == 0:
        raise ValueError(f"{op}: the head dim (last dim of q) must be at least 1")
    H, Hkv = qs[head_dim], ks[head_dim]
    if Hkv == 0 and H != 0 or Hkv and H % Hkv:
        raise ValueError(f"{op}: the query heads H = {H} must be a multiple of the key/value heads Hkv = {Hkv} "
                         "(GQA / MQA)")


def _tma_ok(*ts) -> bool:
    """TMA can copy [rows, D] tiles of each tensor: unit last stride, 16-byte aligned data and other strides."""
    for t in ts:
        st, per16 = t.stride(), 16 // t.element_size()      # elements per 16 bytes
        if st[-1] != 1 or t.data_ptr() & 15:
            return False
        for s in st[:-1]:
            if s % per16:
                return False
    return True


def _problem(q, k, causal, window, v=None, softcap=False) -> Problem:
    left, right = window
    if causal:            # causal ANDs j <= i + off into the window's right bound
        right = 0
    B, H, Sq, D = q.shape
    return Problem(B, H, k.shape[1], Sq, k.shape[2], D, _dtype_name(q.dtype), bool(causal), (left, right),
                   softcap, tma=v is not None and q.is_cuda and _tma_ok(q, k, v),
                   deterministic=torch.are_deterministic_algorithms_enabled())


# ---- the portable torch path (any device; full fp32 on the CPU) --------------------------------------------
def _band_mask(Sq: int, Sk: int, left: int, right: int, device) -> torch.Tensor | None:
    if left < 0 and right < 0:
        return None
    i = torch.arange(Sq, device=device).unsqueeze(1) + (Sk - Sq)
    j = torch.arange(Sk, device=device).unsqueeze(0)
    keep = torch.ones(Sq, Sk, dtype=torch.bool, device=device)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


def _torch_attention(q, k, v, scale, left, right, softcap, keep=None):
    """(o, lse) by the explicit scores in fp32 (fp64 for fp64), differentiable by torch's autograd. ``keep``: a
    boolean [Sq, Sk] mask that replaces the band (varlen's block-diagonal one)."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    qf, kf, vf = q.to(acc), k.to(acc), v.to(acc)
    H, Hkv = q.shape[1], k.shape[1]
    if Hkv and H != Hkv:
        kf, vf = kf.repeat_interleave(H // Hkv, dim=1), vf.repeat_interleave(H // Hkv, dim=1)
    s = (qf @ kf.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if keep is None:
        keep = _band_mask(q.shape[2], k.shape[2], left, right, q.device)
    if keep is not None:
        s = s.masked_fill(~keep, -math.inf)
    if s.shape[-1]:
        m = s.amax(dim=-1, keepdim=True).detach()
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))     # a row with no key: p = 0, not NaN
    else:
        m = s.new_zeros(s.shape[:-1] + (1,))
    p = torch.exp(s - m)
    d = p.sum(dim=-1, keepdim=True)
    some = (d > 0) | torch.isnan(d)             # d = 0: no key (lse −inf); NaN scores: lse NaN, as the kernels
    o = (p @ vf) / torch.where(some, d, torch.ones_like(d))
    lse = torch.where(some, m + torch.log(torch.where(some, d, torch.ones_like(d))), torch.full_like(d, -math.inf))
    return o.to(q.dtype), lse.squeeze(-1).to(torch.float32)


def _varlen_mask(cu_q, cu_k, Tq: int, Tk: int, left: int, right: int) -> torch.Tensor:
    """[Tq, Tk]: query row r attends key row c iff both lie in one sequence and c is in r's band there (no host
    synchronisation: built from cu_seqlens on the device)."""
    def local(cu, T):
        rows = torch.arange(T, device=cu.device)
        seg = torch.searchsorted(cu.long(), rows, right=True) - 1
        return seg, rows - cu.long()[seg.clamp_min(0)]
    seg_q, i = local(cu_q, Tq)
    seg_k, j = local(cu_k, Tk)
    lens_q, lens_k = (cu_q[1:] - cu_q[:-1]).long(), (cu_k[1:] - cu_k[:-1]).long()
    off = (lens_k - lens_q)[seg_q.clamp(0, max(len(lens_q) - 1, 0))] if len(lens_q) else i * 0
    i = (i + off).unsqueeze(1)
    j = j.unsqueeze(0)
    keep = seg_q.unsqueeze(1) == seg_k.unsqueeze(0)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


# ---- the Triton launches --------------------------------------------------------------------------------------
_K = None


def _kernels():
    """(fwd, bwd, launch) kernel modules, imported on first use (``import onlinesoftmax`` never imports Triton)."""
    global _K
    if _K is None:
        from .._triton import launch
        from .kernels import bwd, fwd

        _K = (fwd, bwd, launch)
    return _K


def _scalars(scale: float, softcap: float):
    """(qk_scale, cap_in, cap_out): scores in base 2 are qk·qk_scale, or tanh(qk·cap_in)·cap_out with a softcap."""
    log2e = 1.4426950408889634
    if softcap:
        return scale * log2e, scale / softcap, softcap * log2e
    return scale * log2e, 1.0, 1.0


def _bound(fn, grid, meta):
    _, _, launch = _kernels()
    return launch.BoundKernel(fn, grid, meta)


def _strides(t: torch.Tensor) -> tuple:
    """(batch, head, row, dim) strides: SDPA's [B, H, S, D] as is, varlen's [T, H, D] with batch stride 0."""
    if t.dim() == 3:
        return 0, t.stride(1), t.stride(0), t.stride(2)
    return tuple(t.stride())


def _lse_strides(p: Problem, lse: torch.Tensor) -> tuple:
    """(batch, head) strides of the lse: [B, H, Sq] dense, [H, total_q] varlen (rows offset by the sequence)."""
    return (0, lse.stride(0)) if p.varlen else (lse.stride(0), lse.stride(1))


def _fwd_launch(problem: Problem, plan: ForwardPlan, strides: tuple):
    fwd, _, _ = _kernels()
    p = problem
    grid = (-(-p.Sq // plan.block_m), p.B * p.H)
    left, right = p.window
    common = dict(HEAD_DIM=p.D, BLOCK_N=plan.block_n, HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0,
                  SOFTCAP=p.softcap, REVERSE=p.banded, VARLEN=p.varlen)
    if plan.kernel == "sm90":
        from .kernels import fwd_sm90

        rows = fwd_sm90.CONSUMERS * fwd_sm90.WARPGROUP_ROWS
        if (plan.block_m, plan.num_warps) != (rows, 4):
            raise ValueError(f"attention: the sm90 kernel runs block_m = {rows} query rows on num_warps = 4 (two "
                             f"consumer warpgroups and a producer warp), got {plan.block_m} / {plan.num_warps}")
        meta = dict(common, BLOCK_M=fwd_sm90.WARPGROUP_ROWS, STAGES=plan.num_stages, OVERLAP=plan.overlap,
                    FOLD=plan.fold, num_warps=4)
        if plan.programs:
            del meta["VARLEN"]
            meta.update(PAIRS=plan.pairs, O_DIRECT=plan.o_direct)
            units = persistent_units(grid[0], grid[1], plan.pairs)
            _, _, launch = _kernels()
            return launch.DescriptorKernel(fwd_sm90.attention_fwd_sm90_persistent_kernel,
                                           (min(plan.programs, units),), meta, _persistent_boxes(p, plan))
        return _bound(fwd_sm90.attention_fwd_sm90_kernel, grid, meta)
    return _bound(fwd.attention_fwd_kernel, grid,
                  dict(common, BLOCK_M=plan.block_m, BLOCK_D=p.block_d, F32=plan.dot_f32,
                       num_warps=plan.num_warps, num_stages=plan.num_stages))


def _persistent_boxes(p: Problem, plan: ForwardPlan) -> tuple:
    """(block shape, shared layout) of the persistent kernel's descriptors over q, k, v, o: 4-D boxes of one
    (batch, head)'s rows, a consumer warpgroup's query rows of q and o, block_n keys of k and v."""
    from triton.experimental.gluon import language as gl

    from .kernels.fwd_sm90 import WARPGROUP_ROWS

    dt = gl.float16 if p.dtype == "float16" else gl.bfloat16

    def box(rows):
        block = [1, 1, rows, p.D]
        return block, gl.NVMMASharedLayout.get_default_for(block, dt)

    q_box, kv_box = box(WARPGROUP_ROWS), box(plan.block_n)
    return q_box, kv_box, kv_box, q_box


def _device_allocator(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator() -> None:
    """The sm90 kernel makes its TMA descriptors on the device, in global scratch that Triton's launcher takes
    from the allocator set by ``triton.set_allocator``: a torch allocation (on the current stream, so CUDA graphs
    capture it) unless the caller set one."""
    from triton.runtime import _allocation

    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        _allocation.set_allocator(_device_allocator)


def _bwd_launches(problem: Problem, plan: BackwardPlan, strides: tuple, has_dlse: bool):
    """(Δ, dK/dV, dQ) launches: the third is the dQ kernel, or with ``plan.dq_atomic`` the cast of dQ's fp32 rows.
    ``plan.kernel == "sm90"``: the second is the Gluon kernel (dK, dV and dQ's atomics), always with the cast."""
    _, bwd, _ = _kernels()
    p = problem
    left, right = p.window
    common = dict(HEAD_DIM=p.D, BLOCK_D=p.block_d, HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0, SOFTCAP=p.softcap,
                  F32=plan.dot_f32, VARLEN=p.varlen)
    rows = (-(-p.Sq // 64), p.B * p.H)
    dq_buffer = plan.dq_atomic or plan.kernel == "sm90"
    delta = _bound(bwd.attention_bwd_delta_kernel, rows,
                   dict(HEAD_DIM=p.D, BLOCK_M=64, BLOCK_D=p.block_d, HAS_DLSE=has_dlse, ZERO_DQ=dq_buffer,
                        VARLEN=p.varlen, num_warps=4))
    if plan.kernel == "sm90":
        from .kernels import bwd_sm90

        block_ms, keys = bwd_sm90.TILES[p.D]
        if plan.block_m not in block_ms or (plan.block_n, plan.num_warps) != (keys, 4):
            raise ValueError(f"attention: the sm90 backward at D = {p.D} runs block_m in {block_ms} query rows per "
                             f"step over block_n = {keys} keys on num_warps = 4 (two consumer warpgroups and a "
                             f"producer warp), got {plan.block_m} / {plan.block_n} / {plan.num_warps}")
        meta = dict(HEAD_DIM=p.D, BLOCK_M=plan.block_m, BLOCK_N=keys // bwd_sm90.CONSUMERS,
                    STAGES=plan.num_stages, HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0, VARLEN=p.varlen,
                    STAGE_ROWS=plan.stage_rows, DQ_TMA=plan.dq_tma, DQ_SLOT=plan.dq_slot,
                    LPT_HEADS=plan.lpt_heads, DQ_ROWS=plan.dq_rows, PRODUCER_REGS=plan.producer_regs, num_warps=4)
        n_kb = -(-p.Sk // keys)
        if plan.programs:
            del meta["VARLEN"]
            meta["PAIRS"] = plan.pairs
            _, _, launch = _kernels()
            dkdv = launch.DescriptorKernel(
                bwd_sm90.attention_bwd_sm90_persistent_kernel,
                (min(plan.programs, persistent_units(n_kb, p.B * p.Hkv, plan.pairs)),), meta,
                _bwd_persistent_boxes(p, plan, keys))
        else:
            dkdv = _bound(bwd_sm90.attention_bwd_sm90_kernel, (n_kb, p.B * p.Hkv), meta)
    else:
        dkdv = _bound(bwd.attention_bwd_dkdv_kernel, (-(-p.Sk // plan.block_n), p.B * p.Hkv),
                      dict(common, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, DQ_ATOMIC=plan.dq_atomic,
                           num_warps=plan.num_warps, num_stages=plan.num_stages))
    if dq_buffer:
        dq = _bound(bwd.attention_bwd_dq_cast_kernel, rows,
                    dict(HEAD_DIM=p.D, BLOCK_M=64, BLOCK_D=p.block_d, VARLEN=p.varlen, num_warps=4))
    else:
        dq = _bound(bwd.attention_bwd_dq_kernel, (-(-p.Sq // plan.block_m_dq), p.B * p.H),
                    dict(common, BLOCK_M=plan.block_m_dq, BLOCK_N=plan.block_n_dq, REVERSE=p.banded,
                         num_warps=plan.num_warps_dq, num_stages=plan.num_stages_dq))
    return delta, dkdv, dq


def _bwd_persistent_boxes(p: Problem, plan: BackwardPlan, keys: int) -> tuple:
    """(block shape, shared layout) of the persistent backward's descriptors over q, k, v, dO and dQ's fp32 rows, all
    [B, heads, S, D]: 4-D boxes of one (batch, head)'s block_m query rows, its `keys` keys, and one consumer
    warpgroup's dQ partial tile (block_m rows, halved by dq_rows; D columns, halved at D >= 128)."""
    from triton.experimental.gluon import language as gl

    dt = gl.float16 if p.dtype == "float16" else gl.bfloat16

    def box(rows, cols, t=dt):
        block = [1, 1, rows, cols]
        return block, gl.NVMMASharedLayout.get_default_for(block, t)

    q_box, kv_box = box(plan.block_m, p.D), box(keys, p.D)
    dq_box = box(plan.block_m // 2 if plan.dq_rows else plan.block_m, p.D // 2 if p.D >= 128 else p.D, gl.float32)
    return q_box, kv_box, kv_box, q_box, dq_box


_fwd_cache = None
_bwd_cache = None


def _caches():
    """The bound launches, cached by (problem, plan, strides) in the package's one LRU cache."""
    global _fwd_cache, _bwd_cache
    if _fwd_cache is None:
        _, _, launch = _kernels()
        _fwd_cache = launch.cached(_fwd_launch)
        _bwd_cache = launch.cached(_bwd_launches)
    return _fwd_cache, _bwd_cache


def _wide(p: Problem, plan, *ts) -> bool:
    """The tl.dot kernels' in-tile offsets of one of ``ts`` could pass 2^31 (``wide_tiles``; the sm90 kernels'
    tiles are TMA copies, addressed in 64 bits)."""
    return plan.kernel != "sm90" and any(wide_tiles(t, 0 if p.varlen else 2) for t in ts)


def _forward_triton(q, k, v, problem: Problem, plan: ForwardPlan, scale: float, softcap: float, cu=None):
    """(o, lse) by the forward kernel; ``cu = (cu_seqlens_q, cu_seqlens_k)`` for packed sequences."""
    p = problem
    if _wide(p, plan, q, k, v):      # contiguous copies; o in q's layout (its strides are the fake's)
        o, lse = _forward_triton(q.contiguous(), k.contiguous(), v.contiguous(), p, plan, scale, softcap, cu)
        return torch.empty_like(q).copy_(o), lse
    o = torch.empty_like(q)
    lse_shape = (q.shape[1], q.shape[0]) if p.varlen else q.shape[:3]
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    if p.Sk == 0 or q.numel() == 0:
        return o.zero_(), lse.fill_(-math.inf)
    left, right = p.window
    if plan.kernel == "sm90" and plan.fold and (p.softcap or not scale > 0):
        plan = dataclasses.replace(plan, fold=False)          # the row max over q kᵀ needs c > 0
    if plan.kernel == "sm90" and plan.programs:
        return _forward_persistent(q, k, v, o, lse, p, plan, scale, softcap)
    if plan.kernel == "sm90":     # unit head-dim strides (p.tma): the (batch, head, row) strides only
        _ensure_allocator()
        strides = (*_strides(q)[:3], *_strides(k)[:3], *_strides(v)[:3], *_strides(o)[:3], *_lse_strides(p, lse))
    else:
        strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(o), *_lse_strides(p, lse))
    bk = _caches()[0](p, plan, strides)
    cu_q, cu_k = cu if cu is not None else (lse, lse)      # unread unless VARLEN
    bk((q, k, v, o, lse, cu_q, cu_k, *strides, p.H, p.group, p.Sq, p.Sk, max(left, 0), max(right, 0),
        *_scalars(scale, softcap)), (q, k, v, o), q.device)
    return o, lse


def _forward_persistent(q, k, v, o, lse, p: Problem, plan: ForwardPlan, scale: float, softcap: float):
    """The sm90 kernel on a persistent grid: host TMA descriptors over q, o [B, H, Sq, D] and k, v [B, Hkv, Sk, D]
    (4-D boxes of one (batch, head)'s rows: zeros past S, stores clipped there), made by the bound launch from the
    tensors (``_persistent_boxes``)."""
    so, sl = _strides(o), _lse_strides(p, lse)
    bk = _caches()[0](p, plan, (*_strides(q), *_strides(k), *_strides(v), *so, *sl))
    left, right = p.window
    n_m = -(-p.Sq // plan.block_m)
    bk((q, k, v, o, o, *so[:3], lse, *sl, p.H, p.group, p.Sq, p.Sk, max(left, 0), max(right, 0),
        *_scalars(scale, softcap), n_m, persistent_units(n_m, p.B * p.H, plan.pairs)), (q, k, v, o), q.device)
    return o, lse


def persistent_units(n_m: int, heads: int, pairs: bool) -> int:
    """Work units of the persistent grid (the kernel's ``_units``): n_m query blocks per (batch, head), or with
    ``pairs`` their pairs (i, n_m − 1 − i), the middle block of an odd n_m alone."""
    return (-(-n_m // 2) if pairs else n_m) * heads


def _backward_triton(do, dlse, q, k, v, o, lse, problem: Problem, plan: BackwardPlan, scale: float,
                     softcap: float, cu=None):
    p = problem
    if _wide(p, plan, do, q, k, v, o):      # contiguous copies; dq, dk, dv in q's, k's, v's layouts
        grads = _backward_triton(do.contiguous(), dlse, q.contiguous(), k.contiguous(), v.contiguous(),
                                 o.contiguous(), lse, p, plan, scale, softcap, cu)
        return tuple(torch.empty_like(t).copy_(g) for t, g in zip((q, k, v), grads))
    lse = lse.contiguous()      # Δ and dQ's fp32 rows are laid out as lse: a strided slice of one (a ring's) made dense
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if p.Sk == 0 or p.Sq == 0 or q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    if p.varlen:        # sequences with no keys (or no queries) leave their rows of dq (dk, dv) to these zeros
        dq.zero_()
        dk.zero_()
        dv.zero_()
    if plan.kernel == "sm90" and scale == 0.0:      # the sm90 backward divides by the scale: the tl.dot kernels
        plan = backward_tl(p, target_of(q.device))
    sm90 = plan.kernel == "sm90"
    if sm90 and not _tma_ok(do):       # the kernel copies dO tiles with TMA, as q: a fresh (aligned) copy
        do = do.clone(memory_format=torch.contiguous_format)      # (.contiguous() keeps a misaligned dense dO)
    left, right = p.window
    sq, sk, sv, sdo, so = _strides(q), _strides(k), _strides(v), _strides(do), _strides(o)
    sdq, sdk, sdv, sl = _strides(dq), _strides(dk), _strides(dv), _lse_strides(p, lse)
    delta_k, dkdv_k, dq_k = _caches()[1](p, plan, (*sq, *sk, *sv, *sdo, *so, *sdq, *sdk, *sdv, *sl),
                                         dlse is not None)
    delta = torch.empty_like(lse)
    if dlse is not None:
        dlse = dlse.to(torch.float32)
        if dlse.stride() != lse.stride():
            dlse = dlse.contiguous()
    # dq_atomic / sm90: dQ's fp32 rows, laid out as the lse (contiguous) times block_d; zeroed by the Δ kernel. The
    # sm90 kernel adds whole query tiles (zeros past a sequence's rows): a tile of padding rows after the last
    if sm90:
        dqacc = lse.new_empty(((lse.numel() + plan.block_m) * p.block_d,))
    else:
        dqacc = lse.new_empty((*lse.shape, p.block_d)) if plan.dq_atomic else lse
    cu_q, cu_k = cu if cu is not None else (lse, lse)
    delta_k((o, do, dlse if dlse is not None else lse, delta, dqacc, cu_q, *so, *sdo, *sl, p.H, p.Sq), (o, do),
            q.device)
    lr = (max(left, 0), max(right, 0))
    qk_scale, cap_in, cap_out = _scalars(scale, softcap)
    if sm90 and plan.programs:      # host descriptors over q, k, v, dO and dQ's rows as [B, H, Sq, D] (dense lse)
        dq4 = dqacc[:lse.numel() * p.D].as_strided((p.B, p.H, p.Sq, p.D), (sl[0] * p.D, sl[1] * p.D, p.D, 1))
        n_kb = -(-p.Sk // plan.block_n)
        dkdv_k((q, k, v, do, dq4, lse, delta, dk, dv, dqacc, *sdk[:3], *sdv[:3], *sl, p.Hkv, p.group, p.Sq, p.Sk, *lr,
                scale, qk_scale, n_kb, p.B * p.Hkv, persistent_units(n_kb, p.B * p.Hkv, plan.pairs)),
               (q, k, v, do, dq4, dk, dv), q.device)
    elif sm90:          # unit head-dim strides (TMA): the (batch, head, row) strides only
        _ensure_allocator()
        dkdv_k((q, k, v, do, lse, delta, dk, dv, dqacc, cu_q, cu_k, *sq[:3], *sk[:3], *sv[:3], *sdo[:3], *sdk[:3],
                *sdv[:3], *sl, p.Hkv, p.group, p.Sq, p.Sk, *lr, scale, qk_scale), (q, k, v, do, dk, dv), q.device)
    else:
        dkdv_k((q, k, v, do, lse, delta, dk, dv, dqacc, cu_q, cu_k, *sq, *sk, *sv, *sdo, *sdk, *sdv, *sl,
                p.H, p.Hkv, p.group, p.Sq, p.Sk, *lr, scale, qk_scale, cap_in, cap_out), (q, k, v, do, dk, dv),
               q.device)
    if plan.dq_atomic or sm90:
        dq_k((dqacc, dq, cu_q, *sdq, *sl, p.H, p.Sq, scale), (dq,), q.device)
    else:
        dq_k((q, k, v, do, lse, delta, dq, cu_q, cu_k, *sq, *sk, *sv, *sdo, *sdq, *sl,
              p.H, p.group, p.Sq, p.Sk, *lr, scale, qk_scale, cap_in, cap_out), (q, k, v, do, dq), q.device)
    return dq, dk, dv


# ---- custom ops -------------------------------------------------------------------------------------------------
def _op_problem(q, k, v, causal, left, right, softcap) -> Problem:
    return _problem(q, k, causal, (left, right), v, softcap > 0)


def _triton_plan(p: Problem, device: torch.device) -> AttentionPlan:
    """``plan_attention(p, target_of(device), "triton")``: a pure function of (problem, target), cached per
    function (tools and tests that swap ``api.plan_attention`` get plans of their own)."""
    return _plans(plan_attention, p, target_of(device))


def _plan_uncached(fn, p: Problem, target) -> AttentionPlan:
    return fn(p, target, "triton")


_plans = cached(_plan_uncached)


def _attention_fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, left: int,
                        right: int, softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    problem = _op_problem(q, k, v, causal, left, right, softcap)
    plan = _triton_plan(problem, q.device).forward
    if q.numel() == 0:
        return torch.empty_like(q), torch.full(q.shape[:3], -math.inf, dtype=torch.float32, device=q.device)
    return _forward_triton(q, k, v, problem, plan, scale, softcap)


_attention_fwd_op = torch.library.custom_op("onlinesoftmax::attention_fwd", _attention_fwd_impl, mutates_args=())


@_attention_fwd_op.register_fake
def _(q, k, v, causal, scale, left, right, softcap):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("onlinesoftmax::attention_bwd", mutates_args=())
def _attention_bwd_op(do: torch.Tensor, dlse: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor,
                      v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, causal: bool, scale: float, left: int,
                      right: int, softcap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    problem = _op_problem(q, k, v, causal, left, right, softcap)
    plan = _triton_plan(problem, q.device).backward
    if q.numel() == 0 or k.numel() == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    return _backward_triton(do, dlse, q, k, v, o, lse, problem, plan, scale, softcap)


@_attention_bwd_op.register_fake
def _(do, dlse, q, k, v, o, lse, causal, scale, left, right, softcap):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output):
    q, k, v, causal, scale, left, right, softcap = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.args = (causal, scale, left, right, softcap)


def _backward(ctx, do, dlse):
    no_double_backward(_OP, "by the Triton backward kernels; use backend='torch'")
    q, k, v, o, lse = ctx.saved_tensors
    if do is None:
        do = torch.zeros_like(o)
    dq, dk, dv = torch.ops.onlinesoftmax.attention_bwd(do, dlse, q, k, v, o, lse, *ctx.args)
    return dq, dk, dv, None, None, None, None, None


torch.library.register_autograd("onlinesoftmax::attention_fwd", _backward, setup_context=_setup)


# ---- eager calls: the op's body directly, or an autograd.Function around it where a gradient is needed (the
# custom op's dispatch and registered autograd cost 10-30 µs of host time per call); the backward is the op's ------
class _EagerAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, left, right, softcap):
        o, lse = _attention_fwd_impl(q, k, v, causal, scale, left, right, softcap)
        _setup(ctx, (q, k, v, causal, scale, left, right, softcap), (o, lse))
        return o, lse

    backward = staticmethod(_backward)


_eager_attention = raw_apply(_EagerAttention)


def _attention_fwd(q, k, v, causal, scale, left, right, softcap):
    """(o, lse): the custom op under torch.compile, else the eager paths."""
    if torch.compiler.is_compiling():
        return torch.ops.onlinesoftmax.attention_fwd(q, k, v, causal, scale, left, right, softcap)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _eager_attention(q, k, v, causal, scale, left, right, softcap)
    return _attention_fwd_impl(q, k, v, causal, scale, left, right, softcap)


def _varlen_problem(q, k, v, cu_q, max_q, max_k, causal, left, right, softcap) -> Problem:
    right = 0 if causal else right
    return Problem(cu_q.shape[0] - 1, q.shape[1], k.shape[1], max_q, max_k, q.shape[2], _dtype_name(q.dtype),
                   bool(causal), (left, right), softcap > 0, varlen=True, tma=q.is_cuda and _tma_ok(q, k, v),
                   deterministic=torch.are_deterministic_algorithms_enabled())


@torch.library.custom_op("onlinesoftmax::attention_varlen_fwd", mutates_args=())
def _attention_varlen_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                             cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                             scale: float, left: int, right: int,
                             softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    problem = _varlen_problem(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k, causal, left, right, softcap)
    plan = _triton_plan(problem, q.device).forward
    return _forward_triton(q, k, v, problem, plan, scale, softcap, (cu_seqlens_q, cu_seqlens_k))


@_attention_varlen_fwd_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, left, right, softcap):
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("onlinesoftmax::attention_varlen_bwd", mutates_args=())
def _attention_varlen_bwd_op(do: torch.Tensor, dlse: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor,
                             v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                             cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                             scale: float, left: int, right: int,
                             softcap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    problem = _varlen_problem(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k, causal, left, right, softcap)
    plan = _triton_plan(problem, q.device).backward
    return _backward_triton(do, dlse, q, k, v, o, lse, problem, plan, scale, softcap, (cu_seqlens_q, cu_seqlens_k))


@_attention_varlen_bwd_op.register_fake
def _(do, dlse, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, left,
      right, softcap):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _varlen_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, *args = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
    ctx.args = tuple(args)


def _varlen_backward(ctx, do, dlse):
    no_double_backward(_VOP, "by the Triton backward kernels; use backend='torch'")
    q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
    if do is None:
        do = torch.zeros_like(o)
    dq, dk, dv = torch.ops.onlinesoftmax.attention_varlen_bwd(do, dlse, q, k, v, o, lse, cu_q, cu_k, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None


torch.library.register_autograd("onlinesoftmax::attention_varlen_fwd", _varlen_backward,
                                setup_context=_varlen_setup)


# ---- public -------------------------------------------------------------------------------------------------------
_OP = "onlinesoftmax.attention"


def _prepare(q, k, v, causal, scale, window, softcap, backend, op=_OP):
    """The checked arguments: ``((left, right), backend, scale, softcap)``, scale and softcap Python floats (softcap
    None when not given), a window side wider than the problem cut to it (``fit_window``)."""
    _check_qkv(q, k, v, op, ndim=4, seq_dim=2, head_dim=1)
    scale, softcap = check_attention_scalars(scale, softcap, op)
    if type(causal) is not bool:        # (the checks' messages are built only on failure: a decode step's host cost)
        check_bool(causal, f"{op}: causal")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"{op}: q and k must have the same batch size, got {q.shape[0]} and {k.shape[0]}")
    win = (-1, -1) if window is None else fit_window(*check_window(window, op), q.shape[2], k.shape[2])
    backend = resolve_backend(backend, q, op)
    if backend == "triton":
        check_kernel_inputs(q, op, "q/k/v", MAX_HEAD_DIM)
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    return win, backend, scale, softcap


def explain(q, k, v, *, causal=False, scale=None, window=None, softcap=None, backend=None,
            knobs: Knobs = Knobs()) -> AttentionPlan:
    """The plan ``attention(q, k, v, ...)`` would run: backend, problem, forward and backward launch configurations
    (for the target of q's device). ``knobs`` shows what an override would give."""
    win, backend, _, softcap = _prepare(q, k, v, causal, scale, window, softcap, backend, "onlinesoftmax.explain")
    check_instance(knobs, Knobs, "onlinesoftmax.explain: knobs")
    p = _problem(q, k, causal, win, v, softcap is not None)
    return plan_attention(p, target_of(q.device), backend, knobs)


def attention(q, k, v, *, causal=False, scale=None, window=None, softcap=None, return_lse=False, backend=None):
    """Scaled dot-product attention on the online-softmax state ``(m, d, o)`` (FlashAttention): the Sq × Sk scores
    are never written to memory.

    Parameters
    ----------
    q : Tensor ``[B, H, Sq, D]``; k, v : Tensor ``[B, Hkv, Sk, D]`` with ``H % Hkv == 0``
        SDPA's layout; query head h reads kv head ``h // (H // Hkv)`` (GQA / MQA). Any strides (e.g. a
        ``[B, S, H, D]`` tensor ``.transpose(1, 2)``): nothing is copied, but for a head-dim-outermost buffer of
        more than 2^31 / D rows (4.3 GB at D = 128) seen as ``[B, H, S, D]``, which a contiguous copy replaces.
        float16, bfloat16, float32 (float64 with ``backend="torch"``); ``D <= 256`` for the Triton kernels.
    causal : bool
        Query i attends key j iff ``j <= i + (Sk - Sq)``: **aligned bottom-right** (what a KV cache needs: the
        last query sees every key). ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` aligns
        top-left instead; the two agree when Sq == Sk.
    scale : float, default ``D ** -0.5``
        Scores are ``s = scale · q·k``.
    window : (left, right), default None
        Query i attends key j iff ``i + Sk - Sq - left <= j <= i + Sk - Sq + right`` (-1 = unbounded side), ANDed
        with causal (FlashAttention's ``window_size``; Mistral's sliding window is ``(w - 1, 0)`` with causal).
    softcap : float, default None
        ``s = softcap · tanh(s / softcap)`` before the softmax (Gemma 2).
    return_lse : bool
        Also return ``lse`` (float32 ``[B, H, Sq]``, natural log of the row's Σ e^s); differentiable.
    backend : None, "torch" or "triton"
        None: the Triton kernels on CUDA, the torch path elsewhere (see :mod:`onlinesoftmax.backend`).

    Returns
    -------
    o (q's dtype, q's shape) or ``(o, lse)``. A query row that attends no key gets o = 0 and lse = -inf, never NaN.

    Precision: the kernels accumulate in fp32; for float32 inputs on CUDA the two matmuls run on TF32 tensor cores
    (about 1e-3 relative error, as torch with ``allow_tf32``). The torch backend computes in full fp32 (fp64 for
    fp64). Autograd to q, k, v (dk, dv summed over each GQA group) runs the Triton backward kernels; under
    ``torch.use_deterministic_algorithms(True)`` the ones without atomics (dQ by its own kernel, not added up in
    fp32 atomics): bitwise reproducible gradients, at some speed.

    Under ``torch.autocast`` q, k, v are cast as ``scaled_dot_product_attention``'s (to the autocast dtype, fp64
    left alone), and the op runs with autocast off; gradients come back in the inputs' own dtypes.

    Example
    -------
    >>> q = torch.randn(1, 8, 128, 64); k = torch.randn(1, 2, 128, 64); v = torch.randn(1, 2, 128, 64)
    >>> o = oss.attention(q, k, v, causal=True)          # GQA 8 / 2
    """
    if any_autocast() and autocast_on(q):   # inline, not a decorator: a decode step's host cost
        return _attention_autocast(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap,
                                   return_lse=return_lse, backend=backend)
    (left, right), backend, scale, softcap = _prepare(q, k, v, causal, scale, window, softcap, backend)
    if type(return_lse) is not bool:
        check_bool(return_lse, f"{_OP}: return_lse")
    if backend == "torch" or transforms_active():   # torch.func, forward AD: torch ops compose with them
        o, lse = _torch_attention(q, k, v, scale, left, 0 if causal else right, softcap)
        o = _in_layout_of_q(o, q)
    elif _decode_call(q, k, v):
        o, lse = _full_cache()(q, k, v, causal, scale, left, right, float(softcap) if softcap else 0.0, return_lse)
        o = _in_layout_of_q(o, q)
    else:
        o, lse = _attention_fwd(q, k, v, causal, scale, left, right, float(softcap) if softcap else 0.0)
    return (o, lse) if return_lse else o


_attention_autocast = autocast_boundary("aten::scaled_dot_product_attention", "lower", ("q", "k", "v"))(attention)


def _in_layout_of_q(o: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """o (contiguous, from the torch path or the decode kernels) with q's strides, as the prefill kernels write it
    and the docs promise (``in_layout_of``; autograd flows through its copy). A contiguous q keeps o as it is:
    the decode path's q [B, H, 1, D] is often a transposed view, contiguous but for a size-1 dim's stride."""
    return o if q.is_contiguous() else in_layout_of(o, q)


def _decode_call(q, k, v) -> bool:
    """Eager calls that need no gradient, with few query rows over many keys (plan.decode_dispatch), run the split-KV
    decode kernels (``onlinesoftmax.attention_with_kvcache`` over the whole of k and v, without its argument checks,
    which ``_prepare`` made). Under torch.compile or autograd the attention op runs as before."""
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                                                      or v.requires_grad)):
        return False
    qs = q.shape
    return decode_shape(qs[2], k.shape[2], qs[3])


@functools.cache
def _full_cache():
    """``decode.api.attention_full_cache``, imported on first use (the decode family imports this module's peers)."""
    from ..decode.api import attention_full_cache

    return attention_full_cache


_VOP = "onlinesoftmax.attention_varlen"


def _check_cu(cu, name: str, q, op: str) -> None:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(cu).__name__}")
    if cu.is_floating_point() or cu.is_complex() or cu.dtype == torch.bool:
        raise TypeError(f"{op}: {name} must be an int32 (or other integer) tensor, got {str(cu.dtype)[6:]}")
    if cu.dim() != 1 or cu.shape[0] < 1:
        raise ValueError(f"{op}: {name} must be a 1-d int32 tensor of length B + 1, got {str(cu.dtype)[6:]} of "
                         f"shape {tuple(cu.shape)}")
    if cu.device != q.device:
        raise ValueError(f"{op}: {name} must be on q's device {q.device}, got {cu.device}")


def _check_cu_values(cus: tuple, totals: tuple, maxes: tuple, op: str) -> None:
    """On the CPU (free to read): each cu_seqlens starts at 0, never decreases and ends at its tensor's rows, and
    every length is at most its max_seqlen, else a ``ValueError`` naming the argument. On a GPU the values are not
    read by the host (no synchronisation)."""
    if cus[0].device.type != "cpu" or torch.compiler.is_compiling() or transforms_active():
        return
    for name, cu, total, m in zip(("cu_seqlens_q", "cu_seqlens_k"), cus, totals, maxes):
        c = cu.tolist()
        lengths = [b - a for a, b in zip(c, c[1:])]
        if c[0] != 0 or c[-1] != total or any(n < 0 for n in lengths):
            raise ValueError(f"{op}: {name} must start at 0, never decrease and end at the packed rows ({total}), "
                             f"got {c if len(c) <= 8 else c[:4] + ['...'] + c[-3:]}")
        if lengths and max(lengths) > m:
            raise ValueError(f"{op}: max_seqlen_{name[-1]} = {m} is less than sequence {lengths.index(max(lengths))}'s "
                             f"length {max(lengths)}")


@autocast_boundary("aten::scaled_dot_product_attention", "lower", ("q", "k", "v"))
def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, scale=None,
                     window=None, softcap=None, return_lse=False, backend=None):
    """:func:`attention` over packed sequences (FlashAttention's varlen convention): training with packing, padded
    batches without the padding.

    Parameters
    ----------
    q : Tensor ``[total_q, H, D]``; k, v : Tensor ``[total_k, Hkv, D]``
        Sequence b is rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of q and ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``
        of k and v. Any strides.
    cu_seqlens_q, cu_seqlens_k : int32 Tensor ``[B + 1]``
        Cumulative lengths starting at 0 and ending at total_q / total_k; empty sequences allowed. Another integer
        dtype (``torch.cumsum``'s int64) is converted to int32.
    max_seqlen_q, max_seqlen_k : int (or a NumPy integer, a 0-d integer tensor)
        Bounds on the lengths (they size the grid: no host synchronisation reads cu_seqlens). They must be at
        least every sequence's length, and the cu_seqlens must cover every row: checked (``ValueError``) for CPU
        tensors, not on a GPU (that would need a synchronisation).
    causal, scale, window, softcap, backend
        As :func:`attention`, per sequence (causal aligned bottom-right within each sequence).

    Returns
    -------
    o ``[total_q, H, D]`` (q's dtype), or ``(o, lse)`` with lse float32 ``[H, total_q]`` (FlashAttention's layout).
    Under ``torch.autocast`` and deterministic mode as :func:`attention`.
    """
    _check_qkv(q, k, v, _VOP, ndim=3, seq_dim=0, head_dim=1)
    scale, softcap = check_attention_scalars(scale, softcap, _VOP)
    check_bool(causal, f"{_VOP}: causal")
    check_bool(return_lse, f"{_VOP}: return_lse")
    _check_cu(cu_seqlens_q, "cu_seqlens_q", q, _VOP)
    _check_cu(cu_seqlens_k, "cu_seqlens_k", q, _VOP)
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"{_VOP}: cu_seqlens_q and cu_seqlens_k must have the same length B + 1, got "
                         f"{cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}")
    maxes = []
    for name, m, t in (("max_seqlen_q", max_seqlen_q, q), ("max_seqlen_k", max_seqlen_k, k)):
        # an int as torch takes one (a NumPy integer, a 0-d tensor: ``lengths.max()``), or a torch.SymInt (traced
        # from a shape under torch.compile / torch.export with dynamic shapes)
        if not isinstance(m, torch.SymInt):
            try:
                m = as_int(m, f"{_VOP}: {name}")
            except TypeError:
                raise TypeError(f"{_VOP}: {name} must be an int >= 0, got {m!r}") from None
            if m < 0:
                raise ValueError(f"{_VOP}: {name} must be an int >= 0, got {m}")
        if m == 0 and t.shape[0] > 0 and cu_seqlens_q.shape[0] > 1:
            raise ValueError(f"{_VOP}: {name} is 0 but the packed tensor has {t.shape[0]} rows")
        maxes.append(m)
    max_seqlen_q, max_seqlen_k = maxes
    _check_cu_values((cu_seqlens_q, cu_seqlens_k), (q.shape[0], k.shape[0]), (max_seqlen_q, max_seqlen_k), _VOP)
    # the kernels read int32 offsets: another integer dtype (torch.cumsum's int64) converted, its values checked
    # above on the CPU (on a GPU they end at the packed rows, < 2^31, when valid)
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.to(torch.int32), cu_seqlens_k.to(torch.int32)
    left, right = fit_window(*check_window(window, _VOP), max_seqlen_q, max_seqlen_k)
    backend = resolve_backend(backend, q, _VOP)
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    if backend == "torch" or transforms_active():   # torch.func, forward AD: torch ops compose with them
        keep = _varlen_mask(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], left, 0 if causal else right)
        o, lse = _torch_attention(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                                  v.transpose(0, 1).unsqueeze(0), scale, left, right, softcap, keep=keep)
        o, lse = o[0].transpose(0, 1), lse[0]
    else:
        check_kernel_inputs(q, _VOP, "q/k/v", MAX_HEAD_DIM)
        # the kernels read cu_seqlens[b] at b (unit stride): a strided view (a column of a 2-d tensor) made dense
        cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
        o, lse = torch.ops.onlinesoftmax.attention_varlen_fwd(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, left, right,
            float(softcap) if softcap else 0.0)
    return (o, lse) if return_lse else o
