"""Fused sampling after ``softmax_topk``: the filters and the draw on the k candidates, and an exact full-row pass.

The order of the row is (x descending, index ascending), the same at every temperature T > 0. Every filter keeps a
prefix of that order, so the kept set is the shortest of them: top-k the first k; top-p the first positions whose
mass *before* them is below ``top_p · W`` (W the mass the top-k keeps, the first always stays); min-p every
``p >= min_p · p_max``. The draw is by inverse CDF: with the row's uniform ``u`` (a tensor the caller drew with its
generator, or passed), the first kept token *in index order* whose running mass exceeds ``u · W_kept`` (never one
of p = 0). The log-probability is ``log p − log W_kept``.

1. ``_sample_kernel``, one program per row, on the K sorted candidates of ``softmax_topk(x / T, K)`` (``p`` of the
   whole row): each active filter either ends inside the candidates (decided) or provably runs past them; the
   kept length is the shortest decided one. Rows it cannot decide (top-p or min-p past the K candidates, a
   per-row top-k above K, no filter on a row longer than K) are flagged for step 2; greedy rows (T = 0) take the
   first candidate; rows with no distribution (lse not finite) or a parameter out of range get id -1, NaN.
2. ``_sample_row_kernel``, one program per flagged row (the others return at once), over x itself: the boundary
   of each filter by bisection on the order-preserving int32 key of x (32 passes over the row each: counts for
   top-k, masses for top-p), ties at a boundary cut by the index (bisection on the index bits), then the mass
   of the kept set and the inverse-CDF scan in index order. Exact and sync-free, but O(V · 32) work per flagged
   row on one program: a cost for flat rows, whose nucleus holds thousands of tokens.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._triton.online import LOG2E
from .kernels import INT32_MIN, _key_of, _log2_scale, _param, _value_of


@triton.jit
def _row_params(t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride, q_ptr, q_val, q_stride,
                row, V):
    """(T, top-k length or V, top_p (1: off), min_p (0: off), bad) of row ``row`` (each a scalar where its stride
    is < 0, else loaded: ``_param``); bad where a value is out of range (T not finite or < 0, top_p not in
    (0, 1], min_p not in [0, 1]). A top-k of 0 or less, or >= V, keeps every entry."""
    t = _param(t_ptr, t_val, t_stride, row)
    tp = _param(p_ptr, p_val, p_stride, row)
    mp = _param(q_ptr, q_val, q_stride, row)
    kl = tl.load(k_ptr + row.to(tl.int64) * tl.maximum(k_stride, 0)).to(tl.int64)
    kk = tl.where(k_stride < 0, k_val, tl.where(kl > V, V, kl)).to(tl.int32)
    kk = tl.where((kk <= 0) | (kk > V), V, kk)
    bad = ~((t >= 0.0) & (t < float("inf"))) | ~((tp > 0.0) & (tp <= 1.0)) | ~((mp >= 0.0) & (mp <= 1.0))
    return t, kk, tp, mp, bad


@triton.jit(do_not_specialize=("K", "V", "t_val", "t_stride", "k_val", "k_stride", "p_val", "p_stride",
                               "q_val", "q_stride"))
def _sample_kernel(val_ptr, ind_ptr, lse_ptr, u_ptr, ids_ptr, logp_ptr, flag_ptr,
                   t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride, q_ptr, q_val, q_stride,
                   K, V, KP: tl.constexpr):
    """Step 1 on row ``pid``'s K candidates (``p`` sorted descending, their indices, the row's lse of x / T)."""
    row = tl.program_id(0)
    j = tl.arange(0, KP)
    live = j < K
    p = tl.load(val_ptr + row.to(tl.int64) * K + j, mask=live, other=0.0)
    lse = tl.load(lse_ptr + row)
    t, kk, tp, mp, bad = _row_params(t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride,
                                     q_ptr, q_val, q_stride, row, V)
    undefined = bad | ~((lse > float("-inf")) & (lse < float("inf")))    # also NaN
    greedy = t == 0.0
    all_in = K == V                         # the candidates are the whole row: every filter ends inside
    # a. top-k: decided when kk <= K (its mass W known); off (kk = V) it keeps the whole row, of mass 1
    k_on = kk < V
    k_dec = (k_on & (kk <= K)) | all_in
    lk = tl.minimum(kk, K)
    csum = tl.cumsum(p, 0)
    w = tl.sum(tl.where(j < lk, p, 0.0))
    w = tl.where(k_on | all_in, w, 1.0)
    w_known = k_dec | ~k_on
    # b. top-p: the positions whose mass before them is below top_p · W (the first always stays). Decided when it
    # ends inside the top-k's candidates; past the K candidates it is longer than K
    p_on = tp < 1.0
    lp = tl.maximum(tl.sum(((csum - p < tp * w) & (j < lk)).to(tl.int32)), 1)
    last = tl.sum(tl.where(j == lk - 1, csum, 0.0))           # mass of the first min(kk, K) candidates
    p_dec = w_known & (k_dec | (last >= tp * w))
    # c. min-p: p >= min_p · p_max; decided when some candidate falls below it
    q_on = mp > 0.0
    p_max = tl.max(p)
    lq = tl.sum(((p >= mp * p_max) & live).to(tl.int32))
    q_dec = (lq < K) | all_in
    # the kept length: the shortest decided filter (an undecided one is longer than K, or unbounded: k off)
    big = 2147483647
    n = tl.where(k_on & k_dec, lk, big)
    n = tl.minimum(n, tl.where(p_on & p_dec, lp, big))
    n = tl.minimum(n, tl.where(q_on & q_dec, lq, big))
    n = tl.where(all_in, tl.minimum(n, K), n)          # no filter on a row the candidates hold: all of it
    decided = ((n < big) & ~(p_on & ~w_known)) | greedy | undefined
    n = tl.minimum(n, K)
    # d. the draw: the kept candidates in index order (one int64 sort: index, then p's bits), the first whose
    # running mass exceeds u · W_kept (never one of p = 0)
    keep = j < n
    ind = tl.load(ind_ptr + row.to(tl.int64) * K + j, mask=live, other=0)
    packed = tl.where(keep, (ind << 32) | (p.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF),
                      9223372036854775807)
    packed = tl.sort(packed)
    kept = packed != 9223372036854775807
    ps = tl.where(kept, (packed & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True), 0.0)
    w_kept = tl.sum(ps)
    u = tl.load(u_ptr + row).to(tl.float32)
    pos = tl.sum(((tl.cumsum(ps, 0) <= u * w_kept) & kept).to(tl.int32))
    pos = tl.minimum(pos, tl.max(tl.where(kept & (ps > 0.0), j, 0)))
    sel = j == pos
    pick = tl.sum(tl.where(sel, packed >> 32, 0))
    p_pick = tl.sum(tl.where(sel, ps, 0.0))
    logp = tl.log(p_pick) - tl.log(w_kept)
    # greedy: the first candidate (the argmax, lowest index among ties), probability 1
    first = tl.sum(tl.where(j == 0, ind, 0))
    pick = tl.where(greedy, first, pick)
    logp = tl.where(greedy, 0.0, logp)
    pick = tl.where(undefined, -1, pick)
    logp = tl.where(undefined, float("nan"), logp)
    tl.store(flag_ptr + row, (~decided).to(tl.int32))
    if decided:
        tl.store(ids_ptr + row, pick)
        tl.store(logp_ptr + row, logp)


@triton.jit
def _mass_count(x_row, stride_v, V, c, lse2, t, BLOCK: tl.constexpr):
    """(#{key >= t}, Σ p over key >= t) of the row, p = 2^(x·c − lse2): one pass over x."""
    cnt = 0
    mass = 0.0
    for s in range(0, V, BLOCK):
        o = s + tl.arange(0, BLOCK)
        x = tl.load(x_row + o.to(tl.int64) * stride_v, mask=o < V, other=float("-inf")).to(tl.float32)
        ge = (_key_of(x) >= t) & (o < V)
        cnt += tl.sum(ge.to(tl.int32))
        mass += tl.sum(tl.where(ge, tl.exp2(x * c - lse2), 0.0))
    return cnt, mass


@triton.jit
def _kth_by_count(x_row, stride_v, V, c, lse2, n, BLOCK: tl.constexpr):
    """The largest key t with #{key >= t} >= n (the n-th largest key): 32 passes of bisection."""
    t = tl.full([], INT32_MIN, tl.int32)
    for i in range(32):
        cand = t + (tl.full([], 1, tl.int32) << (31 - i))
        cnt, mass = _mass_count(x_row, stride_v, V, c, lse2, cand, BLOCK)
        t = tl.where(cnt >= n, cand, t)
    return t


@triton.jit
def _kth_by_mass(x_row, stride_v, V, c, lse2, target, BLOCK: tl.constexpr):
    """The largest key t with Σ p over key >= t >= ``target`` (the top-p boundary key): 32 passes."""
    t = tl.full([], INT32_MIN, tl.int32)
    for i in range(32):
        cand = t + (tl.full([], 1, tl.int32) << (31 - i))
        cnt, mass = _mass_count(x_row, stride_v, V, c, lse2, cand, BLOCK)
        t = tl.where(mass >= target, cand, t)
    return t


@triton.jit
def _tie_cut(x_row, stride_v, V, t, n, BLOCK: tl.constexpr):
    """The index of the n-th (n >= 1) element of key t in index order: bisection on the index bits."""
    u = -1
    for i in range(31):     # the largest u with #{key == t, index <= u} < n; the answer is u + 1's element
        cand = u + (1 << (30 - i))
        if cand < V:        # (a cut at or past V counts every tie: u stays)
            cnt = 0
            for s in range(0, V, BLOCK):
                o = s + tl.arange(0, BLOCK)
                x = tl.load(x_row + o.to(tl.int64) * stride_v, mask=o < V, other=float("-inf")).to(tl.float32)
                cnt += tl.sum(((_key_of(x) == t) & (o <= cand) & (o < V)).to(tl.int32))
            u = tl.where(cnt < n, cand, u)
    return u + 1


@triton.jit
def _prefix_cut(x_row, stride_v, V, c, lse2, t, n_incl, BLOCK: tl.constexpr):
    """A prefix of the order ending at key t with ``n_incl`` of its ties as (t, index cut): members are key > t,
    or key == t and index <= cut."""
    cnt_ge, m_ge = _mass_count(x_row, stride_v, V, c, lse2, t, BLOCK)
    cnt_gt, m_gt = _mass_count(x_row, stride_v, V, c, lse2, t + 1, BLOCK)
    cut = 2147483647
    if n_incl < cnt_ge - cnt_gt:
        cut = _tie_cut(x_row, stride_v, V, t, n_incl, BLOCK)
    return cut


@triton.jit(do_not_specialize=("stride_b", "stride_v", "V", "K", "t_val", "t_stride", "k_val", "k_stride",
                               "p_val", "p_stride", "q_val", "q_stride"))
def _sample_row_kernel(x_ptr, stride_b, stride_v, V, ind_ptr, lse_ptr, u_ptr, ids_ptr, logp_ptr, flag_ptr,
                       t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride, q_ptr, q_val,
                       q_stride, K, BLOCK: tl.constexpr):
    """Step 2 for row ``pid`` if step 1 flagged it, over x (see the module's docstring)."""
    row = tl.program_id(0)
    if tl.load(flag_ptr + row) != 0:
        _sample_row(x_ptr + row.to(tl.int64) * stride_b, stride_v, V, ind_ptr, lse_ptr, u_ptr, ids_ptr, logp_ptr,
                    t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride, q_ptr, q_val,
                    q_stride, K, row, BLOCK)


@triton.jit
def _sample_row(x_row, stride_v, V, ind_ptr, lse_ptr, u_ptr, ids_ptr, logp_ptr,
                t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride, q_ptr, q_val, q_stride,
                K, row, BLOCK: tl.constexpr):
    t_row, kk, tp, mp, bad = _row_params(t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride,
                                         q_ptr, q_val, q_stride, row, V)
    c = _log2_scale(t_ptr, t_val, t_stride, row, 1)
    lse2 = tl.load(lse_ptr + row) * LOG2E
    x_max = tl.load(x_row + tl.load(ind_ptr + row.to(tl.int64) * K) * stride_v).to(tl.float32)
    p_max = tl.exp2(x_max * c - lse2)                # as every p here: the min-p test is on this same form
    top = tl.full([], 2147483647, tl.int32)
    # a. top-k: its boundary key and tie cut, and the mass W it keeps (else W = the whole row's)
    tk = tl.full([], INT32_MIN, tl.int32)
    uk = 2147483647
    if kk < V:
        tk = _kth_by_count(x_row, stride_v, V, c, lse2, kk, BLOCK)
        n_gt, m_gt = _mass_count(x_row, stride_v, V, c, lse2, tk + 1, BLOCK)
        uk = _prefix_cut(x_row, stride_v, V, c, lse2, tk, kk - n_gt, BLOCK)
        w = m_gt + (kk - n_gt).to(tl.float32) * tl.exp2(_value_of(tk) * c - lse2)
    else:
        n_all, w = _mass_count(x_row, stride_v, V, c, lse2, INT32_MIN, BLOCK)
    # b. top-p inside the top-k: the boundary key tb (largest with mass(key >= tb) >= top_p · W), and how many of
    # its ties have mass before them below top_p · W
    tb = tl.full([], INT32_MIN, tl.int32)
    ub = 2147483647
    if tp < 1.0:
        target = tp * w
        tb = tl.maximum(_kth_by_mass(x_row, stride_v, V, c, lse2, target, BLOCK), tk)
        n_gt, m_gt = _mass_count(x_row, stride_v, V, c, lse2, tb + 1, BLOCK)
        pb = tl.maximum(tl.exp2(_value_of(tb) * c - lse2), 1e-38)   # > 0: tb is the key of a mass
        n_incl = tl.maximum(tl.ceil((target - m_gt) / pb).to(tl.int32), 1)
        ub = _prefix_cut(x_row, stride_v, V, c, lse2, tb, n_incl, BLOCK)
        if tb == tk:
            ub = tl.minimum(ub, uk)
    # c. the kept set: every filter's prefix (min-p: p >= min_p · p_max); its mass, then the inverse-CDF scan in
    # index order (never landing on p = 0)
    thr = mp * p_max
    w_kept = 0.0
    for s in range(0, V, BLOCK):
        o = s + tl.arange(0, BLOCK)
        x = tl.load(x_row + o.to(tl.int64) * stride_v, mask=o < V, other=float("-inf")).to(tl.float32)
        key = _key_of(x)
        pr = tl.exp2(x * c - lse2)
        kept = ((key > tk) | ((key == tk) & (o <= uk))) & ((key > tb) | ((key == tb) & (o <= ub)))
        kept = kept & (pr >= thr) & (o < V)
        w_kept += tl.sum(tl.where(kept, pr, 0.0))
    target = tl.load(u_ptr + row).to(tl.float32) * w_kept
    run = 0.0
    pick = -1
    last = -1
    p_pick = 0.0
    for s in range(0, V, BLOCK):
        o = s + tl.arange(0, BLOCK)
        x = tl.load(x_row + o.to(tl.int64) * stride_v, mask=o < V, other=float("-inf")).to(tl.float32)
        key = _key_of(x)
        pr = tl.exp2(x * c - lse2)
        kept = ((key > tk) | ((key == tk) & (o <= uk))) & ((key > tb) | ((key == tb) & (o <= ub)))
        kept = kept & (pr >= thr) & (o < V) & (pr > 0.0)
        pk = tl.where(kept, pr, 0.0)
        cs = run + tl.cumsum(pk, 0)
        first = tl.min(tl.where(kept & (cs > target), o, top))
        take = (pick < 0) & (first < top)
        p_first = tl.sum(tl.where(o == first, pr, 0.0))
        pick = tl.where(take, first, pick)
        p_pick = tl.where(take, p_first, p_pick)
        last = tl.maximum(last, tl.max(tl.where(kept, o, -1)))
        run += tl.sum(pk)
    if pick < 0:            # rounding: u · W_kept at or past the scan's total; the last kept entry
        pick = last
        xl = tl.load(x_row + last.to(tl.int64) * stride_v).to(tl.float32)
        p_pick = tl.exp2(xl * c - lse2)
    tl.store(ids_ptr + row, pick.to(tl.int64))
    tl.store(logp_ptr + row, tl.log(p_pick) - tl.log(w_kept))
