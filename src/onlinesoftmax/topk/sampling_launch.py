"""``sample`` on the kernels: candidates by ``softmax_topk`` (temperature folded in), the filters and the draw in
one program per row (or in the last merge's epilogue: ``fuse``), the exact row kernel for rows the candidates
cannot decide.

Host cost is the point here (a decode step calls this once per token): a problem's launches, workspace and
dummy pointers are bound once in a :class:`SampleCall`, found by one dict look-up of a tuple of ints. Later calls
pass every pointer as an int (``data_ptr()``) straight to the compiled kernels' C launchers: Triton's launcher
then neither calls ``data_ptr`` nor queries the driver for the pointer's attributes. Per call: the output
allocations, the launches, and nothing else (no plan hashing, no workspace look-up, no tensor for a Python
parameter, no view of scratch). With ``SampleKnobs(draw="kernel")`` an eager call also skips ``torch.rand`` (the
kernels draw u by Philox from the generator's seed and offset: four ints); with ``one_buffer`` it allocates its
two outputs as views of one buffer.
"""

from __future__ import annotations

import torch

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
from .launch import _empty_like, final_meta, workspaces
from .launch import _launches as topk_launches
from .plan import (
    GRID_TABLE,
    MIN_KP,
    NO_SAMPLE_KNOBS,
    ROW_BINS_CAP,
    ROW_BLOCK,
    ROW_WARPS,
    SampleKnobs,
    SamplePlan,
    sample_plan,
)
from .sampling_grid import _grid_finish_kernel, _grid_pass_kernel
from .sampling_kernels import _sample_kernel, _sample_merge_kernel, _sample_row_kernel

GRID_SCAN_BLOCK = 1024  # the grid's draw: elements per step of its scan of one chunk
GRID_LIST_BLOCK = 64    # ... and of its list's kept masses per chunk (a [GRID_TABLE, this] tile)

CALLS_KEPT = 256        # bound problems kept (then all dropped: a server sees a handful of (B, V, dtype) at a time)
_calls: dict = {}


@cached
def cached_sample_plan(B: int, V: int, dtype: torch.dtype, device: torch.device, greedy: bool, top_k,
                       knobs: SampleKnobs = NO_SAMPLE_KNOBS) -> SamplePlan:
    """:func:`sample_plan` for x's device (fp32 / fp16 / bf16: fp64 logits are read as fp32), cached per problem."""
    return sample_plan(B, V, dtype.itemsize, target_of(device), greedy=greedy, top_k=top_k, knobs=knobs)


class SampleCall:
    """The launches of one ``sample`` problem (B, V, x's strides and dtype, device, stream, K, temperature mode,
    plan, where u comes from), bound once: the top-k launches of ``softmax_topk(x / T, K)`` (their last merge
    replaced by the fused sampling merge with ``plan.fuse``), step 1, step 2 where some row may need it; the
    workspace of the stream. ``philox``: 0, the kernels load u; 1, they draw it (a call's ``u`` is then
    ``(s0, s1, c0, c1)``: the Philox key and counter words as signed int32); 2, a call being captured into a CUDA
    graph, they draw it at the count of replays each row's slot holds and advance it (``u`` is then
    ``(slots, s0, s1, c0, c1, g0, g1)``: the capture's int64 slot per row, the words, the capture's tag).

    Pointers are "ptr-like": tensors on the first call of an alignment class (Triton compiles and binds from
    them) and under the interpreter, ints (``data_ptr()``) afterwards. A parameter is ``(ptr, value, stride)``:
    stride -1 for a Python value (the pointer a dummy of the parameter's dtype, so scalar and per-row calls share
    one compiled kernel)."""

    __slots__ = ("plan", "B", "V", "strides", "device", "kernels", "args", "lanes", "dtypes", "ws", "one", "like")

    def __init__(self, plan: SamplePlan, B: int, V: int, stride_b: int, stride_v: int, t_mode: int,
                 device: torch.device, dtype: torch.dtype, philox: int = 0):
        self.plan, self.B, self.V, self.strides, self.device = plan, B, V, (stride_b, stride_v), device
        self.one = plan.one_buffer                  # ids and logp as views of one buffer
        K, cfg, C = plan.k, plan.topk, plan.row_chunks
        head = (stride_b, stride_v, V)
        top = topk_launches(cfg, B, V, K, stride_b, stride_v, t_mode, one=False)
        kernels, args = [kern for kern, _ in top], [a for _, a in top]
        draw = dict(FIXED=plan.mass == "fixed", PHILOX=philox)
        if plan.fuse:
            kernels[-1] = BoundKernel(_sample_merge_kernel, (B,), dict(final_meta(cfg, t_mode), **draw))
            S2 = -(-cfg.splits // cfg.tree) if cfg.tree else cfg.splits

            def fused(x, ws, ws2, ids, logp, u, tt, prm, rng):
                return (x, *head, ws2 if cfg.tree else ws, K, S2, B * S2, u, ids, logp, *tt, *prm, *rng)
            args[-1] = fused
        else:
            pdl = dict(PDL=plan.pdl, launch_pdl=plan.pdl)     # (launch_pdl: Triton's launch option)
            kernels.append(BoundKernel(_sample_kernel, (B,), dict(KP=max(MIN_KP, pow2(K)),
                                                                  num_warps=1 if K <= 256 else 4, **draw, **pdl)))
            if plan.grid_chunks:
                meta = dict(CP=GRID_TABLE, CAP=ROW_BINS_CAP, **pdl)
                for step in (1, 2, 3, 4):
                    kernels.append(BoundKernel(_grid_pass_kernel, (B * plan.grid_chunks,), dict(
                        meta, STEP=step, LIST=plan.grid_list, LANE_COUNTS=plan.grid_lane_counts,
                        BLOCK=plan.grid_block, num_warps=plan.grid_warps)))
                kernels.append(BoundKernel(_grid_finish_kernel, (B,), dict(     # (4 / 8 warps: 16 / 24 B of stack)
                    meta, BLOCK=GRID_SCAN_BLOCK, LB=GRID_LIST_BLOCK, PHILOX=philox, num_warps=16)))
            if C:
                kernels.append(BoundKernel(_sample_row_kernel, (B * C,), dict(
                    BLOCK=ROW_BLOCK, CP=plan.table, num_warps=ROW_WARPS, PHILOX=philox, BINS=plan.row == "bins",
                    CAP=ROW_BINS_CAP, **pdl)))
        self.kernels, self.args = tuple(kernels), tuple(args)
        # the compile keys of BoundKernel for aligned pointers: x, then the parameters' dtypes (t, top_k, top_p,
        # min_p dummies or tensors, u)
        self.dtypes = (dtype, torch.float32, torch.int64, torch.float32, torch.float32, torch.float32)
        self.lanes = self.ws = self.like = None

    def workspace(self, device: torch.device) -> tuple:
        """Tensors: top-k's scratch (ws, ws2), the candidates (values, indices, lse, flags) and the row kernel's
        barrier words and tables (the views not needed by the plan are None)."""
        B, plan = self.B, self.plan
        ws, ws2 = workspaces(B, plan.topk, device)
        cand = (None,) * 4
        if not plan.fuse:
            K = plan.k
            vals, inds, lse, flag = stream_scratch("sample", device, ((B * K, torch.float32), (B * K, torch.int64),
                                                                      (B, torch.float32), (B, torch.int32)),
                                                   zeroed=0)
            cand = (vals[:B * K], inds[:B * K], lse[:B], flag[:B])
        row = ()
        if plan.row_chunks:
            BC = B * plan.row_chunks
            # barrier words (zeroed, left as found), the levels' histograms (two buffers), tie counts and cuts,
            # then per chunk: the kept mass, the mass past the fine bins, (count, mass) above and at a boundary;
            # the rows' lists of a boundary bin (row="bins")
            row = stream_scratch("sample-row", device, ((B, torch.int32), (B, torch.int32), (32 * BC, torch.int32),
                                                        (32 * BC, torch.float32), (BC + B, torch.int32),
                                                        (6 * BC, torch.float32),
                                                        (B * ROW_BINS_CAP if plan.row == "bins" else 1, torch.int32)),
                                 zeroed=2)
        if plan.grid_chunks:
            # per chunk: the levels' 16-bin masses (and counts below the first) and the mass past the fine bins;
            # per row: three steps' records (int32, float32) and the boundary's list
            BG = 16 * B * plan.grid_chunks
            row += stream_scratch("sample-grid", device, ((BG, torch.float32), (BG // 16, torch.float32),
                                                          (BG, torch.float32), (BG, torch.int32), (BG, torch.float32),
                                                          (BG, torch.int32), (12 * B, torch.int32),
                                                          (12 * B, torch.float32), (B * ROW_BINS_CAP, torch.int32)),
                                  zeroed=0)
        return (ws, ws2, *cand, *row)

    def __call__(self, x: torch.Tensor, tt: tuple, kt: tuple, pt: tuple, qt: tuple, u, stream, capturing: bool):
        """``(ids, logp)``: ``tt``..``qt`` the parameters ``(tensor or None, value, stride)`` (None: a Python value,
        stride -1), ``u`` the uniforms (None: every row greedy; a tuple of four ints: the Philox key and counter of
        a ``philox`` 1 call; the slots and six words of a ``philox`` 2 call), on ``stream`` (the raw current CUDA
        stream; the call's key)."""
        B, dev = self.B, self.device
        like = self.like
        if self.one:        # B int64 ids, then B float32 log-probabilities (16-byte aligned: B rounded up to 2)
            buf = torch.empty(B + B % 2 + (B + 1) // 2, device=dev, dtype=torch.int64)
            ids = buf[:B]
            logp = buf[B + B % 2:].view(torch.float32)[:B]
        elif like is not None and not capturing:       # templates kept beside the lanes: one argument to parse
            ids = _empty_like(like[0])
            logp = _empty_like(like[1])
        else:
            ids = torch.empty(B, device=dev, dtype=torch.int64)
            logp = torch.empty(B, device=dev, dtype=torch.float32)
        rng = _NO_RNG
        if type(u) is tuple:
            u, rng = (None, u + _NO_TAG) if len(u) == 4 else (u[0], u[1:])
        lanes = self.lanes
        if lanes is not None and not capturing:
            idp, lpp = ids.data_ptr(), logp.data_ptr()
            xp = x.data_ptr()
            bits = xp
            up = lpp
            if u is not None:
                up = u.data_ptr()
                bits |= up
            t0, k0, p0, q0 = tt[0], kt[0], pt[0], qt[0]
            if t0 is not None:
                t0 = t0.data_ptr()
                bits |= t0
            if k0 is not None:
                k0 = k0.data_ptr()
                bits |= k0
            if p0 is not None:
                p0 = p0.data_ptr()
                bits |= p0
            if q0 is not None:
                q0 = q0.data_ptr()
                bits |= q0
            if not bits & 15 and not hooks_installed():
                vals = (xp, idp, lpp, up, lpp if t0 is None else t0, float(tt[1]), tt[2], idp if k0 is None else k0,
                        int(kt[1]), kt[2], lpp if p0 is None else p0, float(pt[1]), pt[2],
                        lpp if q0 is None else q0, float(qt[1]), qt[2], *rng)
                for launch, full, subs in lanes:
                    a = full.copy()
                    a[3] = stream
                    for pos, i in subs:
                        a[pos] = vals[i]
                    launch(*a)
                return ids, logp
        self._launch_bound(x, ids, logp, u, tt, kt, pt, qt, rng, capturing)
        return ids, logp

    def _arglists(self, x, views, ids, logp, u, prm, rng) -> list:
        """Each launch's run-time arguments: ``prm`` the parameters as the kernels take them, ``(ptr, value,
        stride)`` four times (a Python value's pointer a dummy of its dtype: logp for float32, ids for int64);
        ``rng`` the Philox key, counter and tag words (zeros where the kernels load u)."""
        plan = self.plan
        ws, ws2, vals, inds, lse, flag = views[:6]
        tt = tuple(prm[:3])
        lists = [a(x, ws, ws2, (vals, inds, lse), tt) for a in self.args[:len(self.args) - plan.fuse]]
        if plan.fuse:
            lists.append(self.args[-1](x, ws, ws2, ids, logp, u, tt, prm[3:], rng))
            return lists
        K, V = plan.k, self.V
        lists.append((vals, inds, lse, u, ids, logp, flag, *prm, *rng, K, V))
        if plan.grid_chunks:
            grid = (*views[13:22], plan.grid_chunks, plan.grid_chunk)
            lists += [(x, *self.strides, V, inds, lse, flag, *prm, K, *grid)] * 4
            lists.append((x, *self.strides, V, inds, lse, u, ids, logp, flag, *prm, *rng, K, grid[0], grid[2],
                          grid[4], *grid[6:]))
        if plan.row_chunks:
            lists.append((x, *self.strides, V, inds, lse, u, ids, logp, flag, *prm, *rng, K, *views[6:13],
                          plan.row_chunks, plan.chunk))
        return lists

    def _launch_bound(self, x, ids, logp, u, tt, kt, pt, qt, rng, capturing):
        """Through ``BoundKernel`` with tensors: the first call (compiles, binds), misaligned pointers, a capture
        (its own workspace), the interpreter. Then, on CUDA, binds the lanes of later aligned calls: each launch's
        C launcher with its arguments laid out once, the per-call ones (``_SLOTS``) put in by position."""
        dev = self.device
        views = self.workspace(dev)
        u = logp if u is None else u                    # all greedy: nothing is drawn (any float32 pointer)
        prm = [logp if tt[0] is None else tt[0], float(tt[1]), tt[2], ids if kt[0] is None else kt[0], int(kt[1]),
               kt[2], logp if pt[0] is None else pt[0], float(pt[1]), pt[2], logp if qt[0] is None else qt[0],
               float(qt[1]), qt[2]]
        check = (x, prm[0], prm[3], prm[6], prm[9], u)
        for kern, a in zip(self.kernels, self._arglists(x, views, ids, logp, u, prm, rng)):
            kern(a, check, dev)
        if capturing or not raw_launches(dev) or self.lanes is not None or any(t.data_ptr() & 15 for t in check):
            return
        key = (current_device(), True, *self.dtypes)
        raw = [kern.entry(key) for kern in self.kernels]
        if any(r is None for r in raw):
            return
        ptrs = tuple(None if v is None else v.data_ptr() for v in views)
        lanes = []
        for (launch, head, tail), a in zip(raw, self._arglists(_SLOTS[0], ptrs, *_SLOTS[1:4], list(_SLOTS[4:16]),
                                                              _SLOTS[16:])):
            full = [*head[:3], None, *head[3:], *a, *tail]
            lanes.append((launch, full, tuple((i, _SLOTS.index(v)) for i, v in enumerate(full)
                                              if isinstance(v, Slot))))
        self.ws = views                                  # held: the pointers in the lanes stay valid
        self.like = (torch.empty_like(ids), torch.empty_like(logp))     # templates of later calls' outputs
        self.lanes = tuple(lanes)


# x, ids, logp, u, then (ptr, value, stride) of temperature, top_k, top_p, min_p, then the Philox key, counter and
# capture tag words (s0, s1, c0, c1, g0, g1): the order of a call's values
_SLOTS = tuple(Slot() for _ in range(22))
_NO_TAG = (0, 0)
_NO_RNG = (0, 0, 0, 0, 0, 0)


def sample_call(x: torch.Tensor, greedy: bool, top_k, t_mode: int, knobs: SampleKnobs, stream,
                philox: int = 0) -> SampleCall | None:
    """The bound problem for ``x`` (``[B, V]``) on ``stream`` (a raw CUDA stream, None elsewhere), cached by a tuple
    of ints; None where the plan is not the kernels' (top_k past the fused kernels: the caller runs torch's path).
    ``philox``: where u comes from (``SampleCall``)."""
    B, V = x.shape
    sb, sv = x.stride()
    dtype, dev = x.dtype, x.device
    # the default knobs as None: a frozen dataclass hashes its fields on every call
    key = (B, V, sb, sv, dtype, dev, stream, greedy, top_k, t_mode, None if knobs is NO_SAMPLE_KNOBS else knobs,
           philox)
    call = _calls.get(key)
    if call is None:
        plan = cached_sample_plan(B, V, dtype, dev, greedy, top_k, knobs)
        if plan.path != "kernels":
            return None
        if len(_calls) >= CALLS_KEPT:
            _calls.clear()
        call = _calls[key] = SampleCall(plan, B, V, sb, sv, t_mode, dev, dtype, philox)
    return call


def _param(v, off) -> tuple:
    """``(tensor or None, value, stride)``: a ``[B, 1]`` tensor (stride 0 when broadcast), or the Python value
    (``off`` for None) with stride -1."""
    if isinstance(v, torch.Tensor):
        return v, 0.0, v.stride(0)
    return None, off if v is None else v, -1


def sample_2d(x: torch.Tensor, t, kk, pp, qq, u, knobs: SampleKnobs = NO_SAMPLE_KNOBS, capturing=None):
    """``(ids [B], logp [B])`` for ``x`` ``[B, V]`` (B >= 1) and the rows' uniforms ``u`` (float32 ``[B]`` on x's
    device; None for an all-greedy call; or :func:`sampling.philox_words` of a generator, or a capture's slots and
    words, ``sampling._graph_philox``: the kernels draw them) on the
    kernels, or None where ``softmax_topk`` would take its sort path (``top_k`` above the fused kernels' range):
    the caller runs torch's path then. ``capturing``: whether x's current stream is being captured, where the
    caller knows it (None: asked here)."""
    if x.dtype == torch.float64:
        x = x.float()
    greedy = not isinstance(t, torch.Tensor) and t == 0
    if greedy:                                      # every row greedy: the first candidate
        kk = pp = qq = None
    tt = _param(t, 1.0)
    t_mode = 0 if tt[2] < 0 and tt[1] == 1.0 else 1
    stream = None
    if x.is_cuda:
        stream = current_stream(current_device())
        if capturing is None:
            capturing = torch._C._cuda_isCurrentStreamCapturing()
    else:
        capturing = False
    philox = 0 if type(u) is not tuple else 1 if len(u) == 4 else 2
    call = sample_call(x, greedy, kk if isinstance(kk, int) else None, t_mode, knobs, stream, philox)
    if call is None:
        return None
    return call(x, tt, _param(kk, 0), _param(pp, 1.0), _param(qq, 0.0), u, stream, capturing)

