"""Which kernel runs a softmax-family problem, and how: pure functions of (problem, target).

A tensor is seen as M rows of N elements (``geometry.py``). The paths:

``rows``   N <= ROW_MAX_N: a tile of BLOCK_M rows x BLOCK_N columns in registers, one read of x, one write of y
           (``kernels/rows.py``); from ONE_ROW_MIN_N one row per program, else a persistent grid-stride loop that
           loads the next tile while the current one is reduced (rows of at most 2 KB). On sm_90, 16-bit rows of
           SMEM_ROWS lengths are held whole in shared memory (``kernels/smem.py`` with one chunk per row, no
           barrier), and logsumexp takes the pipelined / streaming kernels of ``kernels/logsumexp.py``.
``coop``   longer rows, or few rows of large N (decode): each row cut into C chunks, one program per chunk; the
           programs of a row exchange their (m_c, d_c) at a per-row barrier in global memory and normalise the chunk
           they still hold (``kernels/chunks.py``; bf16 as int32 words in ``kernels/bf16x2.py``; on sm_90 the chunk in
           shared memory, ``kernels/smem.py``). The row's C programs must be resident at once: C <= max_chunks(target).
``split``  the same cut in two launches with no waiting (the second re-reads its chunk): the CPU interpreter, which
           runs programs one after another, and rows that would need more chunks than can be resident.
``chunks`` logsumexp's long rows: chunks publish their states and the row's last program to arrive merges them.

Plans are frozen dataclasses. :class:`Knobs` overrides a choice (tests and tools/tune_softmax.py); an unknown knob
is an error (``dataclasses.replace``). Tables tuned on the H200 (``tuned.py``) decide among the kernels of sm_90;
any other target gets the portable register kernels.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .._triton.host import pow2
from ..target import Target
from . import tuned as T

SOFTMAX, LOG_SOFTMAX, LOGSUMEXP = 0, 1, 2      # MODE of the forward kernels

__all__ = ["LOGSUMEXP", "LOG_SOFTMAX", "SOFTMAX", "Backward", "Forward", "Knobs", "Plan", "backward_plan",
           "forward_plan", "max_chunks"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Forward:
    """softmax (mode 0), log-softmax (1) or logsumexp (2) of M rows of N; ``geo_*`` = (stride_outer, stride_inner,
    stride_n) of the row view (``geo_y`` unused for logsumexp, whose output is a contiguous [M]); ``align``: the
    largest of 16, 4, 1 bytes dividing both data pointers."""

    M: int
    N: int
    inner: int
    geo_x: tuple
    geo_y: tuple
    mode: int
    dtype: torch.dtype
    out_dtype: torch.dtype
    align: int = 16

    @property
    def elem_bytes(self) -> int:
        return self.dtype.itemsize


@dataclass(frozen=True)
class Backward:
    """dx from y and dy: softmax (``log`` False) or log-softmax; ``dtypes`` = (y, dy, dx), geometries likewise."""

    M: int
    N: int
    inner: int
    geo_y: tuple
    geo_dy: tuple
    geo_dx: tuple
    log: bool
    dtypes: tuple
    align: int = 16

    @property
    def elem_bytes(self) -> int:
        return self.dtypes[0].itemsize


@dataclass(frozen=True)
class Knobs:
    """Overrides of a plan's choices; None leaves a choice to the plan. ``path``: rows / coop / split; ``smem``,
    ``pipe``, ``stream``, ``bf16x2``: take (or refuse) that kernel where it applies; the others set its
    configuration (``chunk``: elements per program, ``reg`` / ``ring``: register and ring sub-tiles of the
    shared-memory kernels, ``ctas``: persistent programs per SM, ``loads``: 16-byte loads per thread per tile of the
    streaming kernel, ``waves``: grid-stride programs per SM of ``rows``)."""

    path: str | None = None
    smem: bool | None = None
    pipe: bool | None = None
    stream: bool | None = None
    bf16x2: bool | None = None
    prefetch: bool | None = None
    tile: int | None = None
    num_warps: int | None = None
    waves: int | None = None
    chunk: int | None = None
    reg: int | None = None
    ring: int | None = None
    keep_e: bool | None = None
    maxnreg: int | None = None
    loads: int | None = None
    ctas: int | None = None

    @staticmethod
    def of(**overrides) -> Knobs:
        """``Knobs(**overrides)`` through ``dataclasses.replace``: a misspelled knob raises TypeError."""
        return dataclasses.replace(NO_KNOBS, **overrides)


NO_KNOBS = Knobs()


@dataclass(frozen=True)
class Plan:
    """What a problem launches. ``path`` as the module docstring; ``kernel``: rows / chunks / bf16x2 / smem / pipe /
    stream (``torch`` for the portable path); ``grid``: programs; ``chunk`` and ``chunks`` (C) for the chunked
    paths; ``block_m`` x ``block_n`` the tile of ``rows`` (``block_n`` also pipe's row block); ``tile`` the streaming
    kernel's; ``fast_exp``: ex2.approx for the exponentials (see ``_triton.online._exp``); ``reg``, ``ring``,
    ``keep_e``, ``maxnreg``: the shared-memory kernels' register sub-tiles, ring of y, e kept in place of x, and
    register bound (0: the compiler's)."""

    path: str
    kernel: str
    num_warps: int = 0
    grid: int = 0
    chunk: int = 0
    chunks: int = 1
    block_m: int = 0
    block_n: int = 0
    tile: int = 0
    prefetch: bool = False
    fast_exp: bool = False
    reg: int = 0
    ring: int = 0
    keep_e: bool = False
    maxnreg: int = 0


TORCH_PLAN = Plan("torch", "torch")


def _k(knob, default):
    return default if knob is None else knob


# ---- shared rules ------------------------------------------------------------------------------------------------
def max_chunks(target: Target) -> int:
    """Chunks of one row that may wait for each other: COOP_MAX_CHUNKS, and no more than surely fit at once."""
    return min(T.COOP_MAX_CHUNKS, target.programs_resident())


def few_rows(M: int, target: Target) -> bool:
    """At most DECODE_MAX_ROWS_PER_SM rows per SM: decode sizes, where the chunking is sized for latency."""
    return M <= T.DECODE_MAX_ROWS_PER_SM * target.sm_count


def _warps(elems_per_program: int, per_thread: int) -> int:
    return max(4, min(32, elems_per_program // (32 * per_thread)))


def choose_path(M: int, N: int, target: Target, backward: bool = False, words: bool = False) -> str:
    """``rows``, ``coop`` or ``split`` for (M rows, N). ``words``: the forward's bf16x2 kernel applies."""
    decode = few_rows(M, target) and N > T.DECODE_MIN_N
    row_max = T.BF16X2_ROW_MAX_N if words and not target.interpret else T.ROW_MAX_N
    if N <= row_max // (T.BWD_CHUNK_SCALE if backward else 1) and not decode:
        return "rows"
    if target.interpret or chunking(M, N, target, backward)[1] > max_chunks(target):
        return "split"
    return "coop"


def chunking(M: int, N: int, target: Target, backward: bool, words: bool = False) -> tuple[int, int]:
    """(chunk, C) of the register coop kernels. ``words``: many rows in the bf16x2 kernel (half the registers)."""
    decode = few_rows(M, target)
    if backward:
        chunk = T.BWD_DECODE_CHUNK if decode else T.BWD_COOP_CHUNK
    elif decode:
        chunk = T.DECODE_MIN_CHUNK
        while chunk < T.COOP_CHUNK and (M * _cdiv(N, chunk) > T.DECODE_PROGRAMS_PER_SM * target.sm_count
                                        or _cdiv(N, chunk) > max_chunks(target)):
            chunk *= 2
    elif words:
        chunk = T.BF16X2_SHORT_CHUNK if N <= T.BF16X2_SHORT_N else T.COOP_BF16X2_CHUNK
    else:
        chunk = T.COOP_CHUNK
    chunk = min(chunk, pow2(N))
    return chunk, _cdiv(N, chunk)


def smem_rows(geos, N: int, elem_bytes: int) -> bool:
    """Rows the shared-memory kernels copy by 16-byte cp.async per thread: 2- or 4-byte elements, unit-stride rows
    whose starts and N are multiples of 16 elements (pointer alignment is checked apart)."""
    return elem_bytes in (2, 4) and N % 16 == 0 and all(g[2] == 1 and not (g[0] % 16 or g[1] % 16) for g in geos)


def sub_tile_elems(elem_bytes: int, warps: int) -> int:
    """Elements of one sub-tile of the shared-memory kernels: one 16-byte copy per thread of ``warps`` warps (a chunk
    is a whole number of them; REG holds the first ``reg`` in registers)."""
    return 16 // elem_bytes * 32 * warps


def reg_fits(N: int, chunk: int, reg_elems: int) -> bool:
    """Every chunk of a row holds the first ``reg_elems`` elements that REG keeps in registers, unmasked: the chunk
    divides N, or the row's last chunk is at least that long."""
    return N % chunk == 0 or N % chunk >= reg_elems


def _smem_chunk_ok(N: int, chunk: int, C: int, sub: int, reg: int, target: Target) -> bool:
    """A shared-memory plan can run: at most max_chunks per row, and ``reg`` register sub-tiles of ``sub`` elements
    a power of two (or 0), leaving at least one sub-tile in shared memory, and covered by every chunk (reg_fits)."""
    return C <= max_chunks(target) and chunk // sub > reg and not reg & (reg - 1) and reg_fits(N, chunk, reg * sub)


def _smem_chunking(knobs: Knobs, elem_bytes: int, N: int, chunk: int | None, warps: int) -> tuple[int, int, int]:
    """(chunk, C, warps) of a shared-memory plan: the chunk a whole number of sub-tiles, the whole row when
    ``chunk`` is None; the knobs may override chunk and warps."""
    warps = _k(knobs.num_warps, warps)
    sub = sub_tile_elems(elem_bytes, warps)
    chunk = _k(knobs.chunk, chunk)
    chunk = _cdiv(N, sub) * sub if chunk is None else max(sub, chunk // sub * sub)
    return chunk, _cdiv(N, chunk), warps


def _refused(knobs: Knobs, *names: str) -> Knobs:
    """A shared-memory plan was refused: the knobs that configured it do not carry over to the register kernel."""
    return dataclasses.replace(knobs, **dict.fromkeys(names))


def _check_chunks(what: str, path: str, chunk: int, C: int, target: Target) -> None:
    """The register chunk kernels hold a power-of-two chunk, and a coop row's C programs must fit at once (they wait
    for each other): a knob that breaks either is an error, never a kernel that fails to compile or deadlocks."""
    if chunk & (chunk - 1):
        raise ValueError(f"softmax {what} plan: chunk={chunk} must be a power of two for the register chunk kernels")
    if path == "coop" and (C > max_chunks(target) or target.interpret):
        most = 0 if target.interpret else max_chunks(target)
        raise ValueError(f"softmax {what} plan: {C} chunks per row cannot wait for each other at once on this "
                         f"target (at most {most}): take path='split' or a larger chunk")


def _required(name: str, table: str, **values):
    """A forced kernel at a size its table does not list: every value must come from the knobs."""
    missing = [k for k, v in values.items() if v is None]
    if missing:
        raise ValueError(f"{name}: {table} has no entry for this problem; give {', '.join(missing)} in the knobs")
    return tuple(values.values())


# ---- forward ------------------------------------------------------------------------------------------------------
def bf16x2_ok(p: Forward, target: Target) -> bool:
    """softmax_coop_bf16x2_kernel applies: sm_80+, bf16 in and out, unit-stride rows starting on a 4-byte boundary
    (pointers and even row strides), even N, and an output per element."""
    return (target.bf16_pack and p.dtype == p.out_dtype == torch.bfloat16 and p.align >= 4 and p.mode != LOGSUMEXP
            and p.N % 2 == 0 and p.geo_x[2] == p.geo_y[2] == 1 and not any(s % 2 for s in p.geo_x[:2] + p.geo_y[:2]))


def smem_ok(p: Forward, target: Target) -> bool:
    """softmax_coop_smem_kernel applies: sm_90, softmax or log-softmax, smem_rows, x and y 16-byte aligned."""
    return (target.sm90 and p.mode != LOGSUMEXP and smem_rows((p.geo_x, p.geo_y), p.N, p.elem_bytes)
            and p.align >= 16)


def smem_config(p: Forward, target: Target, bf16x2: bool) -> tuple[int, int, int] | None:
    """(chunk, warps, reg) of softmax_coop_smem_kernel for a coop problem of many rows, or None where the register
    kernels stay: decode sizes (measured no better with it) and bf16 rows under SMEM_BF16_MIN_N (bf16x2)."""
    if few_rows(p.M, target) or (bf16x2 and p.N < T.SMEM_BF16_MIN_N) or p.elem_bytes not in T.SMEM_CONFIG:
        return None
    chunk, warps, reg = T.SMEM_CONFIG[p.elem_bytes]
    return ((chunk, warps, reg) if reg_fits(p.N, chunk, reg * sub_tile_elems(p.elem_bytes, warps))
            else T.SMEM_CONFIG_MASKED[p.elem_bytes])


def smem_rows_warps(p: Forward, target: Target) -> int | None:
    """Warps of the shared-memory kernel holding a whole 16-bit row (SMEM_ROWS), or None: other dtypes and lengths,
    logsumexp, and decode sizes (the coop path's)."""
    if p.elem_bytes != 2 or p.mode == LOGSUMEXP or (few_rows(p.M, target) and p.N > T.DECODE_MIN_N):
        return None
    return next((warps for lo, hi, warps in T.SMEM_ROWS if lo <= p.N <= hi), None)


def stream_ok(p: Forward, target: Target) -> bool:
    """logsumexp_stream_kernel applies: sm_90, logsumexp, x smem_rows (16-byte loads) and 16-byte aligned."""
    return target.sm90 and p.mode == LOGSUMEXP and smem_rows((p.geo_x,), p.N, p.elem_bytes) and p.align >= 16


def pipe_ok(p: Forward, target: Target) -> bool:
    """logsumexp_rows_pipe_kernel applies: as stream_ok, and the whole row in at most PIPE_MAX_ROW_BYTES."""
    return stream_ok(p, target) and pow2(p.N) * p.elem_bytes <= T.PIPE_MAX_ROW_BYTES


def stream_config(p: Forward, target: Target) -> tuple[int, int, int] | None:
    """(warps, loads, programs per SM) of logsumexp_stream_kernel for many rows of this length (LSE_STREAM), or
    None: other dtypes, shorter rows, other modes, and decode sizes."""
    if p.mode != LOGSUMEXP or few_rows(p.M, target):
        return None
    return next((c for lo, c in reversed(T.LSE_STREAM.get(p.elem_bytes, ())) if p.N >= lo), None)


def forward_plan(p: Forward, target: Target, knobs: Knobs = NO_KNOBS) -> Plan:
    """The plan of a forward problem on ``target``."""
    words = bf16x2_ok(p, target)
    # bf16x2 for many rows only: at decode sizes the generic kernel was 0.1-1.1 µs faster on 5 of 6 shapes
    many_words = words and not few_rows(p.M, target)
    whole = smem_rows_warps(p, target) if smem_ok(p, target) else None
    path = knobs.path or ("rows" if whole else choose_path(p.M, p.N, target, words=many_words))
    stream = stream_config(p, target)
    if _k(knobs.stream, stream is not None) and stream_ok(p, target):
        return _stream_plan(p, target, knobs, stream)
    pipe = T.LSE_PIPE.get((p.elem_bytes, pow2(p.N))) if p.mode == LOGSUMEXP else None
    if path == "rows" and _k(knobs.pipe, pipe is not None) and pipe_ok(p, target):
        return _pipe_plan(p, target, knobs, pipe)
    if path == "rows" and _k(knobs.smem, whole is not None) and smem_ok(p, target):
        plan = _smem_plan(p, target, knobs, None, whole or T.SMEM_ROWS[-1][2], 0, "rows")
        if plan is not None:
            return plan
        knobs = _refused(knobs, "reg", "num_warps", "chunk")
    if path == "rows":
        return _rows_plan(p, target, knobs)
    smem = smem_config(p, target, words)
    if path == "coop" and _k(knobs.smem, smem is not None) and smem_ok(p, target):
        plan = _smem_plan(p, target, knobs, *(smem or T.SMEM_CONFIG_MASKED[p.elem_bytes]))
        if plan is not None:
            return plan
        knobs = _refused(knobs, "reg", "num_warps", "chunk")
    bf16x2 = path == "coop" and words and _k(knobs.bf16x2, many_words)
    lse_many = p.mode == LOGSUMEXP and not few_rows(p.M, target)
    chunk = knobs.chunk or (min(T.LSE_CHUNK, pow2(p.N)) if lse_many else
                            chunking(p.M, p.N, target, backward=False, words=bf16x2)[0])
    C = _cdiv(p.N, chunk)
    warps = _k(knobs.num_warps, T.LSE_CHUNK_WARPS if lse_many else _warps(chunk, 64 if bf16x2 else 32))
    if p.mode == LOGSUMEXP and not bf16x2:
        path = "chunks"
    _check_chunks("forward", path, chunk, C, target)
    return Plan(path, "bf16x2" if bf16x2 else "chunks", num_warps=warps, grid=p.M * C, chunk=chunk, chunks=C,
                fast_exp=not target.interpret, maxnreg=knobs.maxnreg or 0)


def _rows_plan(p: Forward, target: Target, knobs: Knobs) -> Plan:
    block_n = pow2(p.N)
    row_bytes = block_n * p.elem_bytes
    lse_loop = p.mode == LOGSUMEXP and T.LSE_PREFETCH_MIN_ROW_BYTES <= row_bytes <= T.LSE_PREFETCH_MAX_ROW_BYTES
    one_row = p.N >= T.ONE_ROW_MIN_N and not lse_loop
    prefetch = _k(knobs.prefetch, (row_bytes <= T.PREFETCH_MAX_ROW_BYTES and not one_row) or lse_loop)
    tile = _k(knobs.tile, T.PREFETCH_TILE_ELEMS if prefetch else block_n if one_row else T.ROW_TILE_ELEMS)
    block_m = min(pow2(p.M), max(1, tile // block_n))
    measured = T.ROW_WARPS_MEASURED.get((p.elem_bytes, block_n))
    warps = _k(knobs.num_warps, (measured or max(1, min(32, row_bytes // T.ROW_BYTES_PER_WARP))) if block_m == 1
               else _warps(block_m * block_n, T.ROW_ELEMS_PER_THREAD))
    tiles = _cdiv(p.M, block_m)
    waves = _k(knobs.waves, T.LSE_WAVES if p.mode == LOGSUMEXP else T.PERSISTENT_WAVES)
    grid = min(tiles, waves * target.sm_count) if prefetch else tiles
    # the fast exp everywhere but softmax in the prefetching loop (bf16 N = 1K: 84.7 against 90.0 % with tl.exp,
    # though 48 fewer instructions per tile; logsumexp in the same loop gained 5 points)
    fast = not target.interpret and not (p.mode == SOFTMAX and prefetch)
    return Plan("rows", "rows", num_warps=warps, grid=grid, block_m=block_m, block_n=block_n, prefetch=prefetch,
                fast_exp=fast)


def _smem_plan(p: Forward, target: Target, knobs: Knobs, chunk, warps, reg, path="coop") -> Plan | None:
    """The forward's shared-memory plan (``rows``: one chunk per row, no barrier), or None where a row would need
    too many chunks or ``reg`` leaves no sub-tile in shared memory."""
    reg = _k(knobs.reg, reg)
    chunk, C, warps = _smem_chunking(knobs, p.elem_bytes, p.N, chunk, warps)
    if not _smem_chunk_ok(p.N, chunk, C, sub_tile_elems(p.elem_bytes, warps), reg, target):
        return None
    words = bool(reg) and p.dtype == p.out_dtype == torch.bfloat16       # registers hold two bf16 per word
    # KEEP_E: 16-bit softmax (x, y of one dtype) in coop chunks keeps e_j in x's place (rounded to the dtype: y within
    # 1 ulp, not 0.5) and scales it in step 3 instead of a second exponential: bf16 N = 128K / 256K / 128256 93.4 /
    # 91.7 / 93.9 % against 87.9 / 88.4 / 82.5. Whole rows (`rows`, SMEM_ROWS) lost 0.4-1.2 points with it: not there
    keep_e = (_k(knobs.keep_e, path == "coop") and p.mode == SOFTMAX and p.dtype == p.out_dtype
              and p.elem_bytes == 2)
    maxnreg = _k(knobs.maxnreg, T.SMEM_BF16_MAXNREG if words else 0)
    return Plan(path, "smem", num_warps=warps, grid=p.M * C, chunk=chunk, chunks=C, fast_exp=True, reg=reg,
                keep_e=keep_e, maxnreg=maxnreg)


def _pipe_plan(p: Forward, target: Target, knobs: Knobs, pipe) -> Plan:
    """logsumexp's pipelined ``rows`` plan: a persistent grid of ``ctas`` programs per SM, ``warps`` each (capped so
    that each thread holds at least one 16-byte piece of the row)."""
    warps, ctas = pipe or _required("pipe", "LSE_PIPE", num_warps=knobs.num_warps, ctas=knobs.ctas)
    vec = 16 // p.elem_bytes
    block = max(pow2(p.N), vec * 32)
    warps = min(_k(knobs.num_warps, warps), block // (vec * 32))
    grid = min(p.M, _k(knobs.ctas, ctas) * target.sm_count)
    return Plan("rows", "pipe", num_warps=warps, grid=grid, block_n=block, fast_exp=True)


def _stream_plan(p: Forward, target: Target, knobs: Knobs, stream) -> Plan:
    """logsumexp's streaming plan: a persistent grid of ``ctas`` programs per SM of ``warps`` warps, each thread
    taking ``loads`` 16-byte pieces per tile."""
    warps, loads, ctas = stream or _required("stream", "LSE_STREAM", num_warps=knobs.num_warps, loads=knobs.loads,
                                             ctas=knobs.ctas)
    warps = _k(knobs.num_warps, warps)
    tile = 16 // p.elem_bytes * _k(knobs.loads, loads) * 32 * warps
    grid = min(p.M, _k(knobs.ctas, ctas) * target.sm_count)
    return Plan("rows", "stream", num_warps=warps, grid=grid, tile=tile, fast_exp=True)


# ---- backward -----------------------------------------------------------------------------------------------------
def bf16x2_bwd_ok(p: Backward, target: Target) -> bool:
    """softmax_bwd_coop_bf16x2_kernel applies: sm_80+, y, dy, dx bf16 on 4-byte boundaries, unit-stride rows with
    even strides, even N."""
    return (target.bf16_pack and p.dtypes == (torch.bfloat16,) * 3 and p.align >= 4 and p.N % 2 == 0
            and all(g[2] == 1 and not (g[0] % 2 or g[1] % 2) for g in (p.geo_y, p.geo_dy, p.geo_dx)))


def smem_bwd_ok(p: Backward, target: Target) -> bool:
    """softmax_bwd_coop_smem_kernel applies: sm_90, y, dy, dx of one dtype, smem_rows, 16-byte aligned."""
    return (target.sm90 and p.align >= 16 and len(set(p.dtypes)) == 1
            and smem_rows((p.geo_y, p.geo_dy, p.geo_dx), p.N, p.elem_bytes))


def smem_bwd_config(p: Backward, target: Target) -> tuple[int, int, int, int] | None:
    """(chunk, warps, reg, ring) of softmax_bwd_coop_smem_kernel for many coop rows (SMEM_BWD_CONFIG), or None
    (decode sizes)."""
    if few_rows(p.M, target) or (p.elem_bytes, p.log) not in T.SMEM_BWD_CONFIG:
        return None
    configs = T.SMEM_BWD_CONFIG[p.elem_bytes, p.log]
    return next((c for c in configs if reg_fits(p.N, c[0], c[2] * sub_tile_elems(p.elem_bytes, c[1]))),
                (*configs[-1][:2], 0, configs[-1][3]))


def smem_bwd_rows(p: Backward) -> tuple[int, int, int] | None:
    """(warps, reg, ring) of the smem backward kernel holding a whole row (SMEM_BWD_ROWS), or None."""
    key = (p.elem_bytes, p.log)
    return next((t[key] for lo, hi, t in T.SMEM_BWD_ROWS if lo <= p.N <= hi and key in t), None)


def backward_plan(p: Backward, target: Target, knobs: Knobs = NO_KNOBS) -> Plan:
    """The plan of a backward problem on ``target``."""
    path = knobs.path or choose_path(p.M, p.N, target, backward=True)
    whole = smem_bwd_rows(p)
    if path == "rows" and _k(knobs.smem, whole is not None) and smem_bwd_ok(p, target):
        plan = _smem_bwd_plan(p, target, knobs, None, *(whole or T.SMEM_BWD_ROWS[-1][2][p.elem_bytes, p.log]),
                              path="rows")
        if plan is not None:
            return plan
        knobs = _refused(knobs, "reg", "ring", "maxnreg", "num_warps", "chunk")
    if path == "rows":
        block_n = pow2(p.N)
        tile, warps = T.BWD_ROWS_MEASURED.get((p.elem_bytes, block_n), (T.ROW_TILE_ELEMS // T.BWD_CHUNK_SCALE, None))
        block_m = min(pow2(p.M), max(1, _k(knobs.tile, tile) // block_n))
        warps = warps or min(16, _warps(block_m * block_n, T.ROW_ELEMS_PER_THREAD // T.BWD_CHUNK_SCALE))
        warps = _k(knobs.num_warps, warps)
        grid = min(_cdiv(p.M, block_m), _k(knobs.waves, T.BWD_WAVES) * target.sm_count)
        return Plan(path, "rows", num_warps=warps, grid=grid, block_m=block_m, block_n=block_n)
    smem = smem_bwd_config(p, target)
    if path == "coop" and _k(knobs.smem, smem is not None) and smem_bwd_ok(p, target):
        plan = _smem_bwd_plan(p, target, knobs, *(smem or _required(
            "smem coop backward", "SMEM_BWD_CONFIG", chunk=knobs.chunk, num_warps=knobs.num_warps, reg=knobs.reg,
            ring=knobs.ring)))
        if plan is not None:
            return plan
        knobs = _refused(knobs, "reg", "ring", "maxnreg", "num_warps", "chunk")
    bf16x2 = path == "coop" and bf16x2_bwd_ok(p, target) and _k(knobs.bf16x2, not few_rows(p.M, target))
    chunk = knobs.chunk or (T.BWD_BF16X2_CHUNK if bf16x2 else chunking(p.M, p.N, target, backward=True)[0])
    C = _cdiv(p.N, chunk)
    warps = _k(knobs.num_warps, T.BWD_BF16X2_WARPS if bf16x2 else _warps(chunk, T.BWD_ELEMS_PER_THREAD))
    _check_chunks("backward", path, chunk, C, target)
    return Plan(path, "bf16x2" if bf16x2 else "chunks", num_warps=warps, grid=p.M * C, chunk=chunk, chunks=C)


def _smem_bwd_plan(p: Backward, target: Target, knobs: Knobs, chunk, warps, reg, ring, path="coop") -> Plan | None:
    """The backward's shared-memory plan (``rows``: one chunk per row, no barrier), or None where a row would need
    too many chunks, ``reg`` (sub-tiles of y and dy held in registers) leaves no sub-tile in shared memory or is not
    covered by the row's last chunk, or a ``ring`` of y is asked of softmax's backward (its sum needs y)."""
    reg = _k(knobs.reg, reg)
    ring = _k(knobs.ring, ring)
    maxnreg = _k(knobs.maxnreg, T.SMEM_BWD_F16_MAXNREG if reg and p.dtypes[0] == torch.float16 else 0)
    chunk, C, warps = _smem_chunking(knobs, p.elem_bytes, p.N, chunk, warps)
    if not _smem_chunk_ok(p.N, chunk, C, sub_tile_elems(p.elem_bytes, warps), reg, target) or (ring and not p.log):
        return None
    return Plan(path, "smem", num_warps=warps, grid=p.M * C, chunk=chunk, chunks=C, reg=reg, ring=ring,
                maxnreg=maxnreg)
