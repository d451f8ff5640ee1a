"""Cross-entropy forward with its gradient, a row's chunk held in shared memory (Gluon, ``cp.async``; sm_90 only):
``ce_coop_smem_kernel``. The softmax family's ``softmax_coop_smem_kernel`` with the loss's terms (``common.py``).

Program (row, c) owns chunk c of its row: CHUNK = (REG + S)·SUB logits, the first REG sub-tiles in registers (bf16
as int32 words of two, WORDS), the other S copied into shared memory, where nothing holds registers while the bytes
are in flight or the program waits at the row barrier. Traffic: x read once, dx written once (the floor).

    0. cp.async the S sub-tiles (one commit group each), the REG ones into registers; (z_t, w_t) read from x
       before the barrier (past it another program of the row may write dx over x_t where DX is X);
    1. m_c = c·tanh(max_j x_j / c) (softcap is monotone: one tanh per chunk) as the sub-tiles land; then
       d_c = Σ_j e^(z_j − m_c) and, for smoothing, Σ_j w_j z_j (a second pass over shared memory);
    2. publish (m_c, d_c, Σ w·z), wait for the row's C chunks, (m, d) = ⊕_c (m_c, d_c), lse = m + log d;
       chunk 0 writes the row's loss and lse;
    3. dx_j = ∂loss/∂x_j from p_j = e^(z_j − lse) (``_grad_tile``), read from shared memory again.
KEEP_E (no softcap: its derivative needs z_j): step 1 writes e_j = e^(z_j − m_c) over x_j, rounded to x's dtype,
and step 3 takes p_j = e_j·e^(m_c − lse) without a second exponential (p_j within one ulp of x's dtype, the
rounding dx gets anyway); the target's p_t comes from z_t exactly, since dx_t = (p_t − 1)·… cancels near p_t = 1.
Ignored rows read nothing and write dx = 0.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

from .._triton.online import _bf16_halves, _exp, _merge_row, _pack_bf16x2, _row_barrier, _row_generation, _shift
from .._triton.smem import _chunk_of_program, _copy_sub_tile, _fold_reg_max, _reg_tiles, _smem_max
from .common import _ce_lse, _coefs, _grad_tile, _row_loss, _softcapped, _target_terms


@gluon.jit
def _z(x, col, V, softcap, HAS_SOFTCAP: gl.constexpr, MASKED: gl.constexpr):
    """z = c·tanh(x / c) (or x), −inf past V."""
    z = _softcapped(x, softcap, HAS_SOFTCAP, True)
    if MASKED:
        z = gl.where(col < V, z, float("-inf"))
    return z


@gluon.jit
def _wz(z, col, W, V, HAS_WEIGHT: gl.constexpr, MASKED: gl.constexpr):
    """w_j·z_j (smoothing's Σ w·z), 0 past V."""
    if HAS_WEIGHT:
        wz = gl.load(W + col, mask=col < V, other=0.0) * z
    else:
        wz = z
    if MASKED:
        wz = gl.where(col < V, wz, 0.0)
    return wz


@gluon.jit
def _dx(x, col, t_col, lse, pc, p_t, W, A, s_ce, wt, eps, V, softcap, g_row, KEEP_E: gl.constexpr,
        HAS_WEIGHT: gl.constexpr, HAS_SMOOTH: gl.constexpr, HAS_SOFTCAP: gl.constexpr, HAS_G: gl.constexpr):
    """3. ∂loss/∂x_j of a tile: x holds the logits, or e_j with KEEP_E (pc = e^(m_c − lse))."""
    is_t = col == t_col
    if KEEP_E:
        z = x
        p = gl.where(is_t, p_t, x * pc)
    else:
        z = _softcapped(x, softcap, HAS_SOFTCAP, True)
        p = _exp(z - lse, True)
    if HAS_WEIGHT and HAS_SMOOTH:
        w = gl.load(W + col, mask=col < V, other=0.0)
    else:
        w = 1.0
    return _grad_tile(p, z, is_t, w, A, s_ce, wt, eps, V, softcap, g_row, HAS_SMOOTH, HAS_SOFTCAP, HAS_G)


@gluon.jit
def ce_coop_smem_kernel(
    X, stride_x, T, W, COEF, LOSS, LSE, DX, stride_dx, G, stride_g, PART_M, PART_D, PART_S, ARRIVE, GEN, V,
    ignore_index, eps, z_loss, softcap, C,
    CHUNK: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr, C_POW2: gl.constexpr, EVEN: gl.constexpr,
    REG: gl.constexpr, WORDS: gl.constexpr, KEEP_E: gl.constexpr, HAS_WEIGHT: gl.constexpr,
    HAS_SMOOTH: gl.constexpr, HAS_Z: gl.constexpr, HAS_SOFTCAP: gl.constexpr, NEED_GRAD: gl.constexpr,
    HAS_G: gl.constexpr,
):
    """Program (row, c) = chunk c of `row` (rows unit-stride, X, DX and their row starts 16-byte aligned).
    EVEN: CHUNK divides V (nothing masked). REG (0 or a power of two): the chunk's first REG sub-tiles in
    registers, never masked (every chunk is at least that long); WORDS: bf16 held as int32 words of two."""
    gl.static_assert(not (KEEP_E and HAS_SOFTCAP), "KEEP_E: softcap's derivative needs z_j")
    SUB: gl.constexpr = VEC * 32 * WARPS                      # one 16-byte cp.async per thread per sub-tile
    S: gl.constexpr = CHUNK // SUB - REG
    L: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    pid, row, start = _chunk_of_program(C, CHUNK)
    c = pid % C
    t = gl.load(T + row)
    x_base = row.to(gl.int64) * stride_x
    dx_base = row.to(gl.int64) * stride_dx
    offs = gl.arange(0, SUB, layout=L)
    sm0 = start + REG * SUB                                   # the first shared-memory column
    smem = gl.allocate_shared_memory(X.dtype.element_ty, [S, SUB],
                                     gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]))
    if t == ignore_index:                                     # the row's C programs all skip the barrier
        if c == 0:
            gl.store(LOSS + row, 0.0)
            gl.store(LSE + row, 0.0)
        if NEED_GRAD:
            zero = gl.zeros([SUB], DX.dtype.element_ty, L)
            for s in range(CHUNK // SUB):
                gl.store(DX + dx_base + start + s * SUB + offs, zero, mask=start + s * SUB + offs < V)
    else:
        # 0. the chunk in flight at once (CHUNK·bytes read), then the register sub-tiles and (z_t, w_t)
        for s in gl.static_range(S):
            _copy_sub_tile(smem.index(s), X + x_base + sm0, s, sm0, offs, V, SUB, EVEN)
            cp.commit_group()
        if REG > 0:
            xr, cols_r = _reg_tiles(X, x_base + start, REG, SUB, VEC, WARPS, WORDS)
            if WORDS:
                col_r = start + 2 * cols_r                    # the low half's class; the high half's is col_r + 1
            else:
                col_r = start + cols_r
        zt, wt = _target_terms(X + x_base, W, t, V, softcap, ignore_index, HAS_WEIGHT, HAS_SOFTCAP, True)
        t_col = gl.where((t >= 0) & (t < V), t, -1).to(gl.int32)     # 32-bit compares with the columns
        # 1. m_c = softcap(max_j x_j), each sub-tile as soon as it has landed
        mv = _smem_max(smem, sm0, offs, V, L, S, SUB, EVEN)
        if REG > 0:
            m_x = _fold_reg_max(mv, xr, L, WORDS)
        else:
            m_x = gl.max(mv, axis=0)
        m_c = _softcapped(m_x, softcap, HAS_SOFTCAP, True)
        sh_c = _shift(m_c)
        #    d_c = Σ e^(z_j − m_c), s_c = Σ w_j z_j
        dv = gl.zeros([SUB], gl.float32, L)
        sv = gl.zeros([SUB], gl.float32, L)
        for s in range(S):
            col = sm0 + s * SUB + offs
            z = _z(smem.index(s).load(L).to(gl.float32), col, V, softcap, HAS_SOFTCAP, not EVEN)
            e = _exp(z - sh_c, True)
            dv += e
            if HAS_SMOOTH:
                sv += _wz(z, col, W, V, HAS_WEIGHT, not EVEN)
            if KEEP_E:                                        # the thread's own elements: no barrier
                smem.index(s).store(e.to(X.dtype.element_ty))
        d_c = gl.sum(dv, axis=0)
        s_c = gl.sum(sv, axis=0)
        if REG > 0:
            if WORDS:
                lo, hi = _bf16_halves(xr, 2)
                z_lo = _softcapped(lo, softcap, HAS_SOFTCAP, True)
                z_hi = _softcapped(hi, softcap, HAS_SOFTCAP, True)
                e_lo = _exp(z_lo - sh_c, True)
                e_hi = _exp(z_hi - sh_c, True)
                d_c += gl.sum(gl.sum(e_lo + e_hi, axis=0), axis=0)
                if HAS_SMOOTH:
                    s_c += gl.sum(gl.sum(_wz(z_lo, col_r, W, V, HAS_WEIGHT, False)
                                         + _wz(z_hi, col_r + 1, W, V, HAS_WEIGHT, False), axis=0), axis=0)
                if KEEP_E:
                    xr = _pack_bf16x2(e_lo, e_hi)
            else:
                z = _softcapped(xr.to(gl.float32), softcap, HAS_SOFTCAP, True)
                e = _exp(z - sh_c, True)
                d_c += gl.sum(gl.sum(e, axis=0), axis=0)
                if HAS_SMOOTH:
                    s_c += gl.sum(gl.sum(_wz(z, col_r, W, V, HAS_WEIGHT, False), axis=0), axis=0)
                if KEEP_E:
                    xr = e.to(X.dtype.element_ty)
        # 2. (m, d) = ⊕_c (m_c, d_c) at the row barrier (a row of one chunk has it already)
        if C_POW2 == 1:
            m = m_c
            d = d_c
            sz = s_c
        else:
            gl.store(PART_M + pid, m_c)
            gl.store(PART_D + pid, d_c)
            if HAS_SMOOTH:
                gl.store(PART_S + pid, s_c)
            gl.thread_barrier()
            _row_barrier(ARRIVE, GEN, row, C, _row_generation(GEN, row))
            k = gl.arange(0, C_POW2, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
            m, d = _merge_row(PART_M, PART_D, row, C, k)
            sz = 0.0
            if HAS_SMOOTH:
                sz = gl.sum(gl.load(PART_S + row * C + k, mask=k < C, other=0.0, volatile=True), axis=0)
        lse = _ce_lse(m, d)
        s_ce, A, Wsum = _coefs(COEF, lse, wt, eps, V, z_loss, HAS_SMOOTH, HAS_Z)
        if c == 0:
            gl.store(LOSS + row, _row_loss(lse, zt, wt, sz, Wsum, eps, V, HAS_SMOOTH))
            gl.store(LSE + row, lse)
        # 3. dx from shared memory and registers (CHUNK·bytes written)
        if NEED_GRAD:
            g_row = 1.0
            if HAS_G:
                g_row = gl.load(G + row.to(gl.int64) * stride_g).to(gl.float32)
            pc = gl.exp(sh_c - lse)
            p_t = gl.exp(zt - lse)
            for s in range(S):
                col = sm0 + s * SUB + offs
                g = _dx(smem.index(s).load(L).to(gl.float32), col, t_col, lse, pc, p_t, W, A, s_ce, wt, eps, V,
                        softcap, g_row, KEEP_E, HAS_WEIGHT, HAS_SMOOTH, HAS_SOFTCAP, HAS_G)
                if EVEN:
                    gl.store(DX + dx_base + col, g.to(DX.dtype.element_ty))
                else:
                    gl.store(DX + dx_base + col, g.to(DX.dtype.element_ty), mask=col < V)
            if REG > 0:
                if WORDS:
                    lo, hi = _bf16_halves(xr, 0)
                    gw = _pack_bf16x2(
                        _dx(lo, col_r, t_col, lse, pc, p_t, W, A, s_ce, wt, eps, V, softcap, g_row, KEEP_E,
                            HAS_WEIGHT, HAS_SMOOTH, HAS_SOFTCAP, HAS_G),
                        _dx(hi, col_r + 1, t_col, lse, pc, p_t, W, A, s_ce, wt, eps, V, softcap, g_row, KEEP_E,
                            HAS_WEIGHT, HAS_SMOOTH, HAS_SOFTCAP, HAS_G))
                    gl.store(DX.to(gl.pointer_type(gl.int32)) + (dx_base + start) // 2 + cols_r, gw)
                else:
                    g = _dx(xr.to(gl.float32), col_r, t_col, lse, pc, p_t, W, A, s_ce, wt, eps, V, softcap, g_row,
                            KEEP_E, HAS_WEIGHT, HAS_SMOOTH, HAS_SOFTCAP, HAS_G)
                    gl.store(DX + dx_base + col_r, g.to(DX.dtype.element_ty))
