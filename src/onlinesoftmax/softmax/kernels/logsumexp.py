"""logsumexp kernels that beat the register ``rows`` kernel on the H200 (Gluon; sm_90, the GPU only): whole rows
with the next row in flight in shared memory (``logsumexp_rows_pipe_kernel``), and long 16-bit rows streamed
through registers with a running (m, d) per thread (``logsumexp_stream_kernel``). Both read x once and write one
value per row."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

from ..._triton.online import _alpha, _exp, _lse, _row_offsets, _shift


@gluon.jit
def _copy_row(smem, X, row, M, N, INNER, sxo, sxi, cols, EVEN: gl.constexpr):
    """0. cp.async row `row` of X into smem ([S, SUB], this thread's own 16-byte pieces), one commit group; rows
    past M and columns past N are copied as zeros."""
    src = X + _row_offsets(row, INNER, sxo, sxi) + cols
    if EVEN:
        # cols >= 0 only broadcasts row < M and folds away: no column compare per copy (sm_90a SASS of the pipe
        # kernel 584 against 728 instructions at fp32 N = 32K with cols < N here)
        cp.async_copy_global_to_shared(smem, src, mask=(cols >= 0) & (row < M))
    else:
        cp.async_copy_global_to_shared(smem, src, mask=(cols < N) & (row < M))
    cp.commit_group()


@gluon.jit
def logsumexp_rows_pipe_kernel(
    X, Y, M, N, INNER, sxo, sxi, GRID,
    BLOCK: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr, EVEN: gl.constexpr,
):
    """logsumexp of whole rows with the next row's read in flight: a persistent program takes rows pid,
    pid + GRID, ... Row i waits in shared memory; the program moves it to registers, at once puts row i + GRID in
    flight into the same shared memory (each thread overwrites only the bytes it has just read, so no barrier),
    and reduces row i while that copy lands, so an SM's reads never pause for the reduction (the register `rows`
    kernel's do). BLOCK = S x SUB elements (a power of two, >= N); EVEN: BLOCK == N. Y: one fp value per row.
    (Softmax and log-softmax through the same pipeline measured 82-92 % of the copy ceiling against 94.7-98.1 %
    for their own kernels on the H200.)"""
    SUB: gl.constexpr = VEC * 32 * WARPS                      # one 16-byte cp.async per thread per sub-tile
    S: gl.constexpr = BLOCK // SUB
    L: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [1, WARPS], [1, 0])
    cols = (gl.arange(0, S, layout=gl.SliceLayout(1, L))[:, None] * SUB
            + gl.arange(0, SUB, layout=gl.SliceLayout(0, L))[None, :])
    smem = gl.allocate_shared_memory(X.dtype.element_ty, [S, SUB],
                                     gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0]))
    pid = gl.program_id(0)
    _copy_row(smem, X, pid, M, N, INNER, sxo, sxi, cols, EVEN)
    for row in range(pid, M, GRID):
        cp.wait_group(0)
        x = smem.load(L).to(gl.float32)
        _copy_row(smem, X, row + GRID, M, N, INNER, sxo, sxi, cols, EVEN)     # 0. the next row, in flight
        if not EVEN:
            x = gl.where(cols < N, x, float("-inf"))
        # (axis 0 of [S, SUB] is each thread's own: fold it first)
        m = gl.max(gl.max(x, axis=0), axis=0)                                    # 1. m = max_j x_j
        sh = _shift(m)
        d = gl.sum(gl.sum(_exp(x - sh, True), axis=0), axis=0)                   # 2. d = sum_j e^(x_j - m)
        gl.store(Y + row, _lse(m, d).to(Y.dtype.element_ty))                    # 3. logsumexp = m + log d


@gluon.jit
def _load_tile(X, row, t, M, N, INNER, sxo, sxi, offs, TILE: gl.constexpr):
    """0. Tile t of row `row` into registers (as stored); rows past M and columns past N read as -inf."""
    col = t * TILE + offs
    return gl.load(X + _row_offsets(row, INNER, sxo, sxi) + col, mask=(col < N) & (row < M), other=float("-inf"))


@gluon.jit
def logsumexp_stream_kernel(
    X, Y, M, N, INNER, sxo, sxi, GRID, T,
    PER: gl.constexpr, WARPS: gl.constexpr,
):
    """logsumexp of long rows streamed once, the paper's online normalizer per thread. A persistent program takes
    rows pid, pid + GRID, ..., each as T tiles of TILE = 32·WARPS·PER elements, each thread PER contiguous ones;
    the next tile (of this row or the next) is loaded before the current one is folded in, so a tile is always
    in flight in registers (no shared memory, no barrier until the row's end). Per tile each thread folds its PER
    elements into its (m_t, d_t):
        1. m' = max(m_t, max_v x_v)
        2. d_t = d_t·e^(m_t - m') + sum_v e^(x_v - m')        (PER + 1 exponentials per PER elements)
    3. at the row's end the program merges its threads' states with ⊕ and writes m + log d.
    Measured (softmax/tuned.py: LSE_STREAM): bf16 at 97.7-98.9 % of the copy ceiling from N = 20000 to 256K. The
    same loop through a shared-memory cp.async ring, with compiler-inserted CTA barriers around it, reached
    94.8-96.2 % at its best configurations (docs/tuning.md)."""
    R: gl.constexpr = 32 * WARPS
    TILE: gl.constexpr = R * PER
    L: gl.constexpr = gl.BlockedLayout([1, PER], [32, 1], [WARPS, 1], [1, 0])
    LS: gl.constexpr = gl.SliceLayout(1, L)
    offs = gl.arange(0, R, layout=LS)[:, None] * PER + gl.arange(0, PER, layout=gl.SliceLayout(0, L))[None, :]
    pid = gl.program_id(0)
    nxt = _load_tile(X, pid, 0, M, N, INNER, sxo, sxi, offs, TILE)
    pr = pid + (1 // T) * GRID                            # the next tile to load: tile pt of row pr
    pt = 1 % T
    for row in range(pid, M, GRID):
        m = gl.full([R], float("-inf"), gl.float32, LS)
        d = gl.zeros([R], gl.float32, LS)
        for _t in range(T):
            x = nxt.to(gl.float32)
            nxt = _load_tile(X, pr, pt, M, N, INNER, sxo, sxi, offs, TILE)      # 0. the next tile, in flight
            pt += 1
            if pt == T:
                pt = 0
                pr += GRID
            m_new = gl.maximum(m, gl.max(x, axis=1))                               # 1. m' = max(m_t, x_v)
            d = d * _alpha(m, m_new) + gl.sum(_exp(x - _shift(m_new)[:, None], True), axis=1)  # 2. d_t, relative to m'
            m = m_new
        m_row = gl.max(m, axis=0)                                                  # 3. ⊕ over the threads
        d_row = gl.sum(d * _alpha(m, m_row), axis=0)
        gl.store(Y + row, _lse(m_row, d_row).to(Y.dtype.element_ty))
