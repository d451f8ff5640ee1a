"""Which launches ``softmax_topk`` runs: a pure function of (B, V, k, element size, target).

``filter``: stage 1 over chunks of the row, then the merge (one or two levels; see ``kernels.py``). ``sort``: k too
large for the fused kernels (or their slots): the API runs torch's sort instead. Every table was measured on the
H200; the kernels are portable Triton, so every CUDA target gets the same plan.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .._triton.host import pow2
from ..target import Target

MAX_FUSED_K = 2048                  # k above this (after rounding up to a power of two) takes the sort path
MIN_KP = 16                         # candidate lists are at least this long (tl.sort / tl.arange sizes)
CAP_FACTOR = 2                      # CAP = 2·KP candidate slots per chunk, and survivors in the merge
COLS_PER_KP = 2                     # R = 2·KP column maxima per chunk: ≈ k·(1 + k/2R) <= 1.25·k candidates
MAX_COLS = 2048                     # R = 2·KP up to k = 1024 (with R = KP = 1024, t was the smallest column maximum:
                                    # ≈ 5700 candidates per 16384-element chunk > CAP, every chunk took the exact path)
RADIX_BITS = 3                      # stage 1: bits per bisection step (2^3 − 1 counts packed in one int64 sum;
                                    # 2 bits when R >= 512, as a count then needs more than 9 bits)
ELEMS_PER_THREAD = 64               # elements of x per thread: 64 fit in registers beside the rest (no spills)
MERGE_TILE = 8192                   # candidate keys the merge holds in registers; more are streamed from L2
MERGE_MAX_SLOTS = 32768             # S_pow2 · CAP candidate slots of a row, at most
MERGE_SLOTS_PER_WARP = 2048         # merge warps: min(S_pow2 · CAP, MERGE_TILE) / this, at least 4
MERGE_FEW_ROWS = 128                # B <= this: twice the merge warps (every row's program runs at once)
FIT_TILE_MIN_KP = 256               # from this KP, chunks (and warps, up to FIT_MAX_WARPS) grow until the merge's
FIT_MAX_WARPS = 8                   # slots fit MERGE_TILE (H200: k = 256, 32 x 151936: 54 µs with
                                    # 16384-element chunks and 8 warps, 76 µs with 8192 / 4, 130 µs with 4096 / 2);
                                    # warps of stage 1 for KP >= FIT_TILE_MIN_KP (R = 2048: 255 registers, no spill)
TREE_SLOTS_SMALL_K = 2048           # the merge would stream its slots (S·CAP > MERGE_TILE): a two-level merge, first
TREE_WARPS_SMALL_K = 2              # over groups of this many slots (k <= 64; H200, 256 x 262144, k = 50:
                                    # 163 µs against 235 one-level) or of MERGE_TILE slots (KP >= FIT_TILE_MIN_KP)
BINARY_BISECT_MAX_WARPS = 1         # stage 1 with this many warps or fewer: 1-bit bisection steps (each one int32 warp
                                    # reduction, REDUX: 16 steps ≈ 290 SASS instructions against ≈ 930 for the
                                    # 3-bit radix steps' int64 packed counts; 2136 → 1504 static instructions at
                                    # the goal shape; H200: stage 1 58 → 50 µs there). 1 = every one-warp
                                    # stage 1 (k <= 64)
NARROW_KB = 8                       # k > this: stage 1's bound t_c is the chunk's NARROW_KB-th largest column
NARROW_WIDTH = 32                   # maximum (≈ NARROW_KB candidates, not ≈ k) and the one-level merge loads
NARROW_PEEL_MAX = 16                # one-warp stage 1 with kb <= this finds t_c by kb warp maxima, not bisection
                                    # (H200, goal shape: stage 1 49.0 → 45.0 µs, the call 61.3 → 56.4)
NARROW_SPARSITY = 4                 # NARROW_WIDTH slots per chunk, checked, with an exact fallback; where
                                    # k·BLOCK·NARROW_SPARSITY <= NARROW_KB·V (the row's k-th key is then far above
                                    # the chunks' NARROW_KB-th largest for i.i.d. rows). 0 = off. H200,
                                    # 256 x 128256, k = 50: 62.8 µs against 72.9 (radix 0) and 81.5 (the wide merge)

PATHS = ("filter", "sort")


@dataclass(frozen=True)
class Plan:
    """The launches of one top-k problem (see ``kernels.py`` for the stages these fields configure)."""

    path: str           # "filter" | "sort"
    block: int = 0      # elements per stage-1 program
    cols: int = 0       # R: columns (group maxima) per chunk; G = block // cols elements each
    kp: int = 0         # k rounded up to a power of two (>= MIN_KP)
    cap: int = 0        # candidate slots per chunk and survivor slots of the merge: CAP_FACTOR·KP
    splits: int = 0     # S: programs per row in stage 1
    num_warps: int = 1
    merge_warps: int = 4
    tree: int = 0       # > 0: two-level merge, first over groups of this many chunks (see softmax_topk_2d)
    tree_warps: int = 0     # warps of the first level's programs
    exact_apart: bool = False   # a chunk's exact path (1d) in a launch of its own, not inside the merge
    radix: int = RADIX_BITS     # stage 1: bits per bisection step of t (0: 1-bit steps, one int32 reduction each)
    maxnreg: int = 0            # stage 1: register cap per thread (0: the compiler's choice)
    kb: int = 0                 # stage 1's t_c: the kb-th largest column maximum (0: k; kb < k needs width)
    width: int = 0              # the merge's tile: the first `width` slots of each chunk (0: all CAP)
    peel: int = 0               # stage 1's t_c: the peel-th largest distinct column maximum, by peel warp maxima
    merge_tile: int = MERGE_TILE    # candidate keys a merge program holds in registers at a time
    fast: bool = True           # ex2.approx and FMA forms (the GPU); the interpreter's exact exponentials otherwise
    one: bool = False           # S = 1: stage 1 and the merge in one launch (``kernels._topk_row_kernel``)

    @property
    def group(self) -> int:     # G: elements per column
        return self.block // self.cols if self.cols else 0


@dataclass(frozen=True)
class Knobs:
    """Overrides of :func:`topk_plan`'s choices (tests, tools); None leaves a choice to the plan. An unknown knob
    is an error (``Knobs.of`` goes through ``dataclasses.replace``)."""

    path: str | None = None
    block: int | None = None
    num_warps: int | None = None
    tree: int | None = None
    tree_warps: int | None = None
    merge_warps: int | None = None
    exact_apart: bool | None = None
    radix: int | None = None
    maxnreg: int | None = None
    kb: int | None = None
    width: int | None = None
    peel: int | None = None
    merge_tile: int | None = None
    one: bool | None = None

    @staticmethod
    def of(**overrides) -> Knobs:
        return dataclasses.replace(NO_KNOBS, **overrides)


NO_KNOBS = Knobs()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def topk_plan(B: int, V: int, k: int, esize: int, target: Target, knobs: Knobs = NO_KNOBS) -> Plan:
    """The plan ``softmax_topk`` runs for a ``[B, V]`` input of ``esize``-byte floats and ``k`` on ``target``.

    One warp per 2048-element chunk for k <= 64 (R = 128 columns of 16 elements; 16-byte loads, the bisection
    on R values is warp shuffles only); larger k needs R = 2·KP columns, so more warps and larger chunks. The
    chunk grows only as far as the merge's register tile needs (``MERGE_MAX_SLOTS``). ``knobs`` override the
    choice. The kernels are portable Triton: the same plan on every CUDA target (the tables were measured on the
    H200); the interpreter takes the exact exponentials (``fast`` off).
    """
    path, block, num_warps, tree, tree_warps = knobs.path, knobs.block, knobs.num_warps, knobs.tree, knobs.tree_warps
    merge_warps, exact_apart, radix, kb, width, peel = (knobs.merge_warps, knobs.exact_apart, knobs.radix, knobs.kb,
                                                        knobs.width, knobs.peel)
    maxnreg = knobs.maxnreg or 0
    tile = knobs.merge_tile or MERGE_TILE
    fast = not target.interpret
    if path is not None and path not in PATHS:
        raise ValueError(f"topk_plan: path must be one of {PATHS}, got {path!r}")
    kp = max(MIN_KP, pow2(k))
    if kp > MAX_FUSED_K or path == "sort":
        return Plan("sort", kp=kp)
    cap = CAP_FACTOR * kp
    vec = 16 // esize                                   # elements per 16-byte load
    cols = max(min(COLS_PER_KP * kp, MAX_COLS), 32 * vec)
    max_warps = max(1, cols // (32 * vec))              # every warp along the columns: column maxima in-thread
    if kp >= FIT_TILE_MIN_KP:
        max_warps = FIT_MAX_WARPS
    if block is None:
        block = max(cols, min(32 * ELEMS_PER_THREAD, pow2(V)))
        while pow2(_cdiv(V, block)) * cap > MERGE_MAX_SLOTS:
            block *= 2
        while (kp >= FIT_TILE_MIN_KP and block < 32 * ELEMS_PER_THREAD * max_warps
               and pow2(_cdiv(V, block)) * cap > tile):
            block *= 2
    splits = _cdiv(V, block)
    if pow2(splits) * cap > MERGE_MAX_SLOTS or block > 2 * 32 * ELEMS_PER_THREAD * max_warps:
        return Plan("sort", kp=kp)
    cols = min(cols, block)
    if num_warps is None:
        num_warps = max(1, min(max_warps, block // (32 * ELEMS_PER_THREAD)))
    # the merge also runs a chunk's exact path (1d) at 64 elements per thread; few rows (one wave of
    # programs whatever their size): twice the warps, half the latency
    mw = max(4, min(pow2(splits) * cap, tile) // MERGE_SLOTS_PER_WARP, num_warps)
    if B <= MERGE_FEW_ROWS:
        mw = min(2 * mw, 16)
    tw = 0
    # the narrow merge where x is sparse in the answer (a chunk's kb-th largest is far above the row's k-th) and
    # its tile fits the registers; it needs no tree
    narrow = (kb is None and tree is None and 0 < NARROW_KB < k
              and k * block * NARROW_SPARSITY <= NARROW_KB * V and pow2(splits) * NARROW_WIDTH <= tile)
    if tree is None:        # a two-level merge where one program per row would stream its slots from L2
        tree = 0
        if pow2(splits) * cap > tile and not narrow:
            tree, tw = ((TREE_SLOTS_SMALL_K // cap, TREE_WARPS_SMALL_K) if kp < FIT_TILE_MIN_KP
                        else (tile // cap, max(4, num_warps)))
    tree = min(tree, tile // cap, splits)
    if tree and _cdiv(splits, tree) == 1:
        tree = 0
    if tree:
        ng = _cdiv(splits, tree)
        tw = tree_warps or tw or max(1, min(16, pow2(tree) * cap // MERGE_SLOTS_PER_WARP))
        mw = max(num_warps if kp >= FIT_TILE_MIN_KP else 1,     # (CAP = 2048, SP = 4: 4 warps spill 544 bytes)
                 min(16, pow2(ng) * cap // MERGE_SLOTS_PER_WARP * (2 if B <= MERGE_FEW_ROWS else 1)))
    mw = merge_warps or mw
    if exact_apart is None:     # the first level's tile is full: the exact path's registers would spill it
        exact_apart = bool(tree) and kp >= FIT_TILE_MIN_KP
    if radix is None:
        radix = 0 if num_warps <= BINARY_BISECT_MAX_WARPS else RADIX_BITS
    if kb is None:
        kb = NARROW_KB if narrow else 0
    if width is None:
        width = NARROW_WIDTH if kb else 0
    if bool(kb) != bool(width) or width > cap or (kb and tree):
        raise ValueError(f"topk_plan: kb={kb} needs width (<= CAP = {cap}) and a one-level merge, and the reverse")
    if peel is None:    # the narrow merge's small rank, one warp: peeling instead of bisection
        peel = kb if kb and num_warps == 1 and kb <= NARROW_PEEL_MAX else 0
    one = splits == 1 if knobs.one is None else knobs.one
    if one and (splits > 1 or tree or exact_apart):
        raise ValueError(f"topk_plan: one=True needs the row in one chunk (S = 1, no tree), got S = {splits}")
    return Plan("filter", block, cols, kp, cap, splits, num_warps, mw, tree, tw, exact_apart, radix, maxnreg, kb,
                width, peel, tile, fast, one)


# --- sample (sampling_kernels.py) ----------------------------------------------------------------------------

FREE_K = 64                     # candidates when top_k is not a Python int (the bucket of k = 50: one compile)
ROW_BLOCK = 1024                # elements per step of the row kernel's passes over x
ROW_WARPS = 8                   # (1024 x 4 warps spills: 255 registers, 160 bytes of stack)
ROW_MIN_CHUNK = 2048            # the row kernel's chunks hold at least this many elements
ROWS = ("radix", "bins")        # how the row kernel finds top-p's boundary without top-k (``SampleKnobs.row``)
ROW = "bins"                    # default of ``row``: tools/probe_rowbins.py at 3032953 (H200, flat N(0, 1) rows,
                                # temperature 0.8, top_p 0.9, fp32, µs per call, radix / bins): B = 1 94.2 / 72.0,
                                # 4 126.4 / 82.9, 8 190.8 / 106.1, 64 1119 / 461, 256 5097 / 2015 (1717 with two
                                # levels: sampling_kernels.THIRD_MAX_CH); V = 262144 B = 8 326.9 / 162.3; peaked
                                # rows (a nucleus of ~20 tokens: step 1 decides them) equal
ROW_BINS_CAP = 4096             # row="bins": the most elements of the boundary's fine bin (past it: the radix)
GRID_MIN_ROWS = 8               # default of ``grid``: on from this many rows (tools/probe_samplegrid.py at e359ca0,
                                # H200, fp32, T = 0.8, top_p = 0.9, µs per graph-replayed call, row kernel against
                                # grid at V = 128256: B = 1 49.3 / 54.0, 8 73.9 / 68.0, 64 305.7 / 188.7, 256
                                # 1101 / 568; B = 8, V = 262144: 108.6 / 92.9)
GRID_BLOCK = 256                # grid: elements per step of a pass (two per thread of GRID_WARPS warps)
GRID_WARPS = 4
GRID_TABLE = 128                # grid: the most chunks of a row (per-chunk tables are read this wide: one compile)
GRID_WAVES = 4                  # grid: programs per SM a pass aims for, in chunks of ...
GRID_MIN_CHUNK = 1024           # ... at least this many elements and ...
GRID_MAX_CHUNK = 8192           # ... at most this many (the draw scans one chunk in one program)
GRID_LIST = 512                 # grid: a boundary group of at most this many elements is listed, no third level
GRID_LANE_COUNTS = False        # grid: levels 2-3 count per lane (True) or by tl.histogram per step
PDL = False                     # default of ``pdl`` (H100: graph replays −7..+3 %, eager 1–11 % faster: docs/topk.md)


def row_chunks(B: int, V: int, target: Target) -> tuple[int, int, int]:
    """(C, CH, CP): the row kernel's programs per row, elements per chunk (a multiple of ROW_BLOCK), and the
    power of two its per-chunk tables are read with (the same for every B and V of a target: one compile). All
    B·C programs wait for each other row by row, so B·C stays within what is surely resident
    (``programs_resident``); the interpreter runs programs one after another: C = 1 there."""
    if target.interpret:
        C, cp = 1, 1
    else:
        C = max(1, min(target.programs_resident() // max(B, 1), -(-V // ROW_MIN_CHUNK)))
        cp = pow2(target.programs_resident())
    per = -(-V // C)
    ch = -(-per // ROW_BLOCK) * ROW_BLOCK
    return -(-V // ch), ch, cp


def grid_chunks(B: int, V: int, target: Target, chunk: int | None = None,
                block: int = GRID_BLOCK) -> tuple[int, int]:
    """(C, CH): the grid passes' chunks per row and elements per chunk (a multiple of ``block``): B·C programs of
    ``chunk`` elements (default: GRID_WAVES per SM within [GRID_MIN_CHUNK, GRID_MAX_CHUNK]), C <= GRID_TABLE."""
    if chunk is None:
        chunk = min(max(GRID_MIN_CHUNK, -(-B * V // (GRID_WAVES * target.sm_count))), GRID_MAX_CHUNK)
    ch = -(-max(chunk, -(-V // GRID_TABLE)) // block) * block
    return -(-V // ch), ch


@dataclass(frozen=True)
class SampleKnobs:
    """Overrides of :func:`sample_plan`'s choices (tests, tools); None leaves a choice to the plan.

    ``fuse``: step 1 (the filters and the draw on the K candidates) in the last merge's epilogue, where step 1
    decides every row (``row_chunks == 0``: an int top_k, greedy, K = V): one launch and the candidates' round trip
    through memory (B·K·12 + 8·B bytes written and read back) less.

    ``mass``: how step 1 sums the candidates' p (the top-k mass W, the running masses of top-p and of the draw):
    ``fp32`` adds fp32 values in the order the reduction's layout gives (it differs between step 1's own launch,
    one warp over KP slots, and the fused merge's epilogue, many warps over CAP slots: the same candidates can give
    a log-probability one ulp apart, or another id where u·W falls on a boundary); ``fixed`` adds int64 p·2^61,
    exact, so every layout gives the same bits (``fuse`` is bit-equal to the unfused step 1 with it).

    ``draw``: see :func:`sample_draw_of`; ``graph_draw``: see :func:`sample_graph_draw_of`.

    ``row``: how the row kernel finds top-p's boundary on a row without a top-k cut: ``radix`` (8 levels of a
    4-bit radix select over the keys, a pass and a barrier each, then a pass for the count and mass at the
    boundary) or ``bins`` (two levels of 16 bins over 4096 fine bins of x between the row's max and the lowest x
    the nucleus can reach, a third where the boundary's group holds more than 512 elements, then the boundary
    group's or bin's elements, at most ``ROW_BINS_CAP``, listed, sorted and cut: three or four passes and barriers;
    the radix where more; ``sampling_kernels._topp_bins``). Default ``ROW``.

    ``grid``: rows with top-p and neither top-k nor min-p (the row kernel's bins) on a grid of launches, a pass
    each, over B·C chunks of ``grid_chunk`` elements (default :func:`grid_chunks`), passes stepping
    ``grid_block`` elements with ``grid_warps`` warps, in place of the row kernel's barriers (its programs are
    one per SM: ``sampling_grid``); the row kernel then finishes the other rows. Default: on from
    ``GRID_MIN_ROWS`` rows. ``grid_list`` (<= ``ROW_BINS_CAP``): a boundary group of at most this many elements
    is listed at the second level (the fourth pass then has nothing to do), a larger one takes the third level.
    Default ``GRID_LIST``. ``grid_lane_counts``: levels 2 and 3 count their bins' elements per lane beside the
    masses (a predicated fp32 add per bin) in place of ``tl.histogram`` per step (shared-memory atomics and
    block barriers in the loop). Default ``GRID_LANE_COUNTS``.

    ``pdl``: the launches after ``softmax_topk``'s (step 2, the grid's passes and finish, the row kernel) as
    programmatic dependent launches: each may start while the one before it runs, reads the caller's parameters,
    then waits for it (``griddepcontrol.wait``) before anything that launch wrote; so the gaps between the chain's
    launches shrink. sm_90+ only (ignored before sm_90 and under the interpreter). Default ``PDL``.

    ``one_buffer``: ids and log-probabilities as views of one allocation
    (one ``torch.empty`` less, three views more: on a CPU host the views cost more than the allocation saved,
    1.7 against 4.3 µs for CPU tensors; measured against CUDA's allocation by tools/probe_sample.py)."""

    fuse: bool | None = None
    mass: str | None = None
    draw: str | None = None
    one_buffer: bool | None = None
    graph_draw: str | None = None
    row: str | None = None
    grid: bool | None = None
    grid_chunk: int | None = None
    grid_block: int | None = None
    grid_warps: int | None = None
    grid_list: int | None = None
    grid_lane_counts: bool | None = None
    pdl: bool | None = None


NO_SAMPLE_KNOBS = SampleKnobs()
# Defaults from tools/probe_sample.py at e46b1d2 (H200, fp32, V = 128256, top_k = 50 + top_p = 0.9, µs per eager
# call, B = 1 / 8 / 64 / 256): fuse + fixed + kernel draw 30.2 / 29.2 / 33.2 / 60.7 against 40.9 / 42.4 / 57.6 / 65.1
# unfused, fp32 masses, torch.rand (kernel draw alone 33.9 / 36.1 / 37.5 / 62.3; fuse + fixed alone 40.0 / 37.2 /
# 39.5 / 63.9; one buffer 40.9 / 40.0 / 43.5 / 66.0); CUDA-graph replays within 3 % of each other (16.4-17.2 at
# B = 1, 18.2-18.8 at B = 8).
FUSE = True                     # default of ``fuse``
MASSES = ("fp32", "fixed")
MASS = "fixed"                  # default of ``mass`` (``fuse`` is bit-equal to the unfused step 1 with it)
DRAWS = ("torch", "kernel")
DRAW = "kernel"                 # default of ``draw``
ONE_BUFFER = False              # default of ``one_buffer``
GRAPH_DRAWS = ("torch", "kernel")
GRAPH_DRAW = "kernel"           # default of ``graph_draw``: tools/probe_sample3.py at 565ffee (H200, same problem,
                                # µs per graph replay at B = 1 / 8 / 64 / 256): 14.8 / 16.7 / 26.9 / 58.3 against
                                # 17.0 / 18.7 / 28.6 / 60.0 with torch.rand, i.e. 1.30 / 1.23 / 1.23 / 1.19x
                                # softmax_topk's replay against 1.49 / 1.38 / 1.31 / 1.23x


def sample_draw_of(knobs: SampleKnobs) -> str:
    """Where the uniforms come from: ``torch`` (``torch.rand`` with the generator, a launch of its own) or
    ``kernel`` (Philox in the sampling kernel, seed and offset read from the generator on the host; eager calls on
    CUDA only: a call being captured into a CUDA graph draws as :func:`sample_graph_draw_of` says)."""
    draw = DRAW if knobs.draw is None else knobs.draw
    if draw not in DRAWS:
        raise ValueError(f"SampleKnobs: draw must be one of {DRAWS}, got {draw!r}")
    return draw


def sample_graph_draw_of(knobs: SampleKnobs) -> str:
    """Where a call being captured into a CUDA graph takes its uniforms: ``torch`` (``torch.rand``: a kernel node
    of its own on every replay) or ``kernel`` (Philox in the sampling kernel: the key and a base counter read from
    the generator at capture, each row's replay count in a device tensor of the capture that the kernel reads and
    advances: ``sampling._graph_philox``)."""
    graph_draw = GRAPH_DRAW if knobs.graph_draw is None else knobs.graph_draw
    if graph_draw not in GRAPH_DRAWS:
        raise ValueError(f"SampleKnobs: graph_draw must be one of {GRAPH_DRAWS}, got {graph_draw!r}")
    return graph_draw


@dataclass(frozen=True)
class SamplePlan:
    """What ``sample`` launches for one problem (``explain_sample`` returns it)."""

    path: str                   # "kernels", or "torch" (the portable path: not CUDA, or K past the fused kernels)
    k: int = 0                  # K: candidates from softmax_topk (the temperature folded into its read)
    topk: Plan | None = None    # their plan
    row_chunks: int = 0         # the row kernel's programs per row; 0: not launched (an int top_k decides every row)
    chunk: int = 0              # its elements per program
    table: int = 0              # the power of two its per-chunk tables are read with
    fuse: bool = False          # step 1 in the last merge's epilogue (row_chunks == 0 only)
    mass: str = MASS            # step 1's sums of p: "fp32", or "fixed" (int64 p·2^61: the same bits in any layout)
    draw: str = DRAW            # the uniforms: "torch" (torch.rand) or "kernel" (Philox in step 1, eager calls)
    one_buffer: bool = ONE_BUFFER   # ids and logprobs as views of one allocation
    graph_draw: str = GRAPH_DRAW    # the uniforms of a captured call: "torch" (torch.rand) or "kernel" (Philox)
    row: str = ROW              # the row kernel's top-p boundary without top-k: "radix" or "bins"
    grid_chunks: int = 0        # grid launches (row="bins" only): chunks per row; 0: none
    grid_chunk: int = 0         # their elements per chunk
    grid_block: int = 0         # elements per step of their passes
    grid_warps: int = 0         # their warps
    grid_list: int = 0          # the most elements of a boundary group listed at the second level
    grid_lane_counts: bool = False  # levels 2-3 count per lane, not by tl.histogram
    pdl: bool = False           # the launches after softmax_topk's as programmatic dependent launches (sm_90+)


TORCH_SAMPLE_PLAN = SamplePlan("torch")


def sample_plan(B: int, V: int, esize: int, target: Target, *, greedy: bool = False, top_k: int | None = None,
                knobs: SampleKnobs = NO_SAMPLE_KNOBS) -> SamplePlan:
    """The launches of ``sample`` on a ``[B, V]`` input of ``esize``-byte floats on ``target``: ``greedy`` when every
    row's temperature is 0 (a Python 0), ``top_k`` a Python int (or None: no top-k, or a per-row tensor).
    ``knobs.fuse`` where the row kernel is not needed (else ignored: step 1 must flag rows for it)."""
    K = 1 if greedy else top_k if top_k is not None else min(V, FREE_K)
    mass = MASS if knobs.mass is None else knobs.mass
    if mass not in MASSES:
        raise ValueError(f"SampleKnobs: mass must be one of {MASSES}, got {mass!r}")
    draw = sample_draw_of(knobs)
    graph_draw = sample_graph_draw_of(knobs)
    one = ONE_BUFFER if knobs.one_buffer is None else knobs.one_buffer
    row = ROW if knobs.row is None else knobs.row
    if row not in ROWS:
        raise ValueError(f"SampleKnobs: row must be one of {ROWS}, got {row!r}")
    cfg = topk_plan(B, V, K, esize, target)
    if cfg.path == "sort":
        return TORCH_SAMPLE_PLAN
    if greedy or top_k is not None or K == V:
        return SamplePlan("kernels", K, cfg, fuse=FUSE if knobs.fuse is None else knobs.fuse, mass=mass, draw=draw,
                          one_buffer=one, graph_draw=graph_draw)
    grid = (B >= GRID_MIN_ROWS if knobs.grid is None else knobs.grid) and row == "bins"
    block = GRID_BLOCK if knobs.grid_block is None else knobs.grid_block
    warps = GRID_WARPS if knobs.grid_warps is None else knobs.grid_warps
    if block < 16 or block & (block - 1) or warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"SampleKnobs: grid_block must be a power of two >= 16 and grid_warps one of 1, 2, 4, 8, "
                         f"16, got {block} and {warps}")
    if knobs.grid_chunk is not None and knobs.grid_chunk < 1:
        raise ValueError(f"SampleKnobs: grid_chunk must be positive, got {knobs.grid_chunk}")
    lst = GRID_LIST if knobs.grid_list is None else knobs.grid_list
    if not 1 <= lst <= ROW_BINS_CAP:
        raise ValueError(f"SampleKnobs: grid_list must be in [1, {ROW_BINS_CAP}], got {lst}")
    gc, gch = grid_chunks(B, V, target, knobs.grid_chunk, block) if grid else (0, 0)
    pdl = (PDL if knobs.pdl is None else knobs.pdl) and target.arch >= 90 and not target.interpret
    return SamplePlan("kernels", K, cfg, *row_chunks(B, V, target), mass=mass, draw=draw, one_buffer=one, pdl=pdl,
                      graph_draw=graph_draw, row=row, grid_chunks=gc, grid_chunk=gch,
                      grid_block=block if grid else 0, grid_warps=warps if grid else 0, grid_list=lst if grid else 0,
                      grid_lane_counts=grid and (GRID_LANE_COUNTS if knobs.grid_lane_counts is None
                                                 else knobs.grid_lane_counts))
