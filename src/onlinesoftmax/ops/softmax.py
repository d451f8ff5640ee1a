"""softmax, log_softmax and logsumexp: argument checks, backend choice, torch.library ops, autograd.

Layers, bottom up: Triton launchers (``kernels/softmax.py``, imported lazily) and the portable torch path
(the (m, d) state of ``state.py``) -> custom ops ``onlinesoftmax::softmax``, ``::softmax_backward`` and
``::logsumexp`` (so ``torch.compile(fullgraph=True)`` sees one op) -> autograd registration -> public functions.
"""

from __future__ import annotations

import math

import torch

from .._checks import FLOAT_DTYPES, check_dim, check_float_tensor
from ..backend import resolve_backend
from ..state import SoftmaxState, accumulation_dtype

SOFTMAX, LOG_SOFTMAX, LOGSUMEXP = 0, 1, 2


# ---- the row view: which tensors the kernels can read in place ---------------------------------------
def row_geometry(tensors, dim: int):
    """View every tensor (same shape) as M rows of N elements along ``dim``, without copying.

    Returns ``(M, N, INNER, [(stride_outer, stride_inner, stride_n), ...])`` where row ``r`` starts at
    ``(r // INNER) * stride_outer + (r % INNER) * stride_inner``, or ``None`` when the dims other than
    ``dim`` do not fold into two strided groups for all tensors (the caller then copies).
    """
    shape = tensors[0].shape
    lead = [i for i in range(len(shape)) if i != dim and shape[i] != 1]
    groups = []  # [size, [stride per tensor]]
    for i in lead:
        strides = [t.stride(i) for t in tensors]
        if groups and all(g == s * shape[i] for g, s in zip(groups[-1][1], strides)):
            groups[-1] = [groups[-1][0] * shape[i], strides]
        else:
            groups.append([shape[i], strides])
    if len(groups) > 2:
        return None
    n = shape[dim] if len(shape) else 1
    sn = [t.stride(dim) if len(shape) else 1 for t in tensors]
    if not groups:
        return 1, n, 1, [(0, 0, s) for s in sn]
    if len(groups) == 1:
        return groups[0][0], n, 1, [(so, 0, s) for so, s in zip(groups[0][1], sn)]
    (size_o, so), (size_i, si) = groups
    return size_o * size_i, n, size_i, [(a, b, s) for a, b, s in zip(so, si, sn)]


_GEOMETRY: dict = {}       # (dim, shape, strides...) -> row_geometry, computed once per layout
MAX_GEOMETRIES = 4096


def _rows_or_copy(tensors, dim):
    """The row view of ``tensors``, making them contiguous first only when no view exists."""
    key = (dim, tensors[0].shape, *(t.stride() for t in tensors))
    geo = _GEOMETRY.get(key, False)
    if geo is False:
        if len(_GEOMETRY) >= MAX_GEOMETRIES:
            _GEOMETRY.clear()
        geo = _GEOMETRY[key] = row_geometry(tensors, dim)
    if geo is None:
        tensors = [t.contiguous() for t in tensors]
        geo = row_geometry(tensors, dim)
    return tensors, geo


# ---- the portable torch path (any device): the (m, d) state ------------------------------------------
def _torch_forward(x: torch.Tensor, dim: int, mode: int, out_dtype: torch.dtype) -> torch.Tensor:
    xf = x.to(torch.float64 if torch.float64 in (x.dtype, out_dtype) else torch.float32)   # as the kernels
    s = SoftmaxState.from_tensor(xf, dim)
    m, d = s.m.unsqueeze(dim), s.d.unsqueeze(dim)
    if mode == LOGSUMEXP:
        return s.logsumexp().to(out_dtype)
    nan = torch.full_like(m, math.nan)
    if mode == SOFTMAX:
        y = torch.exp(xf - m) * torch.where(m == math.inf, nan, 1.0 / d)   # y = e^(x - m) / d
    else:
        y = (xf - m) - torch.where(m == math.inf, nan, torch.log(d))  # y = x - m - log d
    return y.to(out_dtype).reshape(x.shape)


def _torch_backward(y, dy, dim, log):
    acc = accumulation_dtype(y.dtype)
    yf, dyf = y.to(acc), dy.to(acc)
    if log:
        dx = dyf - torch.exp(yf) * dyf.sum(dim, keepdim=True)
    else:
        dx = yf * (dyf - (yf * dyf).sum(dim, keepdim=True))
    return dx


# ---- custom ops ---------------------------------------------------------------------------------------
_K = None


def _kernels():
    """The Triton kernel module, imported on first use (``import onlinesoftmax`` never imports Triton)."""
    global _K
    if _K is None:
        from ..kernels import softmax

        _K = softmax
    return _K


_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


def _eager_direct(x: torch.Tensor) -> bool:
    """Calls that need neither autograd nor tracing skip the custom-op dispatcher (tens of µs per call, which is
    most of the time of a decode-sized softmax); the result is the same function. (torch.func transforms are
    routed before this: see _SoftmaxFunction.)"""
    return not (x.requires_grad and torch.is_grad_enabled()) and not torch.compiler.is_compiling()


def _softmax_impl(x: torch.Tensor, dim: int, mode: int, out_dtype: torch.dtype, backend: str) -> torch.Tensor:
    dim %= max(x.dim(), 1)          # the ops take torch's negative dims too (the public functions check the range)
    if backend == "torch" or x.numel() == 0 or x.dim() == 0:
        return _torch_forward(x, dim, mode, out_dtype)
    K = _kernels()

    (x, y), (M, N, inner, (gx, gy)) = _rows_or_copy([x, torch.empty_like(x, dtype=out_dtype)], dim)
    K.forward(x, y, gx, gy, M, N, inner, mode)
    return y


_softmax_op = torch.library.custom_op("onlinesoftmax::softmax", _softmax_impl, mutates_args=())


@_softmax_op.register_fake
def _(x, dim, mode, out_dtype, backend):
    return torch.empty_like(x, dtype=out_dtype)


@torch.library.custom_op("onlinesoftmax::softmax_backward", mutates_args=())
def _softmax_backward_op(y: torch.Tensor, dy: torch.Tensor, dim: int, log: bool, in_dtype: torch.dtype,
                         backend: str) -> torch.Tensor:
    dim %= max(y.dim(), 1)
    if backend == "torch" or y.numel() == 0 or y.dim() == 0:
        return _torch_backward(y, dy, dim, log).to(in_dtype)
    K = _kernels()

    dx = torch.empty_like(y, dtype=in_dtype)
    (y, dy, dx), (M, N, inner, (gy, gdy, gdx)) = _rows_or_copy([y, dy, dx], dim)
    K.backward(y, dy, dx, gy, gdy, gdx, M, N, inner, log)
    return dx


@_softmax_backward_op.register_fake
def _(y, dy, dim, log, in_dtype, backend):
    return torch.empty_like(y, dtype=in_dtype)


def _setup(ctx, inputs, output):
    x, dim, mode, out_dtype, backend = inputs
    ctx.save_for_backward(output)
    ctx.dim, ctx.log, ctx.in_dtype, ctx.backend = dim, mode == LOG_SOFTMAX, x.dtype, backend


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    dx = torch.ops.onlinesoftmax.softmax_backward(y, dy, ctx.dim, ctx.log, ctx.in_dtype, ctx.backend)
    return dx, None, None, None, None


torch.library.register_autograd("onlinesoftmax::softmax", _backward, setup_context=_setup)


# ---- torch.vmap: the batch dim goes first and ``dim`` moves one to the right -------------------------------
def _batch_first(t, bdim, size):
    """``t`` with its vmapped dim first, or expanded to ``size`` along a new first dim if it is not batched."""
    return t.movedim(bdim, 0) if bdim is not None else t.expand(size, *t.shape)


def _vmapped(fn, info, in_dims, tensors, dim):
    """Run ``fn(*batched tensors, dim + 1)``; a 0-d logical tensor becomes a size-1 dim that is squeezed away."""
    ts = [_batch_first(t, b, info.batch_size) for t, b in zip(tensors, in_dims)]
    scalar = ts[0].dim() == 1
    if scalar:
        ts = [t.unsqueeze(-1) for t in ts]
    out = fn(*ts, dim % (ts[0].dim() - 1) + 1)      # dim of the sample (possibly negative), then past the batch
    return (out.squeeze(-1) if scalar and out.dim() == 2 else out), 0


@torch.library.register_vmap("onlinesoftmax::softmax")
def _(info, in_dims, x, dim, mode, out_dtype, backend):
    return _vmapped(lambda x, d: torch.ops.onlinesoftmax.softmax(x, d, mode, out_dtype, backend),
                    info, in_dims[:1], [x], dim)


@torch.library.register_vmap("onlinesoftmax::softmax_backward")
def _(info, in_dims, y, dy, dim, log, in_dtype, backend):
    return _vmapped(lambda y, dy, d: torch.ops.onlinesoftmax.softmax_backward(y, dy, d, log, in_dtype, backend),
                    info, in_dims[:2], [y, dy], dim)


def _logsumexp_rows(x: torch.Tensor, dim: int, backend: str, out_dtype: torch.dtype) -> torch.Tensor:
    """logsumexp over ``dim`` (removed), accumulated in fp32 (fp64 for fp64), rounded to ``out_dtype`` once."""
    dim %= max(x.dim(), 1)
    out_shape = x.shape[:dim] + x.shape[dim + 1:]
    if backend == "torch" or x.numel() == 0 or x.dim() == 0:
        return _torch_forward(x, dim, LOGSUMEXP, accumulation_dtype(x.dtype)).to(out_dtype).reshape(out_shape)
    K = _kernels()

    (xc,), (M, N, inner, (gx,)) = _rows_or_copy([x], dim)
    # rows are numbered in the order of the dims other than `dim`, as a contiguous result of out_shape
    out = torch.empty(M, dtype=out_dtype, device=x.device)
    K.forward(xc, out, gx, None, M, N, inner, LOGSUMEXP)
    return out.reshape(out_shape)


def _logsumexp_impl(x: torch.Tensor, dim: int, backend: str) -> torch.Tensor:
    """The op: logsumexp in the accumulation dtype (fp32, fp64 for fp64): the backward reads it, and an lse
    rounded to bf16 would cost e^(0.03) in every gradient."""
    return _logsumexp_rows(x, dim, backend, accumulation_dtype(x.dtype))


_logsumexp_op = torch.library.custom_op("onlinesoftmax::logsumexp", _logsumexp_impl, mutates_args=())


@_logsumexp_op.register_fake
def _(x, dim, backend):
    dim %= max(x.dim(), 1)
    return x.new_empty(x.shape[:dim] + x.shape[dim + 1:], dtype=accumulation_dtype(x.dtype))


def _lse_setup(ctx, inputs, output):
    x, dim, backend = inputs
    ctx.save_for_backward(x, output)
    ctx.dim = dim


def _lse_backward(ctx, dlse):
    x, lse = ctx.saved_tensors
    # d lse / dx = softmax(x) = e^(x - lse)
    dx = dlse.unsqueeze(ctx.dim) * torch.exp(x.to(lse.dtype) - lse.unsqueeze(ctx.dim))
    return dx.to(x.dtype), None, None


torch.library.register_autograd("onlinesoftmax::logsumexp", _lse_backward, setup_context=_lse_setup)


@torch.library.register_vmap("onlinesoftmax::logsumexp")
def _(info, in_dims, x, dim, backend):
    return _vmapped(lambda x, d: torch.ops.onlinesoftmax.logsumexp(x, d, backend), info, in_dims[:1], [x], dim)


# ---- torch.func transforms (grad, vjp, jacrev, jacfwd, hessian, and vmap over them) -----------------------
# torch.library's autograd (register_autograd above) is not a functorch transform in torch 2.13 ("must override
# the setup_context staticmethod"). Under torch.func the public functions go through these autograd.Functions
# instead: the forward is our op; the derivatives are written in torch ops, which every transform can trace
# and differentiate again (hessians):
#   softmax      vjp dx = y·(dy − Σ y·dy)        jvp dy = y·(t − Σ y·t)
#   log_softmax  vjp dx = dy − e^y·Σ dy          jvp dy = t − Σ e^y·t
#   logsumexp    vjp dx = dlse·e^(x − lse)       jvp dlse = Σ e^(x − lse)·t
def _softmax_jvp_math(y, t, dim, log):
    if not log:
        return _torch_backward(y, t, dim, False)       # softmax's Jacobian is symmetric: jvp = vjp
    acc = accumulation_dtype(y.dtype)
    yf, tf = y.to(acc), t.to(acc)
    return tf - (torch.exp(yf) * tf).sum(dim, keepdim=True)


class _SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(x, dim, mode, out_dtype, backend):
        return torch.ops.onlinesoftmax.softmax(x, dim, mode, out_dtype, backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _setup(ctx, inputs, output)
        ctx.save_for_forward(output)
        ctx.out_dtype = output.dtype

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return _torch_backward(y, dy, ctx.dim, ctx.log).to(ctx.in_dtype), None, None, None, None

    @staticmethod
    def jvp(ctx, t, *_):
        (y,) = ctx.saved_tensors
        return _softmax_jvp_math(y, t, ctx.dim, ctx.log).to(ctx.out_dtype)

    @staticmethod
    def vmap(info, in_dims, x, dim, mode, out_dtype, backend):
        return _vmapped(lambda x, d: torch.ops.onlinesoftmax.softmax(x, d, mode, out_dtype, backend),
                        info, in_dims[:1], [x], dim)


class _LogsumexpFunction(torch.autograd.Function):
    @staticmethod
    def forward(x, dim, backend):
        return torch.ops.onlinesoftmax.logsumexp(x, dim, backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _lse_setup(ctx, inputs, output)
        ctx.save_for_forward(inputs[0], output)

    backward = staticmethod(_lse_backward)

    @staticmethod
    def jvp(ctx, t, *_):
        x, lse = ctx.saved_tensors
        p = torch.exp(x.to(lse.dtype) - lse.unsqueeze(ctx.dim))
        return (p * t.to(lse.dtype)).sum(ctx.dim)

    @staticmethod
    def vmap(info, in_dims, x, dim, backend):
        return _vmapped(lambda x, d: torch.ops.onlinesoftmax.logsumexp(x, d, backend), info, in_dims[:1], [x], dim)


# ---- public functions ---------------------------------------------------------------------------------
def _prepare(name, x, dim, dtype, backend):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: x must be a torch.Tensor, got {type(x).__name__}")
    if dtype is not None:
        if dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name}: dtype must be a floating dtype, got {dtype}")
        # torch casts the input to `dtype` first; an upcast is exact, so the kernel reads x as it is
        if not x.is_floating_point() or torch.finfo(dtype).bits <= torch.finfo(x.dtype).bits:
            x = x.to(dtype)
    check_float_tensor(x, f"{name}: x")
    dim = check_dim(dim, x.dim(), f"{name}: dim")
    return x, dim, dtype or x.dtype, resolve_backend(backend, x, name)


def _softmax_call(name, mode, x, dim, dtype, backend):
    x, dim, out_dtype, backend = _prepare(name, x, dim, dtype, backend)
    if _functorch_active():
        return _SoftmaxFunction.apply(x, dim, mode, out_dtype, backend)
    if _eager_direct(x):
        return _softmax_impl(x, dim, mode, out_dtype, backend)
    return torch.ops.onlinesoftmax.softmax(x, dim, mode, out_dtype, backend)


def softmax(x: torch.Tensor, dim: int = -1, *, dtype: torch.dtype | None = None,
            backend: str | None = None) -> torch.Tensor:
    """``torch.softmax`` on the online state: ``y = e^(x - m) / d`` along ``dim``.

    fp32/fp16/bf16 (and fp64) inputs, fp32 accumulation (fp64 for fp64), any dim and strides, autograd,
    ``torch.compile``-able. ``dtype`` casts as torch does. ``backend``: None (Triton on CUDA, torch on CPU),
    ``"torch"`` or ``"triton"`` (see :mod:`onlinesoftmax.backend`).
    """
    return _softmax_call("softmax", SOFTMAX, x, dim, dtype, backend)


def log_softmax(x: torch.Tensor, dim: int = -1, *, dtype: torch.dtype | None = None,
                backend: str | None = None) -> torch.Tensor:
    """``torch.log_softmax`` on the online state: ``y = x - m - log d``. Same arguments as :func:`softmax`."""
    return _softmax_call("log_softmax", LOG_SOFTMAX, x, dim, dtype, backend)


def logsumexp(x: torch.Tensor, dim: int = -1, *, keepdim: bool = False,
              backend: str | None = None) -> torch.Tensor:
    """``torch.logsumexp`` over one ``dim``: ``m + log d``; -inf for empty and all -inf rows, +inf with +inf."""
    x, dim, _, backend = _prepare("logsumexp", x, dim, None, backend)
    if _functorch_active():
        out = _LogsumexpFunction.apply(x, dim, backend).to(x.dtype)
    elif _eager_direct(x):          # no autograd: the kernel writes x's dtype (no second launch to cast)
        out = _logsumexp_rows(x, dim, backend, x.dtype)
    else:
        out = torch.ops.onlinesoftmax.logsumexp(x, dim, backend).to(x.dtype)
    return out.unsqueeze(dim) if keepdim and x.dim() else out
