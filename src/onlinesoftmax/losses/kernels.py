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

All row offsets are 64-bit (row·stride passes 2^31 at 16K × 152K). DX may be X (the linear cross-entropy
overwrites each logits tile with its gradient): every element is read before the same program writes it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton.host import int_spec
from .._triton.launch import BoundKernel, cached, pow2, stream_scratch
from .._triton.online import _alpha, _exp, _lse, _merge_row, _row_barrier, _row_generation, _shift, _state
from .common import _coefs, _grad_tile, _row_loss, _softcapped, _target_terms
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
            lse = _lse(m, d)
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
            lse = _lse(m, d)
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
        lse = _lse(m, d)
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
        lse = _lse(m, d)
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


# ---- host launchers ---------------------------------------------------------------------------------------


def _flags(plan: CEPlan, has_weight, has_smooth, has_z, has_softcap, need_grad, has_g):
    return dict(HAS_WEIGHT=has_weight, HAS_SMOOTH=has_smooth, HAS_Z=has_z, HAS_SOFTCAP=has_softcap,
                NEED_GRAD=need_grad, HAS_G=has_g, FAST=int(plan.fast_exp))


@cached
def _bound_row(plan: CEPlan, n_rows: int, flags: tuple, spec: tuple) -> BoundKernel:
    return BoundKernel(ce_row_kernel, (n_rows,),
                       dict(BLOCK=plan.block, ONE_BLOCK=plan.one_block, num_warps=plan.num_warps, **dict(flags)))


@cached
def _bound_split(plan: CEPlan, n_rows: int, flags: tuple, spec: tuple) -> tuple[BoundKernel, BoundKernel]:
    f = dict(flags)
    C, chunk = plan.chunks, plan.chunk
    stats = BoundKernel(ce_split_stats_kernel, (n_rows, C),
                        dict(C=C, CHUNK=chunk, BLOCK=plan.block, num_warps=plan.num_warps,
                             **{k: f[k] for k in ("HAS_WEIGHT", "HAS_SMOOTH", "HAS_SOFTCAP", "FAST")}))
    grad = BoundKernel(ce_split_grad_kernel, (n_rows, C if f["NEED_GRAD"] else 1),
                       dict(C=C, CP=max(2, triton.next_power_of_2(C)), CHUNK=chunk, BLOCK=plan.block,
                            num_warps=plan.num_warps, **f))
    return stats, grad


@cached
def _bound_coop(plan: CEPlan, n_rows: int, flags: tuple, spec: tuple) -> BoundKernel:
    return BoundKernel(ce_coop_kernel, (n_rows * plan.chunks,),
                       dict(CHUNK=plan.chunk, CP=max(2, triton.next_power_of_2(plan.chunks)), num_warps=plan.num_warps,
                            **dict(flags)))


@cached
def _bound_smem(plan: CEPlan, n_rows: int, flags: tuple, spec: tuple, itemsize: int, words: bool,
                even: bool) -> BoundKernel:
    f = dict(flags)
    del f["FAST"]                                 # the Gluon kernel's exponentials are all ex2.approx
    keep_e = plan.keep_e and not f["HAS_SOFTCAP"]  # softcap's derivative needs z_j
    meta = dict(CHUNK=plan.chunk, VEC=16 // itemsize, WARPS=plan.num_warps, C_POW2=pow2(plan.chunks), EVEN=even,
                REG=plan.reg, WORDS=words, KEEP_E=keep_e, num_warps=plan.num_warps, **f)
    if plan.maxnreg and not f["HAS_WEIGHT"]:     # weighted smoothing / softcap spill under the bound (sm_90a)
        meta["maxnreg"] = plan.maxnreg
    return BoundKernel(ce_coop_smem_kernel, (n_rows * plan.chunks,), meta)


def ce_rows(plan: CEPlan, x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, coef: torch.Tensor,
            loss: torch.Tensor, lse: torch.Tensor, dx: torch.Tensor | None, g: torch.Tensor | None,
            ignore_index: int, eps: float, z_loss: float, softcap: float | None) -> None:
    """Per-row loss (cross-entropy part) and lse of the [N, V] logits ``x`` (last stride 1) into ``loss``, ``lse``
    (fp32 [N]); with ``dx`` (may be ``x``) the gradient too, scaled by ``coef`` and by ``g`` (per row) if given."""
    N, V = x.shape
    if N == 0:
        return
    dummy = loss
    flags = tuple(_flags(plan, weight is not None, eps > 0, z_loss > 0, softcap is not None, dx is not None,
                         g is not None).items())
    w_ = weight if weight is not None else dummy
    dx_ = dx if dx is not None else dummy
    g_ = g if g is not None else dummy
    stride_dx = dx.stride(0) if dx is not None else 0
    stride_g = g.stride(0) if g is not None and g.dim() else 0
    cap = float(softcap) if softcap is not None else 1.0
    check = (x, target, w_, dx_, g_)
    # one plan serves rows of many lengths and strides: a variant compiled for a 16-divisible row stride, replayed
    # for rows of 50257, is a misaligned access
    spec = int_spec(x.stride(0), stride_dx, stride_g, V, ignore_index)
    if plan.path == "row":
        _bound_row(plan, N, flags, spec)((x, x.stride(0), target, w_, coef, loss, lse, dx_, stride_dx, g_, stride_g, V,
                                    ignore_index, float(eps), float(z_loss), cap), check, x.device)
        return
    if plan.path in ("coop", "smem"):
        C = plan.chunks
        arrive, gen, pm, pd, ps = stream_scratch("ce-coop", x.device, ((max(N, 1024), torch.int32),
                                                 (max(N, 1024), torch.int32), (N * C, torch.float32),
                                                 (N * C, torch.float32), (N * C, torch.float32)), zeroed=2)
        if plan.path == "smem":
            bound = _bound_smem(plan, N, flags, spec, x.element_size(), bool(plan.reg) and x.dtype == torch.bfloat16,
                                V % plan.chunk == 0)
        else:
            bound = _bound_coop(plan, N, flags, spec)
        bound((x, x.stride(0), target, w_, coef, loss, lse, dx_, stride_dx, g_, stride_g, pm, pd, ps, arrive, gen, V,
               ignore_index, float(eps), float(z_loss), cap, C), check, x.device)
        return
    stats, grad = _bound_split(plan, N, flags, spec)
    C = plan.chunks
    ws = torch.empty(3, N * C, dtype=torch.float32, device=x.device)
    pm, pd, ps = ws[0], ws[1], ws[2]
    stats((x, x.stride(0), target, w_, pm, pd, ps, V, ignore_index, cap), check[:3], x.device)
    grad((x, x.stride(0), target, w_, coef, pm, pd, ps, loss, lse, dx_, stride_dx, g_, stride_g, V, ignore_index,
          float(eps), float(z_loss), cap), check, x.device)


@cached
def _bound_scale(n_rows: int, block: int, spec: tuple) -> BoundKernel:
    return BoundKernel(scale_rows_kernel, (n_rows,), dict(BLOCK=block, num_warps=8))


def scale_rows_(t: torch.Tensor, g: torch.Tensor) -> None:
    """``t.view(-1, t.shape[-1]) *= g`` in place, g a scalar or one value per row; nothing moves where g == 1."""
    if t.numel() == 0:
        return
    t2 = t.view(-1, t.shape[-1]) if t.dim() != 2 else t
    rows, V = t2.shape
    block = min(4096, triton.next_power_of_2(V))
    g = g.reshape(-1)
    stride_g = 0 if g.numel() == 1 else g.stride(0)
    _bound_scale(rows, block, int_spec(t2.stride(0), stride_g, V))((t2, t2.stride(0), g, stride_g, V), (t2, g),
                                                                    t2.device)
