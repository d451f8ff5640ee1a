"""``torch.autocast`` at the public functions' boundary.

Autocast casts the arguments of torch's own ops (each op by its policy: matmuls and SDPA to the low-precision dtype,
softmax and the losses to fp32) but not those of custom ops, which it passes through untouched; and inside our torch
paths it would turn the fp32 accumulations' matmuls into low-precision ones. So each public function applies, where
torch's autocast does for the op it stands in for on that device type, the same policy to its own arguments, then
runs with autocast off (so the fp32 accumulation the docstrings promise holds):

* ``"lower"`` (``aten::scaled_dot_product_attention``, ``aten::linear``): floating arguments but fp64 cast to the
  autocast dtype (``torch.get_autocast_dtype``); gradients flow back through the casts in the inputs' dtypes.
* ``"fp32"`` (``aten::logsumexp``): floating arguments but fp64 cast to fp32.
* ``"fp32_out"`` (``aten::softmax``, ``aten::log_softmax``): ``dtype=torch.float32`` unless a dtype is given (the
  kernels read 16-bit inputs and write fp32: no cast of x is made).
* ``"keep"`` (``aten::cross_entropy_loss``): nothing cast; the function computes in fp32 from any input dtype and
  returns fp32 already, as torch's op under autocast.

Where torch's autocast leaves the op alone for a device type (e.g. softmax on the CPU), the arguments are left alone.
"""

from __future__ import annotations

import functools
import inspect

import torch

__all__ = ["any_autocast", "autocast_boundary", "autocast_on"]

any_autocast = torch._C._is_any_autocast_enabled     # one C call: the check a host-cost-bound public function inlines


_DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps", "hpu", "mtia")


def _known(dt: str) -> bool:
    try:
        torch.is_autocast_enabled(dt)
        return True
    except RuntimeError:        # a device type autocast does not know (meta: shape propagation runs as without it)
        return False


_AUTOCAST_TYPES = frozenset(dt for dt in _DEVICE_TYPES if _known(dt))


def autocast_on(t) -> bool:
    """Autocast is on for tensor ``t``'s device type (never for a type autocast does not know, e.g. meta): a public
    function that inlines ``any_autocast() and autocast_on(x)`` and then calls its ``autocast_boundary`` wrapper
    (which turns it off for that device type before calling the function again) cannot recurse."""
    dt = t.device.type if isinstance(t, torch.Tensor) else None
    return dt in _AUTOCAST_TYPES and torch.is_autocast_enabled(dt)


def _torch_autocasts(op: str) -> frozenset:
    """The device types whose autocast has a kernel for torch's ``op`` (read from the dispatcher once: a constant
    that torch.compile can trace)."""
    found = set()
    for dt in _DEVICE_TYPES:
        try:
            if torch._C._dispatch_has_kernel_for_dispatch_key(op, "Autocast" + dt.upper()):
                found.add(dt)
        except RuntimeError:         # a dispatch key this build of torch does not know
            pass
    return frozenset(found)


def _eligible(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


def autocast_boundary(torch_op: str, policy: str, names: tuple[str, ...]):
    """Decorate a public function whose tensor arguments ``names`` (the first one sets the device type) autocast
    treats as it treats ``torch_op``'s, by ``policy`` (see the module docstring); without autocast on, the call goes
    straight through (one check)."""
    devices = _torch_autocasts(torch_op)

    def wrap(fn):
        sig = inspect.signature(fn)
        where = [(n, list(sig.parameters).index(n)) for n in names]

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if not any_autocast():
                return fn(*args, **kwargs)
            first = args[where[0][1]] if len(args) > where[0][1] else kwargs.get(where[0][0])
            if not autocast_on(first):
                return fn(*args, **kwargs)
            device_type = first.device.type
            if device_type in devices and policy != "keep":
                args, kwargs = _applied(sig, where, policy, device_type, args, kwargs)
            with torch.autocast(device_type, enabled=False):
                return fn(*args, **kwargs)

        return call

    return wrap


def _applied(sig, where, policy, device_type, args, kwargs):
    bound = sig.bind(*args, **kwargs)
    a = bound.arguments
    if policy == "fp32_out":
        x = a.get(where[0][0])
        if a.get("dtype") is None and _eligible(x):
            a["dtype"] = torch.float32
    else:
        dtype = torch.get_autocast_dtype(device_type) if policy == "lower" else torch.float32
        for n, _ in where:
            if _eligible(a.get(n)):
                a[n] = a[n].to(dtype)
    return bound.args, bound.kwargs
