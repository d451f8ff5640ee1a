"""Split-KV decoding attention: one program per (batch b, kv head, row block, split), all the query heads of the
GQA group and all Sq query rows at once, so K and V are read once per kv head.

Notation (paper notes §7): per query row the running state is (m, d, o): m the largest score so far, d = Σ e^(s − m),
o = Σ e^(s − m)·v (unnormalised). A key tile moves it to m' = max(m, max s), d' = d·α + Σ p, o' = o·α + p·V with
α = e^(m − m'), p = e^(s − m'). A split ends with the partial state (o/d, lse = m + log d) that ``merge.py`` ⊕-merges.

Memory traffic: K and V of the split's key range, once (BLOCK_N keys × D per tile each); q (G·Sq rows × D) once
per program; out: G·Sq partial rows of D fp32 and one fp32 lse each per split.

The rows of a program are r = g·Sq + i (query head hkv·G + g, query i), padded to BLOCK_M >= 16 for tl.dot.
Key j of sequence b: dense at k[b, hkv, j], paged at k[block_table[b, j // PAGE], hkv, j % PAGE]. Only keys
j < cache_seqlens[b] are loaded (masked loads: the slots past it, and their pages, are never touched, NaN or not).

Variants (constexprs, chosen by the plan's knobs):
- AHEAD (paged): the page numbers of tile t + 1 are read while tile t streams, and K is read as rows [BLOCK_N, D]
  (one gather of page numbers serves K and V). Reading them in the same iteration makes K and V loads depend on a
  load of that iteration, and Triton's pipeliner then keeps one K/V buffer whatever NUM_STAGES asks; read one
  iteration ahead they depend on a loop-carried value and get NUM_STAGES − 1 buffers, as dense tiles do.
- AHEAD = 3 (paged, pages of a multiple or a divisor of BLOCK_N keys, tiles starting at multiples of BLOCK_N): one
  page number per page, read one tile ahead as AHEAD = 2 does. A page of >= BLOCK_N keys holds the whole tile: one
  table entry per tile, the tile addressed as a dense tile is (one scalar base plus row offsets). Smaller pages:
  BLOCK_N / PAGE entries per tile, row r at its page's base plus a loop-invariant offset (slot r % PAGE, column;
  int32: within one page), where AHEAD = 2 rebuilds every row's slot and table index per tile (sm_90, 64-key
  tiles over 4 warps: 423 instructions per tile and warp against 627; dense 128-key tiles over 8 warps: 446).
- BOUND: the splits cut [0, S_MAX) into equal chunks (not [lo, hi) of this sequence): with lengths that vary in a
  batch every program streams at most one chunk, and a program whose chunk starts past the sequence's keys
  stores lse = −inf and exits (the merge never reads its o).

``balanced_kv_kernel`` (the ``balanced`` knob) schedules the same tile loop (``_attend``) differently: equal
ranges of all sequences' tiles per program, whatever the lengths (its docstring).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..._triton.online import _alpha, _exp, _lse, _shift


@triton.jit
def _key_offsets(BT, b, n0, offs_n, n_ok, stride_btb, stride_page, stride_s, PAGED: tl.constexpr,
                 PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    """int64 offsets of keys offs_n = n0 + [0, BLOCK_N) of sequence b in a cache (the kv head's base added by the
    caller). A tile within one page (PAGE a multiple of BLOCK_N) reads one page number, not one per key."""
    if PAGED and PAGE % BLOCK_N == 0:
        page = tl.load(BT + b.to(tl.int64) * stride_btb + n0 // PAGE)
        return page.to(tl.int64) * stride_page + (offs_n % PAGE).to(tl.int64) * stride_s
    elif PAGED:
        page = tl.load(BT + b.to(tl.int64) * stride_btb + offs_n // PAGE, mask=n_ok, other=0)
        return page.to(tl.int64) * stride_page + (offs_n % PAGE).to(tl.int64) * stride_s
    return offs_n.to(tl.int64) * stride_s


@triton.jit
def _load_pages(ptrs, FAST: tl.constexpr):
    """int64 block-table entries at ``ptrs``. FAST: an ld.global.nc the pipeliner does not see as a load, so the
    K / V loads it addresses are pipelined as dense ones are."""
    if FAST:
        page = tl.inline_asm_elementwise("ld.global.nc.b32 $0, [$1];", "=r,l", [ptrs], dtype=tl.int32,
                                         is_pure=True, pack=1)
    else:
        page = tl.load(ptrs)
    return page.to(tl.int64)


@triton.jit
def _page_numbers(BT, b, offs_n, end, stride_btb, PAGE: tl.constexpr, FAST: tl.constexpr):
    """int64 page number of each key offs_n of sequence b, keys past end clamped to the last one (< end, so
    always a table entry in use; their loads are masked off); FAST as :func:`_load_pages`."""
    idx = tl.maximum(tl.minimum(offs_n, end - 1), 0) // PAGE
    ptrs = BT + b.to(tl.int64) * stride_btb + idx
    return _load_pages(ptrs, FAST)


@triton.jit
def _page_numbers_of_tile(BT, b, n0, end, stride_btb, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                          FAST: tl.constexpr):
    """int64 page number(s) of the tile of keys [n0, n0 + BLOCK_N) of sequence b (n0 a multiple of BLOCK_N): a
    scalar when a page holds the tile (PAGE a multiple of BLOCK_N), else one per key (rows r of one page share
    entry n0 / PAGE + r / PAGE); entries past end's page clamped to it (their keys' loads are masked off)."""
    last = tl.maximum(end - 1, 0) // PAGE
    if PAGE % BLOCK_N == 0:
        idx = tl.minimum(n0 // PAGE, last)
    else:
        idx = tl.minimum(n0 // PAGE + tl.arange(0, BLOCK_N) // PAGE, last)
    ptrs = BT + b.to(tl.int64) * stride_btb + idx
    return _load_pages(ptrs, FAST)


@triton.jit
def _key_range(L, Sq, S_MAX, left, right, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """[lo, hi): the keys any query row of a sequence of L keys attends (L a scalar or a vector of lengths); lo a
    tile edge (one page per tile where it can)."""
    hi = tl.minimum(L, S_MAX)        # causal: j <= L − Sq + i <= L − 1 for every row; S_MAX: the cache's slots
    if WINDOW_RIGHT:
        hi = tl.minimum(hi, tl.maximum(L - Sq + (Sq - 1) + right + 1, 0))
    lo = hi * 0
    if WINDOW_LEFT:
        lo = tl.maximum(L - Sq - left, 0) // BLOCK_N * BLOCK_N
    return lo, hi


@triton.jit
def _rows(Q, b, hkv, rb, L, Sq, stride_qb, stride_qh, stride_qs, stride_qd, D, G: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, FAST: tl.constexpr):
    """The block's rows r = g·Sq + i -> query head h = hkv·G + g, query i at position L − Sq + i: q [BLOCK_M,
    BLOCK_D] (0 past the rows), h, i, their positions, which rows exist."""
    offs_r = rb * BLOCK_M + tl.arange(0, BLOCK_M)
    g = offs_r // Sq
    i = offs_r % Sq
    row_ok = g < G
    h = hkv * G + g
    offs_d = tl.arange(0, BLOCK_D)
    q_ptrs = (Q + b.to(tl.int64) * stride_qb + h.to(tl.int64)[:, None] * stride_qh
              + i.to(tl.int64)[:, None] * stride_qs + offs_d[None, :] * stride_qd)
    q = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    if not FAST:
        q = q.to(tl.float32)
    return q, h, i, L - Sq + i, row_ok


@triton.jit
def _kv_bases(K, V, b, hkv, stride_kb, stride_kh, stride_vb, stride_vh, PAGED: tl.constexpr):
    """K and V of kv head hkv (and, dense, of sequence b: a paged cache finds b's pages through the block table)."""
    k_base = K + hkv.to(tl.int64) * stride_kh
    v_base = V + hkv.to(tl.int64) * stride_vh
    if not PAGED:
        k_base += b.to(tl.int64) * stride_kb
        v_base += b.to(tl.int64) * stride_vb
    return k_base, v_base


@triton.jit
def _attend(q, qpos, b, start, end, k_base, v_base, BT, D, stride_btb, stride_kb, stride_ks, stride_kd,
            stride_vb, stride_vs, stride_vd, scale, softcap, left, right,
            PAGED: tl.constexpr, PAGE: tl.constexpr, CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr,
            WINDOW_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_D: tl.constexpr, FAST: tl.constexpr, IEEE: tl.constexpr, NUM_STAGES: tl.constexpr,
            AHEAD: tl.constexpr):
    """The running state (m, d, o) of the rows over keys [start, end) of sequence b (k_base / v_base: the kv
    head's caches, dense ones at sequence b)."""
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    dsum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if AHEAD == 2:
        pg_next = _page_numbers(BT, b, start + tl.arange(0, BLOCK_N), end, stride_btb, PAGE, FAST)
    if AHEAD == 3:
        tl.static_assert(PAGE % BLOCK_N == 0 or BLOCK_N % PAGE == 0)
        pg_next = _page_numbers_of_tile(BT, b, start, end, stride_btb, PAGE, BLOCK_N, FAST)
        # row r of every tile: slot r % PAGE of its page (r + n0 % PAGE where a page holds the tile)
        slot = tl.arange(0, BLOCK_N) % PAGE
        k_in_page = (slot * stride_ks)[:, None] + offs_d[None, :] * stride_kd
        v_in_page = (slot * stride_vs)[:, None] + offs_d[None, :] * stride_vd
    for n0 in tl.range(start, end, BLOCK_N, num_stages=NUM_STAGES):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < end
        if AHEAD == 3:
            pg = pg_next                # tile t's page number(s), read in iteration t − 1; now read tile t + 1's
            pg_next = _page_numbers_of_tile(BT, b, n0 + BLOCK_N, end, stride_btb, PAGE, BLOCK_N, FAST)
            if PAGE % BLOCK_N == 0:     # the tile: a dense one in page pg from slot n0 % PAGE
                k_ptrs = k_base + (pg * stride_kb + (n0 % PAGE) * stride_ks) + k_in_page
                v_ptrs = v_base + (pg * stride_vb + (n0 % PAGE) * stride_vs) + v_in_page
            else:
                k_ptrs = k_base + (pg * stride_kb)[:, None] + k_in_page
                v_ptrs = v_base + (pg * stride_vb)[:, None] + v_in_page
            kt = tl.trans(tl.load(k_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0))
        elif AHEAD:
            if AHEAD == 2:
                pg = pg_next            # tile t's page numbers, read in iteration t − 1; now read tile t + 1's
                pg_next = _page_numbers(BT, b, offs_n + BLOCK_N, end, stride_btb, PAGE, FAST)
            else:
                pg = _page_numbers(BT, b, offs_n, end, stride_btb, PAGE, FAST)
            slot = (offs_n % PAGE).to(tl.int64)
            k_rows = tl.load(k_base + (pg * stride_kb + slot * stride_ks)[:, None] + offs_d[None, :] * stride_kd,
                             mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            kt = tl.trans(k_rows)
            v_ptrs = v_base + (pg * stride_vb + slot * stride_vs)[:, None] + offs_d[None, :] * stride_vd
        else:
            k_off = _key_offsets(BT, b, n0, offs_n, n_ok, stride_btb, stride_kb, stride_ks, PAGED, PAGE, BLOCK_N)
            if PAGED:
                v_off = _key_offsets(BT, b, n0, offs_n, n_ok, stride_btb, stride_vb, stride_vs, PAGED, PAGE,
                                     BLOCK_N)
            else:
                v_off = offs_n.to(tl.int64) * stride_vs
            v_ptrs = v_base + v_off[:, None] + offs_d[None, :] * stride_vd
            kt = tl.load(k_base + k_off[None, :] + offs_d[:, None] * stride_kd, mask=n_ok[None, :] & d_ok[:, None],
                         other=0.0)
        if not FAST:                # Triton 3.6's interpreter gets bf16 tl.dot wrong: fp32 operands there
            kt = kt.to(tl.float32)
        if IEEE:
            s = tl.dot(q, kt, input_precision="ieee")
        else:
            s = tl.dot(q, kt)
        s = s * scale                                            # s = scale · q·k
        if SOFTCAP:
            # c · tanh(s / c) = c · (1 − 2 / (e^(2s/c) + 1)): exact at ±inf, no NaN
            s = softcap - 2.0 * softcap / (tl.exp(2.0 * s / softcap) + 1.0)
        ok = n_ok[None, :]
        if CAUSAL:
            ok = ok & (offs_n[None, :] <= qpos[:, None])
        if WINDOW_LEFT:
            ok = ok & (offs_n[None, :] >= qpos[:, None] - left)
        if WINDOW_RIGHT:
            ok = ok & (offs_n[None, :] <= qpos[:, None] + right)
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))                  # m' = max(m, max_j s_j)
        alpha = _alpha(m, m_new)                                  # α = e^(m − m'), 1 where both are −inf
        p = _exp(s - _shift(m_new)[:, None], FAST)                # p = e^(s − m'), 0 where s = −inf
        dsum = dsum * alpha + tl.sum(p, axis=1)                   # d' = d·α + Σ p
        v = tl.load(v_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        if not FAST:
            v = v.to(tl.float32)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv                           # o' = o·α + p·V
        m = m_new
    return m, dsum, acc


@triton.jit
def split_kv_kernel(
    Q, K, V, SEQLENS, BT, O, LSE, PART_O, PART_LSE,
    H, Hkv, Sq, D, NUM_SPLITS, ROW_BLOCKS, S_MAX,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_btb,
    stride_ob, stride_oh, stride_os, stride_od,
    scale, softcap, left, right,
    G: tl.constexpr, PAGED: tl.constexpr, PAGE: tl.constexpr, CAUSAL: tl.constexpr,
    WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, FAST: tl.constexpr,
    IEEE: tl.constexpr, NUM_STAGES: tl.constexpr, AHEAD: tl.constexpr = False, BOUND: tl.constexpr = False,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    rb = pid % ROW_BLOCKS
    bh = pid // ROW_BLOCKS
    b = bh // Hkv
    hkv = bh % Hkv
    L = tl.load(SEQLENS + b)

    # 1. the rows of the block
    q, h, i, qpos, row_ok = _rows(Q, b, hkv, rb, L, Sq, stride_qb, stride_qh, stride_qs, stride_qd, D, G, BLOCK_M,
                                  BLOCK_D, FAST)

    # 2. the keys any row of the block attends, [lo, hi), cut into NUM_SPLITS chunks of whole tiles
    lo, hi = _key_range(L, Sq, S_MAX, left, right, WINDOW_LEFT, WINDOW_RIGHT, BLOCK_N)
    if BOUND:
        chunk = tl.cdiv(tl.cdiv(S_MAX, NUM_SPLITS), BLOCK_N) * BLOCK_N
        start = tl.maximum(split * chunk, lo)
        end = tl.minimum(split * chunk + chunk, hi)
        if SPLIT and start >= end:                  # nothing of this sequence in the chunk: an empty state
            row = ((b * H + h) * Sq + i).to(tl.int64) * NUM_SPLITS + split
            tl.store(PART_LSE + row, float("-inf"), mask=row_ok)
            return
    else:
        n = tl.maximum(hi - lo, 0)
        chunk = tl.cdiv(tl.cdiv(n, NUM_SPLITS), BLOCK_N) * BLOCK_N
        start = lo + split * chunk
        end = tl.minimum(start + chunk, hi)

    k_base, v_base = _kv_bases(K, V, b, hkv, stride_kb, stride_kh, stride_vb, stride_vh, PAGED)

    # 3. stream the split's key tiles through the running (m, d, o)
    m, dsum, acc = _attend(q, qpos, b, start, end, k_base, v_base, BT, D, stride_btb, stride_kb, stride_ks,
                           stride_kd, stride_vb, stride_vs, stride_vd, scale, softcap, left, right, PAGED, PAGE,
                           CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, BLOCK_M, BLOCK_N, BLOCK_D, FAST, IEEE,
                           NUM_STAGES, AHEAD)

    # 4. the (partial) state: o / d and lse = m + log d; a row without a key gives o = 0, lse = −inf
    offs_d = tl.arange(0, BLOCK_D)
    o = acc / tl.where(dsum == 0.0, 1.0, dsum)[:, None]
    lse = _lse(m, dsum)
    out_ok = row_ok[:, None] & (offs_d < D)[None, :]
    if SPLIT:
        row = ((b * H + h) * Sq + i).to(tl.int64) * NUM_SPLITS + split
        tl.store(PART_O + row[:, None] * D + offs_d[None, :], o, mask=out_ok)
        tl.store(PART_LSE + row, lse, mask=row_ok)
    else:
        o_ptrs = (O + b.to(tl.int64) * stride_ob + h.to(tl.int64)[:, None] * stride_oh
                  + i.to(tl.int64)[:, None] * stride_os + offs_d[None, :] * stride_od)
        tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=out_ok)
        tl.store(LSE + (b * H + h) * Sq + i, lse, mask=row_ok)


@triton.jit
def _tile_counts(SEQLENS, B, Sq, S_MAX, left, right, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr):
    """Key tiles n_b of each sequence (0 past B) and their inclusive prefix sums: sequence b owns tiles
    [incl_b − n_b, incl_b) of the line of all T = Σ n_b tiles, read from cache_seqlens on the device."""
    offs_b = tl.arange(0, BLOCK_B)
    L = tl.load(SEQLENS + offs_b, mask=offs_b < B, other=0)
    lo, hi = _key_range(L, Sq, S_MAX, left, right, WINDOW_LEFT, WINDOW_RIGHT, BLOCK_N)
    n = tl.cdiv(tl.maximum(hi - lo, 0), BLOCK_N)
    return offs_b, n, tl.cumsum(n, 0)


@triton.jit
def balanced_kv_kernel(
    Q, K, V, SEQLENS, BT, PART_O, PART_LSE,
    B, H, Hkv, Sq, D, CHUNKS, ROW_BLOCKS, S_MAX,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_btb,
    scale, softcap, left, right,
    G: tl.constexpr, PAGED: tl.constexpr, PAGE: tl.constexpr, CAUSAL: tl.constexpr,
    WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_B: tl.constexpr,
    FAST: tl.constexpr, IEEE: tl.constexpr, NUM_STAGES: tl.constexpr, AHEAD: tl.constexpr = 0,
    CROSS: tl.constexpr = False,
):
    """One program per (kv head, row block, chunk c): the key tiles of all B sequences laid end to end
    (T = Σ_b n_b per kv head) are cut into CHUNKS equal ranges [c·T/CHUNKS, (c+1)·T/CHUNKS), whatever the
    lengths, so every program streams the same number of tiles (± 1). A range may span several sequences: for
    each sequence b it meets, the program streams its tiles of b and writes one partial state (o, lse) at slot
    c + b of the row (a one-to-one map: a later chunk meets only the same or later sequences), which
    ``merge_segments_kernel`` ⊕-merges. The ranges come from cache_seqlens on the device: no host sync, and a
    CUDA graph stays right when the lengths change.

    CROSS: one line for all kv heads, head-major (kv head hkv's tiles at [hkv·T, (hkv+1)·T)), cut into CHUNKS
    ranges per row block, so the chunk count need not divide by Hkv (it fills every SM); a range may then also
    span kv heads: pair (hkv, b) is segment s = hkv·B + b, its tiles of b's written at slot c + b of the rows of
    kv head hkv (still one-to-one per row: the line is ordered by b within a head).

    Memory traffic: the K and V tiles of the range, once; B lengths; per segment q (G·Sq rows × D) and G·Sq
    partial rows of D + 1 fp32."""
    u = tl.program_id(0)
    c = tl.program_id(1).to(tl.int64)
    rb = u % ROW_BLOCKS
    nslots = CHUNKS + B - 1

    # 1. this chunk's tiles [t0, t1) on the line, and the segments s_first..s_stop − 1 (s = hkv·B + b) they meet
    offs_b, n, incl = _tile_counts(SEQLENS, B, Sq, S_MAX, left, right, WINDOW_LEFT, WINDOW_RIGHT, BLOCK_N, BLOCK_B)
    T = tl.sum(n, 0)
    if CROSS:
        line = T.to(tl.int64) * Hkv
    else:
        line = T.to(tl.int64)
    t0 = (c * line // CHUNKS).to(tl.int32)
    t1 = ((c + 1) * line // CHUNKS).to(tl.int32)
    if CROSS:
        Tg = tl.maximum(T, 1)
        h_first = t0 // Tg
        h_last = (t1 - 1) // Tg                                      # the kv head of tile t1 − 1
        s_first = h_first * B + tl.sum((incl <= t0 - h_first * Tg).to(tl.int32), 0)
        s_last = h_last * B + tl.sum((incl <= t1 - 1 - h_last * Tg).to(tl.int32), 0)
    else:
        h_first = u // ROW_BLOCKS
        s_first = h_first * B + tl.sum((incl <= t0).to(tl.int32), 0)
        s_last = h_first * B + tl.sum((incl < t1).to(tl.int32), 0)    # the sequence of tile t1 − 1
    s_stop = tl.where(t1 > t0, s_last + 1, s_first)

    offs_d = tl.arange(0, BLOCK_D)
    for s in range(s_first, s_stop):
        hkv = s // B
        b = s - hkv * B
        # 2. tiles [a, e) of sequence b's own [lo, hi) lie in the chunk (none if b has no key)
        L = tl.load(SEQLENS + b)
        lo, hi = _key_range(L, Sq, S_MAX, left, right, WINDOW_LEFT, WINDOW_RIGHT, BLOCK_N)
        excl = tl.sum(tl.where(offs_b < b, n, 0), 0)
        if CROSS:
            excl += hkv * T
        n_b = tl.cdiv(tl.maximum(hi - lo, 0), BLOCK_N)
        start = lo + tl.maximum(t0 - excl, 0) * BLOCK_N
        end = tl.minimum(lo + tl.minimum(t1 - excl, n_b) * BLOCK_N, hi)
        q, h, i, qpos, row_ok = _rows(Q, b, hkv, rb, L, Sq, stride_qb, stride_qh, stride_qs, stride_qd, D, G,
                                      BLOCK_M, BLOCK_D, FAST)
        k_base, v_base = _kv_bases(K, V, b, hkv, stride_kb, stride_kh, stride_vb, stride_vh, PAGED)
        # 3. stream them through the running (m, d, o)
        m, dsum, acc = _attend(q, qpos, b, start, end, k_base, v_base, BT, D, stride_btb, stride_kb, stride_ks,
                               stride_kd, stride_vb, stride_vs, stride_vd, scale, softcap, left, right, PAGED, PAGE,
                               CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, BLOCK_M, BLOCK_N, BLOCK_D, FAST, IEEE,
                               NUM_STAGES, AHEAD)
        # 4. the segment's partial state (o / d, lse = m + log d) at slot c + b of each row (h, i)
        o = acc / tl.where(dsum == 0.0, 1.0, dsum)[:, None]
        lse = _lse(m, dsum)
        seg_ok = row_ok & (start < end)
        row = (h * Sq + i).to(tl.int64) * nslots + c + b
        tl.store(PART_O + row[:, None] * D + offs_d[None, :], o, mask=seg_ok[:, None] & (offs_d < D)[None, :])
        tl.store(PART_LSE + row, lse, mask=seg_ok)
