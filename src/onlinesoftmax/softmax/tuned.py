"""Named thresholds and tables of the softmax family's plans, every figure measured on the H200 (sm_90, 132 SMs,
1 GiB per tensor unless a shape is named; % of the device-to-device copy ceiling measured in the same run).

The generic ones (rows / coop / split sizing, decode chunking) apply on every target; the shared-memory and Gluon
tables (SMEM_*, LSE_PIPE, LSE_STREAM) only where ``target.sm90`` (see plan.py). What was tried and not kept is in
docs/tuning.md.
"""

ROW_MAX_N = 32768            # longest row one program holds in registers (fp32: 32-64 values per thread)
ROW_TILE_ELEMS = 4096        # a `rows` tile holds about this many elements (BLOCK_M x BLOCK_N): fp32 N = 1K
                             # 94.1 % vs 86.8 % with 8192, bf16 N = 4K 93.7 % vs 79.8 %, fp32 N = 4K 93.3 % vs 94.0 %
ROW_ELEMS_PER_THREAD = 16    # num_warps = tile elements / (32 * this), clamped to [4, 32]; 32 warps at
                             # N = 16K fp32 gave 94.6 % against 80 % with 16
ONE_ROW_MIN_N = 1024         # rows this long: one row per program, ROW_BYTES_PER_WARP bytes of it per warp (32 B per
ROW_BYTES_PER_WARP = 1024    # thread). 1 GiB, N = 1K: fp32 99.2 % (4 warps) against 96.8 % for 4 rows x 1K with 8
                             # warps; bf16 99.3 % (2 warps) against 90.9 % for the prefetching loop; 16 B per thread
                             # lost (fp32 8 warps 89.9 %, bf16 4 warps 91.1 %); 16 warps at fp32 N = 4K was measured
                             # before (97.6 / 97.4 % against 96.3 / 96.2 % with 8)
ROW_WARPS_MEASURED = {       # (element bytes, N) -> num_warps where one row per program measured better otherwise:
    (2, 16384): 16,          # bf16 91.8 / 91.6 % against 90.7 / 90.7 % with 32 (rows that SMEM_ROWS cannot take)
}
SMEM_ROWS = ((4096, 16384, 4), (16385, 32768, 16))   # 16-bit rows of N in [lo, hi]: one program per row holding it in
                             # shared memory (softmax_coop_smem_kernel with C = 1, no barrier), this many warps.
                             # 1 GiB, bf16: N = 4K 97.7 % against 96.7 (rows), 16K 96.6 against 94.1, 32K 97.3 (16
                             # warps; 8: 96.4, 4: 95.5) against 83.6 (bf16x2)
PREFETCH_MAX_ROW_BYTES = 2048    # shorter rows (bf16 N < 1K, fp32 N <= 512) run the persistent, prefetching loop;
PREFETCH_TILE_ELEMS = 8192       # at bf16 N = 1K it gave 87.9 % against 82.3 % for 4 rows per program
PERSISTENT_WAVES = 2             # ... on a grid of this many programs per SM
COOP_CHUNK = 8192            # long rows: elements per program in the coop path (large batch), 8 warps
BF16X2_ROW_MAX_N = 16384     # rows the bf16x2 kernel can take (see _bf16x2_ok) longer than this, for many rows,
                             # run it rather than `rows`: 4096 x 32768 bf16 77.5 % vs 68.7 %
BF16X2_SHORT_N = 65536       # bf16x2 chunk: BF16X2_SHORT_CHUNK elements (4 warps) up to this N, 77.5 / 75.1 %
BF16X2_SHORT_CHUNK = 4096    # at N = 32K / 64K against 72.4 / 71.5 % with 16384; COOP_BF16X2_CHUNK (8 warps)
COOP_BF16X2_CHUNK = 16384    # beyond: 69.9 / 66.0 % at N = 128K / 256K against 69.4 / 63.2 % with 4096
SMEM_CONFIG = {               # many long rows: element bytes -> (chunk, warps, reg) of the coop kernel that holds its
    4: (16384, 8, 4),        # chunk in shared memory (kernels/smem.py), its first `reg` sub-tiles in registers
    2: (16384, 4, 4),        # (REG): 1 GiB, N = 128K / 256K, fp32 94.6 / 92.6 % against 92.0 / 90.3 for the chunk in
}                            # shared memory alone, bf16 86.0 / 85.8 against 84.5 / 83.7
SMEM_BF16_MAXNREG = 56       # bf16 register sub-tiles (words) get this register bound: ptxas's own 64 registers
                             # allow 8 programs of (16384, 4, 4) per SM, 56 allow 9 (shared memory's limit): 1 GiB,
                             # N = 128K / 256K 94.4 / 93.0 % against 93.1 / 91.1.
                             # fp16 (elements, 72 registers) spills under 64 / 56: +0.9 / -1.1 and -3.5 / -1.2 points
SMEM_CONFIG_MASKED = {       # ... where a row's last chunk is shorter than its register sub-tiles (_reg_fits): the
    4: (11264, 4, 0),        # shared-memory-only chunks. Before REG: fp32 92.5 / 89.9 % against 86.8 / 82.0
    2: (8192, 2, 0),         # (registers), bf16 85.0 / 84.0 against 78.4 / 75.3 (bf16x2)
}
SMEM_BWD_CONFIG = {          # backward, many long rows: (element bytes, log-softmax) -> (chunk, warps, reg, ring) of
    (4, False): ((10240, 4, 8, 0), (8192, 4, 4, 0)),  # the coop kernel with y and dy in shared memory, their first
    (4, True): ((16384, 8, 2, 4),),                   # `reg` sub-tiles in registers (REG, bf16 as words), and for
    (2, False): ((32768, 8, 2, 0),),                  # log-softmax y streamed after step 1 through a ring of `ring`
    (2, True): ((16384, 4, 2, 4),),                   # sub-tiles (RING): the first entry whose REG the row's last
}   # chunk covers (_reg_fits), else the last with reg = 0. 1 GiB, N = 128K / 256K, against the previous default in
    # the same runs: fp32 softmax 98.7 / 95.6 % (10240, reg 8: 4 programs and 320 KB per SM) and 96.8-97.5 /
    # 94.0-94.6 (8192, reg 4: 256 KB) against 95.0-95.3 / 91.2-91.5 (registers); bf16 softmax 98.4 / 96.0
    # against 92.9 / 90.9 (8192, no REG). Log-softmax with RING: fp32 100.0 / 99.4 / 100.5 % against
    # 95.4 / 91.8 / 99.9 with y held (16384, 8, 2: 2 programs per SM, 3 with the ring), ring 2 94.4 / 92.7 / 95.9;
    # bf16 (16384, 4, 2, 4: 6 programs per SM) 99.8 / 99.5 / 100.7 against 93.0 / 86.4 / 94.8 with y held (32768,
    # 8, 2), (32768, 8, 2, 4) 99.7 / 98.9 / 99.7
SMEM_BWD_ROWS = (            # backward, rows of N in [lo, hi] (unit stride, N a multiple of 16, as _smem_bwd_ok):
    (1024, 2048, {(4, False): (4, 0, 0), (2, False): (2, 0, 0), (4, True): (4, 0, 1), (2, True): (1, 0, 2)}),
    (2049, 8192, {(4, False): (4, 0, 0), (2, False): (2, 0, 0), (4, True): (4, 0, 2), (2, True): (2, 0, 2)}),
    (8193, 16384, {(4, False): (16, 0, 0), (2, False): (4, 2, 0), (4, True): (4, 2, 4), (2, True): (2, 2, 4)}),
)   # one program per row (C = 1: no barrier) of the smem kernel, (element bytes, log-softmax) -> (warps, reg, ring);
    # log-softmax holds dy, y through its ring. 1 GiB, N = 1K / 4K / 16K, against the register rows kernel in the
    # same runs: softmax fp32 101.9 / 101.3 / 101.8 % against 96.1 / 96.5 / 98.2, bf16
    # 101.8 / 101.6 / 101.5 against 97.1 / 95.7 / 96.8; log-softmax fp32 102.2 / 101.0
    # / 100.4 against 94.0 / 96.6 / 88.0, bf16 101.8 / 100.9 / 100.9 against 97.0 / 95.4 / 82.1 (torch's own: fp32
    # 101.1 / 99.6 / 80.3, bf16 60.8 / 99.7 / 100.7). (A 2 : 1 read/write mix runs 2-3 % over the 1 : 1 copy.)
SMEM_BWD_F16_MAXNREG = 128   # fp16 register sub-tiles (held as elements: WORDS is bf16's) get this register bound:
                             # at (32768, 8, 2) ptxas's own choice is 64 registers and an 8-byte stack (spills,
                             # sm_90a), and fp16 N = 128K / 256K measured 94.1 / 91.5 % against bf16's 98.3 / 96.1
                             # ; bounded at 128 it takes 102 and spills nothing
SMEM_BF16_MIN_N = 65536      # bf16 rows shorter than this stay in the bf16x2 kernel: N = 32K 83.4 against 83.6 %
LSE_PIPE = {                  # logsumexp, rows of (element bytes, N rounded up to a power of two) -> (warps, programs
    (2, 1024): (1, 32),      # per SM) of logsumexp_rows_pipe_kernel (kernels/logsumexp.py: the next row in flight
    (2, 2048): (2, 16),      # while this one is reduced). 1 GiB, % of the copy ceiling against the register kernels
    (2, 4096): (4, 8),       # in the same run: bf16 N = 1K
    (2, 8192): (4, 4),       # 96.5 / 78.4, 2K 94.6 / 86.8, 4K 100.5 / 83.0, 8K 97.3 / 76.0, 16K 99.6 / 94.5, 32K
    (2, 16384): (8, 3),      # 79.0 / 74.9; fp32 N = 4K 102.7 / 101.1, 8K 98.9 / 97.7, 16K 102.6 / 101.2, 32K 101.0 /
    (4, 4096): (4, 8),       # 95.0 (a read alone runs faster than a copy's read + write). fp32 N = 1K / 2K stay in
                             # registers: 102.0 / 99.7 % against 95.6 / 96.6 at best. 16-bit rows past 16K stream
                             # (LSE_STREAM)
    (4, 8192): (8, 2),
    (4, 16384): (8, 2),
    (4, 32768): (16, 1),
}
PIPE_MAX_ROW_BYTES = 131072  # ... rows of at most this many bytes (in shared memory, one per program)
LSE_STREAM = {                # logsumexp, many 16-bit rows: element bytes -> ((from N, (warps, 16-byte loads per
    2: ((16385, (4, 4, 8)),   # thread per tile, programs per SM)), ...) of logsumexp_stream_kernel (kernels/logsumexp
        (65536, (8, 4, 4))),  # .py: the row streamed, the next tile in flight in registers). 1 GiB, bytes read
}                             # over the copy ceiling, against the kernel these rows took before, same runs
                              # : bf16 N = 20000 97.8 % against 48.3 (pipe), 32K 97.7 / 98.3 against 74.8 / 79.1
                              # (pipe), 128K 98.7 against
                              # 83.0 (chunks), 256K 98.6 / 98.8 against 85.7 / 85.8, fp16 128K 98.5 against 85.1.
                              # (8, 4, 4) at 20000 83.1 % (its 8192-element tiles are 44 % used at the row's end);
                              # (4, 4, 8) at 128K / 256K 97.5 / 96.3. fp32 stays with chunks (256K: 101.4 against
                              # 100.9 at best), 16-bit 16K with pipe (99.7 against 98.8)
DECODE_MIN_CHUNK = 2048      # few rows: the smallest chunk (grown x2 up to COOP_CHUNK while M x C exceeds
DECODE_PROGRAMS_PER_SM = 2   # this many programs per SM). Graph-replayed sweep: 1 x 262144
                             # fp32 10.0 us at 2048 vs 10.5 at 4096; 32 x 128256 bf16 14.1 us at 8192 vs 15.2 at 4096
LSE_PREFETCH_MIN_ROW_BYTES = 16384   # logsumexp (reads x, writes one value per row): rows of 16-64 KB run the
LSE_PREFETCH_MAX_ROW_BYTES = 65536   # prefetching loop too, LSE_WAVES programs per SM. 1 GiB, bytes read over the
LSE_WAVES = 4                        # copy ceiling: fp32 N = 4K 99.6 % vs 90.1 %, bf16 N = 16K 82.9 vs 72.2 %,
                                     # N = 32K 71.4 vs 57.0 %; fp32 N = 16K 100.5 vs 103.7 %
LSE_CHUNK = 16384            # logsumexp long rows, many rows: chunks of this many elements, LSE_CHUNK_WARPS warps:
LSE_CHUNK_WARPS = 8          # fp32 99.7 / 100.1 % vs 96.1 / 95.1 % with COOP_CHUNK, bf16 81.1 / 83.0 vs 75.9 / 75.9
BWD_BF16X2_CHUNK = 16384     # backward, bf16 words (softmax_bwd_coop_bf16x2_kernel), 8 warps. 1 GiB, N = 32K /
BWD_BF16X2_WARPS = 8         # 128K / 256K: softmax 93.4 / 87.3 / 84.2 %, log-softmax 90.6 / 80.5 / 79.8 %, against
                             # 92.2 / 85.8 / 85.6 and 86.4 / 74.7 / 78.0 with 8192 (8 warps), and 82.8 / 80.2 / 76.7
                             # and 90.0 / 79.3 / 79.4 for the generic kernel
BWD_DECODE_CHUNK = 2048      # backward, few rows
DECODE_MAX_ROWS_PER_SM = 2   # "few rows": M <= this x SMs, and N > DECODE_MIN_N
DECODE_MIN_N = 16384
COOP_MAX_CHUNKS = 128        # chunks of one row that must be resident together
BWD_WAVES = 4                # backward `rows`: grid-stride grid of at most this many programs per SM
BWD_CHUNK_SCALE = 2          # backward holds y and dy: `rows` tiles half the forward size, except
BWD_ROWS_MEASURED = {        # (element bytes, BLOCK_N) -> (tile elements, warps) measured better: 1 GiB, bf16 N = 1K
    (2, 1024): (8192, 16),   # 97.0 % against 89.5 % (2048, 8 warps); (4096, 8) 95.9, (4096, 16) 83.4; fp32 N = 1K
}                            # lost with 4096 (89.4 against 97.5 %)
BWD_COOP_CHUNK = 8192        # backward long rows, BWD_ELEMS_PER_THREAD (8 warps): 1 GiB, fp32 99.7 / 95.5 / 91.7 %
BWD_ELEMS_PER_THREAD = 32    # at N = 32K / 128K / 256K against 95.0 / 91.2 / 85.9 % with 4096 (8 warps), bf16
                             # 82.8 / 80.4 / 76.9 against 73.3 / 72.4 / 69.0 %; 8192 with 16 warps lost 4-20 points
