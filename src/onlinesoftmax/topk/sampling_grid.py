"""Top-p without top-k on a grid of launches (``SampleKnobs(grid=True)``): the fine bins of ``_topp_bins`` with
every pass a launch of its own over (row, chunk) programs, in place of the row kernel's barriers.

The row kernel keeps all of a row's chunks resident and waiting on each other (``_triton/online.py``'s barrier),
so its programs are at most one per SM, whatever the batch: eight warps per SM over the whole pass. Here no program
waits on another: each launch covers B·C chunks (C up to ``GRID_TABLE``), as many resident as registers allow, and
the next launch reads what the last one wrote. Each program of a launch makes the previous level's choice itself
from the C chunks' histograms, summed in chunk order (every program the same bits), and chunk 0 records it for the
later launches (one record per step, each step writing its own for every row it takes, so that no program reads a
record that its own launch writes, or one a former call left).

A row goes this way when step 1 flagged it, top-p is on, top-k off and min-p off (the kept set is then the nucleus
alone: its mass per chunk comes from the histograms, no pass); every other flagged row, and a row whose bins fail
(a boundary bin past ``CAP`` elements, a range that is not finite), is left flagged for the row kernel after.

1. ``STEP`` 1: each chunk's 16-bin masses of ``f >> 8`` over the fine bins f < 4096 (``_bin_pass`` level 1), and
   its mass past them.
2. ``STEP`` 2: W (the row's mass: both sums), P = top_p · W and the group d1 where the mass from the top reaches P;
   each chunk's 16-bin masses and counts inside d1.
3. ``STEP`` 3: the group G = 16·d1 + d2 (the same rule, counts of its elements n); where n > ``LIST``
   (``SampleKnobs.grid_list``) each chunk's masses and counts of the 16 fine bins of G, else each chunk lists G's
   elements (index order, the counts of the chunks before it giving its offset).
4. ``STEP`` 4: where step 3 counted, the fine bin F = 16·G + d3 and its list (at most ``CAP``).
5. ``_grid_finish_kernel``, a program per row: the list sorted and cut where the mass from the top reaches P
   (``_cut_list``), each chunk's kept mass (its bins above the boundary's, level by level, and its listed elements
   the cut keeps), the chunk holding u · W_kept scanned for the draw (``_scan_draw``); the row's flag cleared.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .kernels import INT32_MIN, _key_of
from .sampling_kernels import (
    SHORT_LIST,
    _advance,
    _bin_pass,
    _bins_digit,
    _bins_scale,
    _cut_list,
    _first_block,
    _gather16,
    _level_choice,
    _list_bin,
    _load_chunk,
    _row_params,
    _row_scale,
    _scan_draw,
    _uniform,
)

REC = tl.constexpr(4)       # a step's record per row: (status: 0 on, 1 left to the row kernel; levels; G; n), int32,
                            # and (P, mass above G), float32


@triton.jit
def _grid_row(flag_ptr, row, t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride, q_ptr, q_val,
              q_stride, V, PDL: tl.constexpr):
    """(whether row ``row`` goes this way: flagged by step 1, top-p on, no top-k cut, no min-p; its top_p). With
    ``PDL`` (a programmatic dependent launch, ``SamplePlan.pdl``) the row's parameters, the caller's tensors, are
    read before waiting for the launch before this one to finish, the flag after."""
    t, kk, tp, mp, bad = _row_params(t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride,
                                     q_ptr, q_val, q_stride, row, V)
    if PDL:
        gdc_wait()
    on = (tl.load(flag_ptr + row) != 0) & (tp < 1.0) & (kk >= V) & (mp == 0.0) & ~bad
    return on, tp


@triton.jit
def _record(RS, RF, row, step, status, levels, G, n, P, above):
    q = tl.arange(0, REC)
    base = (row * 3 + step) * REC
    tl.store(RS + base + q, tl.where(q == 0, status, tl.where(q == 1, levels, tl.where(q == 2, G, n))))
    tl.store(RF + base + q, tl.where(q == 0, P, above), mask=q < 2)


@triton.jit
def _read(RS, RF, row, step):
    """A step's record of row ``row``: (status, levels, G, n, P, above)."""
    q = tl.arange(0, REC)
    base = (row * 3 + step) * REC
    r = tl.load(RS + base + q)
    f = tl.load(RF + base + q, mask=q < 2, other=0.0)
    return (tl.sum(tl.where(q == 0, r, 0)), tl.sum(tl.where(q == 1, r, 0)), tl.sum(tl.where(q == 2, r, 0)),
            tl.sum(tl.where(q == 3, r, 0)), tl.sum(tl.where(q == 0, f, 0.0)), tl.sum(tl.where(q == 1, f, 0.0)))


@triton.jit(do_not_specialize=("stride_b", "V", "K", "C", "CH", "t_val", "t_stride", "k_val", "k_stride",
                               "p_val", "p_stride", "q_val", "q_stride"))
def _grid_pass_kernel(x_ptr, stride_b, stride_v, V, ind_ptr, lse_ptr, flag_ptr, t_ptr, t_val, t_stride, k_ptr, k_val,
                      k_stride, p_ptr, p_val, p_stride, q_ptr, q_val, q_stride, K, H1, R1, H2, N2, H3, N3, RS, RF, EB,
                      C, CH, STEP: tl.constexpr, BLOCK: tl.constexpr, CP: tl.constexpr, CAP: tl.constexpr,
                      LIST: tl.constexpr, LANE_COUNTS: tl.constexpr, PDL: tl.constexpr):
    """Steps 1–4, program ``pid`` = chunk ``pid % C`` (CH elements) of row ``pid // C``. ``PDL``: the next launch
    may start at once (its programs wait for this one to finish before they read what it writes)."""
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    row = pid // C
    chunk = pid % C
    x_row = x_ptr + row.to(tl.int64) * stride_b
    lo = chunk * CH
    hi = tl.minimum(lo + CH, V)
    if PDL:     # the chunk's first block in flight while waiting (every row's: its flag is not known yet)
        x0 = _first_block(x_row, stride_v, lo, hi, BLOCK)
    on, tp = _grid_row(flag_ptr, row, t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride, q_ptr,
                       q_val, q_stride, V, PDL)
    if on:
        if not PDL:
            x0 = _first_block(x_row, stride_v, lo, hi, BLOCK)
        c, x_max, lse2 = _row_scale(x_row, stride_v, ind_ptr, lse_ptr, t_ptr, t_val, t_stride, row, K)
        s = _bins_scale(lse2, c, tp, V, x_max)
        bins = tl.arange(0, 16)
        mine = (row * C + chunk) * 16 + bins
        if STEP == 1:
            h, rest, _n = _bin_pass(x_row, stride_v, lo, hi, c, lse2, x_max, s, 0, x0, 1, BLOCK)
            tl.store(H1 + mine, h)
            tl.store(R1 + row * C + chunk, rest)
        elif STEP == 2:
            j = tl.arange(0, CP)
            h = _gather16(H1, row, C, CP)
            w = tl.sum(h) + tl.sum(tl.load(R1 + row * C + j, mask=j < C, other=0.0, cache_modifier=".cg"))
            P = tp * w
            d1, above = _bins_digit(h, 0.0, P)
            ok = (d1 < 16) & (s > 0.0) & (s < float("inf"))
            if chunk == 0:
                _record(RS, RF, row, 0, 1 - ok.to(tl.int32), 1, d1, 0, P, above)
            if ok:
                h, _r, cnt = _bin_pass(x_row, stride_v, lo, hi, c, lse2, x_max, s, d1, x0, 2, BLOCK, LANE_COUNTS)
                tl.store(H2 + mine, h)
                tl.store(N2 + mine, cnt)
        elif STEP == 3:
            status, _lv, G, _n, P, above = _read(RS, RF, row, 0)
            if status == 0:
                G, n, base, above, ok = _level_choice(H2, N2, row, chunk, C, G, above, P, CP)
                if chunk == 0:
                    _record(RS, RF, row, 1, 1 - ok, 2, G, n, P, above)
                if ok != 0:
                    if n > LIST:
                        h, _r, cnt = _bin_pass(x_row, stride_v, lo, hi, c, lse2, x_max, s, G, x0, 3, BLOCK,
                                                 LANE_COUNTS)
                        tl.store(H3 + mine, h)
                        tl.store(N3 + mine, cnt)
                    else:
                        _list_bin(x_row, stride_v, lo, hi, x_max, s, 4, G, EB + row * CAP, base, x0, BLOCK)
            elif chunk == 0:        # left to the row kernel: said again, so no later step reads a stale record
                _record(RS, RF, row, 1, status, 1, G, 0, P, above)
        else:
            status, levels, G, n, P, above = _read(RS, RF, row, 1)
            if (status == 0) & (n > LIST):
                G, n, base, above, ok = _level_choice(H3, N3, row, chunk, C, G, above, P, CP)
                ok = ok & (n <= CAP).to(tl.int32)
                if chunk == 0:
                    _record(RS, RF, row, 2, 1 - ok, 3, G, n, P, above)
                if ok != 0:
                    _list_bin(x_row, stride_v, lo, hi, x_max, s, 0, G, EB + row * CAP, base, x0, BLOCK)
            elif chunk == 0:
                _record(RS, RF, row, 2, status, levels, G, n, P, above)


@triton.jit
def _kept_of_bins(HM, row, C, d, CP: tl.constexpr):
    """Each chunk's mass in the 16 bins ``HM`` above bin d (``[CP]``)."""
    j = tl.arange(0, CP)
    bins = tl.arange(0, 16)
    h = tl.load(HM + ((row * C + j) * 16)[:, None] + bins[None, :], mask=(j < C)[:, None] & (bins < d)[None, :],
                other=0.0, cache_modifier=".cg")
    return tl.sum(h, axis=1)


@triton.jit(do_not_specialize=("stride_b", "stride_v", "V", "K", "C", "CH", "t_val", "t_stride", "k_val", "k_stride",
                               "p_val", "p_stride", "q_val", "q_stride", "s0", "s1", "c0", "c1", "g0", "g1"))
def _grid_finish_kernel(x_ptr, stride_b, stride_v, V, ind_ptr, lse_ptr, u_ptr, ids_ptr, logp_ptr, flag_ptr,
                        t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride, q_ptr, q_val,
                        q_stride, s0, s1, c0, c1, g0, g1, K, H1, H2, H3, RS, RF, EB, C, CH, BLOCK: tl.constexpr,
                        CP: tl.constexpr, CAP: tl.constexpr, LB: tl.constexpr, PHILOX: tl.constexpr,
                        PDL: tl.constexpr):
    """Step 5, a program per row: the cut, the chunks' kept masses, the draw; the row's flag cleared (the row
    kernel after it then returns at once), its replay count advanced (``PHILOX`` 2)."""
    if PDL:
        gdc_launch_dependents()
    row = tl.program_id(0)
    on, tp = _grid_row(flag_ptr, row, t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride, q_ptr,
                       q_val, q_stride, V, PDL)
    if on:
        status, levels, G, n, P, above = _read(RS, RF, row, 2)
        if status == 0:
            x_row = x_ptr + row.to(tl.int64) * stride_b
            c, x_max, lse2 = _row_scale(x_row, stride_v, ind_ptr, lse_ptr, t_ptr, t_val, t_stride, row, K)
            lst = EB + row * CAP
            if n <= SHORT_LIST:
                tb, ub = _cut_list(x_row, stride_v, V, c, lse2, lst, n, above, P, SHORT_LIST)
            else:
                tb, ub = _cut_list(x_row, stride_v, V, c, lse2, lst, n, above, P, CAP)
            # each chunk's kept mass: its bins above the boundary's at every level, then its listed elements that
            # the cut keeps (the list is in index order: chunk by chunk)
            d1 = G >> (4 * (levels - 1))
            d2 = (G >> (4 * (levels - 2))) & 15
            kept = _kept_of_bins(H1, row, C, d1, CP) + _kept_of_bins(H2, row, C, d2, CP)
            if levels == 3:
                kept += _kept_of_bins(H3, row, C, G & 15, CP)
            j = tl.arange(0, CP)
            for st in range(0, n, LB):
                e = st + tl.arange(0, LB)
                idx = tl.load(lst + e, mask=e < n, other=0, cache_modifier=".cg")
                x = _load_chunk(x_row, stride_v, idx, tl.where(e < n, V, 0))
                key = _key_of(x)
                keep = ((key > tb) | ((key == tb) & (idx <= ub))) & (e < n)
                pk = tl.where(keep, tl.exp2(x * c - lse2), 0.0)
                kept += tl.sum(tl.where((idx // CH)[None, :] == j[:, None], pk[None, :], 0.0), axis=1)
            w_kept = tl.sum(kept)
            u, n_u = _uniform(u_ptr, row, s0, s1, c0, c1, g0, g1, PHILOX)
            target = u * w_kept
            before = tl.cumsum(kept, 0) - kept
            owner = tl.max(tl.where((before <= target) & (kept > 0.0) & (j < C), j, -1))
            if owner < 0:       # nothing kept (cannot happen: the row's largest p always stays): say so
                tl.store(ids_ptr + row, tl.full([], -1, tl.int64))
                tl.store(logp_ptr + row, float("nan"))
            else:
                lo = owner * CH
                _scan_draw(x_row, stride_v, lo, tl.minimum(lo + CH, V), c, lse2, tl.full([], INT32_MIN, tl.int32),
                           2147483647, tb, ub, 0.0, tl.sum(tl.where(j == owner, before, 0.0)), target, w_kept,
                           ids_ptr + row, logp_ptr + row, BLOCK)
            tl.store(flag_ptr + row, 0)
            _advance(u_ptr, row, n_u, g0, g1, PHILOX)
