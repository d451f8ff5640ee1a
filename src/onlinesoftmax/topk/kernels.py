"""Fused softmax + top-k in Triton: one read of x, no V-sized output (paper §4, arXiv 1805.02867).

The paper keeps, per row, the online normalizer ``(m, d)`` and a sorted list of the K best logits, updated
by one bubble-insertion per element: 1 memory access per element but O(K) work per element, one thread per
row. Here a row is split into chunks of ``BLOCK`` elements, one program each; every chunk's state is ``(m, d,
a superset of its top-k)``, and the states of a row merge exactly as the ``(m, d)`` of ``state.py`` do, with
top-k ⊕ top-k = top-k of the union. Selection is by *threshold*, never by sorting the chunk:

1. Keys. A float maps to an int32 whose signed order is the float order (``bits ^ ((bits >> 31) &
   0x7FFFFFFF)``; ``-0.0`` → ``+0.0``; every NaN → one key above ``+inf``, as ``torch.topk`` ranks NaN
   highest). The total order is (key descending, index ascending): ties go to the lower index.
2. Stage 1, one program per chunk. The chunk is a ``[G, R]`` tile, element ``(g, r) = x[start + g·R + r]``:
   rows of R contiguous elements (16-byte loads), and R strided *columns* of G elements, each held by one
   thread, so a column's maximum ``gmax[r]`` is a reduction inside the thread.
   a. ``m = max gmax``, ``d = Σ e^(x − m)``.
   b. ``t`` = the k-th largest of the R column maxima, to ``COARSE_BITS`` bits (radix bisection on the keys,
      ``RADIX_BITS`` per step: 2^B − 1 counts packed in one int64 reduction; it rounds down). k distinct
      columns hold an element ``>= t``, so ``t`` is at most the chunk's k-th largest key: the chunk's top-k
      lies in ``{x >= t}``, about ``k·(1 + k/2R)`` elements for i.i.d. data (R >= 2·KP keeps that ≤ 1.25·k; with
      R = k, t is the smallest column maximum and the chunk overflows CAP: k = 1024 needs R = 2048).
   c. Those candidates (value, index) go to the chunk's ``CAP = 2·KP`` slots: per-column counts, one scan over
      the R columns and a running count down each column (inside the thread), not a scan over BLOCK elements.
   d. Exact fallback (more than CAP candidates: sorted rows, long runs of ties; or a NaN, or fewer than k
      finite column maxima): stage 1 marks the chunk (``n_c = -1``) and the merge re-reads it (or a launch of
      its own, ``exact_apart``): the exact k-th key by 32-step bisection, its ties cut at the lower index
      (:func:`_select`), so exactly k winners. (Kept out of stage 1, its four [G, R] tiles set the register
      count: 254 → 168, 8 → 12 warps per SM; kept out of the k = 1024 merges, they would spill.)
3. Stage 2, one program per row. ``m = max m_c``, ``d = Σ d_c e^(m_c − m)`` (paper eq. 4). Row bound:
   chunk c holds k elements ``>= t_c``, so the row's k-th key is ``>= lo = max_c t_c``. With ``hi`` = the
   largest candidate key + 1 (``#{>= lo} >= k > #{>= hi}``), ``[lo, hi)`` is cut in 4 (three counts, one
   reduction) until at most CAP candidates are ``>= lo`` (2-3 steps for i.i.d. data) or ``hi = lo + 1`` (lo is
   then the exact k-th key: ties cut at the lower index). The survivors are sorted by (key desc, index asc) as
   one int64; the first k are the answer. ``p = e^(x − m) / d``, ``lse = m + log d``.
   Two levels (``tree``) where the row's S·CAP slots pass one register tile (``MERGE_TILE``): groups of
   ``tree`` chunks merge first, each into a state of stage 1's form (``m, d``, its ≤ CAP survivors, and
   ``t = lo``: the group holds k elements ``>= t``), then one program per row merges the groups' states.
4. The narrow merge (where the answer is sparse in x: k·BLOCK far below kb·V). Stage 1 aims t_c at a small
   rank kb < k (found by kb warp maxima, ``peel``), so a chunk stores ≈ kb candidates, every element ``>= t_c``;
   the merge loads the first W of each chunk's slots. If every ``n_c <= W`` and ``#{key >= lo} >= k``, the row's
   k-th key is ``>= lo >= t_c`` and nothing left out can be in the answer: step 3 on that small tile. Otherwise
   (the top k gathered in a few chunks, sorted rows, a NaN) the tile's exact k-th key kh bounds the row's from
   below; chunks with ``t_c > kh`` are re-read for their exact top k, and step 3 runs on all CAP slots from kh.

Memory traffic per row, V elements of b bytes: read V·b once (stage 1); about ``k·(1 + k/2R)`` candidates of 8
bytes per chunk written and read back (stage 1 → 2: ``S·k·8`` bytes, ≈ 0.3 % of V·b at V = 128256, k = 50,
S = 32); write k·(4 + 8) + 4. The unfused ``softmax → topk`` reads x, writes p and topk reads p again.

Work per element in stage 1 (fp32, fast path): the load, one max, one exponential and add, one compare, a
running count and a predicated store: about 15 SASS instructions; the bisection on R values adds a
per-chunk cost that the chunk size amortises. Dispatch: ``topk/plan.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._triton.online import LN2, LOG2E

COARSE_BITS = 16                    # bits of a threshold that only has to be a lower bound (stage 1's t)
_COARSE = tl.constexpr(COARSE_BITS)

INT32_MIN = tl.constexpr(-2147483648)    # padding key: below every real key (-inf is 0x807FFFFF)


NEG_INF_KEY = tl.constexpr(-2139095041)  # key of -inf


NAN_KEY = tl.constexpr(0x7FC00000)       # canonical NaN key: above +inf (0x7F800000)

@triton.jit
def _key_of(x):
    """Order-preserving int32 key of fp32 ``x`` (−0 → +0, NaN → one key above +inf)."""
    bits = x.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    key = tl.where(x == 0.0, 0, key)
    return tl.where(x != x, NAN_KEY, key)


@triton.jit
def _value_of(key):
    bits = tl.where(key < 0, key ^ 0x7FFFFFFF, key)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _exp2(x, FAST: tl.constexpr):
    if FAST:    # one MUFU.EX2; tl.exp2 adds a denormal-range fix-up we do not need (the terms are summed)
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.exp2(x)


@triton.jit
def _huge(m2):
    """``|m2| >= 2^30``, m2 a row's max in base 2 (``x·c``; |x| / T past ~7e8: a tiny temperature): past it an
    exponent relative to a rounded reference (the FMA's residual, an lse converted to base 2) errs by ulps of m2
    (>= 64), so the kernels take a row's terms as 1 at the max's ties and 0 elsewhere."""
    return (m2 >= 1073741824.0) | (m2 <= -1073741824.0)


@triton.jit
def _log2_rel(x, c, m2, FAST: tl.constexpr):
    """``x·c − m2`` (``c = log2(e) / T``) with one rounding: an FMA, so the term is exact relative to the row's
    reference even when |x| is large (the interpreter emulates the FMA in fp64). Stage 1 and the merge use this
    same form.

    Where ``|m2| >= 2^30`` (|x| / T past ~7e8: a tiny temperature) the FMA's exact residual of the max itself,
    up to half an ulp of m2 (>= 64), would overflow the exponentials: there ``x·c`` rounded as ``x / T`` is in
    fp32 (torch's form), and the terms are 0 for the entries whose rounded ``x·c`` equals m2 and -inf for the
    others (each at least 2^64 times less likely: 2^-64 is not kept anywhere in fp32 sums of 1)."""
    if _huge(m2):                                           # a uniform branch: one per chunk or row
        r = tl.where(x * c == m2, 0.0, float("-inf"))
    elif FAST:
        r = tl.fma(x, c, -m2)
    else:
        r = (x.to(tl.float64) * c.to(tl.float64) - m2.to(tl.float64)).to(tl.float32)
    return r


@triton.jit
def _log2_scale(t_ptr, t_val, t_stride, row, T_MODE: tl.constexpr):
    """``c = log2(e) / T`` for row ``row``, the temperature folded into the one read of x: ``T_MODE`` 0: T = 1;
    1: the scalar ``t_val`` where ``t_stride < 0``, else ``t_ptr[row · t_stride]`` (one compiled kernel for
    both). A T that is not finite and > 0 (0 is greedy, the sampler's business) counts as 1 here: the
    probabilities of such a row are not used."""
    if T_MODE == 0:
        c = tl.full([], LOG2E, tl.float32)
    else:
        t = _param(t_ptr, t_val, t_stride, row)
        ok = (t > 0.0) & (t < float("inf"))
        c = tl.where(ok, LOG2E / tl.where(ok, t, 1.0), LOG2E)
    return c


@triton.jit
def _param(ptr, val, stride, row):
    """A per-row parameter: the scalar ``val`` where ``stride < 0``, else ``ptr[row · stride]`` as fp32."""
    v = tl.load(ptr + row.to(tl.int64) * tl.maximum(stride, 0)).to(tl.float32)
    return tl.where(stride < 0, val, v)


@triton.jit
def _kth_key(keys, k, BITS: tl.constexpr):
    """The largest ``t = INT32_MIN + j·2^(32 − BITS)`` with ``#{keys >= t} >= k``: the k-th largest key,
    rounded down to BITS bits (exact for BITS = 32). Padding is INT32_MIN and never counts. (int32 arithmetic
    wraps: the first candidate, INT32_MIN + 2^31, is 0.)"""
    t = tl.full([], INT32_MIN, tl.int32)
    for i in range(BITS):
        cand = t + (tl.full([], 1, tl.int32) << (31 - i))
        c = tl.sum((keys >= cand).to(tl.int32))
        t = tl.where(c >= k, cand, t)
    return t


@triton.jit
def _kth_distinct(keys, P: tl.constexpr):
    """The P-th largest distinct value of ``keys`` (INT32_MIN when there are fewer): at most the P-th largest
    counted with repeats, so a lower bound for it. P maxima, each removing every copy of the last."""
    t = tl.max(keys)
    for _ in tl.static_range(P - 1):
        keys = tl.where(keys == t, INT32_MIN, keys)
        t = tl.max(keys)
    return t


@triton.jit
def _packed_counts(keys, lo, s, B: tl.constexpr):
    """Σ over ``keys >= lo`` of the thermometer code of ``p = min((key − lo) >> s, F)``, F = 2^B − 1: field j
    (W = 63 // F bits, j = 1 … F) of the int64 sum is ``#{key >= lo + j·2^s}``. One reduction for F counts."""
    F: tl.constexpr = (tl.constexpr(1) << B) - 1
    W: tl.constexpr = 63 // F
    p = tl.minimum((keys - lo).to(tl.uint32, bitcast=True) >> s.to(tl.uint32), F).to(tl.int32)
    p = tl.where(keys >= lo, p, 0)
    code = tl.zeros(keys.shape, tl.int64)
    for j in tl.static_range(1, F + 1):
        code += tl.where(p >= j, tl.full([], 1, tl.int64) << (W * (j - 1)), 0)
    return tl.sum(code)


@triton.jit
def _field(tot, j: tl.constexpr, B: tl.constexpr):
    W: tl.constexpr = 63 // ((tl.constexpr(1) << B) - 1)
    return ((tot >> (W * (j - 1))) & ((tl.constexpr(1) << W) - 1)).to(tl.int32)


@triton.jit
def _kth_key_radix(keys, k, BITS: tl.constexpr, B: tl.constexpr):
    """:func:`_kth_key` with B bits per step (``ceil(BITS / B)`` reductions instead of BITS): the largest
    ``t = INT32_MIN + j·2^(32 − B·steps)`` with ``#{keys >= t} >= k``. Counts must fit 63 // (2^B − 1) bits."""
    F: tl.constexpr = (tl.constexpr(1) << B) - 1
    STEPS: tl.constexpr = (BITS + B - 1) // B
    t = tl.full([], INT32_MIN, tl.int32)
    for i in tl.static_range(STEPS):
        s = tl.full([], 32 - B * (i + 1), tl.int32)
        tot = _packed_counts(keys, t, s, B)
        j = tl.full([], 0, tl.int32)
        for f in tl.static_range(1, F + 1):
            j += (_field(tot, f, B) >= k).to(tl.int32)     # the counts fall with f: j = the largest f >= k
        t = (t.to(tl.int64) + (j.to(tl.int64) << s.to(tl.int64))).to(tl.int32)
    return t


@triton.jit
def _select(keys, idx, k, t):
    """The k first of (key desc, index asc) when ``t`` is the exact k-th key: every key ``> t``, and the ties
    ``== t`` up to the ``need``-th smallest index among them (bisection on the index bits)."""
    gt = keys > t
    eq = keys == t
    need = k - tl.sum(gt.to(tl.int32))
    u = 0x7FFFFFFF
    if tl.sum(eq.to(tl.int32)) > need:
        u = 0
        for i in range(31):        # the largest u with #{eq, idx < u} < need: the need-th smallest index
            cand = u + (1 << (30 - i))
            c = tl.sum((eq & (idx < cand)).to(tl.int32))
            u = tl.where(c < need, cand, u)
    return gt | (eq & (idx <= u))


@triton.jit
def _compact(slots_ptr, run, cnt, x, idx, t, win, EXACT: tl.constexpr, ASM: tl.constexpr):
    """c. Candidates to the chunk's slots, ``slots[pos] = bits(x) | idx << 32`` (int64): ``pos`` = the
    exclusive scan of the column counts ``cnt`` plus the running count ``run`` down the column, minus 1.
    Stored where ``x >= t`` (``EXACT``: where ``win``). ``ASM``: per element one ``mad.wide`` from the column's
    address and a predicated ``st.global.v2.b32``, in the registers' own layout (``tl.store`` to scattered
    addresses makes Triton move the whole tile through shared memory into a "coalesced" layout first)."""
    if ASM:
        col = slots_ptr.to(tl.int64) + (tl.cumsum(cnt, 0) - cnt - 1).to(tl.int64) * 8     # [R] byte address
        col = col[None, :] + tl.zeros_like(run).to(tl.int64)
        if EXACT:
            tl.inline_asm_elementwise(
                """{ .reg .pred p; .reg .b64 a; .reg .b32 v;
                setp.ne.b32 p, $5, 0; mad.wide.u32 a, $4, 8, $1; mov.b32 v, $2; @p st.global.v2.b32 [a], {v, $3};
                mov.b32 $0, 0; }""",
                "=r,l,f,r,r,r", [col, x, idx, run, win.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
        else:
            tl.inline_asm_elementwise(
                """{ .reg .pred p; .reg .b64 a; .reg .b32 v;
                setp.ge.f32 p, $2, $5; mad.wide.u32 a, $4, 8, $1; mov.b32 v, $2; @p st.global.v2.b32 [a], {v, $3};
                mov.b32 $0, 0; }""",
                "=r,l,f,r,r,f", [col, x, idx, run, tl.zeros_like(x) + t], dtype=tl.int32, is_pure=False, pack=1)
    else:
        if not EXACT:
            win = x >= t
        pos = (tl.cumsum(cnt, 0) - cnt)[None, :] + run - 1
        tl.store(slots_ptr + pos, (idx.to(tl.int64) << 32) | (x.to(tl.int32, bitcast=True).to(tl.int64) &
                                                              0xFFFFFFFF), mask=win)


@triton.jit(do_not_specialize=("k", "S", "BS", "t_val", "t_stride"))
def _topk_chunk_kernel(x_ptr, ws_ptr, stride_b, stride_v, V, k, S, BS, t_ptr, t_val, t_stride,
                       BLOCK: tl.constexpr, R: tl.constexpr, CAP: tl.constexpr, FAST: tl.constexpr,
                       RADIX: tl.constexpr, PEEL: tl.constexpr, T_MODE: tl.constexpr):
    """Stage 1, one program per chunk (BS = B·S chunks); ``k``: the rank t_c aims at (``PEEL`` > 0: that rank
    among distinct column maxima, found by peeling)."""
    _chunk_stage(x_ptr, ws_ptr, stride_b, stride_v, V, k, S, BS, t_ptr, t_val, t_stride, tl.program_id(0), BLOCK,
                 R, CAP, FAST, RADIX, PEEL, T_MODE)


@triton.jit
def _chunk_stage(x_ptr, ws_ptr, stride_b, stride_v, V, k, S, BS, t_ptr, t_val, t_stride, pid,
                 BLOCK: tl.constexpr, R: tl.constexpr, CAP: tl.constexpr, FAST: tl.constexpr, RADIX: tl.constexpr,
                 PEEL: tl.constexpr, T_MODE: tl.constexpr):
    """Stage 1 of chunk ``pid`` (steps a-c; d marked for the merge): its state and candidates to ``ws``."""
    G: tl.constexpr = BLOCK // R
    row = pid // S
    start = (pid % S) * BLOCK
    x_row = x_ptr + row.to(tl.int64) * stride_b + start.to(tl.int64) * stride_v
    off = tl.arange(0, G)[:, None] * R + tl.arange(0, R)[None, :]          # [G, R]: (g, r) -> g·R + r
    ptrs = x_row + off.to(tl.int64) * stride_v
    # read BLOCK elements of x: the only pass over x (padding is -inf)
    if start + BLOCK <= V:
        x = tl.load(ptrs).to(tl.float32)
    else:
        x = tl.load(ptrs, mask=off < V - start, other=float("-inf")).to(tl.float32)
    # a. chunk state in base 2: m2 = log2(e)·max x, d = Σ 2^(x·log2(e) − m2) = Σ e^(x − m). For m = ±inf, d is
    # taken relative to 0: (-inf, 0) is ⊕'s identity, (+inf, d) gives lse = +inf. A NaN anywhere makes d NaN
    # (and takes the exact path below).
    # With a temperature T, base 2 means c = log2(e) / T in place of log2(e): (m, d) of x / T.
    gmax = tl.max(x, axis=0)                                               # [R] column maxima, in-thread
    m = tl.max(gmax)
    c = _log2_scale(t_ptr, t_val, t_stride, row, T_MODE)
    m2 = m * c
    m2_ref = tl.where((m2 == float("inf")) | (m2 == float("-inf")), 0.0, m2)
    d = tl.sum(tl.sum(_exp2(_log2_rel(x, c, m2_ref, FAST), FAST), axis=0))
    # b. t <= the k-th largest column maximum <= the chunk's k-th largest key (columns with no element of
    # the row are padding)
    gkey = tl.where(start + tl.arange(0, R) < V, _key_of(gmax), INT32_MIN)
    if PEEL > 0:        # the PEEL-th largest distinct column maximum: PEEL int32 warp maxima (REDUX)
        t = _kth_distinct(gkey, PEEL)
    elif RADIX == 0:    # one warp: a 1-bit step is one int32 warp reduction (REDUX), a few instructions
        t = _kth_key(gkey, k, _COARSE)
    else:
        t = _kth_key_radix(gkey, k, _COARSE, RADIX if R < 512 else 2)
    tf = _value_of(t)
    ge = x >= tf
    cnt = tl.sum(ge.to(tl.int32), axis=0)                                  # [R] candidates per column
    n = tl.sum(cnt)
    exact = (n > CAP) | (d != d) | (t <= NEG_INF_KEY)
    # c. straight-line; stores nothing when the chunk is left to the exact path (x >= NaN is false)
    idx = start + off
    run = tl.cumsum(ge.to(tl.int32), axis=0)                               # running count down each column
    slots = (ws_ptr + 4 * BS).to(tl.pointer_type(tl.int64)) + pid.to(tl.int64) * CAP
    _compact(slots, run, cnt, x, idx, tl.where(exact, float("nan"), tf), x, False, FAST)
    # d. the exact path (rare) runs in the merge, which re-reads the chunk: n_c = -1 marks it. Its registers
    # (four [G, R] tiles) would otherwise set this kernel's register count and so its occupancy.
    tl.store(ws_ptr.to(tl.pointer_type(tl.float32)) + pid, m2)
    tl.store(ws_ptr.to(tl.pointer_type(tl.float32)) + BS + pid, d)
    tl.store(ws_ptr + 2 * BS + pid, tl.where(exact, -1, n))
    tl.store(ws_ptr + 3 * BS + pid, t)


@triton.jit
def _chunk_exact(x_ptr, ws_ptr, stride_b, stride_v, V, k, BS, row, pid, start, c,
                 BLOCK: tl.constexpr, R: tl.constexpr, CAP: tl.constexpr):
    """1d. Exact path of chunk ``pid`` (more than CAP candidates: sorted rows, long runs of ties; or a NaN, or
    fewer than k finite column maxima): the chunk's k first elements (key desc, index asc), re-read from x: the
    exact k-th key by 32-step bisection, its ties cut at the lower index (:func:`_select`); and m_c NaN-aware."""
    G: tl.constexpr = BLOCK // R
    off = tl.arange(0, G)[:, None] * R + tl.arange(0, R)[None, :]
    ptrs = x_ptr + row.to(tl.int64) * stride_b + (start + off).to(tl.int64) * stride_v
    mask = off < V - start
    x = tl.load(ptrs, mask=mask, other=float("-inf")).to(tl.float32)
    keys = tl.where(mask, _key_of(x), INT32_MIN)
    m2 = _value_of(tl.max(tl.max(keys, axis=0))) * c
    idx = start + off
    win = _select(keys, idx, k, _kth_key(keys, k, 32)) & mask
    cnt = tl.sum(win.to(tl.int32), axis=0)
    slots = (ws_ptr + 4 * BS).to(tl.pointer_type(tl.int64)) + pid.to(tl.int64) * CAP
    _compact(slots, tl.cumsum(win.to(tl.int32), axis=0), cnt, x, idx, 0.0, win, True, False)
    tl.store(ws_ptr.to(tl.pointer_type(tl.float32)) + pid, m2)
    tl.store(ws_ptr + 2 * BS + pid, tl.sum(cnt))


@triton.jit(do_not_specialize=("k", "S", "BS", "t_val", "t_stride"))
def _topk_exact_kernel(x_ptr, ws_ptr, stride_b, stride_v, V, k, S, BS, t_ptr, t_val, t_stride,
                       BLOCK: tl.constexpr, R: tl.constexpr, CAP: tl.constexpr, T_MODE: tl.constexpr):
    """1d as a launch of its own (``exact_apart``), one program per chunk, between stage 1 and the merge: the
    merge then carries none of the exact path's registers (its [G, R] tiles made the k = 1024 merge spill)."""
    pid = tl.program_id(0)
    if tl.load(ws_ptr + 2 * BS + pid) < 0:
        row = pid // S
        _chunk_exact(x_ptr, ws_ptr, stride_b, stride_v, V, k, BS, row, pid, (pid % S) * BLOCK,
                     _log2_scale(t_ptr, t_val, t_stride, row, T_MODE), BLOCK, R, CAP)


@triton.jit
def _add3(a1, a2, a3, b1, b2, b3):
    return a1 + b1, a2 + b2, a3 + b3


@triton.jit
def _slot_tile(cand_ptr, n_ptr, S, j, CT: tl.constexpr, W: tl.constexpr, CAP: tl.constexpr):
    """Keys of the first W slots of chunks ``[j·CT, (j + 1)·CT)`` of the row, ``[CT, W]`` (INT32_MIN where chunk c
    has no candidate: slot ``>= n_c``), and the slots' offsets (CAP slots per chunk). Loads bypass L1: the merge
    may have written them."""
    c = j * CT + tl.arange(0, CT)
    n = tl.load(n_ptr + c, mask=c < S, other=0, cache_modifier=".cg")
    o = c[:, None] * CAP + tl.arange(0, W)[None, :]
    live = tl.arange(0, W)[None, :] < n[:, None]
    bits = tl.load(cand_ptr + 2 * o, mask=live, other=0, cache_modifier=".cg")
    return tl.where(live, _key_of(bits.to(tl.float32, bitcast=True)), INT32_MIN), o


@triton.jit
def _tile_j(keys0, cand_ptr, n_ptr, S, j, NT: tl.constexpr, CT: tl.constexpr, W: tl.constexpr, CAP: tl.constexpr):
    """Tile j of the row's slots: the register tile when it holds them all (NT = 1), else loaded (from L2)."""
    if NT == 1:     # the offsets are recomputed, not held in registers beside the keys
        c = tl.arange(0, CT)
        return keys0, c[:, None] * CAP + tl.arange(0, W)[None, :]
    else:
        return _slot_tile(cand_ptr, n_ptr, S, j, CT, W, CAP)


@triton.jit
def _select_into(keys0, cand_ptr, n_ptr, SC, lo, k, buf, OUT_STATE: tl.constexpr, NT: tl.constexpr,
                 CT: tl.constexpr, W: tl.constexpr, CAP: tl.constexpr):
    """Steps 3–4 on the row's candidate keys (tiles ``[CT, W]``, ``keys0`` the first) given ``lo`` with
    ``#{key >= lo} >= k``: the at most CAP survivors to ``buf``; returns their number and the bound t."""
    kmax = tl.full([], INT32_MIN, tl.int32)
    cnt = 0
    for j in tl.static_range(NT):
        kj, o = _tile_j(keys0, cand_ptr, n_ptr, SC, j, NT, CT, W, CAP)
        kmax = tl.maximum(kmax, tl.max(kj))
        cnt += tl.sum((kj >= lo).to(tl.int32))
    # 3. narrow [lo, hi) (#{key >= lo} >= k > #{key >= hi}) by 4-way splits until <= CAP keys are >= lo, or
    # hi = lo + 1 (lo is then the exact k-th key): 3 counts per reduction, about 2-3 reductions for i.i.d. data
    hi = kmax.to(tl.int64) + 1
    while (cnt > CAP) & (hi - lo.to(tl.int64) > 1):
        w = hi - lo.to(tl.int64)
        e = (w.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127       # floor(log2 w) or above
        s = tl.maximum(e - 1, 0)                                           # 4·2^s > w
        step = tl.full([], 1, tl.int64) << s.to(tl.int64)
        th1 = tl.minimum(lo.to(tl.int64) + step, 0x7FFFFFFF).to(tl.int32)   # thresholds past the largest key
        th2 = tl.minimum(lo.to(tl.int64) + 2 * step, 0x7FFFFFFF).to(tl.int32)   # count nothing (hi <= 2^31)
        th3 = tl.minimum(lo.to(tl.int64) + 3 * step, 0x7FFFFFFF).to(tl.int32)
        c1 = 0
        c2 = 0
        c3 = 0
        for j in tl.static_range(NT):
            kj, o = _tile_j(keys0, cand_ptr, n_ptr, SC, j, NT, CT, W, CAP)
            a1, a2, a3 = tl.reduce(tl.reduce(((kj >= th1).to(tl.int32), (kj >= th2).to(tl.int32),
                                              (kj >= th3).to(tl.int32)), 1, _add3), 0, _add3)   # one tree
            c1 += a1
            c2 += a2
            c3 += a3
        f = (c1 >= k).to(tl.int32) + (c2 >= k).to(tl.int32) + (c3 >= k).to(tl.int32)
        cnt = tl.where(f == 0, cnt, tl.where(f == 1, c1, tl.where(f == 2, c2, c3)))
        new_lo = lo.to(tl.int64) + (f.to(tl.int64) << s.to(tl.int64))
        hi = tl.minimum(hi, new_lo + (tl.full([], 1, tl.int64) << s.to(tl.int64)))
        lo = new_lo.to(tl.int32)
    t = lo
    t_gt = t - 1                                    # survivors: key > t_gt, or key == t with index <= u
    u = 0x7FFFFFFF
    if cnt > CAP:
        # rare (ties): t is the exact k-th key; its ties cut at the lower index, the largest u with
        # #{key == t, index < u} < k − #{key > t}
        t_gt = t
        n_gt = 0
        for j in tl.static_range(NT):
            kj, o = _tile_j(keys0, cand_ptr, n_ptr, SC, j, NT, CT, W, CAP)
            n_gt += tl.sum((kj > t).to(tl.int32))
        u = 0
        for i in range(31):
            c_u = u + (1 << (30 - i))
            below = 0
            for j in tl.static_range(NT):
                kj, o = _tile_j(keys0, cand_ptr, n_ptr, SC, j, NT, CT, W, CAP)
                eq = kj == t
                below += tl.sum((eq & (tl.load(cand_ptr + 2 * o + 1, mask=eq, other=0) < c_u)).to(tl.int32))
            u = tl.where(below < k - n_gt, c_u, u)
    # 4. compact the survivors (<= CAP) and pack them: by (key desc, index asc) in one int64 to be sorted; first
    # level of the tree: the group's candidates, unsorted, (value bits, index) as stage 1 stores them
    n = 0
    for j in tl.static_range(NT):
        kj, o = _tile_j(keys0, cand_ptr, n_ptr, SC, j, NT, CT, W, CAP)
        maybe = kj >= t
        idx = tl.load(cand_ptr + 2 * o + 1, mask=maybe, other=0)
        surv = maybe & ((kj > t_gt) | (idx <= u))
        per_c = tl.sum(surv.to(tl.int32), axis=1)
        pos = n + (tl.cumsum(per_c, 0) - per_c)[:, None] + tl.cumsum(surv.to(tl.int32), axis=1) - 1
        if OUT_STATE:
            packed = (idx.to(tl.int64) << 32) | (_value_of(kj).to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF)
        else:
            packed = (kj.to(tl.int64) << 32) | (0x7FFFFFFF - idx).to(tl.int64)
        tl.store(buf + pos, packed, mask=surv)
        n += tl.sum(per_c)
    return n, t


@triton.jit(do_not_specialize=("k", "S", "BS", "GS", "NG", "t_val", "t_stride"))
def _topk_merge_kernel(x_ptr, stride_b, stride_v, V, ws_ptr, out_ptr, val_ptr, ind_ptr, lse_ptr, k, S, BS, GS, NG,
                       t_ptr, t_val, t_stride,
                       BLOCK: tl.constexpr, R: tl.constexpr, CAP: tl.constexpr, SP: tl.constexpr,
                       CT: tl.constexpr, FAST: tl.constexpr, EXACT: tl.constexpr, OUT_STATE: tl.constexpr,
                       W: tl.constexpr, T_MODE: tl.constexpr):
    """Program ``pid`` merges chunks ``[g·GS, g·GS + SC)`` of row ``pid // NG`` (g = pid % NG; S chunks per row in
    ``ws``). One level (NG = 1, GS = S): the row's answer. ``OUT_STATE`` (first level of the tree): the group's
    state ``(m, d, n, t, survivors)`` to ``out_ptr``, laid out as stage 1's, the second level's input.
    ``W < CAP``: stage 1 aimed at a rank below k; the first W slots of each chunk, checked (see below)."""
    pid = tl.program_id(0)
    row, buf, n, t, m, d, c = _merge_rows(x_ptr, stride_b, stride_v, V, ws_ptr, out_ptr, lse_ptr, k, S, BS, GS, NG,
                                          t_ptr, t_val, t_stride, BLOCK, R, CAP, SP, CT, FAST, EXACT, OUT_STATE, W,
                                          T_MODE, not OUT_STATE)
    if OUT_STATE:
        BP = tl.num_programs(0)
        out_f = out_ptr.to(tl.pointer_type(tl.float32))
        tl.store(out_f + pid, m)
        tl.store(out_f + BP + pid, d)
        tl.store(out_ptr + 2 * BP + pid, n)
        tl.store(out_ptr + 3 * BP + pid, t)
    else:
        j, p, ind = _ranked(buf, n, m, d, c, CAP, FAST)
        out = row.to(tl.int64) * k + j
        tl.store(val_ptr + out, p, mask=j < k)
        tl.store(ind_ptr + out, ind.to(tl.int64), mask=j < k)


@triton.jit(do_not_specialize=("k", "kc", "B", "t_val", "t_stride"))
def _topk_row_kernel(x_ptr, stride_b, stride_v, V, ws_ptr, val_ptr, ind_ptr, lse_ptr, k, kc, B, t_ptr, t_val,
                     t_stride, BLOCK: tl.constexpr, R: tl.constexpr, CAP: tl.constexpr, FAST: tl.constexpr,
                     RADIX: tl.constexpr, PEEL: tl.constexpr, W: tl.constexpr, T_MODE: tl.constexpr):
    """Stage 1 and the merge in one program per row, where one chunk holds the whole row (S = 1, ``Plan.one``):
    the chunk's state and candidates go to ``ws`` as between two launches and are read back after a barrier of
    the program's threads. One launch in place of two: the host's cost of a small call (a mixture-of-experts
    router's [tokens, experts], a decode step's short rows). ``kc``: stage 1's rank (``kb`` or k)."""
    row = tl.program_id(0)
    _chunk_stage(x_ptr, ws_ptr, stride_b, stride_v, V, kc, 1, B, t_ptr, t_val, t_stride, row, BLOCK, R, CAP, FAST,
                 RADIX, PEEL, T_MODE)
    tl.debug_barrier()
    _r, buf, n, t, m, d, c = _merge_rows(x_ptr, stride_b, stride_v, V, ws_ptr, ws_ptr, lse_ptr, k, 1, B, 1, 1, t_ptr,
                                         t_val, t_stride, BLOCK, R, CAP, 1, 1, FAST, True, False, W, T_MODE, True)
    j, p, ind = _ranked(buf, n, m, d, c, CAP, FAST)
    out = row.to(tl.int64) * k + j
    tl.store(val_ptr + out, p, mask=j < k)
    tl.store(ind_ptr + out, ind.to(tl.int64), mask=j < k)


@triton.jit
def _merge_rows(x_ptr, stride_b, stride_v, V, ws_ptr, out_ptr, lse_ptr, k, S, BS, GS, NG, t_ptr, t_val, t_stride,
                BLOCK: tl.constexpr, R: tl.constexpr, CAP: tl.constexpr, SP: tl.constexpr, CT: tl.constexpr,
                FAST: tl.constexpr, EXACT: tl.constexpr, OUT_STATE: tl.constexpr, W: tl.constexpr,
                T_MODE: tl.constexpr, LSE: tl.constexpr):
    """The merge of program ``pid`` (see :func:`_topk_merge_kernel`): its row, the survivors' buffer, their number
    n <= CAP, the bound t, the state (m, d) in base 2 and c = log2(e) / T; ``LSE``: the row's lse stored as soon as
    it is known. The final level (``OUT_STATE`` off) leaves the survivors packed (key desc, index asc) for
    :func:`_ranked`; the sampler's fused epilogue takes them from here too (``sampling_kernels``)."""
    NT: tl.constexpr = SP // CT
    pid = tl.program_id(0)
    if OUT_STATE:
        row = pid // NG
        c0 = (pid % NG) * GS                    # the group's first chunk in its row
        SC = tl.minimum(GS, S - c0)
    else:
        row = pid
        c0 = 0
        SC = S
    base_s = row * S + c0
    c = _log2_scale(t_ptr, t_val, t_stride, row, T_MODE)
    m_ptr = ws_ptr.to(tl.pointer_type(tl.float32))
    n_ptr = ws_ptr + 2 * BS + base_s
    so = tl.arange(0, SP)
    smask = so < SC
    # 0. chunks stage 1 left to the exact path (n_c = -1), rare
    if EXACT:
        if tl.min(tl.load(n_ptr + so, mask=smask, other=0)) < 0:
            for j in range(SC):
                if tl.load(n_ptr + j, cache_modifier=".cg") < 0:
                    _chunk_exact(x_ptr, ws_ptr, stride_b, stride_v, V, k, BS, row, base_s + j, (c0 + j) * BLOCK,
                                 c, BLOCK, R, CAP)
            tl.debug_barrier()
    # 1. (m, d) = ⊕ over the S chunks, in base 2: m = max m_c, d = Σ d_c 2^(m_c − m)   (NaN in any chunk → NaN)
    mc = tl.load(m_ptr + base_s + so, mask=smask, other=float("-inf"), cache_modifier=".cg")
    dc = tl.load(m_ptr + BS + base_s + so, mask=smask, other=0.0)
    has_nan = tl.sum((mc != mc).to(tl.int32)) > 0
    m = tl.max(tl.where(mc != mc, float("-inf"), mc))
    m = tl.where(has_nan, float("nan"), m)
    d = tl.sum(tl.where(smask, dc * tl.where(mc == m, 1.0, tl.exp2(mc - m)), 0.0))
    if LSE:
        tl.store(lse_ptr + row, (m + tl.log2(d)) * LN2)
    # 2. the row's k-th key is >= lo = max_c t_c: chunk c holds k elements >= t_c. (t_c is a lower bound for
    # chunk c's k-th key whichever path it took; every real key is >= the key of -inf. With W < CAP, t_c bounds
    # a smaller rank and the claim is checked before it is used, below.)
    tc = tl.load(ws_ptr + 3 * BS + base_s + so, mask=smask, other=INT32_MIN)
    lo = tl.maximum(tl.max(tc), NEG_INF_KEY)
    # the candidate slots of the row (CAP per chunk, chunk c holds n_c): int64 = value bits | index << 32
    slots = (ws_ptr + 4 * BS).to(tl.pointer_type(tl.int64))
    cand_ptr = (slots + base_s.to(tl.int64) * CAP).to(tl.pointer_type(tl.int32))
    BP = tl.num_programs(0)
    if OUT_STATE:
        buf = (out_ptr + 4 * BP).to(tl.pointer_type(tl.int64)) + pid.to(tl.int64) * CAP
    else:
        buf = slots + tl.cast(BS, tl.int64) * CAP + row.to(tl.int64) * CAP   # BS == 1: a constexpr int
    if W < CAP:
        # stage 1 bounded each chunk by its KB-th largest column maximum (KB < k): chunk c stores every element
        # >= t_c, or (exact path, step 0) its top k. If every chunk's n_c <= W (the tile holds them all) and
        # #{key >= lo} >= k, the row's k-th key is >= lo >= t_c, so no element left out can be in the answer.
        keys0 = _slot_tile(cand_ptr, n_ptr, SC, 0, SP, W, CAP)[0]
        nc = tl.load(n_ptr + so, mask=smask, other=0, cache_modifier=".cg")
        if (tl.max(nc) <= W) & (tl.sum((keys0 >= lo).to(tl.int32)) >= k):
            n, t = _select_into(keys0, cand_ptr, n_ptr, SC, lo, k, buf, OUT_STATE, 1, SP, W, CAP)
        else:
            # rare (the top k gathered in few chunks, sorted rows, ties, a NaN). kh = the tile's exact k-th key
            # (INT32_MIN if it holds fewer than k) is <= the row's: the tile is part of the row. A chunk with
            # t_c <= kh leaves out only keys < kh; one with t_c > kh is re-read for its exact top k. Then the
            # whole CAP slots of every chunk, from lo = kh (#{key >= kh} >= k still holds).
            kh = _kth_key(keys0, k, 32)
            for j in range(SC):
                if tl.load(ws_ptr + 3 * BS + base_s + j) > kh:
                    _chunk_exact(x_ptr, ws_ptr, stride_b, stride_v, V, k, BS, row, base_s + j, (c0 + j) * BLOCK,
                                 c, BLOCK, R, CAP)
            tl.debug_barrier()
            keys1 = _slot_tile(cand_ptr, n_ptr, SC, 0, CT, CAP, CAP)[0]
            n, t = _select_into(keys1, cand_ptr, n_ptr, SC, tl.maximum(kh, NEG_INF_KEY), k, buf, OUT_STATE,
                                NT, CT, CAP, CAP)
    else:
        keys0 = _slot_tile(cand_ptr, n_ptr, SC, 0, CT, CAP, CAP)[0]
        n, t = _select_into(keys0, cand_ptr, n_ptr, SC, lo, k, buf, OUT_STATE, NT, CT, CAP, CAP)
    return row, buf, n, t, m, d, c


@triton.jit
def _ranked(buf, n, m, d, c, CAP: tl.constexpr, FAST: tl.constexpr):
    """The ``n <= CAP`` survivors in ``buf`` sorted: ``(j, p, index)``, rank j's probability and int32 index (the
    first k are the answer)."""
    tl.debug_barrier()
    j = tl.arange(0, CAP)
    packed = tl.load(buf + j, mask=j < n, other=-9223372036854775808, cache_modifier=".cg")
    packed = tl.sort(packed, descending=True)
    key = (packed >> 32).to(tl.int32)
    ind = 0x7FFFFFFF - (packed & 0xFFFFFFFF).to(tl.int32)
    # 5. p = e^(x/T − m) / d = 2^(x·c − m2) / d; NaN where torch.softmax gives NaN for the whole row
    # (m = ±inf, or NaN)
    p = tl.exp2(_log2_rel(_value_of(key), c, m, FAST)) / d
    p = tl.where((m == float("inf")) | (m == float("-inf")), float("nan"), p)
    return j, p, ind


@triton.jit
def _topk_grad_kernel(x_ptr, lse_ptr, v_ptr, ind_ptr, dv_ptr, dlse_ptr, dx_ptr, stride_b, stride_v, dv_sb, dv_sk,
                      dlse_s, B, V, K, NB, ROWS: tl.constexpr, BLOCK: tl.constexpr, KC: tl.constexpr,
                      HAS_DV: tl.constexpr, HAS_DLSE: tl.constexpr):
    """The backward of ``(values, lse)`` over a ``[ROWS, BLOCK]`` tile of rows (NB column blocks per row block).
    With p = softmax(x) and v = p at the k indices: ``∂v_a/∂x_j = v_a(δ_aj − p_j)``, ``∂lse/∂x_j = p_j``, so
    ``dx = −p·c`` with ``c = Σ_a dv_a·v_a − dlse`` per row, except at the k selected entries, ``v·(dv − c)``.
    1. c from the row's k values and gradients, KC at a time (each column block of a row computes it: k loads)
    2. the dense ``−p·c``, ``p = 2^((x − lse)·log2 e)`` from the forward's lse: one read of x, one write of dx
    3. after a barrier (the dense store above may hold the same addresses, from other threads), the selected
       entries that fall in this tile."""
    pid = tl.program_id(0)
    rb = pid // NB
    c0 = (pid - rb * NB) * BLOCK
    rows = rb * ROWS + tl.arange(0, ROWS)
    cols = c0 + tl.arange(0, BLOCK)
    ok_r = rows < B
    r64 = rows.to(tl.int64)[:, None]
    # 1. c = Σ dv·v − dlse
    c = tl.zeros([ROWS], tl.float32)
    if HAS_DV:
        for k0 in range(0, K, KC):
            ks = k0 + tl.arange(0, KC)
            sel_ok = ok_r[:, None] & (ks < K)[None, :]
            v = tl.load(v_ptr + r64 * K + ks[None, :], mask=sel_ok, other=0.0)
            dv = tl.load(dv_ptr + r64 * dv_sb + ks[None, :] * dv_sk, mask=sel_ok, other=0.0).to(tl.float32)
            c += tl.sum(dv * v, axis=1)
    if HAS_DLSE:
        c -= tl.load(dlse_ptr + rows.to(tl.int64) * dlse_s, mask=ok_r, other=0.0).to(tl.float32)
    # 2. dx = −p·c
    mask = ok_r[:, None] & (cols < V)[None, :]
    x = tl.load(x_ptr + r64 * stride_b + cols.to(tl.int64)[None, :] * stride_v, mask=mask, other=0.0)
    lse = tl.load(lse_ptr + rows, mask=ok_r, other=0.0)
    p = tl.exp2((x.to(tl.float32) - lse[:, None]) * LOG2E)
    tl.store(dx_ptr + r64 * V + cols[None, :], (-p * c[:, None]).to(dx_ptr.dtype.element_ty), mask=mask)
    # 3. the selected entries of this tile: v·(dv − c)
    if HAS_DV:
        tl.debug_barrier()
        for k0 in range(0, K, KC):
            ks = k0 + tl.arange(0, KC)
            sel_ok = ok_r[:, None] & (ks < K)[None, :]
            ind = tl.load(ind_ptr + r64 * K + ks[None, :], mask=sel_ok, other=-1)
            mine = sel_ok & (ind >= c0) & (ind < c0 + BLOCK)
            v = tl.load(v_ptr + r64 * K + ks[None, :], mask=mine, other=0.0)
            dv = tl.load(dv_ptr + r64 * dv_sb + ks[None, :] * dv_sk, mask=mine, other=0.0).to(tl.float32)
            tl.store(dx_ptr + r64 * V + ind, (v * (dv - c[:, None])).to(dx_ptr.dtype.element_ty), mask=mine)
