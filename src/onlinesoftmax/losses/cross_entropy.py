"""``cross_entropy``: argument checks, backend choice, the torch path, the ``onlinesoftmax::cross_entropy`` op
(Triton kernels of ``kernels.py``, imported lazily) with its fake and autograd, the public function.

Layers, bottom up: torch path (F.cross_entropy, torch's autograd) | the bound call (``kernels.CERun``, cached per
problem, options and plan by ``_run_for``) -> custom op ``cross_entropy`` returning (loss, dlogits) with dlogits
written by the forward kernel -> ``cross_entropy_scale_`` (the backward: dlogits *= dloss in place, nothing moved
when dloss == 1) -> autograd registration -> eager autograd.Function -> public function.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._autocast import autocast_boundary
from .._checks import as_float, as_int, check_bool, check_float_tensor, check_instance, no_double_backward
from .._triton.host import cached
from ..backend import raw_apply, resolve_backend, transforms_active, values_unreadable
from ..target import Target, target_of
from .plan import CEKnobs, CEPlan, CEProblem, plan_cross_entropy

__all__ = ["cross_entropy", "explain_cross_entropy"]

REDUCTIONS = ("none", "mean", "sum")
_LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _kernels():
    from . import kernels  # Triton is imported on first use only

    return kernels


# ---- checks ---------------------------------------------------------------------------------------------
def _check_common(name, target, ignore_index, reduction, label_smoothing, z_loss, softcap, backend) -> int:
    """The arguments both losses take; returns ``ignore_index`` as a Python int."""
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"{name}: target must be a torch.Tensor of class indices, got {type(target).__name__}")
    if target.dtype != torch.int64:
        raise TypeError(f"{name}: target must be int64 class indices, got {str(target.dtype).replace('torch.', '')}"
                        " (class probabilities as targets are not supported)")
    ignore_index = as_int(ignore_index, f"{name}: ignore_index")        # an int as torch takes one
    if not -2**63 <= ignore_index < 2**63:
        raise ValueError(f"{name}: ignore_index must fit int64 (the targets' dtype), got {ignore_index}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"{name}: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    if not 0.0 <= as_float(label_smoothing, f"{name}: label_smoothing") <= 1.0:
        raise ValueError(f"{name}: label_smoothing must be in [0, 1], got {label_smoothing}")
    if not 0.0 <= as_float(z_loss, f"{name}: z_loss") < math.inf:            # inf: inf·lse², NaN where lse = 0
        raise ValueError(f"{name}: z_loss must be >= 0 and finite, got {z_loss}")
    if softcap is not None and not 0.0 < as_float(softcap, f"{name}: softcap") < math.inf:   # inf: c·tanh(x/c) is NaN
        raise ValueError(f"{name}: softcap must be None or a positive finite float, got {softcap}")
    return ignore_index


def check_explain_extras(name: str, need_grad, target_gpu) -> None:
    """An explain's ``need_grad`` (None or a bool) and ``target_gpu`` (None or a Target)."""
    if need_grad is not None:
        check_bool(need_grad, f"{name}: need_grad")
    check_instance(target_gpu, Target, f"{name}: target_gpu")


def _check_target_values(name, target, V: int, ignore_index: int) -> None:
    """On the CPU (free to read): every target in [0, V) or ``ignore_index``, else an ``IndexError`` naming the
    first one. On a GPU the values are not read by the host (no synchronisation): the Triton path gives that row a
    NaN loss. Not under torch.compile, functorch transforms or fake tensors (a data-dependent branch)."""
    if target.device.type != "cpu" or target.numel() == 0 or values_unreadable(target):
        return
    bad = ((target < 0) | (target >= V)) & (target != ignore_index)
    if bad.any():
        i = int(bad.reshape(-1).nonzero()[0, 0])
        raise IndexError(f"{name}: target {int(target.reshape(-1)[i])} (flat position {i}) is outside [0, {V}) and "
                         f"is not ignore_index ({ignore_index})")


def _check_logits(name, logits, target, weight):
    check_float_tensor(logits, f"{name}: logits", _LOGIT_DTYPES)
    if logits.dim() < 1:
        raise ValueError(f"{name}: logits must have at least 1 dimension (classes last), got a 0-d tensor")
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"{name}: target shape {tuple(target.shape)} must be logits' shape without its last "
                         f"(class) dim, {tuple(logits.shape[:-1])}; the class dim is last, unlike F.cross_entropy")
    if target.device != logits.device:
        raise ValueError(f"{name}: target is on {target.device}, logits on {logits.device}")
    if weight is not None:
        check_float_tensor(weight, f"{name}: weight")
        if weight.dim() != 1 or weight.shape[0] != logits.shape[-1]:
            raise ValueError(f"{name}: weight must be 1-d with one entry per class ({logits.shape[-1]}), "
                             f"got shape {tuple(weight.shape)}")
        if weight.device != logits.device:
            raise ValueError(f"{name}: weight is on {weight.device}, logits on {logits.device}")
        if weight.requires_grad and torch.is_grad_enabled():    # the kernels would drop its gradient silently
            raise ValueError(f"{name}: weight (the class weights) must not require grad: no gradient flows to it, "
                             "as F.cross_entropy's")


# ---- the torch path: torch's own ops, torch's autograd ----------------------------------------------------
def torch_cross_entropy(x2, t, weight, ignore_index, reduction, label_smoothing, z_loss, softcap):
    """[N, V] logits, [N] targets; float32 loss (computed in fp64 for fp64 logits)."""
    z = x2.double() if x2.dtype == torch.float64 else x2.float()
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    w = weight.to(z.dtype) if weight is not None else None
    loss = F.cross_entropy(z, t, weight=w, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)
    if z_loss:
        valid = t != ignore_index
        lse = torch.logsumexp(z, dim=-1)
        zl = torch.where(valid, z_loss * lse * lse, torch.zeros((), dtype=z.dtype, device=z.device))
        if reduction == "none":
            loss = loss + zl
        elif reduction == "sum":
            loss = loss + zl.sum()
        else:
            loss = loss + zl.sum() / valid.sum()
    return loss.float()


# ---- the Triton op --------------------------------------------------------------------------------------
def _reduction_coefs(t, weight, ignore_index, reduction, V):
    """[s, s_z, W] (fp32, on t's device) by torch ops: the scales of the CE and z-loss terms of the gradient and
    Σ_j w_j (the Triton path's ``ce_coef_kernel`` in torch, for the linear cross-entropy's torch path)."""
    valid = t != ignore_index
    n_valid = valid.sum().float()
    if weight is not None:
        wt = torch.where(valid, weight[t.clamp(0, V - 1)].float(), 0.0)
        denom, wsum = wt.sum(), weight.float().sum()
    else:
        denom, wsum = n_valid, torch.full((), float(V), device=t.device)
    if reduction == "mean":
        return torch.stack([1.0 / denom, 1.0 / n_valid, wsum])
    one = torch.ones((), device=t.device)
    return torch.stack([one, one, wsum])


def _knobs_of(kpath: str, kblock: int, kone: int, kwarps: int, kchunk: int, kreg: int, kkeep: int,
              kmaxnreg: int) -> CEKnobs:
    """The knobs from the op's integer arguments (0, or -1 for the ones 0 is a value of, leave a choice)."""
    return CEKnobs(path=kpath or None, block=kblock or None, one_block=None if kone < 0 else bool(kone),
                   num_warps=kwarps or None, chunk=kchunk or None, reg=None if kreg < 0 else kreg,
                   keep_e=None if kkeep < 0 else bool(kkeep), maxnreg=None if kmaxnreg < 0 else kmaxnreg)


def _knob_args(k: CEKnobs) -> tuple:
    """The inverse of _knobs_of."""
    return (k.path or "", k.block or 0, -1 if k.one_block is None else int(k.one_block), k.num_warps or 0,
            k.chunk or 0, -1 if k.reg is None else k.reg, -1 if k.keep_e is None else int(k.keep_e),
            -1 if k.maxnreg is None else k.maxnreg)


def smem_rows(x2: torch.Tensor) -> bool:
    """[N, V] logits the smem path can take (CEProblem.smem_rows); dx is allocated like x2."""
    return (x2.element_size() in (2, 4) and x2.shape[1] % 16 == 0 and x2.stride(0) % 16 == 0
            and x2.data_ptr() % 16 == 0)


def _plan_for(x2: torch.Tensor, need_grad: bool, knobs: CEKnobs | None) -> CEPlan:
    N, V = x2.shape
    return plan_cross_entropy(CEProblem(N, V, x2.element_size(), need_grad, smem_rows(x2)), target_of(x2.device),
                              knobs)


@cached
def _bound_run(N: int, V: int, dtype: torch.dtype, stride_x: int, smem: bool, device: torch.device,
               has_weight: bool, ignore_index: int, reduction: str, eps: float, z_loss: float, softcap: float | None,
               need_grad: bool, knobs: CEKnobs | None):
    plan = plan_cross_entropy(CEProblem(N, V, dtype.itemsize, need_grad, smem), target_of(device), knobs)
    return _kernels().CERun(plan, N, V, dtype, stride_x, has_weight, reduction, ignore_index, eps, z_loss, softcap,
                            need_grad)


def _run_for(x2: torch.Tensor, has_weight: bool, ignore_index: int, reduction: str, eps: float, z_loss: float,
             softcap: float | None, need_grad: bool, knobs: CEKnobs | None):
    """The bound call (``kernels.CERun``) for these [N, V] logits (N > 0) and options: planned and bound on the
    first call with this key, looked up after that."""
    N, V = x2.shape
    return _bound_run(N, V, x2.dtype, x2.stride(0), smem_rows(x2), x2.device, has_weight, ignore_index, reduction,
                      eps, z_loss, softcap, need_grad, knobs)


def _empty_loss(x2: torch.Tensor, reduction: str, need_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """No rows: loss [0] ("none"), NaN ("mean", as torch) or 0 ("sum"); an empty dx."""
    loss = torch.zeros(0, device=x2.device) if reduction == "none" else \
        torch.full((), math.nan if reduction == "mean" else 0.0, device=x2.device)
    return loss, (x2.new_empty(x2.shape) if need_grad else x2.new_empty(0))


def _ce_impl(x2: torch.Tensor, t: torch.Tensor, weight: torch.Tensor | None, ignore_index: int, reduction: str,
             label_smoothing: float, z_loss: float, softcap: float | None, need_grad: bool, kpath: str,
             kblock: int, kone: int, kwarps: int, kchunk: int, kreg: int, kkeep: int,
             kmaxnreg: int) -> tuple[torch.Tensor, torch.Tensor]:
    knobs = _knobs_of(kpath, kblock, kone, kwarps, kchunk, kreg, kkeep, kmaxnreg)
    if x2.shape[0] == 0:
        _plan_for(x2, need_grad, knobs)           # knob errors are raised without rows too
        return _empty_loss(x2, reduction, need_grad)
    run = _run_for(x2, weight is not None, ignore_index, reduction, label_smoothing, z_loss, softcap, need_grad,
                   knobs)
    loss, dx = run(x2, t, weight.float().contiguous() if weight is not None else None)
    return loss, (dx if dx is not None else x2.new_empty(0))


_ce_op = torch.library.custom_op("onlinesoftmax::cross_entropy", _ce_impl, mutates_args=())


@_ce_op.register_fake
def _(x2, t, weight, ignore_index, reduction, label_smoothing, z_loss, softcap, need_grad, kpath, kblock, kone,
      kwarps, kchunk, kreg, kkeep, kmaxnreg):
    loss = x2.new_empty((x2.shape[0],) if reduction == "none" else (), dtype=torch.float32)
    return loss, (x2.new_empty(x2.shape) if need_grad else x2.new_empty(0))


@torch.library.custom_op("onlinesoftmax::cross_entropy_scale_", mutates_args=("dx",))
def _scale_op(dx: torch.Tensor, g: torch.Tensor) -> None:
    """dx (rows of the last dim) *= g, g a scalar or one value per row, in place."""
    _kernels().scale_rows_(dx, g.float())


@_scale_op.register_fake
def _(dx, g):
    return None


def _setup(ctx, inputs, output):
    # dx is an output only to hand it to the backward: no gradient flows into it, and none is materialised (a
    # zero-filled N × V tensor per backward otherwise: 617 µs and 2 GB at 8192 × 128256 bf16 on the H200)
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)
    if torch.compiler.is_compiling():
        ctx.save_for_backward(output[1])
        ctx.dx = None
    else:
        # eager: dx is held by ctx alone (a detached alias, no reference cycle) and handed over in the backward,
        # so that autograd's AccumulateGrad can take it as logits.grad instead of cloning it (a saved tensor
        # still referenced there is copied: N·V more memory and one more read + write)
        ctx.dx = output[1].detach()
    ctx.used = False


def _no_double_backward(name: str, instead: str = "backend='torch'") -> None:
    """The backward of a loss whose gradient the forward wrote: it has no graph to give (``no_double_backward``)."""
    no_double_backward(name, f"on this path (the gradient is written by the forward pass); use {instead}")


def _hand_over(ctx) -> torch.Tensor:
    """The forward's dlogits, held by ctx alone, handed to the (one) backward that scales it in place."""
    _no_double_backward("cross_entropy")
    if ctx.used:
        raise RuntimeError("cross_entropy: a second backward through the same loss is not supported (the "
                           "gradient is written by the forward pass and scaled in place); call it again")
    ctx.used = True
    dx, ctx.dx = ctx.dx, None
    return dx


def _backward(ctx, dloss, _ddx):
    if torch.compiler.is_compiling():
        (dx,) = ctx.saved_tensors
    else:
        dx = _hand_over(ctx)
    torch.ops.onlinesoftmax.cross_entropy_scale_(dx, dloss)
    return (dx,) + (None,) * 16


torch.library.register_autograd("onlinesoftmax::cross_entropy", _backward, setup_context=_setup)


# ---- eager autograd: an autograd.Function around the bound call (the custom op's registered autograd cost ~0.8 ms
# of host time per forward + backward on the H200, more than the kernel at 8192 × 32000) ---------------------------
class _EagerCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, t, w, run):
        loss, dx = run(x2, t, w)
        ctx.dx, ctx.used, ctx.run = dx, False, run   # dx held by ctx alone: AccumulateGrad takes it, no copy
        return loss

    @staticmethod
    def backward(ctx, dloss):
        dx = _hand_over(ctx)
        ctx.run.scale_(dx, dloss)
        return dx, None, None, None


_eager_ce = raw_apply(_EagerCrossEntropy)


# ---- public --------------------------------------------------------------------------------------------
def _prepare(name, logits, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap, backend,
             knobs):
    """``(x2, t, backend, ignore_index)``: the [N, V] logits, the [N] targets, the backend, ignore_index an int."""
    ignore_index = _check_common(name, target, ignore_index, reduction, label_smoothing, z_loss, softcap, backend)
    _check_logits(name, logits, target, weight)
    if knobs is not None and not isinstance(knobs, CEKnobs):
        raise TypeError(f"{name}: knobs must be a CEKnobs, got {type(knobs).__name__}")
    _check_target_values(name, target, logits.shape[-1], ignore_index)
    backend = resolve_backend(backend, logits, name)
    if knobs is not None and knobs.path == "torch":
        backend = "torch"
    V = logits.shape[-1]
    x2 = logits if logits.dim() == 2 else logits.reshape(-1, V)
    return x2, (target if target.dim() == 1 else target.reshape(-1)), backend, ignore_index


@autocast_boundary("aten::cross_entropy_loss", "keep", ("logits",))
def cross_entropy(logits: torch.Tensor, target: torch.Tensor, *, weight: torch.Tensor | None = None,
                  ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                  z_loss: float = 0.0, softcap: float | None = None, backend: str | None = None,
                  knobs: CEKnobs | None = None) -> torch.Tensor:
    """Cross-entropy of ``logits [..., V]`` (the class dim is LAST, unlike ``F.cross_entropy``'s dim 1) against
    int64 ``target [...]``, on the online (m, d) state; a float32 loss.

    Equals ``F.cross_entropy(logits.float(), target, weight, ignore_index=..., reduction=...,
    label_smoothing=...)`` (flattened to [N, V]) when ``z_loss == 0`` and ``softcap is None``; every target
    ignored gives NaN for "mean" (as torch), 0 for "sum", and zero gradients.

    ``z_loss=λ`` adds ``λ·lse²`` per kept token (PaLM), averaged over the kept tokens under "mean";
    ``softcap=c`` applies ``c·tanh(logits / c)`` first (Gemma 2). bf16 / fp16 logits accumulate in fp32.
    Autograd to ``logits`` (the gradient in logits' dtype): when a gradient is needed the forward kernel writes
    it in the pass that reads the logits, and the backward only scales it by the incoming gradient (no traffic
    when that is 1). A target outside [0, V) that is not ``ignore_index`` is an ``IndexError`` naming this function
    for CPU tensors; on CUDA the Triton path gives that row a NaN loss (no device sync to check it) and torch's
    path (``backend="torch"``) raises torch's device-side assert.

    Under ``torch.autocast`` nothing is cast (the loss is fp32 from logits of any dtype, as torch's there).

    ``backend``: None (Triton for CUDA tensors, torch otherwise), ``"torch"`` or ``"triton"``;
    ``knobs``: a :class:`~onlinesoftmax.losses.plan.CEKnobs` override of the plan (tests, tuning).
    """
    name = "cross_entropy"
    x2, t, backend, ignore_index = _prepare(name, logits, target, weight, ignore_index, reduction, label_smoothing,
                                            z_loss, softcap, backend, knobs)
    softcap = float(softcap) if softcap is not None else None
    eps, z_loss = float(label_smoothing), float(z_loss)
    if backend == "torch" or transforms_active():   # torch.func, forward AD: torch ops compose with them
        loss = torch_cross_entropy(x2, t, weight, ignore_index, reduction, eps, z_loss, softcap)
        return loss.reshape(target.shape) if reduction == "none" else loss
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    t = t.contiguous()
    need_grad = logits.requires_grad and torch.is_grad_enabled()
    if torch.compiler.is_compiling() or x2.shape[0] == 0:
        loss, _ = torch.ops.onlinesoftmax.cross_entropy(x2, t, weight, ignore_index, reduction, eps, z_loss, softcap,
                                                        need_grad, *_knob_args(knobs or CEKnobs()))
    else:       # eager: the bound call, no dispatcher; an autograd.Function around it where a gradient is needed
        run = _run_for(x2, weight is not None, ignore_index, reduction, eps, z_loss, softcap, need_grad, knobs)
        w = weight.float().contiguous() if weight is not None else None
        loss = _eager_ce(x2, t, w, run) if need_grad else run(x2, t, w)[0]
    return loss.reshape(target.shape) if reduction == "none" else loss


def explain_cross_entropy(logits: torch.Tensor, target: torch.Tensor, *, weight=None, ignore_index: int = -100,
                          reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                          softcap=None, backend=None, knobs: CEKnobs | None = None, need_grad: bool | None = None,
                          target_gpu=None) -> CEPlan:
    """The plan ``cross_entropy`` would run for these arguments (``need_grad`` defaults to logits.requires_grad);
    ``target_gpu``: plan for this :class:`~onlinesoftmax.target.Target` instead of logits' device."""
    x2, _, backend, _ = _prepare("explain", logits, target, weight, ignore_index, reduction, label_smoothing,
                                 z_loss, softcap, backend, knobs)
    check_explain_extras("explain", need_grad, target_gpu)
    if backend == "torch" and target_gpu is None:
        return CEPlan("torch", fast_exp=False, reason="torch backend")
    need = logits.requires_grad if need_grad is None else need_grad
    N, V = x2.shape
    return plan_cross_entropy(CEProblem(N, V, x2.element_size(), need, smem_rows(x2)),
                              target_gpu or target_of(x2.device), knobs)
