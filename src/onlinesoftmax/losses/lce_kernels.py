"""The linear cross-entropy's vocab-chunk kernels (scheme ``"vocab"``, ``linear_cross_entropy.py``).

The logits tile S_c = hidden[block] @ W_cᵀ (+ b_c) holds the classes [v0, v0 + VC) of a block of tokens; cuBLAS
writes it, these kernels read it (one program per token row, BLOCK classes at a time), in the notation of
``kernels.py`` (z = softcap(S), the running state (m, d) of a row):

* ``lce_fold_kernel`` (sweep 1): (m, d) ⊕= the chunk's state, Σ z for smoothing, and z_t where the target falls
  in the chunk. The state lives in fp32 [rows] arrays between launches. Ignored rows read nothing.
* ``lce_grad_kernel`` (sweep 2): S_c is overwritten by dS_c,
  ∂loss/∂z_j = p_j·A − c_s − [j = t]·c_t,  p_j = e^(z_j − lse),
  with the row's factors A = g·(s + 2λ·s_z·lse), c_t = g·s·(1 − ε), c_s = g·s·ε/V taken on the host (g the
  per-token incoming gradient or 1), times 1 − (z_j/c)² under softcap. Ignored rows write zeros.

Traffic per chunk: the tile read once (fold), read and written once (gradient).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton.host import int_spec
from .._triton.launch import BoundKernel, cached, pow2
from .._triton.online import _exp
from .common import _softcapped
from .kernels import _fold_tile

GPU_BLOCK, GPU_WARPS = 4096, 8
INTERPRET_BLOCK = 32         # the interpreter's tests run the loop over several tiles and the ragged last one


@triton.jit
def lce_fold_kernel(S, stride_s, T, M, D, SZ, ZT, v0, VC, ignore_index, softcap,
                    BLOCK: tl.constexpr, HAS_SMOOTH: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FAST: tl.constexpr):
    row = tl.program_id(0)
    t = tl.load(T + row)
    if t != ignore_index:                         # ignored rows: nothing read
        S_row = S + row.to(tl.int64) * stride_s
        cols = tl.arange(0, BLOCK)
        m = tl.load(M + row)
        d = tl.load(D + row)
        sz = 0.0
        if HAS_SMOOTH:
            sz = tl.load(SZ + row)
        # (m, d) ⊕= the chunk's tiles (VC·bytes read)
        for start in range(0, VC, BLOCK):
            m, d, sz = _fold_tile(S_row, S, start, cols, VC, m, d, sz, softcap, "", False, HAS_SMOOTH, HAS_SOFTCAP,
                                  FAST)
        tl.store(M + row, m)
        tl.store(D + row, d)
        if HAS_SMOOTH:
            tl.store(SZ + row, sz)
        if (t >= v0) & (t < v0 + VC):             # z_t from the one chunk that holds the target
            tl.store(ZT + row, _softcapped(tl.load(S_row + (t - v0)).to(tl.float32), softcap, HAS_SOFTCAP, FAST))


@triton.jit
def lce_grad_kernel(S, stride_s, T, LSE, RA, RT, RS, v0, VC, ignore_index, softcap,
                    BLOCK: tl.constexpr, HAS_SMOOTH: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FAST: tl.constexpr):
    row = tl.program_id(0)
    t = tl.load(T + row)
    S_row = S + row.to(tl.int64) * stride_s
    cols = tl.arange(0, BLOCK)
    if t == ignore_index:                         # dS = 0, written, never read
        for start in range(0, VC, BLOCK):
            tl.store(S_row + start + cols, tl.zeros([BLOCK], S.dtype.element_ty), mask=start + cols < VC)
    else:
        lse = tl.load(LSE + row)
        A = tl.load(RA + row)
        c_t = tl.load(RT + row)
        c_s = 0.0
        if HAS_SMOOTH:
            c_s = tl.load(RS + row)
        # dS over S (VC·bytes read and written): every element is read before this program writes it
        for start in range(0, VC, BLOCK):
            mask = start + cols < VC
            z = _softcapped(tl.load(S_row + start + cols, mask=mask, other=0.0).to(tl.float32), softcap,
                            HAS_SOFTCAP, FAST)
            g = _exp(z - lse, FAST) * A - tl.where(v0 + start + cols == t, c_t, 0.0)
            if HAS_SMOOTH:
                g -= c_s
            if HAS_SOFTCAP:
                q = z / softcap
                g = g * (1.0 - q * q)             # d(c·tanh(x/c))/dx = 1 − tanh²
            tl.store(S_row + start + cols, g.to(S.dtype.element_ty), mask=mask)


def _meta(vc: int, fast: bool, smooth: bool, softcap: bool) -> dict:
    block = min(pow2(vc), GPU_BLOCK if fast else INTERPRET_BLOCK)
    return dict(BLOCK=block, HAS_SMOOTH=smooth, HAS_SOFTCAP=softcap, FAST=int(fast),
                num_warps=GPU_WARPS if fast and block >= 2048 else 4)


@cached
def _bound_fold(n: int, vc: int, fast: bool, smooth: bool, softcap: bool, spec: tuple) -> BoundKernel:
    return BoundKernel(lce_fold_kernel, (n,), _meta(vc, fast, smooth, softcap))


@cached
def _bound_grad(n: int, vc: int, fast: bool, smooth: bool, softcap: bool, spec: tuple) -> BoundKernel:
    return BoundKernel(lce_grad_kernel, (n,), _meta(vc, fast, smooth, softcap))


def fold(s: torch.Tensor, t: torch.Tensor, state: torch.Tensor, v0: int, ignore_index: int, smooth: bool,
         softcap: float | None, fast: bool) -> None:
    """Sweep 1 over the tile ``s`` [n, VC] of classes [v0, v0 + VC): ``state`` = fp32 [4, n] rows (m, d, Σz, z_t)
    updated in place."""
    n, vc = s.shape
    cap = float(softcap) if softcap is not None else 1.0
    spec = int_spec(s.stride(0), v0, vc, ignore_index)
    m, d, sz, zt = state[0], state[1], state[2], state[3]
    _bound_fold(n, vc, fast, smooth, softcap is not None, spec)(
        (s, s.stride(0), t, m, d, sz, zt, v0, vc, ignore_index, cap), (s, t, m, d, sz, zt), s.device)


def grad_(s: torch.Tensor, t: torch.Tensor, lse: torch.Tensor, rows: torch.Tensor, v0: int, ignore_index: int,
          smooth: bool, softcap: float | None, fast: bool) -> None:
    """Sweep 2: the tile ``s`` overwritten by dS; ``rows`` = fp32 [3, n] factors (A, c_t, c_s)."""
    n, vc = s.shape
    cap = float(softcap) if softcap is not None else 1.0
    spec = int_spec(s.stride(0), v0, vc, ignore_index)
    _bound_grad(n, vc, fast, smooth, softcap is not None, spec)(
        (s, s.stride(0), t, lse, rows[0], rows[1], rows[2], v0, vc, ignore_index, cap),
        (s, t, lse, rows[0], rows[1], rows[2]), s.device)
