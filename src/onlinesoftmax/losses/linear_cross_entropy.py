"""``linear_cross_entropy``: ``cross_entropy(hidden @ weightᵀ + bias, target)`` without the [N, V] logits.

Tokens are taken ``chunk_tokens`` at a time (``plan.py``: as many as fit the logits-tile budget). Per chunk:

1. tile = hidden[chunk] @ weightᵀ (+ bias)                      (one GEMM into the one reused tile buffer)
2. the cross-entropy kernel reads the tile once for (m, d), the loss rows and lse, and writes dlogits over it
3. grad_hidden[chunk] = tile @ weight; grad_weight += tileᵀ @ hidden[chunk]; grad_bias += Σ_rows tile

so the forward does all three GEMMs (6·N·Hd·V FLOPs, nothing recomputed) and the backward only scales the three
gradients by the incoming dloss (no traffic when it is 1). Under ``reduction="none"`` the incoming gradient is
per token and enters grad_weight inside the sum: the forward then computes the loss alone and the backward runs
the loop again with the per-token scale folded into the kernel's dlogits.

Memory above the inputs and their gradients: the tile (``chunk_tokens × V`` in the logits' dtype), fp32 [N] loss
rows and lse, and an fp32 [V] bias-gradient accumulator. grad_weight accumulates in weight's dtype.

Scheme ``"vocab"`` (``LCEKnobs(scheme="vocab")``, ``plan.py``): a block of tokens against the vocabulary in chunks
of ``vocab_chunk`` classes, two sweeps (``_vocab_loop``): the lse first, then the gradients from recomputed
logits, so 4 GEMMs (8·N·Hd·V FLOPs), all of them cuBLAS at full size, and grad_weight written once per chunk.
"""

from __future__ import annotations

import math

import torch

from .._autocast import autocast_boundary
from .._checks import check_float_tensor
from ..backend import resolve_backend, transforms_active
from ..target import target_of
from .cross_entropy import (
    _check_common,
    _check_target_values,
    _kernels,
    _no_double_backward,
    _reduction_coefs,
    check_explain_extras,
    cross_entropy,
)
from .plan import CEKnobs, LCEKnobs, LCEPlan, LCEProblem, plan_linear_cross_entropy

__all__ = ["explain_linear_cross_entropy", "linear_cross_entropy"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def torch_ce_rows(x, t, coef, loss_rows, lse, dx, g, ignore_index, eps, z_loss, softcap):
    """The torch path of ``kernels.ce_rows`` for unweighted rows: the same outputs from torch ops."""
    V = x.shape[1]
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    z = x.to(acc)
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    lse_ = torch.logsumexp(z, dim=-1)
    lse_ = torch.where(lse_ == float("inf"), float("nan"), lse_)   # a +inf logit: NaN, as torch's log_softmax
    valid = t != ignore_index
    tc = torch.where(valid, t, 0)
    zt = z.gather(1, tc[:, None])[:, 0]
    ce = lse_ - zt
    if eps:
        ce = (1 - eps) * ce + (eps / V) * (V * lse_ - z.sum(-1))
    zero = torch.zeros((), dtype=acc, device=x.device)
    loss_rows.copy_(torch.where(valid, ce, zero))
    lse.copy_(torch.where(valid, lse_, zero))
    if dx is None:
        return
    s, s_z = coef[0].to(acc), coef[1].to(acc)
    A = s + (2.0 * z_loss) * s_z * lse_ if z_loss else s.expand_as(lse_)
    p = torch.exp(z - lse_[:, None])
    gr = p * A[:, None]
    if eps:
        gr = gr - s * (eps / V)
    gr.scatter_add_(1, tc[:, None], (-(1 - eps) * s).expand(len(tc), 1))
    if softcap is not None:
        gr = gr * (1 - (z / softcap) ** 2)
    gr = torch.where(valid[:, None], gr, zero)
    if g is not None:
        gr = gr * g.to(acc)[:, None]
    dx.copy_(gr)


def _outputs(h, W, need_dh, need_dW, need_db):
    """loss rows and lse [N] (fp32), dh, dW (None where not asked for; dW zero without tokens), db (fp32 zeros)."""
    N, V = h.shape[0], W.shape[0]
    loss_rows = torch.empty(N, dtype=torch.float32, device=h.device)
    lse = torch.empty(N, dtype=torch.float32, device=h.device)
    dh = torch.empty_like(h) if need_dh else None
    dW = (torch.zeros_like(W) if N == 0 else torch.empty_like(W)) if need_dW else None
    db = torch.zeros(V, dtype=torch.float32, device=h.device) if need_db else None
    return loss_rows, lse, dh, dW, db


def _loop(h, W, b, t, coef, g, need_dh, need_dW, need_db, plan: LCEPlan, backend, ignore_index, eps, z_loss,
          softcap):
    """The chunk loop: loss rows and lse [N]; dh, dW, db (None where not asked for), scaled by ``coef`` and by
    the per-token ``g`` if given."""
    N, V = h.shape[0], W.shape[0]
    need = need_dh or need_dW or need_db
    loss_rows, lse, dh, dW, db = _outputs(h, W, need_dh, need_dW, need_db)
    if N == 0:
        return loss_rows, lse, dh, dW, db
    T = plan.chunk_tokens
    tile = torch.empty(min(T, N), V, dtype=h.dtype, device=h.device)
    Wt = W.t()
    for s in range(0, N, T):
        e = min(s + T, N)
        hs, lt = h[s:e], tile[: e - s]
        # 1. tile = h[s:e] @ Wᵀ (+ b): (e − s)·V logits, written once, read once by 2.
        if b is not None:
            torch.addmm(b, hs, Wt, out=lt)
        else:
            torch.mm(hs, Wt, out=lt)
        # 2. loss rows, lse, and dlogits over the tile
        gs = g[s:e] if g is not None else None
        if backend == "torch":
            torch_ce_rows(lt, t[s:e], coef, loss_rows[s:e], lse[s:e], lt if need else None, gs, ignore_index,
                          eps, z_loss, softcap)
        else:
            _kernels().ce_rows(plan.ce, lt, t[s:e], None, coef, loss_rows[s:e], lse[s:e], lt if need else None,
                               gs, ignore_index, eps, z_loss, softcap)
        # 3. the three gradients from dlogits
        if need_dh:
            torch.mm(lt, W, out=dh[s:e])
        if need_dW:
            if s == 0:
                torch.mm(lt.t(), hs, out=dW)
            else:
                dW.addmm_(lt.t(), hs)
        if need_db:
            db += lt.sum(0, dtype=torch.float32)
    return loss_rows, lse, dh, dW, db


def _torch_fold(sc, t, state, v0, ignore_index, eps, softcap):
    """The torch path of ``lce_kernels.fold``: (m, d) ⊕= the chunk's, Σ z, and z_t where the target is in the
    chunk (rows of ``state``: m, d, Σz, z_t)."""
    z = sc.to(state.dtype)
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    m, d = state[0], state[1]
    m_new = torch.maximum(m, z.max(1).values)
    shift = torch.where(torch.isinf(m_new), 0.0, m_new)
    alpha = torch.where(m == m_new, 1.0, torch.exp(m - m_new))
    keep = t != ignore_index
    state[1] = torch.where(keep, d * alpha + torch.exp(z - shift[:, None]).sum(1), d)
    state[0] = torch.where(keep, m_new, m)
    if eps:
        state[2] += torch.where(keep, z.sum(1), 0.0)
    here = keep & (t >= v0) & (t < v0 + sc.shape[1])
    zt = z.gather(1, torch.where(here, t - v0, 0)[:, None])[:, 0]
    state[3] = torch.where(here, zt, state[3])


def _torch_grad_(sc, t, lse, rows, v0, ignore_index, softcap):
    """The torch path of ``lce_kernels.grad_``: dS over the tile."""
    acc = rows.dtype
    z = sc.to(acc)
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    gr = torch.exp(z - lse[:, None]) * rows[0][:, None] - rows[2][:, None]
    here = (t >= v0) & (t < v0 + sc.shape[1])
    gr.scatter_add_(1, torch.where(here, t - v0, 0)[:, None], torch.where(here, -rows[1], 0.0)[:, None])
    if softcap is not None:
        gr = gr * (1 - (z / softcap) ** 2)
    sc.copy_(torch.where((t != ignore_index)[:, None], gr, 0.0))


def _mm_f32(a, b, out, accumulate):
    """out (fp32) = / += a @ b for 16-bit a, b: cuBLAS with fp32 output (``out_dtype``); elsewhere in fp32."""
    if a.is_cuda and a.dtype != out.dtype:
        if accumulate:
            torch.addmm(out, a, b, out_dtype=out.dtype, out=out)
        else:
            torch.mm(a, b, out_dtype=out.dtype, out=out)
    elif accumulate:
        out.addmm_(a.to(out.dtype), b.to(out.dtype))
    else:
        torch.mm(a.to(out.dtype), b.to(out.dtype), out=out)


def _vocab_loop(h, W, b, t, coef, g, need_dh, need_dW, need_db, plan: LCEPlan, backend, ignore_index, eps,
                z_loss, softcap):
    """Scheme "vocab" (``LCEPlan``): the outputs of ``_loop``. Per token block, sweep 1 over the vocab chunks
    gives lse; sweep 2 (a gradient wanted) recomputes each chunk's logits, turns them into dS in place and takes
    the chunk's grad_weight rows and its term of grad_hidden by cuBLAS."""
    N, Hd, V = h.shape[0], h.shape[1], W.shape[0]
    need = need_dh or need_dW or need_db
    triton_k = None if backend == "torch" else _lce_kernels()
    acc = torch.float64 if h.dtype == torch.float64 and triton_k is None else torch.float32
    loss_rows, lse, dh, dW, db = _outputs(h, W, need_dh, need_dW, need_db)
    if N == 0:
        return loss_rows, lse, dh, dW, db
    B, Vc = min(plan.chunk_tokens, N), plan.vocab_chunk
    tile = torch.empty(B * min(Vc, V), dtype=h.dtype, device=h.device)
    state = torch.empty(4, B, dtype=acc, device=h.device)         # m, d, Σz, z_t per token
    rows = torch.empty(3, B, dtype=acc, device=h.device)          # A, c_t, c_s per token
    dh_acc = torch.empty(B, Hd, dtype=acc, device=h.device) if need_dh and plan.dh_fp32 else None
    chunks = [(v0, min(v0 + Vc, V)) for v0 in range(0, V, Vc)]
    s_ce, s_z = coef[0].to(acc), coef[1].to(acc)
    fast = plan.ce.fast_exp

    def logits(hs, v0, v1):
        sc = tile[: hs.shape[0] * (v1 - v0)].view(hs.shape[0], v1 - v0)
        if b is not None:
            torch.addmm(b[v0:v1], hs, W[v0:v1].t(), out=sc)
        else:
            torch.mm(hs, W[v0:v1].t(), out=sc)
        return sc

    for s in range(0, N, B):
        e = min(s + B, N)
        n, hs, ts = e - s, h[s:e], t[s:e]
        st = state[:, :n]
        st[0].fill_(float("-inf"))
        st[1:3].zero_()
        st[3].fill_(float("nan"))                 # a target outside [0, V): NaN loss, as the CE kernels
        # sweep 1: S_c (2·n·Hd·Vc FLOPs, cuBLAS), (m, d) ⊕= its state
        for v0, v1 in chunks:
            sc = logits(hs, v0, v1)
            if triton_k is None:
                _torch_fold(sc, ts, st, v0, ignore_index, eps, softcap)
            else:
                triton_k.fold(sc, ts, st, v0, ignore_index, eps > 0, softcap, fast)
        valid = ts != ignore_index
        m, d, sz, zt = st[0], st[1], st[2], st[3]
        lse_ = torch.where(torch.isinf(m), 0.0, m) + torch.log(d)
        lse_ = torch.where(m == float("inf"), float("nan"), lse_)   # a +inf logit: NaN, as torch's log_softmax
        ce = lse_ - zt
        if eps:
            ce = (1 - eps) * ce + (eps / V) * (V * lse_ - sz)
        loss_rows[s:e] = torch.where(valid, ce, 0.0)
        lse[s:e] = torch.where(valid, lse_, 0.0)
        if not need:
            continue
        # the row factors of dS: A = g·(s + 2λ·s_z·lse), c_t = g·s·(1 − ε), c_s = g·s·ε/V
        gs = g[s:e].to(acc) if g is not None else 1.0
        ok = torch.where((ts >= 0) & (ts < V), 1.0, float("nan"))  # a target out of range: NaN gradient row
        r = rows[:, :n]
        r[0] = (s_ce + 2.0 * z_loss * s_z * lse_ if z_loss else s_ce) * gs * ok
        r[1] = s_ce * (1 - eps) * gs * ok
        r[2] = s_ce * (eps / V) * gs * ok
        lse_k = lse_.to(acc)
        # sweep 2, last chunk first: its S_c is still in the tile
        for i, (v0, v1) in enumerate(reversed(chunks)):
            sc = tile[: n * (v1 - v0)].view(n, v1 - v0) if i == 0 else logits(hs, v0, v1)
            if triton_k is None:
                _torch_grad_(sc, ts, lse_k, r, v0, ignore_index, softcap)
            else:
                triton_k.grad_(sc, ts, lse_k, r, v0, ignore_index, eps > 0, softcap, fast)
            if need_dW:                               # grad_W[c] (+)= dS_cᵀ @ hidden[block]
                if s == 0:
                    torch.mm(sc.t(), hs, out=dW[v0:v1])
                else:
                    dW[v0:v1].addmm_(sc.t(), hs)
            if need_db:
                db[v0:v1] += sc.sum(0, dtype=torch.float32)
            if need_dh:                               # grad_hidden[block] += dS_c @ W_c
                if dh_acc is not None:
                    _mm_f32(sc, W[v0:v1], dh_acc[:n], accumulate=i > 0)
                elif i == 0:
                    torch.mm(sc, W[v0:v1], out=dh[s:e])
                else:
                    dh[s:e].addmm_(sc, W[v0:v1])
        if dh_acc is not None:
            dh[s:e].copy_(dh_acc[:n])
    return loss_rows, lse, dh, dW, db


def _lce_kernels():
    from . import lce_kernels  # Triton is imported on first use only

    return lce_kernels


def _coefs(t, ignore_index, reduction, V, backend):
    """[s, s_z, W] (``kernels.py``): one launch of ``ce_coef_kernel`` on the Triton path, torch ops otherwise."""
    if backend == "torch":
        return _reduction_coefs(t, None, ignore_index, reduction, V)
    coef = torch.empty(3, dtype=torch.float32, device=t.device)
    _kernels().ce_coefs(t, None, ignore_index, reduction, V, coef)
    return coef


def _reduce(loss_rows, lse, coef, reduction, z_loss, backend):
    if reduction == "none":
        return loss_rows + z_loss * lse * lse if z_loss else loss_rows
    if backend != "torch":                        # one launch of ce_loss_kernel
        loss = torch.empty((), dtype=torch.float32, device=loss_rows.device)
        _kernels().ce_total_loss(loss_rows, lse, coef, z_loss, reduction, loss)
        return loss
    if reduction == "sum":
        return loss_rows.sum() + (z_loss * (lse * lse).sum() if z_loss else 0.0)
    return loss_rows.sum() * coef[0] + (z_loss * (lse * lse).sum() * coef[1] if z_loss else 0.0)


def _plan_for(h, W, need_grad, kchunk, ktile, kpath, kscheme, kvchunk, kfp32) -> LCEPlan:
    knobs = LCEKnobs(chunk_tokens=kchunk or None, tile_bytes=ktile or None,
                     ce=CEKnobs(path=kpath) if kpath else None, scheme=kscheme or None, vocab_chunk=kvchunk or None,
                     dh_fp32=None if kfp32 < 0 else bool(kfp32))
    p = LCEProblem(h.shape[0], h.shape[1], W.shape[0], h.element_size(), need_grad)
    return plan_linear_cross_entropy(p, target_of(h.device), knobs)


def _empty(x):
    return x.new_empty(0)


def _lce_impl(h: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, t: torch.Tensor, ignore_index: int,
              reduction: str, label_smoothing: float, z_loss: float, softcap: float | None, need_dh: bool,
              need_dW: bool, need_db: bool, backend: str, kchunk: int, ktile: int, kpath: str,
              kscheme: str, kvchunk: int, kfp32: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    V = W.shape[0]
    if reduction == "none":                       # the per-token dloss enters dW's sum: gradients in backward
        need_dh = need_dW = need_db = False
    plan = _plan_for(h, W, need_dh or need_dW or need_db, kchunk, ktile, kpath, kscheme, kvchunk, kfp32)
    coef = _coefs(t, ignore_index, reduction, V, backend)
    loop = _vocab_loop if plan.scheme == "vocab" else _loop
    loss_rows, lse, dh, dW, db = loop(h, W, b, t, coef, None, need_dh, need_dW, need_db, plan, backend,
                                      ignore_index, label_smoothing, z_loss, softcap)
    loss = _reduce(loss_rows, lse, coef, reduction, z_loss, backend)
    if h.shape[0] == 0 and reduction == "mean":
        loss = torch.full((), math.nan, device=h.device)
    db = db.to(b.dtype) if db is not None and b is not None else None
    return (loss, dh if dh is not None else _empty(h), dW if dW is not None else _empty(W),
            db if db is not None else _empty(h))


_lce_op = torch.library.custom_op("onlinesoftmax::linear_cross_entropy", _lce_impl, mutates_args=())


@_lce_op.register_fake
def _(h, W, b, t, ignore_index, reduction, label_smoothing, z_loss, softcap, need_dh, need_dW, need_db, backend,
      kchunk, ktile, kpath, kscheme, kvchunk, kfp32):
    loss = h.new_empty((h.shape[0],) if reduction == "none" else (), dtype=torch.float32)
    grads = reduction != "none"
    return (loss, torch.empty_like(h) if grads and need_dh else h.new_empty(0),
            torch.empty_like(W) if grads and need_dW else W.new_empty(0),
            torch.empty_like(b) if grads and need_db and b is not None else h.new_empty(0))


def _lce_backward_impl(h: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, t: torch.Tensor, g: torch.Tensor,
                       ignore_index: int, label_smoothing: float, z_loss: float, softcap: float | None,
                       need_dh: bool, need_dW: bool, need_db: bool, backend: str, kchunk: int, ktile: int, kpath: str,
                       kscheme: str, kvchunk: int, kfp32: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """reduction="none": the loop again, dlogits scaled per token by g."""
    plan = _plan_for(h, W, True, kchunk, ktile, kpath, kscheme, kvchunk, kfp32)
    coef = _coefs(t, ignore_index, "none", W.shape[0], backend)
    loop = _vocab_loop if plan.scheme == "vocab" else _loop
    _, _, dh, dW, db = loop(h, W, b, t, coef, g.reshape(-1).float().contiguous(), need_dh, need_dW, need_db, plan,
                            backend, ignore_index, label_smoothing, z_loss, softcap)
    db = db.to(b.dtype) if db is not None and b is not None else None
    return (dh if dh is not None else _empty(h), dW if dW is not None else _empty(W),
            db if db is not None else _empty(h))


_lce_bwd_op = torch.library.custom_op("onlinesoftmax::linear_cross_entropy_backward", _lce_backward_impl,
                                      mutates_args=())


@_lce_bwd_op.register_fake
def _(h, W, b, t, g, ignore_index, label_smoothing, z_loss, softcap, need_dh, need_dW, need_db, backend, kchunk,
      ktile, kpath, kscheme, kvchunk, kfp32):
    return (torch.empty_like(h) if need_dh else h.new_empty(0), torch.empty_like(W) if need_dW else W.new_empty(0),
            torch.empty_like(b) if need_db and b is not None else h.new_empty(0))


@torch.library.custom_op("onlinesoftmax::linear_cross_entropy_scale_", mutates_args=("dh", "dW", "db"))
def _lce_scale_op(dh: torch.Tensor, dW: torch.Tensor, db: torch.Tensor, g: torch.Tensor) -> None:
    """The three gradients *= the scalar g in place (nothing moved where g == 1); empty ones are skipped."""
    for x in (dh, dW, db):
        if x.numel():
            if x.is_cuda:
                _kernels().scale_rows_(x.view(1, -1) if x.dim() == 1 else x, g.float())
            else:
                x.mul_(g.to(x.dtype))


@_lce_scale_op.register_fake
def _(dh, dW, db, g):
    return None


def _setup(ctx, inputs, output):
    h, W, b, t, ignore_index, reduction, eps, z_loss, softcap, need_dh, need_dW, need_db, backend, *knobs = inputs
    ctx.reduction = reduction
    ctx.has_b = b is not None
    ctx.args = (ignore_index, eps, z_loss, softcap, need_dh, need_dW, need_db and b is not None, backend, *knobs)
    ctx.used = False
    ctx.mark_non_differentiable(*output[1:])     # no zero-filled gradients materialised for them
    ctx.set_materialize_grads(False)
    ctx.grads = None
    if reduction == "none":
        ctx.save_for_backward(h, W, b, t)
    elif torch.compiler.is_compiling():
        ctx.save_for_backward(*output[1:])
    else:       # held by ctx alone and handed over in the backward: AccumulateGrad takes them without a copy
        ctx.grads = tuple(g.detach() for g in output[1:])


def _backward(ctx, dloss, *_):
    # (under "none" too: the backward op has no autograd formula, its gradients no graph)
    _no_double_backward("linear_cross_entropy", "the logits and cross_entropy(backend='torch')")
    if ctx.reduction == "none":
        h, W, b, t = ctx.saved_tensors
        dh, dW, db = torch.ops.onlinesoftmax.linear_cross_entropy_backward(h, W, b, t, dloss, *ctx.args)
    else:
        if not torch.compiler.is_compiling():
            if ctx.used:
                raise RuntimeError("linear_cross_entropy: a second backward through the same loss is not supported "
                                   "(the gradients are written by the forward pass and scaled in place)")
            ctx.used = True
        if ctx.grads is not None:
            (dh, dW, db), ctx.grads = ctx.grads, None
        else:
            dh, dW, db = ctx.saved_tensors
        torch.ops.onlinesoftmax.linear_cross_entropy_scale_(dh, dW, db, dloss)
    need_dh, need_dW, need_db = ctx.args[4:7]
    return (dh if need_dh else None, dW if need_dW else None, db if need_db else None,
            None, None, None, None, None, None, None, None, None, None, None, None, None, None, None, None)


torch.library.register_autograd("onlinesoftmax::linear_cross_entropy", _backward, setup_context=_setup)


def _prepare(name, hidden, weight, target, bias, ignore_index, reduction, label_smoothing, z_loss, softcap,
             backend, knobs):
    ignore_index = _check_common(name, target, ignore_index, reduction, label_smoothing, z_loss, softcap, backend)
    check_float_tensor(hidden, f"{name}: hidden", _DTYPES)
    check_float_tensor(weight, f"{name}: weight", _DTYPES)
    if hidden.dim() < 1 or weight.dim() != 2:
        raise ValueError(f"{name}: hidden must be [..., Hd] and weight [V, Hd], got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    if hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"{name}: hidden's last dim ({hidden.shape[-1]}) must equal weight's dim 1 "
                         f"({weight.shape[1]}): weight is [V, Hd]")
    if tuple(target.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"{name}: target shape {tuple(target.shape)} must be hidden's shape without its last dim, "
                         f"{tuple(hidden.shape[:-1])}")
    if weight.dtype != hidden.dtype:
        raise TypeError(f"{name}: weight dtype {weight.dtype} must equal hidden's, {hidden.dtype}")
    if bias is not None:
        check_float_tensor(bias, f"{name}: bias", _DTYPES)
        if bias.shape != (weight.shape[0],) or bias.dtype != hidden.dtype:
            raise ValueError(f"{name}: bias must be [V] = [{weight.shape[0]}] of hidden's dtype, got "
                             f"{tuple(bias.shape)} {bias.dtype}")
    for n, x in (("weight", weight), ("target", target), ("bias", bias)):
        if x is not None and x.device != hidden.device:
            raise ValueError(f"{name}: {n} is on {x.device}, hidden on {hidden.device}")
    if knobs is not None and not isinstance(knobs, LCEKnobs):
        raise TypeError(f"{name}: knobs must be an LCEKnobs, got {type(knobs).__name__}")
    _check_target_values(name, target, weight.shape[0], ignore_index)
    backend = resolve_backend(backend, hidden, name)
    k = knobs or LCEKnobs()
    kargs = (k.chunk_tokens or 0, k.tile_bytes or 0, (k.ce.path or "") if k.ce is not None else "", k.scheme or "",
             k.vocab_chunk or 0, -1 if k.dh_fp32 is None else int(k.dh_fp32))
    h = hidden if hidden.dim() == 2 else hidden.reshape(-1, hidden.shape[-1])
    return h, target.reshape(-1), backend, kargs


@autocast_boundary("aten::linear", "lower", ("hidden", "weight", "bias"))
def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *,
                         bias: torch.Tensor | None = None, ignore_index: int = -100, reduction: str = "mean",
                         label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: float | None = None,
                         backend: str | None = None, knobs: LCEKnobs | None = None) -> torch.Tensor:
    """``cross_entropy(hidden @ weight.T + bias, target, ...)`` (see :func:`~onlinesoftmax.cross_entropy`) for
    ``hidden [..., Hd]``, ``weight [V, Hd]``, ``bias [V]``, without holding the [N, V] logits: tiles of logits
    within about 60 MiB (by default blocks of tokens against chunks of the vocabulary; ``LCEKnobs(scheme="tokens")``
    chunks of tokens × V) are computed, reduced to the loss and turned into the gradients one after another.
    Autograd to hidden, weight and bias (the gradients of mean / sum are computed in the forward).

    ``knobs``: a :class:`~onlinesoftmax.losses.plan.LCEKnobs` override (scheme, chunk sizes, tile budget).

    Under ``torch.autocast`` hidden, weight and bias are cast as ``F.linear``'s (to the autocast dtype; gradients in
    their own dtypes) and the loss is fp32, as ``F.cross_entropy(F.linear(...))`` there.
    """
    name = "linear_cross_entropy"
    h, t, backend, kargs = _prepare(name, hidden, weight, target, bias, ignore_index, reduction, label_smoothing,
                                    z_loss, softcap, backend, knobs)
    ignore_index = int(ignore_index)            # checked: an int as torch takes one (a NumPy integer, a 0-d tensor)
    if transforms_active():      # torch.func, forward AD: the logits and torch's cross-entropy compose with them
        loss = cross_entropy(torch.nn.functional.linear(h, weight, bias), t, ignore_index=ignore_index,
                             reduction=reduction, label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap,
                             backend="torch")
        return loss.reshape(target.shape) if reduction == "none" else loss
    h, t = h.contiguous(), t.contiguous()
    w = weight if weight.is_contiguous() else weight.contiguous()
    grad_on = torch.is_grad_enabled()
    need = (hidden.requires_grad and grad_on, weight.requires_grad and grad_on,
            bias is not None and bias.requires_grad and grad_on)
    args = (h, w, bias, t, ignore_index, reduction, float(label_smoothing), float(z_loss),
            float(softcap) if softcap is not None else None, *need, backend, *kargs)
    if not any(need) and not torch.compiler.is_compiling():
        loss = _lce_impl(*args)[0]
    else:
        loss = torch.ops.onlinesoftmax.linear_cross_entropy(*args)[0]
    return loss.reshape(target.shape) if reduction == "none" else loss


def explain_linear_cross_entropy(hidden, weight, target, *, bias=None, ignore_index=-100, reduction="mean",
                                 label_smoothing=0.0, z_loss=0.0, softcap=None, backend=None,
                                 knobs: LCEKnobs | None = None, need_grad: bool | None = None,
                                 target_gpu=None) -> LCEPlan:
    """The plan ``linear_cross_entropy`` would run (``target_gpu``: plan for that Target instead)."""
    h, _, backend, _ = _prepare("explain", hidden, weight, target, bias, ignore_index, reduction, label_smoothing,
                                z_loss, softcap, backend, knobs)
    check_explain_extras("explain", need_grad, target_gpu)
    need = (hidden.requires_grad or weight.requires_grad) if need_grad is None else need_grad
    p = LCEProblem(h.shape[0], h.shape[1], weight.shape[0], h.element_size(), need)
    tgt = target_gpu or target_of(h.device)
    plan = plan_linear_cross_entropy(p, tgt, knobs)
    if backend == "torch" and target_gpu is None:
        from dataclasses import replace

        from .plan import CEPlan
        plan = replace(plan, ce=CEPlan("torch", fast_exp=False, reason="torch backend"))
    return plan
