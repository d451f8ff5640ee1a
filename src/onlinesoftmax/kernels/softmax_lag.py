"""Long rows, many of them: the chunk waits in L2, not on the SM (the GPU only; kernels/softmax.py chooses it).

The coop kernels hold chunk c of a row on its SM (registers or shared memory) until the row's C chunks have
published their states; while a chunk waits, its SM holds bytes it cannot write. Here nothing waits on the SM.
Chunks are numbered q = row·C + c, and program q does two unrelated things:

    pass 1, chunk q:        read x (HBM, kept in L2: evict_last), (m_c, d_c) = the chunk's state, publish it;
    pass 2, chunk q - LAG:  (m, d) = ⊕ of that row's C published states, read x again (an L2 hit: the chunk
                            was read LAG programs ago), write y = e^(x - m) / d  (or (x - m) - log d).

HBM traffic stays one read of x and one write of y; the second read comes from L2, whose 60 MB hold LAG
chunks many times over. LAG >= C, so the row program q finishes needs only chunks below q: programs start in
order, so they all have started and none of them waits on q (the coop kernels rely on the same order).

Steps for pass 1, sub-tile by sub-tile (SUB elements): m_t = max(m, max_j x_j) (one CTA reduction),
d_j ← d_j·e^(m - m_t) + e^(x_j - m_t) per lane (one exponential per element), m ← m_t; d_c = sum_j d_j.
Barrier word ARRIVE[row] (0 between launches): pass 1 adds 1 per chunk; pass 2 waits for C, reads the
states, adds 1; the last of the 2C arrivals resets it to 0.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .softmax import _exp, _merge_row, _row_offsets, _shift


@triton.jit
def softmax_lag_kernel(
    X, Y, PART_M, PART_D, ARRIVE, N, INNER, sxo, sxi, syo, syi, C, Q, LAG,
    CHUNK: tl.constexpr, SUB: tl.constexpr, C_POW2: tl.constexpr, MODE: tl.constexpr, EVEN: tl.constexpr,
    HINTS: tl.constexpr, FAST: tl.constexpr,
):
    """Program q: pass 1 of chunk q (q < Q), pass 2 of chunk q - LAG (q >= LAG). Unit-stride rows."""
    q = tl.program_id(0)
    offs = tl.arange(0, SUB)
    k = tl.arange(0, C_POW2)
    has1 = q < Q
    has2 = q >= LAG
    row1 = q // C
    start1 = (q % C) * CHUNK
    row2 = (q - LAG) // C
    start2 = ((q - LAG) % C) * CHUNK
    x1_row = X + _row_offsets(row1, INNER, sxo, sxi) + start1
    x2_row = X + _row_offsets(row2, INNER, sxo, sxi) + start2
    y2_row = Y + _row_offsets(row2, INNER, syo, syi) + start2
    # pass 1's first sub-tile is in flight before pass 2 waits
    x1 = _load(x1_row, offs, has1 & (start1 + offs < N) if not EVEN else has1, float("-inf"), HINTS, 1)
    # pass 2's row state: wait for its C chunks, (m, d) = ⊕_c (m_c, d_c), count this read
    m = float("-inf")
    d = 1.0
    if has2:
        while tl.atomic_add(ARRIVE + row2, 0, sem="acquire") < C:
            pass
        m, d = _merge_row(PART_M, PART_D, row2, C, k)
        if tl.atomic_add(ARRIVE + row2, 1, sem="acq_rel") == 2 * C - 1:
            tl.atomic_xchg(ARRIVE + row2, 0, sem="relaxed")
    sh = _shift(m)
    scale = tl.where(m == float("inf"), float("nan"), 1.0 / d)
    log_d = tl.where(m == float("inf"), float("nan"), tl.log(d))
    m1 = float("-inf")
    d1 = tl.zeros([SUB], tl.float32)
    for s in tl.range(0, CHUNK // SUB):
        o = s * SUB + offs
        mask2 = has2 & (start2 + o < N) if not EVEN else has2
        x2 = _load(x2_row, o, mask2, 0.0, HINTS, 2)
        # the next pass-1 sub-tile in flight while this one is folded (past the chunk: masked, no traffic)
        mask1n = has1 & (s + 1 < CHUNK // SUB) & (start1 + o + SUB < N) if not EVEN else \
            has1 & (s + 1 < CHUNK // SUB)
        x1n = _load(x1_row, o + SUB, mask1n, float("-inf"), HINTS, 1)
        # pass 2: y of chunk q - LAG
        if MODE == 0:
            y = _exp(x2 - sh, FAST) * scale
        else:
            y = (x2 - m) - log_d
        if HINTS:
            tl.store(y2_row + o, y.to(Y.dtype.element_ty), mask=mask2, eviction_policy="evict_first")
        else:
            tl.store(y2_row + o, y.to(Y.dtype.element_ty), mask=mask2)
        # pass 1: fold the sub-tile into (m1, d1)
        m_t = tl.maximum(m1, tl.max(x1, axis=0))
        alpha = tl.where(m1 == m_t, 1.0, tl.exp(m1 - m_t))
        d1 = d1 * alpha + _exp(x1 - _shift(m_t), FAST)
        m1 = m_t
        x1 = x1n
    if has1:
        tl.store(PART_M + q, m1)
        tl.store(PART_D + q, tl.sum(d1, axis=0))
        tl.debug_barrier()
        tl.atomic_add(ARRIVE + row1, 1, sem="release")


@triton.jit
def _load(row_ptr, o, mask, other, HINTS: tl.constexpr, PASS: tl.constexpr):
    """fp32 sub-tile; pass 1 keeps x in L2 for pass 2 (evict_last), pass 2 lets it go (evict_first)."""
    if HINTS:
        if PASS == 1:
            x = tl.load(row_ptr + o, mask=mask, other=other, eviction_policy="evict_last")
        else:
            x = tl.load(row_ptr + o, mask=mask, other=other, eviction_policy="evict_first")
    else:
        x = tl.load(row_ptr + o, mask=mask, other=other)
    return x.to(tl.float32)
