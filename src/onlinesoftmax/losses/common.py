"""The cross-entropy kernels' elementwise pieces (Triton; the Gluon kernel of ``smem.py`` calls them too), in the
notation of ``kernels.py``'s docstring: softcap, the target's (z_t, w_t), a row's loss, the gradient of a tile and
the reduction's coefficients."""

from __future__ import annotations

import triton
import triton.language as tl

from .._triton.online import _exp, _lse


@triton.jit
def _softcapped(x, softcap, HAS_SOFTCAP: tl.constexpr, FAST: tl.constexpr):
    """c·tanh(x / c) as c·(1 − 2 / (e^(2x/c) + 1)): ±c at ±inf, NaN kept."""
    if HAS_SOFTCAP:
        e = _exp(x * (2.0 / softcap), FAST)
        return softcap * (1.0 - 2.0 / (e + 1.0))
    else:
        return x


@triton.jit
def _ce_lse(m, d):
    """The row's lse for the loss: m + log d, but NaN where a logit is +inf (m = +inf), as torch's log_softmax
    gives (inf − inf); the loss and every p_j = e^(z_j − lse) of that row are then NaN, not inf and a lone −1."""
    return tl.where(m == float("inf"), float("nan"), _lse(m, d))


@triton.jit
def _target_terms(X_row, W, t, V, softcap, ignore_index,
                  HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FAST: tl.constexpr):
    """(z_t, w_t) of the row; NaN for a target outside [0, V) that is not ignore_index (the loss is then NaN)."""
    ok = (t >= 0) & (t < V)
    tc = tl.where(ok, t, 0)
    zt = _softcapped(tl.load(X_row + tc).to(tl.float32), softcap, HAS_SOFTCAP, FAST)
    zt = tl.where(ok, zt, float("nan"))
    if HAS_WEIGHT:
        wt = tl.where(ok, tl.load(W + tc).to(tl.float32), float("nan"))
    else:
        wt = tl.where(ok, 1.0, float("nan"))
    return zt, wt


@triton.jit
def _row_loss(lse, zt, wt, sz, Wsum, eps, V, HAS_SMOOTH: tl.constexpr):
    """(1−ε)·w_t·(lse − z_t) + (ε/V)·(W·lse − Σ w_j z_j). The smoothing term is left out when ε = 0, so a −inf
    logit off the target gives a finite loss (its term would be 0·inf)."""
    if HAS_SMOOTH:
        return (1.0 - eps) * wt * (lse - zt) + (eps / V) * (Wsum * lse - sz)
    else:
        return wt * (lse - zt)


@triton.jit
def _grad_tile(p, z, x_is_col_t, w, A, s_ce, wt, eps, V, softcap, g_row,
               HAS_SMOOTH: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_G: tl.constexpr):
    """∂loss/∂x of one tile from p_j = e^(z_j − lse) (see the module docstring)."""
    g = p * A
    if HAS_SMOOTH:
        g -= s_ce * (eps / V) * w
        g -= tl.where(x_is_col_t, s_ce * (1.0 - eps) * wt, 0.0)
    else:
        g -= tl.where(x_is_col_t, s_ce * wt, 0.0)
    if HAS_SOFTCAP:
        q = z / softcap
        g = g * (1.0 - q * q)                     # d(c·tanh(x/c))/dx = 1 − tanh²
    if HAS_G:
        g = g * g_row
    return g


@triton.jit
def _coefs(COEF, lse, wt, eps, V, z_loss, HAS_SMOOTH: tl.constexpr, HAS_Z: tl.constexpr):
    """(s, A, W): the reduction's CE scale, the factor of p_j in ∂loss/∂z_j, and W = Σ w_j."""
    s_ce = tl.load(COEF)
    Wsum = tl.load(COEF + 2)
    if HAS_SMOOTH:
        A = s_ce * ((1.0 - eps) * wt + (eps / V) * Wsum)
    else:
        A = s_ce * wt
    if HAS_Z:
        A += 2.0 * z_loss * tl.load(COEF + 1) * lse
    return s_ce, A, Wsum
