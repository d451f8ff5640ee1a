"""A top-k plan bound to its kernels: workspace, launches (bound once per problem), and the 2-D entry point."""

from __future__ import annotations

import torch

from .._triton.host import int_spec
from .._triton.launch import (
    BoundKernel,
    Slot,
    cached,
    current_device,
    current_stream,
    hooks_installed,
    pow2,
    raw_launches,
    stream_scratch,
)
from ..target import target_of
from .kernels import _topk_chunk_kernel, _topk_exact_kernel, _topk_grad_kernel, _topk_merge_kernel, _topk_row_kernel
from .plan import Plan, topk_plan


@cached
def cached_plan(B: int, V: int, k: int, dtype: torch.dtype, device: torch.device) -> Plan:
    """:func:`topk_plan` for x's device, cached per problem."""
    return topk_plan(B, V, k, dtype.itemsize, target_of(device))


def workspace_words(B: int, cfg: Plan, splits: int | None = None) -> int:
    """int32 words of scratch: m_c, d_c, n_c, t_c (B·S each), the candidates (B·S·CAP int64: value bits,
    index) and the merge's survivors (B·CAP int64), 16-byte aligned. ``splits``: S of another level."""
    bs = B * (cfg.splits if splits is None else splits)
    return 4 * bs + 2 * (bs + B) * cfg.cap


def _workspace(device: torch.device, words: int, words2: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Scratch cached per (device, stream), grown when needed (``stream_scratch``): stage 1's states and the
    tree's first-level states. Every launch writes what it reads (stage 1 writes every chunk's state and n_c
    candidates), so nothing is cleared."""
    return stream_scratch("topk", device, ((max(words, 1 << 20), torch.int32), (max(words2, 1024), torch.int32)),
                          zeroed=0)


NO_T = (None, 1.0, 0)       # (t_ptr, t_val, t_stride) of a launch without a temperature (T_MODE 0)


@cached
def _launches(cfg: Plan, B: int, V: int, k: int, stride_b: int, stride_v: int, t_mode: int = 0,
              one: bool = True) -> tuple:
    """The launches of ``cfg`` for one problem, bound once (``BoundKernel``: no per-call argument binding):
    ``(kernel, args)`` pairs, ``args(x, ws, ws2, out, tt)`` giving the run-time arguments. Stage 1 first; with
    ``cfg.one`` (and ``one``: the sampler and the stage timings take the two launches) the one launch of both.

    ``t_mode``: the temperature folded into the read of x (``kernels._log2_scale``): 0 none; 1 from
    ``tt = (t_ptr, t_val, t_stride)``: the scalar ``t_val`` where ``t_stride < 0``, else the per-row float32
    tensor ``t_ptr`` (stride ``t_stride``; x stands in for a missing pointer)."""
    S = cfg.splits
    fast = cfg.fast
    BS = B * S
    blk = dict(BLOCK=cfg.block, R=cfg.cols, CAP=cfg.cap)
    opt = dict(maxnreg=cfg.maxnreg) if cfg.maxnreg and fast else {}
    head = (stride_b, stride_v, V)
    tm = dict(T_MODE=t_mode)

    def t(x, tt):
        return (tt[0] if tt[0] is not None else x, *tt[1:])

    if cfg.one and one:
        meta = dict(blk, FAST=fast, RADIX=cfg.radix, PEEL=cfg.peel, W=cfg.width or cfg.cap, **tm,
                    num_warps=cfg.merge_warps)
        return ((BoundKernel(_topk_row_kernel, (B,), meta),
                 lambda x, ws, ws2, o, tt=NO_T: (x, *head, ws, *o, k, cfg.kb or k, B, *t(x, tt))),)
    out = [(BoundKernel(_topk_chunk_kernel, (BS,), dict(blk, FAST=fast, RADIX=cfg.radix, PEEL=cfg.peel,
                                                         num_warps=cfg.num_warps, **tm, **opt)),
            lambda x, ws, ws2, o, tt=NO_T: (x, ws, *head, cfg.kb or k, S, BS, *t(x, tt)))]
    if cfg.exact_apart:
        out.append((BoundKernel(_topk_exact_kernel, (BS,), dict(blk, num_warps=cfg.num_warps, **tm)),
                    lambda x, ws, ws2, o, tt=NO_T: (x, ws, *head, k, S, BS, *t(x, tt))))
    merge = dict(blk, FAST=fast, **tm)
    exact = not cfg.exact_apart
    S2 = S
    if cfg.tree:
        ng = -(-S // cfg.tree)
        sp = pow2(cfg.tree)
        out.append((BoundKernel(_topk_merge_kernel, (B * ng,), dict(merge, SP=sp, CT=sp, EXACT=exact, OUT_STATE=True,
                                                                    W=cfg.cap, num_warps=cfg.tree_warps)),
                    lambda x, ws, ws2, o, tt=NO_T: (x, *head, ws, ws2, *o, k, S, BS, cfg.tree, ng, *t(x, tt))))
        S2, exact = ng, False
    final = BoundKernel(_topk_merge_kernel, (B,), dict(final_meta(cfg, t_mode), OUT_STATE=False))
    out.append((final, lambda x, ws, ws2, o, tt=NO_T: (x, *head, *(2 * (ws2 if cfg.tree else ws,)), *o, k, S2, B * S2,
                                                       S2, 1, *t(x, tt))))
    return tuple(out)


def final_meta(cfg: Plan, t_mode: int = 0) -> dict:
    """The constexprs and warps of the last merge (one program per row, over S chunk states or the tree's NG group
    states), ``OUT_STATE`` aside: also the sampler's fused merge (``sampling_launch``)."""
    S2 = -(-cfg.splits // cfg.tree) if cfg.tree else cfg.splits
    sp = pow2(S2)
    return dict(BLOCK=cfg.block, R=cfg.cols, CAP=cfg.cap, FAST=cfg.fast, T_MODE=t_mode, SP=sp,
                CT=max(1, min(sp, cfg.merge_tile // cfg.cap)), EXACT=not cfg.exact_apart and not cfg.tree,
                W=cfg.width or cfg.cap, num_warps=cfg.merge_warps)


def _run(x: torch.Tensor, launches, ws, ws2, out, tt=NO_T):
    check = (x,) if tt[0] is None else (x, tt[0])
    for kernel, args in launches:
        kernel(args(x, ws, ws2, out, tt), check, x.device)


def stage1(x: torch.Tensor, ws: torch.Tensor, k: int, cfg: Plan):
    """Launch stage 1 for ``x`` ``[B, V]`` into the workspace ``ws`` (also timed alone by the benchmarks)."""
    B, V = x.shape
    _run(x, _launches(cfg, B, V, k, x.stride(0), x.stride(1), one=False)[:1], ws, None, None)


def merge(x: torch.Tensor, ws: torch.Tensor, ws2: torch.Tensor, out: tuple, k: int, cfg: Plan):
    """The launches after stage 1 (the exact path apart, the merge or its two levels) into ``out`` = (values,
    indices, lse); also timed alone by the benchmarks."""
    B, V = x.shape
    _run(x, _launches(cfg, B, V, k, x.stride(0), x.stride(1), one=False)[1:], ws, ws2, out)


def softmax_topk_2d(x: torch.Tensor, k: int, cfg: Plan | None = None, out: tuple | None = None,
                    t_mode: int = 0, tt: tuple = NO_T):
    """``x``: ``[B, V]``, any strides, fp32/fp16/bf16 -> fp32 values ``[B, k]``, int64 indices, fp32 lse.

    Launches: stage 1 (B·S programs); with ``exact_apart`` the chunks' exact paths (B·S, most return at once);
    the merge (B programs), or with ``tree`` two levels: B·NG programs of ``tree`` chunks each, then B over the
    NG group states. ``out``: the three outputs, given (else allocated); ``t_mode``, ``tt``: the temperature
    (see :func:`_launches`): the values are then ``softmax(x / T)`` and lse ``logsumexp(x / T)``."""
    B, V = x.shape
    cfg = cfg or cached_plan(B, V, k, x.dtype, x.device)
    if cfg.path == "sort":
        raise ValueError("softmax_topk_2d: the sort path is not a kernel; the op runs it")
    dev = x.device
    if out is None:
        out = (torch.empty((B, k), device=dev, dtype=torch.float32),
               torch.empty((B, k), device=dev, dtype=torch.int64),
               torch.empty((B,), device=dev, dtype=torch.float32))
    if B == 0:
        return out
    ws, ws2 = workspaces(B, cfg, dev)
    _run(x, _launches(cfg, B, V, k, x.stride(0), x.stride(1), t_mode), ws, ws2, out, tt)
    return out


def workspaces(B: int, cfg: Plan, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1's scratch and the tree's first-level scratch for ``cfg`` (cached per device and stream)."""
    ng = -(-cfg.splits // cfg.tree) if cfg.tree else 1
    return _workspace(device, workspace_words(B, cfg), workspace_words(B, cfg, ng) if cfg.tree else 0)


CALLS_KEPT = 256        # bound problems kept (then all dropped: a server sees a handful of (B, V, k, dtype) at a time)
_calls: dict = {}


class TopKCall:
    """The launches of one ``softmax_topk`` problem (B, V, k, x's strides and dtype, device, stream), bound once.

    The first call (and a misaligned x, a capture, the interpreter, launch hooks) runs ``_launches`` through
    ``BoundKernel`` with tensors; after it, on CUDA, each launch's C launcher gets its arguments laid out once (the
    stream's workspace pointers as ints, the constexprs), and a call puts in x's and the outputs' ``data_ptr()``
    by position: no argument tuple built per launch, no workspace look-up, no driver query of a tensor's pointer.
    Per call: the three output allocations (``torch.empty_like`` of templates kept beside the lanes: one tensor
    argument parses faster than a shape, a device and a dtype) and the launches."""

    __slots__ = ("B", "k", "device", "dtype", "launches", "lanes", "ws", "like")

    def __init__(self, cfg: Plan, B: int, V: int, k: int, stride_b: int, stride_v: int, device: torch.device,
                 dtype: torch.dtype):
        self.B, self.k, self.device, self.dtype = B, k, device, dtype
        self.launches = (cfg, _launches(cfg, B, V, k, stride_b, stride_v, 0))   # softmax_topk_2d's key
        self.lanes = self.ws = self.like = None

    def __call__(self, x: torch.Tensor, stream, capturing: bool) -> tuple:
        """``(values, indices, lse)`` of x on ``stream`` (the raw current CUDA stream; the call's key)."""
        lanes = self.lanes
        if lanes is None or capturing:
            B, k, dev = self.B, self.k, self.device
            f32 = torch.float32
            out = (torch.empty((B, k), device=dev, dtype=f32), torch.empty((B, k), device=dev, dtype=torch.int64),
                   torch.empty((B,), device=dev, dtype=f32))
        else:
            like = self.like
            out = (_empty_like(like[0]), _empty_like(like[1]), _empty_like(like[2]))
            xp = x.data_ptr()
            if not xp & 15 and not hooks_installed():
                vals = (xp, out[0].data_ptr(), out[1].data_ptr(), out[2].data_ptr())
                for launch, full, subs in lanes:
                    a = full.copy()
                    a[3] = stream
                    for pos, i in subs:
                        a[pos] = vals[i]
                    launch(*a)
                return out
        self._launch_bound(x, out, capturing)
        return out

    def _launch_bound(self, x: torch.Tensor, out: tuple, capturing: bool) -> None:
        """Through ``BoundKernel`` with tensors (the capture's own workspace from ``stream_scratch``); then, on
        CUDA and outside a capture, binds the lanes of later aligned calls."""
        cfg, launches = self.launches
        dev = self.device
        ws, ws2 = workspaces(self.B, cfg, dev)
        _run(x, launches, ws, ws2, out)
        if capturing or not raw_launches(dev) or self.lanes is not None or x.data_ptr() & 15:
            return
        key = (current_device(), True, self.dtype)
        raw = [kern.entry(key) for kern, _ in launches]
        if any(r is None for r in raw):
            return
        wsp, ws2p = ws.data_ptr(), ws2.data_ptr()
        lanes = []
        for (launch, head, tail), (_, args) in zip(raw, launches):
            full = [*head[:3], None, *head[3:], *args(_SLOTS[0], wsp, ws2p, _SLOTS[1:]), *tail]
            lanes.append((launch, full, tuple((i, _SLOTS.index(v)) for i, v in enumerate(full)
                                              if isinstance(v, Slot))))
        self.ws = (ws, ws2)                              # held: the pointers in the lanes stay valid
        self.like = tuple(torch.empty_like(t) for t in out)     # templates of later calls' outputs (own tensors)
        self.lanes = tuple(lanes)


_empty_like = torch.empty_like
_SLOTS = tuple(Slot() for _ in range(4))      # x, values, indices, lse: the order of a call's pointers


def topk_call(x: torch.Tensor, k: int, stream) -> TopKCall | None:
    """The bound problem for ``x`` (``[B, V]``, B >= 1, fp32 / fp16 / bf16) on ``stream`` (a raw CUDA stream, None
    elsewhere), cached by a tuple of ints; None where the plan is the sort path (the caller runs torch's)."""
    B, V = x.shape
    sb, sv = x.stride()
    dtype, dev = x.dtype, x.device
    key = (B, V, k, sb, sv, dtype, dev, stream)
    call = _calls.get(key)
    if call is None:
        cfg = cached_plan(B, V, k, dtype, dev)
        if cfg.path == "sort":
            return None
        if len(_calls) >= CALLS_KEPT:
            _calls.clear()
        call = _calls[key] = TopKCall(cfg, B, V, k, sb, sv, dev, dtype)
    return call


def topk_2d(x: torch.Tensor, k: int) -> tuple | None:
    """``(values, indices, lse)`` of x ``[B, V]`` (B >= 1, fp32 / fp16 / bf16) by its bound problem, or None where
    the plan is the sort path."""
    stream, capturing = None, False
    if x.is_cuda:
        stream = current_stream(current_device())
        capturing = torch._C._cuda_isCurrentStreamCapturing()
    call = topk_call(x, k, stream)
    return None if call is None else call(x, stream, capturing)


GRAD_TILE = 4096        # entries per program of the backward's row kernel (rows of fewer entries share a tile)
GRAD_K_TILE = 1024      # selected entries per step of its loops over k (ROWS rows at a time)


@cached
def _grad_launch(B: int, V: int, k: int, has_dv: bool, has_dlse: bool, spec: tuple) -> BoundKernel:
    """The backward's row kernel for ``[B, V]`` and k selected entries: ``[ROWS, BLOCK]`` tiles of GRAD_TILE
    entries, one per program; ``spec``: :func:`int_spec` of the strides (x's, dv's, dlse's: the bound kernel
    replays the variant its first call compiled)."""
    block = min(pow2(V), GRAD_TILE)
    rows = GRAD_TILE // block
    kc = min(pow2(k), max(GRAD_K_TILE // rows, 16))
    return BoundKernel(_topk_grad_kernel, (-(-B // rows) * -(-V // block),),
                       dict(ROWS=rows, BLOCK=block, KC=kc, HAS_DV=has_dv, HAS_DLSE=has_dlse, num_warps=4))


def topk_backward(x: torch.Tensor, values: torch.Tensor, indices: torch.Tensor, lse: torch.Tensor,
                  dvalues: torch.Tensor | None, dlse: torch.Tensor | None) -> torch.Tensor:
    """dx ``[B, V]`` (x's dtype, contiguous) of ``softmax_topk``'s values and lse (``[B, k]``,
    ``[B]``): with ``p = softmax(x)`` and ``v = p`` at the indices, ``dx = scatter(dv·v) − p·c``,
    ``c = Σ dv·v − dlse``, in one launch of ``_topk_grad_kernel`` (one read of x, one write of dx). ``dvalues``
    / ``dlse``: any strides, or None (a gradient that does not flow)."""
    B, V = x.shape
    k = indices.shape[1]
    values, indices, lse = values.contiguous(), indices.contiguous(), lse.contiguous()   # no copy from the forward
    dx = torch.empty((B, V), device=x.device, dtype=x.dtype)
    if B:
        dv_s = dvalues.stride() if dvalues is not None else (0, 0)
        dl_s = dlse.stride(0) if dlse is not None else 0
        bk = _grad_launch(B, V, k, dvalues is not None, dlse is not None, int_spec(*x.stride(), *dv_s, dl_s))
        dv = dvalues if dvalues is not None else values
        dl = dlse if dlse is not None else lse
        bk((x, lse, values, indices, dv, dl, dx, x.stride(0), x.stride(1), *dv_s, dl_s, B, V, k,
            -(-V // bk.meta["BLOCK"])), (x, dv, dl), x.device)
    return dx
