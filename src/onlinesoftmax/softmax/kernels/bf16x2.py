"""The coop path for bf16 rows of unit stride and even N, holding x (backward: y and dy) as int32 words of two
elements: one register per two elements, so a program holds twice the chunk of ``softmax_chunks_kernel`` in the
same registers, and an SM twice the bytes in flight (on-chip bytes in flight per SM set the speed of this path).
Offsets count words (element offset / 2; the plan checks even strides). Needs ``cvt.rn.bf16x2.f32`` (sm_80+)."""

from __future__ import annotations

import triton
import triton.language as tl

from ..._triton.online import (
    _bf16_halves,
    _exp,
    _merge_row,
    _pack_bf16x2,
    _row_barrier,
    _row_generation,
    _row_offsets,
    _shift,
)
from .common import _grad


@triton.jit
def _chunk_words(N, C, CHUNK: tl.constexpr):
    """Program (row, c) of a bf16x2 kernel: its id, row, and chunk c's int32 words (two bf16 each) with their
    mask; N is even."""
    pid = tl.program_id(0)
    row = pid // C
    HALF: tl.constexpr = CHUNK // 2
    words = (pid % C) * HALF + tl.arange(0, HALF)
    return pid, row, words, words < N // 2


@triton.jit
def _word_row(P, row, INNER, so, si):
    """Row `row` of a bf16 tensor as int32 words (its strides are even: the plans check)."""
    return P.to(tl.pointer_type(tl.int32)) + _row_offsets(row, INNER, so // 2, si // 2)


@triton.jit
def softmax_coop_bf16x2_kernel(
    X, Y, PART_M, PART_D, ARRIVE, GEN, N, INNER, sxo, sxi, syo, syi, C,
    CHUNK: tl.constexpr, C_POW2: tl.constexpr, MODE: tl.constexpr,
):
    """The coop path for bf16 rows of unit stride and even N: x is read and held as int32 words of two
    elements, one register per two elements where fp32 e^(x - m_c) needs one per element, so a program
    holds twice the chunk and an SM twice the bytes in flight (H200: bf16 at 8192 elements per program of the
    generic kernel reached 59-61 % of copy against fp32's 76-81 % at the same register footprint; this kernel
    66-78 % at N = 32K-256K). Offsets here count words (element offset / 2; the
    plan checks that strides are even)."""
    pid, row, words, mask = _chunk_words(N, C, CHUNK)
    # read x; padding 0xFF80FF80 = (-inf, -inf)
    w = tl.load(_word_row(X, row, INNER, sxo, sxi) + words, mask=mask, other=-8323200)
    gen = _row_generation(GEN, row)
    # 1. (m_c, d_c) of the chunk's elements, unpacking w once per pass; one reduction each
    lo, hi = _bf16_halves(w, 0)
    m_c = tl.max(tl.maximum(lo, hi), axis=0)
    s_c = _shift(m_c)
    lo, hi = _bf16_halves(w, 1)
    d_c = tl.sum(_exp(lo - s_c, True) + _exp(hi - s_c, True), axis=0)
    tl.store(PART_M + pid, m_c)
    tl.store(PART_D + pid, d_c)
    tl.debug_barrier()
    _row_barrier(ARRIVE, GEN, row, C, gen)                                   # 2. wait for the row's chunks
    m, d = _merge_row(PART_M, PART_D, row, C, tl.arange(0, C_POW2))          # 3. (m, d) = ⊕_c (m_c, d_c)
    lo, hi = _bf16_halves(w, 2)
    if MODE == 0:                                                            # 4. y = e^(x - m) / d
        s = _shift(m)
        scale = tl.where(m == float("inf"), float("nan"), 1.0 / d)
        y_lo = tl.exp(lo - s) * scale           # (ex2.approx.ftz here as well took 64 -> 80 registers and
        y_hi = tl.exp(hi - s) * scale           # lost 5-7 points at N = 32K-256K on the H200)
    else:                                                                    #    y = x - (m + log d)
        b = m + tl.where(m == float("inf"), float("nan"), tl.log(d))  # (16 registers fewer than (x - m) - log d;
        y_lo = lo - b                                                 # the difference is far below bf16's ulp)
        y_hi = hi - b
    tl.store(_word_row(Y, row, INNER, syo, syi) + words, _pack_bf16x2(y_lo, y_hi), mask=mask)   # write y


@triton.jit
def softmax_bwd_coop_bf16x2_kernel(
    Yp, DY, DX, PART, ARRIVE, GEN, N, INNER, syo, syi, sdo, sdi, sxo, sxi, C,
    CHUNK: tl.constexpr, C_POW2: tl.constexpr, LOG: tl.constexpr,
):
    """The backward's coop path for bf16 rows of unit stride and even N, as softmax_coop_bf16x2_kernel: y and
    dy are held across the row barrier as int32 words of two elements (one register per two elements of each)
    and unpacked again after it. Offsets count words (element offset / 2; the plan checks even strides)."""
    pid, row, words, mask = _chunk_words(N, C, CHUNK)
    # read y and dy; padding 0 = (+0.0, +0.0) adds nothing to either sum
    yw = tl.load(_word_row(Yp, row, INNER, syo, syi) + words, mask=mask, other=0)
    dw = tl.load(_word_row(DY, row, INNER, sdo, sdi) + words, mask=mask, other=0)
    gen = _row_generation(GEN, row)
    dy_lo, dy_hi = _bf16_halves(dw, 0)                                       # 1. publish s_c
    if LOG:
        s_c = tl.sum(dy_lo + dy_hi, axis=0)
    else:
        y_lo, y_hi = _bf16_halves(yw, 0)
        s_c = tl.sum(y_lo * dy_lo + y_hi * dy_hi, axis=0)
    tl.store(PART + pid, s_c)
    tl.debug_barrier()
    _row_barrier(ARRIVE, GEN, row, C, gen)                                   # 2. wait for the row
    k = tl.arange(0, C_POW2)
    s = tl.sum(tl.load(PART + row * C + k, mask=k < C, other=0.0, volatile=True), axis=0)   # 3. s = sum s_c
    y_lo, y_hi = _bf16_halves(yw, 1)                                         # 4. dx, unpacking y and dy again
    dy_lo, dy_hi = _bf16_halves(dw, 1)
    dx_lo = _grad(y_lo, dy_lo, s, LOG, False)                               # fast exp: dx is bf16 (see _grad)
    dx_hi = _grad(y_hi, dy_hi, s, LOG, False)
    tl.store(_word_row(DX, row, INNER, sxo, sxi) + words, _pack_bf16x2(dx_lo, dx_hi), mask=mask)  # write dx
