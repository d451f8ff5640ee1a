"""softmax, log_softmax and logsumexp: the public functions, torch.library ops, autograd and ``explain``.

Layers, bottom up: the Triton launches (``launch.py``, imported on first use) and the portable torch path (the
(m, d) state of ``state.py``) -> custom ops ``onlinesoftmax::softmax``, ``::softmax_backward`` and ``::logsumexp``
(so ``torch.compile(fullgraph=True)`` sees one op) -> autograd registration -> public functions.
"""

from __future__ import annotations

import functools
import math

import torch

from .._autocast import any_autocast, autocast_boundary
from .._checks import FLOAT_DTYPES, check_dim, check_float_tensor, check_instance
from ..backend import in_layout_of, raw_apply, resolve_backend, transforms_active
from ..state import accumulation_dtype
from ..target import Target, target_of
from .geometry import rows_or_copy
from .plan import LOG_SOFTMAX, LOGSUMEXP, SOFTMAX, TORCH_PLAN, Backward, Forward, Knobs, Plan

__all__ = ["explain", "log_softmax", "logsumexp", "softmax"]


# ---- the portable torch path (any device): torch's own ops, where the semantics are the same ---------------------
def _torch_forward(x: torch.Tensor, dim: int, mode: int, out_dtype: torch.dtype) -> torch.Tensor:
    """softmax / log_softmax / logsumexp by torch's kernels: the same special values as ours (NaN rows, +inf, all
    -inf), 16-bit inputs accumulated in fp32 and rounded once. logsumexp is taken of fp32 (fp64) values, as ours."""
    if mode == LOGSUMEXP:
        acc = torch.float64 if torch.float64 in (x.dtype, out_dtype) else torch.float32
        lse = torch.logsumexp(x if x.dtype == acc else x.to(acc), dim)
        return lse if lse.dtype == out_dtype else lse.to(out_dtype)
    fn = torch.softmax if mode == SOFTMAX else torch.log_softmax
    return fn(x, dim, dtype=None if out_dtype == x.dtype else out_dtype)


def _torch_backward(y, dy, dim, log):
    """dx in differentiable torch ops, accumulated in fp32 (fp64 for fp64): what torch.func transforms trace."""
    acc = accumulation_dtype(y.dtype)
    yf, dyf = y.to(acc), dy.to(acc)
    if log:
        dx = dyf - torch.exp(yf) * dyf.sum(dim, keepdim=True)
    else:
        dx = yf * (dyf - (yf * dyf).sum(dim, keepdim=True))
    return dx


def _torch_backward_fast(y, dy, dim, log, in_dtype):
    """The portable backward by torch's kernels where y and dy share a dtype."""
    if y.dtype != dy.dtype:
        return _torch_backward(y, dy, dim, log).to(in_dtype)
    fn = torch._log_softmax_backward_data if log else torch._softmax_backward_data
    return fn(dy, y, dim, y.dtype).to(in_dtype)


def _double_backward(y, dy, g, dim, log):
    """Gradients of dx = softmax_backward(y, dy) (or log-softmax's) with respect to y and dy, given g = dL/ddx, in
    differentiable torch ops. softmax, dx = y·(dy − s), s = Σ y·dy: d/ddy = y·(g − Σ g·y),
    d/dy = g·(dy − s) − dy·Σ g·y. log-softmax, dx = dy − e^y·Σ dy: d/ddy = g − Σ g·e^y, d/dy = −g·e^y·Σ dy."""
    acc = accumulation_dtype(y.dtype)
    yf, dyf, gf = y.to(acc), dy.to(acc), g.to(acc)
    if log:
        e = torch.exp(yf)
        gdy = gf - (gf * e).sum(dim, keepdim=True)
        gy = -gf * e * dyf.sum(dim, keepdim=True)
    else:
        gsum = (gf * yf).sum(dim, keepdim=True)
        gdy = yf * (gf - gsum)
        gy = gf * (dyf - (yf * dyf).sum(dim, keepdim=True)) - dyf * gsum
    return gy.to(y.dtype), gdy.to(dy.dtype)


# ---- custom ops ---------------------------------------------------------------------------------------
@functools.cache
def _kernels():
    """The Triton launches, imported on first use (``import onlinesoftmax`` never imports Triton)."""
    from . import launch

    return launch




def _softmax_impl(x: torch.Tensor, dim: int, mode: int, out_dtype: torch.dtype, backend: str) -> torch.Tensor:
    dim %= max(x.dim(), 1)          # the ops take torch's negative dims too (the public functions check the range)
    if backend == "torch" or x.numel() == 0 or x.dim() == 0:
        r = _torch_forward(x, dim, mode, out_dtype)
        return r if mode == LOGSUMEXP else in_layout_of(r, x)
    y = torch.empty_like(x, dtype=out_dtype)
    _triton_forward(x, y, dim, mode)
    return y


def _triton_forward(x: torch.Tensor, y: torch.Tensor, dim: int, mode: int):
    """The kernels' softmax / log-softmax of x into y (x's shape and strides); the bound launch where x and y have
    a row view, None where they were copied to one first (the result then copied into y)."""
    K = _kernels()
    launch = K.forward_rows(x, y, dim, mode)
    if launch is None:
        (xc, yc), (M, N, inner, (gx, gy)) = rows_or_copy([x, y], dim)
        K.forward(xc, yc, gx, gy, M, N, inner, mode)
        if yc is not y:
            y.copy_(yc)
    return launch


_softmax_op = torch.library.custom_op("onlinesoftmax::softmax", _softmax_impl, mutates_args=())


@_softmax_op.register_fake
def _(x, dim, mode, out_dtype, backend):
    return torch.empty_like(x, dtype=out_dtype)


def _softmax_backward_impl(y: torch.Tensor, dy: torch.Tensor, dim: int, log: bool, in_dtype: torch.dtype,
                           backend: str) -> torch.Tensor:
    dim %= max(y.dim(), 1)
    if backend == "torch" or y.numel() == 0 or y.dim() == 0:
        return in_layout_of(_torch_backward_fast(y, dy, dim, log, in_dtype), y)
    K = _kernels()

    # the fake implementation's strides; an fp64 y of a narrower x (``dtype=torch.float64``): dx in fp64, then
    # rounded as torch rounds (the kernels' fp64 -> bf16 store is wrong in Triton 3.6's interpreter)
    narrow = y.dtype == torch.float64 and in_dtype != torch.float64
    dx = torch.empty_like(y, dtype=torch.float64 if narrow else in_dtype)
    (yc, dyc, dxc), (M, N, inner, (gy, gdy, gdx)) = rows_or_copy([y, dy, dx], dim)
    K.backward(yc, dyc, dxc, gy, gdy, gdx, M, N, inner, log)
    if dxc is not dx:
        dx.copy_(dxc)
    return dx.to(in_dtype) if narrow else dx


_softmax_backward_op = torch.library.custom_op("onlinesoftmax::softmax_backward", _softmax_backward_impl,
                                               mutates_args=())


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


def _bwd_setup(ctx, inputs, output):
    y, dy, dim, log, in_dtype, backend = inputs
    ctx.save_for_backward(y, dy)
    ctx.dim, ctx.log = dim, log


def _bwd_backward(ctx, g):
    y, dy = ctx.saved_tensors
    return (*_double_backward(y, dy, g, ctx.dim, ctx.log), None, None, None, None)


torch.library.register_autograd("onlinesoftmax::softmax_backward", _bwd_backward, setup_context=_bwd_setup)


# ---- eager autograd: an autograd.Function around the kernels (the custom op's registered autograd costs about
# ten times torch's host time per call); the backward is itself differentiable (double backward) -------------------
class _EagerSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, mode, out_dtype, backend):
        y = _softmax_impl(x, dim, mode, out_dtype, backend)
        ctx.save_for_backward(y)
        ctx.dim, ctx.log, ctx.in_dtype, ctx.backend = dim, mode == LOG_SOFTMAX, x.dtype, backend
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return _EagerSoftmaxBackward.apply(y, dy, ctx.dim, ctx.log, ctx.in_dtype, ctx.backend), None, None, None, None


class _EagerSoftmaxBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, dy, dim, log, in_dtype, backend):
        ctx.save_for_backward(y, dy)
        ctx.dim, ctx.log = dim, log
        return _softmax_backward_impl(y, dy, dim, log, in_dtype, backend)

    @staticmethod
    def backward(ctx, g):
        y, dy = ctx.saved_tensors
        return (*_double_backward(y, dy, g, ctx.dim, ctx.log), None, None, None, None)


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
    if backend == "torch" or x.numel() == 0 or x.dim() == 0:
        return _torch_forward(x, dim, LOGSUMEXP, out_dtype)       # accumulates in fp32 (fp64) all the same
    K = _kernels()
    out_shape = x.shape[:dim] + x.shape[dim + 1:]

    (xc,), (M, N, inner, (gx,)) = rows_or_copy([x], dim)
    # rows are numbered in the order of the dims other than `dim`, as a contiguous result of out_shape (allocated
    # so, not reshaped: a view made inside the autograd.Function would refuse the caller's in-place ops)
    out = torch.empty(out_shape, dtype=out_dtype, device=x.device)
    K.forward(xc, out, gx, None, M, N, inner, LOGSUMEXP)
    return out


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


class _EagerLogsumexp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, backend):
        lse = _logsumexp_impl(x, dim, backend)
        ctx.save_for_backward(x, lse)
        ctx.dim = dim
        return lse

    backward = staticmethod(_lse_backward)


_eager_softmax = raw_apply(_EagerSoftmax)
_eager_logsumexp = raw_apply(_EagerLogsumexp)


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
        # torch casts the input to `dtype` first; an upcast of a dtype the kernels read is exact, so they read x
        # as it is
        if x.dtype not in FLOAT_DTYPES or torch.finfo(dtype).bits <= torch.finfo(x.dtype).bits:
            x = x.to(dtype)
    check_float_tensor(x, f"{name}: x")
    dim = check_dim(dim, x.dim(), f"{name}: dim")
    return x, dim, dtype or x.dtype, resolve_backend(backend, x, name)


# The eager calls without autograd that ran the Triton kernels on a row view of x, by (mode, dim as given, x's
# shape, strides, dtype and device index) -> their bound launch, for x 16-byte aligned: a later call with the same
# key passed every check of ``_prepare`` with the same outcome, so it goes straight to the launch (one dict
# look-up, y's allocation, the C launcher).
FAST_KEPT = 256
_fast: dict = {}


def _softmax_call(name, mode, x, dim, dtype, backend):
    if (backend is None and dtype is None and type(dim) is int and type(x) is torch.Tensor
            and not torch.compiler.is_compiling() and not transforms_active()
            and not (x.requires_grad and torch.is_grad_enabled())):
        key = (mode, dim, x.shape, x.stride(), x.dtype, x.get_device())
        launch = _fast.get(key)
        if launch is not None and not x.data_ptr() & 15:
            y = torch.empty_like(x)
            launch.pair(x, y)
            return y
        x, dim, out_dtype, backend = _prepare(name, x, dim, dtype, backend)
        if backend != "triton" or not x.is_cuda or x.numel() == 0 or x.dim() == 0:
            return _softmax_impl(x, dim, mode, out_dtype, backend)
        y = torch.empty_like(x)
        launch = _triton_forward(x, y, dim, mode)
        if launch is not None and not x.data_ptr() & 15:
            if len(_fast) >= FAST_KEPT:
                _fast.clear()
            _fast[key] = launch
        return y
    x, dim, out_dtype, backend = _prepare(name, x, dim, dtype, backend)
    if transforms_active():
        return _SoftmaxFunction.apply(x, dim, mode, out_dtype, backend)
    if torch.compiler.is_compiling():
        return torch.ops.onlinesoftmax.softmax(x, dim, mode, out_dtype, backend)
    if x.requires_grad and torch.is_grad_enabled():
        return _eager_softmax(x, dim, mode, out_dtype, backend)
    return _softmax_impl(x, dim, mode, out_dtype, backend)


def _softmax_kw(name, mode, x, dim=-1, dtype=None, *, backend=None):
    """_softmax_call with softmax's argument names (x, dim, dtype, backend), for autocast_boundary to bind."""
    return _softmax_call(name, mode, x, dim, dtype, backend)


_softmax_autocast = autocast_boundary("aten::softmax.int", "fp32_out", ("x",))(_softmax_kw)
_log_softmax_autocast = autocast_boundary("aten::log_softmax.int", "fp32_out", ("x",))(_softmax_kw)


def softmax(x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None, *,
            backend: str | None = None) -> torch.Tensor:
    """``torch.softmax`` on the online state: ``y = e^(x - m) / d`` along ``dim``.

    fp32/fp16/bf16 (and fp64) inputs, fp32 accumulation (fp64 for fp64), any dim and strides, autograd,
    ``torch.compile``-able. ``dtype`` casts as torch does. ``backend``: None (Triton on CUDA, torch on CPU),
    ``"torch"`` or ``"triton"`` (see :mod:`onlinesoftmax.backend`). Under ``torch.autocast`` the dtype is torch's:
    fp32 for a 16-bit x where torch's autocast runs softmax in fp32 (CUDA), unless ``dtype`` is given (the kernels
    read x as it is); x's dtype where it leaves softmax alone (the CPU).
    """
    if any_autocast():      # inline, not a decorator: the eager call's host cost is a goal (one C call here)
        return _softmax_autocast("softmax", SOFTMAX, x, dim, dtype, backend=backend)
    return _softmax_call("softmax", SOFTMAX, x, dim, dtype, backend)


def log_softmax(x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None, *,
                backend: str | None = None) -> torch.Tensor:
    """``torch.log_softmax`` on the online state: ``y = x - m - log d``. Same arguments (and autocast behaviour) as
    :func:`softmax`."""
    if any_autocast():
        return _log_softmax_autocast("log_softmax", LOG_SOFTMAX, x, dim, dtype, backend=backend)
    return _softmax_call("log_softmax", LOG_SOFTMAX, x, dim, dtype, backend)


@autocast_boundary("aten::logsumexp", "fp32", ("x",))
def logsumexp(x: torch.Tensor, dim: int | tuple[int, ...] = -1, keepdim: bool = False, *,
              backend: str | None = None) -> torch.Tensor:
    """``torch.logsumexp`` over ``dim``: ``m + log d``; -inf for empty and all -inf rows, +inf with +inf. ``dim``
    an int, or a tuple / list of distinct ints as torch takes them (those dims moved last and reduced as one row:
    a copy where they do not fold into one). Under ``torch.autocast`` x is cast to fp32 where torch's autocast runs
    logsumexp in fp32 (CUDA), as torch's."""
    if type(keepdim) is not bool:
        raise TypeError(f"logsumexp: keepdim must be a bool, got {type(keepdim).__name__}")
    if isinstance(dim, (tuple, list)):
        return _logsumexp_dims(x, dim, keepdim, backend)
    x, dim, _, backend = _prepare("logsumexp", x, dim, None, backend)
    if transforms_active():
        out = _LogsumexpFunction.apply(x, dim, backend).to(x.dtype)
    elif torch.compiler.is_compiling():
        out = torch.ops.onlinesoftmax.logsumexp(x, dim, backend).to(x.dtype)
    elif x.requires_grad and torch.is_grad_enabled():
        out = _eager_logsumexp(x, dim, backend).to(x.dtype)
    else:                           # no autograd: the kernel writes x's dtype (no second launch to cast)
        out = _logsumexp_rows(x, dim, backend, x.dtype)
    return out.unsqueeze(dim) if keepdim and x.dim() else out


def _logsumexp_dims(x, dims, keepdim: bool, backend) -> torch.Tensor:
    check_float_tensor(x, "logsumexp: x")
    if not dims:
        raise ValueError("logsumexp: dim must name at least one dimension, got an empty tuple")
    ds = [check_dim(d, x.dim(), "logsumexp: dim") for d in dims]
    if len(set(ds)) != len(ds):
        raise ValueError(f"logsumexp: dim {dims} names a dimension more than once")
    if x.dim() == 0 or len(ds) == 1:
        return logsumexp(x, ds[0], keepdim, backend=backend)
    rest = [i for i in range(x.dim()) if i not in ds]
    rows = x.permute(*rest, *ds)
    n = math.prod([x.shape[d] for d in ds])      # not -1: ambiguous where a kept dim is 0 (a list: dynamo traces it)
    out = logsumexp(rows.reshape(*rows.shape[:len(rest)], n), -1, backend=backend)
    if keepdim:
        out = out.reshape([1 if i in ds else x.shape[i] for i in range(x.dim())])
    return out


# ---- introspection ------------------------------------------------------------------------------------------------
_OPS = {"softmax": SOFTMAX, "log_softmax": LOG_SOFTMAX, "logsumexp": LOGSUMEXP}


def explain(x: torch.Tensor, dim: int = -1, *, op: str = "softmax", dtype: torch.dtype | None = None,
            grad: bool = False, backend: str | None = None, target: Target | None = None,
            knobs: Knobs | None = None) -> Plan:
    """The plan ``op(x, dim, dtype=dtype)`` runs (its backward's with ``grad=True``), without running it.

    ``op``: ``"softmax"``, ``"log_softmax"`` or ``"logsumexp"``. ``target`` plans for another GPU than x's (e.g.
    ``onlinesoftmax.target.H200`` for a tensor on the CPU or the meta device; x's data pointer still sets the
    alignment); ``knobs`` as the tuning tools pass them. The portable path, empty and 0-d tensors give a plan with
    ``path == "torch"``. logsumexp's backward is written in torch ops: its ``grad=True`` plan is the torch one.
    """
    if not isinstance(op, str) or op not in _OPS:
        raise ValueError(f"explain: op must be one of {sorted(_OPS)}, got {op!r}")
    check_instance(target, Target, f"explain({op}): target")
    check_instance(knobs, Knobs, f"explain({op}): knobs")
    mode = _OPS[op]
    x, dim, out_dtype, which = _prepare(f"explain({op})", x, dim, dtype, backend if target is None else "torch")
    if (target is None and which == "torch") or x.numel() == 0 or x.dim() == 0 or (grad and mode == LOGSUMEXP):
        return TORCH_PLAN
    from .launch import align_of
    from .plan import backward_plan, forward_plan

    target = target or target_of(x.device)
    knobs = knobs or Knobs()
    meta = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if grad:                                    # y and dx as the op allocates them, dy as y
        y = torch.empty_like(meta, dtype=out_dtype)
        (y, dy, dx), (M, N, inner, geos) = rows_or_copy([y, torch.empty_like(y), torch.empty_like(y, dtype=x.dtype)],
                                                        dim)
        return backward_plan(Backward(M, N, inner, *geos, mode == LOG_SOFTMAX, (y.dtype, dy.dtype, dx.dtype)),
                             target, knobs)
    tensors = [meta] if mode == LOGSUMEXP else [meta, torch.empty_like(meta, dtype=out_dtype)]
    (xm, *_), (M, N, inner, geos) = rows_or_copy(tensors, dim)
    align = align_of(x) if xm is meta else 16          # a copy is aligned
    geo_y = (0, 0, 0) if mode == LOGSUMEXP else geos[1]
    return forward_plan(Forward(M, N, inner, geos[0], geo_y, mode, x.dtype, out_dtype, align), target, knobs)
