"""Attention forward for Hopper (sm_90): the ``(m, d, o)`` recurrence of ``fwd.py`` with TMA, wgmma and a
warp-specialised producer (Gluon).

One program per (query block, head), as ``fwd.py``. Its warps split in two partitions:

* the **producer** (one warp) copies key / value tiles global → shared memory with TMA into a ring of STAGES
  buffers, K and V on their own barriers (``k_ready`` / ``v_ready``), and waits for the consumers to release a
  buffer (``k_empty`` / ``v_empty``) before refilling it;
* the **consumers**, two warpgroups of BLOCK_M = 64 query rows each, run the recurrence on the same key /
  value tiles with asynchronous wgmma: the scores of tile j + 1 are issued before ``p v`` of tile j, so the
  tensor cores work on one while the exponentials of the other run (OVERLAP; FlashAttention-3's intra-warpgroup
  overlap). The warpgroups synchronise only through the ring's barriers, so one's exponentials run beside the
  other's matmuls as the warp schedulers find them.

Per key tile, in the paper's notation (base 2: ``log2 e · scale`` folded into one multiply):
1. ``s = log2(e)·scale·q kᵀ`` (wgmma, q and k from shared memory), masked to −inf outside the band;
2. ``m_new = max(m, max_j s_j)``;
3. ``α = 2^(m − m_new)``, ``p = 2^(s − m_new)``;
4. ``d ← α·d + Σ_j p_j``, ``o ← α·o + p v`` (wgmma, p from registers, v from shared memory); ``m ← m_new``.
At the end ``O = o / d`` and ``lse = ln 2 · (m + log2 d)``; a row with no key keeps ``d = 0``: O = 0, lse = −inf.

Descriptors are made on the device per program over the sequence's own rows (``[S, D]`` at the (batch, head)
base; varlen: at the sequence's first row), so TMA fills rows past the sequence with zeros and clips the store of
O at the sequence's end: no masks for the tails of q, k, v or o. Requirements (checked by the plan,
``sm90_ws_eligible``): fp16 / bf16, a head dim of the plan's table (128, 256) with unit stride, 16-byte aligned
bases and row strides.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ..._triton.online import LN2
from .fwd import _band, _query_program, _seq, _tanh

WARPGROUP_ROWS = 64        # query rows per consumer warpgroup (wgmma's M)
CONSUMERS = 2              # consumer warpgroups per program: block_m = 128 (1 or 3 of them ran 25 % slower)
# registers per consumer thread: the SM's 64K less the producer's warpgroup at 24, over two warpgroups
CONSUMER_REGS = gl.constexpr(240)


@gluon.jit
def _producer(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, lo, n_tiles,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """TMA copies of the key / value tiles [lo + i·BLOCK_N, +BLOCK_N) into ring slot i % STAGES; a slot is
    refilled once every consumer warpgroup has released it (its empty barriers count them)."""
    for i in range(n_tiles):
        s = i % STAGES
        phase = (i // STAGES) & 1
        n0 = lo + i * BLOCK_N
        mbarrier.wait(k_empty.index(s), phase ^ 1)          # barriers start in phase 1: the first lap passes
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [n0, 0], k_ready.index(s), k_smem.index(s))
        mbarrier.wait(v_empty.index(s), phase ^ 1)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [n0, 0], v_ready.index(s), v_smem.index(s))


@gluon.jit
def _scores_tile(qk, n0, offs_m, offs_n, full_lo, full_hi, Sk, off, LEFT, RIGHT, qk_scale, cap_in, cap_out,
                 BLOCK_N: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr):
    """Step 1 after the matmul: base-2 scores, −inf outside the band (only tiles outside [full_lo, full_hi))."""
    if SOFTCAP:
        s = _tanh(qk * cap_in) * cap_out
    else:
        s = qk * qk_scale
    if (n0 < full_lo) | (n0 + BLOCK_N > full_hi):
        j = n0 + offs_n[None, :]
        keep = j < Sk
        if HAS_LEFT:
            keep = keep & (j >= offs_m[:, None] + (off - LEFT))
        if HAS_RIGHT:
            keep = keep & (j <= offs_m[:, None] + (off + RIGHT))
        s = gl.where(keep, s, float("-inf"))
    return s


@gluon.jit
def _softmax_step(s, m_i, l_i):
    """Steps 2-3 and d's part of step 4: (p, α, m_new, d_new). A row with no key so far takes m_ref = 0 (no NaN)."""
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_ref)
    p = gl.exp2(s - m_ref[:, None])
    l_new = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_new


@gluon.jit
def _consumer(q_all, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, o_desc, LSE, lse_off,
              m_blk, Sq, Sk, off, LEFT, RIGHT, lo, full_lo, full_hi, n_tiles, qk_scale, cap_in, cap_out,
              WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr,
              OVERLAP: gl.constexpr):
    """Consumer warpgroup WG: query rows [m_blk + WG·BLOCK_M, +BLOCK_M) of the program's block."""
    q_smem = q_all.index(WG)
    m0 = m_blk + WG * BLOCK_M
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    offs_m = m0 + gl.arange(0, BLOCK_M, layout=row_s)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    mbarrier.wait(q_bar, 0)

    if OVERLAP:
        # prologue: scores of tile 0
        if n_tiles > 0:
            mbarrier.wait(k_ready.index(0), 0)
            qk = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            qk = warpgroup_mma_wait(0, deps=[qk])
            mbarrier.arrive(k_empty.index(0), count=1)
            s = _scores_tile(qk, lo, offs_m, offs_n, full_lo, full_hi, Sk, off, LEFT, RIGHT, qk_scale, cap_in,
                             cap_out, BLOCK_N, HAS_LEFT, HAS_RIGHT, SOFTCAP)
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            for i in range(1, n_tiles):
                s_i = i % STAGES
                s_prev = (i - 1) % STAGES
                # 1. scores of tile i (async), then o += p v of tile i - 1 (async): the tensor cores take both
                mbarrier.wait(k_ready.index(s_i), (i // STAGES) & 1)
                qk = warpgroup_mma(q_smem, k_smem.index(s_i).permute((1, 0)), zero_s, use_acc=False,
                                   is_async=True)
                mbarrier.wait(v_ready.index(s_prev), ((i - 1) // STAGES) & 1)
                acc = warpgroup_mma(p_op, v_smem.index(s_prev), acc, is_async=True)
                qk = warpgroup_mma_wait(1, deps=[qk])
                mbarrier.arrive(k_empty.index(s_i), count=1)
                # 2-3. the softmax of tile i while p v of tile i - 1 runs
                n0 = lo + i * BLOCK_N
                s = _scores_tile(qk, n0, offs_m, offs_n, full_lo, full_hi, Sk, off, LEFT, RIGHT, qk_scale,
                                 cap_in, cap_out, BLOCK_N, HAS_LEFT, HAS_RIGHT, SOFTCAP)
                p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i)
                acc = warpgroup_mma_wait(0, deps=[acc])
                mbarrier.arrive(v_empty.index(s_prev), count=1)
                # 4. o <- α·o (p v of tile i is added next lap)
                acc = acc * gl.convert_layout(alpha, row_o)[:, None]
                p_op = gl.convert_layout(p.to(dtype), p_layout)
            s_last = (n_tiles - 1) % STAGES
            mbarrier.wait(v_ready.index(s_last), ((n_tiles - 1) // STAGES) & 1)
            acc = warpgroup_mma(p_op, v_smem.index(s_last), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
            mbarrier.arrive(v_empty.index(s_last), count=1)
    else:
        for i in range(n_tiles):
            s_i = i % STAGES
            phase = (i // STAGES) & 1
            mbarrier.wait(k_ready.index(s_i), phase)
            qk = warpgroup_mma(q_smem, k_smem.index(s_i).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            qk = warpgroup_mma_wait(0, deps=[qk])
            mbarrier.arrive(k_empty.index(s_i), count=1)
            s = _scores_tile(qk, lo + i * BLOCK_N, offs_m, offs_n, full_lo, full_hi, Sk, off, LEFT, RIGHT,
                             qk_scale, cap_in, cap_out, BLOCK_N, HAS_LEFT, HAS_RIGHT, SOFTCAP)
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            mbarrier.wait(v_ready.index(s_i), phase)
            acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), v_smem.index(s_i), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
            mbarrier.arrive(v_empty.index(s_i), count=1)

    # O = o / d, lse = ln 2 · (m + log2 d); no attended key: O = 0, lse = -inf
    l_o = gl.convert_layout(l_i, row_o)
    o = acc / gl.where(l_o == 0.0, 1.0, l_o)[:, None]
    empty = l_i == 0.0
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) * LN2)
    gl.store(LSE + lse_off + offs_m, lse, mask=offs_m < Sq)
    q_smem.store(o.to(dtype))                 # q is no longer read: its buffer stages O for the TMA store
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [m0, 0], q_smem)
    tma.store_wait(0)


@gluon.jit
def attention_fwd_sm90_kernel(
        Q, K, V, O, LSE, CU_Q, CU_K,
        sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som, slb, slh,
        H, GROUP, Sq, Sk, LEFT, RIGHT, qk_scale, cap_in, cap_out,
        HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
        HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr, REVERSE: gl.constexpr,
        VARLEN: gl.constexpr, OVERLAP: gl.constexpr):
    """Grid (cdiv(Sq, 2·BLOCK_M), B·H), num_warps = 4: two consumer warpgroups of BLOCK_M query rows each (the
    first is the default partition) and the producer warp. Arguments as ``fwd.attention_fwd_kernel`` less the
    unit head-dim strides."""
    ROWS: gl.constexpr = 2 * BLOCK_M
    pid_m, b, h, hk = _query_program(H, GROUP, REVERSE)
    m_blk = pid_m * ROWS
    q_start, Sq = _seq(CU_Q, b, Sq, VARLEN)
    k_start, Sk = _seq(CU_K, b, Sk, VARLEN)
    if m_blk < Sq:
        off = Sk - Sq
        lo, full_lo, full_hi, hi = _band(m_blk, Sq, Sk, off, LEFT, RIGHT, ROWS, BLOCK_N, HAS_LEFT, HAS_RIGHT)
        n_tiles = gl.cdiv(hi - lo, BLOCK_N)

        dtype: gl.constexpr = Q.dtype.element_ty
        q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
        kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
        q_base = Q + b.to(gl.int64) * sqb + h.to(gl.int64) * sqh + q_start.to(gl.int64) * sqm
        k_base = K + b.to(gl.int64) * skb + hk.to(gl.int64) * skh + k_start.to(gl.int64) * skn
        v_base = V + b.to(gl.int64) * svb + hk.to(gl.int64) * svh + k_start.to(gl.int64) * svn
        o_base = O + b.to(gl.int64) * sob + h.to(gl.int64) * soh + q_start.to(gl.int64) * som
        q_desc = tma.make_tensor_descriptor(q_base, [Sq, HEAD_DIM], [sqm, 1], [BLOCK_M, HEAD_DIM], q_layout)
        k_desc = tma.make_tensor_descriptor(k_base, [Sk, HEAD_DIM], [skn, 1], [BLOCK_N, HEAD_DIM], kv_layout)
        v_desc = tma.make_tensor_descriptor(v_base, [Sk, HEAD_DIM], [svn, 1], [BLOCK_N, HEAD_DIM], kv_layout)
        o_desc = tma.make_tensor_descriptor(o_base, [Sq, HEAD_DIM], [som, 1], [BLOCK_M, HEAD_DIM], q_layout)

        q_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_M, HEAD_DIM], q_layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
        bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
        q_bar = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)          # both consumer warpgroups release a slot
            mbarrier.init(v_empty.index(i), count=2)
        fence_async_shared()
        mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [m_blk, 0], q_bar, q_smem.index(0))
        tma.async_copy_global_to_shared(q_desc, [m_blk + BLOCK_M, 0], q_bar, q_smem.index(1))

        lse_off = b.to(gl.int64) * slb + h.to(gl.int64) * slh + q_start
        # the consumers' arguments are spelled out: constexprs inside a tuple built here would become tensors
        gl.warp_specialize([
            (_consumer, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, o_desc, LSE, lse_off,
                         m_blk, Sq, Sk, off, LEFT, RIGHT, lo, full_lo, full_hi, n_tiles, qk_scale, cap_in,
                         cap_out, 0, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, HAS_LEFT, HAS_RIGHT, SOFTCAP, OVERLAP)),
            (_consumer, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, o_desc, LSE, lse_off,
                         m_blk, Sq, Sk, off, LEFT, RIGHT, lo, full_lo, full_hi, n_tiles, qk_scale, cap_in,
                         cap_out, 1, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, HAS_LEFT, HAS_RIGHT, SOFTCAP, OVERLAP)),
            (_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, lo, n_tiles, BLOCK_N,
                         STAGES)),
        ], [4, 1], [CONSUMER_REGS, 24])
