"""Decode plans bound to their kernels, the partial-state workspace per stream (``stream_scratch``: graph-safe,
written before it is read) and the lengths of a full cache (``uniform_lengths``).

A decoding loop grows the cache by one key a step, so nothing here is keyed by the cache's length: plans per class of
16 lengths (``cached_plan``), bound launches per shape class (``_bound_split``, ``_bound_balanced``: the grid and
constexprs the plan fixes, and Triton's specialisation of the run-time integers, ``int_spec``, since a bound kernel
replays the variant compiled at its first call); the lengths, strides and scalars go to each launch as arguments."""

from __future__ import annotations

import collections

import torch

from .._triton import launch as _shared
from .._triton.host import int_spec, pow2
from .._triton.launch import BoundKernel, cached, stream_scratch
from ..target import target_of
from .kernels.merge import merge_segments_kernel, merge_splits_kernel, merge_two_kernel
from .kernels.split_kv import balanced_kv_kernel, split_kv_kernel
from .plan import MergePlan, Plan, Problem, decode_plan, merge_plan


@cached
def _plan(B: int, H: int, Hkv: int, Sq: int, D: int, s_max: int, page: int, esize: int,
          device: torch.device) -> Plan:
    return decode_plan(Problem(B, H, Hkv, Sq, D, s_max, page, esize), target_of(device))


def cached_plan(p: Problem, device: torch.device) -> Plan:
    """``decode_plan(p, target_of(device))``, cached per class of 16 lengths: the plan reads s_max only as whole key
    tiles (``cdiv(s_max, block_n)``, block_n a power of two >= 16), so s_max rounded up to 16 plans the same."""
    return _plan(p.B, p.H, p.Hkv, p.Sq, p.D, -(-p.s_max // 16) * 16, p.page, p.esize, device)


def _spec(p: Problem, scalars: tuple, strides: tuple) -> tuple:
    """The part of a launch's run-time integers a bound kernel's key leaves to Triton's specialisation: s_max,
    the strides, the window."""
    return int_spec(p.s_max, *strides, scalars[2], scalars[3])


@cached
def _bound_split(plan: Plan, B: int, H: int, Hkv: int, Sq: int, D: int, page: int, flags: tuple, spec: tuple):
    """(split-KV kernel, merge kernel or None) of a shape class; ``spec`` (``_spec``) picks Triton's variant."""
    paged, causal, wl, wr, sc, ieee = flags
    split = plan.splits > 1
    kv = BoundKernel(split_kv_kernel, (B * Hkv * plan.row_blocks, plan.splits), dict(
        G=H // Hkv, PAGED=paged, PAGE=max(page, 1), CAUSAL=causal, WINDOW_LEFT=wl, WINDOW_RIGHT=wr, SOFTCAP=sc,
        SPLIT=split, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_D=plan.block_d, FAST=plan.fast, IEEE=ieee,
        NUM_STAGES=plan.num_stages, AHEAD=plan.ahead, BOUND=plan.bound, num_warps=plan.num_warps))
    merge = None
    if split:
        bs = max(1, 1 << (plan.splits - 1).bit_length())
        merge = BoundKernel(merge_splits_kernel, (-(-B * H * Sq // plan.merge_rows),), dict(
            BLOCK_R=plan.merge_rows, BLOCK_S=bs, BLOCK_D=plan.block_d, FAST=plan.fast, num_warps=plan.merge_warps))
    return kv, merge


def _split_launches(plan: Plan, p: Problem, flags: tuple, scalars: tuple, strides: tuple):
    """(split-KV kernel, its trailing arguments, (merge kernel, its trailing arguments) or None) of one problem;
    ``flags`` = (paged, causal, window left, window right, softcap, fp32 inputs), ``scalars`` = (scale, softcap,
    left, right), ``strides`` = q, k, v, block table's row, o."""
    kv, merge = _bound_split(plan, p.B, p.H, p.Hkv, p.Sq, p.D, p.page, flags, _spec(p, scalars, strides))
    head = (p.H, p.Hkv, p.Sq, p.D, plan.splits, plan.row_blocks, p.s_max, *strides, *scalars)
    if merge is not None:
        merge = (merge, (p.B * p.H * p.Sq, p.H, p.Sq, p.D, plan.splits, *strides[-4:]))
    return kv, head, merge


@cached
def _bound_balanced(plan: Plan, B: int, H: int, Hkv: int, Sq: int, D: int, page: int, flags: tuple, spec: tuple):
    """(balanced kernel, segment merge) of a shape class, as ``_bound_split``."""
    paged, causal, wl, wr, sc, ieee = flags
    block_b = max(64, pow2(B))     # one compiled kernel for every B <= 64
    kv = BoundKernel(balanced_kv_kernel, ((1 if plan.cross else Hkv) * plan.row_blocks, plan.splits), dict(
        G=H // Hkv, PAGED=paged, PAGE=max(page, 1), CAUSAL=causal, WINDOW_LEFT=wl, WINDOW_RIGHT=wr, SOFTCAP=sc,
        BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_D=plan.block_d, BLOCK_B=block_b, FAST=plan.fast,
        IEEE=ieee, NUM_STAGES=plan.num_stages, AHEAD=plan.ahead, CROSS=plan.cross, num_warps=plan.num_warps))
    rows = max(1, min(plan.merge_rows, 2048 // block_b))     # its [rows, BLOCK_B] sums stay in registers
    merge = BoundKernel(merge_segments_kernel, (-(-B * H * Sq // rows),), dict(
        WINDOW_LEFT=wl, WINDOW_RIGHT=wr, BLOCK_N=plan.block_n, BLOCK_B=block_b, BLOCK_R=rows,
        BLOCK_D=plan.block_d, FAST=plan.fast, CROSS=plan.cross, num_warps=plan.merge_warps))
    return kv, merge


def _balanced_launches(plan: Plan, p: Problem, flags: tuple, scalars: tuple, strides: tuple):
    """(balanced kernel, its leading arguments), (segment merge, its trailing arguments) of one problem; the
    arguments as ``_split_launches``'."""
    kv, merge = _bound_balanced(plan, p.B, p.H, p.Hkv, p.Sq, p.D, p.page, flags, _spec(p, scalars, strides))
    head = (p.B, p.H, p.Hkv, p.Sq, p.D, plan.splits, plan.row_blocks, p.s_max, *strides[:-4], *scalars)
    tail = (p.B * p.H * p.Sq, p.B, p.H, p.Hkv, p.Sq, p.D, plan.splits, p.s_max, scalars[2], scalars[3],
            *strides[-4:])
    return kv, head, merge, tail


LENGTHS_KEPT = 8            # uniform_lengths' tensors kept: a step's layers share one
_lengths: collections.OrderedDict = collections.OrderedDict()


def uniform_lengths(B: int, S: int, device: torch.device) -> torch.Tensor:
    """int32 ``[B]`` of S (cache_seqlens of a cache whose sequences hold all its S keys), for the kernels to read
    only. The last LENGTHS_KEPT per (device, stream, B, S) are kept: the layers of one decoding step share one, made
    by one fill on the stream that reads it. While a CUDA graph is captured each call makes its own (the graph's
    fill; a kept tensor could be freed while the graph still reads it)."""
    cuda = device.type == "cuda"
    if cuda and torch.cuda.is_current_stream_capturing():
        return torch.full((B,), S, dtype=torch.int32, device=device)
    key = (device, _shared.current_stream(_shared.current_device()) if cuda else None, B, S)
    lens = _lengths.get(key)
    if lens is None:
        lens = _lengths[key] = torch.full((B,), S, dtype=torch.int32, device=device)
        while len(_lengths) > LENGTHS_KEPT:
            _lengths.popitem(last=False)
    return lens


def attention_split_kv(q, k, v, seqlens, block_table, causal: bool, scale: float, left: int, right: int,
                       softcap: float, plan: Plan | None = None, need_lse: bool = True):
    """o ``[B, H, Sq, D]`` (q's dtype) and lse ``[B, H, Sq]`` fp32 by the split-KV kernel (and the merge).
    ``need_lse=False``: the merged lse goes to workspace where the plan merges (returned lse then None)."""
    B, H, Sq, D = q.shape
    paged = block_table is not None
    page = k.shape[2] if paged else 0
    s_max = block_table.shape[1] * page if paged else k.shape[2]
    p = Problem(B, H, k.shape[1], Sq, D, s_max, page, q.element_size())
    plan = plan or cached_plan(p, q.device)
    o = torch.empty((B, H, Sq, D), device=q.device, dtype=q.dtype)
    R = B * H * Sq
    if o.numel() == 0:
        return o, torch.empty((B, H, Sq), device=q.device, dtype=torch.float32).fill_(float("-inf"))
    bt = block_table if paged else seqlens
    flags = (paged, bool(causal), left >= 0, right >= 0, bool(softcap), q.dtype == torch.float32)
    strides = (*q.stride(), *k.stride(), *v.stride(), bt.stride(0), *o.stride())
    scalars = (float(scale), float(softcap or 0.0), int(left), int(right))
    check = (q, k, v, seqlens, bt)
    if plan.balanced:
        kv, head, merge, tail = _balanced_launches(plan, p, flags, scalars, strides)
        rows = H * Sq * (plan.splits + B - 1)
        part_o, part_lse, lse = stream_scratch("decode", q.device, (
            (rows * D, torch.float32), (rows, torch.float32), (0 if need_lse else R, torch.float32)), zeroed=0)
        if need_lse:
            lse = torch.empty((B, H, Sq), device=q.device, dtype=torch.float32)
        kv((q, k, v, seqlens, bt, part_o, part_lse, *head), check, q.device)
        merge((part_o, part_lse, seqlens, o, lse, *tail), (o, seqlens), q.device)
        return o, lse if need_lse else None
    kv, head, merge = _split_launches(plan, p, flags, scalars, strides)
    if merge is None:
        lse = torch.empty((B, H, Sq), device=q.device, dtype=torch.float32)
        kv((q, k, v, seqlens, bt, o, lse, o, lse, *head), check, q.device)
        return o, lse if need_lse else None
    part_o, part_lse, lse = stream_scratch("decode", q.device, (
        (R * plan.splits * D, torch.float32), (R * plan.splits, torch.float32), (0 if need_lse else R, torch.float32)),
        zeroed=0)
    if need_lse:
        lse = torch.empty((B, H, Sq), device=q.device, dtype=torch.float32)
    kv((q, k, v, seqlens, bt, o, lse, part_o, part_lse, *head), check, q.device)
    bound, margs = merge
    bound((part_o, part_lse, o, lse, *margs), (o,), q.device)     # o: q's dtype, which the cache key leaves out
    return o, lse if need_lse else None


@cached
def cached_merge_plan(N: int, D: int, device: torch.device) -> MergePlan:
    return merge_plan(N, D, target_of(device))


@cached
def _merge_launch(plan: MergePlan, N: int, D: int, strides: tuple) -> tuple:
    grid = (-(-N // plan.block_r),)
    return BoundKernel(merge_two_kernel, grid, dict(BLOCK_R=plan.block_r, BLOCK_D=plan.block_d, FAST=plan.fast,
                                                    num_warps=plan.num_warps)), (N, D, *strides)


def merge_states(o_a, lse_a, o_b, lse_b, plan: MergePlan | None = None):
    """(o_a, lse_a) ⊕ (o_b, lse_b) by the Triton kernel: o in o_a's dtype, lse fp32, o_a's shape."""
    D = o_a.shape[-1]
    N = o_a.numel() // D if D else 0
    o = torch.empty(o_a.shape, device=o_a.device, dtype=o_a.dtype)
    lse = torch.empty(o_a.shape[:-1], device=o_a.device, dtype=torch.float32)
    if N == 0:
        return o, lse
    a, b = o_a.reshape(N, D), o_b.reshape(N, D)
    la, lb = lse_a.reshape(N), lse_b.reshape(N)
    plan = plan or cached_merge_plan(N, D, o_a.device)
    bound, tail = _merge_launch(plan, N, D, (*a.stride(), la.stride(0), *b.stride(), lb.stride(0)))
    bound((a, la, b, lb, o, lse, *tail), (a, la, b, lb), o_a.device)
    return o, lse
