"""Attention backward (FlashAttention-2's split): Δ, then dK / dV per key block, then dQ per query block.

With ``P = exp(S − lse)`` recomputed from the saved lse (no S × S matrix is ever stored) and ``dO`` given:

0. ``Δ_i = Σ_d O_id·dO_id − dlse_i`` (the softmax backward's Σ y·dy; ``dlse`` when the lse is used downstream),
1. ``dV = Pᵀ dO``, ``dP = dO Vᵀ``, ``dS = P ⊙ (dP − Δ)`` (times ``1 − tanh²`` under a softcap),
2. ``dK = scale · dSᵀ Q`` (summed over the query heads of a GQA group, in registers: no atomics),
3. ``dQ = scale · dS K``.
Kernel 1 (grid: key blocks × B·Hkv) streams the query blocks of each head of the group past a resident K / V
tile; kernel 2 (grid: query blocks × B·H) streams key blocks past a resident Q / dO tile, as the forward does.
Both recompute S (two extra matmuls against the five the gradient needs) and skip the blocks outside the band.
With ``DQ_ATOMIC`` kernel 1 also forms ``dS K`` per step and adds it (fp32 atomics, ``BLOCK_M·D`` of them per step)
into a ``[rows, BLOCK_D]`` fp32 buffer that kernel 0 zeroed; a row kernel then scales and casts it into dQ: five
matmuls, no second pass over K / V.

A row with no attended key has lse = −inf; it is read as +inf so that its P is 0 (not NaN) everywhere.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..._triton.online import LOG2E
from .fwd import _band, _keep, _load_tile, _mm, _query_program, _seq, _tanh


@triton.jit
def attention_bwd_delta_kernel(O, DO, DLSE, DELTA, DQACC, CU_Q, sob, soh, som, sod, sdb, sdh, sdm, sdd, slb, slh, H,
                               Sq, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                               HAS_DLSE: tl.constexpr, ZERO_DQ: tl.constexpr, VARLEN: tl.constexpr):
    """0. Δ = rowsum(O ⊙ dO) − dlse, float32, laid out as the lse (DLSE too: row i of (b, h) at b·slb + h·slh + i).
    ZERO_DQ: the rows of the dQ buffer (row r at r·BLOCK_D, r the lse's index) start at zero."""
    pid_m, b, h, _ = _query_program(H, 1, False)
    q_start, Sq = _seq(CU_Q, b, Sq, VARLEN)
    if pid_m * BLOCK_M >= Sq:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < Sq) & (offs_d[None, :] < HEAD_DIM)
    rows = (q_start + offs_m[:, None]).to(tl.int64)
    o = tl.load(O + b.to(tl.int64) * sob + h.to(tl.int64) * soh + rows * som + offs_d[None, :] * sod, mask=mask,
                other=0.0)
    do = tl.load(DO + b.to(tl.int64) * sdb + h.to(tl.int64) * sdh + rows * sdm + offs_d[None, :] * sdd, mask=mask,
                 other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    row_base = b.to(tl.int64) * slb + h.to(tl.int64) * slh + q_start
    if HAS_DLSE:
        delta -= tl.load(DLSE + row_base + offs_m, mask=offs_m < Sq, other=0.0)
    tl.store(DELTA + row_base + offs_m, delta, mask=offs_m < Sq)
    if ZERO_DQ:
        tl.store(DQACC + (row_base + offs_m[:, None]) * BLOCK_D + offs_d[None, :],
                 tl.zeros([BLOCK_M, BLOCK_D], tl.float32), mask=offs_m[:, None] < Sq)


@triton.jit
def _q_band(n0, Sq, Sk, off, LEFT, RIGHT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Query ranges for keys [n0, min(n0 + BLOCK_N, Sk)): ``[lo, hi)`` holds every row attending some key,
    ``[full_lo, full_hi)`` (whole blocks inside Sq) the rows attending all of them; empty when the key block
    passes Sk (then every block is masked)."""
    n_last = tl.minimum(n0 + BLOCK_N, Sk) - 1
    lo = 0
    full_lo = 0
    hi = Sq
    end = Sq
    if HAS_RIGHT:              # j <= i + off + RIGHT  <=>  i >= j - off - RIGHT
        lo = tl.maximum(n0 - off - RIGHT, 0)
        lo = (lo // BLOCK_M) * BLOCK_M
        full_lo = tl.cdiv(tl.maximum(n0 + BLOCK_N - 1 - off - RIGHT, 0), BLOCK_M) * BLOCK_M
    if HAS_LEFT:               # j >= i + off - LEFT  <=>  i <= j - off + LEFT
        hi = tl.minimum(Sq, tl.maximum(n_last - off + LEFT + 1, 0))
        end = tl.minimum(Sq, tl.maximum(n0 - off + LEFT + 1, 0))
    full_hi = (end // BLOCK_M) * BLOCK_M
    full_hi = tl.where(n0 + BLOCK_N <= Sk, full_hi, 0)
    hi = tl.maximum(hi, lo)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def _keep_t(offs_m, offs_n, Sk, off, LEFT, RIGHT, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """[N, M]: fwd's ``_keep`` built transposed (key rows), in Pᵀ's layout: no transpose of a mask tile."""
    j = offs_n[:, None]
    keep = j < Sk
    if HAS_LEFT:
        keep &= j >= offs_m[None, :] + (off - LEFT)
    if HAS_RIGHT:
        keep &= j <= offs_m[None, :] + (off + RIGHT)
    return keep


@triton.jit
def _dkdv_steps(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, sqm, sqd, sdm, sdd, offs_n, offs_d,
                start, stop, Sq, Sk, off, LEFT, RIGHT, qk_scale, cap_in, cap_out,
                BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr,
                HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, DQ_ATOMIC: tl.constexpr,
                F32: tl.constexpr):
    """Steps 1-2 for the resident keys offs_n over query blocks [start, stop), transposed (rows = keys), so that
    Pᵀ and dSᵀ come out of the dot in the layout the next dot takes; DQ_ATOMIC: step 3 too, added into dq_base."""
    offs_mb = tl.arange(0, BLOCK_M)
    d_ok = offs_d[None, :] < HEAD_DIM
    for m0 in range(start, stop, BLOCK_M):
        offs_m = m0 + offs_mb
        rows = offs_m[:, None].to(tl.int64)
        q_ptrs = q_base + rows * sqm + offs_d[None, :] * sqd
        do_ptrs = do_base + rows * sdm + offs_d[None, :] * sdd
        q = _load_tile(q_ptrs, offs_m[:, None] < Sq, d_ok, MASKED, BLOCK_D != HEAD_DIM)
        do = _load_tile(do_ptrs, offs_m[:, None] < Sq, d_ok, MASKED, BLOCK_D != HEAD_DIM)
        if MASKED:
            lse = tl.load(lse_base + offs_m, mask=offs_m < Sq, other=float("inf"))
            lse = tl.where(lse == float("-inf"), float("inf"), lse)
            delta = tl.load(delta_base + offs_m, mask=offs_m < Sq, other=0.0)
        else:
            lse = tl.load(lse_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        qkT = _mm(k, tl.trans(q), None, F32)                                          # Sᵀ / scale: [N, M]
        if SOFTCAP:
            t = _tanh(qkT * cap_in)
            sT = t * cap_out
        else:
            sT = qkT * qk_scale
        pT = tl.math.exp2(sT - (lse * LOG2E)[None, :])                        # Pᵀ = 2^(s - lse·log2 e)
        if MASKED:
            pT = tl.where(_keep_t(offs_m, offs_n, Sk, off, LEFT, RIGHT, HAS_LEFT, HAS_RIGHT), pT, 0.0)
        dv = _mm(pT.to(do.dtype), do, dv, F32)                                # 1. dV += Pᵀ dO
        dpT = _mm(v, tl.trans(do), None, F32)                                       #    dPᵀ = V dOᵀ
        dsT = pT * (dpT - delta[None, :])                                     #    dSᵀ = Pᵀ ⊙ (dPᵀ - Δ)
        if SOFTCAP:
            dsT = dsT * (1.0 - t * t)
        dsT = dsT.to(q.dtype)
        dk = _mm(dsT, q, dk, F32)                                             # 2. dK += dSᵀ Q (scale at the end)
        if DQ_ATOMIC:                                                         # 3. dQ += dS K (scale in the cast)
            dq = _mm(tl.trans(dsT), k, None, F32)
            dq_ptrs = dq_base + rows * BLOCK_D + offs_d[None, :]
            if MASKED:
                tl.atomic_add(dq_ptrs, dq, mask=offs_m[:, None] < Sq, sem="relaxed")
            else:
                tl.atomic_add(dq_ptrs, dq, sem="relaxed")
    return dk, dv


@triton.jit
def attention_bwd_dkdv_kernel(
        Q, K, V, DO, LSE, DELTA, DK, DV, DQACC, CU_Q, CU_K,
        sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdm, sdd,
        sdkb, sdkh, sdkn, sdkd, sdvb, sdvh, sdvn, sdvd, slb, slh,
        H, Hkv, GROUP, Sq, Sk, LEFT, RIGHT, scale, qk_scale, cap_in, cap_out,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, DQ_ATOMIC: tl.constexpr,
        F32: tl.constexpr, VARLEN: tl.constexpr):
    """Grid (cdiv(Sk, BLOCK_N), B·Hkv): dK, dV of one key block, summed over the GROUP query heads that read it;
    DQ_ATOMIC: each head's dS K added into its rows of DQACC (laid out as the lse, times BLOCK_D)."""
    pid_n = tl.program_id(0)
    bhk = tl.program_id(1)
    b = bhk // Hkv
    hk = bhk % Hkv
    n0 = pid_n * BLOCK_N
    q_start, Sq = _seq(CU_Q, b, Sq, VARLEN)
    k_start, Sk = _seq(CU_K, b, Sk, VARLEN)
    if n0 >= Sk:
        return
    off = Sk - Sq
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (offs_n[:, None] < Sk) & (offs_d[None, :] < HEAD_DIM)
    rows = (k_start + offs_n[:, None]).to(tl.int64)
    k = tl.load(K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh + rows * skn + offs_d[None, :] * skd,
                mask=kv_mask, other=0.0)
    v = tl.load(V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh + rows * svn + offs_d[None, :] * svd,
                mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    lo, full_lo, full_hi, hi = _q_band(n0, Sq, Sk, off, LEFT, RIGHT, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    for g in range(GROUP):
        h = hk * GROUP + g
        q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + tl.cast(q_start, tl.int64) * sqm
        do_base = DO + b.to(tl.int64) * sdb + h.to(tl.int64) * sdh + tl.cast(q_start, tl.int64) * sdm
        lse_base = LSE + b.to(tl.int64) * slb + h.to(tl.int64) * slh + q_start
        delta_base = DELTA + b.to(tl.int64) * slb + h.to(tl.int64) * slh + q_start
        dq_base = DQACC + (b.to(tl.int64) * slb + h.to(tl.int64) * slh + q_start) * BLOCK_D
        dk, dv = _dkdv_steps(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, sqm, sqd, sdm, sdd,
                             offs_n, offs_d, lo, full_lo, Sq, Sk, off, LEFT, RIGHT, qk_scale, cap_in, cap_out,
                             BLOCK_M, BLOCK_D, HEAD_DIM, True, HAS_LEFT, HAS_RIGHT, SOFTCAP, DQ_ATOMIC, F32)
        dk, dv = _dkdv_steps(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, sqm, sqd, sdm, sdd,
                             offs_n, offs_d, full_lo, full_hi, Sq, Sk, off, LEFT, RIGHT, qk_scale, cap_in, cap_out,
                             BLOCK_M, BLOCK_D, HEAD_DIM, False, HAS_LEFT, HAS_RIGHT, SOFTCAP, DQ_ATOMIC, F32)
        dk, dv = _dkdv_steps(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, sqm, sqd, sdm, sdd,
                             offs_n, offs_d, full_hi, hi, Sq, Sk, off, LEFT, RIGHT, qk_scale, cap_in, cap_out,
                             BLOCK_M, BLOCK_D, HEAD_DIM, True, HAS_LEFT, HAS_RIGHT, SOFTCAP, DQ_ATOMIC, F32)
    dk *= scale
    tl.store(DK + b.to(tl.int64) * sdkb + hk.to(tl.int64) * sdkh + rows * sdkn + offs_d[None, :] * sdkd,
             dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + b.to(tl.int64) * sdvb + hk.to(tl.int64) * sdvh + rows * sdvn + offs_d[None, :] * sdvd,
             dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dq_steps(dq, q, do, lse, delta, k_base, v_base, skn, skd, svn, svd, offs_m, offs_d, start, stop,
              Sk, off, LEFT, RIGHT, qk_scale, cap_in, cap_out,
              BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, F32: tl.constexpr):
    """Step 3 for the resident query rows over key blocks [start, stop)."""
    offs_nb = tl.arange(0, BLOCK_N)
    d_ok = offs_d[None, :] < HEAD_DIM
    for n0 in range(start, stop, BLOCK_N):
        offs_n = n0 + offs_nb
        rows = offs_n[:, None].to(tl.int64)
        k_ptrs = k_base + rows * skn + offs_d[None, :] * skd
        v_ptrs = v_base + rows * svn + offs_d[None, :] * svd
        k = _load_tile(k_ptrs, offs_n[:, None] < Sk, d_ok, MASKED, BLOCK_D != HEAD_DIM)
        v = _load_tile(v_ptrs, offs_n[:, None] < Sk, d_ok, MASKED, BLOCK_D != HEAD_DIM)
        qk = _mm(q, tl.trans(k), None, F32)
        if SOFTCAP:
            t = _tanh(qk * cap_in)
            s = t * cap_out
        else:
            s = qk * qk_scale
        p = tl.math.exp2(s - lse[:, None])
        if MASKED:
            p = tl.where(_keep(offs_m, offs_n, Sk, off, LEFT, RIGHT, HAS_LEFT, HAS_RIGHT), p, 0.0)
        dp = _mm(do, tl.trans(v), None, F32)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = _mm(ds.to(k.dtype), k, dq, F32)                                  # 3. dQ += dS K (scale at the end)
    return dq


@triton.jit
def attention_bwd_dq_kernel(
        Q, K, V, DO, LSE, DELTA, DQ, CU_Q, CU_K,
        sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdm, sdd, sdqb, sdqh, sdqm, sdqd,
        slb, slh, H, GROUP, Sq, Sk, LEFT, RIGHT, scale, qk_scale, cap_in, cap_out,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, REVERSE: tl.constexpr,
        F32: tl.constexpr, VARLEN: tl.constexpr):
    """Grid (cdiv(Sq, BLOCK_M), B·H): dQ of one query block."""
    pid_m, b, h, hk = _query_program(H, GROUP, REVERSE)
    m0 = pid_m * BLOCK_M
    q_start, Sq = _seq(CU_Q, b, Sq, VARLEN)
    k_start, Sk = _seq(CU_K, b, Sk, VARLEN)
    if m0 >= Sq:
        return
    off = Sk - Sq
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    io_mask = (offs_m[:, None] < Sq) & (offs_d[None, :] < HEAD_DIM)
    rows = (q_start + offs_m[:, None]).to(tl.int64)
    q = tl.load(Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + rows * sqm + offs_d[None, :] * sqd,
                mask=io_mask, other=0.0)
    do = tl.load(DO + b.to(tl.int64) * sdb + h.to(tl.int64) * sdh + rows * sdm + offs_d[None, :] * sdd,
                 mask=io_mask, other=0.0)
    row_base = b.to(tl.int64) * slb + h.to(tl.int64) * slh + q_start
    lse = tl.load(LSE + row_base + offs_m, mask=offs_m < Sq, other=float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
    delta = tl.load(DELTA + row_base + offs_m, mask=offs_m < Sq, other=0.0)
    k_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh + tl.cast(k_start, tl.int64) * skn
    v_base = V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh + tl.cast(k_start, tl.int64) * svn
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo, full_lo, full_hi, hi = _band(m0, Sq, Sk, off, LEFT, RIGHT, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    dq = _dq_steps(dq, q, do, lse, delta, k_base, v_base, skn, skd, svn, svd, offs_m, offs_d, lo, full_lo, Sk,
                   off, LEFT, RIGHT, qk_scale, cap_in, cap_out, BLOCK_N, BLOCK_D, HEAD_DIM, True, HAS_LEFT,
                   HAS_RIGHT, SOFTCAP, F32)
    dq = _dq_steps(dq, q, do, lse, delta, k_base, v_base, skn, skd, svn, svd, offs_m, offs_d, full_lo, full_hi, Sk,
                   off, LEFT, RIGHT, qk_scale, cap_in, cap_out, BLOCK_N, BLOCK_D, HEAD_DIM, False, HAS_LEFT,
                   HAS_RIGHT, SOFTCAP, F32)
    dq = _dq_steps(dq, q, do, lse, delta, k_base, v_base, skn, skd, svn, svd, offs_m, offs_d, full_hi, hi, Sk,
                   off, LEFT, RIGHT, qk_scale, cap_in, cap_out, BLOCK_N, BLOCK_D, HEAD_DIM, True, HAS_LEFT,
                   HAS_RIGHT, SOFTCAP, F32)
    dq *= scale
    tl.store(DQ + b.to(tl.int64) * sdqb + h.to(tl.int64) * sdqh + rows * sdqm + offs_d[None, :] * sdqd,
             dq.to(DQ.dtype.element_ty), mask=io_mask)


@triton.jit
def attention_bwd_dq_cast_kernel(DQACC, DQ, CU_Q, sdqb, sdqh, sdqm, sdqd, slb, slh, H, Sq, scale,
                                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                                 VARLEN: tl.constexpr):
    """Grid (cdiv(Sq, BLOCK_M), B·H): dQ = scale · the fp32 rows DQ_ATOMIC accumulated, in dQ's dtype and strides."""
    pid_m, b, h, _ = _query_program(H, 1, False)
    q_start, Sq = _seq(CU_Q, b, Sq, VARLEN)
    if pid_m * BLOCK_M >= Sq:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_base = b.to(tl.int64) * slb + h.to(tl.int64) * slh + q_start
    acc = tl.load(DQACC + (row_base + offs_m[:, None]) * BLOCK_D + offs_d[None, :], mask=offs_m[:, None] < Sq,
                  other=0.0)
    rows = (q_start + offs_m[:, None]).to(tl.int64)
    tl.store(DQ + b.to(tl.int64) * sdqb + h.to(tl.int64) * sdqh + rows * sdqm + offs_d[None, :] * sdqd,
             (acc * scale).to(DQ.dtype.element_ty), mask=(offs_m[:, None] < Sq) & (offs_d[None, :] < HEAD_DIM))
