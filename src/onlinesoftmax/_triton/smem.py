"""Gluon building blocks of the kernels that hold a row's chunk in shared memory (sm_90: ``cp.async``), shared by
the softmax family's coop kernels (``softmax/kernels/smem.py``) and the cross-entropy's (``losses/smem.py``).

A program owns chunk c of its row: CHUNK = (REG + S)·SUB elements, SUB = VEC·32·WARPS (one 16-byte copy per thread
per sub-tile). The first REG sub-tiles are loaded into registers (``_reg_tiles``; bf16 as int32 words of two
elements), the other S are copied global → shared by ``cp.async`` (``_copy_sub_tile``), one commit group each, and
read back as fp32 (``_sub_tile``). Rows are unit-stride, their starts 16-byte aligned.

This module imports nothing from the op families.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

from .online import _bf16_halves


@gluon.jit
def _chunk_of_program(C, CHUNK: gl.constexpr):
    """(program id, row, first column) of this program's chunk: program = row·C + c."""
    pid = gl.program_id(0)
    return pid, pid // C, (pid % C) * CHUNK


@gluon.jit
def _sub_tile(smem, s, cols, N, L: gl.constexpr, EVEN: gl.constexpr):
    """Sub-tile s as fp32, -inf past N (copied as zeros there)."""
    x = smem.index(s).load(L).to(gl.float32)
    if EVEN:
        return x
    else:
        return gl.where(cols < N, x, float("-inf"))


@gluon.jit
def _copy_sub_tile(dst, row_ptr, s, sm0, offs, N, SUB: gl.constexpr, EVEN: gl.constexpr):
    """cp.async sub-tile s of the chunk's shared-memory part (elements from sm0 of the row at row_ptr) into dst;
    columns past N are copied as zeros (nothing is read)."""
    if EVEN:
        cp.async_copy_global_to_shared(dst, row_ptr + s * SUB + offs)
    else:
        cp.async_copy_global_to_shared(dst, row_ptr + s * SUB + offs, mask=sm0 + s * SUB + offs < N)


@gluon.jit
def _reg_tiles(P, base, REG: gl.constexpr, SUB: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr,
               WORDS: gl.constexpr):
    """The first REG sub-tiles of the chunk at element offset `base` of P, as a [REG, SUB] tensor (each thread
    holding VEC consecutive elements of each), or with WORDS as [REG, SUB / 2] int32 words of two bf16 (`base`
    is even); returns (tiles, their offsets: elements, or words with WORDS)."""
    if WORDS:
        LW: gl.constexpr = gl.BlockedLayout([1, VEC // 2], [1, 32], [1, WARPS], [1, 0])
        cols = (gl.arange(0, REG, layout=gl.SliceLayout(1, LW))[:, None] * (SUB // 2)
                + gl.arange(0, SUB // 2, layout=gl.SliceLayout(0, LW))[None, :])
        return gl.load(P.to(gl.pointer_type(gl.int32)) + base // 2 + cols), cols
    else:
        LR: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [1, WARPS], [1, 0])
        cols = (gl.arange(0, REG, layout=gl.SliceLayout(1, LR))[:, None] * SUB
                + gl.arange(0, SUB, layout=gl.SliceLayout(0, LR))[None, :])
        return gl.load(P + base + cols), cols


@gluon.jit
def _smem_max(smem, sm0, offs, N, L: gl.constexpr, S: gl.constexpr, SUB: gl.constexpr, EVEN: gl.constexpr):
    """Per-thread max over the S shared-memory sub-tiles, each as soon as its cp.async group has landed (each
    thread reads back only what it copied): a [SUB] vector, -inf past N."""
    mv = gl.full([SUB], float("-inf"), gl.float32, L)
    for s in gl.static_range(S):
        cp.wait_group(S - 1 - s)
        mv = gl.maximum(mv, _sub_tile(smem, s, sm0 + s * SUB + offs, N, L, EVEN))
    return mv


@gluon.jit
def _fold_reg_max(mv, xr, L: gl.constexpr, WORDS: gl.constexpr):
    """max of the shared-memory part `mv` and the register sub-tiles `xr` ([REG, SUB], or bf16 pairs as words):
    the register tiles fold within each thread first (axis 0 is the thread's own)."""
    if WORDS:
        lo, hi = _bf16_halves(xr, 1)
        return gl.maximum(gl.max(mv, axis=0), gl.max(gl.max(gl.maximum(lo, hi), axis=0), axis=0))
    else:
        return gl.max(gl.maximum(mv, gl.convert_layout(gl.max(xr.to(gl.float32), axis=0), L)), axis=0)
