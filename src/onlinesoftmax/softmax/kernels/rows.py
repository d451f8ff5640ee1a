"""Softmax, log-softmax and logsumexp with whole rows in registers: the readable kernel (the seed tutorial's V3).

Program p takes tiles of BLOCK_M rows x BLOCK_N columns (BLOCK_N >= N, a power of two), grid-stride. Per row, in the
paper's notation (Milakov & Gimelshein, arXiv 1805.02867):

    1. m = max_j x_j
    2. d = sum_j e^(x_j - m)                      (e^(x_j - m) kept in registers: one exponential per element)
    3. y_j = e^(x_j - m) / d   (softmax)   or   (x_j - m) - log d   (log-softmax)   or   lse = m + log d

Memory traffic per element of b bytes: one read of x, one write of y (2b); logsumexp reads x once (b).

A row starts at ``(r // INNER) * stride_o + (r % INNER) * stride_i`` and its N elements are ``stride_n`` apart, so
any dim of a contiguous tensor, transposes and most strided views run without a copy. Offsets are 64-bit.

The backward (``softmax_bwd_rows_kernel``) reads y and dy once and writes dx once:
softmax ``dx = y·(dy − Σ y·dy)``, log-softmax ``dx = dy − e^y·Σ dy``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..._triton.online import _lse, _row_offsets, _state
from .common import _grad, _grad_sum, _normalise


@triton.jit
def _load_rows(X, tile, M, N, INNER, so, si, sn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr):
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    off = _row_offsets(rows, INNER, so, si)[:, None] + cols[None, :].to(tl.int64) * sn
    return tl.load(X + off, mask=mask, other=float("-inf")).to(ACC)   # tiles past M: all masked, no traffic


@triton.jit
def softmax_rows_kernel(
    X, Y, M, N, INNER, sxo, sxi, sxn, syo, syi, syn, GRID,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr, ACC: tl.constexpr,
    PREFETCH: tl.constexpr, FAST: tl.constexpr,
):
    """One read of x, one write of y (or of lse when MODE == LOGSUMEXP); grid-stride over row tiles.
    With PREFETCH the next tile's loads are in flight while this tile is reduced and written."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M)
    if PREFETCH:
        x_next = _load_rows(X, pid, M, N, INNER, sxo, sxi, sxn, BLOCK_M, BLOCK_N, ACC)
    for tile in tl.range(pid, num_tiles, GRID):
        if PREFETCH:
            x = x_next
            x_next = _load_rows(X, tile + GRID, M, N, INNER, sxo, sxi, sxn, BLOCK_M, BLOCK_N, ACC)
        else:
            x = _load_rows(X, tile, M, N, INNER, sxo, sxi, sxn, BLOCK_M, BLOCK_N, ACC)   # read x: M·N
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        m, d, e = _state(x, 1, FAST)
        if MODE == 2:
            tl.store(Y + rows, _lse(m, d).to(Y.dtype.element_ty), mask=rows < M)   # write lse: M
        else:
            y = _normalise(x, e, m[:, None], m[:, None], d[:, None], MODE)
            mask = (rows < M)[:, None] & (cols < N)[None, :]
            y_off = _row_offsets(rows, INNER, syo, syi)[:, None] + cols[None, :].to(tl.int64) * syn
            tl.store(Y + y_off, y.to(Y.dtype.element_ty), mask=mask)      # write y: M·N


@triton.jit
def softmax_bwd_rows_kernel(
    Yp, DY, DX, M, N, INNER, syo, syi, syn, sdo, sdi, sdn, sxo, sxi, sxn, GRID,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOG: tl.constexpr, LIBDEVICE: tl.constexpr,
    ACC: tl.constexpr, SUM: tl.constexpr,
):
    """Read y and dy once, write dx once."""
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    num_tiles = tl.cdiv(M, BLOCK_M)
    for tile in tl.range(tl.program_id(0), num_tiles, GRID):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        mask = (rows < M)[:, None] & col_mask[None, :]
        c64 = cols[None, :].to(tl.int64)
        y = tl.load(Yp + _row_offsets(rows, INNER, syo, syi)[:, None] + c64 * syn, mask=mask, other=0.0)
        dy = tl.load(DY + _row_offsets(rows, INNER, sdo, sdi)[:, None] + c64 * sdn, mask=mask, other=0.0)
        y = y.to(ACC)                       # padding: y = dy = 0 adds nothing to either sum
        dy = dy.to(ACC)
        s = _grad_sum(y, dy, 1, LOG, SUM).to(ACC)
        dx = _grad(y, dy, s[:, None], LOG, LIBDEVICE)
        tl.store(DX + _row_offsets(rows, INNER, sxo, sxi)[:, None] + c64 * sxn,
                 dx.to(DX.dtype.element_ty), mask=mask)
