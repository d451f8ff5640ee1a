"""The long-row softmax kernel that holds its chunk in shared memory (Gluon, sm_80+; the GPU only).

Same scheme as ``softmax_chunks_kernel``'s coop phase (kernels/softmax.py): program (row, c) owns chunk c of its
row, publishes (m_c, d_c), waits at the row barrier until its C siblings have published, merges with ⊕ and
writes y from the chunk it still holds: one read of x, one write of y. The difference is where the chunk waits.
The register kernels hold at most about 128 KB per SM (four 8192-element fp32 chunks at 57 registers), and the
coop path's speed followed those bytes (docs/softmax.md: 64 KB per SM ≈ 55 %, 128 KB ≈ 75 %, 160 KB ≈ 81 %).
Here the chunk is copied global → shared by ``cp.async`` (no registers held while the bytes are in flight or
while the program waits), so an SM holds up to its 227 KB of shared memory, and a program needs few registers.

Steps, in the paper's notation, for chunk c of CHUNK = S x SUB elements:
    0. cp.async the S sub-tiles into shared memory, wait for them;
    1. m_c = max_j x_j,  d_c = sum_j e^(x_j - m_c)   (two passes over shared memory, one exponential each);
    2. publish (m_c, d_c), wait for the row's C chunks, (m, d) = ⊕_c (m_c, d_c);
    3. y_j = e^(x_j - m) / d  (softmax) or (x_j - m) - log d  (log-softmax), read from shared memory again.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

from .softmax import _exp, _shift


@gluon.jit
def _issue(smem, buf, x_row, start, N, ok, offs, S: gl.constexpr, SUB: gl.constexpr):
    """cp.async of one chunk into buffer `buf` (sub-tiles buf·S ... buf·S + S - 1), one group per sub-tile;
    nothing is read where `ok` is false, but the S groups are committed all the same (the waits count them)."""
    for s in gl.static_range(S):
        cp.async_copy_global_to_shared(smem.index(buf * S + s), x_row + s * SUB + offs,
                                       mask=ok & (start + s * SUB + offs < N))
        cp.commit_group()


@gluon.jit
def _issue_next(smem, buf, nxt, X, N, INNER, sxo, sxi, C, ITEMS, offs, CHUNK: gl.constexpr, S: gl.constexpr,
                SUB: gl.constexpr):
    """_issue for item `nxt` (nothing read past the last item)."""
    rn = (nxt // C).to(gl.int64)
    start = (nxt % C) * CHUNK
    _issue(smem, buf, X + (rn // INNER) * sxo + (rn % INNER) * sxi + start, start, N, nxt < ITEMS, offs, S, SUB)


@gluon.jit
def softmax_coop_smem_kernel(
    X, Y, PART_M, PART_D, ARRIVE, GEN, N, INNER, sxo, sxi, syo, syi, C, ITEMS, G,
    CHUNK: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr, C_POW2: gl.constexpr, MODE: gl.constexpr,
    BUFS: gl.constexpr, EARLY: gl.constexpr,
):
    """Items w = row·C + c (chunk c of `row`); program p takes items p, p + G, p + 2G, ... (unit-stride rows;
    row starts and X, Y 16-byte aligned). BUFS = 1: G = ITEMS, one item per program. BUFS = 2 (persistent,
    G programs resident at once, G a multiple of C): the next item's chunk is copied into the other buffer while
    this one waits at its row barrier and writes y, so the wait is not dead time for the memory system."""
    SUB: gl.constexpr = VEC * 32 * WARPS                      # one 16-byte cp.async per thread per sub-tile
    S: gl.constexpr = CHUNK // SUB
    L: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    KL: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    offs = gl.arange(0, SUB, layout=L)
    k = gl.arange(0, C_POW2, layout=KL)
    smem = gl.allocate_shared_memory(X.dtype.element_ty, [BUFS * S, SUB],
                                     gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]))
    p = gl.program_id(0)
    r0 = (p // C).to(gl.int64)
    _issue(smem, 0, X + (r0 // INNER) * sxo + (r0 % INNER) * sxi + (p % C) * CHUNK, (p % C) * CHUNK, N, True,
           offs, S, SUB)
    i = 0
    for w in range(p, ITEMS, G):
        b = i % BUFS
        row = w // C
        r64 = row.to(gl.int64)
        start = (w % C) * CHUNK
        # 0.-1. m_c over each sub-tile as soon as it has landed (each thread reads back only what it copied:
        # no block barrier), then d_c relative to it
        mv = gl.full([SUB], float("-inf"), gl.float32, L)
        for s in gl.static_range(S):
            cp.wait_group(S - 1 - s)
            x = gl.where(start + s * SUB + offs < N, smem.index(b * S + s).load(L).to(gl.float32), float("-inf"))
            mv = gl.maximum(mv, x)
        m_c = gl.max(mv, axis=0)
        sh_c = _shift(m_c)
        dv = gl.zeros([SUB], gl.float32, L)
        for s in range(S):
            x = gl.where(start + s * SUB + offs < N, smem.index(b * S + s).load(L).to(gl.float32), float("-inf"))
            dv += _exp(x - sh_c, True)
        d_c = gl.sum(dv, axis=0)
        # 2. publish (m_c, d_c) and arrive at the row barrier (kernels/softmax.py `_row_barrier`, split here so
        # that the next chunk's copy is issued after the arrival's release: a release waits for earlier loads)
        if BUFS == 2 and EARLY:
            _issue_next(smem, 1 - b, w + G, X, N, INNER, sxo, sxi, C, ITEMS, offs, CHUNK, S, SUB)
        gl.store(PART_M + w, m_c)
        gl.store(PART_D + w, d_c)
        gl.thread_barrier()
        gen = gl.atomic_add(GEN + row, 0, sem="acquire")
        last = gl.atomic_add(ARRIVE + row, 1, sem="acq_rel") == C - 1
        if last:
            gl.atomic_xchg(ARRIVE + row, 0, sem="relaxed")
            gl.atomic_add(GEN + row, 1, sem="release")
        if BUFS == 2 and not EARLY:
            _issue_next(smem, 1 - b, w + G, X, N, INNER, sxo, sxi, C, ITEMS, offs, CHUNK, S, SUB)
        if not last:
            while gl.atomic_add(GEN + row, 0, sem="acquire") == gen:
                pass
        # (m, d) = ⊕_c (m_c, d_c):  m = max_c m_c,  d = sum_c d_c e^(m_c - m)
        pm = gl.load(PART_M + row * C + k, mask=k < C, other=float("-inf"), volatile=True)
        pd = gl.load(PART_D + row * C + k, mask=k < C, other=0.0, volatile=True)
        m = gl.max(pm, axis=0)
        d = gl.sum(pd * gl.where(pm == m, 1.0, gl.exp(pm - m)), axis=0)
        # 3. y from shared memory; a row holding +inf is NaN, an all -inf row 0/0 = NaN, as torch
        y_row = Y + (r64 // INNER) * syo + (r64 % INNER) * syi + start
        sh = _shift(m)
        if MODE == 0:
            scale = gl.where(m == float("inf"), float("nan"), 1.0 / d)
        else:
            log_d = gl.where(m == float("inf"), float("nan"), gl.log(d))
        for s in range(S):
            x = smem.index(b * S + s).load(L).to(gl.float32)
            if MODE == 0:
                y = _exp(x - sh, True) * scale
            else:
                y = (x - m) - log_d
            gl.store(y_row + s * SUB + offs, y.to(Y.dtype.element_ty), mask=start + s * SUB + offs < N)
        i += 1
