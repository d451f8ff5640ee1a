"""Attention forward for Hopper (sm_90): the ``(m, d, o)`` recurrence of ``fwd.py`` with TMA, wgmma and a
warp-specialised producer (Gluon).

One program per (query block, head), as ``fwd.py``, or (``attention_fwd_sm90_persistent_kernel``) one per SM,
looping over the (query block, head) tiles. Its warps split in two partitions:

* the **producer** (one warp) copies key / value tiles global → shared memory with TMA into a ring of STAGES
  buffers, K and V on their own barriers (``k_ready`` / ``v_ready``), and waits for the consumers to release a
  buffer (``k_empty`` / ``v_empty``) before refilling it; the ring's counter runs on across a persistent
  program's tiles, so the next tile's keys (and its queries) arrive while this tile ends;
* the **consumers**, two warpgroups of BLOCK_M = 64 query rows each, run the recurrence on the same key /
  value tiles with asynchronous wgmma: the scores of tile j + 1 are issued before ``p v`` of tile j, so the
  tensor cores work on one while the exponentials of the other run (OVERLAP; FlashAttention-3's intra-warpgroup
  overlap). The warpgroups synchronise only through the ring's barriers, so one's exponentials run beside the
  other's matmuls as the warp schedulers find them.

Per key tile, in the paper's notation (base 2: ``c = log2 e · scale`` folded into one multiply):
1. ``s = c·q kᵀ`` (wgmma, q and k from shared memory), masked to −inf outside the band;
2. ``m_new = max(m, max_j s_j)``;
3. ``α = 2^(m − m_new)``, ``p = 2^(s − m_new)``;
4. ``d ← α·d + Σ_j p_j``, ``o ← α·o + p v`` (wgmma, p from registers, v from shared memory); ``m ← m_new``.
FOLD (c > 0, no softcap): the row max is taken over ``q kᵀ`` and scaled once per row, ``p = 2^(qk·c − m_new)``
is one FFMA per score (not a multiply and a subtraction).
At the end ``O = o / d`` and ``lse = ln 2 · (m + log2 d)``; a row with no key keeps ``d = 0``: O = 0, lse = −inf.

Descriptors of the per-tile kernel are made on the device per program over the sequence's own rows (``[S, D]``
at the (batch, head) base; varlen: at the sequence's first row), so TMA fills rows past the sequence with zeros
and clips the store of O at the sequence's end: no masks for the tails of q, k, v or o. The persistent kernel
takes host descriptors over ``[B, H, S, D]`` (4-D boxes ``[1, 1, rows, D]``: the same zero fill and clipping at
S, no varlen) and stages O in its own buffer, so the store of one tile overlaps the next tile's matmuls, or
(O_DIRECT) stores O from registers, which leaves that buffer's shared memory to the ring. Its work units are the
tiles head by head, or (PAIRS) the pairs of query blocks (i, n_m − 1 − i) of one head, whose causal key counts
add up to the same number: a balanced round-robin over the programs.
Requirements (checked by the plan, ``sm90_ws_eligible``): fp16 / bf16, a head dim of the plan's table with unit
stride, 16-byte aligned bases and row strides.
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
def _copy_in(desc, b, h, row, bar, dst, RANK4: gl.constexpr):
    """TMA copy of rows [row, +block) of head (b, h): a per-sequence 2-D descriptor, or the [B, H, S, D] one."""
    if RANK4:
        tma.async_copy_global_to_shared(desc, [b, h, row, 0], bar, dst)
    else:
        tma.async_copy_global_to_shared(desc, [row, 0], bar, dst)


@gluon.jit
def _mat(buf, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr, RANK4: gl.constexpr):
    """A [ROWS, HEAD_DIM] view of one tile buffer (4-D boxes [1, 1, ROWS, HEAD_DIM] drop their unit dims)."""
    view = buf
    if RANK4:
        view = buf.reshape([ROWS, HEAD_DIM])
    return view


@gluon.jit
def _load_kv(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, b, hk, lo, n_tiles, it0,
             BLOCK_N: gl.constexpr, STAGES: gl.constexpr, RANK4: gl.constexpr):
    """TMA copies of the key / value tiles [lo + i·BLOCK_N, +BLOCK_N) into ring slot (it0 + i) % STAGES; a slot is
    refilled once every consumer warpgroup has released it (its empty barriers count them)."""
    for i in range(n_tiles):
        c = it0 + i
        s = c % STAGES
        phase = (c // STAGES) & 1
        n0 = lo + i * BLOCK_N
        mbarrier.wait(k_empty.index(s), phase ^ 1)          # barriers start in phase 1: the first lap passes
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        _copy_in(k_desc, b, hk, n0, k_ready.index(s), k_smem.index(s), RANK4)
        mbarrier.wait(v_empty.index(s), phase ^ 1)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        _copy_in(v_desc, b, hk, n0, v_ready.index(s), v_smem.index(s), RANK4)


@gluon.jit
def _producer(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, lo, n_tiles,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    _load_kv(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, 0, 0, lo, n_tiles, 0, BLOCK_N,
             STAGES, False)


@gluon.jit
def _scores_tile(qk, n0, offs_m, offs_n, full_lo, full_hi, Sk, off, LEFT, RIGHT, qk_scale, cap_in, cap_out,
                 BLOCK_N: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr,
                 FOLD: gl.constexpr):
    """Step 1 after the matmul: base-2 scores (FOLD: q kᵀ itself, c applied in the softmax step), −inf outside the
    band (only tiles outside [full_lo, full_hi))."""
    if SOFTCAP:
        s = _tanh(qk * cap_in) * cap_out
    elif FOLD:
        s = qk
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
def _softmax_step(s, m_i, l_i, qk_scale, FOLD: gl.constexpr):
    """Steps 2-3 and d's part of step 4: (p, α, m_new, d_new). A row with no key so far takes m_ref = 0 (no NaN).
    FOLD: s is q kᵀ and c = qk_scale > 0, so max_j c·s_j = c·max_j s_j and p = 2^(s·c − m_ref) is one FFMA."""
    if FOLD:
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s * qk_scale - m_ref[:, None])
    else:
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - m_ref[:, None])
    alpha = gl.exp2(m_i - m_ref)
    l_new = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_new


@gluon.jit
def _attend(q_smem, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, q_empty, it0, m0, Sk, off, LEFT, RIGHT,
            lo, full_lo, full_hi, n_tiles, qk_scale, cap_in, cap_out,
            HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
            HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr, OVERLAP: gl.constexpr,
            FOLD: gl.constexpr, RANK4: gl.constexpr, RELEASE_Q: gl.constexpr):
    """Steps 1-4 of one warpgroup's BLOCK_M query rows from m0 over the key tiles [lo, lo + n_tiles·BLOCK_N), in ring
    slots (it0 + i) % STAGES. Returns (o, m, d) in o's / the scores' row layouts. RELEASE_Q: q_empty is arrived
    once the last scores are read (the producer may then copy the next tile's queries)."""
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

    if OVERLAP:
        # prologue: scores of tile 0
        if n_tiles > 0:
            s0 = it0 % STAGES
            mbarrier.wait(k_ready.index(s0), (it0 // STAGES) & 1)
            k_t = _mat(k_smem.index(s0), BLOCK_N, HEAD_DIM, RANK4).permute((1, 0))
            qk = warpgroup_mma(q_smem, k_t, zero_s, use_acc=False, is_async=True)
            qk = warpgroup_mma_wait(0, deps=[qk])
            mbarrier.arrive(k_empty.index(s0), count=1)
            s = _scores_tile(qk, lo, offs_m, offs_n, full_lo, full_hi, Sk, off, LEFT, RIGHT, qk_scale, cap_in,
                             cap_out, BLOCK_N, HAS_LEFT, HAS_RIGHT, SOFTCAP, FOLD)
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, FOLD)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            for i in range(1, n_tiles):
                c = it0 + i
                s_i = c % STAGES
                s_prev = (c - 1) % STAGES
                # 1. scores of tile i (async), then o += p v of tile i - 1 (async): the tensor cores take both
                mbarrier.wait(k_ready.index(s_i), (c // STAGES) & 1)
                k_t = _mat(k_smem.index(s_i), BLOCK_N, HEAD_DIM, RANK4).permute((1, 0))
                qk = warpgroup_mma(q_smem, k_t, zero_s, use_acc=False, is_async=True)
                mbarrier.wait(v_ready.index(s_prev), ((c - 1) // STAGES) & 1)
                acc = warpgroup_mma(p_op, _mat(v_smem.index(s_prev), BLOCK_N, HEAD_DIM, RANK4), acc,
                                    is_async=True)
                qk = warpgroup_mma_wait(1, deps=[qk])
                mbarrier.arrive(k_empty.index(s_i), count=1)
                # 2-3. the softmax of tile i while p v of tile i - 1 runs
                n0 = lo + i * BLOCK_N
                s = _scores_tile(qk, n0, offs_m, offs_n, full_lo, full_hi, Sk, off, LEFT, RIGHT, qk_scale,
                                 cap_in, cap_out, BLOCK_N, HAS_LEFT, HAS_RIGHT, SOFTCAP, FOLD)
                p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, FOLD)
                acc = warpgroup_mma_wait(0, deps=[acc])
                mbarrier.arrive(v_empty.index(s_prev), count=1)
                # 4. o <- α·o (p v of tile i is added next lap)
                acc = acc * gl.convert_layout(alpha, row_o)[:, None]
                p_op = gl.convert_layout(p.to(dtype), p_layout)
            if RELEASE_Q:
                mbarrier.arrive(q_empty, count=1)
            c_last = it0 + n_tiles - 1
            s_last = c_last % STAGES
            mbarrier.wait(v_ready.index(s_last), (c_last // STAGES) & 1)
            acc = warpgroup_mma(p_op, _mat(v_smem.index(s_last), BLOCK_N, HEAD_DIM, RANK4), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
            mbarrier.arrive(v_empty.index(s_last), count=1)
        elif RELEASE_Q:
            mbarrier.arrive(q_empty, count=1)
    else:
        for i in range(n_tiles):
            c = it0 + i
            s_i = c % STAGES
            phase = (c // STAGES) & 1
            mbarrier.wait(k_ready.index(s_i), phase)
            k_t = _mat(k_smem.index(s_i), BLOCK_N, HEAD_DIM, RANK4).permute((1, 0))
            qk = warpgroup_mma(q_smem, k_t, zero_s, use_acc=False, is_async=True)
            qk = warpgroup_mma_wait(0, deps=[qk])
            mbarrier.arrive(k_empty.index(s_i), count=1)
            s = _scores_tile(qk, lo + i * BLOCK_N, offs_m, offs_n, full_lo, full_hi, Sk, off, LEFT, RIGHT,
                             qk_scale, cap_in, cap_out, BLOCK_N, HAS_LEFT, HAS_RIGHT, SOFTCAP, FOLD)
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, FOLD)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            mbarrier.wait(v_ready.index(s_i), phase)
            acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout),
                                _mat(v_smem.index(s_i), BLOCK_N, HEAD_DIM, RANK4), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
            mbarrier.arrive(v_empty.index(s_i), count=1)
        if RELEASE_Q:
            mbarrier.arrive(q_empty, count=1)
    return acc, m_i, l_i


@gluon.jit
def _finish(acc, m_i, l_i):
    """O = o / d, lse = ln 2 · (m + log2 d); no attended key: O = 0, lse = -inf."""
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, acc.type.layout))
    o = acc / gl.where(l_o == 0.0, 1.0, l_o)[:, None]
    empty = l_i == 0.0
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) * LN2)
    return o, lse


@gluon.jit
def _consumer(q_all, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, o_desc, LSE, lse_off,
              m_blk, Sq, Sk, off, LEFT, RIGHT, lo, full_lo, full_hi, n_tiles, qk_scale, cap_in, cap_out,
              WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr,
              OVERLAP: gl.constexpr, FOLD: gl.constexpr):
    """Consumer warpgroup WG: query rows [m_blk + WG·BLOCK_M, +BLOCK_M) of the program's block."""
    q_smem = q_all.index(WG)
    m0 = m_blk + WG * BLOCK_M
    mbarrier.wait(q_bar, 0)
    acc, m_i, l_i = _attend(q_smem, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, q_bar, 0, m0, Sk, off,
                            LEFT, RIGHT, lo, full_lo, full_hi, n_tiles, qk_scale, cap_in, cap_out, HEAD_DIM,
                            BLOCK_M, BLOCK_N, STAGES, HAS_LEFT, HAS_RIGHT, SOFTCAP, OVERLAP, FOLD, False, False)
    o, lse = _finish(acc, m_i, l_i)
    offs_m = m0 + gl.arange(0, BLOCK_M, layout=lse.type.layout)
    gl.store(LSE + lse_off + offs_m, lse, mask=offs_m < Sq)
    q_smem.store(o.to(q_smem.dtype))          # q is no longer read: its buffer stages O for the TMA store
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
        VARLEN: gl.constexpr, OVERLAP: gl.constexpr, FOLD: gl.constexpr):
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
                         cap_out, 0, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, HAS_LEFT, HAS_RIGHT, SOFTCAP, OVERLAP, FOLD)),
            (_consumer, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, o_desc, LSE, lse_off,
                         m_blk, Sq, Sk, off, LEFT, RIGHT, lo, full_lo, full_hi, n_tiles, qk_scale, cap_in,
                         cap_out, 1, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, HAS_LEFT, HAS_RIGHT, SOFTCAP, OVERLAP, FOLD)),
            (_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, lo, n_tiles, BLOCK_N,
                         STAGES)),
        ], [4, 1], [CONSUMER_REGS, 24])


# ---- persistent: one program per SM, looping over the (query block, head) tiles ---------------------------------
@gluon.jit
def _units(n_m, BH, PAIRS: gl.constexpr):
    """Work units of the persistent grid: (query block, head) tiles, or with PAIRS the pairs of query blocks
    (i, n_m − 1 − i) of one head (the middle block alone when n_m is odd)."""
    units = n_m * BH
    if PAIRS:
        units = gl.cdiv(n_m, 2) * BH
    return units


@gluon.jit
def _halves(u, n_m, PAIRS: gl.constexpr):
    """Tiles in work unit u: 1, or with PAIRS 2 (1 for the middle block of an odd n_m)."""
    n = 1
    if PAIRS:
        n_pairs = gl.cdiv(n_m, 2)
        n = 2 - ((n_m % 2) & (u % n_pairs == n_pairs - 1).to(gl.int32))
    return n


@gluon.jit
def _pair_block(u, half, n):
    """(block, head) of tile ``half`` of pair unit u = (head, i): block n − 1 − i, then block i (the backward's
    persistent grid pairs its key blocks the same way)."""
    n_pairs = gl.cdiv(n, 2)
    i = u % n_pairs
    blk = n - 1 - i
    if half == 1:
        blk = i
    return blk, u // n_pairs


@gluon.jit
def _tile(u, half, n_m, H, GROUP, REVERSE: gl.constexpr, PAIRS: gl.constexpr):
    """(query block, batch, head, kv head) of tile ``half`` of work unit u: heads in turn (a head's keys stay in
    L2 while its query blocks run), within a head the longest rows first when REVERSE (banded), as the per-tile
    grid launches. PAIRS: unit u = (head, i) runs block n_m − 1 − i, then block i; under a causal mask their key
    ranges add up to the same count for every i, so a round-robin of units over the programs is balanced."""
    if PAIRS:
        pid_m, bh = _pair_block(u, half, n_m)
    else:
        bh = u // n_m
        pid_m = u % n_m
        if REVERSE:
            pid_m = n_m - 1 - pid_m
    h = bh % H
    return pid_m, bh // H, h, h // GROUP


@gluon.jit
def _producer_persistent(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready,
                         k_empty, v_empty, H, GROUP, Sq, Sk, LEFT, RIGHT, n_m, units,
                         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                         HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, REVERSE: gl.constexpr,
                         PAIRS: gl.constexpr):
    """Per tile: the first key tile, then each warpgroup's queries once it released the last tile's (its last
    scores were read), then the remaining key / value tiles; the ring's counter runs on across tiles."""
    ROWS: gl.constexpr = 2 * BLOCK_M
    it = 0
    lap = 0
    for u in range(gl.program_id(0), units, gl.num_programs(0)):
        for half in range(_halves(u, n_m, PAIRS)):
            pid_m, b, h, hk = _tile(u, half, n_m, H, GROUP, REVERSE, PAIRS)
            m_blk = pid_m * ROWS
            lo, full_lo, full_hi, hi = _band(m_blk, Sq, Sk, Sk - Sq, LEFT, RIGHT, ROWS, BLOCK_N, HAS_LEFT,
                                             HAS_RIGHT)
            n_tiles = gl.cdiv(hi - lo, BLOCK_N)
            first = gl.minimum(n_tiles, 1)
            _load_kv(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, b, hk, lo, first, it,
                     BLOCK_N, STAGES, True)
            for wg in gl.static_range(2):
                mbarrier.wait(q_empty.index(wg), (lap & 1) ^ 1)
                mbarrier.expect(q_ready.index(wg), q_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(q_desc, [b, h, m_blk + wg * BLOCK_M, 0], q_ready.index(wg),
                                                q_smem.index(wg))
            _load_kv(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, b, hk,
                     lo + first * BLOCK_N, n_tiles - first, it + first, BLOCK_N, STAGES, True)
            it += n_tiles
            lap += 1


@gluon.jit
def _consumer_persistent(q_smem, o_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
                         o_desc, O, sob, soh, som, LSE, slb, slh, H, GROUP, Sq, Sk, LEFT, RIGHT, n_m, units,
                         qk_scale, cap_in, cap_out, WG: gl.constexpr, HEAD_DIM: gl.constexpr,
                         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                         HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr,
                         REVERSE: gl.constexpr, OVERLAP: gl.constexpr, FOLD: gl.constexpr, PAIRS: gl.constexpr,
                         O_DIRECT: gl.constexpr):
    """Consumer warpgroup WG of every tile of the program: rows [m_blk + WG·BLOCK_M, +BLOCK_M). O leaves through
    its own buffer: the TMA store of tile t runs on while tile t + 1's matmuls do, and is waited for only before
    the buffer is written again. O_DIRECT: O is stored from the registers (o's wgmma layout, rows past Sq
    masked), no buffer: its shared memory goes to the ring."""
    ROWS: gl.constexpr = 2 * BLOCK_M
    q_wg = _mat(q_smem.index(WG), BLOCK_M, HEAD_DIM, True)
    o_wg = o_smem.index(WG)
    it = 0
    lap = 0
    for u in range(gl.program_id(0), units, gl.num_programs(0)):
        for half in range(_halves(u, n_m, PAIRS)):
            pid_m, b, h, hk = _tile(u, half, n_m, H, GROUP, REVERSE, PAIRS)
            m_blk = pid_m * ROWS
            off = Sk - Sq
            lo, full_lo, full_hi, hi = _band(m_blk, Sq, Sk, off, LEFT, RIGHT, ROWS, BLOCK_N, HAS_LEFT, HAS_RIGHT)
            n_tiles = gl.cdiv(hi - lo, BLOCK_N)
            m0 = m_blk + WG * BLOCK_M
            mbarrier.wait(q_ready.index(WG), lap & 1)
            acc, m_i, l_i = _attend(q_wg, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, q_empty.index(WG),
                                    it, m0, Sk, off, LEFT, RIGHT, lo, full_lo, full_hi, n_tiles, qk_scale, cap_in,
                                    cap_out, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                                    OVERLAP, FOLD, True, True)
            it += n_tiles
            lap += 1
            o, lse = _finish(acc, m_i, l_i)
            offs_m = m0 + gl.arange(0, BLOCK_M, layout=lse.type.layout)
            gl.store(LSE + b.to(gl.int64) * slb + h.to(gl.int64) * slh + offs_m, lse, mask=offs_m < Sq)
            if O_DIRECT:
                rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o.type.layout))
                cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o.type.layout))
                o_ptr = O + b.to(gl.int64) * sob + h.to(gl.int64) * soh
                gl.store(o_ptr + rows.to(gl.int64)[:, None] * som + cols[None, :], o.to(O.dtype.element_ty),
                         mask=(rows < Sq)[:, None])
            else:
                tma.store_wait(0)                     # the last tile's O has left the buffer
                _mat(o_wg, BLOCK_M, HEAD_DIM, True).store(o.to(o_smem.dtype))
                fence_async_shared()
                tma.async_copy_shared_to_global(o_desc, [b, h, m0, 0], o_wg)
    if not O_DIRECT:
        tma.store_wait(0)


@gluon.jit(do_not_specialize=["Sq", "Sk", "n_m", "units"])      # one compile serves every sequence length
def attention_fwd_sm90_persistent_kernel(
        q_desc, k_desc, v_desc, o_desc, O, sob, soh, som, LSE, slb, slh,
        H, GROUP, Sq, Sk, LEFT, RIGHT, qk_scale, cap_in, cap_out, n_m, units,
        HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
        HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SOFTCAP: gl.constexpr, REVERSE: gl.constexpr,
        OVERLAP: gl.constexpr, FOLD: gl.constexpr, PAIRS: gl.constexpr, O_DIRECT: gl.constexpr):
    """Grid (programs,), num_warps = 4; work units u = 0 .. units − 1 (``_units``: the n_m · B · H query blocks of
    2·BLOCK_M rows, or with PAIRS their pairs) go to program u mod programs. Host descriptors over q, o [B, H, Sq, D]
    (boxes [1, 1, BLOCK_M, D]) and k, v [B, Hkv, Sk, D] (boxes [1, 1, BLOCK_N, D]); O (with O_DIRECT, stored from
    registers) row i of (b, h) at b·sob + h·soh + i·som; LSE (float32) row i of (b, h) at b·slb + h·slh + i.
    Shared memory: q (2 × BLOCK_M × D), O staging as much unless O_DIRECT, the ring (2 × STAGES × BLOCK_N × D)."""
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
    o_smem = q_smem                                           # unused with O_DIRECT
    if not O_DIRECT:
        o_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, BLOCK_M, HEAD_DIM], o_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    for i in gl.static_range(2):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1)              # its own warpgroup releases a query buffer
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)              # both consumer warpgroups release a slot
        mbarrier.init(v_empty.index(i), count=2)
    fence_async_shared()
    gl.warp_specialize([
        (_consumer_persistent, (q_smem, o_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                                v_empty, o_desc, O, sob, soh, som, LSE, slb, slh, H, GROUP, Sq, Sk, LEFT, RIGHT,
                                n_m, units, qk_scale, cap_in, cap_out, 0, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                                HAS_LEFT, HAS_RIGHT, SOFTCAP, REVERSE, OVERLAP, FOLD, PAIRS, O_DIRECT)),
        (_consumer_persistent, (q_smem, o_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                                v_empty, o_desc, O, sob, soh, som, LSE, slb, slh, H, GROUP, Sq, Sk, LEFT, RIGHT,
                                n_m, units, qk_scale, cap_in, cap_out, 1, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                                HAS_LEFT, HAS_RIGHT, SOFTCAP, REVERSE, OVERLAP, FOLD, PAIRS, O_DIRECT)),
        (_producer_persistent, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready,
                                k_empty, v_empty, H, GROUP, Sq, Sk, LEFT, RIGHT, n_m, units, BLOCK_M, BLOCK_N,
                                STAGES, HAS_LEFT, HAS_RIGHT, REVERSE, PAIRS)),
    ], [4, 1], [CONSUMER_REGS, 24])
