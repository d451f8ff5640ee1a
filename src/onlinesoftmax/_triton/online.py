"""Triton building blocks every op family shares, in the paper's notation (Milakov & Gimelshein, arXiv 1805.02867).

The online normalizer state of a set of values is ``(m, d)``: ``m = max_j x_j``, ``d = sum_j e^(x_j - m)``; two
states merge with ⊕: ``m = max(m1, m2)``, ``d = d1·e^(m1 - m) + d2·e^(m2 - m)``. Here: the exponential (``_exp``),
the state of a tile (``_state``), the rescale factor of ⊕ (``_alpha``), ⊕ of a row's published states
(``_merge_row``), ``lse = m + log d`` (``_lse``), the row view's offsets, the per-row barrier in global memory
that lets the programs sharing a row wait for each other's states, and bf16 packing (two bf16 in one int32 word).
The shared-memory (Gluon) blocks are in ``smem.py``.

This module imports nothing from the op families.
"""

from __future__ import annotations

import triton
import triton.language as tl

# _exp: log2 e (rounded to fp32 in the kernels: L), ln 2 in two fp32 parts, and the clamp of z
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
LN2_HI = tl.constexpr(0.6931471824645996)       # ln 2 rounded to fp32
LN2_LO = tl.constexpr(-1.9046542121259336e-09)  # ln 2 - LN2_HI, as fp32
CLAMP_Z = tl.constexpr(-104.0)                  # e^-104 = 2^-150: below the smallest ftz result


@triton.jit
def _shift(m):
    """What d and e are taken relative to: m, or 0 where m = ±inf."""
    return tl.where((m == float("inf")) | (m == float("-inf")), 0.0, m)


@triton.jit
def _exp(z, FAST: tl.constexpr):
    """e^z. FAST (the GPU, fp32): 2^(z·log2 e) by one ex2.approx.ftz.f32 (MUFU.EX2); results below 2^-126 flush
    to 0 (no term that small moves d >= 1, and torch's y there is below 1.2e-38). tl.exp's non-ftz ex2 costs a
    compare and two predicated multiplies more per element. The interpreter, and fp64, take tl.exp.

    FAST == 2 (fp32 outputs of softmax): t = z·L with L = log2 e rounded to fp32 errs by the product's rounding
    and by z·(log2 e - L), so 2^t alone is off by up to 3.8e-6 (relative) for z in [-87, 0], several fp32 ulps of y.
    Cody-Waite recovers the remainder: u = z - t·ln 2 in two FMAs (ln 2 = LN2_HI + LN2_LO) and e^z = 2^t·(1 + u),
    within 1 fp32 eps plus the hardware ex2's ~2 ulp. z is clamped at CLAMP_Z first (NaN kept), so z = -inf gives
    2^-150, flushed to 0, where u would be -inf + inf. Cost: three FMAs and a max per element."""
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
def _merge_row(PART_M, PART_D, row, C, k):
    """(m, d) = ⊕ of the C partial states row ``row``'s programs published (``k = arange(pow2 >= C)``, 1-D; in a
    Gluon kernel with its layout), read past the caches: the row barrier orders them. The scalar max broadcasts
    back without tl.expand_dims, which Gluon refuses on a 1-D reduction's scalar."""
    pm = tl.load(PART_M + row * C + k, mask=k < C, other=float("-inf"), volatile=True)
    pd = tl.load(PART_D + row * C + k, mask=k < C, other=0.0, volatile=True)
    m = tl.max(pm, axis=0)
    return m, tl.sum(pd * _alpha(pm, m), axis=0)


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
def _pack_bf16x2(lo, hi):
    """Both halves rounded to nearest even and packed into one word by one instruction."""
    return tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,r,r", [hi, lo], dtype=tl.int32,
                                     is_pure=True, pack=1)
