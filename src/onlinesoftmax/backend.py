"""The one place that chooses how an op runs: ``backend=None | "torch" | "triton"``.

* ``None``: Triton for CUDA tensors (when Triton is importable), the portable torch path otherwise.
* ``"torch"``: the portable path (runs on any device; the CPU backend).
* ``"triton"``: the Triton kernels. On a CPU tensor only under ``TRITON_INTERPRET=1``, so tests can run
  the kernels' logic on a machine without a GPU. Meta tensors (no values: shape propagation) take the torch path.

Kernel modules are imported lazily (``import onlinesoftmax`` never imports Triton).
"""

from __future__ import annotations

import importlib.util
import os

import torch
from torch.autograd import forward_ad as _forward_ad

BACKENDS = ("torch", "triton")


# Looked up once, without importing triton (and so that torch.compile can trace resolve_backend).
_TRITON_FOUND = importlib.util.find_spec("triton") is not None


def triton_available() -> bool:
    return _TRITON_FOUND


_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


def transforms_active() -> bool:
    """torch.func transforms (vmap, grad, jvp) active, or a forward-mode AD level open
    (``torch.autograd.forward_ad.dual_level``): ops take the path that composes with them (custom ops with vmap
    and jvp rules, or torch ops) rather than the eager kernels and autograd.Function fast paths, which carry no
    tangent (a dual input's tangent was dropped: its output came back without one)."""
    return _functorch_active() or _forward_ad._current_level >= 0


def values_unreadable(t: torch.Tensor) -> bool:
    """Whether the host cannot read t's values now (a data-dependent check or index must be skipped): under
    torch.compile or torch.func transforms, or t a meta or fake tensor (FakeTensorMode's shape propagation)."""
    if torch.compiler.is_compiling() or _functorch_active() or t.device.type == "meta":
        return True
    if type(t) is torch.Tensor:
        return False
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)


def in_layout_of(r: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``r`` (t's shape) with the strides of ``torch.empty_like(t)``, what the ops' fake implementations and docs
    promise: torch's own kernels (and the torch paths' matmuls) return a dense layout of their choosing for some
    strided inputs (a transposed 4-D one). A copy only where the two differ."""
    if r.stride() == t.stride():
        return r
    y = torch.empty_like(t, dtype=r.dtype)
    if y.stride() == r.stride():
        return r
    return y.copy_(r)


def raw_apply(fn: type[torch.autograd.Function]):
    """``fn.apply`` without its Python wrapper (default-argument binding, torch.func unwrapping: neither applies
    to eager calls, which torch.func transforms never reach): 2-3 µs less host time per call. ``fn.apply`` where
    torch's autograd.Function base does not expose it."""
    apply = getattr(getattr(torch._C, "_FunctionBase", None), "__dict__", {}).get("apply")
    return apply.__get__(None, fn) if apply is not None else fn.apply


def interpret_mode() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def resolve_backend(backend: str | None, x: torch.Tensor, op: str) -> str:
    """Return ``"torch"`` or ``"triton"`` for running ``op`` on ``x``, or raise a clear error."""
    if backend is None:
        return "triton" if x.is_cuda and triton_available() else "torch"
    if backend not in BACKENDS:
        raise ValueError(f"{op}: backend must be None, 'torch' or 'triton', got {backend!r}")
    if backend == "triton":
        if not triton_available():
            raise RuntimeError(f"{op}: backend='triton' needs the triton package (pip install triton)")
        if x.is_meta:       # no values: the torch path's ops give the shapes, dtypes and strides (shape propagation)
            return "torch"
        if not x.is_cuda and not interpret_mode():
            raise RuntimeError(
                f"{op}: backend='triton' needs a CUDA tensor, got a tensor on {x.device}; "
                "set TRITON_INTERPRET=1 before importing onlinesoftmax kernels to run them on the CPU")
    return backend
