"""Decode plans bound to their kernels: the launches of a problem built once (``cached``, ``BoundKernel``), the
partial-state workspace per stream (``stream_scratch``: graph-safe, written before it is read)."""

from __future__ import annotations

import torch

from .._triton.host import pow2
from .._triton.launch import BoundKernel, cached, stream_scratch
from ..target import target_of
from .kernels.merge import merge_segments_kernel, merge_splits_kernel, merge_two_kernel
from .kernels.split_kv import balanced_kv_kernel, split_kv_kernel
from .plan import MergePlan, Plan, Problem, decode_plan, merge_plan


@cached
def cached_plan(p: Problem, device: torch.device) -> Plan:
    return decode_plan(p, target_of(device))


@cached
def _split_launches(plan: Plan, p: Problem, flags: tuple, scalars: tuple, strides: tuple):
    """(split-KV kernel, merge kernel or None) of one problem; ``flags`` = (paged, causal, window left, window
    right, softcap, fp32 inputs), ``scalars`` = (scale, softcap, left, right), ``strides`` = q, k, v, block
    table's row, o."""
    paged, causal, wl, wr, sc, ieee = flags
    split = plan.splits > 1
    grid = (p.B * p.Hkv * plan.row_blocks, plan.splits)
    kv = BoundKernel(split_kv_kernel, grid, dict(
        G=p.group, PAGED=paged, PAGE=max(p.page, 1), CAUSAL=causal, WINDOW_LEFT=wl, WINDOW_RIGHT=wr, SOFTCAP=sc,
        SPLIT=split, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_D=plan.block_d, FAST=plan.fast, IEEE=ieee,
        NUM_STAGES=plan.num_stages, AHEAD=plan.ahead, BOUND=plan.bound, num_warps=plan.num_warps))
    head = (p.H, p.Hkv, p.Sq, p.D, plan.splits, plan.row_blocks, p.s_max, *strides, *scalars)
    merge = None
    if split:
        R = p.B * p.H * p.Sq
        bs = max(1, 1 << (plan.splits - 1).bit_length())
        merge = BoundKernel(merge_splits_kernel, (-(-R // plan.merge_rows),), dict(
            BLOCK_R=plan.merge_rows, BLOCK_S=bs, BLOCK_D=plan.block_d, FAST=plan.fast, num_warps=plan.merge_warps))
        merge = (merge, (R, p.H, p.Sq, p.D, plan.splits, *strides[-4:]))
    return kv, head, merge


@cached
def _balanced_launches(plan: Plan, p: Problem, flags: tuple, scalars: tuple, strides: tuple):
    """(balanced kernel, its leading arguments), (segment merge, its trailing arguments) of one problem; the
    arguments as ``_split_launches``'."""
    paged, causal, wl, wr, sc, ieee = flags
    block_b = max(64, pow2(p.B))     # one compiled kernel for every B <= 64
    kv = BoundKernel(balanced_kv_kernel, ((1 if plan.cross else p.Hkv) * plan.row_blocks, plan.splits), dict(
        G=p.group, PAGED=paged, PAGE=max(p.page, 1), CAUSAL=causal, WINDOW_LEFT=wl, WINDOW_RIGHT=wr, SOFTCAP=sc,
        BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_D=plan.block_d, BLOCK_B=block_b, FAST=plan.fast,
        IEEE=ieee, NUM_STAGES=plan.num_stages, AHEAD=plan.ahead, CROSS=plan.cross, num_warps=plan.num_warps))
    head = (p.B, p.H, p.Hkv, p.Sq, p.D, plan.splits, plan.row_blocks, p.s_max, *strides[:-4], *scalars)
    R = p.B * p.H * p.Sq
    rows = max(1, min(plan.merge_rows, 2048 // block_b))     # its [rows, BLOCK_B] sums stay in registers
    merge = BoundKernel(merge_segments_kernel, (-(-R // rows),), dict(
        WINDOW_LEFT=wl, WINDOW_RIGHT=wr, BLOCK_N=plan.block_n, BLOCK_B=block_b, BLOCK_R=rows,
        BLOCK_D=plan.block_d, FAST=plan.fast, CROSS=plan.cross, num_warps=plan.merge_warps))
    tail = (R, p.B, p.H, p.Hkv, p.Sq, p.D, plan.splits, p.s_max, scalars[2], scalars[3], *strides[-4:])
    return kv, head, merge, tail


def attention_split_kv(q, k, v, seqlens, block_table, causal: bool, scale: float, left: int, right: int,
                       softcap: float, plan: Plan | None = None):
    """o ``[B, H, Sq, D]`` (q's dtype) and lse ``[B, H, Sq]`` fp32 by the split-KV kernel (and the merge)."""
    B, H, Sq, D = q.shape
    paged = block_table is not None
    s_max = block_table.shape[1] * k.shape[2] if paged else k.shape[2]
    p = Problem(B, H, k.shape[1], Sq, D, s_max, k.shape[2] if paged else 0, q.element_size())
    plan = plan or cached_plan(p, q.device)
    o = torch.empty((B, H, Sq, D), device=q.device, dtype=q.dtype)
    lse = torch.empty((B, H, Sq), device=q.device, dtype=torch.float32)
    if o.numel() == 0:
        return o, lse.fill_(float("-inf"))
    bt = block_table if paged else seqlens
    flags = (paged, bool(causal), left >= 0, right >= 0, bool(softcap), q.dtype == torch.float32)
    strides = (*q.stride(), *k.stride(), *v.stride(), bt.stride(0), *o.stride())
    kv, head, merge = _split_launches(plan, p, flags, (float(scale), float(softcap or 0.0), int(left), int(right)),
                                      strides)
    check = (q, k, v, seqlens, bt)
    if plan.balanced:
        return _balanced(plan, p, flags, scale, softcap, left, right, strides, q, k, v, seqlens, bt, o, lse)
    if merge is None:
        kv((q, k, v, seqlens, bt, o, lse, o, lse, *head), check, q.device)
        return o, lse
    R = B * H * Sq
    part_o, part_lse = stream_scratch("decode", q.device, ((R * plan.splits * D, torch.float32),
                                                          (R * plan.splits, torch.float32)), zeroed=0)
    kv((q, k, v, seqlens, bt, o, lse, part_o, part_lse, *head), check, q.device)
    bound, margs = merge
    bound((part_o, part_lse, o, lse, *margs), (o,), q.device)     # o: q's dtype, which the cache key leaves out
    return o, lse


def _balanced(plan, p, flags, scale, softcap, left, right, strides, q, k, v, seqlens, bt, o, lse):
    """The balanced schedule: segments of every chunk into H·Sq rows of CHUNKS + B − 1 slots, then their ⊕."""
    kv, head, merge, tail = _balanced_launches(plan, p, flags, (float(scale), float(softcap or 0.0), int(left),
                                                                int(right)), strides)
    rows = p.H * p.Sq * (plan.splits + p.B - 1)
    part_o, part_lse = stream_scratch("decode", q.device, ((rows * p.D, torch.float32), (rows, torch.float32)),
                                      zeroed=0)
    kv((q, k, v, seqlens, bt, part_o, part_lse, *head), (q, k, v, seqlens, bt), q.device)
    merge((part_o, part_lse, seqlens, o, lse, *tail), (o,), q.device)
    return o, lse


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
