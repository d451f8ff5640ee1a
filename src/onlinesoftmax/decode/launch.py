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
from .._triton.launch import BoundKernel, cached, raw_launches, stream_scratch
from ..target import target_of
from .kernels.merge import merge_segments_kernel, merge_splits_kernel, merge_two_kernel
from .kernels.split_kv import balanced_kv_kernel, split_kv_kernel
from .plan import MergePlan, Plan, Problem, decode_plan, merge_plan


@cached
def _plan(B: int, H: int, Hkv: int, Sq: int, D: int, s_max: int, page: int, esize: int, full: bool,
          device: torch.device) -> Plan:
    return decode_plan(Problem(B, H, Hkv, Sq, D, s_max, page, esize, full), target_of(device))


def cached_plan(p: Problem, device: torch.device) -> Plan:
    """``decode_plan(p, target_of(device))``, cached per class of 16 lengths: the plan reads s_max only as whole key
    tiles (``cdiv(s_max, block_n)``, block_n a power of two >= 16), so s_max rounded up to 16 plans the same."""
    return _plan(p.B, p.H, p.Hkv, p.Sq, p.D, -(-p.s_max // 16) * 16, p.page, p.esize, p.full, device)


# The merges load MERGE_STEP splits (MERGE_SEGMENTS segments) of a row block at once, lse and o together: one round
# trip to memory per step, on MERGE_TILE fp32 of o per program (16 per thread of 4 warps); the segment merge takes
# one sequence's rows per program (its place on the line found once, not per row). H200, full lengths, µs per merge
# (tools/probe_merge_seg.py, probe_decode_prof.py): splits 2.1-2.6 against 5.2-6.0 for the loop before (each step
# waited on a state's lse to mask its o), segments 3.5-4.6 against 5.6-9.4 (SDPA cuDNN's reduction 2.1-2.4)
MERGE_STEP, MERGE_SEGMENTS, MERGE_TILE = 16, 2, 2048


@cached
def _bound_split(plan: Plan, B: int, H: int, Hkv: int, Sq: int, D: int, page: int, flags: tuple, spec: tuple):
    """(split-KV kernel, merge kernel or None) of a shape class; ``spec`` (``int_spec`` of the run-time integers a
    shape class leaves free: s_max, the strides, the window) picks Triton's variant."""
    paged, causal, wl, wr, sc, ieee = flags
    split = plan.splits > 1
    kv = BoundKernel(split_kv_kernel, (B * Hkv * plan.row_blocks, plan.splits), dict(
        G=H // Hkv, PAGED=paged, PAGE=max(page, 1), CAUSAL=causal, WINDOW_LEFT=wl, WINDOW_RIGHT=wr, SOFTCAP=sc,
        SPLIT=split, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_D=plan.block_d, FAST=plan.fast, IEEE=ieee,
        NUM_STAGES=plan.num_stages, AHEAD=plan.ahead, BOUND=plan.bound, num_warps=plan.num_warps,
        **({"maxnreg": plan.maxnreg} if plan.maxnreg else {})))
    merge = None
    if split:
        bs = min(pow2(plan.splits), MERGE_STEP)
        rows = max(1, min(plan.merge_rows, MERGE_TILE // (bs * plan.block_d)))
        merge = BoundKernel(merge_splits_kernel, (-(-B * H * Sq // rows),), dict(
            BLOCK_R=rows, BLOCK_S=bs, BLOCK_D=plan.block_d, FAST=plan.fast, num_warps=plan.merge_warps))
    return kv, merge


@cached
def _bound_balanced(plan: Plan, B: int, H: int, Hkv: int, Sq: int, D: int, page: int, flags: tuple, spec: tuple):
    """(balanced kernel, segment merge) of a shape class, as ``_bound_split``."""
    paged, causal, wl, wr, sc, ieee = flags
    block_b = max(64, pow2(B))     # one compiled kernel for every B <= 64
    kv = BoundKernel(balanced_kv_kernel, ((1 if plan.cross else Hkv) * plan.row_blocks, plan.splits), dict(
        G=H // Hkv, PAGED=paged, PAGE=max(page, 1), CAUSAL=causal, WINDOW_LEFT=wl, WINDOW_RIGHT=wr, SOFTCAP=sc,
        BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_D=plan.block_d, BLOCK_B=block_b, FAST=plan.fast,
        IEEE=ieee, NUM_STAGES=plan.num_stages, AHEAD=plan.ahead, CROSS=plan.cross, num_warps=plan.num_warps,
        **({"maxnreg": plan.maxnreg} if plan.maxnreg else {})))
    rows = max(1, min(plan.merge_rows, pow2(H * Sq), MERGE_TILE // (MERGE_SEGMENTS * plan.block_d)))
    merge = BoundKernel(merge_segments_kernel, (B, -(-H * Sq // rows)), dict(
        WINDOW_LEFT=wl, WINDOW_RIGHT=wr, BLOCK_N=plan.block_n, BLOCK_B=block_b, BLOCK_R=rows,
        BLOCK_D=plan.block_d, FAST=plan.fast, CROSS=plan.cross, BLOCK_K=MERGE_SEGMENTS, num_warps=plan.merge_warps))
    return kv, merge


# the tensors of a call, in the order the launches' ``check`` indices count: q, k, v, lengths, block table (the
# lengths again for a dense cache), o
KV_CHECK, MERGE_CHECK, O_CHECK = (0, 1, 2, 3, 4), (5, 3), (5,)


def _launches(plan: Plan, p: Problem, flags: tuple, scalars: tuple, qst: tuple, ost: tuple, spec: tuple) -> tuple:
    """The launches of a shape class: ``(kernel, args, check)`` each, ``args(q, k, v, lens, bt, o, lse, part_o,
    part_lse, s_max, k strides, v strides, block table's row stride)`` its run-time arguments (tensors, or ints of
    their ``data_ptr()``), ``check`` the indices of the call's tensors whose alignment and dtypes pick the compiled
    kernel (KV_CHECK ...). ``flags`` = (paged, causal, window left, window right, softcap, fp32 inputs), ``scalars`` =
    (scale, softcap, left, right), ``qst`` / ``ost`` q's and o's strides, ``spec`` :func:`_spec`'s: what the class
    fixes; the cache's length and strides go to ``args``."""
    B, H, Hkv, Sq, D = p.B, p.H, p.Hkv, p.Sq, p.D
    splits, rb, R = plan.splits, plan.row_blocks, B * H * Sq
    left, right = scalars[2], scalars[3]
    if plan.balanced:
        kv, merge = _bound_balanced(plan, B, H, Hkv, Sq, D, p.page, flags, spec)

        def kv_args(q, k, v, lens, bt, o, lse, po, pl, s_max, kst, vst, bts):
            return (q, k, v, lens, bt, po, pl, B, H, Hkv, Sq, D, splits, rb, s_max, *qst, *kst, *vst, bts, *scalars)

        def merge_args(q, k, v, lens, bt, o, lse, po, pl, s_max, kst, vst, bts):
            return (po, pl, lens, o, lse, B, H, Hkv, Sq, D, splits, s_max, left, right, *ost)
        return (kv, kv_args, KV_CHECK), (merge, merge_args, MERGE_CHECK)
    kv, merge = _bound_split(plan, B, H, Hkv, Sq, D, p.page, flags, spec)
    if merge is None:           # one split writes o and lse itself
        def direct_args(q, k, v, lens, bt, o, lse, po, pl, s_max, kst, vst, bts):
            return (q, k, v, lens, bt, o, lse, o, lse, H, Hkv, Sq, D, splits, rb, s_max, *qst, *kst, *vst, bts, *ost,
                    *scalars)
        return ((kv, direct_args, KV_CHECK),)

    def split_args(q, k, v, lens, bt, o, lse, po, pl, s_max, kst, vst, bts):
        return (q, k, v, lens, bt, o, lse, po, pl, H, Hkv, Sq, D, splits, rb, s_max, *qst, *kst, *vst, bts, *ost,
                *scalars)

    def merge_args(q, k, v, lens, bt, o, lse, po, pl, s_max, kst, vst, bts):
        return (po, pl, o, lse, R, H, Sq, D, splits, *ost)
    return (kv, split_args, KV_CHECK), (merge, merge_args, O_CHECK)    # merge: o's dtype, which the key leaves out


def _spec(s_max: int, qst: tuple, kst: tuple, vst: tuple, bts: int, ost: tuple, left: int, right: int) -> tuple:
    """The part of a launch's run-time integers a bound kernel's key leaves to Triton's specialisation: s_max,
    the strides, the window."""
    return int_spec(s_max, *qst, *kst, *vst, bts, *ost, left, right)


def _workspace(plan: Plan, p: Problem, need_lse: bool, device: torch.device) -> tuple:
    """(partial o, partial lse, lse): the partial states (the balanced kernel's segments or the splits') and, where
    the caller wants no lse, the merged one's; per (device, stream), written before read."""
    R = p.B * p.H * p.Sq
    rows = p.H * p.Sq * (plan.splits + p.B - 1) if plan.balanced else (R * plan.splits if plan.splits > 1 else 0)
    return stream_scratch("decode", device, ((rows * p.D, torch.float32), (rows, torch.float32),
                                             (0 if need_lse else R, torch.float32)), zeroed=0)


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
    """o ``[B, H, Sq, D]`` (q's dtype) and lse ``[B, H, Sq]`` fp32 by the split-KV kernel (and the merge), through
    ``BoundKernel`` with tensors (the route :class:`DecodeCall` binds; ``plan``: any plan, knobs included).
    ``need_lse=False``: the merged lse goes to workspace (returned lse then None)."""
    B, H, Sq, D = q.shape
    paged = block_table is not None
    page = k.shape[2] if paged else 0
    s_max = block_table.shape[1] * page if paged else k.shape[2]
    p = Problem(B, H, k.shape[1], Sq, D, s_max, page, q.element_size())
    plan = plan or cached_plan(p, q.device)
    o = torch.empty((B, H, Sq, D), device=q.device, dtype=q.dtype)
    if o.numel() == 0:
        return o, torch.empty((B, H, Sq), device=q.device, dtype=torch.float32).fill_(float("-inf"))
    bt = block_table if paged else seqlens
    flags = (paged, bool(causal), left >= 0, right >= 0, bool(softcap), q.dtype == torch.float32)
    qst, kst, vst, bts, ost = q.stride(), k.stride(), v.stride(), bt.stride(0), o.stride()
    scalars = (float(scale), float(softcap or 0.0), int(left), int(right))
    launches = _launches(plan, p, flags, scalars, qst, ost, _spec(s_max, qst, kst, vst, bts, ost, left, right))
    part_o, part_lse, lse = _workspace(plan, p, need_lse, q.device)
    if need_lse:
        lse = torch.empty((B, H, Sq), device=q.device, dtype=torch.float32)
    call = (q, k, v, seqlens, bt, o)
    for kern, args, check in launches:
        kern(args(q, k, v, seqlens, bt, o, lse, part_o, part_lse, s_max, kst, vst, bts), tuple(call[i] for i in check),
             q.device)
    return o, lse if need_lse else None


def _wide(strides: tuple, D: int, page: int) -> bool:
    """``wide_tiles`` of a cache with these strides: the kernels' 32-bit offsets within a tile (the head dim, and a
    page's slots) could pass 2^31 (a head-dim-outermost cache of more than 2^31 / D rows)."""
    return (D - 1) * strides[3] + max(page - 1, 0) * strides[2] >= 2**31


LENGTHS_TABLE_BYTES = 1 << 18   # a full cache's lengths: rows of lengths S, S + 1, ... kept per bound call
BOUND_KEPT = 1024               # a DecodeCall's classes of 16 lengths kept (then all dropped): 16K keys of growth


class _Bound:
    """A :class:`DecodeCall`'s launches for one class of 16 cache lengths and one specialisation of the cache's
    strides: the plan's launches, and after the first aligned call on CUDA their lanes (C launcher, its head around
    the stream, the argument builder, the constexprs) and the workspace pointers they take."""

    __slots__ = ("plan", "problem", "launches", "lanes", "ws", "ptrs")

    def __init__(self, plan: Plan, problem: Problem, launches: tuple):
        self.plan, self.problem, self.launches = plan, problem, launches
        self.lanes = self.ws = self.ptrs = None


class DecodeCall:
    """The launches of one decode shape class (q's shape and strides, the cache's heads and page size, dtype,
    device, stream, masking, scale, whether lse is returned, a full cache or given lengths), bound once, whatever the
    cache's length: a decoding loop whose cache grows by one key a step calls the same one every step.

    Per call: o (and lse) allocated, the cache's s_max and strides read, the launches of their class
    (:class:`_Bound`, per class of 16 lengths, ``int_spec`` of the strides and whether the cache is full: a full one
    splits per sequence; the last call's kept) found. The first call of a class (and a misaligned pointer, a
    capture, the interpreter, launch hooks) runs them through ``BoundKernel`` with tensors; after it, on CUDA, each
    launch's C launcher gets every pointer as an int (no ``data_ptr`` call or driver query of a pointer's attributes
    in Triton's launcher) and its arguments from the builder ``_launches`` gave.

    ``full``: the lengths of a full cache (every sequence holds all S keys, ``oss.attention``) are read from a table
    whose row i holds S0 + i (B of them, padded to 16 bytes), made once for LENGTHS_TABLE_BYTES of rows: the call
    passes a pointer into it, not a fill of its own (a CUDA graph capture takes ``uniform_lengths``' fill)."""

    __slots__ = ("B", "H", "Hkv", "Sq", "D", "page", "esize", "dtype", "device", "flags", "scalars", "qst", "ost",
                 "need_lse", "bound", "last", "table")

    def __init__(self, q: torch.Tensor, Hkv: int, page: int, flags: tuple, scalars: tuple, need_lse: bool):
        self.B, self.H, self.Sq, self.D = q.shape
        self.Hkv, self.page, self.esize, self.dtype, self.device = Hkv, page, q.element_size(), q.dtype, q.device
        self.flags, self.scalars, self.qst, self.need_lse = flags, scalars, q.stride(), need_lse
        self.ost = (self.H * self.Sq * self.D, self.Sq * self.D, self.D, 1)      # o: contiguous
        self.bound: dict = {}
        self.last = None        # ((s_max, k strides, v strides, table stride, full), _Bound) of the last call
        self.table = None       # full cache: (lengths table [rows, Bp], S0, S0 + rows, data_ptr, bytes per row)

    def __call__(self, q, k, v, lens, bt, stream, capturing: bool):
        """(o, lse or None) of q over the cache ``k``, ``v``: ``lens`` the lengths (None: a full cache), ``bt`` the
        block table (None: dense), on ``stream`` (the raw current CUDA stream, None elsewhere; the call's key)."""
        B, H, Sq, D, dev = self.B, self.H, self.Sq, self.D, self.device
        o = torch.empty((B, H, Sq, D), device=dev, dtype=self.dtype)
        lse = torch.empty((B, H, Sq), device=dev, dtype=torch.float32) if self.need_lse else None
        if self.page:
            s_max, bts = bt.shape[1] * self.page, bt.stride(0)
        else:
            s_max, bts = k.shape[2], 1
        kst, vst = k.stride(), v.stride()
        full = lens is None
        ints = (s_max, kst, vst, bts, full)
        last = self.last
        if last is not None and last[0] == ints:
            bound = last[1]
        else:
            if _wide(kst, D, self.page) or _wide(vst, D, self.page):      # rare: contiguous copies of the cache
                return self(q, k.contiguous(), v.contiguous(), lens, bt, stream, capturing)
            key = (s_max + 15) >> 4, int_spec(s_max, *kst, *vst, bts), full
            bound = self.bound.get(key)
            if bound is None:
                if len(self.bound) >= BOUND_KEPT:
                    self.bound.clear()
                bound = self.bound[key] = self._bind(s_max, kst, vst, bts, full)
            self.last = (ints, bound)
        lanes = bound.lanes
        if lanes is not None and not capturing:
            qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
            if lens is None:
                t = self.table
                if t is None or not t[1] <= s_max < t[2]:
                    t = self._new_table(s_max)
                lp = t[3] + (s_max - t[1]) * t[4]
            else:
                lp = lens.data_ptr()
            bp = lp if bt is None else bt.data_ptr()
            if not (qp | kp | vp | lp | bp) & 15 and not _shared.hooks_installed():
                po, pl, pw = bound.ptrs
                op = o.data_ptr()
                sp = pw if lse is None else lse.data_ptr()
                for launch, h1, h2, args, tail in lanes:
                    launch(*h1, stream, *h2, *args(qp, kp, vp, lp, bp, op, sp, po, pl, s_max, kst, vst, bts), *tail)
                return o, lse
        self._launch_bound(bound, q, k, v, lens, bt, o, lse, s_max, kst, vst, bts, capturing)
        return o, lse

    def _bind(self, s_max: int, kst: tuple, vst: tuple, bts: int, full: bool) -> _Bound:
        p = Problem(self.B, self.H, self.Hkv, self.Sq, self.D, s_max, self.page, self.esize, full)
        plan = cached_plan(p, self.device)
        left, right = self.scalars[2], self.scalars[3]
        spec = _spec(s_max, self.qst, kst, vst, bts, self.ost, left, right)
        return _Bound(plan, p, _launches(plan, p, self.flags, self.scalars, self.qst, self.ost, spec))

    def _new_table(self, S: int) -> tuple:
        """The lengths table from S0 = S less a quarter of its rows (a loop that restarts a little shorter stays in
        it): made by one arange and one copy on the call's stream."""
        Bp = -(-self.B // 4) * 4                # rows of 16 bytes: every row's pointer is aligned
        rows = max(64, LENGTHS_TABLE_BYTES // (4 * Bp))
        first = max(0, S - rows // 4)
        tab = torch.arange(first, first + rows, device=self.device, dtype=torch.int32)[:, None].expand(rows, Bp)
        tab = tab.contiguous()
        self.table = (tab, first, first + rows, tab.data_ptr(), 4 * Bp)
        return self.table

    def _launch_bound(self, bound: _Bound, q, k, v, lens, bt, o, lse, s_max, kst, vst, bts, capturing: bool):
        """Through ``BoundKernel`` with tensors (a capture: its own workspace and lengths); then, on CUDA and outside a
        capture, binds the lanes of later aligned calls."""
        dev = self.device
        if lens is None:
            if capturing:
                lens = uniform_lengths(self.B, s_max, dev)
            else:
                t = self.table
                if t is None or not t[1] <= s_max < t[2]:
                    t = self._new_table(s_max)
                lens = t[0][s_max - t[1], :self.B]
        if bt is None:
            bt = lens
        ws = _workspace(bound.plan, bound.problem, self.need_lse, dev)
        po, pl, pw = ws
        call = (q, k, v, lens, bt, o)
        sl = pw if lse is None else lse
        for kern, args, check in bound.launches:
            kern(args(q, k, v, lens, bt, o, sl, po, pl, s_max, kst, vst, bts), tuple(call[i] for i in check), dev)
        if capturing or not raw_launches(dev) or bound.lanes is not None or any(t.data_ptr() & 15 for t in call):
            return
        index = _shared.current_device()
        dtypes = tuple(t.dtype for t in call)
        raw = [kern.entry((index, True, *(dtypes[i] for i in check))) for kern, _, check in bound.launches]
        if any(r is None for r in raw):
            return
        bound.ws, bound.ptrs = ws, tuple(t.data_ptr() for t in ws)      # held: the lanes' pointers stay valid
        bound.lanes = tuple((launch, head[:3], head[3:], args, tail)
                            for (launch, head, tail), (_, args, _) in zip(raw, bound.launches))


CALLS_KEPT = 256        # bound shape classes kept (then all dropped: a model has a handful)
_calls: dict = {}


def attention_decode(q, k, v, lens, block_table, causal: bool, scale: float, left: int, right: int, softcap: float,
                     need_lse: bool):
    """(o, lse or None) of ``attention_with_kvcache`` (``lens`` None: over all S keys of every sequence of the dense
    ``k``, ``v`` ``[B, Hkv, S, D]``, ``oss.attention``'s decode dispatch) by the shape class's :class:`DecodeCall`;
    the arguments checked by the caller. An empty q runs :func:`attention_split_kv`."""
    if lens is not None and lens.stride(0) != 1 and lens.shape[0] > 1:
        lens = lens.contiguous()            # the kernels read lengths[b] at b, block_table[b, i] at b·stride + i
    if block_table is not None and block_table.stride(1) != 1 and block_table.shape[1] > 1:
        block_table = block_table.contiguous()
    if not q.numel():
        if lens is None:
            lens = uniform_lengths(q.shape[0], k.shape[2], q.device)
        o, lse = attention_split_kv(q, k, v, lens, block_table, causal, scale, left, right, softcap,
                                    need_lse=need_lse)
        return o, lse
    stream, capturing, index = None, False, None
    if q.is_cuda:
        index = _shared.current_device()
        stream = _shared.current_stream(index)
        capturing = torch._C._cuda_isCurrentStreamCapturing()
    paged = block_table is not None
    page = k.shape[2] if paged else 0
    key = (q.shape, q.stride(), k.shape[1], page, q.dtype, q.device, index, stream, causal, scale, left, right,
           softcap, need_lse)
    call = _calls.get(key)
    if call is None:
        if len(_calls) >= CALLS_KEPT:
            _calls.clear()
        flags = (paged, bool(causal), left >= 0, right >= 0, bool(softcap), q.dtype == torch.float32)
        if (q.shape[3] - 1) * q.stride(3) >= 2**31:    # head-dim offsets past 32 bits (wide_tiles): rare, a copy
            return attention_decode(q.contiguous(), k, v, lens, block_table, causal, scale, left, right, softcap,
                                    need_lse)
        call = _calls[key] = DecodeCall(q, k.shape[1], page, flags, (float(scale), float(softcap or 0.0), int(left),
                                                                     int(right)), need_lse)
    return call(q, k, v, lens, block_table, stream, capturing)


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
    a, b = (t.contiguous() if (D - 1) * t.stride(1) >= 2**31 else t       # head-dim offsets past 32 bits
            for t in (o_a.reshape(N, D), o_b.reshape(N, D)))
    la, lb = lse_a.reshape(N), lse_b.reshape(N)
    plan = plan or cached_merge_plan(N, D, o_a.device)
    bound, tail = _merge_launch(plan, N, D, (*a.stride(), la.stride(0), *b.stride(), lb.stride(0)))
    bound((a, la, b, lb, o, lse, *tail), (a, la, b, lb), o_a.device)
    return o, lse
