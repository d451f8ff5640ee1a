"""Attention forward: the online-softmax state extended to ``(m, d, o)``, one program per (query block, head).

Per program: a ``BLOCK_M × D`` tile of queries stays in registers; key / value tiles of ``BLOCK_N`` rows stream
through (each K and V element read once per query block: ``2·Sk·D`` elements per program), the ``BLOCK_M ×
BLOCK_N`` scores live in registers only, and the output is written once. In the paper's notation, per key tile:

1. ``s = log2(e)·scale·q kᵀ`` (scores in base 2: one ``ex2`` per score, the scale folded into the constant; with a
   softcap c, ``s = c·log2(e)·tanh(scale·q kᵀ / c)``), masked to −inf outside the band;
2. ``m_new = max(m, max_j s_j)``;
3. ``α = 2^(m − m_new)``, ``p = 2^(s − m_new)``;
4. ``d ← α·d + Σ_j p_j``, ``o ← α·o + p v``; ``m ← m_new``.
At the end ``O = o / d`` and ``lse = ln 2 · (m + log2 d)``; a row with no key keeps ``d = 0``: O = 0, lse = −inf.

The band: query i attends key j iff ``i + off − LEFT <= j <= i + off + RIGHT`` (``off = Sk − Sq``; causal is
RIGHT = 0; a missing bound is a constexpr flag). Key blocks outside every row's band are skipped; blocks inside
every row's band (and inside Sk) run without masks (:func:`_band` splits the key range in three).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..._triton.online import LN2, LOG2E


@triton.jit
def _tanh(x):
    """tanh through one exp2: 1 − 2 / (e^(2x) + 1), exact to fp32 rounding at |x| large (±1), no NaN."""
    return 1.0 - 2.0 / (tl.math.exp2(x * (2.0 * LOG2E)) + 1.0)


@triton.jit
def _mm(a, b, acc, F32: tl.constexpr):
    """acc + a @ b (fp32 accumulation). F32: operands upcast first (the interpreter's bf16 tl.dot is wrong in
    Triton 3.6; the plan sets it there only)."""
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def _load_tile(ptrs, row_ok, d_ok, MASKED: tl.constexpr, PAD_D: tl.constexpr):
    """A [rows, BLOCK_D] tile, zeros where masked: rows by row_ok and the padded head dim by d_ok (MASKED), the
    padded head dim only (PAD_D: BLOCK_D > HEAD_DIM), or no mask at all."""
    if MASKED:
        return tl.load(ptrs, mask=row_ok & d_ok, other=0.0)
    elif PAD_D:
        return tl.load(ptrs, mask=d_ok, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _band(m0, Sq, Sk, off, LEFT, RIGHT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
          HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Key ranges for query rows [m0, min(m0 + BLOCK_M, Sq)): ``[lo, hi)`` holds every key some row attends,
    ``[full_lo, full_hi)`` (whole blocks) those every row attends; lo <= full_lo <= full_hi <= hi."""
    m_last = tl.minimum(m0 + BLOCK_M, Sq) - 1
    lo = 0
    full_lo = 0
    hi = Sk
    end = Sk
    if HAS_LEFT:
        lo = tl.maximum(m0 + off - LEFT, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
        full_lo = tl.cdiv(tl.maximum(m_last + off - LEFT, 0), BLOCK_N) * BLOCK_N
    if HAS_RIGHT:
        hi = tl.minimum(Sk, tl.maximum(m_last + off + RIGHT + 1, 0))
        end = tl.minimum(Sk, tl.maximum(m0 + off + RIGHT + 1, 0))
    full_hi = (end // BLOCK_N) * BLOCK_N
    hi = tl.maximum(hi, lo)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def _scores(q, k, qk_scale, cap_in, cap_out, SOFTCAP: tl.constexpr, F32: tl.constexpr):
    """Step 1 without the mask: base-2 scores of q [M, D] against k [N, D] (fp32 accumulation)."""
    qk = _mm(q, tl.trans(k), None, F32)
    if SOFTCAP:
        return _tanh(qk * cap_in) * cap_out
    return qk * qk_scale


@triton.jit
def _keep(offs_m, offs_n, Sk, off, LEFT, RIGHT, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """[M, N]: key offs_n exists and lies in query offs_m's band."""
    j = offs_n[None, :]
    keep = j < Sk
    if HAS_LEFT:
        keep &= j >= offs_m[:, None] + (off - LEFT)
    if HAS_RIGHT:
        keep &= j <= offs_m[:, None] + (off + RIGHT)
    return keep


@triton.jit
def _fwd_steps(acc, m_i, l_i, q, k_base, v_base, skn, skd, svn, svd, offs_m, offs_d, start, stop,
               Sk, off, LEFT, RIGHT, qk_scale, cap_in, cap_out,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr,
               HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, F32: tl.constexpr):
    """Steps 1-4 over the key blocks [start, stop); MASKED: the band / Sk mask applies."""
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d[None, :] < HEAD_DIM
    for n0 in range(start, stop, BLOCK_N):
        n0_64 = tl.cast(n0, tl.int64)
        k_ptrs = k_base + n0_64 * skn + offs_n[:, None] * skn + offs_d[None, :] * skd
        v_ptrs = v_base + n0_64 * svn + offs_n[:, None] * svn + offs_d[None, :] * svd
        row_ok = (n0 + offs_n[:, None]) < Sk
        k = _load_tile(k_ptrs, row_ok, d_ok, MASKED, BLOCK_D != HEAD_DIM)
        s = _scores(q, k, qk_scale, cap_in, cap_out, SOFTCAP, F32)                # 1. s = log2e·scale·q kᵀ
        if MASKED:
            s = tl.where(_keep(offs_m, n0 + offs_n, Sk, off, LEFT, RIGHT, HAS_LEFT, HAS_RIGHT), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))                            # 2. m_new = max(m, max_j s_j)
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)             #    no key yet: take 0 (no NaN)
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_ref = m_new
        alpha = tl.math.exp2(m_i - m_ref)                                    # 3. α = 2^(m - m_new)
        p = tl.math.exp2(s - m_ref[:, None])                                 #    p = 2^(s - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)                                     # 4. d <- α·d + Σ p
        v = _load_tile(v_ptrs, row_ok, d_ok, MASKED, BLOCK_D != HEAD_DIM)
        acc = _mm(p.to(v.dtype), v, acc * alpha[:, None], F32)                 #    o <- α·o + p v
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _query_program(H, GROUP, REVERSE: tl.constexpr):
    """(query block, batch, head, kv head) of a program of the grid (query blocks, B·H). REVERSE (banded): the
    longest rows (last query blocks) start first, the short ones fill in. GQA: head h reads kv head h // GROUP."""
    pid_m = tl.program_id(0)
    if REVERSE:
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1)
    h = bh % H
    return pid_m, bh // H, h, h // GROUP


@triton.jit
def _seq(CU, b, S, VARLEN: tl.constexpr):
    """(first row, rows) of sequence b: from the cumulative lengths CU (int32 [B + 1]) when VARLEN, else (0, S)."""
    if VARLEN:
        start = tl.load(CU + b)
        return start, tl.load(CU + b + 1) - start
    return 0, S


@triton.jit
def attention_fwd_kernel(
        Q, K, V, O, LSE, CU_Q, CU_K,
        sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod, slb, slh,
        H, GROUP, Sq, Sk, LEFT, RIGHT, qk_scale, cap_in, cap_out,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, REVERSE: tl.constexpr,
        F32: tl.constexpr, VARLEN: tl.constexpr):
    """Grid (cdiv(Sq, BLOCK_M), B·H). O has q's strides; LSE (float32) row i of (b, h) is at b·slb + h·slh + i.
    VARLEN: sequence b is rows CU_Q[b]:CU_Q[b + 1] of q (its strides' b term is 0) and CU_K[b]:CU_K[b + 1] of
    k / v; Sq, Sk are the longest lengths (the grid's), each program reads its own."""
    pid_m, b, h, hk = _query_program(H, GROUP, REVERSE)
    m0 = pid_m * BLOCK_M
    q_start, Sq = _seq(CU_Q, b, Sq, VARLEN)
    k_start, Sk = _seq(CU_K, b, Sk, VARLEN)
    if m0 >= Sq:                   # VARLEN: past this sequence's queries
        return
    off = Sk - Sq
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + tl.cast(q_start, tl.int64) * sqm
    k_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh + tl.cast(k_start, tl.int64) * skn
    v_base = V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh + tl.cast(k_start, tl.int64) * svn
    io_mask = (offs_m[:, None] < Sq) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_base + offs_m[:, None].to(tl.int64) * sqm + offs_d[None, :] * sqd, mask=io_mask, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo, full_lo, full_hi, hi = _band(m0, Sq, Sk, off, LEFT, RIGHT, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    acc, m_i, l_i = _fwd_steps(acc, m_i, l_i, q, k_base, v_base, skn, skd, svn, svd, offs_m, offs_d, lo, full_lo,
                               Sk, off, LEFT, RIGHT, qk_scale, cap_in, cap_out, BLOCK_N, BLOCK_D, HEAD_DIM, True,
                               HAS_LEFT, HAS_RIGHT, SOFTCAP, F32)
    acc, m_i, l_i = _fwd_steps(acc, m_i, l_i, q, k_base, v_base, skn, skd, svn, svd, offs_m, offs_d, full_lo,
                               full_hi, Sk, off, LEFT, RIGHT, qk_scale, cap_in, cap_out, BLOCK_N, BLOCK_D, HEAD_DIM,
                               False, HAS_LEFT, HAS_RIGHT, SOFTCAP, F32)
    acc, m_i, l_i = _fwd_steps(acc, m_i, l_i, q, k_base, v_base, skn, skd, svn, svd, offs_m, offs_d, full_hi, hi,
                               Sk, off, LEFT, RIGHT, qk_scale, cap_in, cap_out, BLOCK_N, BLOCK_D, HEAD_DIM, True,
                               HAS_LEFT, HAS_RIGHT, SOFTCAP, F32)

    empty = l_i == 0.0             # no attended key: O = 0, lse = -inf
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)
    o_base = O + b.to(tl.int64) * sob + h.to(tl.int64) * soh + tl.cast(q_start, tl.int64) * som
    tl.store(o_base + offs_m[:, None].to(tl.int64) * som + offs_d[None, :] * sod, o.to(O.dtype.element_ty),
             mask=io_mask)
    lse_base = LSE + b.to(tl.int64) * slb + h.to(tl.int64) * slh + q_start
    tl.store(lse_base + offs_m, lse, mask=offs_m < Sq)
