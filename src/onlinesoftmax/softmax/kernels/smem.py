"""The coop path with each chunk held in shared memory (Gluon: explicit layouts and ``cp.async``; sm_90, the GPU
only), forward (``softmax_coop_smem_kernel``) and backward (``softmax_bwd_coop_smem_kernel``).

Same scheme as ``softmax_chunks_kernel``: program (row, c) owns chunk c of its row, publishes (m_c, d_c), waits at
the row barrier until its C siblings have published, merges with ⊕ and writes y from the chunk it still holds: one
read of x, one write of y. The difference is where the chunk waits. Register kernels hold at most about 128 KB per
SM, and the coop path's speed follows the bytes an SM holds. Here the chunk is copied global → shared by
``cp.async`` (no registers held while the bytes are in flight or while the program waits), so an SM holds up to its
227 KB of shared memory; the chunk's first REG sub-tiles are also kept in registers, which shared memory leaves
idle (bf16 as int32 words of two elements, WORDS). With one chunk per row (C = 1: step 2 is skipped, no barrier)
the same kernel holds whole 16-bit rows of 4K-32K (forward) or rows of 1K-16K (backward) for the ``rows`` path.

Steps, in the paper's notation, for chunk c of CHUNK = (REG + S) x SUB elements:
    0. cp.async the S sub-tiles into shared memory, one commit group each (and load the REG ones into registers);
    1. m_c = max_j x_j as the sub-tiles land, then d_c = sum_j e^(x_j - m_c) (a second pass over shared memory);
    2. publish (m_c, d_c), wait for the row's C chunks, (m, d) = ⊕_c (m_c, d_c);
    3. y_j = e^(x_j - m) / d  (softmax) or (x_j - m) - log d  (log-softmax), read from shared memory again.
With KEEP_E (16-bit softmax in coop chunks) step 1 writes e_j = e^(x_j - m_c) over x_j and step 3 is
y_j = e_j · e^(m_c - m) / d: one exponential per element.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

from ..._triton.online import (
    _alpha,
    _bf16_halves,
    _exp,
    _merge_row,
    _pack_bf16x2,
    _row_barrier,
    _row_generation,
    _row_offsets,
    _shift,
)
from ..._triton.smem import _chunk_of_program, _copy_sub_tile, _fold_reg_max, _reg_tiles, _smem_max, _sub_tile
from .common import _grad


@gluon.jit
def softmax_coop_smem_kernel(
    X, Y, PART_M, PART_D, ARRIVE, GEN, N, INNER, sxo, sxi, syo, syi, C,
    CHUNK: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr, C_POW2: gl.constexpr, MODE: gl.constexpr,
    EVEN: gl.constexpr, REG: gl.constexpr, WORDS: gl.constexpr, FAST: gl.constexpr, KEEP_E: gl.constexpr,
):
    """Program (row, c): chunk c of `row` (unit-stride rows; row starts and X, Y 16-byte aligned).
    EVEN: CHUNK divides N, so no element is masked (a compare and a select per element fewer).
    REG (0 or a power of two): the chunk's first REG sub-tiles are held in registers, never masked (the plan keeps
    every chunk at least that long), the others in shared memory. WORDS (bf16 in and out): those registers hold
    int32 words of two elements, unpacked at each use. FAST: the output's exponential (_exp_level). KEEP_E
    (softmax, 16-bit x and y of one dtype): step 1 overwrites each x_j with e_j = e^(x_j - m_c) rounded to that
    dtype, and step 3 scales it, y_j = e_j·e^(m_c - m)/d, without a second exponential."""
    SUB: gl.constexpr = VEC * 32 * WARPS                      # one 16-byte cp.async per thread per sub-tile
    S: gl.constexpr = CHUNK // SUB - REG
    L: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    pid, row, start = _chunk_of_program(C, CHUNK)
    x_row = X + _row_offsets(row, INNER, sxo, sxi) + start + REG * SUB      # the shared-memory sub-tiles
    sm0 = start + REG * SUB
    offs = gl.arange(0, SUB, layout=L)
    smem = gl.allocate_shared_memory(X.dtype.element_ty, [S, SUB],
                                     gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]))
    # 0. the whole chunk in flight at once, one cp.async group per sub-tile, then the register sub-tiles
    for s in gl.static_range(S):
        _copy_sub_tile(smem.index(s), x_row, s, sm0, offs, N, SUB, EVEN)
        cp.commit_group()
    if REG > 0:
        xr, cols_r = _reg_tiles(X, _row_offsets(row, INNER, sxo, sxi) + start, REG, SUB, VEC, WARPS, WORDS)
    # 1. m_c over each sub-tile as soon as it has landed (each thread reads back only what it copied), then d_c
    mv = _smem_max(smem, sm0, offs, N, L, S, SUB, EVEN)
    if REG > 0:
        m_c = _fold_reg_max(mv, xr, L, WORDS)
    else:
        m_c = gl.max(mv, axis=0)
    sh_c = _shift(m_c)
    dv = gl.zeros([SUB], gl.float32, L)
    for s in range(S):
        e = _exp(_sub_tile(smem, s, sm0 + s * SUB + offs, N, L, EVEN) - sh_c, True)
        dv += e
        if KEEP_E:                              # the thread's own elements: no barrier
            smem.index(s).store(e.to(X.dtype.element_ty))
    if REG > 0:
        if WORDS:
            lo, hi = _bf16_halves(xr, 2)
            e_lo = _exp(lo - sh_c, True)
            e_hi = _exp(hi - sh_c, True)
            d_c = gl.sum(dv, axis=0) + gl.sum(gl.sum(e_lo + e_hi, axis=0), axis=0)
            if KEEP_E:
                xr = _pack_bf16x2(e_lo, e_hi)
        else:
            e = _exp(xr.to(gl.float32) - sh_c, True)
            d_c = gl.sum(dv + gl.convert_layout(gl.sum(e, axis=0), L), axis=0)
            if KEEP_E:
                xr = e.to(X.dtype.element_ty)
    else:
        d_c = gl.sum(dv, axis=0)
    # 2. publish (m_c, d_c), wait for the row's C chunks, (m, d) = ⊕_c (m_c, d_c); a row of one chunk (the
    #    `rows` path's 16-bit rows, SMEM_ROWS) has its state already
    if C_POW2 == 1:
        m = m_c
        d = d_c
    else:
        gl.store(PART_M + pid, m_c)
        gl.store(PART_D + pid, d_c)
        gl.thread_barrier()
        _row_barrier(ARRIVE, GEN, row, C, _row_generation(GEN, row))
        k = gl.arange(0, C_POW2, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
        m, d = _merge_row(PART_M, PART_D, row, C, k)
    # 3. y from shared memory (and registers); a row holding +inf is NaN, an all -inf row 0/0 = NaN, as torch
    y_base = Y + _row_offsets(row, INNER, syo, syi) + start
    sh = _shift(m)
    if KEEP_E:                                  # y_j = e_j · c, c = e^(m_c - m) / d
        c = gl.where(m == float("inf"), float("nan"), _alpha(m_c, m) / d)
    elif MODE == 0:
        c = gl.where(m == float("inf"), float("nan"), 1.0 / d)
    else:
        c = gl.where(m == float("inf"), float("nan"), gl.log(d))
    for s in range(S):
        y = _out(smem.index(s).load(L).to(gl.float32), m, sh, c, MODE, FAST, KEEP_E)
        if EVEN:
            gl.store(y_base + REG * SUB + s * SUB + offs, y.to(Y.dtype.element_ty))
        else:
            gl.store(y_base + REG * SUB + s * SUB + offs, y.to(Y.dtype.element_ty), mask=sm0 + s * SUB + offs < N)
    if REG > 0:
        if WORDS:
            lo, hi = _bf16_halves(xr, 0)
            yw = _pack_bf16x2(_out(lo, m, sh, c, MODE, FAST, KEEP_E), _out(hi, m, sh, c, MODE, FAST, KEEP_E))
            gl.store(Y.to(gl.pointer_type(gl.int32)) + (_row_offsets(row, INNER, syo, syi) + start) // 2 + cols_r,
                     yw)
        else:
            y = _out(xr.to(gl.float32), m, sh, c, MODE, FAST, KEEP_E)
            gl.store(y_base + cols_r, y.to(Y.dtype.element_ty))


@gluon.jit
def _out(x, m, sh, c, MODE: gl.constexpr, FAST: gl.constexpr, KEEP_E: gl.constexpr):
    """3. y = e^(x - m) / d with c = 1/d (softmax; e^ relative to sh = _shift(m)), or (x - m) - log d with
    c = log d (log-softmax); with KEEP_E x holds e_j already and y = e_j · c."""
    if KEEP_E:
        return x * c
    elif MODE == 0:
        return _exp(x - sh, FAST) * c
    else:
        return (x - m) - c


@gluon.jit
def softmax_bwd_coop_smem_kernel(
    Yp, DY, DX, PART, ARRIVE, GEN, N, INNER, syo, syi, sdo, sdi, sxo, sxi, C,
    CHUNK: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr, C_POW2: gl.constexpr, LOG: gl.constexpr,
    LIBDEVICE: gl.constexpr, SUM: gl.constexpr, EVEN: gl.constexpr, REG: gl.constexpr, WORDS: gl.constexpr,
    RING: gl.constexpr,
):
    """Backward of program (row, c): chunks of y and dy held in shared memory (y, dy, dx of one dtype, rows as
    the forward's). 1. s_c = sum_j y_j·dy_j (softmax) or sum_j dy_j (log-softmax), in SUM (fp64 for fp32, see
    common.py `_grad_sum`); 2. s = sum_c s_c at the row barrier; 3. dx from shared memory (`_grad`).
    REG (0 or a power of two, as the forward's): the chunk's first REG sub-tiles of y and dy are held in
    registers, never masked; WORDS (bf16): as int32 words of two elements.
    RING (log-softmax only; 0 or more): step 1 needs dy alone, so y's shared-memory sub-tiles are not held through
    steps 1 and 2 but streamed through a ring of RING sub-tiles, the first RING put in flight before the row
    barrier: a program holds its chunk of dy and RING sub-tiles of y, and more programs fit on an SM."""
    SUB: gl.constexpr = VEC * 32 * WARPS
    S: gl.constexpr = CHUNK // SUB - REG
    L: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    pid, row, start = _chunk_of_program(C, CHUNK)
    sm0 = start + REG * SUB                     # the shared-memory sub-tiles
    y_row = Yp + _row_offsets(row, INNER, syo, syi) + sm0
    dy_row = DY + _row_offsets(row, INNER, sdo, sdi) + sm0
    offs = gl.arange(0, SUB, layout=L)
    layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    gl.static_assert(RING == 0 or LOG, "RING: log-softmax only (softmax's s_c needs y)")
    ys = gl.allocate_shared_memory(Yp.dtype.element_ty, [RING if RING > 0 else S, SUB], layout)
    dys = gl.allocate_shared_memory(DY.dtype.element_ty, [S, SUB], layout)
    for s in gl.static_range(S):            # masked-off elements are copied as zeros: they add nothing to s_c
        if RING == 0:
            _copy_sub_tile(ys.index(s), y_row, s, sm0, offs, N, SUB, EVEN)
        _copy_sub_tile(dys.index(s), dy_row, s, sm0, offs, N, SUB, EVEN)
        cp.commit_group()
    if REG > 0:
        yr, cols_r = _reg_tiles(Yp, _row_offsets(row, INNER, syo, syi) + start, REG, SUB, VEC, WARPS, WORDS)
        dyr, _ = _reg_tiles(DY, _row_offsets(row, INNER, sdo, sdi) + start, REG, SUB, VEC, WARPS, WORDS)
    # 1. s_c, each sub-tile as soon as it has landed
    sv = gl.zeros([SUB], SUM, L)
    for s in gl.static_range(S):
        cp.wait_group(S - 1 - s)
        dy = dys.index(s).load(L).to(gl.float32)
        if LOG:
            sv += dy.to(SUM)
        else:
            sv += (ys.index(s).load(L).to(gl.float32) * dy).to(SUM)
    s_c = gl.sum(sv, axis=0)
    if REG > 0:                             # (axis 0 of [REG, SUB] is each thread's own: fold it first)
        if WORDS:
            dy_lo, dy_hi = _bf16_halves(dyr, 1)
            if LOG:
                t = dy_lo.to(SUM) + dy_hi.to(SUM)
            else:
                y_lo, y_hi = _bf16_halves(yr, 1)
                t = (y_lo * dy_lo).to(SUM) + (y_hi * dy_hi).to(SUM)
        elif LOG:
            t = dyr.to(gl.float32).to(SUM)
        else:
            t = (yr.to(gl.float32) * dyr.to(gl.float32)).to(SUM)
        s_c += gl.sum(gl.sum(t, axis=0), axis=0)
    if RING > 0:                            # y's first RING sub-tiles fly while the row gathers
        for r in gl.static_range(RING):
            if r < S:
                _copy_sub_tile(ys.index(r), y_row, r, sm0, offs, N, SUB, EVEN)
            cp.commit_group()
    # 2. s = sum_c s_c; a row of one chunk has it already
    if C_POW2 == 1:
        s_row = s_c.to(gl.float32)
    else:
        gl.store(PART + pid, s_c)
        gl.thread_barrier()
        _row_barrier(ARRIVE, GEN, row, C, _row_generation(GEN, row))
        k = gl.arange(0, C_POW2, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
        s_row = gl.sum(gl.load(PART + row * C + k, mask=k < C, other=0.0, volatile=True), axis=0).to(gl.float32)
    # 3. dx = y·(dy - s)  or  dy - e^y·s
    dx_base = DX + _row_offsets(row, INNER, sxo, sxi) + start
    for s in range(S):
        if RING > 0:
            cp.wait_group(RING - 1)             # sub-tile s of y has landed in slot s % RING
            y = ys.index(s % RING).load(L)
        else:
            y = ys.index(s).load(L)
        dx = _grad(y.to(gl.float32), dys.index(s).load(L).to(gl.float32), s_row, LOG, LIBDEVICE)
        if EVEN:
            gl.store(dx_base + REG * SUB + s * SUB + offs, dx.to(DX.dtype.element_ty))
        else:
            gl.store(dx_base + REG * SUB + s * SUB + offs, dx.to(DX.dtype.element_ty),
                     mask=sm0 + s * SUB + offs < N)
        if RING > 0:
            # refill the slot with sub-tile s + RING: each thread overwrites only the 16-byte pieces it has just
            # read (and used), so no CTA barrier; past S nothing is copied, but a group is still committed so
            # that wait_group keeps counting one group per sub-tile
            nxt = s + RING
            if EVEN:
                live = offs < (S - nxt) * SUB
            else:
                live = (sm0 + nxt * SUB + offs < N) & (nxt < S)
            cp.async_copy_global_to_shared(ys.index(s % RING), y_row + nxt * SUB + offs, mask=live)
            cp.commit_group()
    if REG > 0:
        if WORDS:
            y_lo, y_hi = _bf16_halves(yr, 0)
            dy_lo, dy_hi = _bf16_halves(dyr, 0)
            dxw = _pack_bf16x2(_grad(y_lo, dy_lo, s_row, LOG, LIBDEVICE), _grad(y_hi, dy_hi, s_row, LOG, LIBDEVICE))
            gl.store(DX.to(gl.pointer_type(gl.int32)) + (_row_offsets(row, INNER, sxo, sxi) + start) // 2 + cols_r,
                     dxw)
        else:
            dx = _grad(yr.to(gl.float32), dyr.to(gl.float32), s_row, LOG, LIBDEVICE)
            gl.store(dx_base + cols_r, dx.to(DX.dtype.element_ty))
