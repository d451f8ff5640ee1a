"""Argument checks shared by every public function: each error names the argument at fault."""

from __future__ import annotations

import math
from numbers import Integral, Real

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)     # what the attention / decode kernels take


def check_kernel_inputs(q: torch.Tensor, op: str, what: str, max_head_dim: int) -> None:
    """backend="triton" for an attention-like ``op``: ``q``'s dtype one the kernels take and its head dim (last) at
    most ``max_head_dim``, else an error naming ``op`` (``what``: the inputs as its message names them)."""
    if q.dtype not in KERNEL_DTYPES:
        raise TypeError(f"{op}: backend='triton' takes float16, bfloat16 or float32 {what}, got "
                        f"{str(q.dtype).replace('torch.', '')} (use backend='torch')")
    if q.shape[-1] > max_head_dim:
        raise ValueError(f"{op}: backend='triton' takes head dims up to {max_head_dim}, got {q.shape[-1]} "
                         "(use backend='torch')")


def as_int(v, name: str) -> int:
    """``v`` as a Python int where torch takes it as one (an int, a NumPy integer, a 0-d integer tensor), else a
    TypeError naming ``name``. bool is refused (``dim=True`` is a mistake, and torch refuses it too)."""
    if type(v) is int:
        return v
    if isinstance(v, torch.Tensor):
        if v.dim() == 0 and not (v.is_floating_point() or v.is_complex() or v.dtype == torch.bool):
            return int(v)
    elif isinstance(v, Integral) and not isinstance(v, bool):
        return int(v)
    raise TypeError(f"{name} must be an int, got {type(v).__name__}")


def type_name(v) -> str:
    """``v``'s type as an error message names it: ``numpy.bool`` for NumPy's bool, not a bare ``bool``."""
    t = type(v)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__.split('.')[0]}.{t.__name__}"


def as_float(v, name: str) -> float:
    """``v`` as a Python float where torch takes it as one (an int or float, a NumPy real, a 0-d real tensor), else
    a TypeError naming ``name``. bool is refused; so is a tensor on the meta device (it holds no value)."""
    if type(v) is float:
        return v
    if isinstance(v, torch.Tensor):
        if v.dim() == 0 and not (v.is_complex() or v.dtype == torch.bool):
            if v.device.type == "meta":
                raise TypeError(f"{name} must be a float, got a tensor on the meta device (it holds no value)")
            return float(v)
    elif isinstance(v, Real) and not isinstance(v, bool):     # (a NumPy bool is no Real)
        return float(v)
    raise TypeError(f"{name} must be a float, got {type_name(v)}")


def check_bool(v, name: str) -> bool:
    """``v`` a Python bool (as torch's bool arguments: 1, None, a NumPy bool or a tensor are refused), else a
    TypeError naming ``name``."""
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be a bool, got {type_name(v)}")
    return v


def check_window(window, op: str) -> tuple[int, int]:
    """An attention ``window``: None (unbounded) or a pair (left, right) of ints >= -1 (-1 = that side unbounded),
    each an int as torch takes it (:func:`as_int`), else a TypeError / ValueError naming ``op``."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"{op}: window must be None or a pair of ints (left, right), got {window!r}")
    left, right = (as_int(w, f"{op}: window[{i}]") for i, w in enumerate(window))
    if left < -1 or right < -1:
        raise ValueError(f"{op}: window entries must be >= -1 (-1 = unbounded), got {window!r}")
    return left, right


def fit_window(left: int, right: int, rows: int, keys: int) -> tuple[int, int]:
    """A window side wider than the problem restricts nothing: cut to ``keys`` (left) and ``rows`` (right), so that
    the kernels' int32 positions (``i + right``) cannot overflow. Query i of ``rows`` sits at key position
    ``i + keys - rows``: a left side >= keys - 1 or a right side >= rows - 1 keeps every key. Only an entry past
    2^30 is compared (no guard on a traced size for the usual window)."""
    big = 1 << 30
    return (min(left, keys) if left > big else left), (min(right, rows) if right > big else right)


def check_dim(dim: int, ndim: int, name: str = "dim") -> int:
    """Normalise a possibly negative ``dim`` as torch does (a 0-d tensor accepts 0 and -1); ``dim`` an int or what
    torch takes as one (:func:`as_int`)."""
    dim = as_int(dim, name)
    rank = max(ndim, 1)
    if not -rank <= dim < rank:
        raise IndexError(f"{name}={dim} is out of range for a tensor with {ndim} dimension(s) "
                         f"(expected a value in [{-rank}, {rank - 1}])")
    return dim % rank


def check_ints(v, name: str, minimum: int = 1) -> tuple[int, ...]:
    """An int or a sequence of ints, each ``>= minimum``, as a tuple; else a TypeError / ValueError naming ``name``
    (a float size is not rounded, a bool is not an int)."""
    items = (v,) if isinstance(v, (Integral, float)) else v
    try:
        items = tuple(items)
    except TypeError:
        raise TypeError(f"{name} must be an int or a sequence of ints, got {type(v).__name__}") from None
    for i in items:
        if isinstance(i, bool) or not isinstance(i, Integral):
            raise TypeError(f"{name} must hold ints, got {i!r}")
        if i < minimum:
            raise ValueError(f"{name} must hold ints >= {minimum}, got {int(i)}")
    return tuple(int(i) for i in items)


def check_dtypes(v, name: str) -> tuple[torch.dtype, ...]:
    """A floating dtype the kernels take, or a sequence of them, as a tuple; else a TypeError naming ``name``."""
    items = (v,) if isinstance(v, torch.dtype) else v
    try:
        items = tuple(items)
    except TypeError:
        raise TypeError(f"{name} must be a dtype or a sequence of dtypes, got {type(v).__name__}") from None
    for d in items:
        if d not in FLOAT_DTYPES:
            names = ", ".join(str(f).replace("torch.", "") for f in FLOAT_DTYPES)
            raise TypeError(f"{name} must hold dtypes of ({names}), got {d!r}")
    return items


def check_instance(v, cls: type, name: str) -> None:
    """``v`` None or a ``cls`` (an explain's ``target``, a plan's ``knobs``), else a TypeError naming ``name``
    (not an AttributeError from deep inside a plan)."""
    if v is not None and not isinstance(v, cls):
        raise TypeError(f"{name} must be a {cls.__name__} or None, got {type(v).__name__}")


def check_float_tensor(x, name: str, dtypes=FLOAT_DTYPES) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {str(x.dtype).replace('torch.', '')}")


def check_attention_scalars(scale, softcap, op: str) -> tuple[float | None, float | None]:
    """An attention call's ``scale`` (None or a finite number) and ``softcap`` (None or a positive finite number),
    each a float as torch takes one (:func:`as_float`: SDPA's ``scale`` takes a NumPy float or a 0-d tensor), as
    ``(scale, softcap)`` Python floats or None."""
    if scale is not None:
        try:
            scale = as_float(scale, f"{op}: scale")
        except TypeError:
            raise TypeError(f"{op}: scale must be None or a float, got {type_name(scale)}") from None
        if not math.isfinite(scale):
            raise ValueError(f"{op}: scale must be finite, got {scale}")
    if softcap is not None:
        try:
            softcap = as_float(softcap, f"{op}: softcap")
        except TypeError:
            raise TypeError(f"{op}: softcap must be None or a positive float, got {type_name(softcap)}") from None
        if not (softcap > 0 and math.isfinite(softcap)):
            raise ValueError(f"{op}: softcap must be a positive finite float, got {softcap}")
    return scale, softcap


def no_double_backward(name: str, detail: str) -> None:
    """In a backward whose gradients carry no graph (kernels, or a gradient the forward wrote): under
    create_graph=True (grad mode on in the backward) a gradient penalty would silently lose its second-order term, and
    torch's own error would come only at the second backward, naming neither op nor cause; a RuntimeError naming
    ``name`` instead. Skipped while compiling (AOT autograd traces the backward with grad mode on)."""
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        raise RuntimeError(f"{name}: double backward (create_graph=True) is not supported {detail}")
