"""Fused sampling after ``softmax_topk``: the filters and the draw on the k candidates, and an exact full-row pass.

The order of the row is (x descending, index ascending), the same at every temperature T > 0. Every filter keeps a
prefix of that order, so the kept set is the shortest of them: top-k the first k; top-p the first positions whose
mass *before* them is below ``top_p · W`` (W the mass the top-k keeps, the first always stays); min-p every
``p >= min_p · p_max``. The draw is by inverse CDF: with the row's uniform ``u`` (a tensor the caller drew with its
generator, or passed; or with ``PHILOX``, drawn here: :func:`_uniform`), the first kept token *in index order*
whose running mass exceeds ``u · W_kept`` (never one of p = 0). The log-probability is ``log p − log W_kept``.
Step 1 sums p in fp32 (an order that follows the reduction's layout) or, with ``FIXED``, in int64 fixed point
(p·2^61: exact, the same bits in every layout; ``SampleKnobs.mass``).

1. ``_sample_kernel``, one program per row, on the K sorted candidates of ``softmax_topk(x / T, K)`` (``p`` of the
   whole row): each active filter either ends inside the candidates (decided) or provably runs past them; the
   kept length is the shortest decided one. Rows it cannot decide (top-p or min-p past the K candidates, a
   per-row top-k above K, no filter on a row longer than K) are flagged for step 2; greedy rows (T = 0) take the
   first candidate; rows with no distribution (lse not finite) or a parameter out of range get id -1, NaN.
2. ``_sample_row_kernel``, C programs per flagged row (the others return at once), each over a chunk of x, the
   row's programs waiting for each other at a per-row barrier (``_triton/online.py``; all B·C programs resident at
   once: ``row_chunks``). The boundary key of each filter by radix select on ``u = key + 2^31``, 4 bits per level
   from the top: each chunk's 16-bin histogram (counts for top-k, masses for top-p) of the elements that match the
   prefix so far, published; after the barrier every program sums the C histograms in chunk order (deterministic,
   no atomics) and takes the same digit: the largest whose total from the top still reaches the target. 8 levels
   per boundary, then the other unit above and at the boundary in one pass. Ties at a boundary are cut by index
   (the n-th tie in index order: per-chunk counts, a barrier, the chunk holding it finds it). Then each chunk's
   kept mass, a barrier, and the chunk holding ``u · W_kept`` scans for the drawn token.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .._triton.online import LN2, LOG2E, _row_barrier, _row_generation
from .kernels import INT32_MIN, _huge, _key_of, _log2_scale, _merge_rows, _param, _ranked


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


MASS_SCALE = tl.constexpr(2.0 ** 61)   # a kept mass (<= 1 plus rounding) stays below 2^63 in these int64 units
MASS_UNIT = tl.constexpr(2.0 ** -61)


@triton.jit
def _word(v):
    """The low 32 bits of an integer as uint32 (an int32 or int64 argument)."""
    return (v.to(tl.int64) & 0xFFFFFFFF).to(tl.uint32)


GRAPH_REPLAYS = tl.constexpr(2 ** 32)   # replays of a captured call per row before its count starts again at 0


@triton.jit
def _uniform(u_ptr, row, s0, s1, c0, c1, g0, g1, PHILOX: tl.constexpr):
    """Row ``row``'s u in [0, 1) and its replay count n: u loaded (``PHILOX`` 0, n = 0), or drawn by
    Philox-4x32-10 with key (s0, s1) (the generator's seed, low and high words) at counter (c + n, row, 0), c =
    (c0, c1) (the generator's offset / 4: curand's state of subsequence ``row`` at that offset, as torch's kernels
    seed a thread); the first word's top 24 bits · 2^-24. ``PHILOX`` 1: n = 0 (an eager call's words). ``PHILOX``
    2 (a call captured into a CUDA graph): ``u_ptr`` is the capture's int64 slot per row, holding g + n after n
    replays (g = (g0, g1), the capture's random tag); a slot whose n is not in [0, 2^32) (memory never written by
    this capture) counts as n = 0. :func:`_advance` writes g + n + 1 once the row has drawn: each program reads and
    writes its own row's slot, no program waits on another."""
    if PHILOX == 0:
        return tl.load(u_ptr + row).to(tl.float32), tl.zeros([], tl.int64)
    else:
        if PHILOX == 2:
            tag = (_word(g1).to(tl.int64) << 32) | _word(g0).to(tl.int64)
            n = tl.load(u_ptr + row) - tag
            n = tl.where((n >= 0) & (n < GRAPH_REPLAYS), n, 0)
        else:
            n = tl.zeros([], tl.int64)
        seed = (_word(s1).to(tl.uint64) << 32) | _word(s0).to(tl.uint64)
        ctr = ((_word(c1).to(tl.uint64) << 32) | _word(c0).to(tl.uint64)) + n.to(tl.uint64)
        r, _, _, _ = tl.philox(seed, (ctr & 0xFFFFFFFF).to(tl.uint32), (ctr >> 32).to(tl.uint32), _word(row),
                               tl.zeros([], tl.uint32))
        return (r >> 8).to(tl.int32).to(tl.float32) * (1.0 / 16777216.0), n


@triton.jit
def _advance(u_ptr, row, n, g0, g1, PHILOX: tl.constexpr):
    """``PHILOX`` 2: row ``row``'s slot to g + n + 1 (its next replay draws at counter c + n + 1)."""
    if PHILOX == 2:
        tl.store(u_ptr + row, ((_word(g1).to(tl.int64) << 32) | _word(g0).to(tl.int64)) + n + 1)


@triton.jit
def _mass(p, FIXED: tl.constexpr):
    """p (>= 0, or NaN) in the unit step 1 sums masses in: fp32, or (``FIXED``) int64 p·2^61, truncated (exact for
    p >= 2^-37; NaN as 0). Integer sums do not depend on the order of the additions."""
    if FIXED:
        return (tl.where(p > 0.0, p, 0.0) * MASS_SCALE).to(tl.int64)
    else:
        return p


@triton.jit
def _scaled(f, w, FIXED: tl.constexpr):
    """f · w for a mass w in :func:`_mass`'s unit (``FIXED``: in fp64, truncated to the unit)."""
    if FIXED:
        return (f.to(tl.float64) * w.to(tl.float64)).to(tl.int64)
    else:
        return f * w


@triton.jit
def _prob(w, FIXED: tl.constexpr):
    """A mass in :func:`_mass`'s unit as an fp32 probability."""
    if FIXED:
        return w.to(tl.float32) * MASS_UNIT
    else:
        return w


@triton.jit(do_not_specialize=("K", "V", "t_val", "t_stride", "k_val", "k_stride", "p_val", "p_stride",
                               "q_val", "q_stride", "s0", "s1", "c0", "c1", "g0", "g1"))
def _sample_kernel(val_ptr, ind_ptr, lse_ptr, u_ptr, ids_ptr, logp_ptr, flag_ptr,
                   t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride, q_ptr, q_val, q_stride,
                   s0, s1, c0, c1, g0, g1, K, V, KP: tl.constexpr, FIXED: tl.constexpr, PHILOX: tl.constexpr,
                   PDL: tl.constexpr):
    """Step 1 on row ``pid``'s K candidates (``p`` sorted descending, their indices, the row's lse of x / T);
    (s0, s1, c0, c1, g0, g1): the Philox seed, counter and capture tag where ``PHILOX`` (else unused). A row the
    candidates decide advances its replay count here (``PHILOX`` 2), a flagged one in the row kernel. ``PDL``
    (``SamplePlan.pdl``): launched while the merge before it may still run; it waits for it before any load, and
    lets the next launch start at once."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    row = tl.program_id(0)
    j = tl.arange(0, KP)
    live = j < K
    p = tl.load(val_ptr + row.to(tl.int64) * K + j, mask=live, other=0.0)
    ind = tl.load(ind_ptr + row.to(tl.int64) * K + j, mask=live, other=0)
    u, n = _uniform(u_ptr, row, s0, s1, c0, c1, g0, g1, PHILOX)
    decided = _draw(p, ind, j, K, tl.load(lse_ptr + row), row, u, ids_ptr, logp_ptr, flag_ptr, t_ptr, t_val,
                    t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride, q_ptr, q_val, q_stride, V, True, FIXED)
    if decided:
        _advance(u_ptr, row, n, g0, g1, PHILOX)


@triton.jit(do_not_specialize=("k", "S", "BS", "t_val", "t_stride", "k_val", "k_stride", "p_val", "p_stride",
                               "q_val", "q_stride", "s0", "s1", "c0", "c1", "g0", "g1"))
def _sample_merge_kernel(x_ptr, stride_b, stride_v, V, ws_ptr, k, S, BS, u_ptr, ids_ptr, logp_ptr,
                         t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride, q_ptr, q_val,
                         q_stride, s0, s1, c0, c1, g0, g1, BLOCK: tl.constexpr, R: tl.constexpr, CAP: tl.constexpr,
                         SP: tl.constexpr, CT: tl.constexpr, FAST: tl.constexpr, EXACT: tl.constexpr,
                         W: tl.constexpr, T_MODE: tl.constexpr, FIXED: tl.constexpr, PHILOX: tl.constexpr):
    """Step 1 fused into the last merge of ``softmax_topk(x / T, k)`` (``fuse``): the row's k sorted candidates
    go from the merge's registers to the filters and the draw, not through memory (no values, indices or lse
    written and read back, one launch less). Only where step 1 decides every row (an int top_k, or greedy): no
    flag, no step 2."""
    row, buf, n, t, m, d, c = _merge_rows(x_ptr, stride_b, stride_v, V, ws_ptr, ws_ptr, logp_ptr, k, S, BS, S, 1,
                                          t_ptr, t_val, t_stride, BLOCK, R, CAP, SP, CT, FAST, EXACT, False, W, T_MODE,
                                          False)
    j, p, ind = _ranked(buf, n, m, d, c, CAP, FAST)
    live = j < k
    u, n_u = _uniform(u_ptr, row, s0, s1, c0, c1, g0, g1, PHILOX)
    _draw(tl.where(live, p, 0.0), tl.where(live, ind, 0).to(tl.int64), j, k, (m + tl.log2(d)) * LN2, row, u,
          ids_ptr, logp_ptr, logp_ptr, t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride,
          q_ptr, q_val, q_stride, V, False, FIXED)
    _advance(u_ptr, row, n_u, g0, g1, PHILOX)


@triton.jit
def _draw(p, ind, j, K, lse, row, u, ids_ptr, logp_ptr, flag_ptr, t_ptr, t_val, t_stride, k_ptr, k_val, k_stride,
          p_ptr, p_val, p_stride, q_ptr, q_val, q_stride, V, FLAG: tl.constexpr, FIXED: tl.constexpr):
    """Step 1 on row ``row``'s candidates ``p`` (sorted descending, 0 at positions ``j >= K``), their int64
    indices ``ind``, the row's lse and its uniform ``u``: the id and log-probability, stored where the candidates
    decide the row; ``FLAG``: the row's flag for step 2 stored (else every row must be decided: the fused merge).
    Masses in :func:`_mass`'s unit (``FIXED``). Returns whether the candidates decide the row."""
    live = j < K
    t, kk, tp, mp, bad = _row_params(t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride,
                                     q_ptr, q_val, q_stride, row, V)
    undefined = bad | ~((lse > float("-inf")) & (lse < float("inf")))    # also NaN
    greedy = t == 0.0
    # the candidates are the whole row, or the rest of it has no mass in fp32 (the K-th candidate's p is 0, so every
    # entry past it is: a peaked row, a tiny temperature): every filter ends inside
    all_in = (K == V) | (tl.sum(tl.where(j == K - 1, p, 0.0)) == 0.0)
    # a. top-k: decided when kk <= K (its mass W known); off (kk = V) it keeps the whole row, of mass 1
    k_on = kk < V
    k_dec = (k_on & (kk <= K)) | all_in
    lk = tl.minimum(kk, K)
    pm = _mass(p, FIXED)
    csum = tl.cumsum(pm, 0)
    w = tl.sum(tl.where(j < lk, pm, 0))
    w = tl.where(k_on | all_in, w, _mass(tl.full([], 1.0, tl.float32), FIXED))
    w_known = k_dec | ~k_on
    # b. top-p: the positions whose mass before them is below top_p · W (the first always stays). Decided when it
    # ends inside the top-k's candidates; past the K candidates it is longer than K
    p_on = tp < 1.0
    pw = _scaled(tp, w, FIXED)
    lp = tl.maximum(tl.sum(((csum - pm < pw) & (j < lk)).to(tl.int32)), 1)
    last = tl.sum(tl.where(j == lk - 1, csum, 0))           # mass of the first min(kk, K) candidates
    p_dec = w_known & (k_dec | (last >= pw))
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
    # running mass exceeds u · W_kept (never one of p = 0; rounding past the last: the last of p > 0; none of
    # p > 0: the first)
    keep = j < n
    packed = tl.where(keep, (ind << 32) | (p.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF),
                      9223372036854775807)
    packed = tl.sort(packed)
    kept = packed != 9223372036854775807
    ps = tl.where(kept, (packed & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True), 0.0)
    psm = _mass(ps, FIXED)
    w_kept = tl.sum(psm)
    pos = tl.sum(((tl.cumsum(psm, 0) <= _scaled(u, w_kept, FIXED)) & kept).to(tl.int32))
    pos = tl.minimum(pos, tl.max(tl.where(kept & (psm > 0), j, 0)))
    sel = j == pos
    pick = tl.sum(tl.where(sel, packed >> 32, 0))
    p_pick = tl.sum(tl.where(sel, ps, 0.0))
    logp = tl.log(p_pick) - tl.log(_prob(w_kept, FIXED))
    # greedy: the first candidate (the argmax, lowest index among ties), probability 1
    first = tl.sum(tl.where(j == 0, ind, 0))
    pick = tl.where(greedy, first, pick)
    logp = tl.where(greedy, 0.0, logp)
    pick = tl.where(undefined, -1, pick)
    logp = tl.where(undefined, float("nan"), logp)
    if FLAG:
        tl.store(flag_ptr + row, (~decided).to(tl.int32))
        if decided:
            tl.store(ids_ptr + row, pick)
            tl.store(logp_ptr + row, logp)
    else:
        tl.store(ids_ptr + row, pick)
        tl.store(logp_ptr + row, logp)
    return decided


@triton.jit
def _u64(x):
    """The order-preserving key of x as int64 in [0, 2^32): ascending with (x, NaN highest)."""
    return _key_of(x).to(tl.int64) + 2147483648


@triton.jit
def _load_chunk(x_row, stride_v, o, hi):
    return tl.load(x_row + o.to(tl.int64) * stride_v, mask=o < hi, other=float("-inf")).to(tl.float32)


@triton.jit
def _block(x_row, stride_v, s, hi, c, lse2, BLOCK: tl.constexpr):
    """Elements [s, s + BLOCK) of the chunk ending at hi: their indices, keys, p = 2^(x·c − lse2), and which exist."""
    o = s + tl.arange(0, BLOCK)
    x = _load_chunk(x_row, stride_v, o, hi)
    return o, _key_of(x), tl.exp2(x * c - lse2), o < hi


@triton.jit
def _in_prefixes(key, o, tk, uk, tb, ub):
    """Inside both prefixes of the order: top-k's (key > tk, or == tk up to index uk) and top-p's (tb, ub)."""
    return ((key > tk) | ((key == tk) & (o <= uk))) & ((key > tb) | ((key == tb) & (o <= ub)))


@triton.jit
def _histogram(x_row, stride_v, lo, hi, c, lse2, prefix, shift, BY_MASS: tl.constexpr, BLOCK: tl.constexpr):
    """Chunk [lo, hi)'s 16-bin histogram (counts, or with ``BY_MASS`` masses p = 2^(x·c − lse2)) of digit
    ``(u >> shift) & 15`` over the elements whose ``u >> (shift + 4) == prefix``: a ``[16, BLOCK]`` accumulator
    over the chunk, reduced once at the end (a reduction per step costs a cross-warp exchange each). Bins first: the
    default layout gives each thread all 16 bins of its elements, which lie as the 1-D loads do (a ``[BLOCK, 16]``
    tile spreads the bins over lanes, and every block's digits and masses then go through shared memory)."""
    bins = tl.arange(0, 16)
    if BY_MASS:
        h = tl.zeros([16, BLOCK], tl.float32)
    else:
        h = tl.zeros([16, BLOCK], tl.int32)
    for s in range(lo, hi, BLOCK):
        o = s + tl.arange(0, BLOCK)
        x = _load_chunk(x_row, stride_v, o, hi)
        u = _u64(x)
        sel = (o < hi) & ((u >> (shift + 4).to(tl.int64)) == prefix)
        hit = (((u >> shift.to(tl.int64)) & 15)[None, :] == bins[:, None]) & sel[None, :]
        if BY_MASS:
            h += tl.where(hit, tl.exp2(x * c - lse2)[None, :], 0.0)
        else:
            h += hit.to(tl.int32)
    return tl.sum(h, axis=1)


@triton.jit
def _at_and_above(x_row, stride_v, lo, hi, c, lse2, t, WM, ARRIVE, GEN, row, chunk, C, BLOCK: tl.constexpr,
                  CP: tl.constexpr):
    """(count, mass) of the row's keys > t and == t: per-chunk sums (per-lane accumulators over the chunk, reduced
    once), a barrier, summed in chunk order."""
    a_gt = tl.zeros([BLOCK], tl.int32)
    a_eq = tl.zeros([BLOCK], tl.int32)
    w_gt = tl.zeros([BLOCK], tl.float32)
    w_eq = tl.zeros([BLOCK], tl.float32)
    for s in range(lo, hi, BLOCK):
        o, key, p, live = _block(x_row, stride_v, s, hi, c, lse2, BLOCK)
        gt = (key > t) & live
        eq = (key == t) & live
        a_gt += gt.to(tl.int32)
        a_eq += eq.to(tl.int32)
        w_gt += tl.where(gt, p, 0.0)
        w_eq += tl.where(eq, p, 0.0)
    n_gt = tl.sum(a_gt)
    n_eq = tl.sum(a_eq)
    m_gt = tl.sum(w_gt)
    m_eq = tl.sum(w_eq)
    q = tl.arange(0, 4)
    base = WM + 2 * tl.num_programs(0) + (row * C + chunk) * 4
    tl.store(base + q, tl.where(q == 0, n_gt.to(tl.float32), tl.where(q == 1, n_eq.to(tl.float32),
                                                                      tl.where(q == 2, m_gt, m_eq))))
    _barrier(ARRIVE, GEN, row, C)
    j = tl.arange(0, CP)
    v = tl.load(WM + 2 * tl.num_programs(0) + ((row * C + j) * 4)[:, None] + q[None, :], mask=(j < C)[:, None],
                other=0.0, cache_modifier=".cg")
    v = tl.sum(v, axis=0)
    return (tl.sum(tl.where(q == 0, v, 0.0)).to(tl.int32), tl.sum(tl.where(q == 1, v, 0.0)).to(tl.int32),
            tl.sum(tl.where(q == 2, v, 0.0)), tl.sum(tl.where(q == 3, v, 0.0)))


@triton.jit
def _gather16(ptr, row, C, CP: tl.constexpr):
    """Σ over the row's C chunks, in chunk order, of the 16-vectors at ``ptr + (row·C + j)·16`` (read from L2)."""
    j = tl.arange(0, CP)
    v = tl.load(ptr + ((row * C + j) * 16)[:, None] + tl.arange(0, 16)[None, :], mask=(j < C)[:, None], other=0,
                cache_modifier=".cg")
    return tl.sum(v, axis=0)


@triton.jit
def _barrier(ARRIVE, GEN, row, C):
    """Every program of the row past its stores before any reads what they published: the program's threads first
    (their stores ordered before the one thread's release), then the row's programs."""
    tl.debug_barrier()
    _row_barrier(ARRIVE, GEN, row, C, _row_generation(GEN, row))


@triton.jit
def _radix(x_row, stride_v, lo, hi, c, lse2, target, BY_MASS: tl.constexpr, HC, HM, ARRIVE, GEN, row, chunk, C,
           level0, rel, BLOCK: tl.constexpr, CP: tl.constexpr):
    """(t, target): the largest key t whose count (``BY_MASS`` off) or mass of elements ``>= t`` reaches
    ``target`` (``rel`` != 0: ``target`` times the row's total, which the first level's histogram sums): 8 levels
    of 4 bits, a barrier each (histogram buffers alternate by level parity from ``level0``: a fast program never
    overwrites one a slow program still reads). The chosen digit is the largest whose total from the top reaches
    the target and whose bin is not empty (of positive mass, by mass: the boundary holds mass)."""
    prefix = tl.zeros([], tl.int64)
    if BY_MASS:
        above = tl.zeros([], tl.float32)
    else:
        above = tl.zeros([], tl.int32)
    bins = tl.arange(0, 16)
    for lv in range(8):
        shift = tl.full([], 28, tl.int32) - 4 * lv
        h = _histogram(x_row, stride_v, lo, hi, c, lse2, prefix, shift, BY_MASS, BLOCK)
        buf = ((level0 + lv) % 2) * (tl.num_programs(0) * 16)
        dst = (row * C + chunk) * 16 + bins
        if BY_MASS:
            tl.store(HM + buf + dst, h)
        else:
            tl.store(HC + buf + dst, h)
        _barrier(ARRIVE, GEN, row, C)
        if BY_MASS:
            h = _gather16(HM + buf, row, C, CP)
        else:
            h = _gather16(HC + buf, row, C, CP)
        if (lv == 0) & (rel != 0):
            target = target * tl.sum(h)
        ge = tl.sum(h) - (tl.cumsum(h, 0) - h)          # what is >= each digit (suffix sums from the top)
        d = tl.max(tl.where((above + ge >= target) & (h > 0), bins, 0))
        sel = bins == d
        above += tl.sum(tl.where(sel, ge - h, 0))
        prefix = prefix * 16 + d
    return (prefix - 2147483648).to(tl.int32), target


@triton.jit
def _tie_cut(x_row, stride_v, lo, hi, t, n, WC, ARRIVE, GEN, row, chunk, C, BLOCK: tl.constexpr,
             CP: tl.constexpr):
    """The index of the n-th (n >= 1) element of key t in index order: each chunk's count of them, a barrier, the
    chunk holding it finds it and publishes it, a barrier."""
    lanes = tl.zeros([BLOCK], tl.int32)
    for s in range(lo, hi, BLOCK):
        o = s + tl.arange(0, BLOCK)
        lanes += ((_key_of(_load_chunk(x_row, stride_v, o, hi)) == t) & (o < hi)).to(tl.int32)
    cnt = tl.sum(lanes)
    tl.store(WC + row * C + chunk, cnt)
    _barrier(ARRIVE, GEN, row, C)
    j = tl.arange(0, CP)
    counts = tl.load(WC + row * C + j, mask=j < C, other=0, cache_modifier=".cg")
    before = tl.sum(tl.where(j < chunk, counts, 0))
    if (before < n) & (n <= before + cnt):
        run = before
        cut = -1
        for s in range(lo, hi, BLOCK):
            o = s + tl.arange(0, BLOCK)
            tie = (_key_of(_load_chunk(x_row, stride_v, o, hi)) == t) & (o < hi)
            at = run + tl.cumsum(tie.to(tl.int32), 0)
            hit = tl.min(tl.where(tie & (at == n), o, 2147483647))
            cut = tl.where((cut < 0) & (hit < 2147483647), hit, cut)
            run += tl.sum(tie.to(tl.int32))
        tl.store(WC + tl.num_programs(0) + row, cut)
    _barrier(ARRIVE, GEN, row, C)
    return tl.load(WC + tl.num_programs(0) + row, cache_modifier=".cg")


SHORT_LIST = tl.constexpr(512)      # row="bins": a boundary bin of at most this many elements is sorted in a tile this
                                    # size (else in one of CAP); past it after the second level, a third
THIRD_MAX_CH = tl.constexpr(65536)  # ... where a chunk holds at most this many elements (a pass over longer chunks
                                    # costs more than the long list's sort). H200, flat top_p 0.9 rows, µs, fp32,
                                    # V = 128256 (tools/probe_rowtune.py at fd1b93f, same process), a third level up
                                    # to 131072 against 32768: CH = 64512 (B = 64) 286.9 / 330.5; 129024 (B = 256)
                                    # 1071.9 / 996.6; CH <= 16384 (B <= 8) within 0.4


@triton.jit
def _fine_bin(x, x_top, s):
    """The fine bin ``f = floor((x_top − x) · s)`` as int32, 4096 for x at or past the range's low end (−inf
    included): non-increasing in x, so each bin holds a contiguous run of the row's order."""
    return tl.minimum(tl.floor((x_top - x) * s), 4096.0).to(tl.int32)


@triton.jit
def _bin_pass(x_row, stride_v, lo, hi, c, lse2, x_top, s, sel, x_first, LEVEL: tl.constexpr, BLOCK: tl.constexpr,
              LANE_COUNTS: tl.constexpr = False):
    """Chunk [lo, hi)'s 16-bin mass histogram of the fine bins (per-lane accumulators, reduced once): ``LEVEL`` 1
    by ``f >> 8`` over f < 4096, with the mass past the range (f = 4096); ``LEVEL`` 2 by ``(f >> 4) & 15`` over
    ``f >> 8 == sel``, ``LEVEL`` 3 by ``f & 15`` over ``f >> 4 == sel``, both with the elements' counts: by
    ``tl.histogram`` per step, or with ``LANE_COUNTS`` per lane under the masses' compares (a predicated fp32 add
    per bin, exact below 2^24; no shared memory or block barrier in the loop, 16 registers more per element of a
    thread's step; sm_90a, grid level 2 at 256 elements / 4 warps: 143 loop instructions against 157 with three
    barriers; an int32 count compiled to selects, 252)."""
    SHIFT: tl.constexpr = 8 if LEVEL == 1 else 4 if LEVEL == 2 else 0
    bins = tl.arange(0, 16)
    h = tl.zeros([16, BLOCK], tl.float32)
    n = tl.zeros([16, BLOCK], tl.float32)         # (counts in fp32, exact to 2^24: predicated FADDs as the masses)
    rest = tl.zeros([BLOCK], tl.float32)
    cnt = tl.zeros([16], tl.int32)
    x_next = x_first                                # (the chunk's first block: _first_block, loaded by the caller)
    for st in range(lo, hi, BLOCK):
        o = st + tl.arange(0, BLOCK)
        x = x_next                                  # (the next block's load in flight while this one is binned)
        x_next = _load_chunk(x_row, stride_v, o + BLOCK, hi)
        p = tl.exp2(x * c - lse2)
        f = _fine_bin(x, x_top, s)
        live = o < hi
        dg = (f >> SHIFT) & 15
        if LEVEL == 1:
            on = live & (f < 4096)
            rest += tl.where(live & (f >= 4096), p, 0.0)
        else:
            on = live & ((f >> (SHIFT + 4)) == sel)
            if not LANE_COUNTS:
                cnt += tl.histogram(dg, 16, mask=on)
        # off elements to bin 16 (no bin), then each bin's add under its own compare: a predicated FADD per
        # bin (sm_90a: 127 instructions per 256-element step at 4 warps against 186 for a select per bin)
        dg = tl.where(on, dg, 16)
        hit = dg[None, :] == bins[:, None]
        h = tl.where(hit, h + p[None, :], h)
        if LANE_COUNTS and LEVEL > 1:
            n = tl.where(hit, n + 1.0, n)
    if LANE_COUNTS:
        cnt = tl.sum(n, axis=1).to(tl.int32)
    return tl.sum(h, axis=1), tl.sum(rest), cnt


@triton.jit
def _bins_level(x_row, stride_v, lo, hi, c, lse2, x_top, s, G, above, P, kept, HC, HM, ARRIVE, GEN, row, chunk, C,
                parity, LEVEL: tl.constexpr, BLOCK: tl.constexpr, CP: tl.constexpr):
    """One level below the first (``_bin_pass``'s LEVEL 2 or 3 inside bin G): a pass, a barrier, the bin d of the
    16 where the mass from the top (``above`` before them) reaches P (``_level_choice``). Returns (G·16 + d, its
    elements' count, the count in the chunks before this one, the mass above it, this chunk's own mass above it
    added to ``kept``, ok)."""
    bins = tl.arange(0, 16)
    buf = (parity % 2) * (tl.num_programs(0) * 16)
    mine = (row * C + chunk) * 16 + bins
    h, _r, cnt = _bin_pass(x_row, stride_v, lo, hi, c, lse2, x_top, s, G,
                           _first_block(x_row, stride_v, lo, hi, BLOCK), LEVEL, BLOCK)
    tl.store(HM + buf + mine, h)
    tl.store(HC + buf + mine, cnt)
    _barrier(ARRIVE, GEN, row, C)
    G, n, base, above, ok = _level_choice(HM + buf, HC + buf, row, chunk, C, G, above, P, CP)
    kept += tl.sum(tl.where(bins < (G & 15), h, 0.0))
    return G, n, base, above, kept, ok


@triton.jit
def _level_choice(HM, HC, row, chunk, C, G, above, P, CP: tl.constexpr):
    """The bin d of the 16 below G (the C chunks' masses ``HM``, summed in chunk order) where the mass from the top
    reaches P: (16·G + d, its elements' count n, the count in the chunks before this one, the mass above it, ok)."""
    j = tl.arange(0, CP)
    d, above = _bins_digit(_gather16(HM, row, C, CP), above, P)
    counts = tl.load(HC + (row * C + j) * 16 + d, mask=(j < C) & (d < 16), other=0, cache_modifier=".cg")
    n = tl.sum(counts)
    return G * 16 + d, n, tl.sum(tl.where(j < chunk, counts, 0)), above, ((d < 16) & (n >= 1)).to(tl.int32)


@triton.jit
def _bins_digit(h, above, P):
    """(d, mass above bin d): the first of the 16 bins ``h`` (from the top) where the mass from the top, ``above``
    before them, reaches P (16: none)."""
    bins = tl.arange(0, 16)
    d = tl.min(tl.where(above + tl.cumsum(h, 0) >= P, bins, 16))
    return d, above + tl.sum(tl.where(bins < d, h, 0.0))


@triton.jit
def _bins_scale(lse2, c, tp, V, x_max):
    """Fine bins per unit of x: 4096 over [x_lo, x_max], where every element of p < (1 − top_p) / (2V) lies past
    the nucleus (the mass above it exceeds top_p · W: at most V elements of no more p lie at or below it)."""
    x_lo = (lse2 + tl.log2((1.0 - tp) * 0.5 / V.to(tl.float32))) / c
    return 4096.0 / (x_max - x_lo)


@triton.jit
def _first_block(x_row, stride_v, lo, hi, BLOCK: tl.constexpr):
    """Chunk [lo, hi)'s first BLOCK elements (the passes' first load, issued by their callers: the grid's before it
    waits for the launch before it)."""
    return _load_chunk(x_row, stride_v, lo + tl.arange(0, BLOCK), hi)


@triton.jit
def _list_bin(x_row, stride_v, lo, hi, x_max, s, SH, G, lst, run, x_first, BLOCK: tl.constexpr):
    """The indices of chunk [lo, hi)'s elements of fine bin group ``f >> SH == G``, in index order, to ``lst``
    from position ``run`` (``x_first``: the chunk's first block); returns the position after them."""
    x_next = x_first
    for st in range(lo, hi, BLOCK):
        o = st + tl.arange(0, BLOCK)
        x = x_next                                  # (the next block's load in flight while this one is listed)
        x_next = _load_chunk(x_row, stride_v, o + BLOCK, hi)
        sel = (o < hi) & ((_fine_bin(x, x_max, s) >> SH) == G)
        tl.store(lst + run + tl.cumsum(sel.to(tl.int32), 0) - 1, o, mask=sel)
        run += tl.sum(sel.to(tl.int32))
    return run


@triton.jit
def _topp_bins(x_row, stride_v, V, lo, hi, c, lse2, x_max, tp, HC, HM, WM, EB, ARRIVE, GEN, row, chunk, C, CH, level0,
               BLOCK: tl.constexpr, CP: tl.constexpr, CAP: tl.constexpr):
    """Top-p's boundary without top-k (``SampleKnobs(row="bins")``): ``(ok, levels, tb, ub, kept)``, the nucleus
    the prefix of keys > tb and of key tb up to index ub, ``kept`` this chunk's mass of it; or ok = 0 (the
    caller's radix select then, its histogram buffers from parity ``level0 + levels``).

    Every element of p < (1 − top_p) / (2V) lies past the nucleus (the mass above it exceeds top_p · W: at most V
    elements of no more p lie at or below it). So the boundary's x lies in [x_lo, x_max], cut into 4096 fine bins
    of equal width, ``_fine_bin``. Levels of 16 (each a pass, a barrier, the C chunks' histograms summed in chunk
    order) find the bin where the mass from the top reaches top_p · W (W: the row's mass, the first level's total):
    two levels a group G of 16 fine bins, and where G holds more than SHORT_LIST elements (and the chunks are
    short: CH <= THIRD_MAX_CH, the same for every chunk of the row) a third its fine bin F;
    every chunk writes the indices of its elements in G (F) to the row's list at its offset (the counts of chunks
    before it: the list in index order), a barrier, and every program reads the list (at most ``CAP``, else ok =
    0), sorts it by (key descending, index ascending) and cuts it where the running mass reaches top_p · W."""
    s = _bins_scale(lse2, c, tp, V, x_max)
    bins = tl.arange(0, 16)
    j = tl.arange(0, CP)
    npg = tl.num_programs(0)
    mine = (row * C + chunk) * 16 + bins
    # 1. level 1: the row's mass W and the 16-group d1 where the mass from the top reaches P = top_p · W
    h, rest, _n = _bin_pass(x_row, stride_v, lo, hi, c, lse2, x_max, s, 0,
                            _first_block(x_row, stride_v, lo, hi, BLOCK), 1, BLOCK)
    kept = tl.zeros([], tl.float32)
    kept_own = h                                    # this chunk's own histograms: its mass above the boundary bin
    buf = (level0 % 2) * (npg * 16)
    tl.store(HM + buf + mine, h)
    tl.store(WM + npg + row * C + chunk, rest)
    _barrier(ARRIVE, GEN, row, C)
    h = _gather16(HM + buf, row, C, CP)
    w = tl.sum(h) + tl.sum(tl.load(WM + npg + row * C + j, mask=j < C, other=0.0, cache_modifier=".cg"))
    P = tp * w
    d1, above = _bins_digit(h, 0.0, P)
    ok = ((d1 < 16) & (s > 0.0) & (s < float("inf"))).to(tl.int32)
    levels = 1
    tb = tl.full([], INT32_MIN, tl.int32)
    ub = tl.full([], 2147483647, tl.int32)
    if ok != 0:
        kept = tl.sum(tl.where(bins < d1, kept_own, 0.0))
        # 2. level 2, and level 3 where the group is long: the bin G of fine bins >> SH, its count n
        G, n, base, above, kept, ok = _bins_level(x_row, stride_v, lo, hi, c, lse2, x_max, s, d1, above, P, kept,
                                                  HC, HM, ARRIVE, GEN, row, chunk, C, level0 + 1, 2, BLOCK, CP)
        levels = 2
        SH = 4
        if (ok != 0) & (n > SHORT_LIST) & (CH <= THIRD_MAX_CH):
            G, n, base, above, kept, ok = _bins_level(x_row, stride_v, lo, hi, c, lse2, x_max, s, G, above, P,
                                                      kept, HC, HM, ARRIVE, GEN, row, chunk, C, level0, 3, BLOCK, CP)
            levels = 3
            SH = 0
        ok = ok & (n <= CAP).to(tl.int32)
        if ok != 0:
            # 3. the list of G's elements in index order, sorted and cut
            run = _list_bin(x_row, stride_v, lo, hi, x_max, s, SH, G, EB + row * CAP, base,
                            _first_block(x_row, stride_v, lo, hi, BLOCK), BLOCK)
            _barrier(ARRIVE, GEN, row, C)
            if n <= SHORT_LIST:
                tb, ub = _cut_list(x_row, stride_v, V, c, lse2, EB + row * CAP, n, above, P, SHORT_LIST)
            else:
                tb, ub = _cut_list(x_row, stride_v, V, c, lse2, EB + row * CAP, n, above, P, CAP)
            # the chunk's kept mass without another pass over it: its bins above G (summed level by level), and
            # its listed elements that the cut keeps (used where no min-p cuts the nucleus)
            lanes = tl.zeros([BLOCK], tl.float32)
            for st in range(base, run, BLOCK):
                e = st + tl.arange(0, BLOCK)
                idx = tl.load(EB + row * CAP + e, mask=e < run, other=0, cache_modifier=".cg")
                x = _load_chunk(x_row, stride_v, idx, tl.where(e < run, V, 0))
                key = _key_of(x)
                lanes += tl.where(((key > tb) | ((key == tb) & (idx <= ub))) & (e < run), tl.exp2(x * c - lse2), 0.0)
            kept += tl.sum(lanes)
    return ok, levels, tb, ub, kept


@triton.jit
def _cut_list(x_row, stride_v, V, c, lse2, lst, n, above, P, N: tl.constexpr):
    """The boundary ``(tb, ub)`` among the n (<= N) indices at ``lst``: sorted by (key descending, index
    ascending), the first whose running mass from ``above`` reaches P (the last where rounding leaves it short)."""
    e = tl.arange(0, N)
    idx = tl.load(lst + e, mask=e < n, other=0, cache_modifier=".cg")
    x = _load_chunk(x_row, stride_v, idx, tl.where(e < n, V, 0))
    comp = tl.where(e < n, ((4294967295 - _u64(x)) << 31) | idx.to(tl.int64), 9223372036854775807)
    comp = tl.sort(comp)
    idx = (comp & 2147483647).to(tl.int32)
    key = (2147483647 - (comp >> 31)).to(tl.int32)
    p = tl.exp2(_load_chunk(x_row, stride_v, idx, tl.where(e < n, V, 0)) * c - lse2)
    at = tl.min(tl.where((above + tl.cumsum(p, 0) >= P) & (e < n), e, n - 1))
    return tl.sum(tl.where(e == at, key, 0)), tl.sum(tl.where(e == at, idx, 0))


@triton.jit(do_not_specialize=("stride_b", "stride_v", "V", "K", "C", "CH", "t_val", "t_stride", "k_val", "k_stride",
                               "p_val", "p_stride", "q_val", "q_stride", "s0", "s1", "c0", "c1", "g0", "g1"))
def _sample_row_kernel(x_ptr, stride_b, stride_v, V, ind_ptr, lse_ptr, u_ptr, ids_ptr, logp_ptr, flag_ptr,
                       t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride, q_ptr, q_val,
                       q_stride, s0, s1, c0, c1, g0, g1, K, ARRIVE, GEN, HC, HM, WC, WM, EB, C, CH,
                       BLOCK: tl.constexpr, CP: tl.constexpr, PHILOX: tl.constexpr, BINS: tl.constexpr,
                       CAP: tl.constexpr, PDL: tl.constexpr):
    """Step 2, program ``pid`` = chunk ``pid % C`` of row ``pid // C`` (CH elements), if step 1 flagged the row (the
    row's u as step 1 drew it: :func:`_uniform`). ``PHILOX`` 2: chunk 0 advances the row's replay count once the
    row is done (every chunk read it before the row's first barrier, chunk 0 writes after the last). ``PDL``: it
    waits for the launch before it to finish before any load."""
    if PDL:
        gdc_wait()
    pid = tl.program_id(0)
    row = pid // C
    if tl.load(flag_ptr + row) != 0:
        u, n = _uniform(u_ptr, row, s0, s1, c0, c1, g0, g1, PHILOX)
        _sample_row(x_ptr + row.to(tl.int64) * stride_b, stride_v, V, ind_ptr, lse_ptr, u, ids_ptr, logp_ptr,
                    t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride, q_ptr, q_val,
                    q_stride, K, ARRIVE, GEN, HC, HM, WC, WM, EB, row, pid % C, C, CH, BLOCK, CP, BINS, CAP)
        if pid % C == 0:
            _advance(u_ptr, row, n, g0, g1, PHILOX)


@triton.jit
def _sample_row(x_row, stride_v, V, ind_ptr, lse_ptr, u, ids_ptr, logp_ptr,
                t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride, q_ptr, q_val, q_stride,
                K, ARRIVE, GEN, HC, HM, WC, WM, EB, row, chunk, C, CH, BLOCK: tl.constexpr, CP: tl.constexpr,
                BINS: tl.constexpr, CAP: tl.constexpr):
    t_row, kk, tp, mp, bad = _row_params(t_ptr, t_val, t_stride, k_ptr, k_val, k_stride, p_ptr, p_val, p_stride,
                                         q_ptr, q_val, q_stride, row, V)
    c, x_max, lse2 = _row_scale(x_row, stride_v, ind_ptr, lse_ptr, t_ptr, t_val, t_stride, row, K)
    p_max = tl.exp2(x_max * c - lse2)                # as every p here: the min-p test is on this same form
    lo = chunk * CH
    hi = tl.minimum(lo + CH, V)
    level = tl.zeros([], tl.int32)
    # a. top-k: its boundary key tk and the mass W it keeps (else W = the row's); ties at tk cut by index
    tk = tl.full([], INT32_MIN, tl.int32)
    uk = 2147483647
    n_tk = 0
    m_tk = 0.0              # the mass above tk, and p of one tie at tk
    p_tk = 1.0
    if kk < V:
        tk, _n = _radix(x_row, stride_v, lo, hi, c, lse2, kk, False, HC, HM, ARRIVE, GEN, row, chunk, C, level, 0,
                        BLOCK, CP)
        level += 8
        n_gt, n_eq, m_gt, m_eq = _at_and_above(x_row, stride_v, lo, hi, c, lse2, tk, WM, ARRIVE, GEN, row, chunk, C,
                                               BLOCK, CP)
        n_tk = kk - n_gt
        m_tk = m_gt
        p_tk = m_eq / n_eq.to(tl.float32)
        w = m_gt + n_tk.to(tl.float32) * p_tk
        if n_tk < n_eq:
            uk = _tie_cut(x_row, stride_v, lo, hi, tk, n_tk, WC, ARRIVE, GEN, row, chunk, C, BLOCK, CP)
        rel = 0
    else:
        w = 1.0             # top-p's W is the row's mass: its radix's first level sums it (or no top-p)
        rel = 1
    # b. top-p inside the top-k: the boundary key tb (largest with mass(key >= tb) >= top_p · W, at least tk) and
    # how many of its ties have mass before them below top_p · W
    tb = tl.full([], INT32_MIN, tl.int32)
    ub = 2147483647
    done = tl.zeros([], tl.int32)
    kept_bins = tl.zeros([], tl.float32)
    if BINS:
        if (tp < 1.0) & (kk >= V):  # no top-k cut: the fine bins of x (else, or where they overflow, the radix)
            done, used, tb, ub, kept_bins = _topp_bins(x_row, stride_v, V, lo, hi, c, lse2, x_max, tp, HC, HM, WM, EB,
                                                       ARRIVE, GEN, row, chunk, C, CH, level, BLOCK, CP, CAP)
            level += used
    if (tp < 1.0) & (done == 0):
        tb, P = _radix(x_row, stride_v, lo, hi, c, lse2, tp * w, True, HC, HM, ARRIVE, GEN, row, chunk, C, level,
                       rel, BLOCK, CP)
        if tb <= tk:        # the nucleus ends in the top-k's last run of ties (tb >= tk: mass(key >= tk) >= W)
            tb = tk
            n_incl = tl.minimum(tl.maximum(tl.ceil((P - m_tk) / tl.maximum(p_tk, 1e-38)).to(tl.int32), 1), n_tk)
            ub = uk
            if n_incl < n_tk:
                ub = _tie_cut(x_row, stride_v, lo, hi, tk, n_incl, WC, ARRIVE, GEN, row, chunk, C, BLOCK, CP)
        else:
            nb_gt, nb_eq, mb_gt, mb_eq = _at_and_above(x_row, stride_v, lo, hi, c, lse2, tb, WM, ARRIVE, GEN, row,
                                                       chunk, C, BLOCK, CP)
            pb = tl.maximum(mb_eq / nb_eq.to(tl.float32), 1e-38)
            n_incl = tl.minimum(tl.maximum(tl.ceil((P - mb_gt) / pb).to(tl.int32), 1), nb_eq)
            if n_incl < nb_eq:
                ub = _tie_cut(x_row, stride_v, lo, hi, tb, n_incl, WC, ARRIVE, GEN, row, chunk, C, BLOCK, CP)
    # c. the kept set (every filter's prefix; min-p: p >= min_p · p_max): each chunk's kept mass, a barrier, then
    # the chunk holding u · W_kept scans for the first kept token (index order) whose running mass passes it
    thr = mp * p_max
    mine = kept_bins            # the fine bins' count of it (no min-p), else a pass
    if (done == 0) | (mp > 0.0):
        lanes = tl.zeros([BLOCK], tl.float32)
        for s in range(lo, hi, BLOCK):
            o, key, pr, live = _block(x_row, stride_v, s, hi, c, lse2, BLOCK)
            lanes += tl.where(_in_prefixes(key, o, tk, uk, tb, ub) & (pr >= thr) & live, pr, 0.0)
        mine = tl.sum(lanes)
    tl.store(WM + row * C + chunk, mine)
    _barrier(ARRIVE, GEN, row, C)
    j = tl.arange(0, CP)
    masses = tl.load(WM + row * C + j, mask=j < C, other=0.0, cache_modifier=".cg")
    before = tl.cumsum(masses, 0) - masses
    w_kept = tl.sum(masses)
    target = u * w_kept
    owner = tl.max(tl.where((before <= target) & (masses > 0.0) & (j < C), j, -1))
    if (owner < 0) & (chunk == 0):      # nothing kept (cannot happen: the row's largest p always stays): say so
        tl.store(ids_ptr + row, tl.full([], -1, tl.int64))
        tl.store(logp_ptr + row, float("nan"))
    if owner == chunk:
        _scan_draw(x_row, stride_v, lo, hi, c, lse2, tk, uk, tb, ub, thr, tl.sum(tl.where(j == chunk, before, 0.0)),
                   target, w_kept, ids_ptr + row, logp_ptr + row, BLOCK)


@triton.jit
def _row_scale(x_row, stride_v, ind_ptr, lse_ptr, t_ptr, t_val, t_stride, row, K):
    """(c, x_max, lse2) of a flagged row: p = 2^(x·c − lse2), x_max its first candidate's x, lse2 = lse·log2 e."""
    c = _log2_scale(t_ptr, t_val, t_stride, row, 1)
    x_max = tl.load(x_row + tl.load(ind_ptr + row.to(tl.int64) * K) * stride_v).to(tl.float32)
    lse2 = tl.load(lse_ptr + row) * LOG2E
    m2 = x_max * c
    if _huge(m2):
        # |x| / T past ~7e8 (a tiny T): lse2 converted from lse errs by ulps of 2^30 (p = 2^(x·c − lse2) then
        # overflows or vanishes); p = 2^(x·c − m2) instead, 1 at the max's ties, 0 elsewhere: every mass below is
        # measured on this same form (top-p's W by its radix's first level or its bins, top-k's by the sums at tk),
        # so the scale cancels
        lse2 = m2
    return c, x_max, lse2


@triton.jit
def _scan_draw(x_row, stride_v, lo, hi, c, lse2, tk, uk, tb, ub, thr, run, target, w_kept, id_ptr, lp_ptr,
               BLOCK: tl.constexpr):
    """The draw inside chunk [lo, hi), the kept mass before it ``run``: block by block, a sum each, until the
    running mass passes ``target`` = u · W_kept (one scan, in that block; the next block's elements loaded while
    this one is summed); the first kept token (index order) past it, its id and log p − log W_kept stored."""
    pick = -1
    last = -1
    s = lo
    x_next = _load_chunk(x_row, stride_v, s + tl.arange(0, BLOCK), hi)
    while (s < hi) & (pick < 0):
        o = s + tl.arange(0, BLOCK)
        x = x_next
        x_next = _load_chunk(x_row, stride_v, o + BLOCK, hi)
        pr = tl.exp2(x * c - lse2)
        kept = _in_prefixes(_key_of(x), o, tk, uk, tb, ub) & (pr >= thr) & (o < hi) & (pr > 0.0)
        pk = tl.where(kept, pr, 0.0)
        mass = tl.sum(pk)
        if run + mass > target:
            pick = tl.min(tl.where(kept & (run + tl.cumsum(pk, 0) > target), o, 2147483647))
            pick = tl.where(pick == 2147483647, -1, pick)
        last = tl.maximum(last, tl.max(tl.where(kept, o, -1)))
        run += mass
        s += BLOCK
    pick = tl.where(pick < 0, last, pick)          # rounding: u · W_kept at or past the chunk's end
    p_pick = tl.exp2(tl.load(x_row + pick.to(tl.int64) * stride_v).to(tl.float32) * c - lse2)
    tl.store(id_ptr, pick.to(tl.int64))
    tl.store(lp_ptr, tl.log(p_pick) - tl.log(w_kept))
