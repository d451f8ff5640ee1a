"""Fused softmax + top-k in Triton: one read of x, no V-sized output (paper §4, arXiv 1805.02867).

The paper keeps, per row, the online normalizer ``(m, d)`` and a sorted list of the K best logits, updated
by one bubble-insertion per element. That is 1 memory access per element but O(K) work per element, and one
thread per row. Here a row is split into chunks of ``BLOCK`` elements, one program each, and every chunk's
state is ``(m, d, its own top-k)``; the states merge exactly as the ``(m, d)`` of ``state.py`` do, with
top-k ⊕ top-k = top-k of the union. Selection is by *threshold* rather than by sorting:

1. Keys. A float maps to an int32 whose signed order is the float order (``bits ^ ((bits >> 31) &
   0x7FFFFFFF)``; ``-0.0`` → ``+0.0``; every NaN → one key above ``+inf``, as ``torch.topk`` ranks NaN
   highest). Ties are broken by the lower index, which is the order elements are kept in throughout, so no
   index is ever compared.
2. k-th key by bisection. ``t`` = the largest key with ``#{key >= t} >= k``, built bit by bit from the top:
   32 count-reductions over the tile, O(32·n) compares, independent of k. Then the winners are every key ``>
   t`` and the first ``k - #{key > t}`` keys ``== t`` (a prefix count), compacted in index order by a prefix
   sum.
3. Group filter (path ``grouped``). A chunk is an ``[R, G]`` tile of R contiguous groups. The chunk's top-k
   lies inside the k groups with the largest maxima (a group outside them has k groups above it, each
   holding one larger element), so step 2 runs first on the R group maxima, the k chosen groups (k·G
   elements) are written to an on-chip-sized scratch slot, and step 2 runs again on those: 32·(R + k·G)
   compares instead of 32·BLOCK. With few elements per k (``BLOCK < GROUP_MIN_RATIO · KP``) the filter
   cannot shrink anything (path ``direct``).
4. Merge (stage 2, one program per row). ``m = max m_c``, ``d = Σ d_c e^(m_c − m)`` (paper eq. 4), then step
   2 on the ``S·k`` chunk winners, then a sort of only the k final keys; ``p = e^(x − m) / d``, ``lse = m +
   log d``.

Memory traffic per row, V elements of b bytes: read V·b once (stage 1); write / read back S·k·8 bytes of chunk
winners (stage 1 → 2) and, on the grouped path, k·G·8 bytes per chunk of scratch; write k·(4 + 8) + 4.
The unfused ``softmax → topk`` moves V·(b + 4 + 4 + …) bytes: read x, write p, and topk reads p (5 accesses).

Dispatch (:func:`select_path`) picks ``BLOCK`` so that ``B · S`` programs fill the GPU, the group size ``G``,
and falls back to a full sort when ``k`` is beyond ``MAX_FUSED_K`` (k = N on a long row, say).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# --- dispatch thresholds (see select_path) ------------------------------------------------------------------
MAX_FUSED_K = 2048                  # k above this (after rounding up to a power of two) takes the sort path
MIN_KP = 16                         # candidate lists are at least this long (tl.sort / tl.arange sizes)
MIN_BLOCK = 1024                    # smallest chunk a program handles
MAX_BLOCK = 16384                   # largest chunk held in registers by one program
GROW_MAX_BLOCK = 8192               # chunks grow past this only when the merge needs fewer of them
TARGET_PROGRAMS = 1024              # enough programs to fill 132 SMs several times over (B · S)
STAGE2_MAX_CANDIDATES = 32768       # S_pow2 · CAP slots read by the one merge program of a row
FILTER_MAX_KP = 128                 # the threshold filter (path "filter") for k up to this
FILTER_GROUP = 4                    # the filter keeps whole groups of 4 contiguous elements (one 16-byte load)
FILTER_CAP_FACTOR = 8               # up to 8·KP groups kept per chunk (mean ≈ 1.1·KP·ln KP); more: exact k
GROUP_MIN_RATIO = 16                # group filter only when BLOCK >= GROUP_MIN_RATIO · KP
MAX_GROUP = 16                      # largest group (elements of x per group maximum)
MERGE_MIN_CAP = 2048                # the merge's survivor buffer: max(MERGE_MIN_CAP, 4·KP) slots
MERGE_TILE = 4096                   # slots the merge reads per step

INT32_MIN = tl.constexpr(-2147483648)    # padding key: below every real key (-inf is 0x807FFFFF)
NAN_KEY = tl.constexpr(0x7FC00000)       # canonical NaN key: above +inf (0x7F800000)
PATHS = ("filter", "grouped", "direct", "sort")


@dataclass(frozen=True)
class TopKConfig:
    path: str           # "filter" | "grouped" | "direct" | "sort"
    block: int = 0      # elements per stage-1 program
    group: int = 1      # G: elements per group maximum (grouped path)
    kp: int = 0         # k rounded up to a power of two (>= MIN_KP)
    cap: int = 0        # candidate slots per chunk (KP, or FILTER_CAP_FACTOR·KP on the filter path)
    splits: int = 0     # S: programs per row in stage 1
    num_warps: int = 8
    merge_warps: int = 8
    cap2: int = 0       # survivor slots of the merge


def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def _fits(V: int, block: int, cap: int) -> bool:
    return _pow2(triton.cdiv(V, block)) * cap <= STAGE2_MAX_CANDIDATES


def select_path(B: int, V: int, k: int, *, path: str | None = None, block: int | None = None,
                group: int | None = None, num_warps: int | None = None) -> TopKConfig:
    """The kernel configuration ``softmax_topk`` runs for a ``[B, V]`` input and ``k``.

    ``path`` / ``block`` / ``group`` / ``num_warps`` override the choice (tests and the variant timer use them).
    """
    if path is not None and path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    kp = max(MIN_KP, _pow2(k))
    if kp > MAX_FUSED_K or path == "sort":
        return TopKConfig("sort", kp=kp)
    lo = max(min(MIN_BLOCK, _pow2(V)), kp)          # chunks no longer than the row needs

    def smallest_block(cap_of, lo=lo):
        b = lo
        while b < MAX_BLOCK and not _fits(V, b, cap_of(b)):
            b *= 2
        return b if _fits(V, b, cap_of(b)) else None

    def filter_cap(b):
        return min(b, FILTER_CAP_FACTOR * kp * FILTER_GROUP)

    if path is None:
        if kp <= FILTER_MAX_KP and smallest_block(filter_cap, max(lo, FILTER_GROUP * kp)) is not None:
            path = "filter"
        else:
            path = "auto"                               # grouped or direct, once the chunk size is known
    if path == "filter":
        cap_of, lo = filter_cap, max(lo, FILTER_GROUP * kp)
    else:
        cap_of = lambda b: kp  # noqa: E731
    b_min = smallest_block(cap_of, lo)
    if b_min is None:
        return TopKConfig("sort", kp=kp)
    if block is None:
        # largest chunk that still gives TARGET_PROGRAMS programs
        block = b_min
        grow_max = MAX_BLOCK if kp >= 1024 else GROW_MAX_BLOCK   # measured: k = 1024 is best at 16384 / G = 4
        while block < grow_max and block < _pow2(V) and B * triton.cdiv(V, block * 2) >= TARGET_PROGRAMS:
            block *= 2
    if path in ("direct", "grouped", "auto"):
        ratio = block // kp
        if path == "direct" or (path == "auto" and group is None and ratio < GROUP_MIN_RATIO):
            group = 1
        elif group is None:
            group = max(2, min(MAX_GROUP, 1 << (int(math.log2(max(ratio, 1))) // 2)))
        if group > 1 and block // group < kp:
            group = 1                                  # fewer groups than k: nothing to filter
        path = "grouped" if group > 1 else "direct"
    else:
        group = FILTER_GROUP
    cap = cap_of(block)
    splits = triton.cdiv(V, block)
    if num_warps is None:
        num_warps = 4 if block <= 2048 else (16 if block >= 16384 and path == "filter" else 8)
    slots = _pow2(splits) * cap
    cap2 = min(slots, max(MERGE_MIN_CAP, 4 * kp))       # survivors come in groups of 4 slots
    merge_warps = 4 if min(slots, max(cap2, MERGE_TILE)) <= 2048 else 8
    return TopKConfig(path, block, group, kp, cap, splits, num_warps, merge_warps, cap2)


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
def _kth_key(keys, k):
    """Largest t with #{keys >= t} >= k: the k-th largest key. Padding is INT32_MIN and never counts."""
    t = tl.full([], INT32_MIN, tl.int64)
    one = tl.full([], 1, tl.int64)
    for i in range(32):
        cand = t + (one << (31 - i))
        c = tl.sum((keys >= cand.to(tl.int32)).to(tl.int32))
        t = tl.where(c >= k, cand, t)
    return t.to(tl.int32)


@triton.jit
def _winners(keys, k, t):
    """The k keys ranked first when ties at t go to the lower position: all > t, then the first ties."""
    gt = keys > t
    eq = keys == t
    need = k - tl.sum(gt.to(tl.int32))
    if tl.sum(eq.to(tl.int32)) > need:      # more ties than places: the lower positions (a prefix count)
        win = gt | (eq & (tl.cumsum(eq.to(tl.int32), 0) <= need))
    else:
        win = gt | eq
    return win


# --- stage 1: per-chunk (m, d) and top-k candidates ---------------------------------------------------------

@triton.jit
def _topk_chunk_kernel(x_ptr, stride_b, stride_v, V, k, S,
                       m_ptr, d_ptr, t_ptr, n_ptr, ck_ptr, ci_ptr, sk_ptr, si_ptr,
                       KP: tl.constexpr, BLOCK: tl.constexpr, G: tl.constexpr, CAP: tl.constexpr,
                       FILTER: tl.constexpr):
    pid = tl.program_id(0)
    row = pid // S
    s = pid % S
    start = s * BLOCK
    x_row = x_ptr + row.to(tl.int64) * stride_b
    out = pid.to(tl.int64) * CAP                      # this chunk's CAP candidate slots
    if G == 1:
        idx = start + tl.arange(0, BLOCK)
    else:                                             # [R, G]: R groups of G contiguous elements
        R: tl.constexpr = BLOCK // G
        idx = start + tl.arange(0, R)[:, None] * G + tl.arange(0, G)[None, :]
    mask = idx < V
    # read BLOCK elements of x: the only pass over x
    x = tl.load(x_row + idx.to(tl.int64) * stride_v, mask=mask, other=float("-inf")).to(tl.float32)
    keys = tl.where(mask, _key_of(x), INT32_MIN)
    # 1. chunk state: m = max x (NaN-aware through the keys), d = Σ e^(x − m) (padding is -inf: e^-inf = 0).
    # For m = ±inf, d is taken relative to 0: (-inf, 0) is ⊕'s identity, (+inf, d) gives lse = +inf.
    m = _value_of(tl.max(keys))
    m_ref = tl.where((m == float("inf")) | (m == float("-inf")), 0.0, m)
    d = tl.sum(tl.exp(x - m_ref))
    tl.store(m_ptr + pid, m)
    tl.store(d_ptr + pid, d)
    if FILTER:
        # 3'. on group maxima: t0 = min over KP strided columns of groups of the column max. KP >= k
        # disjoint sets hold an element >= t0, so t0 <= the chunk's k-th key: every element of the chunk's
        # top-k sits in a group whose max is >= t0 (≈ 1.1·KP·ln KP groups for random data). Those groups
        # are copied whole: a prefix sum over R groups, not over BLOCK elements.
        gmax = tl.max(keys, axis=1)
        t = tl.min(tl.max(tl.reshape(gmax, [BLOCK // G // KP, KP]), axis=0))
        gwin = (gmax >= t) & (gmax != INT32_MIN)
        ng = tl.sum(gwin.to(tl.int32))
        if ng > CAP // G:       # rare (adversarial orders, long runs of ties): the k groups of largest max
            t = _kth_key(gmax, k)
            gwin = _winners(gmax, k, t) & (gmax != INT32_MIN)
            ng = tl.sum(gwin.to(tl.int32))
        gpos = tl.cumsum(gwin.to(tl.int32), 0) - 1
        spos = gpos[:, None] * G + tl.arange(0, G)[None, :]
        smask = gwin[:, None] & (spos >= 0)
        tl.store(ck_ptr + out + spos, keys, mask=smask)
        tl.store(ci_ptr + out + spos, idx, mask=smask)
        n = ng * G
    elif G == 1:
        # 2. exact top-k of the chunk
        t = _kth_key(keys, k)
        win = _winners(keys, k, t) & mask
        n = tl.sum(win.to(tl.int32))
        pos = tl.cumsum(win.to(tl.int32), 0) - 1       # compaction in index order
        tl.store(ck_ptr + out + pos, keys, mask=win)
        tl.store(ci_ptr + out + pos, idx, mask=win)
    else:
        # 3. the k groups with the largest maxima hold the chunk's top-k; copy them (k·G elements) to scratch
        gmax = tl.max(keys, axis=1)
        gwin = _winners(gmax, k, _kth_key(gmax, k))
        grank = tl.cumsum(gwin.to(tl.int32), 0) - 1
        n_groups = tl.sum(gwin.to(tl.int32))
        spos = grank[:, None] * G + tl.arange(0, G)[None, :]
        scratch = pid.to(tl.int64) * (KP * G)
        smask = gwin[:, None] & (spos >= 0)
        tl.store(sk_ptr + scratch + spos, keys, mask=smask)
        tl.store(si_ptr + scratch + spos, idx, mask=smask)
        tl.debug_barrier()
        o = tl.arange(0, KP * G)
        live = o < n_groups * G
        ckeys = tl.load(sk_ptr + scratch + o, mask=live, other=INT32_MIN, cache_modifier=".cg")
        cidx = tl.load(si_ptr + scratch + o, mask=live, other=0, cache_modifier=".cg")
        # 2. on the k·G candidates (still in index order)
        t = _kth_key(ckeys, k)
        win = _winners(ckeys, k, t) & (ckeys != INT32_MIN)
        n = tl.sum(win.to(tl.int32))
        pos = tl.cumsum(win.to(tl.int32), 0) - 1
        tl.store(ck_ptr + out + pos, ckeys, mask=win)
        tl.store(ci_ptr + out + pos, cidx, mask=win)
    tl.store(t_ptr + pid, t)        # a lower bound of the chunk's k-th key, so of the row's
    tl.store(n_ptr + pid, n)


# --- stage 2: merge the S chunk states of a row -------------------------------------------------------------

@triton.jit
def _topk_merge_kernel(m_ptr, d_ptr, t_ptr, n_ptr, ck_ptr, ci_ptr, sk_ptr, si_ptr, fk_ptr, fi_ptr,
                       val_ptr, ind_ptr, lse_ptr, k, S, stride_vb, stride_ib,
                       KP: tl.constexpr, SP: tl.constexpr, CAP: tl.constexpr, CAP2: tl.constexpr,
                       TILE: tl.constexpr):
    row = tl.program_id(0)
    # 4. (m, d) = ⊕ over the S chunks: m = max m_c, d = Σ d_c e^(m_c − m)   (NaN in any chunk → NaN)
    so = tl.arange(0, SP)
    smask = so < S
    base_s = row.to(tl.int64) * S
    mc = tl.load(m_ptr + base_s + so, mask=smask, other=float("-inf"))
    dc = tl.load(d_ptr + base_s + so, mask=smask, other=0.0)
    has_nan = tl.sum((mc != mc).to(tl.int32)) > 0
    m = tl.max(tl.where(mc != mc, float("-inf"), mc))
    m = tl.where(has_nan, float("nan"), m)
    d = tl.sum(tl.where(smask, dc * tl.where(mc == m, 1.0, tl.exp(mc - m)), 0.0))
    lse = m + tl.log(d)
    tl.store(lse_ptr + row, lse)
    # every chunk's bound t_c is <= the row's k-th key: candidates below max_c t_c cannot win.
    # Pass over the S·CAP slots, TILE at a time in groups of 4 slots (chunk order, then index order = index
    # order), copying the groups that hold a survivor to CAP2 slots (a prefix sum over groups).
    t_row = tl.max(tl.load(t_ptr + base_s + so, mask=smask, other=INT32_MIN))
    fbase = row.to(tl.int64) * KP
    sbase = row.to(tl.int64) * CAP2
    c_base = ck_ptr + base_s * CAP
    i_base = ci_ptr + base_s * CAP
    o = tl.arange(0, TILE // 4)[:, None] * 4 + tl.arange(0, 4)[None, :]
    off = 0
    for t0 in range(0, S * CAP, TILE):
        slot = t0 + o
        c = slot // CAP
        live = (c < S) & (slot % CAP < tl.load(n_ptr + base_s + c, mask=c < S, other=0))
        keys = tl.load(c_base + slot, mask=live, other=INT32_MIN)
        gsurv = tl.max((live & (keys >= t_row)).to(tl.int32), axis=1) > 0
        spos = off + (tl.cumsum(gsurv.to(tl.int32), 0) - 1)[:, None] * 4 + tl.arange(0, 4)[None, :]
        gmask = gsurv[:, None] & (spos < CAP2)
        tl.store(sk_ptr + sbase + spos, keys, mask=gmask)
        tl.store(si_ptr + sbase + spos, tl.load(i_base + slot, mask=gmask & live, other=0), mask=gmask)
        off += tl.sum(gsurv.to(tl.int32)) * 4
    tl.debug_barrier()
    if off <= CAP2:
        # 2. on the CAP2 survivor slots
        o2 = tl.arange(0, CAP2)
        l2 = o2 < off
        k2 = tl.load(sk_ptr + sbase + o2, mask=l2, other=INT32_MIN, cache_modifier=".cg")
        w2 = _winners(k2, k, _kth_key(k2, k))
        p2 = tl.cumsum(w2.to(tl.int32), 0) - 1
        tl.store(fk_ptr + fbase + p2, k2, mask=w2)
        tl.store(fi_ptr + fbase + p2, tl.load(si_ptr + sbase + o2, mask=w2, other=0, cache_modifier=".cg"),
                 mask=w2)
    else:
        # rare (long runs of ties above the bound): 2. over all S·CAP slots, TILE at a time
        o1 = tl.arange(0, TILE)
        kt = tl.full([], INT32_MIN, tl.int64)
        one = tl.full([], 1, tl.int64)
        for i in range(32):
            cand = (kt + (one << (31 - i))).to(tl.int32)
            cnt = 0
            for t0 in range(0, S * CAP, TILE):
                slot = t0 + o1
                c1 = slot // CAP
                live1 = (c1 < S) & (slot % CAP < tl.load(n_ptr + base_s + c1, mask=c1 < S, other=0))
                keys1 = tl.load(c_base + slot, mask=live1, other=INT32_MIN)
                cnt += tl.sum((keys1 >= cand).to(tl.int32))
            kt = tl.where(cnt >= k, kt + (one << (31 - i)), kt)
        tk = kt.to(tl.int32)
        n_gt = 0
        for t0 in range(0, S * CAP, TILE):
            slot = t0 + o1
            c1 = slot // CAP
            live1 = (c1 < S) & (slot % CAP < tl.load(n_ptr + base_s + c1, mask=c1 < S, other=0))
            n_gt += tl.sum((tl.load(c_base + slot, mask=live1, other=INT32_MIN) > tk).to(tl.int32))
        need = k - n_gt
        done = 0
        filled = 0
        for t0 in range(0, S * CAP, TILE):
            slot = t0 + o1
            c1 = slot // CAP
            live1 = (c1 < S) & (slot % CAP < tl.load(n_ptr + base_s + c1, mask=c1 < S, other=0))
            keys1 = tl.load(c_base + slot, mask=live1, other=INT32_MIN)
            eq = keys1 == tk
            w1 = (keys1 > tk) | (eq & (done + tl.cumsum(eq.to(tl.int32), 0) <= need))
            p1 = filled + tl.cumsum(w1.to(tl.int32), 0) - 1
            tl.store(fk_ptr + fbase + p1, keys1, mask=w1)
            tl.store(fi_ptr + fbase + p1, tl.load(i_base + slot, mask=w1, other=0), mask=w1)
            filled += tl.sum(w1.to(tl.int32))
            done += tl.sum(eq.to(tl.int32))
    tl.debug_barrier()
    # sort only the k winners: descending key, then ascending index
    jo = tl.arange(0, KP)
    jl = jo < k
    fk = tl.load(fk_ptr + fbase + jo, mask=jl, other=INT32_MIN, cache_modifier=".cg")
    fi = tl.load(fi_ptr + fbase + jo, mask=jl, other=0x7FFFFFFF, cache_modifier=".cg")
    packed = (fk.to(tl.int64) << 32) | (0x7FFFFFFF - fi).to(tl.int64)
    packed = tl.sort(packed, descending=True)
    key = (packed >> 32).to(tl.int32)
    ind = 0x7FFFFFFF - (packed & 0xFFFFFFFF).to(tl.int32)
    # p = e^(x − m) / d; NaN where torch.softmax gives NaN for the whole row (m = ±inf, or NaN)
    p = tl.exp(_value_of(key) - m) / d
    p = tl.where((m == float("inf")) | (m == float("-inf")), float("nan"), p)
    tl.store(val_ptr + row.to(tl.int64) * stride_vb + jo, p, mask=jl)
    tl.store(ind_ptr + row.to(tl.int64) * stride_ib + jo, ind.to(tl.int64), mask=jl)


# --- launcher -----------------------------------------------------------------------------------------------

def softmax_topk_2d(x: torch.Tensor, k: int, cfg: TopKConfig | None = None):
    """``x``: ``[B, V]``, any strides, fp32/fp16/bf16 -> fp32 values ``[B, k]``, int64 indices, fp32 lse."""
    B, V = x.shape
    cfg = cfg or select_path(B, V, k)
    if cfg.path == "sort":
        raise ValueError("softmax_topk_2d: the sort path is not a kernel; the op runs it")
    dev = x.device
    S, KP, G, CAP = cfg.splits, cfg.kp, cfg.group, cfg.cap
    values = torch.empty(B, k, device=dev, dtype=torch.float32)
    indices = torch.empty(B, k, device=dev, dtype=torch.int64)
    lse = torch.empty(B, device=dev, dtype=torch.float32)
    if B == 0:
        return values, indices, lse
    i32 = dict(device=dev, dtype=torch.int32)
    m_c = torch.empty(B * S, device=dev, dtype=torch.float32)
    d_c = torch.empty(B * S, device=dev, dtype=torch.float32)
    t_c = torch.empty(B * S, **i32)
    n_c = torch.empty(B * S, **i32)
    ck = torch.empty(B * S * CAP, **i32)
    ci = torch.empty(B * S * CAP, **i32)
    sk = torch.empty(B * S * KP * G if G > 1 else 1, **i32)     # grouped path: k·G candidates per chunk
    si = torch.empty_like(sk)
    s2k = torch.empty(B * cfg.cap2, **i32)                        # merge: survivors of the row bound
    s2i = torch.empty_like(s2k)
    fk = torch.empty(B * KP, **i32)
    fi = torch.empty(B * KP, **i32)
    _topk_chunk_kernel[(B * S,)](x, x.stride(0), x.stride(1), V, k, S, m_c, d_c, t_c, n_c, ck, ci, sk, si,
                                 KP=KP, BLOCK=cfg.block, G=G, CAP=CAP, FILTER=cfg.path == "filter",
                                 num_warps=cfg.num_warps)
    _topk_merge_kernel[(B,)](m_c, d_c, t_c, n_c, ck, ci, s2k, s2i, fk, fi, values, indices, lse, k, S,
                             values.stride(0), indices.stride(0), KP=KP, SP=_pow2(S), CAP=CAP, CAP2=cfg.cap2,
                             TILE=min(MERGE_TILE, _pow2(S) * CAP), num_warps=cfg.merge_warps)
    return values, indices, lse
