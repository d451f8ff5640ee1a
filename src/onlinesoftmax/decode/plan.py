"""Which launches ``attention_with_kvcache`` and ``merge_attention_states`` run: pure functions of (problem, target).

Decoding attention is one split-KV launch (``kernels/split_kv.py``) and, with more than one split, the ⊕ of the
splits' partial states (``kernels/merge.py``). The split count comes from shapes and ``s_max`` (the bound on a
sequence's length the cache's shape gives), never from ``cache_seqlens``: nothing waits on the host and a CUDA
graph captured once stays right when the lengths change. The tiles for sm_90 (``SM90``) are the H200's; every
other target gets the portable tiles (``PORTABLE``), the interpreter small ones (more tiles and splits per test).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .._triton.host import pow2
from ..target import Target


@dataclass(frozen=True)
class Problem:
    """One decode call's shapes: q ``[B, H, Sq, D]``, a cache of ``Hkv`` heads holding at most ``s_max`` keys per
    sequence, ``page`` keys per page (0: dense), ``esize``-byte elements; ``full``: every sequence holds all s_max
    keys (``oss.attention``'s decode dispatch, no ``cache_seqlens``)."""

    B: int
    H: int
    Hkv: int
    Sq: int
    D: int
    s_max: int
    page: int = 0
    esize: int = 2
    full: bool = False

    @property
    def group(self) -> int:         # G: query heads per kv head
        return self.H // self.Hkv


@dataclass(frozen=True)
class Tiles:
    """Keys per tile, software-pipeline stages, the most query rows a program holds, programs per SM the split
    count aims for, warps; the defaults of the ``ahead`` / ``bound`` / ``programs_per_sm`` knobs (``waves``: the
    programs per SM ``num_splits_waves`` counts with, 0 for ``num_splits_heuristic``; ``balanced``: the
    balanced schedule, with ``balanced_per_sm`` programs per SM, ``cross``: over one line of all kv heads)."""

    block_n: int
    num_stages: int
    max_rows: int
    programs_per_sm: int
    num_warps: int = 4
    ahead: int = 0
    bound: bool = False
    waves: int = 0
    balanced: bool = False
    balanced_per_sm: int = 0     # programs per SM of the balanced schedule (0: programs_per_sm)
    wide_per_sm: int = 0         # the same for row blocks past 16 rows (G·Sq > 16; 0: balanced_per_sm)
    cross: bool = False          # the balanced line over all kv heads (Plan.cross)
    balanced_below: int = 0      # balanced for fewer than this many units per SM only (0: any)


# sm_90, H200 (tools/probe_decode.py, bf16, Sq = 1, GB/s of K and V): dense caches take 128-key tiles over 8 warps,
# 3 stages (4443 / 4278 / 4090 / 4199 GB/s at the four shapes against 4449 / 4305 / 4113 / 3461 for 64-key
# tiles; cuDNN 4493 / 4388 / 4171 / 4206); paged caches keep 64-key tiles (128-key paged tiles spill) with the page
# numbers read two tiles ahead over 4 stages (page 16: 4314 / 4212 / 4004 / 3986, page 256: 4375 / 4171 / 3971 /
# 4067, 0.95-0.98x the dense figures; 3 stages ran 0.5-3 % faster on the first three shapes, 23 % slower on the
# fourth; before: 3156-3798)
# Dense caches run the balanced schedule (a fixed grid cutting the line of all sequences' key tiles, cut on the
# device: tools/probe_decode_varlen.py at dbcd81a + decode-varlen, one program per SM): lengths drawn from 1 to 32K
# at 0.94-0.99x the GB/s of a uniform batch of the same keys (B 8 / 32 / 64, H 32/32 and 32/8) against 0.77-0.84x
# for the per-sequence splits, and within 1.4 % of them at full lengths.
# Paged caches of 8 or more sequences run the balanced schedule too, with 3 programs of 4 warps per SM over 3 stages
# (tools/probe_decode2.py at b4fb837, page 16): lengths drawn from 1 to S at 1.03-1.73x the per-sequence splits'
# GB/s (B 8 / 32 / 64, H 32/32 and 32/8; 0.95-1.00x a uniform batch of the same keys), 0.96-1.01x them at full
# lengths (page 256: 0.96-0.99x). One sequence keeps the per-sequence splits (nothing to balance: 0.65x at 128K).
SM90 = Tiles(block_n=64, num_stages=4, max_rows=64, programs_per_sm=2, num_warps=8, ahead=2)
# The paged balanced schedule's 3 programs per SM hold when the kernel takes <= 168 registers (3 x 128 threads): at
# Sq = 1 it takes 168, with the causal mask of Sq = 2-16 rows 200-255, and the grid of 3 programs per SM then ran
# in 1.5 waves (Sq = 4: 0.65-0.69x the GB/s of Sq = 1; tools/probe_sq4.py). The plan caps the registers at what
# its programs per SM allow (``Plan.maxnreg``; the spills stay outside the key-tile loop). Row blocks of 32 or 64
# rows take 78-115 KB of shared memory over 3 stages: 2 programs per SM (``wide_per_sm``).
SM90_PAGED_BALANCED = Tiles(block_n=64, num_stages=3, max_rows=64, programs_per_sm=2, num_warps=4, ahead=2,
                            balanced=True, balanced_per_sm=3, wide_per_sm=2)
PAGED_BALANCED_MIN_B = 8    # fewer paged sequences split per sequence (measured at 1 and from 8)
# From 3 (b, kv head, row block) units per SM a dense cache splits per sequence: the units fill the SMs without a
# split, so no merge launch, and the GPU's block scheduler evens out drawn lengths (tools/probe_decode_units.py:
# 4-16 units per SM, full lengths 1.02-1.10x the balanced GB/s, 0.993x cuDNN at (64, 32/8, 4K) against 0.943; lengths
# drawn from 1 to S 0.98x at 4 units per SM, 1.04-1.20x at 8-16; skewed lengths (a few full, the rest short)
# 1.18-1.71x; at 2 units per SM drawn lengths 0.77-0.90x, so the balanced schedule stays below).
SM90_DENSE = Tiles(block_n=128, num_stages=3, max_rows=64, programs_per_sm=2, num_warps=8, balanced=True,
                   balanced_per_sm=1, balanced_below=3)
BALANCED_MAX_B = 256        # the balanced merge sums over all B lengths per row: larger batches split per sequence
PORTABLE = Tiles(block_n=64, num_stages=2, max_rows=64, programs_per_sm=2, num_warps=8)   # 4 warps spill on sm_80
INTERPRETED = Tiles(block_n=16, num_stages=1, max_rows=16, programs_per_sm=2)

REGISTERS_PER_SM = 65536    # 32-bit registers per SM (sm_70 to sm_90)
MAX_SPLITS = 128            # partial states per row, at most (the merge reads them all)
MIN_TILES_PER_SPLIT = 4     # a split streams at least this many key tiles (s_max permitting)
WAVE_EFFICIENCY = 0.85      # the fewest splits whose last wave is at least this full, relative to the best


@dataclass(frozen=True)
class Plan:
    """The launches of one decode problem. ``path``: ``"split_kv"`` (Triton) or ``"torch"``; ``kernel``:
    ``"sm90"`` (the H200's tiles) or ``"portable"``."""

    path: str
    kernel: str = ""
    splits: int = 1             # key ranges per (b, kv head): 1 writes o directly, more add the merge launch
    block_m: int = 16           # query rows per program (G·Sq rounded up to a power of two, >= 16)
    row_blocks: int = 1         # programs along the rows of one (b, kv head)
    block_n: int = 64
    block_d: int = 16
    num_warps: int = 4
    num_stages: int = 2
    merge_rows: int = 16        # rows per merge program
    merge_warps: int = 4
    fast: bool = True           # ex2.approx exponentials (the GPU); tl.exp in the interpreter
    maxnreg: int = 0            # registers per thread the split-KV launch may take (0: the compiler's choice)
    per_sm: int = 0             # balanced: programs per SM its chunks count on being resident at once (else 0)
    ahead: int = 0              # paged: 1 page numbers by ld.global.nc, K as rows; 2 also one tile ahead; 3 as 2,
                                # one number per page (pages of a multiple or a divisor of block_n keys)
    bound: bool = False         # splits cut [0, s_max) into equal chunks; programs past a sequence's end exit
    balanced: bool = False      # splits = chunks of the line of all sequences' tiles per (kv head, row block)
    cross: bool = False         # balanced: one line for all kv heads, splits = chunks of it per row block

    @property
    def programs(self) -> int:
        return self.splits * self.row_blocks


@dataclass(frozen=True)
class Knobs:
    """Overrides of :func:`decode_plan`'s choices (tests, tools); None leaves one to the plan. An unknown knob is a
    TypeError (``Knobs.of`` goes through ``dataclasses.replace``)."""

    splits: int | None = None
    block_n: int | None = None
    block_m: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    merge_rows: int | None = None
    ahead: int | None = None
    bound: bool | None = None
    programs_per_sm: int | None = None      # split count by num_splits_waves (balanced: num_chunks) with this occupancy
    balanced: bool | None = None            # the balanced schedule (kernels/split_kv.py: balanced_kv_kernel)
    cross: bool | None = None               # balanced: chunks of one line over all kv heads (fills every SM)
    dense_tiles: bool | None = None         # paged: the dense cache's tiles, page numbers one per page (ahead 3)
    maxnreg: int | None = None              # register cap of the split-KV launch (0: none)

    @staticmethod
    def of(**overrides) -> Knobs:
        return dataclasses.replace(NO_KNOBS, **overrides)


NO_KNOBS = Knobs()
TORCH_PLAN = Plan("torch")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def tiles_for(target: Target, paged: bool = True, B: int = 1, balanced: bool | None = None,
              dense_tiles: bool = False) -> Tiles:
    """The tiles of ``target`` for a dense or paged cache of B sequences (``balanced``: the knob, None by default;
    paged caches asked for per-sequence splits keep those splits' tiles; ``dense_tiles``: a paged cache takes the
    dense cache's tiles, its page numbers read one per page)."""
    if paged and dense_tiles:
        return dataclasses.replace(tiles_for(target, paged=False), ahead=3)
    if target.interpret:
        return INTERPRETED
    if target.sm90:
        if not paged:
            return SM90_DENSE
        if balanced is not False and PAGED_BALANCED_MIN_B <= B <= BALANCED_MAX_B:
            return SM90_PAGED_BALANCED
        return SM90
    return PORTABLE


def num_splits_heuristic(B: int, Hkv: int, row_blocks: int, s_max: int, sm_count: int, tiles: Tiles) -> int:
    """Key splits per (b, kv head, row block): 1 where those programs already fill the GPU; else the fewest
    splits whose programs fill their last wave nearly as well as the best count does, each split streaming at
    least MIN_TILES_PER_SPLIT tiles of s_max, at most MAX_SPLITS.

    ``slots`` = programs_per_sm · sm_count programs run at once (a 4-warp decode program alone does not saturate
    an SM's memory pipe); efficiency of n programs = (n / slots) / ceil(n / slots), as flash-attention's
    num_splits_heuristic."""
    units = max(B * Hkv * row_blocks, 1)
    slots = max(tiles.programs_per_sm * sm_count, 1)
    if 5 * units >= 4 * slots:          # >= 80 % of a wave without splitting
        return 1
    most = max(1, min(MAX_SPLITS, _cdiv(s_max, tiles.block_n * MIN_TILES_PER_SPLIT)))

    def eff(s):
        waves = units * s / slots
        return waves / _cdiv(units * s, slots)

    best = max(eff(s) for s in range(1, most + 1))
    return next(s for s in range(1, most + 1) if eff(s) >= WAVE_EFFICIENCY * best)


FULL_WAVE = 0.95            # num_splits_waves: the fewest splits within 5 % of the best last-wave fill


def num_splits_waves(B: int, Hkv: int, row_blocks: int, s_max: int, sm_count: int, block_n: int,
                     programs_per_sm: int) -> int:
    """Key splits per (b, kv head, row block) from the occupancy the compiler report gives (sm_90, D = 128, bf16:
    64-key tiles, 8 warps, 3 stages take 78-80 registers and 70 KB of shared memory, so 3 programs per SM): the
    fewest splits whose programs fill their last wave within FULL_WAVE of the best count, 1 included (no early
    exit at 80 % of one wave: 512 programs on 396 slots run 2 waves, the second 29 % full)."""
    units = max(B * Hkv * row_blocks, 1)
    slots = max(programs_per_sm * sm_count, 1)
    most = max(1, min(MAX_SPLITS, _cdiv(s_max, block_n * MIN_TILES_PER_SPLIT)))

    def fill(s):
        return units * s / slots / _cdiv(units * s, slots)

    top = max(fill(s) for s in range(1, most + 1))
    return next(s for s in range(1, most + 1) if fill(s) >= FULL_WAVE * top)


def num_chunks(B: int, Hkv: int, row_blocks: int, s_max: int, sm_count: int, block_n: int,
               programs_per_sm: int, cross: bool = False) -> int:
    """Chunks per (kv head, row block) of the balanced schedule (``cross``: per row block, of the line of all
    kv heads): every chunk streams the same number of tiles whatever the lengths, so the programs fill the
    ``programs_per_sm · sm_count`` slots once, as many as fit (at least one per line, at most one per tile of the
    B·s_max bound). Per kv head, Hkv = 8 at one program per SM makes 16 chunks of 8 heads: 128 programs on 132
    SMs; across heads, 132."""
    lines = max(row_blocks if cross else Hkv * row_blocks, 1)
    tiles = B * _cdiv(s_max, block_n) * (Hkv if cross else 1)
    return max(1, min(programs_per_sm * sm_count // lines, tiles, 4096))


def dense_tiles_fit(p: Problem, target: Target) -> bool:
    """The ``dense_tiles`` default on sm_90: a paged cache whose pages hold whole dense tiles (page a multiple of the
    dense block_n) streams them as the dense cache does, one table entry per tile read one tile ahead; the only
    bytes added are 4 per tile of 64 KB (128 keys x D 128 x K and V in bf16). H200, page 256, shuffled pages:
    0.98-1.00x the dense GB/s against 0.87-0.99x on the paged tiles (tools/probe_pagedtile.py)."""
    return target.sm90 and bool(p.page) and p.page % tiles_for(target, paged=False).block_n == 0


def decode_plan(p: Problem, target: Target, knobs: Knobs = NO_KNOBS) -> Plan:
    """The plan of ``attention_with_kvcache`` for problem ``p`` on ``target``."""
    dense_tiles = dense_tiles_fit(p, target) if knobs.dense_tiles is None else knobs.dense_tiles
    tiles = tiles_for(target, bool(p.page), p.B, knobs.balanced, dense_tiles)
    rows = p.group * p.Sq
    block_m = knobs.block_m or max(16, min(pow2(rows), tiles.max_rows))
    if block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"decode_plan: block_m must be a power of two >= 16, got {block_m}")
    row_blocks = _cdiv(rows, block_m)
    block_d = max(16, pow2(p.D))
    # the tiles are sized for D = 128 at 2 bytes: wider rows (D = 256, fp32) take proportionally fewer keys
    block_n = knobs.block_n or max(16, min(tiles.block_n, tiles.block_n * 256 // (block_d * p.esize)))
    tiles = dataclasses.replace(tiles, block_n=block_n)
    # a full cache has nothing to balance: its sequences split alone (no merge launch where one split fills the GPU)
    units = p.B * p.Hkv * row_blocks
    many = tiles.balanced_below and units >= tiles.balanced_below * target.sm_count
    balanced = (tiles.balanced and p.B <= BALANCED_MAX_B and not p.full and not many) if knobs.balanced is None \
        else knobs.balanced
    cross = balanced and (tiles.cross if knobs.cross is None else knobs.cross)
    per_sm = knobs.programs_per_sm or (block_m > 16 and tiles.wide_per_sm) or tiles.balanced_per_sm \
        or tiles.programs_per_sm
    num_warps = knobs.num_warps or max(tiles.num_warps, 8 if block_m * block_d >= 64 * 256 else 4)
    if knobs.splits:
        splits = knobs.splits
    elif balanced:
        splits = num_chunks(p.B, p.Hkv, row_blocks, p.s_max, target.sm_count, block_n, per_sm, cross)
    elif knobs.programs_per_sm or tiles.waves:
        splits = num_splits_waves(p.B, p.Hkv, row_blocks, p.s_max, target.sm_count, block_n,
                                  knobs.programs_per_sm or tiles.waves)
    else:
        splits = num_splits_heuristic(p.B, p.Hkv, row_blocks, p.s_max, target.sm_count, tiles)
    if not 1 <= splits <= 4096:
        raise ValueError(f"decode_plan: splits must be in [1, 4096], got {splits}")
    # the balanced grid fills per_sm programs on every SM once: their registers must let them fit
    cap = REGISTERS_PER_SM // (per_sm * 32 * num_warps) // 8 * 8
    maxnreg = (cap if balanced and target.sm90 and cap < 255 else 0) if knobs.maxnreg is None else knobs.maxnreg
    stages = knobs.num_stages or tiles.num_stages
    merge_rows = knobs.merge_rows or 16
    ahead = (tiles.ahead if knobs.ahead is None else knobs.ahead) if p.page else 0
    if ahead == 3 and p.page % block_n and block_n % p.page:
        raise ValueError(f"decode_plan: ahead 3 reads one page number per page: the page ({p.page} keys) must be a "
                         f"multiple or a divisor of block_n ({block_n})")
    bound = tiles.bound if knobs.bound is None else knobs.bound
    return Plan("split_kv", "sm90" if target.sm90 else "portable", splits, block_m, row_blocks, block_n, block_d,
                num_warps, stages, merge_rows, 4, not target.interpret, maxnreg, per_sm if balanced else 0, ahead,
                bound, balanced, cross)


@dataclass(frozen=True)
class MergePlan:
    """``merge_attention_states``: rows per program, columns per step, warps."""

    path: str
    block_r: int = 0
    block_d: int = 0
    num_warps: int = 4
    fast: bool = True


MERGE_TILE = 4096           # elements of o per program step (rows × columns): 8 KB of bf16 per input


def merge_plan(N: int, D: int, target: Target) -> MergePlan:
    """The two-state merge for N rows of D on ``target``: the same portable kernel everywhere."""
    block_d = min(max(16, pow2(D)), 256)
    block_r = max(1, min(MERGE_TILE // block_d, pow2(N)))
    return MergePlan("triton", block_r, block_d, 4, not target.interpret)
