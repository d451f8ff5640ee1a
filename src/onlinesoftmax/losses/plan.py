"""Plans of the losses family: frozen dataclasses chosen by small pure functions of (problem, target).

Overrides (tests, tuning) are frozen knobs applied with ``dataclasses.replace``: a knob the plan does not have is a
``TypeError``. The public functions take ``knobs=`` and :func:`onlinesoftmax.losses.explain` returns the plan a call
would run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..target import Target

__all__ = ["CEKnobs", "CEPlan", "CEProblem", "LCEKnobs", "LCEPlan", "LCEProblem", "plan_cross_entropy",
           "plan_linear_cross_entropy"]

# The whole row stays in registers up to this many classes (one read of the logits): 32768 fp32 values over
# 32 warps is 32 per thread. Measured on the H200; other targets keep the smaller, always-safe size.
ONE_BLOCK_MAX_SM90 = 32768
ONE_BLOCK_MAX = 16384
# Rows split over programs when one program per row would leave SMs idle (fewer rows than ROWS_PER_SM per SM).
ROWS_PER_SM = 4
SPLIT_CHUNK = 16384          # classes per program of the split path
TILE = 8192                  # classes per tile of the two-pass row kernel and the split kernels (GPU)
# H200 (8192 rows, V = 128K-262K, bf16, fwd + bwd): 32K tiles over 32 warps ran 2.15 / 2.60 / 4.48 ms against
# 2.26 / 2.69 / 4.59 ms with 8K tiles over 16 warps: one program per SM keeps the rows in flight inside L2
# for the second pass. The one-block row at V = 32000 ran 35 µs faster with 16 warps than with 32.
TILE_SM90, TILE_WARPS_SM90 = 32768, 32
ONE_BLOCK_WARPS_MAX_SM90 = 16
# Rows of V <= COOP_MAX_V on a GPU: a row over C programs of COOP_CHUNK classes each (16 per thread over
# COOP_WARPS), waiting for each other at a row barrier (all of a row's programs resident at once: at most
# COOP_MAX_CHUNKS, one per SM). H200, 8192 rows, bf16, fwd + bwd, kernel time: V = 32000 (C = 4) 447 µs; past it
# the row's programs wait longer than they stream (V = 50257, C = 7: 2029 µs against 1235 for two passes of 8K
# tiles; V = 128256: 1593 µs at best, 8K chunks over 4 warps, against 1377 µs for two passes of 32K tiles).
COOP_CHUNK, COOP_WARPS, COOP_MAX_V = 8192, 16, 32768
COOP_MAX_CHUNKS = 64
# path "smem" (sm_90): a row over C programs each holding its chunk in shared memory (cp.async), its first `reg`
# sub-tiles in registers. The default for 16-bit logits with a gradient at V >= SMEM_MIN_V (H200, 8192 rows,
# bf16, fwd + bwd, 10 % ignored, tools/probe_ce.py: 1.139 / 1.360 / 2.227 ms at V = 128256 / 151936 / 262144
# against 1.368 / 1.674 / 2.885 for the two-pass kernel; kernel alone at V = 32000: 288 µs, 446 for coop).
# (chunk, warps, reg) per logit byte size: the softmax
# family's choice for 128K-256K rows; SMEM_CONFIG_MASKED where a row's last chunk is shorter than its register
# sub-tiles. Register bound: bf16 (16384, 4, 4) takes 80 registers (6 programs per SM), 64 without spilling (8
# programs, shared memory's limit is 9), and so do the unweighted losses' options; 56 spills, and so do class
# weights with smoothing or softcap under 64: weighted losses take the compiler's count (sm_90a compile).
SMEM_CONFIG = {2: (16384, 4, 4), 4: (16384, 8, 4)}
# 16-bit rows of at most SMEM_WHOLE_ROW_MAX_V: the whole row in one program over 8 warps, 4 register sub-tiles under
# 64 registers (49 KB of shared memory, 4 programs per SM; no row barrier, no partial states). H200, 8192 rows, bf16,
# kernel alone (tools/probe_ce32k.py at 5ad35db): V = 32000 255.6 µs against 287.4 for two 16K chunks (clone 249).
SMEM_WHOLE_ROW = {2: (32768, 8, 4)}
SMEM_WHOLE_ROW_MAX_V = 32768
SMEM_CONFIG_MASKED = {2: (8192, 2, 0), 4: (11264, 4, 0)}
SMEM_MAXNREG = {2: 64}
SMEM_MIN_V = 32000
INTERPRET_TILE = 256         # ... and in the interpreter (small tiles: the tests exercise the loops and masks)
INTERPRET_ONE_BLOCK_MAX = 1024


@dataclass(frozen=True)
class CEProblem:
    n_rows: int
    vocab: int
    itemsize: int            # bytes per logit
    need_grad: bool
    smem_rows: bool = False  # rows cp.async can copy by 16 bytes: 2- or 4-byte logits, V and the row strides
                             # multiples of 16, x and dx 16-byte aligned (the smem path's condition)


@dataclass(frozen=True)
class CEPlan:
    """``path``: ``"torch"`` (F.cross_entropy and torch autograd), ``"coop"`` (``chunks`` programs per row of
    ``chunk`` classes each in registers, meeting at a row barrier: x read once), ``"smem"`` (the same with each
    chunk in shared memory, its first ``reg`` sub-tiles in registers; ``keep_e``: e_j kept in x_j's place, one
    exponential per logit; ``maxnreg``: a register bound, 0 for the compiler's; sm_90), ``"row"`` (one program per
    row; ``one_block``: the row in registers, read once) or ``"split"`` (``chunks`` programs per row of ``chunk``
    classes each, two launches, x read twice)."""

    path: str
    block: int = 0
    one_block: bool = False
    num_warps: int = 4
    chunks: int = 1
    chunk: int = 0
    fast_exp: bool = True    # ex2.approx.ftz (GPU); the interpreter takes tl.exp
    reg: int = 0
    keep_e: bool = False
    maxnreg: int = 0
    reason: str = ""


@dataclass(frozen=True)
class CEKnobs:
    """Overrides of a :class:`CEPlan`; None leaves the planned value."""

    path: str | None = None
    block: int | None = None
    one_block: bool | None = None
    num_warps: int | None = None
    chunk: int | None = None
    reg: int | None = None
    keep_e: bool | None = None
    maxnreg: int | None = None


def _pow2(n: int) -> int:
    return 1 << (max(int(n), 1) - 1).bit_length()


def _warps(block: int, target: Target) -> int:
    """Threads for a register-resident row: 32 fp32 values each (64 on the H200, measured), 4 to 32 warps."""
    if target.sm90:
        return max(4, min(ONE_BLOCK_WARPS_MAX_SM90, block // 2048))
    return max(4, min(32, block // 1024))


def plan_cross_entropy(p: CEProblem, target: Target, knobs: CEKnobs | None = None) -> CEPlan:
    """The cross-entropy plan for ``p`` on ``target``; ``knobs`` override it (a path's sizes are re-derived)."""
    k = knobs or CEKnobs()
    tile = INTERPRET_TILE if target.interpret else TILE_SM90 if target.sm90 else TILE
    tile_warps = 4 if target.interpret else TILE_WARPS_SM90 if target.sm90 else 16
    one_max = (INTERPRET_ONE_BLOCK_MAX if target.interpret
               else ONE_BLOCK_MAX_SM90 if target.sm90 else ONE_BLOCK_MAX)
    fast = not target.interpret
    path = k.path
    coop_c = -(-p.vocab // COOP_CHUNK)
    if path is None:
        if _smem_default(p, target):
            path, reason = "smem", ("programs per row holding their chunks in shared memory (at a row barrier where "
                                    "there are several): x read once, dx written from shared memory")
        elif not target.interpret and p.vocab <= COOP_MAX_V and coop_c <= target.programs_resident():
            path, reason = "coop", f"{coop_c} programs of {COOP_CHUNK} classes per row at a row barrier: x read once"
        elif p.vocab <= one_max:
            path, reason = "row", f"V = {p.vocab} <= {one_max}: the row in registers, read once"
        elif p.n_rows >= ROWS_PER_SM * max(target.sm_count, 1):
            path, reason = "row", f"{p.n_rows} rows fill {target.sm_count} SMs: one program per row, two passes"
        else:
            path, reason = "split", f"{p.n_rows} rows < {ROWS_PER_SM} per SM: each row split over programs"
    else:
        reason = "knobs"
    if path == "torch":
        return CEPlan("torch", fast_exp=False, reason=reason)
    if path == "row":
        one = k.one_block if k.one_block is not None else p.vocab <= one_max
        block = k.block or (_pow2(p.vocab) if one else min(tile, _pow2(p.vocab)))
        if one and block < p.vocab:
            raise ValueError(f"cross_entropy knobs: one_block needs block >= V = {p.vocab}, got {block}")
        warps = k.num_warps or (_warps(block, target) if one else tile_warps)
        return CEPlan("row", block=block, one_block=one, num_warps=warps, fast_exp=fast, reason=reason)
    if path == "coop":
        chunk = k.chunk or (COOP_CHUNK if not target.interpret else _pow2(p.vocab))
        if chunk != _pow2(chunk):
            raise ValueError(f"cross_entropy knobs: a coop chunk must be a power of two, got {chunk}")
        chunks = -(-p.vocab // chunk)
        limit = 1 if target.interpret else min(COOP_MAX_CHUNKS, target.programs_resident())
        if chunks > limit:          # the interpreter runs programs one after another: none may wait for another
            raise ValueError(f"cross_entropy knobs: coop needs at most {limit} chunks per row on this target, got "
                             f"{chunks} of {chunk} classes for V = {p.vocab}")
        if k.block not in (None, chunk):
            raise ValueError(f"cross_entropy knobs: a coop chunk is held whole in registers (block = chunk = {chunk}),"
                             f" got block {k.block}")
        warps = k.num_warps or max(1, min(COOP_WARPS, chunk // 512))
        return CEPlan("coop", block=chunk, num_warps=warps, chunks=chunks, chunk=chunk, fast_exp=fast,
                      reason=reason)
    if path == "split":
        block = k.block or min(TILE if not target.interpret else tile, _pow2(p.vocab))
        chunk = k.chunk or (INTERPRET_TILE * 2 if target.interpret else SPLIT_CHUNK)
        chunk = max(block, -(-chunk // block) * block)           # a whole number of tiles
        chunks = -(-p.vocab // chunk)
        warps = k.num_warps or (4 if target.interpret else 16)
        return CEPlan("split", block=block, num_warps=warps, chunks=chunks, chunk=chunk, fast_exp=fast,
                      reason=reason)
    if path == "smem":
        return _smem_plan(p, target, k, reason)
    raise ValueError(f"cross_entropy knobs: path must be 'torch', 'coop', 'smem', 'row' or 'split', got {path!r}")


def _smem_default(p: CEProblem, target: Target) -> bool:
    """The smem path is the default: sm_90, 16-bit rows it can copy, a gradient to write, V >= SMEM_MIN_V and the
    row's chunks all resident at once."""
    if not (target.sm90 and not target.interpret and p.smem_rows and p.need_grad and p.itemsize == 2
            and p.vocab >= SMEM_MIN_V):
        return False
    return -(-p.vocab // SMEM_CONFIG[2][0]) <= min(COOP_MAX_CHUNKS, target.programs_resident())


def _smem_plan(p: CEProblem, target: Target, k: CEKnobs, reason: str) -> CEPlan:
    """The shared-memory coop plan: ``chunk`` a whole number of sub-tiles (one 16-byte copy per thread each; the
    whole row where ``chunk`` >= V), ``reg`` (0 or a power of two) of them in registers, at least one in shared
    memory, and every chunk of the row (its last too) at least ``reg`` sub-tiles long."""
    if not target.sm90:
        raise ValueError("cross_entropy knobs: path 'smem' runs on sm_90 only (Gluon cp.async)")
    if not p.smem_rows:
        raise ValueError("cross_entropy knobs: path 'smem' needs 2- or 4-byte logits, V and the row strides "
                         "multiples of 16 and 16-byte aligned tensors")
    if p.itemsize not in SMEM_CONFIG:
        raise ValueError(f"cross_entropy knobs: path 'smem' takes 2- or 4-byte logits, got {p.itemsize}")
    whole = p.vocab <= SMEM_WHOLE_ROW_MAX_V and p.itemsize in SMEM_WHOLE_ROW
    chunk, warps, reg = (SMEM_WHOLE_ROW if whole else SMEM_CONFIG)[p.itemsize]
    chunk, warps, sub = _smem_chunk(p, k.chunk or chunk, k.num_warps or warps)
    reg = k.reg if k.reg is not None else reg
    if not _reg_fits(p.vocab, chunk, reg * sub) and k.reg is None and k.chunk is None and k.num_warps is None:
        chunk, warps, reg = SMEM_CONFIG_MASKED[p.itemsize]
        chunk, warps, sub = _smem_chunk(p, chunk, warps)
    chunks = -(-p.vocab // chunk)
    limit = min(COOP_MAX_CHUNKS, target.programs_resident())
    if chunks > limit:
        raise ValueError(f"cross_entropy knobs: smem needs at most {limit} chunks per row, got {chunks} of {chunk} "
                         f"classes for V = {p.vocab}")
    if reg & (reg - 1) or chunk // sub <= reg or not _reg_fits(p.vocab, chunk, reg * sub):
        raise ValueError(f"cross_entropy knobs: smem reg = {reg} sub-tiles of {sub} must be 0 or a power of two, "
                         f"leave one of the chunk's {chunk // sub} in shared memory and fit the row's last chunk")
    maxnreg = k.maxnreg if k.maxnreg is not None else SMEM_MAXNREG.get(p.itemsize, 0) if reg else 0
    return CEPlan("smem", block=chunk, num_warps=warps, chunks=chunks, chunk=chunk, fast_exp=True, reg=reg,
                  keep_e=bool(k.keep_e), maxnreg=maxnreg, reason=reason)


def _smem_chunk(p: CEProblem, chunk: int, warps: int) -> tuple[int, int, int]:
    """(chunk, warps, sub-tile): the chunk a whole number of sub-tiles, the whole row where it is >= V."""
    sub = 16 // p.itemsize * 32 * warps
    return (-(-p.vocab // sub) * sub if chunk >= p.vocab else max(sub, chunk // sub * sub)), warps, sub


def _reg_fits(V: int, chunk: int, reg_elems: int) -> bool:
    """Every chunk of a row holds the ``reg_elems`` logits kept in registers, unmasked."""
    return V % chunk == 0 or V % chunk >= reg_elems


# ---- linear cross-entropy ---------------------------------------------------------------------------------

# scheme "tokens": the logits tile (tokens × V in the logits' dtype) is the one buffer the op adds: it is sized to
# this budget. A larger tile amortises the grad-weight accumulation (read + write of V × Hd per tile) over more
# tokens.
LCE_TILE_BYTES = 56 << 20
LCE_TOKEN_MULTIPLE = 16
# scheme "vocab": a block of tokens × a chunk of the vocabulary per logits tile (all four GEMMs by cuBLAS at full
# size). The tile (plus the fp32 grad-hidden accumulator under dh_fp32) fits LCE_VOCAB_BYTES, 4 MiB below the
# goal's 64 MiB for the [N] fp32 rows (loss, lse, the running (m, d), the target logit, the gradient's factors).
# All N tokens form one block up to LCE_VOCAB_MAX_TOKENS: grad_weight is then written once per vocab chunk, never
# accumulated, and grad_hidden accumulates over the V / vocab_chunk chunks.
LCE_VOCAB_BYTES = 60 << 20
LCE_VOCAB_MAX_TOKENS = 16384
LCE_VOCAB_MULTIPLE = 128
LCE_SCHEMES = ("tokens", "vocab")


@dataclass(frozen=True)
class LCEProblem:
    n_tokens: int
    hidden: int
    vocab: int
    itemsize: int
    need_grad: bool


@dataclass(frozen=True)
class LCEPlan:
    """``scheme``:

    * ``"tokens"``: tokens are taken ``chunk_tokens`` at a time: logits tile = hidden[chunk] @ weightᵀ (+ bias),
      its loss and gradient by ``ce`` (written over the tile), then grad_hidden[chunk] = dtile @ weight and
      grad_weight += dtileᵀ @ hidden[chunk] (3 GEMMs, grad_weight read and written once per chunk).
    * ``"vocab"``: blocks of ``chunk_tokens`` tokens; per block two sweeps over the vocabulary in chunks of
      ``vocab_chunk`` classes. Sweep 1: S_c = hidden[block] @ W_cᵀ (+ b_c), folded into the running (m, d) per
      token (and the target logit); lse = m + log d. Sweep 2 (a gradient wanted; the last chunk first, its S_c
      still in the tile): S_c again, turned in place into dS_c, then grad_W[c] (+)= dS_cᵀ @ hidden[block] and
      grad_hidden[block] += dS_c @ W_c (in its own dtype, or in an fp32 accumulator under ``dh_fp32``). 4 GEMMs.
    """

    chunk_tokens: int
    tile_bytes: int
    ce: CEPlan
    reason: str = ""
    scheme: str = "tokens"
    vocab_chunk: int = 0
    dh_fp32: bool = False


@dataclass(frozen=True)
class LCEKnobs:
    chunk_tokens: int | None = None
    tile_bytes: int | None = None
    ce: CEKnobs | None = None
    scheme: str | None = None
    vocab_chunk: int | None = None
    dh_fp32: bool | None = None


# The default: scheme "vocab", 16-bit hidden states with the fp32 grad-hidden accumulator. H200, bf16, fwd + bwd
# (tools/probe_lce.py at dbcd81a + lce): (8192, 4096, 128256) 58.7 ms against "tokens" 60.2 (torch.compile 40.5,
# Liger 56.5, Cut Cross-Entropy 88.8); (16384, 2048, 151936) 74.4 against 79.4 (torch.compile 52.0, Liger 68.4).
# Without the fp32 accumulator "vocab" takes 54.6 / 69.1 ms, but grad_hidden, rounded to 16 bits after every vocab
# chunk, comes out with 3-5x torch's relative error (7.2e-3 against 2.5e-3; 9.5e-3 against 1.9e-3).
LCE_DEFAULT_SCHEME = "vocab"


def plan_linear_cross_entropy(p: LCEProblem, target: Target, knobs: LCEKnobs | None = None) -> LCEPlan:
    k = knobs or LCEKnobs()
    scheme = k.scheme or LCE_DEFAULT_SCHEME
    if scheme not in LCE_SCHEMES:
        raise ValueError(f"linear_cross_entropy knobs: scheme must be one of {LCE_SCHEMES}, got {scheme!r}")
    if scheme == "vocab":
        if k.dh_fp32 is None:          # 16-bit grad_hidden accumulates in fp32 (fp32 accumulates in itself)
            k = with_knobs(k, dh_fp32=p.itemsize < 4)
        return _plan_vocab(p, target, k)
    if k.vocab_chunk or k.dh_fp32:
        raise ValueError("linear_cross_entropy knobs: vocab_chunk and dh_fp32 belong to scheme 'vocab'")
    budget = k.tile_bytes or LCE_TILE_BYTES
    row_bytes = max(p.vocab * p.itemsize, 1)
    fit = max(LCE_TOKEN_MULTIPLE, budget // row_bytes // LCE_TOKEN_MULTIPLE * LCE_TOKEN_MULTIPLE)
    chunk = k.chunk_tokens or min(max(p.n_tokens, 1), fit)
    reason = (f"knobs: {chunk} tokens" if k.chunk_tokens else
              f"{chunk} tokens × V = {p.vocab} fill the {budget >> 20} MiB logits tile")
    ce = plan_cross_entropy(CEProblem(chunk, p.vocab, p.itemsize, p.need_grad), target, k.ce)
    return LCEPlan(chunk_tokens=chunk, tile_bytes=chunk * row_bytes, ce=ce, reason=reason)


def _plan_vocab(p: LCEProblem, target: Target, k: LCEKnobs) -> LCEPlan:
    """Token block and vocab chunk within the budget: the block as large as allowed (all tokens up to
    LCE_VOCAB_MAX_TOKENS, equal blocks past it; under dh_fp32 its fp32 accumulator at most half the budget), the
    chunk what the rest holds, a multiple of LCE_VOCAB_MULTIPLE."""
    if k.ce is not None:
        raise ValueError("linear_cross_entropy knobs: scheme 'vocab' runs no cross-entropy plan (ce knobs)")
    budget = k.tile_bytes or LCE_VOCAB_BYTES
    n, mult = max(p.n_tokens, 1), LCE_TOKEN_MULTIPLE
    fp32 = bool(k.dh_fp32)
    acc_row = 4 * p.hidden if fp32 else 0
    if k.chunk_tokens:
        block = k.chunk_tokens
    else:
        cap = LCE_VOCAB_MAX_TOKENS if not fp32 else max(mult, budget // 2 // acc_row // mult * mult)
        per = -(-n // -(-n // cap))                   # equal blocks of at most cap tokens
        block = min(n, -(-per // mult) * mult)
    if k.vocab_chunk:
        vc = min(k.vocab_chunk, max(p.vocab, 1))
    else:
        fit = max(0, budget - block * acc_row) // (block * p.itemsize)
        vc = max(LCE_VOCAB_MULTIPLE, fit // LCE_VOCAB_MULTIPLE * LCE_VOCAB_MULTIPLE)
        vc = min(vc, max(p.vocab, 1))
    reason = (f"{block} tokens × {vc} classes per logits tile ({-(-n // block)} token block(s), "
              f"{-(-max(p.vocab, 1) // vc)} vocab chunks), 4 GEMMs")
    if k.chunk_tokens or k.vocab_chunk or k.tile_bytes:
        reason = "knobs: " + reason
    ce = CEPlan("vocab", fast_exp=not target.interpret,
                reason="scheme 'vocab': the fold and gradient kernels of lce_kernels.py, no cross-entropy plan")
    return LCEPlan(chunk_tokens=block, tile_bytes=block * vc * p.itemsize + block * acc_row, ce=ce, reason=reason,
                   scheme="vocab", vocab_chunk=vc, dh_fp32=fp32)


def with_knobs(knobs, **changes):
    """``dataclasses.replace`` for knobs: an unknown name is a TypeError."""
    return dataclasses.replace(knobs, **changes)
