"""Cross-entropy kernels on the online normalizer state (m, d) (Milakov & Gimelshein, arXiv 1805.02867).

For a row of logits x (class dim last), target t, class weights w (1 without), smoothing ε, z-loss λ, softcap c:

    z_j  = c·tanh(x_j / c)                      (softcap; z = x without)
    m    = max_j z_j,  d = Σ_j e^(z_j − m),  lse = m + log d
    loss = (1−ε)·w_t·(lse − z_t) + (ε/V)·(W·lse − Σ_j w_j z_j)        W = Σ_j w_j   (+ λ·lse², added on the host)
    ∂loss/∂z_j = p_j·A − s·(ε/V)·w_j − [j = t]·s·(1−ε)·w_t,   p_j = e^(z_j − lse),
                 A = s·((1−ε)·w_t + (ε/V)·W) + 2λ·s_z·lse
    ∂loss/∂x_j = ∂loss/∂z_j · (1 − (z_j / c)²)

``s`` and ``s_z`` are the reduction's scale of the cross-entropy and z-loss terms (1/Σ w_t and 1/(valid rows) for
"mean", 1 otherwise), read from COEF = [s, s_z, W] so that the forward can write the final dlogits in the pass
that reads the logits: forward + backward then touch the logits twice (read x, write dx) instead of four times.

Kernels, readable one first:

* ``ce_row_kernel``: one program per row. ONE_BLOCK (the row fits one block): x is read once into registers,
  (m, d) taken, dx written from the same registers. Else two passes over the row in BLOCK-sized tiles: the first
  folds each tile's state into the running (m, d) by ⊕, the second re-reads the row (from L2 where it is still
  there: the first pass loads with evict_last, the second with evict_first) and writes dx.
* ``ce_coop_kernel``: a row over C programs (the GPU's path for V <= 32768): each holds a chunk in registers,
  publishes its (m_c, d_c), waits at the row barrier for the row's C states, merges them by ⊕ and writes dx from
  the same registers. Traffic: x read once, dx written once, for any V up to C·CHUNK.
* ``ce_coop_smem_kernel`` (``smem.py``, Gluon, sm_90): the coop scheme with each chunk held in shared memory by
  cp.async (and its first sub-tiles in registers): an SM holds up to 227 KB of the row in flight, not the ~128 KB
  its registers can. Traffic as the coop kernel's.
* ``ce_split_stats_kernel`` + ``ce_split_grad_kernel``: a row split over C programs (rows too few to fill the GPU,
  or too long). The first writes each chunk's partial state (m, d, Σ w·z); the second merges the C states by ⊕,
  re-reads its chunk and writes dx. Traffic: x read twice, dx written once.
* ``scale_rows_kernel``: the backward's dx *= dloss, one program per row, skipped (one word read) where
  dloss == 1, the usual case.
* ``ce_coef_kernel`` (before the loss kernel: COEF from the targets) and ``ce_loss_kernel`` (after it: the
  "mean" / "sum" scalar from the loss rows), one program each: two launches where torch ops took about twelve
  of host time. ``CERun`` binds a call's launches once (cached per problem and options by the caller).

All row offsets are 64-bit (row·stride passes 2^31 at 16K × 152K). DX may be X (the linear cross-entropy
overwrites each logits tile with its gradient): every element is read before the same program writes it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton.host import int_spec
from .._triton.launch import BoundKernel, cached, pow2, stream_scratch
from .._triton.online import _alpha, _exp, _merge_row, _row_barrier, _row_generation, _shift, _state
from .common import _ce_lse, _coefs, _grad_tile, _row_loss, _softcapped, _target_terms
from .plan import CEPlan
from .smem import ce_coop_smem_kernel

# ---- one program per row ----------------------------------------------------------------------------------


@triton.jit
def _fold_tile(X_row, W, start, cols, V, m, d, sz, softcap, EVICT: tl.constexpr, HAS_WEIGHT: tl.constexpr,
               HAS_SMOOTH: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FAST: tl.constexpr):
    """The tile of logits at ``start`` folded into the running (m, d) by ⊕ (and Σ w·z for smoothing): one read."""
    mask = start + cols < V
    x = tl.load(X_row + start + cols, mask=mask, other=0.0, eviction_policy=EVICT)
    z = tl.where(mask, _softcapped(x.to(tl.float32), softcap, HAS_SOFTCAP, FAST), float("-inf"))
    m_new = tl.maximum(m, tl.max(z, axis=0))
    d = d * _alpha(m, m_new) + tl.sum(_exp(z - _shift(m_new), FAST), axis=0)
    if HAS_SMOOTH:
        if HAS_WEIGHT:
            w = tl.load(W + start + cols, mask=mask, other=0.0).to(tl.float32)
            sz += tl.sum(w * tl.where(mask, z, 0.0), axis=0)
        else:
            sz += tl.sum(tl.where(mask, z, 0.0), axis=0)
    return m_new, d, sz


@triton.jit
def _grad_pass(X_row, DX_row, W, lo, hi, t, lse, A, s_ce, wt, eps, V, softcap, g_row, BLOCK: tl.constexpr,
               HAS_WEIGHT: tl.constexpr, HAS_SMOOTH: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_G: tl.constexpr,
               FAST: tl.constexpr):
    """dx of the classes [lo, hi) in BLOCK-sized tiles: each tile re-read (from L2 where it is still there) and
    its gradient written over DX (which may be X: a tile is read before it is written)."""
    cols = tl.arange(0, BLOCK)
    for start in range(lo, hi, BLOCK):
        mask = (start + cols < V) & (start + cols < hi)
        x = tl.load(X_row + start + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        z = _softcapped(x.to(tl.float32), softcap, HAS_SOFTCAP, FAST)
        if HAS_WEIGHT and HAS_SMOOTH:
            w = tl.load(W + start + cols, mask=mask, other=0.0).to(tl.float32)
        else:
            w = 1.0
        g = _grad_tile(_exp(z - lse, FAST), z, start + cols == t, w, A, s_ce, wt, eps, V, softcap, g_row,
                       HAS_SMOOTH, HAS_SOFTCAP, HAS_G)
        tl.store(DX_row + start + cols, g.to(DX_row.dtype.element_ty), mask=mask, eviction_policy="evict_first")


@triton.jit
def ce_row_kernel(X, stride_x, T, W, COEF, LOSS, LSE, DX, stride_dx, G, stride_g, V, ignore_index,
                  eps, z_loss, softcap,
                  BLOCK: tl.constexpr, ONE_BLOCK: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                  HAS_SMOOTH: tl.constexpr, HAS_Z: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                  NEED_GRAD: tl.constexpr, HAS_G: tl.constexpr, FAST: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    X_row = X + row * stride_x
    DX_row = DX + row * stride_dx
    cols = tl.arange(0, BLOCK)
    t = tl.load(T + row)
    if t == ignore_index:
        tl.store(LOSS + row, 0.0)
        tl.store(LSE + row, 0.0)
        if NEED_GRAD:                             # ignored rows: dx = 0, written, never read
            for start in range(0, V, BLOCK):
                tl.store(DX_row + start + cols, tl.zeros([BLOCK], DX.dtype.element_ty), mask=start + cols < V)
    else:
        zt, wt = _target_terms(X_row, W, t, V, softcap, ignore_index, HAS_WEIGHT, HAS_SOFTCAP, FAST)
        g_row = 1.0
        if HAS_G:
            g_row = tl.load(G + row * stride_g).to(tl.float32)
        if ONE_BLOCK:
            # 1. read the row once (V·bytes), keep it in registers
            mask = cols < V
            z = _softcapped(tl.load(X_row + cols, mask=mask, other=0.0).to(tl.float32), softcap, HAS_SOFTCAP, FAST)
            z = tl.where(mask, z, float("-inf"))
            # 2. (m, d) of the row; lse = m + log d
            m = tl.max(z, axis=0)
            d = tl.sum(_exp(z - _shift(m), FAST), axis=0)
            lse = _ce_lse(m, d)
            sz = 0.0
            if HAS_SMOOTH:
                if HAS_WEIGHT:
                    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
                else:
                    w = tl.where(mask, 1.0, 0.0)
                sz = tl.sum(w * tl.where(mask, z, 0.0), axis=0)
            else:
                w = 0.0
            s_ce, A, Wsum = _coefs(COEF, lse, wt, eps, V, z_loss, HAS_SMOOTH, HAS_Z)
            tl.store(LOSS + row, _row_loss(lse, zt, wt, sz, Wsum, eps, V, HAS_SMOOTH))
            tl.store(LSE + row, lse)
            # 3. dx from the same registers (V·bytes written)
            if NEED_GRAD:
                g = _grad_tile(_exp(z - lse, FAST), z, cols == t, w, A, s_ce, wt, eps, V, softcap, g_row,
                               HAS_SMOOTH, HAS_SOFTCAP, HAS_G)
                tl.store(DX_row + cols, g.to(DX.dtype.element_ty), mask=mask)
        else:
            # 1. [online softmax] first pass: tile states folded into the running (m, d) by ⊕ (V·bytes read)
            m = float("-inf")
            d = 0.0
            sz = 0.0
            for start in range(0, V, BLOCK):
                m, d, sz = _fold_tile(X_row, W, start, cols, V, m, d, sz, softcap, "evict_last", HAS_WEIGHT,
                                      HAS_SMOOTH, HAS_SOFTCAP, FAST)
            lse = _ce_lse(m, d)
            s_ce, A, Wsum = _coefs(COEF, lse, wt, eps, V, z_loss, HAS_SMOOTH, HAS_Z)
            tl.store(LOSS + row, _row_loss(lse, zt, wt, sz, Wsum, eps, V, HAS_SMOOTH))
            tl.store(LSE + row, lse)
            # 2. second pass: re-read (from L2 where the row is still there), write dx (V·bytes read + written)
            if NEED_GRAD:
                _grad_pass(X_row, DX_row, W, 0, V, t, lse, A, s_ce, wt, eps, V, softcap, g_row, BLOCK, HAS_WEIGHT,
                           HAS_SMOOTH, HAS_SOFTCAP, HAS_G, FAST)


# ---- a row split over C programs --------------------------------------------------------------------------


@triton.jit
def ce_split_stats_kernel(X, stride_x, T, W, PM, PD, PS, V, ignore_index, softcap,
                          C: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                          HAS_SMOOTH: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FAST: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    t = tl.load(T + row)
    if t != ignore_index:                         # ignored rows: nothing read
        X_row = X + row * stride_x
        cols = tl.arange(0, BLOCK)
        m = float("-inf")
        d = 0.0
        sz = 0.0
        # 1. the chunk's state (m_c, d_c) (and Σ w·z for smoothing): CHUNK·bytes read
        for start in range(c * CHUNK, c * CHUNK + CHUNK, BLOCK):
            m, d, sz = _fold_tile(X_row, W, start, cols, V, m, d, sz, softcap, "", HAS_WEIGHT, HAS_SMOOTH,
                                  HAS_SOFTCAP, FAST)
        tl.store(PM + row * C + c, m)
        tl.store(PD + row * C + c, d)
        tl.store(PS + row * C + c, sz)


@triton.jit
def ce_split_grad_kernel(X, stride_x, T, W, COEF, PM, PD, PS, LOSS, LSE, DX, stride_dx, G, stride_g, V,
                         ignore_index, eps, z_loss, softcap,
                         C: tl.constexpr, CP: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                         HAS_WEIGHT: tl.constexpr, HAS_SMOOTH: tl.constexpr, HAS_Z: tl.constexpr,
                         HAS_SOFTCAP: tl.constexpr, NEED_GRAD: tl.constexpr, HAS_G: tl.constexpr,
                         FAST: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    t = tl.load(T + row)
    X_row = X + row * stride_x
    DX_row = DX + row * stride_dx
    cols = tl.arange(0, BLOCK)
    if t == ignore_index:
        if c == 0:
            tl.store(LOSS + row, 0.0)
            tl.store(LSE + row, 0.0)
        if NEED_GRAD:
            for start in range(c * CHUNK, c * CHUNK + CHUNK, BLOCK):
                tl.store(DX_row + start + cols, tl.zeros([BLOCK], DX.dtype.element_ty), mask=start + cols < V)
    else:
        # 2. ⊕ of the C chunk states: (m, d) of the row, lse = m + log d (3·C words read per program)
        k = tl.arange(0, CP)
        pm = tl.load(PM + row * C + k, mask=k < C, other=float("-inf"))
        pd = tl.load(PD + row * C + k, mask=k < C, other=0.0)
        m = tl.max(pm, axis=0)
        d = tl.sum(pd * _alpha(pm, m), axis=0)
        lse = _ce_lse(m, d)
        zt, wt = _target_terms(X_row, W, t, V, softcap, ignore_index, HAS_WEIGHT, HAS_SOFTCAP, FAST)
        s_ce, A, Wsum = _coefs(COEF, lse, wt, eps, V, z_loss, HAS_SMOOTH, HAS_Z)
        if c == 0:
            sz = 0.0
            if HAS_SMOOTH:
                sz = tl.sum(tl.load(PS + row * C + k, mask=k < C, other=0.0), axis=0)
            tl.store(LOSS + row, _row_loss(lse, zt, wt, sz, Wsum, eps, V, HAS_SMOOTH))
            tl.store(LSE + row, lse)
        # 3. re-read the chunk, write dx (CHUNK·bytes read + written)
        if NEED_GRAD:
            g_row = 1.0
            if HAS_G:
                g_row = tl.load(G + row * stride_g).to(tl.float32)
            _grad_pass(X_row, DX_row, W, c * CHUNK, c * CHUNK + CHUNK, t, lse, A, s_ce, wt, eps, V, softcap, g_row,
                       BLOCK, HAS_WEIGHT, HAS_SMOOTH, HAS_SOFTCAP, HAS_G, FAST)


# ---- a row over C programs that wait for each other -------------------------------------------------------


@triton.jit
def ce_coop_kernel(X, stride_x, T, W, COEF, LOSS, LSE, DX, stride_dx, G, stride_g, PART_M, PART_D, PART_S,
                   ARRIVE, GEN, V, ignore_index, eps, z_loss, softcap, C,
                   CHUNK: tl.constexpr, CP: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_SMOOTH: tl.constexpr,
                   HAS_Z: tl.constexpr, HAS_SOFTCAP: tl.constexpr, NEED_GRAD: tl.constexpr, HAS_G: tl.constexpr,
                   FAST: tl.constexpr):
    """Program ``pid`` holds chunk ``pid % C`` of row ``pid // C`` in registers: the logits are read once and dx
    written from the same registers, the row's C states meeting at a row barrier (all C programs resident: C is at
    most one per SM). Traffic: x read once, dx written once — the floor of a fused forward + backward."""
    pid = tl.program_id(0)
    row = pid // C
    c = pid % C
    t = tl.load(T + row)
    X_row = X + row.to(tl.int64) * stride_x
    DX_row = DX + row.to(tl.int64) * stride_dx
    cols = c * CHUNK + tl.arange(0, CHUNK)
    mask = cols < V
    if t == ignore_index:                         # the row's C programs all skip the barrier
        if c == 0:
            tl.store(LOSS + row, 0.0)
            tl.store(LSE + row, 0.0)
        if NEED_GRAD:
            tl.store(DX_row + cols, tl.zeros([CHUNK], DX.dtype.element_ty), mask=mask)
    else:
        # 1. read the chunk (CHUNK·bytes), keep z in registers; the chunk's state (m_c, d_c), e = e^(z − m_c)
        x = tl.load(X_row + cols, mask=mask, other=0.0)
        gen = _row_generation(GEN, row)                                  # (its round trip overlaps x's)
        z = tl.where(mask, _softcapped(x.to(tl.float32), softcap, HAS_SOFTCAP, FAST), float("-inf"))
        m_c, d_c, e = _state(z, 0, FAST)
        # (z_t, w_t) read before the barrier: past it another program of the row may overwrite x_t (DX may be X)
        zt, wt = _target_terms(X_row, W, t, V, softcap, ignore_index, HAS_WEIGHT, HAS_SOFTCAP, FAST)
        if HAS_WEIGHT and HAS_SMOOTH:
            w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        else:
            w = tl.where(mask, 1.0, 0.0)
        # 2. publish (m_c, d_c) (and Σ w·z for smoothing), wait for the row's C chunks
        tl.store(PART_M + pid, m_c)
        tl.store(PART_D + pid, d_c)
        if HAS_SMOOTH:
            tl.store(PART_S + pid, tl.sum(w * tl.where(mask, z, 0.0), axis=0))
        tl.debug_barrier()
        _row_barrier(ARRIVE, GEN, row, C, gen)
        # 3. (m, d) = ⊕_c (m_c, d_c), lse = m + log d
        k = tl.arange(0, CP)
        m, d = _merge_row(PART_M, PART_D, row, C, k)
        lse = _ce_lse(m, d)
        s_ce, A, Wsum = _coefs(COEF, lse, wt, eps, V, z_loss, HAS_SMOOTH, HAS_Z)
        # 4. chunk 0 writes the row's loss and lse
        if c == 0:
            sz = 0.0
            if HAS_SMOOTH:
                sz = tl.sum(tl.load(PART_S + row * C + k, mask=k < C, other=0.0, volatile=True), axis=0)
            tl.store(LOSS + row, _row_loss(lse, zt, wt, sz, Wsum, eps, V, HAS_SMOOTH))
            tl.store(LSE + row, lse)
        # 5. dx from the registers (CHUNK·bytes written): p_j = e_j · e^(m_c − lse), no second exponential
        if NEED_GRAD:
            g_row = 1.0
            if HAS_G:
                g_row = tl.load(G + row.to(tl.int64) * stride_g).to(tl.float32)
            p = e * tl.exp(_shift(m_c) - lse)
            g = _grad_tile(p, z, cols == t, w, A, s_ce, wt, eps, V, softcap, g_row, HAS_SMOOTH, HAS_SOFTCAP, HAS_G)
            tl.store(DX_row + cols, g.to(DX.dtype.element_ty), mask=mask)


# ---- the backward's scale ---------------------------------------------------------------------------------


@triton.jit
def scale_rows_kernel(DX, stride_dx, G, stride_g, V, BLOCK: tl.constexpr):
    """dx[row] *= g[row · stride_g] (stride_g = 0: one scalar), one program per row. Where g == 1 nothing is read
    or written: the program loads one word and ends."""
    row = tl.program_id(0).to(tl.int64)
    g = tl.load(G + row * stride_g).to(tl.float32)
    if g != 1.0:
        cols = tl.arange(0, BLOCK)
        for start in range(0, V, BLOCK):
            ptr = DX + row * stride_dx + start + cols
            mask = start + cols < V
            dx = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
            tl.store(ptr, (dx * g).to(DX.dtype.element_ty), mask=mask)


# ---- the reduction's coefficients (before the loss kernel) and the scalar loss (after it) --------------------


@triton.jit
def ce_coef_kernel(T, W, COEF, N, V, ignore_index, MEAN: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                   BLOCK: tl.constexpr):
    """COEF = [s, s_z, W], one program: "mean" s = 1 / Σ_kept w_t, s_z = 1 / (kept rows); else s = s_z = 1;
    W = Σ_j w_j (V without weights). N targets read (8 bytes each), V weights with HAS_WEIGHT."""
    offs = tl.arange(0, BLOCK)
    kept = tl.zeros([BLOCK], tl.int32)
    wt = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N, BLOCK):
        t = tl.load(T + start + offs, mask=start + offs < N, other=ignore_index)
        ok = t != ignore_index
        kept += ok.to(tl.int32)
        if HAS_WEIGHT:
            tc = tl.minimum(tl.maximum(t, 0), V - 1)
            wt += tl.load(W + tc, mask=ok, other=0.0)
    Wsum = tl.cast(V, tl.float32)
    if HAS_WEIGHT:
        wv = tl.zeros([BLOCK], tl.float32)
        for start in range(0, V, BLOCK):
            wv += tl.load(W + start + offs, mask=start + offs < V, other=0.0)
        Wsum = tl.sum(wv, axis=0)
    if MEAN:
        n_kept = tl.sum(kept, axis=0).to(tl.float32)
        denom = n_kept
        if HAS_WEIGHT:
            denom = tl.sum(wt, axis=0)
        tl.store(COEF, tl.math.div_rn(1.0, denom))          # IEEE 1 / n, as torch's reciprocal
        tl.store(COEF + 1, tl.math.div_rn(1.0, n_kept))
    else:
        tl.store(COEF, 1.0)
        tl.store(COEF + 1, 1.0)
    tl.store(COEF + 2, Wsum)


@triton.jit
def ce_loss_kernel(LOSS, LSE, COEF, OUT, N, z_loss, MEAN: tl.constexpr, HAS_Z: tl.constexpr, BLOCK: tl.constexpr):
    """OUT = s·Σ_rows loss + λ·s_z·Σ_rows lse² ("mean"; s = s_z = 1 for "sum"), one program (ignored rows hold 0)."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    acc_z = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N, BLOCK):
        mask = start + offs < N
        acc += tl.load(LOSS + start + offs, mask=mask, other=0.0)
        if HAS_Z:
            lse = tl.load(LSE + start + offs, mask=mask, other=0.0)
            acc_z += lse * lse
    total = tl.sum(acc, axis=0)
    if MEAN:
        total = total * tl.load(COEF)
    if HAS_Z:
        zl = z_loss * tl.sum(acc_z, axis=0)
        if MEAN:
            zl = zl * tl.load(COEF + 1)
        total += zl
    tl.store(OUT, total)


# ---- host launchers ---------------------------------------------------------------------------------------

COEF_BLOCK = 1024            # targets (rows) per step of the one-program coefficient (loss) kernel


def _flags(has_weight, has_smooth, has_z, has_softcap, need_grad, has_g, fast) -> tuple:
    return (("HAS_WEIGHT", has_weight), ("HAS_SMOOTH", has_smooth), ("HAS_Z", has_z), ("HAS_SOFTCAP", has_softcap),
            ("NEED_GRAD", need_grad), ("HAS_G", has_g), ("FAST", int(fast)))


def _smem_bound(plan: CEPlan, n_rows: int, f: dict, V: int, itemsize: int, bf16: bool) -> BoundKernel:
    del f["FAST"]                                 # the Gluon kernel's exponentials are all ex2.approx
    keep_e = plan.keep_e and not f["HAS_SOFTCAP"]  # softcap's derivative needs z_j
    meta = dict(CHUNK=plan.chunk, VEC=16 // itemsize, WARPS=plan.num_warps, C_POW2=pow2(plan.chunks),
                EVEN=V % plan.chunk == 0, REG=plan.reg, WORDS=bool(plan.reg) and bf16, KEEP_E=keep_e,
                num_warps=plan.num_warps, **f)
    if plan.maxnreg and not f["HAS_WEIGHT"]:     # weighted smoothing / softcap spill under the bound (sm_90a)
        meta["maxnreg"] = plan.maxnreg
    return BoundKernel(ce_coop_smem_kernel, (n_rows * plan.chunks,), meta)


class RowsLaunch:
    """The plan's kernel(s) over ``n_rows`` rows of V classes, bound once per (plan, rows, flags, integer
    specialisation, logit dtype). ``layout`` / ``zeroed``: the :func:`stream_scratch` views ``run`` takes as ``ws``,
    (ARRIVE, GEN, PART_M, PART_D, PART_S): the row barrier's words (zero-initialised) and the chunks' partial states
    (empty where the path has none)."""

    __slots__ = ("path", "launches", "layout", "zeroed", "V", "chunks")

    def __init__(self, plan: CEPlan, n_rows: int, V: int, flags: tuple, spec: tuple, itemsize: int, bf16: bool):
        f = dict(flags)
        C, f32 = plan.chunks, torch.float32
        self.path, self.V, self.chunks = plan.path, V, C
        words = 0 if plan.path in ("row", "split") else max(n_rows, 1024)
        parts = 0 if plan.path == "row" else n_rows * C
        self.layout = ((words, torch.int32), (words, torch.int32), (parts, f32), (parts, f32), (parts, f32))
        self.zeroed = 2 if words else 0
        if plan.path == "row":
            self.launches = (BoundKernel(ce_row_kernel, (n_rows,), dict(BLOCK=plan.block, ONE_BLOCK=plan.one_block,
                                                                        num_warps=plan.num_warps, **f)),)
        elif plan.path == "split":
            stats = BoundKernel(ce_split_stats_kernel, (n_rows, C),
                                dict(C=C, CHUNK=plan.chunk, BLOCK=plan.block, num_warps=plan.num_warps,
                                     **{k: f[k] for k in ("HAS_WEIGHT", "HAS_SMOOTH", "HAS_SOFTCAP", "FAST")}))
            grad = BoundKernel(ce_split_grad_kernel, (n_rows, C if f["NEED_GRAD"] else 1),
                               dict(C=C, CP=max(2, triton.next_power_of_2(C)), CHUNK=plan.chunk, BLOCK=plan.block,
                                    num_warps=plan.num_warps, **f))
            self.launches = (stats, grad)
        elif plan.path == "coop":
            self.launches = (BoundKernel(ce_coop_kernel, (n_rows * C,),
                                         dict(CHUNK=plan.chunk, CP=max(2, triton.next_power_of_2(C)),
                                              num_warps=plan.num_warps, **f)),)
        else:
            self.launches = (_smem_bound(plan, n_rows, f, V, itemsize, bf16),)

    def run(self, x, t, w, coef, loss, lse, dx, stride_dx, g, stride_g, ignore_index, eps, z_loss, cap, ws):
        """Launch on x's device: ``w``, ``dx``, ``g`` are tensors (dummies where absent), the scalars floats."""
        V, dev, check = self.V, x.device, (x, t, w, dx, g)
        if self.path == "row":
            self.launches[0]((x, x.stride(0), t, w, coef, loss, lse, dx, stride_dx, g, stride_g, V, ignore_index, eps,
                              z_loss, cap), check, dev)
            return
        arrive, gen, pm, pd, ps = ws
        if self.path == "split":
            stats, grad = self.launches
            stats((x, x.stride(0), t, w, pm, pd, ps, V, ignore_index, cap), check[:3], dev)
            grad((x, x.stride(0), t, w, coef, pm, pd, ps, loss, lse, dx, stride_dx, g, stride_g, V, ignore_index, eps,
                  z_loss, cap), check, dev)
            return
        self.launches[0]((x, x.stride(0), t, w, coef, loss, lse, dx, stride_dx, g, stride_g, pm, pd, ps, arrive, gen,
                          V, ignore_index, eps, z_loss, cap, self.chunks), check, dev)


@cached
def _rows_launch(plan: CEPlan, n_rows: int, V: int, flags: tuple, spec: tuple, itemsize: int,
                 bf16: bool) -> RowsLaunch:
    return RowsLaunch(plan, n_rows, V, flags, spec, itemsize, bf16)


def ce_rows(plan: CEPlan, x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, coef: torch.Tensor,
            loss: torch.Tensor, lse: torch.Tensor, dx: torch.Tensor | None, g: torch.Tensor | None,
            ignore_index: int, eps: float, z_loss: float, softcap: float | None) -> None:
    """Per-row loss (cross-entropy part) and lse of the [N, V] logits ``x`` (last stride 1) into ``loss``, ``lse``
    (fp32 [N]); with ``dx`` (may be ``x``) the gradient too, scaled by ``coef`` and by ``g`` (per row) if given."""
    N, V = x.shape
    if N == 0:
        return
    dummy = loss
    flags = _flags(weight is not None, eps > 0, z_loss > 0, softcap is not None, dx is not None, g is not None,
                   plan.fast_exp)
    stride_dx = dx.stride(0) if dx is not None else 0
    stride_g = g.stride(0) if g is not None and g.dim() else 0
    # one plan serves rows of many lengths and strides: a variant compiled for a 16-divisible row stride, replayed
    # for rows of 50257, is a misaligned access
    spec = int_spec(x.stride(0), stride_dx, stride_g, V, ignore_index)
    rows = _rows_launch(plan, N, V, flags, spec, x.element_size(), x.dtype == torch.bfloat16)
    rows.run(x, target, weight if weight is not None else dummy, coef, loss, lse, dx if dx is not None else dummy,
             stride_dx, g if g is not None else dummy, stride_g, ignore_index, float(eps), float(z_loss),
             float(softcap) if softcap is not None else 1.0, stream_scratch("ce-rows", x.device, rows.layout,
                                                                             rows.zeroed))


@cached
def _bound_coef(mean: bool, has_weight: bool, spec: tuple) -> BoundKernel:
    return BoundKernel(ce_coef_kernel, (1,), dict(MEAN=mean, HAS_WEIGHT=has_weight, BLOCK=COEF_BLOCK, num_warps=4))


@cached
def _bound_loss(mean: bool, has_z: bool, spec: tuple) -> BoundKernel:
    return BoundKernel(ce_loss_kernel, (1,), dict(MEAN=mean, HAS_Z=has_z, BLOCK=COEF_BLOCK, num_warps=4))


def ce_coefs(t: torch.Tensor, weight: torch.Tensor | None, ignore_index: int, reduction: str, V: int,
             coef: torch.Tensor) -> None:
    """``coef`` (fp32 [3]) = [s, s_z, W] for the [N] targets ``t``: one launch of ``ce_coef_kernel``."""
    w = weight if weight is not None else coef
    _bound_coef(reduction == "mean", weight is not None, int_spec(t.shape[0], V, ignore_index))(
        (t, w, coef, t.shape[0], V, ignore_index), (t, w, coef), t.device)


def ce_total_loss(loss_rows: torch.Tensor, lse: torch.Tensor, coef: torch.Tensor, z_loss: float, reduction: str,
                  out: torch.Tensor) -> None:
    """``out`` (fp32 scalar) = the "mean" / "sum" loss from the per-row losses and lse: one launch."""
    _bound_loss(reduction == "mean", z_loss > 0, int_spec(loss_rows.shape[0]))(
        (loss_rows, lse, coef, out, loss_rows.shape[0], float(z_loss)), (loss_rows, lse, coef, out),
        loss_rows.device)


@cached
def _bound_scale(n_rows: int, block: int, spec: tuple) -> BoundKernel:
    return BoundKernel(scale_rows_kernel, (n_rows,), dict(BLOCK=block, num_warps=8))


def _scale_block(V: int) -> int:
    return min(4096, triton.next_power_of_2(V))


def scale_rows_(t: torch.Tensor, g: torch.Tensor) -> None:
    """``t.view(-1, t.shape[-1]) *= g`` in place, g a scalar or one value per row; nothing moves where g == 1."""
    if t.numel() == 0:
        return
    t2 = t.view(-1, t.shape[-1]) if t.dim() != 2 else t
    rows, V = t2.shape
    g = g.reshape(-1)
    stride_g = 0 if g.numel() == 1 else g.stride(0)
    _bound_scale(rows, _scale_block(V), int_spec(t2.stride(0), stride_g, V))((t2, t2.stride(0), g, stride_g, V),
                                                                              (t2, g), t2.device)


class CERun:
    """One eager cross-entropy call over [N, V] logits, bound once per (problem, options, plan): the caller caches
    it. Per call: ``ce_coef_kernel`` writes COEF = [s, s_z, W], the plan's kernel(s) the loss rows, lse and dx, and
    under "mean" / "sum" ``ce_loss_kernel`` the scalar loss; COEF, the loss rows and lse share one
    :func:`stream_scratch` with the plan's workspace. Three launches and two allocations (dx, the loss), where torch
    ops for the coefficients and the reduction took about fifteen launches of host time."""

    __slots__ = ("N", "V", "rows", "coef", "total", "scale", "layout", "zeroed", "reduction", "ignore_index", "eps",
                 "z_loss", "cap", "need_grad")

    def __init__(self, plan: CEPlan, N: int, V: int, dtype: torch.dtype, stride_x: int, has_weight: bool,
                 reduction: str, ignore_index: int, eps: float, z_loss: float, softcap: float | None,
                 need_grad: bool):
        self.N, self.V, self.reduction, self.need_grad = N, V, reduction, need_grad
        self.ignore_index, self.eps, self.z_loss = ignore_index, float(eps), float(z_loss)
        self.cap = float(softcap) if softcap is not None else 1.0
        flags = _flags(has_weight, eps > 0, z_loss > 0, softcap is not None, need_grad, False, plan.fast_exp)
        stride_dx = V if need_grad else 0             # dx is allocated contiguous
        self.rows = _rows_launch(plan, N, V, flags, int_spec(stride_x, stride_dx, 0, V, ignore_index),
                                 dtype.itemsize, dtype == torch.bfloat16)
        self.coef = _bound_coef(reduction == "mean", has_weight, int_spec(N, V, ignore_index))
        self.total = _bound_loss(reduction == "mean", z_loss > 0, int_spec(N)) if reduction != "none" else None
        self.scale = _bound_scale(N, _scale_block(V), int_spec(V, 0, V)) if need_grad else None
        f32 = torch.float32
        self.layout = self.rows.layout + ((4, f32), (N, f32), (N, f32))
        self.zeroed = self.rows.zeroed

    def __call__(self, x: torch.Tensor, t: torch.Tensor, w: torch.Tensor | None):
        """``(loss, dx)`` of [N, V] logits ``x`` (last stride 1), contiguous [N] int64 ``t``, fp32 contiguous [V]
        ``w`` or None: the fp32 loss (a scalar, [N] under "none") and the contiguous [N, V] dx (None without a
        gradient)."""
        N, V, dev = self.N, self.V, x.device
        arrive, gen, pm, pd, ps, coef, rows, lse = stream_scratch("ce-call", dev, self.layout, self.zeroed)
        w_ = coef if w is None else w
        self.coef((t, w_, coef, N, V, self.ignore_index), (t, w_, coef), dev)
        if self.reduction == "none":
            rows = torch.empty(N, dtype=torch.float32, device=dev)
        dx = torch.empty((N, V), dtype=x.dtype, device=dev) if self.need_grad else None
        self.rows.run(x, t, w_, coef, rows, lse, rows if dx is None else dx, 0 if dx is None else V, rows, 0,
                      self.ignore_index, self.eps, self.z_loss, self.cap, (arrive, gen, pm, pd, ps))
        if self.total is None:                      # (scratch views may be longer than N)
            return (rows + self.z_loss * lse[:N] * lse[:N] if self.z_loss else rows), dx
        loss = torch.empty((), dtype=torch.float32, device=dev)
        self.total((rows, lse, coef, loss, N, self.z_loss), (rows, lse, coef, loss), dev)
        return loss, dx

    def scale_(self, dx: torch.Tensor, g: torch.Tensor) -> None:
        """The backward: ``dx *= g`` (the loss's incoming gradient) in place; nothing moves where g == 1."""
        if g.dim() == 0 and g.dtype == torch.float32:
            self.scale((dx, self.V, g, 0, self.V), (dx, g), dx.device)
        else:
            scale_rows_(dx, g.float())
