"""The (o, lse) ⊕: over the NUM_SPLITS partial states of each row (the split-KV kernel's second launch), and the
public two-state merge (``merge_attention_states``).

For states (o_s, lse_s) of disjoint key sets: lse = log Σ_s e^(lse_s), o = Σ_s o_s·e^(lse_s − lse). With
m = max_s lse_s, w_s = e^(lse_s − m) (0 where lse_s = −inf), W = Σ w_s: lse = m + log W, o = Σ w_s·o_s / W.
An empty state (lse −inf) weighs exactly 0 and its o is never multiplied (it may hold anything); the only
non-empty one comes back with weight 1, exactly; no state at all gives o = 0, lse = −inf.

Memory traffic: each partial o and lse read once, o and lse written once (fp32 math).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..._triton.online import _alpha, _exp, _lse, _shift
from .split_kv import _tile_counts


@triton.jit
def _fold(m, W, acc, ls, o_s, FAST: tl.constexpr):
    """The running ⊕ (m, W, acc) of a row block moved over BLOCK_K more states at once: lse ls [BLOCK_R, BLOCK_K]
    (−inf: empty), o o_s [BLOCK_R, BLOCK_K, BLOCK_D] (anything where empty). m' = max(m, max_k ls_k),
    W' = W·e^(m − m') + Σ_k w_k, acc' = acc·e^(m − m') + Σ_k w_k·o_k with w_k = e^(ls_k − m'); a lone state
    weighs e^0 = 1 exactly."""
    m_new = tl.maximum(m, tl.max(ls, axis=1))
    alpha = _alpha(m, m_new)
    w = _exp(ls - _shift(m_new)[:, None], FAST)                     # 0 where ls = −inf
    W = W * alpha + tl.sum(w, axis=1)
    wo = tl.where((w > 0.0)[:, :, None], w[:, :, None] * o_s, 0.0)  # an empty state's o never multiplied
    return m_new, W, acc * alpha[:, None] + tl.sum(wo, axis=1)


@triton.jit
def merge_splits_kernel(PART_O, PART_LSE, O, LSE, R, Hq, Sq, D, NUM_SPLITS,
                        stride_ob, stride_oh, stride_os, stride_od,
                        BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, FAST: tl.constexpr):
    """Rows r = (b·H + h)·Sq + i of PART_O [R, NUM_SPLITS, D] fp32 / PART_LSE [R, NUM_SPLITS] into O [B, H, Sq, D]
    (any strides, its dtype) and LSE [R] fp32, BLOCK_S splits per step: their lse and o loaded together (one
    round trip to memory per step, none waiting on another)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = rows < R
    rows64 = rows.to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    W = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for s0 in range(0, NUM_SPLITS, BLOCK_S):
        slot = rows64[:, None] * NUM_SPLITS + (s0 + offs_s)[None, :]
        ok = r_ok[:, None] & (s0 + offs_s < NUM_SPLITS)[None, :]
        ls = tl.load(PART_LSE + slot, mask=ok, other=float("-inf"))
        o_s = tl.load(PART_O + slot[:, :, None] * D + offs_d[None, None, :], mask=ok[:, :, None] & d_ok[None, None, :],
                      other=0.0)
        m, W, acc = _fold(m, W, acc, ls, o_s, FAST)
    bh = rows64 // Sq
    i = rows64 % Sq
    o_ptrs = (O + (bh // Hq) * stride_ob + (bh % Hq) * stride_oh + i * stride_os)[:, None] + offs_d[None, :] * stride_od
    tl.store(o_ptrs, (acc / tl.where(W == 0.0, 1.0, W)[:, None]).to(O.dtype.element_ty),
             mask=r_ok[:, None] & d_ok[None, :])
    tl.store(LSE + rows64, _lse(m, W), mask=r_ok)


@triton.jit
def merge_two_kernel(OA, LA, OB, LB, O, LSE, N, D,
                     stride_ar, stride_ad, stride_la, stride_br, stride_bd, stride_lb,
                     BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, FAST: tl.constexpr):
    """(OA, LA) ⊕ (OB, LB) for N rows of D: o rows of any strides, lse of any stride; O [N, D], LSE [N]."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = rows < N
    rows64 = rows.to(tl.int64)
    la = tl.load(LA + rows64 * stride_la, mask=r_ok, other=float("-inf")).to(tl.float32)
    lb = tl.load(LB + rows64 * stride_lb, mask=r_ok, other=float("-inf")).to(tl.float32)
    m = tl.maximum(la, lb)
    ms = _shift(m)
    wa = tl.where(la == float("-inf"), 0.0, _exp(la - ms, FAST))
    wb = tl.where(lb == float("-inf"), 0.0, _exp(lb - ms, FAST))
    W = wa + wb
    inv = 1.0 / tl.where(W == 0.0, 1.0, W)
    wa = wa * inv           # one side empty: W = e^0 = 1, the other side's weight exactly 1
    wb = wb * inv
    offs_d = tl.arange(0, BLOCK_D)
    for d0 in range(0, D, BLOCK_D):
        cols = d0 + offs_d
        c_ok = r_ok[:, None] & (cols < D)[None, :]
        oa = tl.load(OA + rows64[:, None] * stride_ar + cols[None, :] * stride_ad, mask=c_ok & (wa > 0.0)[:, None],
                     other=0.0).to(tl.float32)
        ob = tl.load(OB + rows64[:, None] * stride_br + cols[None, :] * stride_bd, mask=c_ok & (wb > 0.0)[:, None],
                     other=0.0).to(tl.float32)
        o = wa[:, None] * oa + wb[:, None] * ob
        tl.store(O + rows64[:, None] * D + cols[None, :], o.to(O.dtype.element_ty), mask=c_ok)
    tl.store(LSE + rows64, ms + tl.log(W), mask=r_ok)


@triton.jit
def merge_segments_kernel(PART_O, PART_LSE, SEQLENS, O, LSE, B, Hq, Hkv, Sq, D, CHUNKS, S_MAX, left, right,
                          stride_ob, stride_oh, stride_os, stride_od,
                          WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_B: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, FAST: tl.constexpr,
                          CROSS: tl.constexpr = False, BLOCK_K: tl.constexpr = 4):
    """Rows r = (b·H + h)·Sq + i of the balanced kernel's segments into O [B, H, Sq, D] (any strides) and LSE
    [B·H·Sq]: program (b, j) takes rows h·Sq + i in [j·BLOCK_R, (j + 1)·BLOCK_R) of sequence b.

    Sequence b owns tiles [e_b, e_b + n_b) of the line of T tiles; the chunks c = chunk(e_b) .. chunk(e_b + n_b
    − 1), chunk(x) = ((x + 1)·CHUNKS − 1) // T (the last c with c·T // CHUNKS <= x), each nonempty one wrote its
    segment of b at slot c + b of PART_O [H·Sq, CHUNKS + B − 1, D] / PART_LSE. They are ⊕-merged BLOCK_K at a time
    into a running (m, W, o) (``_fold``); one segment comes back exactly (weight e^0 = 1); a sequence without a key
    gives o = 0, lse = −inf. CROSS: the line of all Hkv·T tiles, head-major (query head h's kv head h // (Hq / Hkv)
    first at tile hkv·T)."""
    b = tl.program_id(0)
    hi = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)         # h·Sq + i
    r_ok = hi < Hq * Sq
    hi_r = hi.to(tl.int64)
    rows64 = b.to(tl.int64) * Hq * Sq + hi_r
    nslots = CHUNKS + B - 1
    # 1. the sequence's first tile e_b and tile count n_b on the line (one sequence per program), then each row's
    #    chunks
    offs_b, n, incl = _tile_counts(SEQLENS, B, Sq, S_MAX, left, right, WINDOW_LEFT, WINDOW_RIGHT, BLOCK_N, BLOCK_B)
    T = tl.maximum(tl.sum(n, 0), 1).to(tl.int64)     # T = 0: no row has a segment (count 0)
    e_b = tl.sum(tl.where(offs_b < b, n, 0), 0).to(tl.int64) + hi_r * 0
    n_b = tl.sum(tl.where(offs_b == b, n, 0), 0).to(tl.int64)
    if CROSS:
        e_b += (hi_r // Sq) // (Hq // Hkv) * T
        T = T * Hkv
    c_first = ((e_b + 1) * CHUNKS - 1) // T
    c_last = ((e_b + n_b) * CHUNKS - 1) // T
    count = tl.where(r_ok & (n_b > 0), c_last - c_first + 1, 0)
    slot0 = hi_r * nslots + c_first + b
    # 2. the running ⊕ over the row's segments, BLOCK_K at a time (lse and o loaded together)
    offs_k = tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    W = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for k0 in range(0, tl.max(count, 0), BLOCK_K):
        k = k0 + offs_k[None, :]
        c = c_first[:, None] + k
        ok = (k < count[:, None]) & (c * T // CHUNKS < (c + 1) * T // CHUNKS)   # chunks are empty where T < CHUNKS
        slot = slot0[:, None] + k
        ls = tl.load(PART_LSE + slot, mask=ok, other=float("-inf"))
        o_s = tl.load(PART_O + slot[:, :, None] * D + offs_d[None, None, :], mask=ok[:, :, None] & d_ok[None, None, :],
                      other=0.0)
        m, W, acc = _fold(m, W, acc, ls, o_s, FAST)
    bh = rows64 // Sq
    i = rows64 % Sq
    o_ptrs = (O + (bh // Hq) * stride_ob + (bh % Hq) * stride_oh + i * stride_os)[:, None] + offs_d[None, :] * stride_od
    tl.store(o_ptrs, (acc / tl.where(W == 0.0, 1.0, W)[:, None]).to(O.dtype.element_ty),
             mask=r_ok[:, None] & d_ok[None, :])
    tl.store(LSE + rows64, _lse(m, W), mask=r_ok)
