"""Long-row softmax on thread-block clusters (Gluon, sm_90+; the GPU only).

One cluster of C CTAs per row: CTA c (its rank in the cluster, %cluster_ctarank) owns chunk c of the row,
exactly as program (row, c) of the coop kernels (kernels/softmax_smem.py). The difference is the barrier: the
hardware cluster barrier (barrier.cluster.arrive.release / wait.acquire) replaces the per-row software barrier
on global atomics, and the hardware launches a cluster's CTAs together, so no launch order is relied on.

Triton 3.6 cannot reduce across the CTAs of a cluster (ReduceOp asserts it stays within a CTA) nor copy with
cp.async into a CTA-split layout, so every tensor here is laid out whole in each CTA (cga bases all 0) and the
chunk is picked by the rank read in PTX. The compiler masks tl.store of such a tensor to rank 0 (it believes
the CTAs hold copies), so y and the partial states are written by inline PTX stores.

Steps, in the paper's notation, for chunk c of CHUNK = S x SUB elements:
    0. cp.async the S sub-tiles into shared memory, one commit group each;
    1. m_c = max_j x_j as the sub-tiles land, then d_c = sum_j e^(x_j - m_c);
    2. publish (m_c, d_c) to global memory, cluster barrier, (m, d) = ⊕_c (m_c, d_c);
    3. y_j = e^(x_j - m) / d (softmax) or (x_j - m) - log d (log-softmax), from shared memory.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

from .softmax import _exp, _shift


@gluon.jit
def _cluster_rank():
    return gl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r", [], dtype=gl.int32, is_pure=True,
                                     pack=1)


@gluon.jit
def _cluster_sync(x):
    """All threads of the cluster's CTAs arrive (release) and wait (acquire); returns 0, a token that later
    loads add to their address so they cannot move above the barrier."""
    return gl.inline_asm_elementwise(
        "barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;\n\tmov.u32 $0, 0;",
        "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _st_f32(ptr, v):
    """Every thread stores the same scalar (a CTA-replicated tl.store would be masked to rank 0)."""
    return gl.inline_asm_elementwise("st.global.f32 [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,f",
                                     [ptr.to(gl.int64, bitcast=True), v], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _st_vec(ptrs, y, VEC: gl.constexpr):
    """16-byte store of each thread's VEC consecutive elements (fp32: 4, 16-bit: 8) at 16-byte aligned ptrs."""
    addr = ptrs.to(gl.int64, bitcast=True)
    if VEC == 4:
        return gl.inline_asm_elementwise(
            "st.global.v4.b32 [$4], {$8, $9, $10, $11};\n\tmov.u32 $0, 0;\n\tmov.u32 $1, 0;\n\t"
            "mov.u32 $2, 0;\n\tmov.u32 $3, 0;",
            "=r,=r,=r,=r,l,l,l,l,r,r,r,r", [addr, y.to(gl.int32, bitcast=True)], dtype=gl.int32,
            is_pure=False, pack=4)
    else:
        return gl.inline_asm_elementwise(
            "{\n\t.reg .b32 w<4>;\n\tmov.b32 w0, {$16, $17};\n\tmov.b32 w1, {$18, $19};\n\t"
            "mov.b32 w2, {$20, $21};\n\tmov.b32 w3, {$22, $23};\n\tst.global.v4.b32 [$8], {w0, w1, w2, w3};\n\t}\n\t"
            "mov.u32 $0, 0;\n\tmov.u32 $1, 0;\n\tmov.u32 $2, 0;\n\tmov.u32 $3, 0;\n\t"
            "mov.u32 $4, 0;\n\tmov.u32 $5, 0;\n\tmov.u32 $6, 0;\n\tmov.u32 $7, 0;",
            "=r,=r,=r,=r,=r,=r,=r,=r,l,l,l,l,l,l,l,l,h,h,h,h,h,h,h,h", [addr, y.to(gl.int16, bitcast=True)],
            dtype=gl.int32, is_pure=False, pack=8)


@gluon.jit
def softmax_cluster_smem_kernel(
    X, Y, PART_M, PART_D, sx, sy,
    CHUNK: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr, C: gl.constexpr, MODE: gl.constexpr,
    L: gl.constexpr, R: gl.constexpr, SL: gl.constexpr,
):
    """Cluster `row` = program id, CTA c = rank: chunk c of the row (N = C x CHUNK, unit stride, X and Y and
    every row 16-byte aligned). L, R, SL: the register, partial-state and shared layouts, CTA-replicated."""
    SUB: gl.constexpr = VEC * 32 * WARPS
    S: gl.constexpr = CHUNK // SUB
    row = gl.program_id(0)
    c = _cluster_rank()
    x_row = X + row.to(gl.int64) * sx + c * CHUNK
    offs = gl.arange(0, SUB, layout=L)
    smem = gl.allocate_shared_memory(X.dtype.element_ty, [CHUNK], SL)
    # 0. the whole chunk in flight, one cp.async group per sub-tile
    for s in gl.static_range(S):
        cp.async_copy_global_to_shared(smem.slice(s * SUB, SUB), x_row + s * SUB + offs)
        cp.commit_group()
    # 1. m_c as the sub-tiles land, then d_c
    mv = gl.full([SUB], float("-inf"), gl.float32, L)
    for s in gl.static_range(S):
        cp.wait_group(S - 1 - s)
        mv = gl.maximum(mv, smem.slice(s * SUB, SUB).load(L).to(gl.float32))
    m_c = gl.max(mv, axis=0)
    sh_c = _shift(m_c)
    dv = gl.zeros([SUB], gl.float32, L)
    for s in gl.static_range(S):
        dv += _exp(smem.slice(s * SUB, SUB).load(L).to(gl.float32) - sh_c, True)
    d_c = gl.sum(dv, axis=0)
    # 2. publish, cluster barrier, merge
    slot = row.to(gl.int64) * C + c
    t = _st_f32(PART_M + slot, m_c) + _st_f32(PART_D + slot, d_c)
    tok = _cluster_sync(t)
    k = gl.arange(0, C, layout=R)
    pm = gl.load(PART_M + row.to(gl.int64) * C + k + tok, cache_modifier=".cg")
    pd = gl.load(PART_D + row.to(gl.int64) * C + k + tok, cache_modifier=".cg")
    m = gl.max(pm, axis=0)
    d = gl.sum(pd * gl.where(pm == m, 1.0, gl.exp(pm - m)), axis=0)
    # 3. y from shared memory
    y_row = Y + row.to(gl.int64) * sy + c * CHUNK
    sh = _shift(m)
    if MODE == 0:
        scale = gl.where(m == float("inf"), float("nan"), 1.0 / d)
    else:
        log_d = gl.where(m == float("inf"), float("nan"), gl.log(d))
    for s in gl.static_range(S):
        x = smem.slice(s * SUB, SUB).load(L).to(gl.float32)
        if MODE == 0:
            y = _exp(x - sh, True) * scale
        else:
            y = (x - m) - log_d
        _st_vec(y_row + s * SUB + offs, y.to(Y.dtype.element_ty), VEC)


def cluster_layouts(C, VEC, WARPS):
    """(L, R, SL): register, partial-state and shared layouts, each CTA holding the whole tensor."""
    rep = [[0]] * (C.bit_length() - 1)
    return (gl.BlockedLayout([VEC], [32], [WARPS], [0], rep),
            gl.BlockedLayout([1], [32], [WARPS], [0], rep),
            gl.SwizzledSharedLayout(1, 1, 1, [0], rep))


@gluon.jit
def softmax_cluster_regs_kernel(
    X, Y, PART_M, PART_D, N, sx, sy,
    CHUNK: gl.constexpr, C: gl.constexpr, MODE: gl.constexpr, EVEN: gl.constexpr, L: gl.constexpr, R: gl.constexpr,
):
    """Cluster `row`: the row as a [C, CHUNK] tensor whose dim 0 is split across the cluster's CTAs (L), so CTA c
    holds chunk c in registers; (m_c, d_c) leave through global memory (a CTA-split [C] tensor, stored by each
    CTA for itself) and come back after the cluster barrier as a CTA-replicated [C] tensor (R)."""
    row = gl.program_id(0)
    c = gl.arange(0, C, layout=gl.SliceLayout(1, L))
    cols = c[:, None] * CHUNK + gl.arange(0, CHUNK, layout=gl.SliceLayout(0, L))[None, :]
    if EVEN:
        x = gl.load(X + row.to(gl.int64) * sx + cols).to(gl.float32)
    else:
        x = gl.load(X + row.to(gl.int64) * sx + cols, mask=cols < N, other=float("-inf")).to(gl.float32)
    # 1. (m_c, d_c) of each CTA's chunk
    m_c = gl.max(x, axis=1)
    d_c = gl.sum(_exp(x - _shift(m_c)[:, None], True), axis=1)
    # 2. publish, cluster barrier, merge
    gl.store(PART_M + row.to(gl.int64) * C + c, m_c)
    gl.store(PART_D + row.to(gl.int64) * C + c, d_c)
    tok = _cluster_sync(row)
    k = gl.arange(0, C, layout=R)
    pm = gl.load(PART_M + row.to(gl.int64) * C + k + tok, cache_modifier=".cg")
    pd = gl.load(PART_D + row.to(gl.int64) * C + k + tok, cache_modifier=".cg")
    m = gl.max(pm, axis=0)
    d = gl.sum(pd * gl.where(pm == m, 1.0, gl.exp(pm - m)), axis=0)
    # 3. y from the registers
    if MODE == 0:
        y = _exp(x - _shift(m), True) * gl.where(m == float("inf"), float("nan"), 1.0 / d)
    else:
        y = (x - m) - gl.where(m == float("inf"), float("nan"), gl.log(d))
    if EVEN:
        gl.store(Y + row.to(gl.int64) * sy + cols, y.to(Y.dtype.element_ty))
    else:
        gl.store(Y + row.to(gl.int64) * sy + cols, y.to(Y.dtype.element_ty), mask=cols < N)


def cluster_regs_layouts(C, VEC, WARPS):
    """(L, R): dim 0 of [C, CHUNK] split across the C CTAs; [C] whole in each CTA."""
    bits = C.bit_length() - 1
    return (gl.BlockedLayout([1, VEC], [1, 32], [1, WARPS], [1, 0], [[1 << i, 0] for i in range(bits)]),
            gl.BlockedLayout([1], [32], [WARPS], [0], [[0]] * bits))
