"""A softmax-family plan bound to its kernels: the launches, their run-time arguments and the workspace they need,
built once per problem (``cached``) and then run with a few µs of host time."""

from __future__ import annotations

import torch
import triton.language as tl

from .._triton.host import int_spec
from .._triton.launch import (
    BoundKernel,
    cached,
    current_device,
    current_stream,
    hooks_installed,
    pow2,
    raw_launches,
    stream_scratch,
)
from ..target import Target, target_of
from .geometry import row_geometry_of, rows_or_copy
from .kernels.bf16x2 import softmax_bwd_coop_bf16x2_kernel, softmax_coop_bf16x2_kernel
from .kernels.chunks import softmax_bwd_chunks_kernel, softmax_chunks_kernel
from .kernels.logsumexp import logsumexp_rows_pipe_kernel, logsumexp_stream_kernel
from .kernels.rows import softmax_bwd_rows_kernel, softmax_rows_kernel
from .kernels.smem import softmax_bwd_coop_smem_kernel, softmax_coop_smem_kernel
from .plan import (
    LOGSUMEXP,
    NO_KNOBS,
    SOFTMAX,
    Backward,
    Forward,
    Knobs,
    Plan,
    backward_plan,
    forward_plan,
)


def exp_level(fast: bool, mode: int, out_dtype: torch.dtype) -> int:
    """FAST of a forward kernel: 0 (tl.exp), 1 (ex2.approx.ftz) or 2 (ex2.approx.ftz with the product's rounding
    compensated) where softmax writes fp32 e^(x - m) as its output (see ``_triton.online._exp``)."""
    return (2 if mode == SOFTMAX and out_dtype == torch.float32 else 1) if fast else 0


def _acc(*dtypes) -> tl.dtype:
    return tl.float64 if torch.float64 in dtypes else tl.float32


def _bwd_sum(*dtypes) -> tl.dtype:
    """The backward's sum: fp64 when any tensor is fp32 or fp64 (its terms cancel: kernels/common.py `_grad_sum`),
    fp32 for 16-bit ones."""
    return tl.float64 if {torch.float32, torch.float64} & set(dtypes) else tl.float32


def _phases(path: str) -> tuple:
    """coop: one launch (PHASE 0); split: publish (1), then finish (2); logsumexp's chunks: publish (1)."""
    return (0,) if path == "coop" else (1,) if path == "chunks" else (1, 2)


def _opt(maxnreg: int) -> dict:
    return {"maxnreg": maxnreg} if maxnreg else {}


class Launch:
    """A plan's bound kernels (in order), the run-time arguments after the tensors, and its workspace:
    ``(rows, parts, partial-state dtype, the order the kernels take the views in)`` or None.

    The first call on a CUDA device goes through each :class:`BoundKernel` (Triton compiles and binds from the
    tensors); later calls there take ``lanes[device index]``: the kernels' C launchers called straight, with every
    pointer as an int (``data_ptr()``: the launcher then neither calls it nor asks the driver about the pointer)."""

    __slots__ = ("plan", "kernels", "scalars", "workspace", "lanes", "pair")

    def __init__(self, plan: Plan, kernels: list, scalars: tuple, workspace):
        self.plan, self.kernels, self.scalars, self.workspace = plan, kernels, scalars, workspace
        self.lanes: dict = {}
        self.pair = self._pair          # pair(x, y): the launch on tensors (x, y); see _direct

    def _pair(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self((x, y), x.device)

    def __call__(self, tensors: tuple, device: torch.device) -> None:
        lanes = self.lanes
        if lanes and not hooks_installed():
            index = current_device()
            lane = lanes.get(index)
            if lane is not None:
                ptrs = [t.data_ptr() for t in tensors]
                if self.workspace is not None:
                    rows, parts, dtype, pick = self.workspace
                    ws = workspace(device, rows, parts, dtype)
                    ptrs += [ws[i].data_ptr() for i in pick]
                stream = current_stream(index)
                for launch, head3, head9, tail in lane:
                    launch(*head3, stream, *head9, *ptrs, *self.scalars, *tail)
                return
        args = tensors
        if self.workspace is not None:
            rows, parts, dtype, pick = self.workspace
            ws = workspace(device, rows, parts, dtype)
            args = args + tuple(ws[i] for i in pick)
        args = args + self.scalars
        for bound in self.kernels:
            bound(args, (), device)     # nothing to check: the problem fixes the tensors' dtypes and alignment
        if raw_launches(device):
            index = current_device()
            lane = tuple(bound.lane(index) for bound in self.kernels)
            if None not in lane:
                lanes[index] = lane
                if len(lane) == 1 and self.workspace is None and len(args) == 2 + len(self.scalars):
                    self.pair = _direct(index, *lane[0], self.scalars, self._pair)


def _direct(index: int, run, head3: tuple, head9: tuple, tail: tuple, scalars: tuple, fallback):
    """``pair(x, y)`` of a one-kernel launch without workspace bound on device ``index``: its C launcher called
    with x's and y's pointers as ints, the scalars and the constexpr tail (the eager softmax's fast path; what
    ``Launch.__call__`` does on a lane, without its loops). Launch hooks or another current device: ``fallback``."""
    rest = scalars + tail

    def pair(x: torch.Tensor, y: torch.Tensor) -> None:
        if hooks_installed() or current_device() != index:
            fallback(x, y)
        else:
            run(*head3, current_stream(index), *head9, x.data_ptr(), y.data_ptr(), *rest)

    return pair


def workspace(device: torch.device, rows: int, parts: int, dtype: torch.dtype):
    """Barrier words (ARRIVE, GEN: int32 per row) and partial-state buffers (PART_M, PART_D: ``parts`` each).

    Every launch leaves ARRIVE as it found it (0) and writes the partial states it reads, so the buffers are cached
    per (device, stream) and reused without a memset (``stream_scratch``); only the barrier words start zeroed (GEN
    may hold any value)."""
    rows, parts = max(rows, 1024), max(parts, 1 << 16)
    return stream_scratch(("softmax", dtype), device,
                          ((rows, torch.int32), (rows, torch.int32), (parts, dtype), (parts, dtype)), zeroed=2)


def bind_forward(p: Forward, plan: Plan, target: Target) -> Launch:
    geo_x, geo_y = p.geo_x, p.geo_y
    fast = exp_level(plan.fast_exp, p.mode, p.out_dtype)
    if plan.kernel == "stream":
        per = plan.tile // (32 * plan.num_warps)
        meta = dict(PER=per, WARPS=plan.num_warps, num_warps=plan.num_warps)
        scalars = (p.M, p.N, p.inner, *geo_x[:2], plan.grid, -(-p.N // plan.tile))
        return Launch(plan, [BoundKernel(logsumexp_stream_kernel, (plan.grid,), meta)], scalars, None)
    if plan.kernel == "pipe":
        meta = dict(BLOCK=plan.block_n, VEC=16 // p.elem_bytes, WARPS=plan.num_warps, EVEN=p.N == plan.block_n,
                    num_warps=plan.num_warps)
        return Launch(plan, [BoundKernel(logsumexp_rows_pipe_kernel, (plan.grid,), meta)],
                      (p.M, p.N, p.inner, *geo_x[:2], plan.grid), None)
    C = plan.chunks
    if plan.kernel == "smem":
        words = bool(plan.reg) and p.dtype == p.out_dtype == torch.bfloat16
        meta = dict(CHUNK=plan.chunk, VEC=16 // p.elem_bytes, WARPS=plan.num_warps, C_POW2=pow2(C), MODE=p.mode,
                    EVEN=p.N % plan.chunk == 0, REG=plan.reg, WORDS=words, FAST=fast, KEEP_E=plan.keep_e,
                    num_warps=plan.num_warps, **_opt(plan.maxnreg))
        rows, parts = (p.M, p.M * C) if C > 1 else (1, 1)          # one chunk per row: the barrier goes unused
        return Launch(plan, [BoundKernel(softmax_coop_smem_kernel, (plan.grid,), meta)],
                      (p.N, p.inner, *geo_x[:2], *geo_y[:2], C), (rows, parts, torch.float32, (2, 3, 0, 1)))
    acc = _acc(p.dtype, p.out_dtype)
    if plan.kernel == "rows":
        meta = dict(BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, MODE=p.mode, ACC=acc, PREFETCH=plan.prefetch,
                    FAST=fast, num_warps=plan.num_warps)
        return Launch(plan, [BoundKernel(softmax_rows_kernel, (plan.grid,), meta)],
                      (p.M, p.N, p.inner, *geo_x, *geo_y, plan.grid), None)
    # workspace order in the kernels: PART_M, PART_D, ARRIVE, GEN
    ws = (p.M, p.M * C, torch.float64 if acc == tl.float64 else torch.float32, (2, 3, 0, 1))
    if plan.kernel == "bf16x2":
        meta = dict(CHUNK=plan.chunk, C_POW2=pow2(C), MODE=p.mode, num_warps=plan.num_warps, **_opt(plan.maxnreg))
        return Launch(plan, [BoundKernel(softmax_coop_bf16x2_kernel, (plan.grid,), meta)],
                      (p.N, p.inner, *geo_x[:2], *geo_y[:2], C), ws)
    meta = dict(CHUNK=plan.chunk, C_POW2=pow2(C), MODE=p.mode, ACC=acc, FAST=fast, num_warps=plan.num_warps,
                **_opt(plan.maxnreg))
    kernels = [BoundKernel(softmax_chunks_kernel, (plan.grid,), dict(meta, PHASE=ph)) for ph in _phases(plan.path)]
    return Launch(plan, kernels, (p.N, p.inner, *geo_x, *geo_y, C), ws)


def bind_backward(p: Backward, plan: Plan, target: Target) -> Launch:
    geos = (p.geo_y, p.geo_dy, p.geo_dx)
    precise = not target.interpret and p.dtypes[2] in (torch.float32, torch.float64)    # see kernels/common.py
    types = dict(LOG=p.log, LIBDEVICE=precise, ACC=_acc(*p.dtypes), SUM=_bwd_sum(*p.dtypes))
    part = torch.float64 if types["SUM"] == tl.float64 else torch.float32
    C = plan.chunks
    if plan.kernel == "smem":
        dtype = p.dtypes[0]
        meta = dict(CHUNK=plan.chunk, VEC=16 // p.elem_bytes, WARPS=plan.num_warps, C_POW2=pow2(C),
                    EVEN=p.N % plan.chunk == 0, num_warps=plan.num_warps, REG=plan.reg,
                    WORDS=bool(plan.reg) and dtype == torch.bfloat16, RING=plan.ring,
                    **{k: types[k] for k in ("LOG", "LIBDEVICE", "SUM")}, **_opt(plan.maxnreg))
        rows, parts = (p.M, p.M * C) if C > 1 else (1, 1)          # one chunk per row: the barrier goes unused
        return Launch(plan, [BoundKernel(softmax_bwd_coop_smem_kernel, (plan.grid,), meta)],
                      (p.N, p.inner, *(g for geo in geos for g in geo[:2]), C), (rows, parts, part, (2, 0, 1)))
    if plan.kernel == "rows":
        meta = dict(BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, num_warps=plan.num_warps, **types)
        return Launch(plan, [BoundKernel(softmax_bwd_rows_kernel, (plan.grid,), meta)],
                      (p.M, p.N, p.inner, *p.geo_y, *p.geo_dy, *p.geo_dx, plan.grid), None)
    if plan.kernel == "bf16x2":
        meta = dict(CHUNK=plan.chunk, C_POW2=pow2(C), LOG=p.log, num_warps=plan.num_warps)
        return Launch(plan, [BoundKernel(softmax_bwd_coop_bf16x2_kernel, (plan.grid,), meta)],
                      (p.N, p.inner, *p.geo_y[:2], *p.geo_dy[:2], *p.geo_dx[:2], C), (p.M, p.M * C, torch.float32,
                                                                                     (2, 0, 1)))
    meta = dict(CHUNK=plan.chunk, C_POW2=pow2(C), num_warps=plan.num_warps, **types)
    kernels = [BoundKernel(softmax_bwd_chunks_kernel, (plan.grid,), dict(meta, PHASE=ph)) for ph in _phases(plan.path)]
    # workspace order in the kernels: PART, ARRIVE, GEN
    return Launch(plan, kernels, (p.N, p.inner, *p.geo_y, *p.geo_dy, *p.geo_dx, C), (p.M, p.M * C, part, (2, 0, 1)))


def align_of(*tensors: torch.Tensor) -> int:
    """The largest of 16, 4, 1 bytes dividing every data pointer."""
    ptrs = 0
    for t in tensors:
        ptrs |= t.data_ptr()
    return 16 if not ptrs & 15 else 4 if not ptrs & 3 else 1


@cached
def _forward_launch(p: Forward, device: torch.device) -> Launch:
    target = target_of(device)
    return bind_forward(p, forward_plan(p, target), target)


@cached
def _backward_launch(p: Backward, device: torch.device) -> Launch:
    target = target_of(device)
    return bind_backward(p, backward_plan(p, target), target)


def forward_rows(x: torch.Tensor, out: torch.Tensor, dim: int, mode: int) -> Launch | None:
    """softmax / log-softmax of ``x`` into ``out`` (x's shape) along ``dim`` (0 <= dim < x.dim()), planned by one
    cached lookup of the layout; returns the bound launch it ran (``launch((x, out), device)`` runs it again on
    tensors of the same layout and alignment), None where no row view of both exists (the caller copies and calls
    ``forward``)."""
    launch = _forward_by_layout(x.shape, x.stride(), out.stride(), dim, mode, x.dtype, out.dtype, align_of(x, out),
                                x.device)
    if launch is None:
        return None
    launch((x, out), x.device)
    return launch


@cached
def _forward_by_layout(shape, stride_x, stride_y, dim, mode, dtype, out_dtype, align, device) -> Launch | None:
    geo = row_geometry_of(shape, (stride_x, stride_y), dim)
    if geo is None:
        return None
    M, N, inner, (geo_x, geo_y) = geo
    return _forward_launch(Forward(M, N, inner, geo_x, geo_y, mode, dtype, out_dtype, align), device)


def forward(x, out, geo_x, geo_y, M, N, inner, mode: int, knobs: Knobs | None = None) -> Plan:
    """Launch softmax (mode 0), log-softmax (1) or logsumexp (2; ``out`` is a contiguous [M] tensor) on the row view
    ``geo_*`` = (stride_outer, stride_inner, stride_n). ``knobs`` override the plan (not cached). Returns the plan."""
    p = Forward(M, N, inner, geo_x, (0, 0, 0) if mode == LOGSUMEXP else geo_y, mode, x.dtype, out.dtype,
                align_of(x, out))
    if knobs is None or knobs == NO_KNOBS:
        launch = _forward_launch(p, x.device)
    else:
        target = target_of(x.device)
        launch = bind_forward(p, forward_plan(p, target, knobs), target)
    launch((x, out), x.device)
    return launch.plan


def backward(y, dy, dx, geo_y, geo_dy, geo_dx, M, N, inner, log: bool, knobs: Knobs | None = None) -> Plan:
    """dx from y and dy: softmax ``dx = y·(dy − Σ y·dy)``, log-softmax ``dx = dy − e^y·Σ dy``. Returns the plan."""
    p = Backward(M, N, inner, geo_y, geo_dy, geo_dx, log, (y.dtype, dy.dtype, dx.dtype), align_of(y, dy, dx))
    if knobs is None or knobs == NO_KNOBS:
        launch = _backward_launch(p, y.device)
    else:
        target = target_of(y.device)
        launch = bind_backward(p, backward_plan(p, target, knobs), target)
    launch((y, dy, dx), y.device)
    return launch.plan


def warmup_rows(N: int, dtype: torch.dtype, mode: int, max_rows: int, target: Target) -> list[int]:
    """Row counts M <= ``max_rows`` whose forward launches on contiguous ``[M, N]`` rows cover every compiled
    variant any M <= max_rows needs on ``target``: one M per distinct (kernels, constexprs, Triton's
    specialisation of the run-time integers: == 1, divisible by 16). A handful per (N, dtype, mode): the plan's
    constexprs change with M in a few classes only."""
    first: dict = {}
    meta = torch.empty(2, N, dtype=dtype, device="meta")       # the row view a call on contiguous rows takes
    _, (_, _, inner, (geo, *_)) = rows_or_copy([meta], 1)
    for M in range(1, max_rows + 1):
        p = Forward(M, N, inner, geo, (0, 0, 0) if mode == LOGSUMEXP else geo, mode, dtype, dtype, 16)
        launch = bind_forward(p, forward_plan(p, target), target)
        key = (tuple((b.fn.__name__, tuple(sorted((k, str(v)) for k, v in b.meta.items()))) for b in launch.kernels),
               int_spec(*(a for a in launch.scalars if isinstance(a, int))),
               launch.workspace is not None)
        first.setdefault(key, M)
    return sorted(first.values())
