"""Plans for ``oss.attention``: frozen dataclasses chosen by small pure functions of (problem, target).

A :class:`Problem` is what the kernels specialise on (sizes, head dim, dtype, the mask's shape); a
:class:`ForwardPlan` / :class:`BackwardPlan` is the launch configuration. :class:`Knobs` overrides any field of a
plan (``dataclasses.replace``, so a misspelled key is an error); tools sweep with it, users never need it.

Tile sizes for ``target.sm90`` were measured on the H200 (bf16, D = 64 / 128); every other GPU gets the portable
configuration (correct anywhere Triton runs: 64 × 64 tiles, 4 warps, 2 stages), the interpreter the smallest.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..target import Target

__all__ = ["AttentionPlan", "BackwardPlan", "ForwardPlan", "Knobs", "Problem", "plan_attention",
           "plan_backward", "plan_forward", "sm90_bwd_eligible", "sm90_bwd_shared"]


@dataclass(frozen=True)
class Problem:
    B: int
    H: int
    Hkv: int
    Sq: int
    Sk: int
    D: int
    dtype: str              # "float16", "bfloat16", "float32"
    causal: bool = False
    window: tuple = (-1, -1)
    softcap: bool = False
    varlen: bool = False    # packed sequences: B = len(cu_seqlens) - 1, Sq / Sk = the longest lengths
    tma: bool = False       # q, k, v: unit head-dim stride, 16-byte aligned data and strides (TMA can copy tiles)
    deterministic: bool = False   # torch.use_deterministic_algorithms(True): no fp32 atomics in the backward

    @property
    def group(self) -> int:
        return self.H // self.Hkv

    @property
    def block_d(self) -> int:
        """The head dim padded to a power of two, at least 16 (tl.dot's smallest K)."""
        return max(16, 1 << (self.D - 1).bit_length())

    @property
    def banded(self) -> bool:
        """Some keys are skipped per query block: causal or a finite window."""
        return self.causal or self.window != (-1, -1)


@dataclass(frozen=True)
class ForwardPlan:
    kernel: str             # "triton": the portable tl.dot kernel (kernels/fwd.py); "sm90": TMA + wgmma with a
                            # warp-specialised producer (kernels/fwd_sm90.py, Gluon; Hopper only)
    block_m: int
    block_n: int
    num_warps: int          # "sm90": 4 (two consumer warpgroups of 64 rows and a producer warp run)
    num_stages: int         # "sm90": the key / value ring's slots
    dot_f32: bool = False   # operands upcast to fp32 before tl.dot (the interpreter's bf16 dot is wrong)
    overlap: bool = True    # "sm90": the scores of tile j + 1 issued before p v of tile j
    fold: bool = False      # "sm90": the row max over q kᵀ, p = 2^(qk·c − m) one FFMA per score (c = log2e·scale
                            # > 0, no softcap; other calls run unfolded)
    programs: int = 0       # "sm90": a persistent grid of this many programs looping over the (query block, head)
                            # tiles, host TMA descriptors, O staged apart (not varlen); 0: one program per tile;
                            # -1 (a knob): the target's SM count
    pairs: bool = False     # persistent grid: a program's unit of work is the query blocks i and n_m − 1 − i of
                            # one head (under a causal mask their key ranges sum to n_m + 1 key tiles: the
                            # round-robin over programs is balanced; head-major, longest first, without)
    o_direct: bool = False  # persistent grid: O stored from registers, no staging buffer (at D = 128 its 32 KB
                            # make room for a third ring slot: 224 KB; at D = 256 the grid needs it, q 64 KB and
                            # two ring slots 128 KB leave no room for O's 64 KB)


@dataclass(frozen=True)
class BackwardPlan:
    kernel: str             # "triton" (kernels/bwd.py: Δ, then dK/dV per key block, then dQ per query block);
                            # "sm90": dK, dV and dQ in one Gluon kernel (kernels/bwd_sm90.py: TMA ring filled by a
                            # producer warp, wgmma consumers, dQ by fp32 atomics as dq_atomic; Hopper only)
    block_m: int            # dK/dV kernel: query rows per step
    block_n: int            # dK/dV kernel: keys per program ("sm90": two consumer warpgroups of 64, of 32 at D = 256)
    num_warps: int          # dK/dV kernel ("sm90": 4, the first consumer warpgroup)
    num_stages: int         # ("sm90": the Q / dO ring's slots)
    block_m_dq: int         # dQ kernel: query rows per program
    block_n_dq: int         # dQ kernel: keys per step
    num_warps_dq: int
    num_stages_dq: int
    dq_atomic: bool = False  # dQ added by the dK/dV kernel into an fp32 buffer (fp32 atomics; 5 matmuls, not 7),
                             # then scaled and cast by a row kernel; the dQ kernel's fields go unused
    dot_f32: bool = False
    # "sm90" only (kernels/bwd_sm90.py):
    stage_rows: bool = False  # the producer warp stages each tile's lse and Δ in shared memory with its Q / dO
                              # (the consumers wait on no global load)
    dq_tma: bool = False      # dQ's partial tile through shared memory, added by a TMA reduce (one bulk op per
                              # tile and warpgroup, not 32 fp32 atomics per thread)
    dq_slot: bool = False     # dq_tma's partial tiles written into the tile's Q / dO slot once both warpgroups'
                              # matmuls have read it, the slot refilled after the reduce read it (D = 128: no 32 KB
                              # of dQ tiles, room for a third slot; D = 256: dQ by TMA reduce at all)
    lpt_heads: int = 0        # > 0: programs launched longest first within groups of this many (batch, kv head)s
                              # (a causal band's key block 0 has the most query rows); 0: head by head
    dq_rows: bool = False     # D = 64: the warpgroups split dQ by query rows over all the program's keys (dSᵀ
                              # shared through a ring): half the fp32 bytes reduced, half dQ's registers
    programs: int = 0         # a persistent grid of this many programs looping over the (key block, batch·kv head)
                              # units in the per-program grid's order (lpt_heads' when set), host TMA descriptors,
                              # the next block's K / V and Q / dO loads issued while the last block's dK / dV are
                              # stored (not varlen); 0: one program per unit; -1 (a knob): the target's SM count
    pairs: bool = False       # persistent grid: a program's unit of work is the key blocks n_kb − 1 − i and i of one
                              # (batch, kv head) (under a causal band their query tiles add up to the same count:
                              # the round-robin over programs is balanced; no lpt_heads then)
    producer_regs: int = 32   # registers per thread of the producer's warpgroup (setmaxnreg); the default-partition
                              # consumer gets 504 − 240 − this (kernels/bwd_sm90.py: 232 spills inside its loop at
                              # D = 128, 24 gives it 240; not timed)


@dataclass(frozen=True)
class Knobs:
    """Overrides of plan fields: ``Knobs(forward={"block_n": 64})``. A name that is not a field of ForwardPlan /
    BackwardPlan is a TypeError here (on any backend, not only where the plan is made)."""

    forward: tuple = ()     # (name, value) pairs, or a dict (normalised)
    backward: tuple = ()

    def __post_init__(self):
        for f, cls in (("forward", ForwardPlan), ("backward", BackwardPlan)):
            v = getattr(self, f)
            if isinstance(v, dict):
                object.__setattr__(self, f, tuple(sorted(v.items())))
            unknown = sorted({name for name, _ in getattr(self, f)} - {x.name for x in dataclasses.fields(cls)})
            if unknown:
                raise TypeError(f"attention Knobs: {f} has no field {', '.join(unknown)} (the fields of "
                                f"{cls.__name__})")


@dataclass(frozen=True)
class AttentionPlan:
    backend: str            # "torch" or "triton"
    problem: Problem
    forward: ForwardPlan | None
    backward: BackwardPlan | None
    decode: bool = False    # a call without a gradient runs the split-KV decode kernels (decode_dispatch)


# A few query rows over many keys: one program per (batch, head, query block) leaves the GPU idle; the decode
# family's split-KV kernels cut the keys across programs and merge their (o, lse).
DECODE_MAX_SQ = 16
DECODE_MIN_SK = 2048


def decode_dispatch(p: Problem) -> bool:
    """The forward runs the decode family's split-KV kernels: Sq <= DECODE_MAX_SQ query rows over at least
    DECODE_MIN_SK keys (and no more queries than keys), D <= 256."""
    return decode_shape(p.Sq, p.Sk, p.D)


def decode_shape(Sq: int, Sk: int, D: int) -> bool:
    """:func:`decode_dispatch` from the three sizes it reads (an eager call's per-step test)."""
    return Sq <= DECODE_MAX_SQ and Sk >= max(DECODE_MIN_SK, Sq) and D <= 256


# ---- the forward ------------------------------------------------------------------------------------------
# H200, bf16: (block_m, block_n, num_warps, num_stages) by head dim.
SM90_FORWARD = {
    64: (128, 64, 8, 3),
    128: (128, 128, 8, 3),
    256: (128, 64, 8, 2),
}
# The Gluon kernel (fp16 / bf16, TMA-able tensors): (block_m = 128: two consumer warpgroups of 64 rows, block_n,
# 4 warps, ring slots) by head dim; its shared memory holds q (block_m × D) and the ring's k and v tiles
# (2 × slots × block_n × D), at most 227 KB.
# By default (H200, bf16, tools/probe_fwd_sm90.py at dbcd81a + fwd-sm90, bench attention at d8f0334): D = 128 and
# 64 fold the scale into the row max (p = 2^(qk·c − m), one FFMA per score) and, for dense [B, H, S, D] inputs, run
# a persistent grid of one program per SM (`programs`): 4 × 32 × 4096 × 128 619 / 525 TFLOP/s causal against
# 546 / 478 per tile, 16 × 32 × 1024 × 128 616 / 368 against 432 / 285; non-causal D = 64 477 at 4 × 32 × 4096
# against the tl.dot kernel's 428. Causal (or windowed) problems on the persistent grid take `pairs`: a program's
# unit of work is query blocks i and n_m − 1 − i, the same number of key tiles per unit, so the round-robin over
# 132 programs is balanced (tools/probe_fwd2.py at b4fb837, causal, TFLOP/s against cuDNN's in the same run):
# 16 × 32 × 1024 × 128 433 against 350 without pairs (cuDNN 464), 4 × 32 × 4096 553 / 528 (600), 2 × 32 × 8192
# 571 / 553 (574); D = 64 8 × 16 × 2048 379 / 332 (376), 4 × 32 × 4096 426 / 391 (435), where the tl.dot kernel,
# the default before, measured 316 and 376. Packed D = 64 sequences keep the tl.dot kernel (the per-tile sm90 kernel
# measured 0.6-0.9x it at D = 64). D = 256: causal / windowed dense problems run the persistent grid with O from
# registers (o_direct: q and a two-slot ring fill 197 KB, no room for O's staging tile), folded, with pairs
# (tools/probe_fwd3.py at e46b1d2, TFLOP/s by graph replay / eager against cuDNN's: 2 × 16 × 4096 × 256 619 / 623
# against 538 / 580 per tile (cuDNN 599 / 600), 4 × 16 × 2048 499 / 479 against 477 / 485 (529 / 536));
# non-causal D = 256 stays per tile, unfolded (643 / 685 against cuDNN's 647 / 685; the persistent variants
# measured 0.94-1.02x it).
SM90_WS_FORWARD = {
    64: (128, 128, 4, 4),
    128: (128, 128, 4, 2),
    256: (128, 64, 4, 2),
}
SM90_WS_BANDED_STAGES = {128: 3}   # causal / windowed at D = 128, per-tile grid: a third slot (H200: +2-5 % at S >= 8K,
                                   # GQA); the persistent grid's O buffer leaves room for two
SM90_WS_FOLD = (64, 128)           # head dims whose default folds the scale (fold)
SM90_WS_PERSISTENT = (64, 128)     # head dims whose default grid for dense inputs is persistent
SM90_WS_PERSISTENT_BANDED_OD = (256,)  # head dims whose causal / windowed default is persistent with o_direct
SM90_WS_PERSISTENT_BANDED_SK = 8192  # causal / windowed D = 128 past this many keys runs per tile with 3 slots
                                     # (probe_fwd2 at b4fb837, 1 × 32 × 16384 causal: per tile, folded, 3 slots 651
                                     # TFLOP/s, persistent with pairs 581, cuDNN 594)


SM90_SHARED = 232448               # bytes of shared memory one Hopper program may take (227 KB)
SM90_BARRIERS = 1024               # room left beside the tiles for the ring's and the queries' mbarriers


def sm90_persistent_shared(D: int, plan: ForwardPlan) -> int:
    """Bytes of the persistent kernel's 16-bit tiles: q (block_m × D), O's staging buffer as much unless
    o_direct, the ring's k and v tiles (2 × slots × block_n × D)."""
    rows = plan.block_m * (1 if plan.o_direct else 2)
    return 2 * D * (rows + 2 * plan.num_stages * plan.block_n)


def sm90_ws_eligible(p: Problem) -> bool:
    """The Gluon kernel can run: 16-bit inputs that TMA can copy, a head dim it has a table row for."""
    return p.tma and p.dtype in ("float16", "bfloat16") and p.D in SM90_WS_FORWARD


def _forward_sm90_ws(p: Problem) -> ForwardPlan:
    bm, bn, w, st = SM90_WS_FORWARD[p.D]
    return ForwardPlan("sm90", bm, bn, w, SM90_WS_BANDED_STAGES.get(p.D, st) if p.banded else st)


def _sm90_ws_default(p: Problem, target: Target) -> ForwardPlan | None:
    """The Gluon kernel's default plan for ``p``, or None where the tl.dot kernel is the default."""
    if not sm90_ws_eligible(p):
        return None
    if p.D == 64 and p.varlen:
        return None
    plan = dataclasses.replace(_forward_sm90_ws(p), fold=p.D in SM90_WS_FOLD)
    if p.D in SM90_WS_PERSISTENT and not p.varlen and not (p.D == 128 and p.banded
                                                           and p.Sk > SM90_WS_PERSISTENT_BANDED_SK):
        plan = dataclasses.replace(plan, programs=target.sm_count, num_stages=SM90_WS_FORWARD[p.D][3],
                                   pairs=p.banded)
    elif p.D in SM90_WS_PERSISTENT_BANDED_OD and p.banded and not p.varlen:
        plan = dataclasses.replace(plan, programs=target.sm_count, fold=True, o_direct=True, pairs=True)
    return plan


def _forward_sm90(p: Problem, target: Target) -> ForwardPlan:
    ws = _sm90_ws_default(p, target)
    if ws is not None:
        return ws
    bd = p.block_d
    bm, bn, w, s = SM90_FORWARD.get(bd, SM90_FORWARD[256] if bd > 128 else SM90_FORWARD[64])
    if p.dtype == "float32":          # fp32 tiles take twice the shared memory
        bn, s = min(bn, 64), 2
    return ForwardPlan("triton", bm, bn, w, s)


def _forward_portable(p: Problem, target: Target) -> ForwardPlan:
    if target.interpret:
        return ForwardPlan("triton", 16, 16, 1, 1, dot_f32=p.dtype == "bfloat16")
    bn = 32 if p.block_d > 128 or p.dtype == "float32" else 64
    return ForwardPlan("triton", 64, bn, 4, 2)


def plan_forward(p: Problem, target: Target, knobs: Knobs = Knobs()) -> ForwardPlan:
    """The forward's launch configuration. ``Knobs(forward={"kernel": "sm90"})`` asks for the Gluon kernel (its
    table row, then the other knobs; ``"programs": -1`` makes its grid persistent, one program per SM); a problem or
    target it cannot run raises."""
    over = dict(knobs.forward)
    if over.get("kernel") == "sm90":
        if not (target.sm90 and sm90_ws_eligible(p)):
            raise ValueError("attention: the sm90 forward needs a Hopper GPU, float16 / bfloat16 q, k, v that TMA can "
                             f"copy and D in {sorted(SM90_WS_FORWARD)}; got {p} on arch {target.arch}")
        plan = _forward_sm90_ws(p)
    else:
        plan = _forward_sm90(p, target) if target.sm90 else _forward_portable(p, target)
    plan = dataclasses.replace(plan, **over)
    if plan.programs < 0:
        plan = dataclasses.replace(plan, programs=target.sm_count)
    if plan.programs and (plan.kernel != "sm90" or p.varlen):
        raise ValueError(f"attention: a persistent forward grid (programs = {plan.programs}) runs the sm90 kernel on "
                         f"dense [B, H, S, D] inputs only; got kernel {plan.kernel!r}, varlen = {p.varlen}")
    if (plan.pairs or plan.o_direct) and not plan.programs:
        raise ValueError("attention: pairs / o_direct are options of the persistent forward grid (programs != 0); "
                         f"got {plan}")
    if plan.programs and sm90_persistent_shared(p.D, plan) > SM90_SHARED - SM90_BARRIERS:
        raise ValueError(f"attention: the persistent forward's tiles take {sm90_persistent_shared(p.D, plan)} bytes "
                         f"of shared memory at D = {p.D}, more than {SM90_SHARED - SM90_BARRIERS}: fewer ring slots "
                         f"(num_stages) or o_direct (O from registers, no staging buffer); got {plan}")
    return plan


# ---- the backward -----------------------------------------------------------------------------------------
# (block_m, block_n, num_warps, num_stages) of the dK/dV kernel, then the same four of the dQ kernel
# Causal / windowed, D = 128, no GQA: one kernel, dQ added with fp32 atomics (5 matmuls, not 7). H200, bf16
# (tools/probe_attnbwd.py at c2cac02): 334 / 386 / 363 / 237 TFLOP/s at (4, 32, 4096) / (1, 32, 16384) / (2, 32, 8192) /
# (16, 32, 1024) against 321 / 349 / 336 / 239 for the split; without a band the split stays ahead (395 vs 377 at
# (4, 32, 4096)); with GQA the atomic kernel spills (its group loop), not measured. The atomics' order varies
# from run to run (dQ's last bits do): under torch.use_deterministic_algorithms(True) the split runs.
SM90_BACKWARD_BANDED = dict(dq_atomic=True, block_m=64, block_n=128, num_warps=8, num_stages=3)
SM90_BACKWARD = {          # H200, bf16
    64: (64, 64, 4, 2, 64, 64, 4, 2),
    128: (64, 64, 4, 2, 64, 64, 4, 2),
    256: (32, 64, 4, 1, 64, 32, 4, 1),
}


# The Gluon kernel (kernels/bwd_sm90.py): (query rows per step, keys per program, num_warps, Q / dO ring slots) by
# head dim. Shared memory at D = 128: K, V (2 × 32 KB), the ring (slots × 32 KB), Pᵀ (16 KB) and two dSᵀ tiles
# (32 KB): 180 KB at two slots, 213 KB at three; dq_tma adds two fp32 dQ tiles (32 KB): 214 KB at two slots (three
# do not fit). Its default (H200, bf16, tools/probe_attnbwd_sm90.py at dbcd81a + attnbwd-sm90): lse and Δ staged
# by the producer (stage_rows) and dQ added by TMA reduce from shared memory (dq_tma): 473 / 404 TFLOP/s causal at
# 4 × 32 × 4096 × 128 against the split kernels' 387 / 334, 16 × 32 × 1024 368 / 252 against 323 / 236, GQA 32 / 8
# causal 413 against 315; D = 64 307 / 229 against 302 / 227.
# D = 256: 64 keys per program, the two warpgroups splitting them for S and dP and the head dim for dK, dV and dQ
# (FlashAttention-3's D = 256 tiles); K, V (64 KB), two slots of Q / dO (128 KB), two of Pᵀ and dSᵀ (32 KB): 225 KB,
# so dQ's TMA reduce goes through the drained Q / dO slot (dq_slot, below). D = 64: 128 query rows per step
# (with dq_tma: 226 KB). tools/probe_attnbwd3.py
# at b4fb837, TFLOP/s against the previous default (cuDNN): D = 256 2 × 16 × 4096 186 / 176 causal against the
# tl.dot kernels' 114 / 74 (380 / 342); D = 64 8 × 16 × 2048 343 / 252 against 302 / 228 at 64 rows (406 / 313),
# 4 × 32 × 4096 371 against 339 (435). At 64 rows 3 or 4 slots gave 310 / 309 against 302; at 128 rows a third
# slot does not fit beside dq_tma's tiles (kernels/bwd_sm90.TILES).
# tools/probe_attnbwd4.py at e46b1d2 (TFLOP/s against the default then, cuDNN in brackets): D = 256 with dQ by TMA
# reduce through the drained Q / dO slot (dq_slot) 2 × 16 × 4096 326 / 290 causal against 184 / 176 (376 / 340),
# causal with programs longest first in groups of 16 (batch, kv head)s 304; causal D = 64 with dQ by query rows
# (dq_rows) 8 × 16 × 2048 264 against 251 (313), non-causal 338 against 343 (kept off); causal GQA 4 × 32 / 8 × 4096
# × 128 with programs longest first over all (batch, kv head)s 461 against 421 (450): a kv head's program covers
# 4 query heads, so the causal tail is long; MHA causal measured 319 against 413 there (L2 reuse across a head's
# key blocks lost) and stays head by head. dq_slot at D = 128 (room for a third slot) measured 0.87-0.96x.
SM90_WS_LPT = {128: 132, 256: 16}
SM90_WS_PERSISTENT_MAX_S = 2048     # sm90_bwd_persistent
SM90_WS_BACKWARD = {
    64: (128, 128, 4, 2),
    128: (64, 128, 4, 2),
    256: (64, 64, 4, 2),
}


def sm90_bwd_shared(D: int, plan: BackwardPlan) -> int:
    """Bytes of the Gluon backward's tiles (kernels/bwd_sm90._shared): K and V (block_n keys × D each), the Q / dO ring
    (2 × slots × block_m × D), dSᵀ (two tiles of block_n × block_m where both warpgroups write it: D = 128, 256,
    dq_rows; else one), Pᵀ (two at D = 256, else one), the lse / Δ rows (fp32, 2 × slots × block_m) and with
    dq_tma but not dq_slot two fp32 dQ partial tiles (block_m, halved by dq_rows, × D, halved at D >= 128)."""
    bm, keys = plan.block_m, plan.block_n
    two_ds = D in (128, 256) or plan.dq_rows
    tiles = 2 * (2 * keys * D + 2 * plan.num_stages * bm * D + (2 if two_ds else 1) * keys * bm
                 + (2 if D == 256 else 1) * keys * bm)
    tiles += 4 * 2 * plan.num_stages * bm
    if plan.dq_tma and not plan.dq_slot:
        tiles += 4 * 2 * (bm // 2 if plan.dq_rows else bm) * (D // 2 if D >= 128 else D)
    return tiles


def sm90_bwd_eligible(p: Problem) -> bool:
    """The Gluon backward can run: 16-bit inputs TMA can copy, a head dim of its table, no softcap (its derivative
    is not in the kernel), no deterministic mode (dQ's partial tiles are added in an order that varies)."""
    return (p.tma and p.dtype in ("float16", "bfloat16") and p.D in SM90_WS_BACKWARD and not p.softcap
            and not p.deterministic)


def _backward_sm90_ws(p: Problem) -> BackwardPlan:
    """The table row, lse / Δ staged by the producer (stage_rows), dQ by TMA reduce (dq_tma); at D = 256 through
    the drained Q / dO slot (dq_slot); causal D = 64 with dQ split by query rows (dq_rows); causal programs launched
    longest first where they are long (SM90_WS_LPT); short sequences on the persistent grid (pairs when causal)."""
    bm, bn, w, st = SM90_WS_BACKWARD[p.D]
    short = sm90_bwd_persistent(p)
    return BackwardPlan("sm90", bm, bn, w, st, bm, bn, w, st, dq_atomic=True, stage_rows=True, dq_tma=True,
                        dq_slot=p.D == 256, dq_rows=p.D == 64 and p.banded,
                        lpt_heads=_sm90_lpt_heads(p), programs=-1 if short else 0, pairs=short and p.causal)


def sm90_bwd_persistent(p: Problem) -> bool:
    """The persistent grid by default (``programs`` = the SM count): dense D = 64 / 128 with at most
    SM90_WS_PERSISTENT_MAX_S query rows and keys, where a program per key block spends a large share of its time
    on set-up and dK / dV epilogue (H200, tools/probe_bwdpers.py: 16 x 32 x 1024 x 128 causal 281 against 251
    TFLOP/s with pairs, non-causal 402 against 373; 8 x 16 x 2048 x 64 causal 293 against 266, non-causal 369
    against 345; at 4096 keys causal pairs 415 against 413, GQA 449 against 455: left per program)."""
    return not p.varlen and p.D in (64, 128) and max(p.Sq, p.Sk) <= SM90_WS_PERSISTENT_MAX_S


def _sm90_lpt_heads(p: Problem) -> int:
    """lpt_heads by default: causal / windowed D = 256, and GQA at D = 128 (a kv head's program covers the group's
    query heads: long programs, a long causal tail); 0 (head by head) elsewhere."""
    if not p.banded:
        return 0
    if p.D == 256:
        return SM90_WS_LPT[256]
    if p.D == 128 and p.group > 1:
        return SM90_WS_LPT[128]
    return 0


def backward_tl(p: Problem, target: Target) -> BackwardPlan:
    """The tl.dot backward's configuration (the default wherever the Gluon kernel is not: non-Hopper GPUs, fp32,
    softcap, D outside its table, deterministic mode, scale = 0)."""
    if target.interpret:
        return BackwardPlan("triton", 16, 16, 1, 1, 16, 16, 1, 1, dot_f32=p.dtype == "bfloat16")
    if target.sm90:
        bd = p.block_d
        cfg = SM90_BACKWARD.get(bd, SM90_BACKWARD[256] if bd > 128 else SM90_BACKWARD[64])
        if p.dtype == "float32":
            cfg = (32, 64, 4, 1, 64, 32, 4, 1)
        plan = BackwardPlan("triton", *cfg)
        if p.banded and p.group == 1 and p.D == 128 and p.dtype != "float32" and not p.deterministic:
            plan = dataclasses.replace(plan, **SM90_BACKWARD_BANDED)
        return plan
    small = p.block_d > 128 or p.dtype == "float32"
    return BackwardPlan("triton", 32, 32 if small else 64, 4, 1, 32 if small else 64, 32, 4, 1)


def plan_backward(p: Problem, target: Target, knobs: Knobs = Knobs()) -> BackwardPlan:
    """The backward's launch configuration: the Gluon kernel on Hopper where it can run, else the tl.dot kernels.
    ``Knobs(backward={"kernel": "sm90"})`` asks for the Gluon kernel (its table row, then the other knobs; a problem
    or target it cannot run raises), ``{"kernel": "triton"}`` for the tl.dot kernels."""
    over = dict(knobs.backward)
    kernel = over.get("kernel")
    if kernel == "sm90" and not (target.sm90 and sm90_bwd_eligible(p)):
        raise ValueError("attention: the sm90 backward needs a Hopper GPU, float16 / bfloat16 q, k, v and dO that "
                         f"TMA can copy, D in {sorted(SM90_WS_BACKWARD)}, no softcap and no deterministic mode; "
                         f"got {p} on arch {target.arch}")
    if kernel == "sm90" or (kernel is None and target.sm90 and sm90_bwd_eligible(p)):
        plan = _backward_sm90_ws(p)
    else:
        plan = backward_tl(p, target)
    plan = dataclasses.replace(plan, **over)
    # dq_rows, dq_slot and the persistent grid were measured (and fit in shared memory) at the table's rows and
    # slots with dq_tma: a knob that names one of those fields turns them off unless it names them too; without a
    # persistent grid, no pairs
    if any(f in over for f in ("block_m", "num_stages", "dq_tma")):
        plan = dataclasses.replace(plan, **{f: False for f in ("dq_rows", "dq_slot", "pairs") if f not in over})
        if "programs" not in over:
            plan = dataclasses.replace(plan, programs=0)
    if not plan.programs and "pairs" not in over:
        plan = dataclasses.replace(plan, pairs=False)
    if (plan.dq_slot or plan.lpt_heads or plan.dq_rows) and plan.kernel != "sm90":
        raise ValueError(f"attention: dq_slot / lpt_heads / dq_rows are options of the sm90 backward; got {plan}")
    if plan.producer_regs != 32 and (plan.kernel != "sm90" or plan.producer_regs not in (24, 32, 40, 48)):
        raise ValueError(f"attention: producer_regs is the sm90 backward's producer register count, one of 24, 32, "
                         f"40, 48; got {plan.producer_regs} with kernel {plan.kernel!r}")
    if plan.dq_rows and (p.D != 64 or plan.block_m != 128):
        raise ValueError(f"attention: dq_rows splits dQ's 128 query rows per step in two at D = 64 (D = 128 / 256 "
                         f"split it by columns); got D = {p.D}, block_m = {plan.block_m}")
    if plan.dq_slot and not (plan.dq_tma and (p.D in (128, 256) or plan.dq_rows)):
        raise ValueError(f"attention: dq_slot reduces dQ by TMA (dq_tma) through the Q / dO slot, dQ split in two "
                         f"(D = 128 / 256, or dq_rows at D = 64); got D = {p.D}, {plan}")
    if plan.kernel == "sm90" and p.D == 256 and plan.dq_tma and not (plan.dq_slot or plan.num_stages == 1):
        raise ValueError("attention: the sm90 backward at D = 256 has room for dQ tiles of their own beside one ring "
                         "slot only: dq_tma needs dq_slot or num_stages = 1")
    return _backward_persistent(p, target, plan, over)


def _backward_persistent(p: Problem, target: Target, plan: BackwardPlan, over: dict) -> BackwardPlan:
    """The persistent grid's checks: the sm90 kernel on dense inputs, its tiles within shared memory; pairs only
    there, and in place of lpt_heads (a default lpt_heads falls away under pairs; both named raise)."""
    if plan.programs < 0:
        plan = dataclasses.replace(plan, programs=target.sm_count)
    if plan.programs and (plan.kernel != "sm90" or p.varlen):
        raise ValueError(f"attention: a persistent backward grid (programs = {plan.programs}) runs the sm90 kernel on "
                         f"dense [B, H, S, D] inputs only; got kernel {plan.kernel!r}, varlen = {p.varlen}")
    if plan.pairs and not plan.programs:
        raise ValueError(f"attention: pairs is an option of the persistent backward grid (programs != 0); got {plan}")
    if plan.pairs and plan.lpt_heads:
        if "lpt_heads" in over:
            raise ValueError("attention: the persistent backward's pairs (balanced units) and lpt_heads (longest "
                             f"first) are two orders of its units, not both; got {plan}")
        plan = dataclasses.replace(plan, lpt_heads=0)
    if plan.programs and sm90_bwd_shared(p.D, plan) > SM90_SHARED - SM90_BARRIERS:
        raise ValueError(f"attention: the persistent backward's tiles take {sm90_bwd_shared(p.D, plan)} bytes of "
                         f"shared memory at D = {p.D}, more than {SM90_SHARED - SM90_BARRIERS}: fewer ring slots "
                         f"(num_stages), dq_slot or no dq_tma; got programs = {plan.programs}, {plan}")
    return plan


def plan_attention(p: Problem, target: Target, backend: str, knobs: Knobs = Knobs()) -> AttentionPlan:
    if backend == "torch":
        return AttentionPlan("torch", p, None, None)
    return AttentionPlan("triton", p, plan_forward(p, target, knobs), plan_backward(p, target, knobs),
                         decode_dispatch(p))
