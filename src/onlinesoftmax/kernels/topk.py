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
per-chunk cost that the chunk size amortises. Dispatch: :func:`select_path`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..backend import interpret_mode
from ._launch import BoundKernel, stream_scratch

# --- dispatch thresholds (see select_path) ------------------------------------------------------------------
MAX_FUSED_K = 2048                  # k above this (after rounding up to a power of two) takes the sort path
MIN_KP = 16                         # candidate lists are at least this long (tl.sort / tl.arange sizes)
CAP_FACTOR = 2                      # CAP = 2·KP candidate slots per chunk, and survivors in the merge
COLS_PER_KP = 2                     # R = 2·KP column maxima per chunk: ≈ k·(1 + k/2R) <= 1.25·k candidates
MAX_COLS = 2048                     # R = 2·KP up to k = 1024 (with R = KP = 1024, t was the smallest column maximum:
                                    # ≈ 5700 candidates per 16384-element chunk > CAP, every chunk took the exact path)
COARSE_BITS = 16                    # bits of a threshold that only has to be a lower bound
RADIX_BITS = 3                      # stage 1: bits per bisection step (2^3 − 1 counts packed in one int64 sum;
                                    # 2 bits when R >= 512, as a count then needs more than 9 bits)
ELEMS_PER_THREAD = 64               # elements of x per thread: 64 fit in registers beside the rest (no spills)
MERGE_TILE = 8192                   # candidate keys the merge holds in registers; more are streamed from L2
MERGE_MAX_SLOTS = 32768             # S_pow2 · CAP candidate slots of a row, at most
MERGE_SLOTS_PER_WARP = 2048         # merge warps: min(S_pow2 · CAP, MERGE_TILE) / this, at least 4
MERGE_FEW_ROWS = 128                # B <= this: twice the merge warps (every row's program runs at once)
FIT_TILE_MIN_KP = 256               # from this KP, chunks (and warps, up to FIT_MAX_WARPS) grow until the merge's
FIT_MAX_WARPS = 8                   # slots fit MERGE_TILE (H200, run 9: k = 256, 32 x 151936: 54 µs with
                                    # 16384-element chunks and 8 warps, 76 µs with 8192 / 4, 130 µs with 4096 / 2);
                                    # warps of stage 1 for KP >= FIT_TILE_MIN_KP (R = 2048: 255 registers, no spill)
TREE_SLOTS_SMALL_K = 2048           # the merge would stream its slots (S·CAP > MERGE_TILE): a two-level merge, first
TREE_WARPS_SMALL_K = 2              # over groups of this many slots (k <= 64; H200 run 14, 256 x 262144, k = 50:
                                    # 163 µs against 235 one-level) or of MERGE_TILE slots (KP >= FIT_TILE_MIN_KP)
BINARY_BISECT_MAX_WARPS = 1         # stage 1 with this many warps or fewer: 1-bit bisection steps (each one int32 warp
                                    # reduction, REDUX: 16 steps ≈ 290 SASS instructions against ≈ 930 for the
                                    # 3-bit radix steps' int64 packed counts; 2136 → 1504 static instructions at
                                    # the goal shape; H200 run 17: stage 1 58 → 50 µs there). 1 = every one-warp
                                    # stage 1 (k <= 64)
ROW_BOUND = False                   # the merge starts from the k-th largest chunk maximum when k <= chunks
                                    # (simulated: ≈ 96 candidates >= it at the goal shape, so no narrowing pass);
                                    # off: not yet timed on a GPU
NARROW_KB = 8                       # k > this: stage 1's bound t_c is the chunk's NARROW_KB-th largest column
NARROW_WIDTH = 32                   # maximum (≈ NARROW_KB candidates, not ≈ k) and the one-level merge loads
NARROW_PEEL_MAX = 16                # one-warp stage 1 with kb <= this finds t_c by kb warp maxima, not bisection
                                    # (H200 run 21, goal shape: stage 1 49.0 → 45.0 µs, the call 61.3 → 56.4)
NARROW_SPARSITY = 4                 # NARROW_WIDTH slots per chunk, checked, with an exact fallback; where
                                    # k·BLOCK·NARROW_SPARSITY <= NARROW_KB·V (the row's k-th key is then far above
                                    # the chunks' NARROW_KB-th largest for i.i.d. rows). 0 = off. H200 run 19,
                                    # 256 x 128256, k = 50: 62.8 µs against 72.9 (radix 0) and 81.5 (run 16's plan)

INT32_MIN = tl.constexpr(-2147483648)    # padding key: below every real key (-inf is 0x807FFFFF)
NEG_INF_KEY = tl.constexpr(-2139095041)  # key of -inf
NAN_KEY = tl.constexpr(0x7FC00000)       # canonical NaN key: above +inf (0x7F800000)
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
_COARSE = tl.constexpr(COARSE_BITS)
RADIX_BITS_ = tl.constexpr(RADIX_BITS)
PATHS = ("filter", "sort")


@dataclass(frozen=True)
class TopKConfig:
    path: str           # "filter" | "sort"
    block: int = 0      # elements per stage-1 program
    cols: int = 0       # R: columns (group maxima) per chunk; G = block // cols elements each
    kp: int = 0         # k rounded up to a power of two (>= MIN_KP)
    cap: int = 0        # candidate slots per chunk and survivor slots of the merge: CAP_FACTOR·KP
    splits: int = 0     # S: programs per row in stage 1
    num_warps: int = 1
    merge_warps: int = 4
    tree: int = 0       # > 0: two-level merge, first over groups of this many chunks (see softmax_topk_2d)
    tree_warps: int = 0     # warps of the first level's programs
    exact_apart: bool = False   # a chunk's exact path (1d) in a launch of its own, not inside the merge
    radix: int = RADIX_BITS     # stage 1: bits per bisection step of t (0: 1-bit steps, one int32 reduction each)
    maxnreg: int = 0            # stage 1: register cap per thread (0: the compiler's choice)
    row_bound: bool = False     # the merge's lo also >= the k-th largest chunk maximum (k <= chunks of the program)
    kb: int = 0                 # stage 1's t_c: the kb-th largest column maximum (0: k; kb < k needs width)
    width: int = 0              # the merge's tile: the first `width` slots of each chunk (0: all CAP)
    peel: int = 0               # stage 1's t_c: the peel-th largest distinct column maximum, by peel warp maxima

    @property
    def group(self) -> int:     # G: elements per column
        return self.block // self.cols if self.cols else 0


def _pow2(n: int) -> int:
    return 1 << (max(int(n), 1) - 1).bit_length()


def select_path(B: int, V: int, k: int, *, path: str | None = None, block: int | None = None,
                num_warps: int | None = None, tree: int | None = None, tree_warps: int | None = None,
                merge_warps: int | None = None, exact_apart: bool | None = None, radix: int | None = None,
                maxnreg: int = 0, row_bound: bool | None = None, kb: int | None = None,
                width: int | None = None, peel: int | None = None, esize: int = 4) -> TopKConfig:
    """The kernel configuration ``softmax_topk`` runs for a ``[B, V]`` input of ``esize``-byte floats and ``k``.

    One warp per 2048-element chunk for k <= 64 (R = 128 columns of 16 elements; 16-byte loads, the bisection
    on R values is warp shuffles only); larger k needs R = 2·KP columns, so more warps and larger chunks. The
    chunk grows only as far as the merge's register tile needs (``MERGE_MAX_SLOTS``). ``path`` / ``block`` /
    ``num_warps`` / ``tree`` / ``tree_warps`` / ``merge_warps`` / ``exact_apart`` / ``radix`` / ``maxnreg`` /
    ``row_bound`` / ``kb`` / ``width`` / ``peel`` override the choice (tests and the variant timers
    use them).
    """
    if path is not None and path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    kp = max(MIN_KP, _pow2(k))
    if kp > MAX_FUSED_K or path == "sort":
        return TopKConfig("sort", kp=kp)
    cap = CAP_FACTOR * kp
    vec = 16 // esize                                   # elements per 16-byte load
    cols = max(min(COLS_PER_KP * kp, MAX_COLS), 32 * vec)
    max_warps = max(1, cols // (32 * vec))              # every warp along the columns: column maxima in-thread
    if kp >= FIT_TILE_MIN_KP:
        max_warps = FIT_MAX_WARPS
    if block is None:
        block = max(cols, min(32 * ELEMS_PER_THREAD, _pow2(V)))
        while _pow2(triton.cdiv(V, block)) * cap > MERGE_MAX_SLOTS:
            block *= 2
        while (kp >= FIT_TILE_MIN_KP and block < 32 * ELEMS_PER_THREAD * max_warps
               and _pow2(triton.cdiv(V, block)) * cap > MERGE_TILE):
            block *= 2
    splits = triton.cdiv(V, block)
    if _pow2(splits) * cap > MERGE_MAX_SLOTS or block > 2 * 32 * ELEMS_PER_THREAD * max_warps:
        return TopKConfig("sort", kp=kp)
    cols = min(cols, block)
    if num_warps is None:
        num_warps = max(1, min(max_warps, block // (32 * ELEMS_PER_THREAD)))
    # the merge also runs a chunk's exact path (1d) at 64 elements per thread; few rows (one wave of
    # programs whatever their size): twice the warps, half the latency
    mw = max(4, min(_pow2(splits) * cap, MERGE_TILE) // MERGE_SLOTS_PER_WARP, num_warps)
    if B <= MERGE_FEW_ROWS:
        mw = min(2 * mw, 16)
    tw = 0
    # the narrow merge where x is sparse in the answer (a chunk's kb-th largest is far above the row's k-th) and
    # its tile fits the registers; it needs no tree
    narrow = (kb is None and tree is None and 0 < NARROW_KB < k and not (ROW_BOUND if row_bound is None else row_bound)
              and k * block * NARROW_SPARSITY <= NARROW_KB * V and _pow2(splits) * NARROW_WIDTH <= MERGE_TILE)
    if tree is None:        # a two-level merge where one program per row would stream its slots from L2
        tree = 0
        if _pow2(splits) * cap > MERGE_TILE and not narrow:
            tree, tw = ((TREE_SLOTS_SMALL_K // cap, TREE_WARPS_SMALL_K) if kp < FIT_TILE_MIN_KP
                        else (MERGE_TILE // cap, max(4, num_warps)))
    tree = min(tree, MERGE_TILE // cap, splits)
    if tree and triton.cdiv(splits, tree) == 1:
        tree = 0
    if tree:
        ng = triton.cdiv(splits, tree)
        tw = tree_warps or tw or max(1, min(16, _pow2(tree) * cap // MERGE_SLOTS_PER_WARP))
        mw = max(num_warps if kp >= FIT_TILE_MIN_KP else 1,     # (CAP = 2048, SP = 4: 4 warps spill 544 bytes)
                 min(16, _pow2(ng) * cap // MERGE_SLOTS_PER_WARP * (2 if B <= MERGE_FEW_ROWS else 1)))
    mw = merge_warps or mw
    if exact_apart is None:     # the first level's tile is MERGE_TILE: the exact path's registers would spill it
        exact_apart = bool(tree) and kp >= FIT_TILE_MIN_KP
    if radix is None:
        radix = 0 if num_warps <= BINARY_BISECT_MAX_WARPS else RADIX_BITS
    if row_bound is None:   # only where a merge program holds k chunks (else no k-th largest maximum exists)
        row_bound = ROW_BOUND and k <= (min(tree, triton.cdiv(splits, tree)) if tree else splits)
    if kb is None:
        kb = NARROW_KB if narrow else 0
    if width is None:
        width = NARROW_WIDTH if kb else 0
    if bool(kb) != bool(width) or width > cap or (kb and (tree or row_bound)):
        raise ValueError(f"select_path: kb={kb} needs width (<= CAP = {cap}) and a one-level merge, and the reverse")
    if peel is None:    # the narrow merge's small rank, one warp: peeling instead of bisection
        peel = kb if kb and num_warps == 1 and kb <= NARROW_PEEL_MAX else 0
    return TopKConfig("filter", block, cols, kp, cap, splits, num_warps, mw, tree, tw, exact_apart, radix, maxnreg,
                      row_bound, kb, width, peel)


# --- device helpers -----------------------------------------------------------------------------------------

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
def _log2_rel(x, m2, FAST: tl.constexpr):
    """``x·log2(e) − m2`` with one rounding: an FMA, so the term is exact relative to the row's reference even
    when |x| is large (the interpreter emulates the FMA in fp64). Stage 1 and the merge use this same form."""
    if FAST:
        return tl.fma(x, LOG2E, -m2)
    else:
        c = tl.full([], LOG2E, tl.float32).to(tl.float64)
        return (x.to(tl.float64) * c - m2.to(tl.float64)).to(tl.float32)


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


# --- stage 1: per-chunk (m, d) and top-k candidates ---------------------------------------------------------

@triton.jit
def _topk_chunk_kernel(x_ptr, ws_ptr, stride_b, stride_v, V, k, S, BS,
                       BLOCK: tl.constexpr, R: tl.constexpr, CAP: tl.constexpr, FAST: tl.constexpr,
                       RADIX: tl.constexpr, PEEL: tl.constexpr):
    """Stage 1, one program per chunk (BS = B·S chunks); ``k``: the rank t_c aims at (``PEEL`` > 0: that rank
    among distinct column maxima, found by peeling)."""
    G: tl.constexpr = BLOCK // R
    pid = tl.program_id(0)
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
    gmax = tl.max(x, axis=0)                                               # [R] column maxima, in-thread
    m = tl.max(gmax)
    m2 = m * LOG2E
    m2_ref = tl.where((m2 == float("inf")) | (m2 == float("-inf")), 0.0, m2)
    d = tl.sum(tl.sum(_exp2(_log2_rel(x, m2_ref, FAST), FAST), axis=0))
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
def _chunk_exact(x_ptr, ws_ptr, stride_b, stride_v, V, k, BS, row, pid, start,
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
    m2 = _value_of(tl.max(tl.max(keys, axis=0))) * LOG2E
    idx = start + off
    win = _select(keys, idx, k, _kth_key(keys, k, 32)) & mask
    cnt = tl.sum(win.to(tl.int32), axis=0)
    slots = (ws_ptr + 4 * BS).to(tl.pointer_type(tl.int64)) + pid.to(tl.int64) * CAP
    _compact(slots, tl.cumsum(win.to(tl.int32), axis=0), cnt, x, idx, 0.0, win, True, False)
    tl.store(ws_ptr.to(tl.pointer_type(tl.float32)) + pid, m2)
    tl.store(ws_ptr + 2 * BS + pid, tl.sum(cnt))


@triton.jit
def _topk_exact_kernel(x_ptr, ws_ptr, stride_b, stride_v, V, k, S, BS,
                       BLOCK: tl.constexpr, R: tl.constexpr, CAP: tl.constexpr):
    """1d as a launch of its own (``exact_apart``), one program per chunk, between stage 1 and the merge: the
    merge then carries none of the exact path's registers (its [G, R] tiles made the k = 1024 merge spill)."""
    pid = tl.program_id(0)
    if tl.load(ws_ptr + 2 * BS + pid) < 0:
        _chunk_exact(x_ptr, ws_ptr, stride_b, stride_v, V, k, BS, pid // S, pid, (pid % S) * BLOCK, BLOCK, R, CAP)


# --- stage 2: merge the S chunk states of a row -------------------------------------------------------------

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


@triton.jit
def _topk_merge_kernel(x_ptr, stride_b, stride_v, V, ws_ptr, out_ptr, val_ptr, ind_ptr, lse_ptr, k, S, BS, GS, NG,
                       BLOCK: tl.constexpr, R: tl.constexpr, CAP: tl.constexpr, SP: tl.constexpr,
                       CT: tl.constexpr, FAST: tl.constexpr, EXACT: tl.constexpr, OUT_STATE: tl.constexpr,
                       ROWB: tl.constexpr, W: tl.constexpr):
    """Program ``pid`` merges chunks ``[g·GS, g·GS + SC)`` of row ``pid // NG`` (g = pid % NG; S chunks per row in
    ``ws``). One level (NG = 1, GS = S): the row's answer. ``OUT_STATE`` (first level of the tree): the group's
    state ``(m, d, n, t, survivors)`` to ``out_ptr``, laid out as stage 1's, the second level's input.
    ``W < CAP``: stage 1 aimed at a rank below k; the first W slots of each chunk, checked (see below)."""
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
    m_ptr = ws_ptr.to(tl.pointer_type(tl.float32))
    n_ptr = ws_ptr + 2 * BS + base_s
    so = tl.arange(0, SP)
    smask = so < SC
    # 0. chunks stage 1 left to the exact path (n_c = -1), rare
    if EXACT:
        if tl.min(tl.load(n_ptr + so, mask=smask, other=0)) < 0:
            for c in range(SC):
                if tl.load(n_ptr + c, cache_modifier=".cg") < 0:
                    _chunk_exact(x_ptr, ws_ptr, stride_b, stride_v, V, k, BS, row, base_s + c, (c0 + c) * BLOCK,
                                 BLOCK, R, CAP)
            tl.debug_barrier()
    # 1. (m, d) = ⊕ over the S chunks, in base 2: m = max m_c, d = Σ d_c 2^(m_c − m)   (NaN in any chunk → NaN)
    mc = tl.load(m_ptr + base_s + so, mask=smask, other=float("-inf"), cache_modifier=".cg")
    dc = tl.load(m_ptr + BS + base_s + so, mask=smask, other=0.0)
    has_nan = tl.sum((mc != mc).to(tl.int32)) > 0
    m = tl.max(tl.where(mc != mc, float("-inf"), mc))
    m = tl.where(has_nan, float("nan"), m)
    d = tl.sum(tl.where(smask, dc * tl.where(mc == m, 1.0, tl.exp2(mc - m)), 0.0))
    if not OUT_STATE:
        tl.store(lse_ptr + row, (m + tl.log2(d)) * LN2)
    # 2. the row's k-th key is >= lo = max_c t_c: chunk c holds k elements >= t_c. (t_c is a lower bound for
    # chunk c's k-th key whichever path it took; every real key is >= the key of -inf. With W < CAP, t_c bounds
    # a smaller rank and the claim is checked before it is used, below.)
    tc = tl.load(ws_ptr + 3 * BS + base_s + so, mask=smask, other=INT32_MIN)
    lo = tl.maximum(tl.max(tc), NEG_INF_KEY)
    if ROWB:
        # chunk c holds an element >= its maximum m_c, so k chunks (k <= SC) hold k elements >= the k-th largest
        # maximum: lo >= it too. m_c is known as mc = fl(m_c·log2 e), so mc·ln 2 is within 4 ulps of it: take a
        # lower bound (1e-6 relative, and the smallest normal for zero / denormal maxima under flush-to-zero).
        # A NaN chunk's mc is NaN (its exact path ran above): NaN ranks highest and the chunk holds one.
        v = mc * LN2
        lb = tl.where(v == float("inf"), v, v - tl.abs(v) * 1e-6 - 1.1754944e-38)
        uk = tl.where(smask, _key_of(lb), INT32_MIN)
        n_ge = tl.sum((uk[None, :] >= uk[:, None]).to(tl.int32), axis=1)      # #{u_j >= u_i}
        lo = tl.maximum(lo, tl.max(tl.where(n_ge >= k, uk, INT32_MIN)))
    # the candidate slots of the row (CAP per chunk, chunk c holds n_c): int64 = value bits | index << 32
    slots = (ws_ptr + 4 * BS).to(tl.pointer_type(tl.int64))
    cand_ptr = (slots + base_s.to(tl.int64) * CAP).to(tl.pointer_type(tl.int32))
    BP = tl.num_programs(0)
    if OUT_STATE:
        buf = (out_ptr + 4 * BP).to(tl.pointer_type(tl.int64)) + pid.to(tl.int64) * CAP
    else:
        buf = slots + BS.to(tl.int64) * CAP + row.to(tl.int64) * CAP
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
            for c in range(SC):
                if tl.load(ws_ptr + 3 * BS + base_s + c) > kh:
                    _chunk_exact(x_ptr, ws_ptr, stride_b, stride_v, V, k, BS, row, base_s + c, (c0 + c) * BLOCK,
                                 BLOCK, R, CAP)
            tl.debug_barrier()
            keys1 = _slot_tile(cand_ptr, n_ptr, SC, 0, CT, CAP, CAP)[0]
            n, t = _select_into(keys1, cand_ptr, n_ptr, SC, tl.maximum(kh, NEG_INF_KEY), k, buf, OUT_STATE,
                                NT, CT, CAP, CAP)
    else:
        keys0 = _slot_tile(cand_ptr, n_ptr, SC, 0, CT, CAP, CAP)[0]
        n, t = _select_into(keys0, cand_ptr, n_ptr, SC, lo, k, buf, OUT_STATE, NT, CT, CAP, CAP)
    if OUT_STATE:
        out_f = out_ptr.to(tl.pointer_type(tl.float32))
        tl.store(out_f + pid, m)
        tl.store(out_f + BP + pid, d)
        tl.store(out_ptr + 2 * BP + pid, n)
        tl.store(out_ptr + 3 * BP + pid, t)
    else:
        _finish(buf, n, m, d, val_ptr, ind_ptr, row, k, CAP, FAST)


@triton.jit
def _finish(buf, n, m, d, val_ptr, ind_ptr, row, k, CAP: tl.constexpr, FAST: tl.constexpr):
    """The ``n <= CAP`` survivors in ``buf`` sorted; the first k as probabilities and indices."""
    tl.debug_barrier()
    j = tl.arange(0, CAP)
    packed = tl.load(buf + j, mask=j < n, other=-9223372036854775808, cache_modifier=".cg")
    packed = tl.sort(packed, descending=True)
    key = (packed >> 32).to(tl.int32)
    ind = 0x7FFFFFFF - (packed & 0xFFFFFFFF).to(tl.int32)
    # 5. p = e^(x − m) / d = 2^(x·log2(e) − m2) / d; NaN where torch.softmax gives NaN for the whole row
    # (m = ±inf, or NaN)
    p = tl.exp2(_log2_rel(_value_of(key), m, FAST)) / d
    p = tl.where((m == float("inf")) | (m == float("-inf")), float("nan"), p)
    out = row.to(tl.int64) * k + j
    tl.store(val_ptr + out, p, mask=j < k)
    tl.store(ind_ptr + out, ind.to(tl.int64), mask=j < k)


# --- launcher -----------------------------------------------------------------------------------------------

def workspace_words(B: int, cfg: TopKConfig, splits: int | None = None) -> int:
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


@functools.lru_cache(maxsize=4096)
def plan(B: int, V: int, k: int, dtype: torch.dtype) -> TopKConfig:
    """:func:`select_path`, cached per problem."""
    return select_path(B, V, k, esize=torch.finfo(dtype).bits // 8)


@functools.lru_cache(maxsize=4096)
def _launches(cfg: TopKConfig, B: int, V: int, k: int, stride_b: int, stride_v: int, fast: bool) -> tuple:
    """The launches of ``cfg`` for one problem, bound once (``BoundKernel``: no per-call argument binding):
    ``(kernel, args)`` pairs, ``args(x, ws, ws2, out)`` giving the run-time arguments. Stage 1 first."""
    S = cfg.splits
    BS = B * S
    blk = dict(BLOCK=cfg.block, R=cfg.cols, CAP=cfg.cap)
    opt = dict(maxnreg=cfg.maxnreg) if cfg.maxnreg and fast else {}
    head = (stride_b, stride_v, V)
    out = [(BoundKernel(_topk_chunk_kernel, (BS,), dict(blk, FAST=fast, RADIX=cfg.radix, PEEL=cfg.peel,
                                                         num_warps=cfg.num_warps, **opt)),
            lambda x, ws, ws2, o: (x, ws, *head, cfg.kb or k, S, BS))]
    if cfg.exact_apart:
        out.append((BoundKernel(_topk_exact_kernel, (BS,), dict(blk, num_warps=cfg.num_warps)),
                    lambda x, ws, ws2, o: (x, ws, *head, k, S, BS)))
    merge = dict(blk, FAST=fast, ROWB=cfg.row_bound)
    exact = not cfg.exact_apart
    S2 = S
    if cfg.tree:
        ng = triton.cdiv(S, cfg.tree)
        sp = _pow2(cfg.tree)
        out.append((BoundKernel(_topk_merge_kernel, (B * ng,), dict(merge, SP=sp, CT=sp, EXACT=exact, OUT_STATE=True,
                                                                    W=cfg.cap, num_warps=cfg.tree_warps)),
                    lambda x, ws, ws2, o: (x, *head, ws, ws2, *o, k, S, BS, cfg.tree, ng)))
        S2, exact = ng, False
    sp = _pow2(S2)
    final = BoundKernel(_topk_merge_kernel, (B,), dict(merge, SP=sp, CT=max(1, min(sp, MERGE_TILE // cfg.cap)),
                                                       EXACT=exact, OUT_STATE=False, W=cfg.width or cfg.cap,
                                                       num_warps=cfg.merge_warps))
    out.append((final, lambda x, ws, ws2, o: (x, *head, *(2 * (ws2 if cfg.tree else ws,)), *o, k, S2, B * S2, S2, 1)))
    return tuple(out)


def _run(x: torch.Tensor, launches, ws, ws2, out):
    for kernel, args in launches:
        kernel(args(x, ws, ws2, out), (x,), x.device)


def stage1(x: torch.Tensor, ws: torch.Tensor, k: int, cfg: TopKConfig, fast: bool):
    """Launch stage 1 for ``x`` ``[B, V]`` into the workspace ``ws`` (also timed alone by the benchmarks)."""
    B, V = x.shape
    _run(x, _launches(cfg, B, V, k, x.stride(0), x.stride(1), fast)[:1], ws, None, None)


def merge(x: torch.Tensor, ws: torch.Tensor, ws2: torch.Tensor, out: tuple, k: int, cfg: TopKConfig, fast: bool):
    """The launches after stage 1 (the exact path apart, the merge or its two levels) into ``out`` = (values,
    indices, lse); also timed alone by the benchmarks."""
    B, V = x.shape
    _run(x, _launches(cfg, B, V, k, x.stride(0), x.stride(1), fast)[1:], ws, ws2, out)


def softmax_topk_2d(x: torch.Tensor, k: int, cfg: TopKConfig | None = None):
    """``x``: ``[B, V]``, any strides, fp32/fp16/bf16 -> fp32 values ``[B, k]``, int64 indices, fp32 lse.

    Launches: stage 1 (B·S programs); with ``exact_apart`` the chunks' exact paths (B·S, most return at once);
    the merge (B programs), or with ``tree`` two levels: B·NG programs of ``tree`` chunks each, then B over the
    NG group states."""
    B, V = x.shape
    cfg = cfg or plan(B, V, k, x.dtype)
    if cfg.path == "sort":
        raise ValueError("softmax_topk_2d: the sort path is not a kernel; the op runs it")
    dev = x.device
    values = torch.empty((B, k), device=dev, dtype=torch.float32)
    indices = torch.empty((B, k), device=dev, dtype=torch.int64)
    lse = torch.empty((B,), device=dev, dtype=torch.float32)
    if B == 0:
        return values, indices, lse
    ws, ws2 = workspaces(B, cfg, dev)
    fast = dev.type == "cuda" and not interpret_mode()
    _run(x, _launches(cfg, B, V, k, x.stride(0), x.stride(1), fast), ws, ws2, (values, indices, lse))
    return values, indices, lse


def workspaces(B: int, cfg: TopKConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1's scratch and the tree's first-level scratch for ``cfg`` (cached per device and stream)."""
    ng = triton.cdiv(cfg.splits, cfg.tree) if cfg.tree else 1
    return _workspace(device, workspace_words(B, cfg), workspace_words(B, cfg, ng) if cfg.tree else 0)
