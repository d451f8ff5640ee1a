"""Triton kernels for softmax, log-softmax and logsumexp along one dim, forward and backward.

Every kernel works on the online normalizer state of Milakov & Gimelshein (arXiv 1805.02867):

    m = max_j x_j,    d = sum_j e^(x_j - m),    y_j = e^(x_j - m) / d,    lse = m + log d

A tensor is seen as rows: ``row r`` starts at ``(r // INNER) * stride_o + (r % INNER) * stride_i`` and its
``N`` elements are ``stride_n`` apart, so any ``dim`` of a contiguous tensor, transposes and most strided
views run without a copy. Offsets are 64-bit.

Paths, chosen by :func:`choose_path` (thresholds below; tests assert the choice):

``rows``   N <= ROW_MAX_N. A tile of BLOCK_M rows x BLOCK_N columns sits in registers: one read of x, one
           write of y (the seed's V3); from ONE_ROW_MIN_N one row per program, 32 bytes of it per thread. For
           rows of at most 2 KB below that, a persistent grid-stride loop over tiles (the seed's V4) that loads
           the next tile while the current one is reduced and written; elsewhere one tile per program measured
           faster. 16-bit rows of SMEM_ROWS lengths (unit stride, 16-byte aligned) are held whole in shared memory
           instead: ``softmax_coop_smem_kernel`` with one chunk per row, which skips the barrier (3 rows of 32K
           per SM against 2 in registers).
``coop``   N > ROW_MAX_N, or few rows of large N (decode). Each row is cut into C chunks, one program per chunk
           holding it in registers. Every program publishes its chunk's (m_c, d_c), waits at a per-row barrier
           in global memory until its row's C siblings have published, merges the C partial states with ⊕ and
           normalises its chunk from registers: still one read of x and one write of y (seed §7 "segmented
           reduce"). The barrier needs all C programs of a row resident at once (C <= COOP_MAX_CHUNKS) and
           programs dispatched in order, as decoupled look-back scans assume.
           Many bf16 rows of unit stride and even N take ``softmax_coop_bf16x2_kernel`` from N >
           BF16X2_ROW_MAX_N: x is held as int32 words of two elements, twice the chunk in the same registers
           (on-chip bytes in flight per SM set the speed of this path).
           Many long rows of unit stride (16-byte aligned, N a multiple of 16) take the same scheme with the
           chunk in shared memory instead (``softmax_coop_smem_kernel``, kernels/softmax_smem.py, Gluon;
           SMEM_CONFIG), its first few sub-tiles in registers (REG): 256-288 KB per SM held through the
           barrier against about 128 KB in registers alone. 16-bit softmax there keeps e^(x - m_c) in place of x
           after the sum (KEEP_E): one exponential per element instead of two.
``split``  The same cut, in two launches with no waiting: the first publishes partial states, the second merges
           them and re-reads its chunk. Used under TRITON_INTERPRET=1 (the CPU interpreter runs programs one
           after another, so a barrier would hang there) and when a row needs more than COOP_MAX_CHUNKS chunks.

Memory traffic per element (fp32, 4 B): naive 3-pass safe softmax reads x 3 times and writes y (16 B);
``rows`` and ``coop`` read x once and write y once (8 B); ``split`` reads x twice (12 B).
logsumexp reads x once in every path (its partial states merge in the last program of the row to arrive);
many 16-bit rows longer than 16K (LSE_STREAM) stream through ``logsumexp_stream_kernel``
(kernels/softmax_smem.py: persistent, a running (m, d) per thread, the next tile in flight in registers); other
rows of LSE_PIPE lengths (1K-32K) run ``logsumexp_rows_pipe_kernel`` (persistent, the next row in flight into
shared memory while this one is reduced), other rows of 16-64 KB the prefetching loop, many long rows
LSE_CHUNK-element chunks.

Exponentials: ``_exp`` (ex2.approx.ftz, one MUFU.EX2 per element) on the GPU, except softmax's output in the
bf16x2 kernel and in the prefetching ``rows`` loop, where it measured slower (a ``rows`` plan records ``fast_exp``).

Backward (read y and dy, write dx): ``rows`` or ``coop`` as above with y and dy in registers. Unit-stride rows
of 1K-16K (SMEM_BWD_ROWS) and many long rows (SMEM_BWD_CONFIG) take ``softmax_bwd_coop_smem_kernel``
(kernels/softmax_smem.py: y and dy in shared memory and registers; a whole row per program for ``rows``, no
barrier); log-softmax's there holds dy only and streams y after step 1 through a ring (RING), since sum(dy) needs
no y. Where that does not apply, bf16 long rows take ``softmax_bwd_coop_bf16x2_kernel`` (y and dy held as
words). Its sums accumulate in fp64 for fp32 and fp64 tensors (the terms of sum(dy) cancel).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

# ---- named thresholds (H200 measurements behind each: benchmarks/results/softmax/tune.log) ------------
ROW_MAX_N = 32768            # longest row one program holds in registers (fp32: 32-64 values per thread)
ROW_TILE_ELEMS = 4096        # a `rows` tile holds about this many elements (BLOCK_M x BLOCK_N): fp32 N = 1K
                             # 94.1 % vs 86.8 % with 8192, bf16 N = 4K 93.7 % vs 79.8 %, fp32 N = 4K 93.3 % vs 94.0 %
ROW_ELEMS_PER_THREAD = 16    # num_warps = tile elements / (32 * this), clamped to [4, 32]; 32 warps at
                             # N = 16K fp32 gave 94.6 % against 80 % with 16
ONE_ROW_MIN_N = 1024         # rows this long: one row per program, ROW_BYTES_PER_WARP bytes of it per warp (32 B per
ROW_BYTES_PER_WARP = 1024    # thread). 1 GiB, N = 1K: fp32 99.2 % (4 warps) against 96.8 % for 4 rows x 1K with 8
                             # warps; bf16 99.3 % (2 warps) against 90.9 % for the prefetching loop; 16 B per thread
                             # lost (fp32 8 warps 89.9 %, bf16 4 warps 91.1 %); 16 warps at fp32 N = 4K was measured
                             # before (97.6 / 97.4 % against 96.3 / 96.2 % with 8: tune-gib1.log, tune-gib2.log)
ROW_WARPS_MEASURED = {       # (element bytes, N) -> num_warps where one row per program measured better otherwise:
    (2, 16384): 16,          # bf16 91.8 / 91.6 % against 90.7 / 90.7 % with 32 (rows that SMEM_ROWS cannot take)
}
SMEM_ROWS = ((4096, 16384, 4), (16385, 32768, 16))   # 16-bit rows of N in [lo, hi]: one program per row holding it in
                             # shared memory (softmax_coop_smem_kernel with C = 1, no barrier), this many warps.
                             # 1 GiB, bf16: N = 4K 97.7 % against 96.7 (rows), 16K 96.6 against 94.1, 32K 97.3 (16
                             # warps; 8: 96.4, 4: 95.5) against 83.6 (bf16x2) (tune-gib-slots-c1d6159.log)
PREFETCH_MAX_ROW_BYTES = 2048    # shorter rows (bf16 N < 1K, fp32 N <= 512) run the persistent, prefetching loop;
PREFETCH_TILE_ELEMS = 8192       # at bf16 N = 1K it gave 87.9 % against 82.3 % for 4 rows per program
PERSISTENT_WAVES = 2             # ... on a grid of this many programs per SM
COOP_CHUNK = 8192            # long rows: elements per program in the coop path (large batch), 8 warps
BF16X2_ROW_MAX_N = 16384     # rows the bf16x2 kernel can take (see _bf16x2_ok) longer than this, for many rows,
                             # run it rather than `rows`: 4096 x 32768 bf16 77.5 % vs 68.7 % (tune-bf16x2-f0cf1a3.log)
BF16X2_SHORT_N = 65536       # bf16x2 chunk: BF16X2_SHORT_CHUNK elements (4 warps) up to this N, 77.5 / 75.1 %
BF16X2_SHORT_CHUNK = 4096    # at N = 32K / 64K against 72.4 / 71.5 % with 16384; COOP_BF16X2_CHUNK (8 warps)
COOP_BF16X2_CHUNK = 16384    # beyond: 69.9 / 66.0 % at N = 128K / 256K against 69.4 / 63.2 % with 4096
SMEM_CONFIG = {               # many long rows: element bytes -> (chunk, warps, reg) of the coop kernel that holds its
    4: (16384, 8, 4),        # chunk in shared memory (kernels/softmax_smem.py), its first `reg` sub-tiles in registers
    2: (16384, 4, 4),        # (REG): 1 GiB, N = 128K / 256K, fp32 94.6 / 92.6 % against 92.0 / 90.3 for the chunk in
}                            # shared memory alone, bf16 86.0 / 85.8 against 84.5 / 83.7 (tune-gib-hybrid-ea3cf0f.log)
SMEM_BF16_MAXNREG = 56       # bf16 register sub-tiles (words) get this register bound: ptxas's own 64 registers
                             # allow 8 programs of (16384, 4, 4) per SM, 56 allow 9 (shared memory's limit): 1 GiB,
                             # N = 128K / 256K 94.4 / 93.0 % against 93.1 / 91.1 (tune-gib-fwdbound-e654654.log).
                             # fp16 (elements, 72 registers) spills under 64 / 56: +0.9 / -1.1 and -3.5 / -1.2 points
SMEM_CONFIG_MASKED = {       # ... where a row's last chunk is shorter than its register sub-tiles (_reg_fits): the
    4: (11264, 4, 0),        # shared-memory-only chunks. Before REG: fp32 92.5 / 89.9 % against 86.8 / 82.0
    2: (8192, 2, 0),         # (registers), bf16 85.0 / 84.0 against 78.4 / 75.3 (bf16x2) (tune-gib-smem-2b9adac.log)
}
SMEM_BWD_CONFIG = {          # backward, many long rows: (element bytes, log-softmax) -> (chunk, warps, reg, ring) of
    (4, False): ((10240, 4, 8, 0), (8192, 4, 4, 0)),  # the coop kernel with y and dy in shared memory, their first
    (4, True): ((16384, 8, 2, 4),),                   # `reg` sub-tiles in registers (REG, bf16 as words), and for
    (2, False): ((32768, 8, 2, 0),),                  # log-softmax y streamed after step 1 through a ring of `ring`
    (2, True): ((16384, 4, 2, 4),),                   # sub-tiles (RING): the first entry whose REG the row's last
}   # chunk covers (_reg_fits), else the last with reg = 0. 1 GiB, N = 128K / 256K, against the previous default in
    # the same runs (tune-gib-bwdreg-da9bbb6.log, tune-gib-bwdreg2-f9ec1ff.log, tune-gib-bwdreg3-dbea8f8.log): fp32
    # softmax 98.7 / 95.6 % (10240, reg 8: 4 programs and 320 KB per SM) and 96.8-97.5 / 94.0-94.6 (8192, reg 4:
    # 256 KB) against 95.0-95.3 / 91.2-91.5 (registers); bf16 softmax 98.4 / 96.0 against 92.9 / 90.9 (8192, no
    # REG). Log-softmax with RING (tune-gib-ring-*.log; N = 128K / 256K / 32K): fp32 100.0 / 99.4 / 100.5 % against
    # 95.4 / 91.8 / 99.9 with y held (16384, 8, 2: 2 programs per SM, 3 with the ring), ring 2 94.4 / 92.7 / 95.9;
    # bf16 (16384, 4, 2, 4: 6 programs per SM) 99.8 / 99.5 / 100.7 against 93.0 / 86.4 / 94.8 with y held (32768,
    # 8, 2), (32768, 8, 2, 4) 99.7 / 98.9 / 99.7
SMEM_BWD_ROWS = (            # backward, rows of N in [lo, hi] (unit stride, N a multiple of 16, as _smem_bwd_ok):
    (1024, 2048, {(4, False): (4, 0, 0), (2, False): (2, 0, 0), (4, True): (4, 0, 1), (2, True): (1, 0, 2)}),
    (2049, 8192, {(4, False): (4, 0, 0), (2, False): (2, 0, 0), (4, True): (4, 0, 2), (2, True): (2, 0, 2)}),
    (8193, 16384, {(4, False): (16, 0, 0), (2, False): (4, 2, 0), (4, True): (4, 2, 4), (2, True): (2, 2, 4)}),
)   # one program per row (C = 1: no barrier) of the smem kernel, (element bytes, log-softmax) -> (warps, reg, ring);
    # log-softmax holds dy, y through its ring. 1 GiB, N = 1K / 4K / 16K, against the register rows kernel in the
    # same runs: softmax (tune-gib-brows-d6a8ab6.log) fp32 101.9 / 101.3 / 101.8 % against 96.1 / 96.5 / 98.2, bf16
    # 101.8 / 101.6 / 101.5 against 97.1 / 95.7 / 96.8; log-softmax (tune-gib-lrows-e670f39.log) fp32 102.2 / 101.0
    # / 100.4 against 94.0 / 96.6 / 88.0, bf16 101.8 / 100.9 / 100.9 against 97.0 / 95.4 / 82.1 (torch's own: fp32
    # 101.1 / 99.6 / 80.3, bf16 60.8 / 99.7 / 100.7). (A 2 : 1 read/write mix runs 2-3 % over the 1 : 1 copy.)
SMEM_BWD_FALLBACK = {4: (4096, 4, 0, 0), 2: (8192, 4, 0, 0)}   # a forced smem=True at decode sizes (no config)
SMEM_BWD_F16_MAXNREG = 128   # fp16 register sub-tiles (held as elements: WORDS is bf16's) get this register bound:
                             # at (32768, 8, 2) ptxas's own choice is 64 registers and an 8-byte stack (spills,
                             # sm_90a), and fp16 N = 128K / 256K measured 94.1 / 91.5 % against bf16's 98.3 / 96.1
                             # (tune-gib-fp16-0cd1e41.log); bounded at 128 it takes 102 and spills nothing
SMEM_BF16_MIN_N = 65536      # bf16 rows shorter than this stay in the bf16x2 kernel: N = 32K 83.4 against 83.6 %
LSE_PIPE = {                  # logsumexp, rows of (element bytes, N rounded up to a power of two) -> (warps, programs
    (2, 1024): (1, 32),      # per SM) of logsumexp_rows_pipe_kernel (kernels/softmax_smem.py: the next row in flight
    (2, 2048): (2, 16),      # while this one is reduced). 1 GiB, % of the copy ceiling against the register kernels
    (2, 4096): (4, 8),       # in the same run (tune-gib-pipe-77f31cb.log, tune-gib-pipe-217fc5e.log): bf16 N = 1K
    (2, 8192): (4, 4),       # 96.5 / 78.4, 2K 94.6 / 86.8, 4K 100.5 / 83.0, 8K 97.3 / 76.0, 16K 99.6 / 94.5, 32K
    (2, 16384): (8, 3),      # 79.0 / 74.9; fp32 N = 4K 102.7 / 101.1, 8K 98.9 / 97.7, 16K 102.6 / 101.2, 32K 101.0 /
    (4, 4096): (4, 8),       # 95.0 (a read alone runs faster than a copy's read + write). fp32 N = 1K / 2K stay in
                             # registers: 102.0 / 99.7 % against 95.6 / 96.6 at best. 16-bit rows past 16K stream
                             # (LSE_STREAM)
    (4, 8192): (8, 2),
    (4, 16384): (8, 2),
    (4, 32768): (16, 1),
}
LSE_PIPE_FALLBACK = (4, 4)   # a forced pipe=True (tests, tuning) at lengths the table does not list
PIPE_MAX_ROW_BYTES = 131072  # ... rows of at most this many bytes (in shared memory, one per program)
LSE_STREAM = {                # logsumexp, many 16-bit rows: element bytes -> ((from N, (warps, 16-byte loads per
    2: ((16385, (4, 4, 8)),   # thread per tile, programs per SM)), ...) of logsumexp_stream_kernel (kernels/softmax_
        (65536, (8, 4, 4))),  # smem.py: the row streamed, the next tile in flight in registers). 1 GiB, bytes read
}                             # over the copy ceiling, against the kernel these rows took before, same runs
                              # (tune-gib-stream-22abb0b.log, tune-gib-stream-444d8be.log): bf16 N = 20000 97.8 %
                              # against 48.3 (pipe), 32K 97.7 / 98.3 against 74.8 / 79.1 (pipe), 128K 98.7 against
                              # 83.0 (chunks), 256K 98.6 / 98.8 against 85.7 / 85.8, fp16 128K 98.5 against 85.1.
                              # (8, 4, 4) at 20000 83.1 % (its 8192-element tiles are 44 % used at the row's end);
                              # (4, 4, 8) at 128K / 256K 97.5 / 96.3. fp32 stays with chunks (256K: 101.4 against
                              # 100.9 at best), 16-bit 16K with pipe (99.7 against 98.8)
LSE_STREAM_FALLBACK = (4, 4, 8)   # a forced stream=True (tests, tuning) where the table has no entry
DECODE_MIN_CHUNK = 2048      # few rows: the smallest chunk (grown x2 up to COOP_CHUNK while M x C exceeds
DECODE_PROGRAMS_PER_SM = 2   # this many programs per SM). Graph-replayed sweep (profile_launch.log): 1 x 262144
                             # fp32 10.0 us at 2048 vs 10.5 at 4096; 32 x 128256 bf16 14.1 us at 8192 vs 15.2 at 4096
LSE_PREFETCH_MIN_ROW_BYTES = 16384   # logsumexp (reads x, writes one value per row): rows of 16-64 KB run the
LSE_PREFETCH_MAX_ROW_BYTES = 65536   # prefetching loop too, LSE_WAVES programs per SM. 1 GiB, bytes read over the
LSE_WAVES = 4                        # copy ceiling: fp32 N = 4K 99.6 % vs 90.1 %, bf16 N = 16K 82.9 vs 72.2 %,
                                     # N = 32K 71.4 vs 57.0 %; fp32 N = 16K 100.5 vs 103.7 % (tune-gib-lse.log)
LSE_CHUNK = 16384            # logsumexp long rows, many rows: chunks of this many elements, LSE_CHUNK_WARPS warps:
LSE_CHUNK_WARPS = 8          # fp32 99.7 / 100.1 % vs 96.1 / 95.1 % with COOP_CHUNK, bf16 81.1 / 83.0 vs 75.9 / 75.9
BWD_BF16X2_CHUNK = 16384     # backward, bf16 words (softmax_bwd_coop_bf16x2_kernel), 8 warps. 1 GiB, N = 32K /
BWD_BF16X2_WARPS = 8         # 128K / 256K: softmax 93.4 / 87.3 / 84.2 %, log-softmax 90.6 / 80.5 / 79.8 %, against
                             # 92.2 / 85.8 / 85.6 and 86.4 / 74.7 / 78.0 with 8192 (8 warps), and 82.8 / 80.2 / 76.7
                             # and 90.0 / 79.3 / 79.4 for the generic kernel (tune-gib-bwd16b.log)
BWD_DECODE_CHUNK = 2048      # backward, few rows
DECODE_MAX_ROWS_PER_SM = 2   # "few rows": M <= this x SMs, and N > DECODE_MIN_N
DECODE_MIN_N = 16384
COOP_MAX_CHUNKS = 128        # chunks of one row that must be resident together
BWD_WAVES = 4                # backward `rows`: grid-stride grid of at most this many programs per SM
BWD_CHUNK_SCALE = 2          # backward holds y and dy: `rows` tiles half the forward size, except
BWD_ROWS_MEASURED = {        # (element bytes, BLOCK_N) -> (tile elements, warps) measured better: 1 GiB, bf16 N = 1K
    (2, 1024): (8192, 16),   # 97.0 % against 89.5 % (2048, 8 warps); (4096, 8) 95.9, (4096, 16) 83.4; fp32 N = 1K
}                            # lost with 4096 (89.4 against 97.5 %) (tune-gib-sleep-204a00a.log, tune-gib-bwd.log)
BWD_COOP_CHUNK = 8192        # backward long rows, BWD_ELEMS_PER_THREAD (8 warps): 1 GiB, fp32 99.7 / 95.5 / 91.7 %
BWD_ELEMS_PER_THREAD = 32    # at N = 32K / 128K / 256K against 95.0 / 91.2 / 85.9 % with 4096 (8 warps), bf16
                             # 82.8 / 80.4 / 76.9 against 73.3 / 72.4 / 69.0 %; 8192 with 16 warps lost 4-20
                             # points (tune-gib-bwd.log; the earlier 256 MB sweep tried 8192 with 16 warps only)

# MODE of the forward kernels
SOFTMAX, LOG_SOFTMAX, LOGSUMEXP = 0, 1, 2

# _exp: log2 e (rounded to fp32 in the kernels: L), ln 2 in two fp32 parts, and the clamp of z
LOG2E = tl.constexpr(1.4426950408889634)
LN2_HI = tl.constexpr(0.6931471824645996)       # ln 2 rounded to fp32
LN2_LO = tl.constexpr(-1.9046542121259336e-09)  # ln 2 - LN2_HI, as fp32
CLAMP_Z = tl.constexpr(-104.0)                  # e^-104 = 2^-150: below the smallest ftz result


# ---- building blocks, in the paper's notation ------------------------------------------------------
@triton.jit
def _shift(m):
    """What d and e are taken relative to: m, or 0 where m = ±inf."""
    return tl.where((m == float("inf")) | (m == float("-inf")), 0.0, m)


@triton.jit
def _exp(z, FAST: tl.constexpr):
    """e^z. FAST (the GPU, fp32): 2^(z·log2 e) by ex2.approx.ftz.f32, results below 2^-126 flushed to 0 (no
    term that small moves d, which is >= 1, and torch's y there is below 1.2e-38). tl.exp's non-ftz ex2 costs a
    compare and two predicated multiplies more per element, 3 of the about 20 SASS instructions per element of
    the bf16 logsumexp rows kernel (benchmarks/softmax_ptxas.py). The interpreter, and fp64, take tl.exp.

    FAST == 2 (fp32 outputs of softmax: _exp_level): t = z·L, L = log2 e rounded to fp32, is off from z·log2 e by
    the rounding of the product (up to half an ulp of t) and by z·(log2 e - L); 2^t then has a relative error of up
    to 3.8e-6 for z in [-87, 0] (several fp32 ulps of y; a bf16 -> fp32 softmax measured 1.6e-6 against torch's
    1.9e-7 on the H200), where torch's expf is within an ulp. The remainder is recovered by Cody-Waite: u = z - t·ln
    2 in two fmas (ln 2 = LN2_HI + LN2_LO, both fp32) and e^z = 2^t·e^u ≈ 2^t·(1 + u) (|u| < 3.8e-6 for z in [-87,
    0]). An emulation with an exact 2^t (numpy, 1.1M z in [-87, 88]) gives at most 0.98 fp32 eps against 3.8e-6; the
    hardware ex2.approx adds its own ~2 ulp. z is clamped at CLAMP_Z first, NaN kept: z = -inf gives 2^-150, flushed
    to 0, where u would be -inf + inf. Cost: three FMAs and a max per element (fp32 N = 32K rows kernel: 513 SASS
    instructions per thread against 655 for the ecc04f6 form r = fma(z, L_lo, fma(z, L, -t)), e·(1 + r·ln 2) with a
    select for z = ±inf, and 352 uncompensated). 1 GiB fp32 softmax, same run (tune-gib-exp-66b5de2.log): N = 32K
    97.4 % against 94.5 (ecc04f6) and 97.8 (uncompensated); 128K / 256K 93.9 / 91.6 against 93.5 / 90.6 and 94.5 /
    92.5; 1K-16K within 0.4 points of either."""
    if FAST and z.dtype == tl.float32:
        if FAST == 2:
            z = tl.maximum(z, CLAMP_Z, propagate_nan=tl.PropagateNan.ALL)
        t = z * LOG2E
        e = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [t], dtype=tl.float32, is_pure=True,
                                      pack=1)
        if FAST == 2:
            return tl.fma(e, tl.fma(-t, LN2_LO, tl.fma(-t, LN2_HI, z)), e)
        return e
    else:
        return tl.exp(z)


def _exp_level(fast: bool, mode: int, out_dtype: torch.dtype) -> int:
    """FAST for a softmax-family kernel: 0 (tl.exp), 1 (ex2.approx.ftz) or 2 (ex2.approx.ftz with the product's
    rounding compensated) where softmax writes fp32 e^(x - m) as its output (see _exp)."""
    return (2 if mode == SOFTMAX and out_dtype == torch.float32 else 1) if fast else 0


@triton.jit
def _state(x, axis: tl.constexpr, FAST: tl.constexpr):
    """(m, d) of x along axis, and e = e^(x - m) (kept: the output reuses it, one exponential per element).
    d and e are taken relative to m, or to 0 where m = ±inf, so an all -inf set gives (-inf, 0), the identity
    of ⊕, and a set holding +inf gives d = inf (logsumexp = +inf), as torch.logsumexp."""
    m = tl.max(x, axis=axis)                                  # 1. m = max_j x_j
    e = _exp(x - tl.expand_dims(_shift(m), axis), FAST)
    d = tl.sum(e, axis=axis)                                  # 2. d = sum_j e^(x_j - m)
    return m, d, e


@triton.jit
def _alpha(m_c, m):
    """e^(m_c - m), which takes a d relative to m_c to one relative to m >= m_c (⊕); 1 where m_c == m, so that
    -inf - -inf and inf - inf give 1, not NaN."""
    return tl.where(m_c == m, 1.0, tl.exp(m_c - m))


@triton.jit
def _combine_all(pm, pd, axis: tl.constexpr):
    """⊕ over partial states (pm, pd) along axis."""
    m = tl.max(pm, axis=axis)
    d = tl.sum(pd * _alpha(pm, tl.expand_dims(m, axis)), axis=axis)
    return m, d


@triton.jit
def _normalise(x, e, m_c, m, d, MODE: tl.constexpr):
    """3. y from registers. e = e^(x - m_c) for this tile's own max m_c; (m, d) is the merged row state.
    softmax: y = e · e^(m_c - m) / d;  log-softmax: y = (x - m) - log d. A row holding +inf is NaN, as torch."""
    if MODE == 0:
        return e * tl.where(m == float("inf"), float("nan"), _alpha(m_c, m) / d)
    else:
        log_d = tl.where(m == float("inf"), float("nan"), tl.log(d))
        return (x - m) - log_d            # x - m first: exact near the max, as torch


@triton.jit
def _lse(m, d):
    """logsumexp = m + log d with d relative to _shift(m): -inf for the identity, +inf for +inf."""
    return _shift(m) + tl.log(d)


@triton.jit
def _row_offsets(rows, INNER, stride_o, stride_i):
    rows = rows.to(tl.int64)
    return (rows // INNER) * stride_o + (rows % INNER) * stride_i


@triton.jit
def _row_generation(GEN, row):
    """The row barrier's generation before this program arrives: only the row's last arrival in this launch
    moves it. The register kernels read it right after issuing their chunk's loads, so its L2 round trip
    overlaps them; the shared-memory kernels read it at the barrier."""
    return tl.atomic_add(GEN + row, 0, sem="acquire")


@triton.jit
def _row_barrier(ARRIVE, GEN, row, C, gen):
    """Wait until all C programs of `row` have arrived. Sense-reversing barrier on two int32 words per row
    that persist across launches: the last to arrive resets ARRIVE and bumps GEN; the others spin on GEN until
    it leaves ``gen`` (_row_generation)."""
    arrived = tl.atomic_add(ARRIVE + row, 1, sem="acq_rel")
    if arrived == C - 1:
        tl.atomic_xchg(ARRIVE + row, 0, sem="relaxed")
        tl.atomic_add(GEN + row, 1, sem="release")
    else:
        # one thread polls with an acquire atomic. (Polling with volatile loads from every thread measured
        # 10-40 % slower on the H200: 512 threads per program re-reading one word.)
        while tl.atomic_add(GEN + row, 0, sem="acquire") == gen:
            pass


# ---- forward: rows in registers ---------------------------------------------------------------------
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


# ---- forward: a row cut into C chunks ------------------------------------------------------------------
@triton.jit
def softmax_chunks_kernel(
    X, Y, PART_M, PART_D, ARRIVE, GEN, N, INNER, sxo, sxi, sxn, syo, syi, syn, C,
    CHUNK: tl.constexpr, C_POW2: tl.constexpr, MODE: tl.constexpr, PHASE: tl.constexpr, ACC: tl.constexpr,
    FAST: tl.constexpr,
):
    """Program (row, c) owns chunk c of its row.

    PHASE 0 (coop):    read chunk, publish (m_c, d_c), row barrier, merge with ⊕, write y from registers.
    PHASE 1 (publish): read chunk, publish (m_c, d_c); for LOGSUMEXP the last program of the row to arrive
                       merges and writes lse (nobody waits, so it also runs in the interpreter).
    PHASE 2 (finish):  merge the published states, re-read the chunk, write y (`split`, interpreter only).
    """
    pid = tl.program_id(0)
    row = pid // C
    c = pid % C
    cols = c * CHUNK + tl.arange(0, CHUNK)
    mask = cols < N
    x_off = _row_offsets(row, INNER, sxo, sxi) + cols.to(tl.int64) * sxn
    x = tl.load(X + x_off, mask=mask, other=float("-inf")).to(ACC)          # read x
    if PHASE == 0:
        gen = _row_generation(GEN, row)                                     # (its round trip overlaps x's)
    k = tl.arange(0, C_POW2)
    if PHASE != 2:
        # 1. publish this chunk's state (m_c, d_c)
        m_c, d_c, e = _state(x, 0, FAST)
        tl.store(PART_M + pid, m_c)
        tl.store(PART_D + pid, d_c)
        tl.debug_barrier()
    if PHASE == 1:
        if MODE == 2:
            if tl.atomic_add(ARRIVE + row, 1, sem="acq_rel") == C - 1:
                tl.atomic_xchg(ARRIVE + row, 0, sem="relaxed")
                m, d = _merge_row(PART_M, PART_D, row, C, k)
                tl.store(Y + row, _lse(m, d).to(Y.dtype.element_ty))
    else:
        if PHASE == 0:
            _row_barrier(ARRIVE, GEN, row, C, gen)                          # 2. wait for the row's chunks
        m, d = _merge_row(PART_M, PART_D, row, C, k)                         # 3. (m, d) = ⊕_c (m_c, d_c)
        if PHASE == 2:
            m_c, _, e = _state(x, 0, FAST)
        y = _normalise(x, e, m_c, m, d, MODE)                                # 4. y from registers
        y_off = _row_offsets(row, INNER, syo, syi) + cols.to(tl.int64) * syn
        tl.store(Y + y_off, y.to(Y.dtype.element_ty), mask=mask)            # write y


@triton.jit
def _merge_row(PART_M, PART_D, row, C, k):
    pm = tl.load(PART_M + row * C + k, mask=k < C, other=float("-inf"), volatile=True)
    pd = tl.load(PART_D + row * C + k, mask=k < C, other=0.0, volatile=True)
    return _combine_all(pm, pd, 0)


@triton.jit
def _ptx_f32(w, ASM: tl.constexpr):
    """One PTX instruction on each int32 of w, its 32-bit result read as fp32 (not pure: never merged)."""
    return tl.inline_asm_elementwise(ASM, "=r,r", [w], dtype=tl.float32, is_pure=False, pack=1)


@triton.jit
def _bf16_halves(w, FORM: tl.constexpr):
    """The two bf16 of each int32 word w as fp32: element 2j is the low half (little-endian), 2j + 1 the high.
    FORM 0 is plain shift/and; FORMs 1 and 2 give the same values by other instructions (byte permute;
    funnel shift and bit-field insert) in inline PTX, which neither LLVM nor ptxas merges with another
    FORM. Each use of the halves unpacks w again in its own FORM, so only w (one register per two elements)
    is live between uses, not both fp32 halves."""
    if FORM == 1:
        return _ptx_f32(w, "prmt.b32 $0, $1, 0, 0x1044;"), _ptx_f32(w, "prmt.b32 $0, $1, 0, 0x3244;")
    if FORM == 2:
        return _ptx_f32(w, "shf.l.wrap.b32 $0, 0, $1, 16;"), _ptx_f32(w, "bfi.b32 $0, 0, $1, 0, 16;")
    return (w << 16).to(tl.float32, bitcast=True), (w & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _chunk_words(N, C, CHUNK: tl.constexpr):
    """Program (row, c) of a bf16x2 kernel: its id, row, and chunk c's int32 words (two bf16 each) with their
    mask; N is even."""
    pid = tl.program_id(0)
    row = pid // C
    HALF: tl.constexpr = CHUNK // 2
    words = (pid % C) * HALF + tl.arange(0, HALF)
    return pid, row, words, words < N // 2


@triton.jit
def _word_row(P, row, INNER, so, si):
    """Row `row` of a bf16 tensor as int32 words (its strides are even: the plans check)."""
    return P.to(tl.pointer_type(tl.int32)) + _row_offsets(row, INNER, so // 2, si // 2)


@triton.jit
def _pack_bf16x2(lo, hi):
    """Both halves rounded to nearest even and packed into one word by one instruction."""
    return tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,r,r", [hi, lo], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def softmax_coop_bf16x2_kernel(
    X, Y, PART_M, PART_D, ARRIVE, GEN, N, INNER, sxo, sxi, syo, syi, C,
    CHUNK: tl.constexpr, C_POW2: tl.constexpr, MODE: tl.constexpr,
):
    """The coop path for bf16 rows of unit stride and even N: x is read and held as int32 words of two
    elements, one register per two elements where fp32 e^(x - m_c) needs one per element, so a program
    holds twice the chunk and an SM twice the bytes in flight (bf16 at 8192 elements per program
    reached 59-61 % of copy against fp32's 76-81 % at the same register footprint: tune-long.log; this kernel
    66-78 % at N = 32K-256K: tune-bf16x2-f0cf1a3.log). Offsets here count words (element offset / 2; the
    plan checks that strides are even)."""
    pid, row, words, mask = _chunk_words(N, C, CHUNK)
    # read x; padding 0xFF80FF80 = (-inf, -inf)
    w = tl.load(_word_row(X, row, INNER, sxo, sxi) + words, mask=mask, other=-8323200)
    gen = _row_generation(GEN, row)
    # 1. (m_c, d_c) of the chunk's elements, unpacking w once per pass; one reduction each
    lo, hi = _bf16_halves(w, 0)
    m_c = tl.max(tl.maximum(lo, hi), axis=0)
    s_c = _shift(m_c)
    lo, hi = _bf16_halves(w, 1)
    d_c = tl.sum(_exp(lo - s_c, True) + _exp(hi - s_c, True), axis=0)
    tl.store(PART_M + pid, m_c)
    tl.store(PART_D + pid, d_c)
    tl.debug_barrier()
    _row_barrier(ARRIVE, GEN, row, C, gen)                                   # 2. wait for the row's chunks
    m, d = _merge_row(PART_M, PART_D, row, C, tl.arange(0, C_POW2))          # 3. (m, d) = ⊕_c (m_c, d_c)
    lo, hi = _bf16_halves(w, 2)
    if MODE == 0:                                                            # 4. y = e^(x - m) / d
        s = _shift(m)
        scale = tl.where(m == float("inf"), float("nan"), 1.0 / d)
        y_lo = tl.exp(lo - s) * scale           # (ex2.approx.ftz here as well took 64 -> 80 registers and
        y_hi = tl.exp(hi - s) * scale           # lost 5-7 points at N = 32K-256K: ab-ftz-d09fd7e.log)
    else:                                                                    #    y = x - (m + log d)
        b = m + tl.where(m == float("inf"), float("nan"), tl.log(d))  # (16 registers fewer than (x - m) - log d;
        y_lo = lo - b                                                 # the difference is far below bf16's ulp)
        y_hi = hi - b
    tl.store(_word_row(Y, row, INNER, syo, syi) + words, _pack_bf16x2(y_lo, y_hi), mask=mask)   # write y


# ---- backward ---------------------------------------------------------------------------------------
@triton.jit
def _grad(y, dy, s, LOG: tl.constexpr, LIBDEVICE: tl.constexpr):
    if LOG:
        # log-softmax: dx = dy - e^y · sum(dy). For fp32/fp64 dx (LIBDEVICE) libdevice's exp, as torch's expf:
        # e^y · sum(dy) reaches ~4 at N = 3000 (|sum(dy)| ~ 55), where the fast 2^(y·log2 e)'s few-ulp error is
        # several of dx's ulps; for 16-bit dx the fast exp's error is far below an ulp. The interpreter has no
        # libdevice; its tl.exp is numpy's, exact.
        return dy - (libdevice.exp(y) if LIBDEVICE else tl.exp(y)) * s
    else:
        return y * (dy - s)                # softmax:     dx = y · (dy - sum(y · dy))


@triton.jit
def _grad_sum(y, dy, axis: tl.constexpr, LOG: tl.constexpr, SUM: tl.constexpr):
    """sum(dy) or sum(y · dy), accumulated in SUM: fp64 for fp32 tensors. The terms have both signs, so the
    sum cancels (|sum| ~ sqrt(N) of sum|terms| ~ N): an fp32 tree's error, times e^y, measured 7x torch's in
    dx on the H200 (N = 3000), and was as large whether y came from this library, torch or fp64."""
    if LOG:
        return tl.sum(dy.to(SUM), axis=axis)
    else:
        return tl.sum((y * dy).to(SUM), axis=axis)


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


@triton.jit
def softmax_bwd_chunks_kernel(
    Yp, DY, DX, PART, ARRIVE, GEN, N, INNER, syo, syi, syn, sdo, sdi, sdn, sxo, sxi, sxn, C,
    CHUNK: tl.constexpr, C_POW2: tl.constexpr, LOG: tl.constexpr, PHASE: tl.constexpr, LIBDEVICE: tl.constexpr,
    ACC: tl.constexpr, SUM: tl.constexpr,
):
    """Long rows: chunk c of y and dy in registers; partial sums s_c meet at the row barrier (PHASE 0), or
    are published (PHASE 1) and finished by a second launch that re-reads the chunk (PHASE 2, interpreter)."""
    pid = tl.program_id(0)
    row = pid // C
    c = pid % C
    cols = c * CHUNK + tl.arange(0, CHUNK)
    mask = cols < N
    c64 = cols.to(tl.int64)
    y = tl.load(Yp + _row_offsets(row, INNER, syo, syi) + c64 * syn, mask=mask, other=0.0).to(ACC)
    dy = tl.load(DY + _row_offsets(row, INNER, sdo, sdi) + c64 * sdn, mask=mask, other=0.0).to(ACC)
    if PHASE == 0:
        gen = _row_generation(GEN, row)
    if PHASE != 2:
        tl.store(PART + pid, _grad_sum(y, dy, 0, LOG, SUM))                 # 1. publish s_c
        tl.debug_barrier()
    if PHASE != 1:
        if PHASE == 0:
            _row_barrier(ARRIVE, GEN, row, C, gen)                          # 2. wait for the row
        k = tl.arange(0, C_POW2)
        s = tl.sum(tl.load(PART + row * C + k, mask=k < C, other=0.0, volatile=True), axis=0).to(ACC)  # 3. s
        dx = _grad(y, dy, s, LOG, LIBDEVICE)                                 # 4. dx from registers
        tl.store(DX + _row_offsets(row, INNER, sxo, sxi) + c64 * sxn, dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def softmax_bwd_coop_bf16x2_kernel(
    Yp, DY, DX, PART, ARRIVE, GEN, N, INNER, syo, syi, sdo, sdi, sxo, sxi, C,
    CHUNK: tl.constexpr, C_POW2: tl.constexpr, LOG: tl.constexpr,
):
    """The backward's coop path for bf16 rows of unit stride and even N, as softmax_coop_bf16x2_kernel: y and
    dy are held across the row barrier as int32 words of two elements (one register per two elements of each)
    and unpacked again after it. Offsets count words (element offset / 2; the plan checks even strides)."""
    pid, row, words, mask = _chunk_words(N, C, CHUNK)
    # read y and dy; padding 0 = (+0.0, +0.0) adds nothing to either sum
    yw = tl.load(_word_row(Yp, row, INNER, syo, syi) + words, mask=mask, other=0)
    dw = tl.load(_word_row(DY, row, INNER, sdo, sdi) + words, mask=mask, other=0)
    gen = _row_generation(GEN, row)
    dy_lo, dy_hi = _bf16_halves(dw, 0)                                       # 1. publish s_c
    if LOG:
        s_c = tl.sum(dy_lo + dy_hi, axis=0)
    else:
        y_lo, y_hi = _bf16_halves(yw, 0)
        s_c = tl.sum(y_lo * dy_lo + y_hi * dy_hi, axis=0)
    tl.store(PART + pid, s_c)
    tl.debug_barrier()
    _row_barrier(ARRIVE, GEN, row, C, gen)                                   # 2. wait for the row
    k = tl.arange(0, C_POW2)
    s = tl.sum(tl.load(PART + row * C + k, mask=k < C, other=0.0, volatile=True), axis=0)   # 3. s = sum s_c
    y_lo, y_hi = _bf16_halves(yw, 1)                                         # 4. dx, unpacking y and dy again
    dy_lo, dy_hi = _bf16_halves(dw, 1)
    dx_lo = _grad(y_lo, dy_lo, s, LOG, False)                               # fast exp: dx is bf16 (see _grad)
    dx_hi = _grad(y_hi, dy_hi, s, LOG, False)
    tl.store(_word_row(DX, row, INNER, sxo, sxi) + words, _pack_bf16x2(dx_lo, dx_hi), mask=mask)  # write dx


# ---- launchers: choose a path once per problem, then launch -----------------------------------------------
import torch  # noqa: E402  (kept below the kernels: this half is host code)

from ..backend import interpret_mode  # noqa: E402
from ._launch import BoundKernel, stream_scratch  # noqa: E402

_INTERPRETER_SMS = 4
_sms: dict = {}           # device index -> SM count
_plans: dict = {}         # problem -> _Plan: the path and launch configuration are chosen once per problem
MAX_PLANS = 4096
_last = None              # (plan, compiled kernel) of the latest launch: see last_launch()


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return _INTERPRETER_SMS
    if device.index not in _sms:
        _sms[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return _sms[device.index]


def _pow2(n: int) -> int:
    return 1 << (max(int(n), 1) - 1).bit_length()


def _acc(*dtypes) -> tl.dtype:
    return tl.float64 if torch.float64 in dtypes else tl.float32


def _bwd_sum(*dtypes) -> tl.dtype:
    """The backward's sum: fp64 when any tensor is fp32 or fp64 (see _grad_sum), fp32 for 16-bit ones."""
    return tl.float64 if {torch.float32, torch.float64} & set(dtypes) else tl.float32


def _workspace(device: torch.device, rows: int, parts: int, dtype: torch.dtype):
    """Barrier words (ARRIVE, GEN: int32 per row) and partial-state buffers (PART_M, PART_D: ``parts`` each).

    Every launch leaves ARRIVE as it found it (0) and writes the partial states it reads, so the buffers are
    cached per (device, stream) and reused without a memset (``stream_scratch``); only the barrier words start
    zeroed (GEN may hold any value).
    """
    rows, parts = max(rows, 1024), max(parts, 1 << 16)
    return stream_scratch(("softmax", dtype), device,
                          ((rows, torch.int32), (rows, torch.int32), (parts, dtype), (parts, dtype)), zeroed=2)


class _Plan:
    """What one problem (shape, strides, dtypes, op) launches: ``launches`` (bound kernels, in order) with the
    run-time arguments after the tensors, the workspace it needs, and the record that ``last_launch()`` reports."""

    __slots__ = ("path", "launches", "scalars", "workspace", "record")

    def __init__(self, path, launches, scalars, workspace, record):
        self.path, self.launches, self.scalars, self.workspace, self.record = (
            path, launches, scalars, workspace, record)


def _run(plan: _Plan, tensors: tuple, device: torch.device) -> str:
    global _last
    args = tensors
    if plan.workspace is not None:
        rows, parts, dtype, pick = plan.workspace
        ws = _workspace(device, rows, parts, dtype)
        args = args + tuple(ws[i] for i in pick)
    args = args + plan.scalars
    for bound in plan.launches:
        compiled = bound(args, tensors, device)
    _last = (plan, compiled)
    return plan.path


def last_launch() -> dict:
    """Path and configuration of the latest launch, with the compiler's registers and spills (tests, benchmarks)."""
    if _last is None:
        return {}
    plan, compiled = _last
    return dict(plan.record, regs=getattr(compiled, "n_regs", None), spills=getattr(compiled, "n_spills", None))


def _cached_plan(key, build, config):
    if config:                                  # explicit overrides (tests, tuning) are not cached
        return build(dict(config))
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) >= MAX_PLANS:
            _plans.clear()
        plan = _plans[key] = build({})
    return plan


def _warps(elems_per_program: int, per_thread: int) -> int:
    return max(4, min(32, elems_per_program // (32 * per_thread)))


def _few_rows(M: int, sms: int) -> bool:
    """At most DECODE_MAX_ROWS_PER_SM rows per SM: decode sizes, where the chunking is sized for latency."""
    return M <= DECODE_MAX_ROWS_PER_SM * sms


def choose_path(M: int, N: int, sms: int, interpret: bool, backward: bool = False, words: bool = False) -> str:
    """``rows``, ``coop`` or ``split`` for an (M rows, N) problem (see the module docstring). ``words``: the
    forward's bf16x2 kernel applies (bf16 rows of unit stride, even N, 4-byte aligned starts)."""
    few_rows = _few_rows(M, sms) and N > DECODE_MIN_N
    row_max = BF16X2_ROW_MAX_N if words and not interpret else ROW_MAX_N
    if N <= row_max // (BWD_CHUNK_SCALE if backward else 1) and not few_rows:
        return "rows"
    if interpret or _chunking(M, N, sms, backward)[1] > COOP_MAX_CHUNKS:
        return "split"
    return "coop"


def _chunking(M: int, N: int, sms: int, backward: bool, words: bool = False) -> tuple[int, int]:
    """(chunk, C). ``words``: many rows in the bf16x2 kernel, which holds a chunk in half the registers."""
    few_rows = _few_rows(M, sms)
    if backward:
        chunk = BWD_DECODE_CHUNK if few_rows else BWD_COOP_CHUNK
    elif few_rows:
        chunk = DECODE_MIN_CHUNK
        while chunk < COOP_CHUNK and (M * triton.cdiv(N, chunk) > DECODE_PROGRAMS_PER_SM * sms
                                      or triton.cdiv(N, chunk) > COOP_MAX_CHUNKS):
            chunk *= 2
    elif words:
        chunk = BF16X2_SHORT_CHUNK if N <= BF16X2_SHORT_N else COOP_BF16X2_CHUNK
    else:
        chunk = COOP_CHUNK
    chunk = min(chunk, _pow2(N))
    return chunk, triton.cdiv(N, chunk)


def _chunk_launches(fn, path: str, grid: tuple, meta: dict) -> list:
    """coop: one launch (PHASE 0); split: publish (PHASE 1), then finish (PHASE 2); logsumexp: PHASE 1."""
    phases = (0,) if path == "coop" else (1,) if path == "chunks" else (1, 2)
    return [BoundKernel(fn, grid, dict(meta, PHASE=p)) for p in phases]


def forward(x, out, geo_x, geo_y, M, N, INNER, mode: int, config: dict | None = None) -> str:
    """Launch softmax (mode 0), log-softmax (1) or logsumexp (2; ``out`` is a contiguous [M] tensor).

    ``geo_*`` are (stride_outer, stride_inner, stride_n) of the row view. Returns the path taken.
    """
    device = x.device
    words = x.dtype == torch.bfloat16 and not (x.data_ptr() | out.data_ptr()) & 3   # see _bf16x2_ok
    aligned = not (x.data_ptr() | out.data_ptr()) & 15                              # see _smem_ok
    key = (M, N, INNER, geo_x, geo_y, mode, x.dtype, out.dtype, device, words, aligned)
    plan = _cached_plan(key, lambda cfg: _forward_plan(cfg, x, out, geo_x, geo_y, M, N, INNER, mode, words),
                        config)
    return _run(plan, (x, out), device)


def _bf16x2_ok(x, out, geo_x, geo_y, N, mode, words) -> bool:
    """softmax_coop_bf16x2_kernel applies: bf16 in and out, unit-stride rows that start on a 4-byte boundary
    (pointers, when ``words``, and even row strides), even N, and an output per element."""
    return (words and out.dtype == torch.bfloat16 and mode != LOGSUMEXP and N % 2 == 0
            and geo_x[2] == geo_y[2] == 1 and not any(s % 2 for s in geo_x[:2] + geo_y[:2]))


def _forward_plan(cfg, x, out, geo_x, geo_y, M, N, INNER, mode, words=False) -> _Plan:
    device = x.device
    sms = sm_count(device)
    interpret = device.type != "cuda" and interpret_mode()
    eligible = _bf16x2_ok(x, out, geo_x, geo_y, N, mode, words)
    # bf16x2 for many rows only: at decode sizes the generic kernel was 0.1-1.1 µs faster on 5 of 6 shapes and
    # 1.8 µs slower on one (32 x 262144), tune-bf16x2-f0cf1a3.log
    words = eligible and not _few_rows(M, sms)
    smem_rows = _smem_rows_warps(M, N, x.element_size(), mode, sms)
    smem_rows = smem_rows if smem_rows and _smem_ok(x, out, geo_x, geo_y, N, mode, interpret) else None
    path = cfg.pop("path", None) or ("rows" if smem_rows else choose_path(M, N, sms, interpret, words=words))
    acc = _acc(x.dtype, out.dtype)
    if mode == LOGSUMEXP:
        geo_y = (0, 0, 0)
    stream = _stream_config(M, N, x.element_size(), mode, sms)
    if cfg.pop("stream", stream is not None) and _stream_ok(x, geo_x, N, mode, interpret):
        return _stream_plan(cfg, x, M, N, INNER, geo_x, *(stream or LSE_STREAM_FALLBACK))
    pipe = LSE_PIPE.get((x.element_size(), _pow2(N))) if mode == LOGSUMEXP else None
    if path == "rows" and cfg.pop("pipe", pipe is not None) and _pipe_ok(x, geo_x, N, mode, interpret):
        return _pipe_plan(cfg, x, M, N, INNER, geo_x, *(pipe or LSE_PIPE_FALLBACK))
    if path == "rows" and cfg.pop("smem", smem_rows is not None):
        plan = _smem_plan(cfg, x, out, M, N, INNER, geo_x, geo_y, mode, None, smem_rows or SMEM_ROWS[-1][2], 0,
                          "rows")
        if plan is not None:
            return plan
    if path == "rows":
        block_n = _pow2(N)
        row_bytes = block_n * x.element_size()
        lse_loop = mode == LOGSUMEXP and LSE_PREFETCH_MIN_ROW_BYTES <= row_bytes <= LSE_PREFETCH_MAX_ROW_BYTES
        one_row = N >= ONE_ROW_MIN_N and not lse_loop
        prefetch = cfg.pop("prefetch", (row_bytes <= PREFETCH_MAX_ROW_BYTES and not one_row) or lse_loop)
        tile = cfg.pop("tile", PREFETCH_TILE_ELEMS if prefetch else block_n if one_row else ROW_TILE_ELEMS)
        block_m = min(_pow2(M), max(1, tile // block_n))
        measured = ROW_WARPS_MEASURED.get((x.element_size(), block_n))
        warps = cfg.pop("num_warps", (measured or max(1, min(32, row_bytes // ROW_BYTES_PER_WARP))) if block_m == 1
                        else _warps(block_m * block_n, ROW_ELEMS_PER_THREAD))
        tiles = triton.cdiv(M, block_m)
        waves = cfg.pop("waves", LSE_WAVES if mode == LOGSUMEXP else PERSISTENT_WAVES)
        grid = min(tiles, waves * sms) if prefetch else tiles
        # the fast exp everywhere but softmax in the prefetching loop (bf16 N = 1K: 84.7 against 90.0 % with
        # tl.exp, though 48 fewer instructions per tile; logsumexp in the same loop gained 5 points)
        fast = not interpret and not (mode == SOFTMAX and prefetch)
        meta = dict(BLOCK_M=block_m, BLOCK_N=block_n, MODE=mode, ACC=acc, PREFETCH=prefetch,
                    FAST=_exp_level(fast, mode, out.dtype), num_warps=warps)
        record = dict(path=path, block_m=block_m, block_n=block_n, num_warps=warps, grid=grid, prefetch=prefetch,
                      fast_exp=fast)
        return _Plan(path, [BoundKernel(softmax_rows_kernel, (grid,), meta)], (M, N, INNER, *geo_x, *geo_y, grid),
                     None, record)
    smem = _smem_config(M, N, x.element_size(), mode, sms, eligible)
    if path == "coop" and cfg.pop("smem", smem is not None) and _smem_ok(x, out, geo_x, geo_y, N, mode, interpret):
        plan = _smem_plan(cfg, x, out, M, N, INNER, geo_x, geo_y, mode,
                          *(smem or SMEM_CONFIG_MASKED[x.element_size()]))
        if plan is not None:
            return plan
    bf16x2 = path == "coop" and eligible and cfg.pop("bf16x2", words)
    lse_many = mode == LOGSUMEXP and not _few_rows(M, sms)
    chunk = cfg.pop("chunk", None) or (min(LSE_CHUNK, _pow2(N)) if lse_many else
                                       _chunking(M, N, sms, backward=False, words=bf16x2)[0])
    C = triton.cdiv(N, chunk)
    warps = cfg.pop("num_warps", LSE_CHUNK_WARPS if lse_many else _warps(chunk, 64 if bf16x2 else 32))
    part_dtype = torch.float64 if acc == tl.float64 else torch.float32
    options = {"maxnreg": cfg.pop("maxnreg")} if "maxnreg" in cfg else {}
    record = dict(path=path, kernel="bf16x2" if bf16x2 else "chunks", chunk=chunk, chunks=C, num_warps=warps,
                  grid=M * C, **options)
    # workspace order in the kernels: PART_M, PART_D, ARRIVE, GEN
    workspace = (M, M * C, part_dtype, (2, 3, 0, 1))
    if bf16x2:
        meta = dict(CHUNK=chunk, C_POW2=_pow2(C), MODE=mode, num_warps=warps, **options)
        return _Plan(path, [BoundKernel(softmax_coop_bf16x2_kernel, (M * C,), meta)],
                     (N, INNER, *geo_x[:2], *geo_y[:2], C), workspace, record)
    if mode == LOGSUMEXP:
        path = record["path"] = "chunks"
    meta = dict(CHUNK=chunk, C_POW2=_pow2(C), MODE=mode, ACC=acc, FAST=_exp_level(not interpret, mode, out.dtype),
                num_warps=warps, **options)
    launches = _chunk_launches(softmax_chunks_kernel, path, (M * C,), meta)
    return _Plan(path, launches, (N, INNER, *geo_x, *geo_y, C), workspace, record)


def _smem_rows(geos, N: int, elem_bytes: int) -> bool:
    """Rows the shared-memory kernels copy by 16-byte cp.async per thread: 2- or 4-byte elements, unit-stride
    rows whose starts and N are multiples of 16 elements (pointer alignment is the caller's check)."""
    return elem_bytes in (2, 4) and N % 16 == 0 and all(g[2] == 1 and not (g[0] % 16 or g[1] % 16) for g in geos)


def _smem_ok(x, out, geo_x, geo_y, N, mode, interpret) -> bool:
    """softmax_coop_smem_kernel applies (not in the interpreter): softmax or log-softmax, _smem_rows, 16-byte
    aligned x and y."""
    return (not interpret and mode != LOGSUMEXP and _smem_rows((geo_x, geo_y), N, x.element_size())
            and not (x.data_ptr() | out.data_ptr()) & 15)


def _smem_config(M: int, N: int, elem_bytes: int, mode: int, sms: int, bf16x2: bool) -> tuple[int, int, int] | None:
    """(chunk, warps, reg) of softmax_coop_smem_kernel for a coop problem of many rows, or None where the register
    kernels stay: decode sizes (measured no better with it) and bf16 rows under SMEM_BF16_MIN_N (bf16x2)."""
    if _few_rows(M, sms) or (bf16x2 and N < SMEM_BF16_MIN_N) or elem_bytes not in SMEM_CONFIG:
        return None
    chunk, warps, reg = SMEM_CONFIG[elem_bytes]
    return (chunk, warps, reg) if _reg_fits(N, chunk, reg * _sub_tile_elems(elem_bytes, warps)) else \
        SMEM_CONFIG_MASKED[elem_bytes]


def _sub_tile_elems(elem_bytes: int, warps: int) -> int:
    """Elements of one sub-tile of the shared-memory kernels: one 16-byte copy per thread of ``warps`` warps (a
    chunk is a whole number of them; REG holds the first ``reg`` in registers)."""
    return 16 // elem_bytes * 32 * warps


def _reg_fits(N: int, chunk: int, reg_elems: int) -> bool:
    """Every chunk of a row holds the first ``reg_elems`` elements that REG keeps in registers, unmasked: the
    chunk divides N, or the row's last chunk is at least that long."""
    return N % chunk == 0 or N % chunk >= reg_elems


def _smem_rows_warps(M: int, N: int, elem_bytes: int, mode: int, sms: int) -> int | None:
    """Warps of the shared-memory kernel holding a whole 16-bit row (SMEM_ROWS), or None: other dtypes and lengths,
    logsumexp, and decode sizes (the coop path's)."""
    if elem_bytes != 2 or mode == LOGSUMEXP or (_few_rows(M, sms) and N > DECODE_MIN_N):
        return None
    return next((warps for lo, hi, warps in SMEM_ROWS if lo <= N <= hi), None)


def _smem_chunk_ok(N: int, chunk: int, C: int, sub: int, reg: int) -> bool:
    """A shared-memory plan (forward or backward) can run: at most COOP_MAX_CHUNKS chunks per row, and ``reg``
    register sub-tiles of ``sub`` elements a power of two (or 0), leaving at least one sub-tile in shared memory,
    and covered by every chunk of the row (_reg_fits)."""
    return C <= COOP_MAX_CHUNKS and chunk // sub > reg and not reg & (reg - 1) and _reg_fits(N, chunk, reg * sub)


def _smem_chunking(cfg, elem_bytes: int, N: int, chunk: int | None, warps: int) -> tuple[int, int, int, int]:
    """(chunk, C, vec, warps) of a shared-memory plan: the chunk a whole number of sub-tiles (one 16-byte copy per
    thread each), the whole row when ``chunk`` is None; ``cfg`` may override chunk and warps."""
    warps = cfg.pop("num_warps", warps)
    vec = 16 // elem_bytes
    sub = _sub_tile_elems(elem_bytes, warps)
    chunk = cfg.pop("chunk", chunk)
    chunk = triton.cdiv(N, sub) * sub if chunk is None else max(sub, chunk // sub * sub)
    return chunk, triton.cdiv(N, chunk), vec, warps


def _smem_plan(cfg, x, out, M, N, INNER, geo_x, geo_y, mode, chunk, warps, reg, path="coop") -> _Plan | None:
    """The forward's shared-memory plan (``rows``: one chunk per row, no barrier), or None where a row would need
    more than COOP_MAX_CHUNKS or ``reg`` leaves no sub-tile in shared memory. ``reg``: sub-tiles held in registers
    (a power of two; bf16 in and out holds them as int32 words)."""
    from .softmax_smem import softmax_coop_smem_kernel  # it imports this module's building blocks

    reg = cfg.pop("reg", reg)
    chunk, C, vec, warps = _smem_chunking(cfg, x.element_size(), N, chunk, warps)
    if not _smem_chunk_ok(N, chunk, C, _sub_tile_elems(x.element_size(), warps), reg):
        return None
    words = bool(reg) and x.dtype == out.dtype == torch.bfloat16       # registers hold two bf16 per word
    # KEEP_E: 16-bit softmax (x, y of one dtype) in coop chunks keeps e_j in x's place (rounded to the dtype: y
    # within 1 ulp, not 0.5) and scales it in step 3 instead of a second exponential. 1 GiB (tune-gib-keep-217fc5e
    # .log): bf16 N = 128K / 256K / 128256 93.4 / 91.7 / 93.9 % against 87.9 / 88.4 / 82.5, fp16 128K 89.9 / 86.5.
    # Whole rows (`rows`, SMEM_ROWS) lost 0.4-1.2 points with it (bf16 N = 4K / 16K / 32K): not there
    keep_e = (cfg.pop("keep_e", path == "coop") and mode == SOFTMAX and x.dtype == out.dtype
              and x.element_size() == 2)
    maxnreg = cfg.pop("maxnreg", SMEM_BF16_MAXNREG if words else 0)
    meta = dict(CHUNK=chunk, VEC=vec, WARPS=warps, C_POW2=_pow2(C), MODE=mode, EVEN=N % chunk == 0, REG=reg,
                WORDS=words, FAST=_exp_level(True, mode, out.dtype), KEEP_E=keep_e, num_warps=warps,
                **({"maxnreg": maxnreg} if maxnreg else {}))
    record = dict(path=path, kernel="smem", chunk=chunk, chunks=C, num_warps=warps, grid=M * C, reg=reg,
                  keep_e=keep_e, maxnreg=maxnreg)
    rows, parts = (M, M * C) if C > 1 else (1, 1)          # one chunk per row: the barrier's words go unused
    return _Plan(path, [BoundKernel(softmax_coop_smem_kernel, (M * C,), meta)],
                 (N, INNER, *geo_x[:2], *geo_y[:2], C), (rows, parts, torch.float32, (2, 3, 0, 1)), record)


def _pipe_ok(x, geo_x, N, mode, interpret) -> bool:
    """logsumexp_rows_pipe_kernel applies: as the streaming kernel (_stream_ok: not in the interpreter, logsumexp,
    x _smem_rows and 16-byte aligned), and the whole row in at most PIPE_MAX_ROW_BYTES of shared memory."""
    return _stream_ok(x, geo_x, N, mode, interpret) and _pow2(N) * x.element_size() <= PIPE_MAX_ROW_BYTES


def _pipe_plan(cfg, x, M, N, INNER, geo_x, warps, ctas) -> _Plan:
    """logsumexp's pipelined `rows` plan: a persistent grid of ``ctas`` programs per SM, ``warps`` each (capped
    so that each thread holds at least one 16-byte piece of the row)."""
    from .softmax_smem import logsumexp_rows_pipe_kernel  # it imports this module's building blocks

    vec = 16 // x.element_size()
    block = max(_pow2(N), vec * 32)
    warps = min(cfg.pop("num_warps", warps), block // (vec * 32))
    grid = min(M, cfg.pop("ctas", ctas) * sm_count(x.device))
    meta = dict(BLOCK=block, VEC=vec, WARPS=warps, EVEN=N == block, num_warps=warps)
    record = dict(path="rows", kernel="pipe", block_n=block, num_warps=warps, grid=grid)
    return _Plan("rows", [BoundKernel(logsumexp_rows_pipe_kernel, (grid,), meta)],
                 (M, N, INNER, *geo_x[:2], grid), None, record)


def _stream_config(M: int, N: int, elem_bytes: int, mode: int, sms: int) -> tuple[int, int, int] | None:
    """(warps, loads, programs per SM) of logsumexp_stream_kernel for many rows of this length (LSE_STREAM), or
    None: other dtypes, shorter rows, other modes, and decode sizes."""
    if mode != LOGSUMEXP or _few_rows(M, sms):
        return None
    return next((c for lo, c in reversed(LSE_STREAM.get(elem_bytes, ())) if N >= lo), None)


def _stream_ok(x, geo_x, N, mode, interpret) -> bool:
    """logsumexp_stream_kernel applies (not in the interpreter): logsumexp, x _smem_rows (16-byte loads) and
    16-byte aligned."""
    return (not interpret and mode == LOGSUMEXP and _smem_rows((geo_x,), N, x.element_size())
            and not x.data_ptr() & 15)


def _stream_plan(cfg, x, M, N, INNER, geo_x, warps, loads, ctas) -> _Plan:
    """logsumexp's streaming plan: a persistent grid of ``ctas`` programs per SM of ``warps`` warps, each thread
    taking ``loads`` 16-byte pieces per tile (config keys num_warps, loads, ctas override them)."""
    from .softmax_smem import logsumexp_stream_kernel  # it imports this module's building blocks

    warps, per = cfg.pop("num_warps", warps), 16 // x.element_size() * cfg.pop("loads", loads)
    tile = per * 32 * warps
    grid = min(M, cfg.pop("ctas", ctas) * sm_count(x.device))
    record = dict(path="rows", kernel="stream", tile=tile, num_warps=warps, grid=grid)
    return _Plan("rows", [BoundKernel(logsumexp_stream_kernel, (grid,), dict(PER=per, WARPS=warps, num_warps=warps))],
                 (M, N, INNER, *geo_x[:2], grid, triton.cdiv(N, tile)), None, record)


def backward(y, dy, dx, geo_y, geo_dy, geo_dx, M, N, INNER, log: bool, config: dict | None = None) -> str:
    """dx from y and dy: softmax ``dx = y·(dy − Σ y·dy)``, log-softmax ``dx = dy − e^y·Σ dy``."""
    device = y.device
    dtypes = (y.dtype, dy.dtype, dx.dtype)
    ptrs = y.data_ptr() | dy.data_ptr() | dx.data_ptr()
    words = dtypes == (torch.bfloat16,) * 3 and not ptrs & 3
    aligned = not ptrs & 15                                                           # see _smem_bwd_ok
    key = (M, N, INNER, geo_y, geo_dy, geo_dx, log, *dtypes, device, words, aligned)
    plan = _cached_plan(key, lambda cfg: _backward_plan(cfg, device, geo_y, geo_dy, geo_dx, M, N, INNER, log,
                                                        dtypes, words, aligned), config)
    return _run(plan, (y, dy, dx), device)


def _bf16x2_bwd_ok(geos, N: int, words: bool) -> bool:
    """softmax_bwd_coop_bf16x2_kernel applies: y, dy, dx bf16 starting on 4-byte boundaries (``words``), unit-stride
    rows with even strides, even N."""
    return words and N % 2 == 0 and all(g[2] == 1 and not (g[0] % 2 or g[1] % 2) for g in geos)


def _smem_bwd_config(M: int, N: int, elem_bytes: int, log: bool, sms: int) -> tuple[int, int, int, int] | None:
    """(chunk, warps, reg, ring) of softmax_bwd_coop_smem_kernel for many coop rows (SMEM_BWD_CONFIG), or None (decode
    sizes)."""
    if _few_rows(M, sms) or (elem_bytes, log) not in SMEM_BWD_CONFIG:
        return None
    configs = SMEM_BWD_CONFIG[elem_bytes, log]
    return next((c for c in configs if _reg_fits(N, c[0], c[2] * _sub_tile_elems(elem_bytes, c[1]))),
                (*configs[-1][:2], 0, configs[-1][3]))


def _smem_bwd_rows(N: int, elem_bytes: int, log: bool) -> tuple[int, int, int] | None:
    """(warps, reg, ring) of the smem backward kernel holding a whole row (SMEM_BWD_ROWS), or None."""
    return next((t[elem_bytes, log] for lo, hi, t in SMEM_BWD_ROWS if lo <= N <= hi and (elem_bytes, log) in t),
                None)


def _smem_bwd_ok(geos, N: int, dtypes, aligned: bool, interpret: bool) -> bool:
    """softmax_bwd_coop_smem_kernel applies (not in the interpreter): y, dy, dx of one dtype, _smem_rows,
    16-byte aligned."""
    return not interpret and aligned and len(set(dtypes)) == 1 and _smem_rows(geos, N, dtypes[0].itemsize)


def _smem_bwd_plan(cfg, M, N, INNER, geos, dtype, types, chunk, warps, reg, ring, path="coop") -> _Plan | None:
    """The backward's shared-memory plan (``rows``: one chunk per row, no barrier), or None where a row would need
    more than COOP_MAX_CHUNKS or ``reg`` (sub-tiles of y and dy held in registers, as the forward's REG) leaves no
    sub-tile in shared memory or is not covered by the row's last chunk, or where a ``ring`` of y (RING) is asked
    of softmax's backward."""
    from .softmax_smem import softmax_bwd_coop_smem_kernel  # it imports this module's building blocks

    reg = cfg.pop("reg", reg)
    ring = cfg.pop("ring", ring)
    maxnreg = cfg.pop("maxnreg", SMEM_BWD_F16_MAXNREG if reg and dtype == torch.float16 else 0)
    chunk, C, vec, warps = _smem_chunking(cfg, dtype.itemsize, N, chunk, warps)
    if not _smem_chunk_ok(N, chunk, C, _sub_tile_elems(dtype.itemsize, warps), reg) or (ring and not types["LOG"]):
        return None
    meta = dict(CHUNK=chunk, VEC=vec, WARPS=warps, C_POW2=_pow2(C), EVEN=N % chunk == 0, num_warps=warps,
                REG=reg, WORDS=bool(reg) and dtype == torch.bfloat16, RING=ring,
                **{k: types[k] for k in ("LOG", "LIBDEVICE", "SUM")}, **({"maxnreg": maxnreg} if maxnreg else {}))
    record = dict(path=path, kernel="smem", chunk=chunk, chunks=C, num_warps=warps, grid=M * C, reg=reg,
                  ring=ring, maxnreg=maxnreg)
    part = torch.float64 if types["SUM"] == tl.float64 else torch.float32
    rows, parts = (M, M * C) if C > 1 else (1, 1)          # one chunk per row: the barrier's words go unused
    return _Plan(path, [BoundKernel(softmax_bwd_coop_smem_kernel, (M * C,), meta)],
                 (N, INNER, *(g for geo in geos for g in geo[:2]), C), (rows, parts, part, (2, 0, 1)), record)


def _backward_plan(cfg, device, geo_y, geo_dy, geo_dx, M, N, INNER, log, dtypes, words=False,
                   aligned=False) -> _Plan:
    sms = sm_count(device)
    interpret = device.type != "cuda" and interpret_mode()
    precise = not interpret and dtypes[2] in (torch.float32, torch.float64)       # see _grad
    types = dict(LOG=log, LIBDEVICE=precise, ACC=_acc(*dtypes), SUM=_bwd_sum(*dtypes))
    path = cfg.pop("path", None) or choose_path(M, N, sms, interpret, backward=True)
    geos = (geo_y, geo_dy, geo_dx)
    whole = _smem_bwd_rows(N, dtypes[0].itemsize, log)
    if path == "rows" and cfg.pop("smem", whole is not None) and _smem_bwd_ok(geos, N, dtypes, aligned, interpret):
        plan = _smem_bwd_plan(cfg, M, N, INNER, geos, dtypes[0], types, None,
                              *(whole or SMEM_BWD_ROWS[-1][2][dtypes[0].itemsize, log]), path="rows")
        if plan is not None:
            return plan
    if path == "rows":
        block_n = _pow2(N)
        tile, warps = BWD_ROWS_MEASURED.get((dtypes[0].itemsize, block_n), (ROW_TILE_ELEMS // BWD_CHUNK_SCALE, None))
        block_m = min(_pow2(M), max(1, cfg.pop("tile", tile) // block_n))
        warps = warps or min(16, _warps(block_m * block_n, ROW_ELEMS_PER_THREAD // BWD_CHUNK_SCALE))
        warps = cfg.pop("num_warps", warps)
        grid = min(triton.cdiv(M, block_m), cfg.pop("waves", BWD_WAVES) * sms)
        meta = dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, **types)
        record = dict(path=path, block_m=block_m, block_n=block_n, num_warps=warps, grid=grid)
        return _Plan(path, [BoundKernel(softmax_bwd_rows_kernel, (grid,), meta)],
                     (M, N, INNER, *geo_y, *geo_dy, *geo_dx, grid), None, record)
    smem = _smem_bwd_config(M, N, dtypes[0].itemsize, log, sms)
    if path == "coop" and cfg.pop("smem", smem is not None) and _smem_bwd_ok(geos, N, dtypes, aligned, interpret):
        plan = _smem_bwd_plan(cfg, M, N, INNER, geos, dtypes[0], types,
                              *(smem or SMEM_BWD_FALLBACK[dtypes[0].itemsize]))
        if plan is not None:
            return plan
    eligible = path == "coop" and _bf16x2_bwd_ok(geos, N, words)
    bf16x2 = eligible and cfg.pop("bf16x2", not _few_rows(M, sms))      # many rows, as the forward
    chunk = cfg.pop("chunk", None) or (BWD_BF16X2_CHUNK if bf16x2 else _chunking(M, N, sms, backward=True)[0])
    C = triton.cdiv(N, chunk)
    warps = cfg.pop("num_warps", BWD_BF16X2_WARPS if bf16x2 else _warps(chunk, BWD_ELEMS_PER_THREAD))
    record = dict(path=path, kernel="bf16x2" if bf16x2 else "chunks", chunk=chunk, chunks=C, num_warps=warps,
                  grid=M * C)
    if bf16x2:
        meta = dict(CHUNK=chunk, C_POW2=_pow2(C), LOG=log, num_warps=warps)
        return _Plan(path, [BoundKernel(softmax_bwd_coop_bf16x2_kernel, (M * C,), meta)],
                     (N, INNER, *geo_y[:2], *geo_dy[:2], *geo_dx[:2], C), (M, M * C, torch.float32, (2, 0, 1)),
                     record)
    meta = dict(CHUNK=chunk, C_POW2=_pow2(C), num_warps=warps, **types)
    launches = _chunk_launches(softmax_bwd_chunks_kernel, path, (M * C,), meta)
    # workspace order in the kernels: PART, ARRIVE, GEN
    part = torch.float64 if types["SUM"] == tl.float64 else torch.float32
    return _Plan(path, launches, (N, INNER, *geo_y, *geo_dy, *geo_dx, C), (M, M * C, part, (2, 0, 1)), record)
