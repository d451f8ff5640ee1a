"""Attention backward for Hopper (sm_90): dK, dV and dQ of ``bwd.py`` in one kernel with TMA, wgmma and a
warp-specialised producer (Gluon; FlashAttention-3's backward structure).

One program per (key block of 2·BLOCK_N keys, kv head), or (``attention_bwd_sm90_persistent_kernel``, the plan's
``programs``) one per SM looping over those units: the producer loads the next block's K and V as soon as both
consumers' last matmuls of a block are done (one K / V buffer: a second fits at no head dim) and its Q / dO ring runs
on across blocks, while the consumers store the finished block's dK and dV. Its warps split in three partitions:

* the **producer** (one warp) copies the Q and dO tiles of the query rows that attend the block (``_q_band``),
  for each query head of the GQA group in turn, global → shared memory with TMA into a ring of STAGES slots
  (``q_ready`` / ``do_ready``), and refills a slot once both consumers released it (``empty``);
* two **consumers**, warpgroups of BLOCK_N keys each, hold their keys' dK and dV accumulators in registers for
  the whole program; K and V stay in shared memory.

Per query tile of BLOCK_M rows (transposed, rows = keys, as ``bwd._dkdv_steps``), the lse and Δ of the tile's rows
read once per thread and spread over the columns as the initial accumulators of the first two matmuls:
1. ``Sᵀ = K Qᵀ − lse·log2 e / (scale·log2 e)`` and ``dPᵀ − Δ = V dOᵀ − Δ`` (both async), then
   ``Pᵀ = 2^(scale·log2 e · (Sᵀ − …))`` masked to the band (no lse / Δ registers held across the matmuls);
2. ``dV += Pᵀ dO`` and ``dK += dSᵀ Q`` with ``dSᵀ = Pᵀ ⊙ (dPᵀ − Δ)``, Pᵀ and dSᵀ stored to shared memory and read
   from there by wgmma (FlashAttention-3 at D = 128: no operand registers held while the matmuls run);
3. ``dQ += dS K`` (wgmma reads dSᵀ transposed). SPLIT_DQ (D = 128): both warpgroups write their halves of the
   tile's ``[2·BLOCK_N keys, BLOCK_M]`` dSᵀ (a two-slot ring between them, ``ds_ready`` / ``ds_empty``) and each
   forms dQ for half the head dim over all 2·BLOCK_N keys, so a thread holds BLOCK_M·D/2 / 128 fp32 of dQ, not
   BLOCK_M·D / 128; otherwise (D = 64) each warpgroup forms dQ over its own keys. dQ is added with fp32 atomics
   (two consecutive per thread, from the accumulator's layout) into the rows of the buffer the Δ kernel zeroed
   (``bwd.attention_bwd_dq_cast_kernel`` scales and casts it): BLOCK_M·D fp32 per tile and program (SPLIT_DQ),
   twice that without.
Knobs (the plan's, off unless asked for): STAGE_ROWS, the producer also stages each tile's lse·log2 e and Δ in
shared memory (the consumers read them where used, after the matmuls; no global load on their path); DQ_TMA, each
warpgroup writes its fp32 dQ partial [BLOCK_M, 64] to shared memory and one thread adds it with a TMA reduce
(``cp.reduce.async.bulk.tensor .add``; rows past Sq clipped by the descriptor), waited one tile later, instead of
32 two-wide atomics per thread; DQ_SLOT, that partial written where the tile's Q (warpgroup 0) or dO (warpgroup 1)
was once both warpgroups' matmuls have read the slot, the slot refilled one tile later (no dQ tiles of their own:
D = 128 has room for a third slot, D = 256 for the TMA reduce at all); DQ_ROWS (D = 64, 128 rows per step), the
warpgroups split dQ by rows, each forming BLOCK_M/2 rows over all 2·BLOCK_N keys from the shared dSᵀ ring (half
the fp32 bytes reduced per tile, half the dQ registers); LPT_HEADS, the programs run longest first (``_lpt_order``).
At the end ``dK ← scale·dK``; dK and dV are stored once (a GQA group's heads are summed here: no atomics).
SPLIT_D (D = 256, ``_consumer_split_d``): dK and dV of 64 keys × 256 would take 256 registers a thread in one
warpgroup, so the program holds 64 keys, each warpgroup forms S and dP for 32 of them (not transposed: wgmma's M
is the 64 query rows) and dK, dV, dQ for half the head dim over all 64 (FlashAttention-3's D = 256 split).

Rows past Sq read zeros (TMA) and an lse of +inf (so does a row with no key: lse = −inf), so their P is 0; query
tiles that cross the band or Sk are masked (``_q_band``'s full range). Requirements (checked by the plan,
``sm90_bwd_eligible``): fp16 / bf16, D = 64 / 128 / 256 with unit stride, 16-byte aligned bases and strides of q, k, v,
dO (TMA), no softcap; a nonzero scale (step 1 divides by it: the api refuses 0).
"""

from __future__ import annotations

from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ..._triton.online import LOG2E
from .bwd import _keep_t, _q_band
from .fwd import _keep, _seq
from .fwd_sm90 import _halves, _pair_block

CONSUMERS = 2              # consumer warpgroups per program
# by head dim: (the query rows per step it runs, keys per program). D <= 128: 64 keys per warpgroup (wgmma's M for
# Sᵀ, dPᵀ, dK, dV), 64 query rows (N for Sᵀ, dPᵀ; M for dQ), 128 at D = 64 (Sᵀ, dPᵀ: 64 fp32 registers each beside
# dK, dV's 32 each and dQ's 64); D = 256 (SPLIT_D): 32 keys per warpgroup for S, dP, dK / dV / dQ split by columns
TILES = {64: ((64, 128), 128), 128: ((64,), 128), 256: ((64,), 64)}
# registers per thread of the worker consumer warpgroup; the producer's warpgroup takes the kernel's PRODUCER_REGS
# (``BackwardPlan.producer_regs``, default 32: it loads lse / Δ with STAGE_ROWS) and the default-partition consumer
# the rest of 384 threads × 168: 504 − 240 − PRODUCER_REGS per thread
CONSUMER_REGS = gl.constexpr(240)


@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """``tma.async_copy_shared_to_global`` that adds into the destination (``cp.reduce.async.bulk.tensor .add``):
    Gluon 3.6 builds the op (``create_async_tma_reduce``) but has no wrapper for it. Completes as a TMA store
    (``tma.store_wait``)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _copy_tile(desc, b, h0, g, m0, bar, dst, RANK4: gl.constexpr):
    """TMA copy of rows [m0, +BLOCK_M) of the GQA group's query head g into dst: a per-program [group head, row,
    dim] descriptor from the group's first head h0, or (RANK4: the persistent grid) a host [B, H, S, D] one."""
    if RANK4:
        tma.async_copy_global_to_shared(desc, [b, h0 + g, m0, 0], bar, dst.reshape(desc.block_shape))
    else:
        tma.async_copy_global_to_shared(desc, [g, m0, 0], bar, dst.reshape(desc.block_shape))


@gluon.jit
def _dq_reduce(desc, b, h0, g, m0, col0, src, RANK4: gl.constexpr):
    """dQ's fp32 partial tile src added at rows m0.., columns col0.. of query head g (descriptors as _copy_tile)."""
    if RANK4:
        _tma_reduce_add(desc, [b, h0 + g, m0, col0], src.reshape(desc.block_shape))
    else:
        _tma_reduce_add(desc, [g, m0, col0], src.reshape(desc.block_shape))


@gluon.jit
def _fill(q_desc, do_desc, q_smem, do_smem, rows_smem, q_ready, do_ready, empty, LSE, DELTA, row_base, slh, Sq,
          b, h0, lo, n_m, n_tiles, it0,
          BLOCK_M: gl.constexpr, STAGES: gl.constexpr, STAGE_ROWS: gl.constexpr, RANK4: gl.constexpr):
    """Tile i = g·n_m + t of a key block: rows [lo + t·BLOCK_M, +BLOCK_M) of the group's query head g, into slot
    (it0 + i) % STAGES (the ring's counter runs on across a persistent program's key blocks). STAGE_ROWS: also the
    tile's lse·log2 e and Δ into rows_smem[2s], rows_smem[2s + 1], so no consumer waits on a global load; q_ready
    then takes a second arrival."""
    offs = gl.arange(0, BLOCK_M, layout=gl.BlockedLayout([2], [32], [1], [0]))
    for i in range(n_tiles):
        it = it0 + i
        s = it % STAGES
        g = i // n_m
        m0 = lo + (i - g * n_m) * BLOCK_M
        if STAGE_ROWS:      # loads issued before the slot wait: their latency hides behind it
            in_q = m0 + offs < Sq
            rows = row_base + g * slh + m0 + offs
            lse = gl.load(LSE + rows, mask=in_q, other=float("inf"))
            delta = gl.load(DELTA + rows, mask=in_q, other=0.0)
        mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)     # barriers start in phase 1: lap 0 passes
        mbarrier.expect(q_ready.index(s), q_desc.block_type.nbytes)
        # the [BLOCK_M, D] slot seen as the descriptor's [1, (1,) BLOCK_M, D] box
        _copy_tile(q_desc, b, h0, g, m0, q_ready.index(s), q_smem.index(s), RANK4)
        mbarrier.expect(do_ready.index(s), do_desc.block_type.nbytes)
        _copy_tile(do_desc, b, h0, g, m0, do_ready.index(s), do_smem.index(s), RANK4)
        if STAGE_ROWS:
            lse = gl.where(lse == float("-inf"), float("inf"), lse)          # no key: P = 0
            rows_smem.index(2 * s).store(lse * LOG2E)
            rows_smem.index(2 * s + 1).store(delta)
            mbarrier.arrive(q_ready.index(s), count=1)      # (its bar.sync: the warp's stores are done)


@gluon.jit
def _producer(q_desc, do_desc, q_smem, do_smem, rows_smem, q_ready, do_ready, empty, LSE, DELTA, row_base, slh,
              Sq, lo, n_m, n_tiles,
              BLOCK_M: gl.constexpr, STAGES: gl.constexpr, STAGE_ROWS: gl.constexpr):
    _fill(q_desc, do_desc, q_smem, do_smem, rows_smem, q_ready, do_ready, empty, LSE, DELTA, row_base, slh, Sq, 0, 0,
          lo, n_m, n_tiles, 0, BLOCK_M, STAGES, STAGE_ROWS, False)


@gluon.jit
def _dq_into_slot(dq, q_smem, do_smem, drained, dq_desc, s, phase, b, h0, g, m0, col0,
                  BLOCK_M: gl.constexpr, COLS: gl.constexpr, WG: gl.constexpr, RANK4: gl.constexpr):
    """DQ_SLOT: once both warpgroups' matmuls of the tile have read slot s (``drained``), the fp32 dQ partial
    [BLOCK_M, COLS] (half the tile's dQ: rows m0.., columns col0..) of warpgroup 0 goes where the slot's Q tile
    was, warpgroup 1's where its dO tile was (the same bytes), and one TMA reduce adds it to the buffer; the slot
    returns to the producer one tile later (``_release_drained``), once the reduce has read it."""
    mbarrier.arrive(drained.index(s), count=1)
    mbarrier.wait(drained.index(s), phase)
    gl.static_assert(BLOCK_M * COLS * 4 == q_smem.shape[1] * q_smem.shape[2] * 2,
                     "dQ's fp32 half tile takes a 16-bit Q / dO slot's bytes")
    dq_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, COLS], gl.float32)
    if WG == 0:
        buf = q_smem.index(s)._reinterpret(gl.float32, [BLOCK_M, COLS], dq_layout)
    else:
        buf = do_smem.index(s)._reinterpret(gl.float32, [BLOCK_M, COLS], dq_layout)
    buf.store(dq)
    fence_async_shared()
    _dq_reduce(dq_desc, b, h0, g, m0, col0, buf, RANK4)


@gluon.jit
def _release_drained(empty, it, STAGES: gl.constexpr):
    """DQ_SLOT: the previous tile's slot back to the producer once its dQ reduce has read it (waited here, after
    this tile's first matmuls are issued, not where it was issued)."""
    if it > 0:
        tma.store_wait(0)
        mbarrier.arrive(empty.index((it - 1) % STAGES), count=1)     # (its bar.sync: the issuing thread waited)


@gluon.jit
def _consumer_unit(k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, rows_smem, dq_smem, q_ready, do_ready, empty,
                   ds_ready, ds_empty, drained, dq_desc, LSE, DELTA, DQACC, row_base, slh, b, h0, n0,
                   Sq, Sk, off, LEFT, RIGHT, lo, full_lo, full_hi, n_m, n_tiles, it0, qk_scale,
                   WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   STAGES: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SPLIT_DQ: gl.constexpr,
                   STAGE_ROWS: gl.constexpr, DQ_TMA: gl.constexpr, DQ_SLOT: gl.constexpr, DQ_BY_ROWS: gl.constexpr,
                   RANK4: gl.constexpr):
    """Consumer warpgroup WG over one key block's query tiles (ring slots from counter it0): keys
    [n0 + WG·BLOCK_N, +BLOCK_N), K and V in shared memory. SPLIT_DQ: dQ over all 2·BLOCK_N keys from the shared dSᵀ
    ring, for half the head dim, or (DQ_BY_ROWS) for half the tile's rows. Returns (dK / scale, dV); a DQ_TMA reduce
    of the last tile may still be reading dq_smem."""
    dtype: gl.constexpr = k_smem.dtype
    DQ_M: gl.constexpr = BLOCK_M // 2 if DQ_BY_ROWS else BLOCK_M
    DQ_COLS: gl.constexpr = HEAD_DIM // 2 if SPLIT_DQ and not DQ_BY_ROWS else HEAD_DIM
    k_w = k_smem.slice(WG * BLOCK_N, BLOCK_N)
    v_w = v_smem.slice(WG * BLOCK_N, BLOCK_N)
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DQ_COLS, 16])
    offs_n = n0 + WG * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))    # keys (rows)
    col: gl.constexpr = gl.SliceLayout(0, s_layout)
    offs_q = gl.arange(0, BLOCK_M, layout=col)                                                  # queries (cols)
    offs_v = gl.arange(0, BLOCK_M, layout=gl.BlockedLayout([1], [32], [4], [0]))
    # dQ's atomics straight from the accumulator's layout: 2 consecutive fp32 per thread (v2), 8 rows of 32 bytes
    # (whole sectors) per warp instruction
    dq_rows = gl.arange(0, DQ_M, layout=gl.SliceLayout(1, dq_layout))
    dq_offs = dq_rows[:, None] * HEAD_DIM + gl.arange(0, DQ_COLS, layout=gl.SliceLayout(0, dq_layout))[None, :]
    dq_col0: gl.constexpr = WG * DQ_COLS if SPLIT_DQ and not DQ_BY_ROWS else 0
    dq_row0: gl.constexpr = WG * DQ_M if DQ_BY_ROWS else 0
    dq_offs += dq_row0 * HEAD_DIM + dq_col0

    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
    zero_s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=s_layout)
    zero_dq = gl.zeros([DQ_M, DQ_COLS], gl.float32, layout=dq_layout)
    for i in range(n_tiles):
        it = it0 + i
        s = it % STAGES
        phase = (it // STAGES) & 1
        g = i // n_m
        m0 = lo + (i - g * n_m) * BLOCK_M
        rows = row_base + g * slh + m0           # the tile's first row in the lse / Δ / dQ-buffer layout (int64)
        # 1. Sᵀ = K Qᵀ and dPᵀ = V dOᵀ on the tensor cores; Pᵀ = 2^(scale·log2 e · Sᵀ − lse·log2 e).
        #    STAGE_ROWS: lse·log2 e and Δ read from the slot where they are used (no registers held across the
        #    matmuls, both of which start from zero). Otherwise one global load per thread, spread across the
        #    columns as the initial accumulators: Sᵀ − lse·log2 e / (scale·log2 e) and dPᵀ − Δ come out of wgmma
        if STAGE_ROWS:
            mbarrier.wait(q_ready.index(s), phase)
            sT = warpgroup_mma(k_w, q_smem.index(s).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            mbarrier.wait(do_ready.index(s), phase)
            dpT = warpgroup_mma(v_w, do_smem.index(s).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            sT = warpgroup_mma_wait(1, deps=[sT])
            pT = gl.exp2(sT * qk_scale - rows_smem.index(2 * s).load(col)[None, :])
        else:
            in_q = m0 + offs_v < Sq
            lse = gl.load(LSE + rows + offs_v, mask=in_q, other=float("inf"))
            lse = gl.where(lse == float("-inf"), float("inf"), lse)          # no key: P = 0
            s_init = gl.convert_layout(lse * (-LOG2E / qk_scale), col)[None, :] + zero_s
            delta = gl.load(DELTA + rows + offs_v, mask=in_q, other=0.0)
            dp_init = gl.convert_layout(-delta, col)[None, :] + zero_s
            mbarrier.wait(q_ready.index(s), phase)
            sT = warpgroup_mma(k_w, q_smem.index(s).permute((1, 0)), s_init, is_async=True)
            mbarrier.wait(do_ready.index(s), phase)
            dpT = warpgroup_mma(v_w, do_smem.index(s).permute((1, 0)), dp_init, is_async=True)
            sT = warpgroup_mma_wait(1, deps=[sT])
            pT = gl.exp2(sT * qk_scale)
        if DQ_SLOT:
            _release_drained(empty, it, STAGES)
        if (m0 < full_lo) | (m0 + BLOCK_M > full_hi):
            pT = gl.where(_keep_t(m0 + offs_q, offs_n, Sk, off, LEFT, RIGHT, HAS_LEFT, HAS_RIGHT), pT, 0.0)
        # 2. dV += Pᵀ dO while dSᵀ = Pᵀ ⊙ (dPᵀ − Δ) is formed; dK += dSᵀ Q. Pᵀ and dSᵀ go through shared memory:
        #    no operand registers held while the matmuls run (wgmma with Pᵀ from registers, as FlashAttention-3,
        #    is serialised by ptxas here: "insufficient register resources" beside dK and dV's 128 accumulators)
        p_own = p_smem.slice(WG * BLOCK_N, BLOCK_N)
        p_own.store(pT.to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        dv = warpgroup_mma(p_own, do_smem.index(s), dv, is_async=True)
        dpT = warpgroup_mma_wait(1, deps=[dpT])
        if STAGE_ROWS:
            dpT = dpT - rows_smem.index(2 * s + 1).load(col)[None, :]
        dsT = (pT * dpT).to(dtype)
        # 3. dQ += dS K (wgmma reads dSᵀ transposed)
        if SPLIT_DQ:
            pb = it % 2
            ds_all = ds_smem.index(pb)
            ds_own = ds_all.slice(WG * BLOCK_N, BLOCK_N)
            mbarrier.wait(ds_empty.index(pb), ((it // 2) & 1) ^ 1)
            ds_own.store(dsT)
            fence_async_shared()
            mbarrier.arrive(ds_ready.index(pb), count=1)     # (its bar.sync: the warpgroup's stores are done)
            dk = warpgroup_mma(ds_own, q_smem.index(s), dk, is_async=True)
            mbarrier.wait(ds_ready.index(pb), (it // 2) & 1)
            if DQ_BY_ROWS:
                dq = warpgroup_mma(ds_all.slice(dq_row0, DQ_M, dim=1).permute((1, 0)), k_smem, zero_dq,
                                   use_acc=False, is_async=True)
            else:
                dq = warpgroup_mma(ds_all.permute((1, 0)), k_smem.slice(dq_col0, DQ_COLS, dim=1), zero_dq,
                                   use_acc=False, is_async=True)
        else:
            ds_own = ds_smem.index(0).slice(WG * BLOCK_N, BLOCK_N)
            ds_own.store(dsT)
            fence_async_shared()
            gl.thread_barrier()
            dk = warpgroup_mma(ds_own, q_smem.index(s), dk, is_async=True)
            dq = warpgroup_mma(ds_own.permute((1, 0)), k_w, zero_dq, use_acc=False, is_async=True)
        dv, dk, dq = warpgroup_mma_wait(0, deps=[dv, dk, dq])
        if not DQ_SLOT:
            mbarrier.arrive(empty.index(s), count=1)      # (its bar.sync: every warp is past the wait)
        if SPLIT_DQ:
            mbarrier.arrive(ds_empty.index(it % 2), count=1)
        if DQ_SLOT:
            _dq_into_slot(dq, q_smem, do_smem, drained, dq_desc, s, phase, b, h0, g, m0 + dq_row0, dq_col0, DQ_M,
                          DQ_COLS, WG, RANK4)
        elif DQ_TMA:
            # the tile's dQ partial through shared memory, added by one TMA reduce (rows past Sq clipped by the
            # descriptor); the previous tile's reduce has long finished reading dq_smem
            tma.store_wait(0)
            dq_smem.store(dq)
            fence_async_shared()
            _dq_reduce(dq_desc, b, h0, g, m0 + dq_row0, dq_col0, dq_smem, RANK4)
        else:
            # no mask: rows past Sq have dS = 0 (P = 0, dO = 0), so their dQ rows are exact zeros, added into the
            # next rows of the buffer or into its BLOCK_M rows of padding (a masked atomic is a branch each)
            gl.atomic_add(DQACC + rows * HEAD_DIM + dq_offs, dq, sem="relaxed")
    return dk, dv


@gluon.jit
def _store_dkdv(dk, dv, dk_ptr, dv_ptr, sdkn, sdvn, key0, col0, Sk, scale):
    """dK = scale · dSᵀ Q and dV from the accumulators (keys from key0, head-dim columns from col0), cast, stored
    from registers; rows past Sk clipped."""
    layout: gl.constexpr = dk.type.layout
    keys = key0 + gl.arange(0, dk.shape[0], layout=gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, dk.shape[1], layout=gl.SliceLayout(0, layout))
    ok = keys[:, None] < Sk
    dtype: gl.constexpr = dk_ptr.dtype.element_ty
    gl.store(dk_ptr + keys[:, None].to(gl.int64) * sdkn + cols[None, :], (dk * scale).to(dtype), mask=ok)
    gl.store(dv_ptr + keys[:, None].to(gl.int64) * sdvn + cols[None, :], dv.to(dtype), mask=ok)


@gluon.jit
def _consumer(k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, rows_smem, dq_smem, kv_bar, q_ready, do_ready, empty,
              ds_ready, ds_empty, drained, dq_desc, LSE, DELTA, DQACC, dk_ptr, dv_ptr, row_base, slh, sdkn, sdvn, n0,
              Sq, Sk, off, LEFT, RIGHT, lo, full_lo, full_hi, n_m, n_tiles, qk_scale, scale,
              WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SPLIT_DQ: gl.constexpr,
              STAGE_ROWS: gl.constexpr, DQ_TMA: gl.constexpr, DQ_SLOT: gl.constexpr, DQ_BY_ROWS: gl.constexpr):
    """Consumer warpgroup WG of the program's key block (``_consumer_unit``), then its dK, dV stored once."""
    mbarrier.wait(kv_bar, 0)
    dk, dv = _consumer_unit(k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, rows_smem, dq_smem, q_ready, do_ready,
                            empty, ds_ready, ds_empty, drained, dq_desc, LSE, DELTA, DQACC, row_base, slh, 0, 0, n0,
                            Sq, Sk, off, LEFT, RIGHT, lo, full_lo, full_hi, n_m, n_tiles, 0, qk_scale, WG, HEAD_DIM,
                            BLOCK_M, BLOCK_N, STAGES, HAS_LEFT, HAS_RIGHT, SPLIT_DQ, STAGE_ROWS, DQ_TMA, DQ_SLOT,
                            DQ_BY_ROWS, False)
    if DQ_TMA:
        tma.store_wait(0)
    _store_dkdv(dk, dv, dk_ptr, dv_ptr, sdkn, sdvn, n0 + WG * BLOCK_N, 0, Sk, scale)


@gluon.jit
def _consumer_split_d(k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, rows_smem, dq_smem, kv_bar, q_ready,
                      do_ready, empty, pd_ready, pd_empty, drained, dq_desc, DQACC, dk_ptr, dv_ptr, row_base, slh,
                      sdkn, sdvn, n0, Sk, off, LEFT, RIGHT, lo, full_lo, full_hi, n_m, n_tiles, qk_scale, scale,
                      WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      STAGES: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, DQ_TMA: gl.constexpr,
                      DQ_SLOT: gl.constexpr):
    """SPLIT_D (D = 256) consumer warpgroup WG of the program's key block (``_split_d_unit``), then its dK, dV
    columns stored once."""
    mbarrier.wait(kv_bar, 0)
    dk, dv = _split_d_unit(k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, rows_smem, dq_smem, q_ready, do_ready,
                           empty, pd_ready, pd_empty, drained, dq_desc, DQACC, row_base, slh, 0, 0, n0, Sk, off, LEFT,
                           RIGHT, lo, full_lo, full_hi, n_m, n_tiles, 0, qk_scale, WG, HEAD_DIM, BLOCK_M, BLOCK_N,
                           STAGES, HAS_LEFT, HAS_RIGHT, DQ_TMA, DQ_SLOT, False)
    if DQ_TMA:
        tma.store_wait(0)
    _store_dkdv(dk, dv, dk_ptr, dv_ptr, sdkn, sdvn, n0, WG * (HEAD_DIM // 2), Sk, scale)


@gluon.jit
def _split_d_unit(k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, rows_smem, dq_smem, q_ready, do_ready, empty,
                  pd_ready, pd_empty, drained, dq_desc, DQACC, row_base, slh, b, h0, n0, Sk, off, LEFT, RIGHT, lo,
                  full_lo, full_hi, n_m, n_tiles, it0, qk_scale,
                  WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, DQ_TMA: gl.constexpr,
                  DQ_SLOT: gl.constexpr, RANK4: gl.constexpr):
    """SPLIT_D (D = 256) consumer warpgroup WG over one key block's query tiles (ring slots from counter it0):
    scores for keys [n0 + WG·BLOCK_N, +BLOCK_N) of the block's 2·BLOCK_N, accumulators for head-dim columns
    [WG·D/2, +D/2) of all of them; returns (dK / scale, dV) of those columns.

    Per query tile (not transposed: rows = the BLOCK_M queries, so wgmma's M = 64 holds with BLOCK_N = 32 keys):
    1. S = Q K_wᵀ and dP = dO V_wᵀ ([BLOCK_M, BLOCK_N], 16 fp32 registers each), P = 2^(scale·log2 e·S − lse·log2 e),
       dS = P ⊙ (dP − Δ) from fp32 P;
    2. Pᵀ and dSᵀ of the warpgroup's keys into its rows of the shared [2·BLOCK_N, BLOCK_M] tiles (a two-slot ring
       between the warpgroups, ``pd_ready`` / ``pd_empty``); once both halves are in:
    3. dV[:, cols] += Pᵀ dO[:, cols], dK[:, cols] += dSᵀ Q[:, cols], dQ[:, cols] = dS K[:, cols] (wgmma reads dSᵀ
       transposed), each [2·BLOCK_N or BLOCK_M, D/2]: dK, dV 64 fp32 registers each, dQ 64, added with fp32
       atomics (a dQ partial tile of its own does not fit beside a two-slot ring at D = 256), or with DQ_SLOT
       through the drained Q / dO slot by a TMA reduce (``_dq_into_slot``), or with DQ_TMA alone (one slot: room
       for the tiles, FlashAttention-3's D = 256 layout) through dq_smem."""
    dtype: gl.constexpr = k_smem.dtype
    COLS: gl.constexpr = HEAD_DIM // 2
    k_w = k_smem.slice(WG * BLOCK_N, BLOCK_N)
    v_w = v_smem.slice(WG * BLOCK_N, BLOCK_N)
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, COLS, 16])
    row: gl.constexpr = gl.SliceLayout(1, s_layout)
    offs_q = gl.arange(0, BLOCK_M, layout=row)                                                     # queries (rows)
    offs_n = n0 + WG * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))        # keys (cols)
    dq_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
    dq_cols = WG * COLS + gl.arange(0, COLS, layout=gl.SliceLayout(0, acc_layout))

    dk = gl.zeros([2 * BLOCK_N, COLS], gl.float32, layout=acc_layout)
    dv = gl.zeros([2 * BLOCK_N, COLS], gl.float32, layout=acc_layout)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    zero_dq = gl.zeros([BLOCK_M, COLS], gl.float32, layout=acc_layout)
    for i in range(n_tiles):
        it = it0 + i
        s = it % STAGES
        phase = (it // STAGES) & 1
        g = i // n_m
        m0 = lo + (i - g * n_m) * BLOCK_M
        rows = row_base + g * slh + m0
        # 1. S, dP on the tensor cores (lse·log2 e and Δ staged by the producer), P and dS in fp32
        mbarrier.wait(q_ready.index(s), phase)
        sc = warpgroup_mma(q_smem.index(s), k_w.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        mbarrier.wait(do_ready.index(s), phase)
        dp = warpgroup_mma(do_smem.index(s), v_w.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        sc = warpgroup_mma_wait(1, deps=[sc])
        if DQ_SLOT:
            _release_drained(empty, it, STAGES)
        p = gl.exp2(sc * qk_scale - rows_smem.index(2 * s).load(row)[:, None])
        if (m0 < full_lo) | (m0 + BLOCK_M > full_hi):
            p = gl.where(_keep(m0 + offs_q, offs_n, Sk, off, LEFT, RIGHT, HAS_LEFT, HAS_RIGHT), p, 0.0)
        dp = warpgroup_mma_wait(0, deps=[dp])
        ds = p * (dp - rows_smem.index(2 * s + 1).load(row)[:, None])
        # 2. the warpgroup's Pᵀ, dSᵀ rows into the shared tiles; wait for the other warpgroup's
        pb = it % 2
        mbarrier.wait(pd_empty.index(pb), ((it // 2) & 1) ^ 1)
        p_all = p_smem.index(pb)
        ds_all = ds_smem.index(pb)
        p_all.slice(WG * BLOCK_N, BLOCK_N).store(gl.permute(p.to(dtype), [1, 0]))
        ds_all.slice(WG * BLOCK_N, BLOCK_N).store(gl.permute(ds.to(dtype), [1, 0]))
        fence_async_shared()
        mbarrier.arrive(pd_ready.index(pb), count=1)         # (its bar.sync: the warpgroup's stores are done)
        mbarrier.wait(pd_ready.index(pb), (it // 2) & 1)
        # 3. this warpgroup's head-dim columns of dV, dK and dQ over all 2·BLOCK_N keys
        dv = warpgroup_mma(p_all, do_smem.index(s).slice(WG * COLS, COLS, dim=1), dv, is_async=True)
        dk = warpgroup_mma(ds_all, q_smem.index(s).slice(WG * COLS, COLS, dim=1), dk, is_async=True)
        dq = warpgroup_mma(ds_all.permute((1, 0)), k_smem.slice(WG * COLS, COLS, dim=1), zero_dq, use_acc=False,
                           is_async=True)
        dv, dk, dq = warpgroup_mma_wait(0, deps=[dv, dk, dq])
        mbarrier.arrive(pd_empty.index(pb), count=1)
        if DQ_SLOT:
            _dq_into_slot(dq, q_smem, do_smem, drained, dq_desc, s, phase, b, h0, g, m0, WG * COLS, BLOCK_M, COLS, WG,
                          RANK4)
        elif DQ_TMA:
            mbarrier.arrive(empty.index(s), count=1)
            tma.store_wait(0)
            dq_smem.store(dq)
            fence_async_shared()
            _dq_reduce(dq_desc, b, h0, g, m0, WG * COLS, dq_smem, RANK4)
        else:
            mbarrier.arrive(empty.index(s), count=1)
            # rows past Sq have dS = 0: exact zeros added into the next rows or the buffer's padding (the offsets
            # formed here, not held across the loop: 64 more registers beside dK, dV and dQ's 192)
            gl.atomic_add(DQACC + rows * HEAD_DIM + (dq_rows[:, None] * HEAD_DIM + dq_cols[None, :]), dq,
                          sem="relaxed")
    return dk, dv


@gluon.jit
def _lpt_order(LONGEST_LAST: gl.constexpr, HEADS: gl.constexpr):
    """(key block, batch·kv head) of this program when the grid (key blocks, B·Hkv) is walked longest first: in
    launch order (program_id(0) fastest), groups of HEADS heads, each taking its heads' key blocks one block index
    at a time (every head's block 0, then every head's block 1, …), so the long programs of a banded problem start
    before the short ones (the tail is short programs) while a group's Q, dO and dQ rows stay in L2. A causal
    (right-bounded) band gives key block 0 the most query rows; a left-only window the last block (LONGEST_LAST)."""
    n_kb = gl.num_programs(0)
    return _lpt_unit(gl.program_id(1) * n_kb + gl.program_id(0), n_kb, gl.num_programs(1), LONGEST_LAST, HEADS)


@gluon.jit
def _lpt_unit(flat, n_kb, n_bh, LONGEST_LAST: gl.constexpr, HEADS: gl.constexpr):
    """_lpt_order's (key block, batch·kv head) of launch index flat in a (n_kb, n_bh) grid."""
    group = flat // (n_kb * HEADS)
    heads = gl.minimum(n_bh - group * HEADS, HEADS)
    r = flat - group * (n_kb * HEADS)
    pid_n = r // heads
    if LONGEST_LAST:
        pid_n = n_kb - 1 - pid_n
    return pid_n, group * HEADS + r % heads


@gluon.jit
def _shared(dtype: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, KEYS: gl.constexpr,
            STAGES: gl.constexpr, SPLIT_DQ: gl.constexpr, SPLIT_D: gl.constexpr, STAGE_ROWS: gl.constexpr,
            DQ_TILES: gl.constexpr, DQ_M: gl.constexpr, DQ_COLS: gl.constexpr):
    """The program's shared memory (one K / V block, the Q / dO ring, Pᵀ and dSᵀ, lse / Δ rows, DQ_TILES: two fp32
    dQ partial tiles, one per warpgroup) and its barriers, initialised: (k, v, q, do, dS, P, rows, dQ tile of
    warpgroup 0, of warpgroup 1 (rows where there are none: unread), kv, q_ready, do_ready, empty, ds_ready,
    ds_empty, drained)."""
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([KEYS, HEAD_DIM], dtype)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([KEYS, BLOCK_M], dtype)
    k_smem = gl.allocate_shared_memory(dtype, [KEYS, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [KEYS, HEAD_DIM], kv_layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_layout)
    # dSᵀ: a two-slot ring between the warpgroups where both write it (SPLIT_DQ, SPLIT_D); one tile otherwise
    ds_smem = gl.allocate_shared_memory(dtype, [2 if SPLIT_DQ or SPLIT_D else 1, KEYS, BLOCK_M], ds_layout)
    p_smem = gl.allocate_shared_memory(dtype, [2 if SPLIT_D else 1, KEYS, BLOCK_M], ds_layout)
    rows_smem = gl.allocate_shared_memory(gl.float32, [2 * STAGES, BLOCK_M],
                                          gl.SwizzledSharedLayout(1, 1, 1, order=[0]))   # rank 1: .index(i) a row
    dq_smem0 = rows_smem
    dq_smem1 = rows_smem
    if DQ_TILES:
        dq_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([DQ_M, DQ_COLS], gl.float32)
        dq_smem = gl.allocate_shared_memory(gl.float32, [2, DQ_M, DQ_COLS], dq_layout)
        dq_smem0 = dq_smem.index(0)
        dq_smem1 = dq_smem.index(1)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    ds_empty = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    drained = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)    # DQ_SLOT: matmuls off the slot
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=2 if STAGE_ROWS else 1)    # TMA's expect (+ the rows' arrive)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)          # both consumer warpgroups release a slot
        mbarrier.init(drained.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(ds_ready.index(i), count=2)
        mbarrier.init(ds_empty.index(i), count=2)
    fence_async_shared()
    return (k_smem, v_smem, q_smem, do_smem, ds_smem, p_smem, rows_smem, dq_smem0, dq_smem1, kv_bar, q_ready,
            do_ready, empty, ds_ready, ds_empty, drained)


@gluon.jit
def attention_bwd_sm90_kernel(
        Q, K, V, DO, LSE, DELTA, DK, DV, DQACC, CU_Q, CU_K,
        sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdb, sdh, sdm, sdkb, sdkh, sdkn, sdvb, sdvh, sdvn, slb, slh,
        Hkv, GROUP, Sq, Sk, LEFT, RIGHT, scale, qk_scale,
        HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
        HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, VARLEN: gl.constexpr,
        STAGE_ROWS: gl.constexpr = False, DQ_TMA: gl.constexpr = False, DQ_SLOT: gl.constexpr = False,
        LPT_HEADS: gl.constexpr = 0, DQ_ROWS: gl.constexpr = False, PRODUCER_REGS: gl.constexpr = 32):
    """Grid (cdiv(Sk, 2·BLOCK_N), B·Hkv), num_warps = 4: two consumer warpgroups of BLOCK_N keys (the first is
    the default partition) and the producer warp. Strides as ``bwd.attention_bwd_dkdv_kernel`` less the unit
    head-dim ones; DQACC: fp32 rows of HEAD_DIM laid out as the lse, zeroed. STAGE_ROWS / DQ_TMA: the plan's
    ``stage_rows`` / ``dq_tma``; DQ_SLOT / LPT_HEADS / DQ_ROWS: ``dq_slot`` / ``lpt_heads`` / ``dq_rows``."""
    KEYS: gl.constexpr = 2 * BLOCK_N
    gl.static_assert(not DQ_ROWS or HEAD_DIM == 64, "DQ_ROWS: D = 64 (D = 128 splits dQ by columns)")
    SPLIT_DQ: gl.constexpr = HEAD_DIM == 128 or DQ_ROWS
    SPLIT_D: gl.constexpr = HEAD_DIM == 256
    gl.static_assert(not (SPLIT_D and DQ_TMA) or DQ_SLOT or STAGES == 1,
                     "D = 256: dQ's TMA reduce goes through the drained slot, or through tiles of its own beside one")
    gl.static_assert(not DQ_SLOT or (DQ_TMA and (SPLIT_DQ or SPLIT_D) and STAGES >= 2),
                     "DQ_SLOT: DQ_TMA with dQ split in two, and a second slot to fill while one drains")
    gl.static_assert(STAGE_ROWS or not SPLIT_D, "D = 256 reads lse / Δ staged by the producer")
    DQ_COLS: gl.constexpr = HEAD_DIM // 2 if HEAD_DIM >= 128 else HEAD_DIM      # a warpgroup's dQ partial
    DQ_M: gl.constexpr = BLOCK_M // 2 if DQ_ROWS else BLOCK_M
    if LPT_HEADS > 0:
        pid_n, bhk = _lpt_order(HAS_LEFT and not HAS_RIGHT, LPT_HEADS)
    else:
        pid_n = gl.program_id(0)
        bhk = gl.program_id(1)
    b = bhk // Hkv
    hk = bhk % Hkv
    n0 = pid_n * KEYS
    q_start, Sq = _seq(CU_Q, b, Sq, VARLEN)
    k_start, Sk = _seq(CU_K, b, Sk, VARLEN)
    if n0 < Sk:
        off = Sk - Sq
        lo, full_lo, full_hi, hi = _q_band(n0, Sq, Sk, off, LEFT, RIGHT, BLOCK_M, KEYS, HAS_LEFT, HAS_RIGHT)
        n_m = gl.cdiv(hi - lo, BLOCK_M)
        n_tiles = GROUP * n_m

        dtype: gl.constexpr = Q.dtype.element_ty
        kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([KEYS, HEAD_DIM], dtype)
        q3_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, BLOCK_M, HEAD_DIM], dtype)
        h0 = hk * GROUP
        k_base = K + b.to(gl.int64) * skb + hk.to(gl.int64) * skh + k_start.to(gl.int64) * skn
        v_base = V + b.to(gl.int64) * svb + hk.to(gl.int64) * svh + k_start.to(gl.int64) * svn
        q_base = Q + b.to(gl.int64) * sqb + h0.to(gl.int64) * sqh + q_start.to(gl.int64) * sqm
        do_base = DO + b.to(gl.int64) * sdb + h0.to(gl.int64) * sdh + q_start.to(gl.int64) * sdm
        k_desc = tma.make_tensor_descriptor(k_base, [Sk, HEAD_DIM], [skn, 1], [KEYS, HEAD_DIM], kv_layout)
        v_desc = tma.make_tensor_descriptor(v_base, [Sk, HEAD_DIM], [svn, 1], [KEYS, HEAD_DIM], kv_layout)
        # [group head, row, dim]: the producer walks the GQA group's heads with one descriptor each
        q_desc = tma.make_tensor_descriptor(q_base, [GROUP, Sq, HEAD_DIM], [sqh, sqm, 1], [1, BLOCK_M, HEAD_DIM],
                                            q3_layout)
        do_desc = tma.make_tensor_descriptor(do_base, [GROUP, Sq, HEAD_DIM], [sdh, sdm, 1],
                                             [1, BLOCK_M, HEAD_DIM], q3_layout)
        row_base = b.to(gl.int64) * slb + h0.to(gl.int64) * slh + q_start      # head h0's row 0 in the lse layout

        (k_smem, v_smem, q_smem, do_smem, ds_smem, p_smem, rows_smem, dq_smem0, dq_smem1, kv_bar, q_ready, do_ready,
         empty, ds_ready, ds_empty, drained) = _shared(dtype, HEAD_DIM, BLOCK_M, KEYS, STAGES, SPLIT_DQ, SPLIT_D,
                                                       STAGE_ROWS, DQ_TMA and not DQ_SLOT, DQ_M, DQ_COLS)
        if DQ_TMA:
            # dQ's fp32 rows as [group head, row, dim] from the group's first head; a box of one consumer's columns
            # (DQ_SLOT: written where the tile's Q / dO were, no tiles of its own)
            dq3_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, DQ_M, DQ_COLS], gl.float32)
            dq_desc = tma.make_tensor_descriptor(DQACC + row_base * HEAD_DIM, [GROUP, Sq, HEAD_DIM],
                                                 [slh * HEAD_DIM, HEAD_DIM, 1], [1, DQ_M, DQ_COLS], dq3_layout)
        else:
            dq_desc = q_desc        # unread (a partition's argument cannot be None)
        mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [n0, 0], kv_bar, k_smem)
        tma.async_copy_global_to_shared(v_desc, [n0, 0], kv_bar, v_smem)

        dk_ptr = DK + b.to(gl.int64) * sdkb + hk.to(gl.int64) * sdkh + k_start.to(gl.int64) * sdkn
        dv_ptr = DV + b.to(gl.int64) * sdvb + hk.to(gl.int64) * sdvh + k_start.to(gl.int64) * sdvn
        # the partitions' arguments are spelled out: constexprs inside a tuple built here would become tensors
        if SPLIT_D:
            gl.warp_specialize([
                (_consumer_split_d, (k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, rows_smem, dq_smem0,
                                     kv_bar, q_ready, do_ready, empty, ds_ready, ds_empty, drained, dq_desc, DQACC,
                                     dk_ptr, dv_ptr, row_base, slh, sdkn, sdvn, n0, Sk, off, LEFT, RIGHT, lo, full_lo,
                                     full_hi, n_m, n_tiles, qk_scale, scale, 0, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                                     HAS_LEFT, HAS_RIGHT, DQ_TMA, DQ_SLOT)),
                (_consumer_split_d, (k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, rows_smem, dq_smem1,
                                     kv_bar, q_ready, do_ready, empty, ds_ready, ds_empty, drained, dq_desc, DQACC,
                                     dk_ptr, dv_ptr, row_base, slh, sdkn, sdvn, n0, Sk, off, LEFT, RIGHT, lo, full_lo,
                                     full_hi, n_m, n_tiles, qk_scale, scale, 1, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                                     HAS_LEFT, HAS_RIGHT, DQ_TMA, DQ_SLOT)),
                (_producer, (q_desc, do_desc, q_smem, do_smem, rows_smem, q_ready, do_ready, empty, LSE, DELTA,
                             row_base, slh, Sq, lo, n_m, n_tiles, BLOCK_M, STAGES, STAGE_ROWS)),
            ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
        else:
            gl.warp_specialize([
                (_consumer, (k_smem, v_smem, q_smem, do_smem, p_smem.index(0), ds_smem, rows_smem, dq_smem0, kv_bar,
                             q_ready, do_ready, empty, ds_ready, ds_empty, drained, dq_desc, LSE, DELTA, DQACC,
                             dk_ptr, dv_ptr, row_base, slh, sdkn, sdvn, n0, Sq, Sk, off, LEFT, RIGHT, lo, full_lo,
                             full_hi, n_m, n_tiles, qk_scale, scale, 0, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                             HAS_LEFT, HAS_RIGHT, SPLIT_DQ, STAGE_ROWS, DQ_TMA, DQ_SLOT, DQ_ROWS)),
                (_consumer, (k_smem, v_smem, q_smem, do_smem, p_smem.index(0), ds_smem, rows_smem, dq_smem1, kv_bar,
                             q_ready, do_ready, empty, ds_ready, ds_empty, drained, dq_desc, LSE, DELTA, DQACC,
                             dk_ptr, dv_ptr, row_base, slh, sdkn, sdvn, n0, Sq, Sk, off, LEFT, RIGHT, lo, full_lo,
                             full_hi, n_m, n_tiles, qk_scale, scale, 1, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                             HAS_LEFT, HAS_RIGHT, SPLIT_DQ, STAGE_ROWS, DQ_TMA, DQ_SLOT, DQ_ROWS)),
                (_producer, (q_desc, do_desc, q_smem, do_smem, rows_smem, q_ready, do_ready, empty, LSE, DELTA,
                             row_base, slh, Sq, lo, n_m, n_tiles, BLOCK_M, STAGES, STAGE_ROWS)),
            ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# ---- persistent: one program per SM, looping over the (key block, batch·kv head) units -------------------------
@gluon.jit
def _unit(u, half, n_kb, n_bh, LONGEST_LAST: gl.constexpr, LPT_HEADS: gl.constexpr, PAIRS: gl.constexpr):
    """(key block, batch·kv head) of block ``half`` of work unit u: the per-program grid's launch order (key blocks
    of a head in turn, or LPT_HEADS' longest first, ``_lpt_unit``), or with PAIRS the key blocks n_kb − 1 − i, then
    i of one head (``fwd_sm90._pair_block``: under a causal band their query tiles add up to the same count for
    every i, so a round-robin of units over the programs is balanced)."""
    if PAIRS:
        pid_n, bhk = _pair_block(u, half, n_kb)
    elif LPT_HEADS > 0:
        pid_n, bhk = _lpt_unit(u, n_kb, n_bh, LONGEST_LAST, LPT_HEADS)
    else:
        pid_n = u % n_kb
        bhk = u // n_kb
    return pid_n, bhk


@gluon.jit
def _producer_persistent(q_desc, k_desc, v_desc, do_desc, q_smem, k_smem, v_smem, do_smem, rows_smem, kv_ready,
                         kv_empty, q_ready, do_ready, empty, LSE, DELTA, slb, slh, Hkv, GROUP, Sq, Sk, LEFT, RIGHT,
                         n_kb, n_bh, units, BLOCK_M: gl.constexpr, KEYS: gl.constexpr, STAGES: gl.constexpr,
                         HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, STAGE_ROWS: gl.constexpr,
                         LPT_HEADS: gl.constexpr, PAIRS: gl.constexpr):
    """Per key block: its K and V once both consumers released the last block's (after its last matmuls: one
    K / V buffer, shared memory has no room for two), then its Q / dO tiles into the ring, whose counter runs on
    across blocks (the first tiles of the next block were in flight while the last block's ended)."""
    it = 0
    lap = 0
    for u in range(gl.program_id(0), units, gl.num_programs(0)):
        for half in range(_halves(u, n_kb, PAIRS)):
            pid_n, bhk = _unit(u, half, n_kb, n_bh, HAS_LEFT and not HAS_RIGHT, LPT_HEADS, PAIRS)
            b = bhk // Hkv
            hk = bhk % Hkv
            n0 = pid_n * KEYS
            lo, full_lo, full_hi, hi = _q_band(n0, Sq, Sk, Sk - Sq, LEFT, RIGHT, BLOCK_M, KEYS, HAS_LEFT, HAS_RIGHT)
            n_m = gl.cdiv(hi - lo, BLOCK_M)
            mbarrier.wait(kv_empty, (lap & 1) ^ 1)                 # barriers start in phase 1: lap 0 passes
            mbarrier.expect(kv_ready, 2 * k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [b, hk, n0, 0], kv_ready, k_smem.reshape(k_desc.block_shape))
            tma.async_copy_global_to_shared(v_desc, [b, hk, n0, 0], kv_ready, v_smem.reshape(v_desc.block_shape))
            h0 = hk * GROUP
            row_base = b.to(gl.int64) * slb + h0.to(gl.int64) * slh
            _fill(q_desc, do_desc, q_smem, do_smem, rows_smem, q_ready, do_ready, empty, LSE, DELTA, row_base, slh,
                  Sq, b, h0, lo, n_m, GROUP * n_m, it, BLOCK_M, STAGES, STAGE_ROWS, True)
            it += GROUP * n_m
            lap += 1


@gluon.jit
def _consumer_persistent(k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, rows_smem, dq_smem, kv_ready, kv_empty,
                         q_ready, do_ready, empty, ds_ready, ds_empty, drained, dq_desc, LSE, DELTA, DQACC, DK, DV,
                         sdkb, sdkh, sdkn, sdvb, sdvh, sdvn, slb, slh, Hkv, GROUP, Sq, Sk, LEFT, RIGHT, n_kb, n_bh,
                         units, qk_scale, scale, WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                         BLOCK_N: gl.constexpr, STAGES: gl.constexpr, HAS_LEFT: gl.constexpr,
                         HAS_RIGHT: gl.constexpr, SPLIT_DQ: gl.constexpr, SPLIT_D: gl.constexpr,
                         STAGE_ROWS: gl.constexpr, DQ_TMA: gl.constexpr, DQ_SLOT: gl.constexpr,
                         DQ_BY_ROWS: gl.constexpr, LPT_HEADS: gl.constexpr, PAIRS: gl.constexpr):
    """Consumer warpgroup WG of every key block of the program (``_consumer_unit`` / ``_split_d_unit``): K and V
    released once its last matmuls are done, then its dK, dV stored from registers while the producer's next K / V
    load is in flight. A DQ_TMA reduce is waited for where its buffer is written next (in the next block), and once
    at the end."""
    KEYS: gl.constexpr = 2 * BLOCK_N
    it = 0
    lap = 0
    for u in range(gl.program_id(0), units, gl.num_programs(0)):
        for half in range(_halves(u, n_kb, PAIRS)):
            pid_n, bhk = _unit(u, half, n_kb, n_bh, HAS_LEFT and not HAS_RIGHT, LPT_HEADS, PAIRS)
            b = bhk // Hkv
            hk = bhk % Hkv
            n0 = pid_n * KEYS
            off = Sk - Sq
            lo, full_lo, full_hi, hi = _q_band(n0, Sq, Sk, off, LEFT, RIGHT, BLOCK_M, KEYS, HAS_LEFT, HAS_RIGHT)
            n_m = gl.cdiv(hi - lo, BLOCK_M)
            h0 = hk * GROUP
            row_base = b.to(gl.int64) * slb + h0.to(gl.int64) * slh
            mbarrier.wait(kv_ready, lap & 1)
            if SPLIT_D:
                dk, dv = _split_d_unit(k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, rows_smem, dq_smem, q_ready,
                                       do_ready, empty, ds_ready, ds_empty, drained, dq_desc, DQACC, row_base, slh, b,
                                       h0, n0, Sk, off, LEFT, RIGHT, lo, full_lo, full_hi, n_m, GROUP * n_m, it,
                                       qk_scale, WG, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, HAS_LEFT, HAS_RIGHT, DQ_TMA,
                                       DQ_SLOT, True)
                key0 = n0
                col0 = WG * (HEAD_DIM // 2)
            else:
                dk, dv = _consumer_unit(k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, rows_smem, dq_smem, q_ready,
                                        do_ready, empty, ds_ready, ds_empty, drained, dq_desc, LSE, DELTA, DQACC,
                                        row_base, slh, b, h0, n0, Sq, Sk, off, LEFT, RIGHT, lo, full_lo, full_hi, n_m,
                                        GROUP * n_m, it, qk_scale, WG, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, HAS_LEFT,
                                        HAS_RIGHT, SPLIT_DQ, STAGE_ROWS, DQ_TMA, DQ_SLOT, DQ_BY_ROWS, True)
                key0 = n0 + WG * BLOCK_N
                col0 = 0
            mbarrier.arrive(kv_empty, count=1)          # (its bar.sync: every warp is past the last matmuls' wait)
            it += GROUP * n_m
            lap += 1
            dk_ptr = DK + b.to(gl.int64) * sdkb + hk.to(gl.int64) * sdkh
            dv_ptr = DV + b.to(gl.int64) * sdvb + hk.to(gl.int64) * sdvh
            _store_dkdv(dk, dv, dk_ptr, dv_ptr, sdkn, sdvn, key0, col0, Sk, scale)
    if DQ_TMA:
        tma.store_wait(0)


@gluon.jit(do_not_specialize=["Sq", "Sk", "n_kb", "n_bh", "units"])      # one compile serves every length
def attention_bwd_sm90_persistent_kernel(
        q_desc, k_desc, v_desc, do_desc, dq_desc, LSE, DELTA, DK, DV, DQACC,
        sdkb, sdkh, sdkn, sdvb, sdvh, sdvn, slb, slh, Hkv, GROUP, Sq, Sk, LEFT, RIGHT, scale, qk_scale,
        n_kb, n_bh, units,
        HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
        HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, STAGE_ROWS: gl.constexpr = False,
        DQ_TMA: gl.constexpr = False, DQ_SLOT: gl.constexpr = False, LPT_HEADS: gl.constexpr = 0,
        DQ_ROWS: gl.constexpr = False, PAIRS: gl.constexpr = False, PRODUCER_REGS: gl.constexpr = 32):
    """Grid (programs,), num_warps = 4 (as ``attention_bwd_sm90_kernel``); work units u = 0 .. units − 1 (the
    n_kb key blocks of 2·BLOCK_N keys of each of the n_bh = B·Hkv (batch, kv head)s, or with PAIRS their pairs:
    ``fwd_sm90._units``) go to program u mod programs. Host descriptors over q, dO [B, H, Sq, D] (boxes
    [1, 1, BLOCK_M, D]), k, v [B, Hkv, Sk, D] (boxes [1, 1, 2·BLOCK_N, D]) and dQ's fp32 rows [B, H, Sq, D] (boxes
    of one warpgroup's partial tile; with DQ_TMA); dK, dV row i of (b, kv head) at b·sdkb + h·sdkh + i·sdkn;
    LSE, DELTA (float32) and DQACC's rows (of HEAD_DIM) row i of (b, h) at b·slb + h·slh + i. Shared memory as
    the per-program kernel's (no second K / V buffer: none fits at any head dim)."""
    KEYS: gl.constexpr = 2 * BLOCK_N
    gl.static_assert(not DQ_ROWS or HEAD_DIM == 64, "DQ_ROWS: D = 64 (D = 128 splits dQ by columns)")
    SPLIT_DQ: gl.constexpr = HEAD_DIM == 128 or DQ_ROWS
    SPLIT_D: gl.constexpr = HEAD_DIM == 256
    gl.static_assert(not (SPLIT_D and DQ_TMA) or DQ_SLOT or STAGES == 1,
                     "D = 256: dQ's TMA reduce goes through the drained slot, or through tiles of its own beside one")
    gl.static_assert(not DQ_SLOT or (DQ_TMA and (SPLIT_DQ or SPLIT_D) and STAGES >= 2),
                     "DQ_SLOT: DQ_TMA with dQ split in two, and a second slot to fill while one drains")
    gl.static_assert(STAGE_ROWS or not SPLIT_D, "D = 256 reads lse / Δ staged by the producer")
    DQ_COLS: gl.constexpr = HEAD_DIM // 2 if HEAD_DIM >= 128 else HEAD_DIM
    DQ_M: gl.constexpr = BLOCK_M // 2 if DQ_ROWS else BLOCK_M
    dtype: gl.constexpr = q_desc.dtype
    (k_smem, v_smem, q_smem, do_smem, ds_smem, p_smem, rows_smem, dq_smem0, dq_smem1, kv_ready, q_ready, do_ready,
     empty, ds_ready, ds_empty, drained) = _shared(dtype, HEAD_DIM, BLOCK_M, KEYS, STAGES, SPLIT_DQ, SPLIT_D,
                                                   STAGE_ROWS, DQ_TMA and not DQ_SLOT, DQ_M, DQ_COLS)
    kv_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_empty, count=2)                # both consumer warpgroups release K and V
    fence_async_shared()
    p_arg = p_smem
    if not SPLIT_D:
        p_arg = p_smem.index(0)
    # the partitions' arguments are spelled out: constexprs inside a tuple built here would become tensors
    gl.warp_specialize([
        (_consumer_persistent, (k_smem, v_smem, q_smem, do_smem, p_arg, ds_smem, rows_smem, dq_smem0, kv_ready,
                                kv_empty, q_ready, do_ready, empty, ds_ready, ds_empty, drained, dq_desc, LSE, DELTA,
                                DQACC, DK, DV, sdkb, sdkh, sdkn, sdvb, sdvh, sdvn, slb, slh, Hkv, GROUP, Sq, Sk, LEFT,
                                RIGHT, n_kb, n_bh, units, qk_scale, scale, 0, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                                HAS_LEFT, HAS_RIGHT, SPLIT_DQ, SPLIT_D, STAGE_ROWS, DQ_TMA, DQ_SLOT, DQ_ROWS,
                                LPT_HEADS, PAIRS)),
        (_consumer_persistent, (k_smem, v_smem, q_smem, do_smem, p_arg, ds_smem, rows_smem, dq_smem1, kv_ready,
                                kv_empty, q_ready, do_ready, empty, ds_ready, ds_empty, drained, dq_desc, LSE, DELTA,
                                DQACC, DK, DV, sdkb, sdkh, sdkn, sdvb, sdvh, sdvn, slb, slh, Hkv, GROUP, Sq, Sk, LEFT,
                                RIGHT, n_kb, n_bh, units, qk_scale, scale, 1, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                                HAS_LEFT, HAS_RIGHT, SPLIT_DQ, SPLIT_D, STAGE_ROWS, DQ_TMA, DQ_SLOT, DQ_ROWS,
                                LPT_HEADS, PAIRS)),
        (_producer_persistent, (q_desc, k_desc, v_desc, do_desc, q_smem, k_smem, v_smem, do_smem, rows_smem, kv_ready,
                                kv_empty, q_ready, do_ready, empty, LSE, DELTA, slb, slh, Hkv, GROUP, Sq, Sk, LEFT,
                                RIGHT, n_kb, n_bh, units, BLOCK_M, KEYS, STAGES, HAS_LEFT, HAS_RIGHT, STAGE_ROWS,
                                LPT_HEADS, PAIRS)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
