"""Long rows cut into C chunks, one program per chunk holding it in registers (the seed's "segmented reduce").

Program (row, c) computes its chunk's state (m_c, d_c), publishes it, and (coop, PHASE 0) waits at the per-row
barrier in global memory until the row's C programs have published, merges the C states with ⊕ and normalises its
chunk from registers: one read of x and one write of y. The barrier needs the row's C programs resident at once
(the plan bounds C) and programs dispatched in order.

PHASE 1 / 2 (``split``): publish, then a second launch merges and re-reads its chunk (x read twice, nobody waits:
it runs in the CPU interpreter). logsumexp's PHASE 1 alone: the row's last program to arrive merges and writes lse.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..._triton.online import _lse, _merge_row, _row_barrier, _row_generation, _row_offsets, _state
from .common import _grad, _grad_sum, _normalise


@triton.jit
def softmax_chunks_kernel(
    X, Y, PART_M, PART_D, ARRIVE, GEN, N, INNER, sxo, sxi, sxn, syo, syi, syn, C,
    CHUNK: tl.constexpr, C_POW2: tl.constexpr, MODE: tl.constexpr, PHASE: tl.constexpr, ACC: tl.constexpr,
    FAST: tl.constexpr,
):
    """Program (row, c) owns chunk c of its row.

    PHASE 0 (coop):    read chunk, publish (m_c, d_c), row barrier, merge with ⊕, write y from registers.
    PHASE 1 (publish): read chunk, publish (m_c, d_c); for LOGSUMEXP the last program of the row to arrive
                       merges and writes lse (nobody waits, so it also runs in the interpreter).
    PHASE 2 (finish):  merge the published states, re-read the chunk, write y (`split`, interpreter only).
    """
    pid = tl.program_id(0)
    row = pid // C
    c = pid % C
    cols = c * CHUNK + tl.arange(0, CHUNK)
    mask = cols < N
    x_off = _row_offsets(row, INNER, sxo, sxi) + cols.to(tl.int64) * sxn
    x = tl.load(X + x_off, mask=mask, other=float("-inf")).to(ACC)          # read x
    if PHASE == 0:
        gen = _row_generation(GEN, row)                                     # (its round trip overlaps x's)
    k = tl.arange(0, C_POW2)
    if PHASE != 2:
        # 1. publish this chunk's state (m_c, d_c)
        m_c, d_c, e = _state(x, 0, FAST)
        tl.store(PART_M + pid, m_c)
        tl.store(PART_D + pid, d_c)
        tl.debug_barrier()
    if PHASE == 1:
        if MODE == 2:
            if tl.atomic_add(ARRIVE + row, 1, sem="acq_rel") == C - 1:
                tl.atomic_xchg(ARRIVE + row, 0, sem="relaxed")
                m, d = _merge_row(PART_M, PART_D, row, C, k)
                tl.store(Y + row, _lse(m, d).to(Y.dtype.element_ty))
    else:
        if PHASE == 0:
            _row_barrier(ARRIVE, GEN, row, C, gen)                          # 2. wait for the row's chunks
        m, d = _merge_row(PART_M, PART_D, row, C, k)                         # 3. (m, d) = ⊕_c (m_c, d_c)
        if PHASE == 2:
            m_c, _, e = _state(x, 0, FAST)
        y = _normalise(x, e, m_c, m, d, MODE)                                # 4. y from registers
        y_off = _row_offsets(row, INNER, syo, syi) + cols.to(tl.int64) * syn
        tl.store(Y + y_off, y.to(Y.dtype.element_ty), mask=mask)            # write y


@triton.jit
def softmax_bwd_chunks_kernel(
    Yp, DY, DX, PART, ARRIVE, GEN, N, INNER, syo, syi, syn, sdo, sdi, sdn, sxo, sxi, sxn, C,
    CHUNK: tl.constexpr, C_POW2: tl.constexpr, LOG: tl.constexpr, PHASE: tl.constexpr, LIBDEVICE: tl.constexpr,
    ACC: tl.constexpr, SUM: tl.constexpr,
):
    """Long rows: chunk c of y and dy in registers; partial sums s_c meet at the row barrier (PHASE 0), or
    are published (PHASE 1) and finished by a second launch that re-reads the chunk (PHASE 2, interpreter)."""
    pid = tl.program_id(0)
    row = pid // C
    c = pid % C
    cols = c * CHUNK + tl.arange(0, CHUNK)
    mask = cols < N
    c64 = cols.to(tl.int64)
    y = tl.load(Yp + _row_offsets(row, INNER, syo, syi) + c64 * syn, mask=mask, other=0.0).to(ACC)
    dy = tl.load(DY + _row_offsets(row, INNER, sdo, sdi) + c64 * sdn, mask=mask, other=0.0).to(ACC)
    if PHASE == 0:
        gen = _row_generation(GEN, row)
    if PHASE != 2:
        tl.store(PART + pid, _grad_sum(y, dy, 0, LOG, SUM))                 # 1. publish s_c
        tl.debug_barrier()
    if PHASE != 1:
        if PHASE == 0:
            _row_barrier(ARRIVE, GEN, row, C, gen)                          # 2. wait for the row
        k = tl.arange(0, C_POW2)
        s = tl.sum(tl.load(PART + row * C + k, mask=k < C, other=0.0, volatile=True), axis=0).to(ACC)  # 3. s
        dx = _grad(y, dy, s, LOG, LIBDEVICE)                                 # 4. dx from registers
        tl.store(DX + _row_offsets(row, INNER, sxo, sxi) + c64 * sxn, dx.to(DX.dtype.element_ty), mask=mask)
