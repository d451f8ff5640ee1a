"""Argument checks shared by every public function: each error names the argument at fault."""

from __future__ import annotations

import math

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_dim(dim: int, ndim: int, name: str = "dim") -> int:
    """Normalise a possibly negative ``dim`` as torch does (a 0-d tensor accepts 0 and -1)."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}")
    rank = max(ndim, 1)
    if not -rank <= dim < rank:
        raise IndexError(f"{name}={dim} is out of range for a tensor with {ndim} dimension(s) "
                         f"(expected a value in [{-rank}, {rank - 1}])")
    return dim % rank


def check_float_tensor(x, name: str, dtypes=FLOAT_DTYPES) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {str(x.dtype).replace('torch.', '')}")


def check_attention_scalars(scale, softcap, op: str) -> None:
    """An attention call's ``scale`` (None or a finite number) and ``softcap`` (None or a positive finite number)."""
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"{op}: scale must be None or a float, got {type(scale).__name__}")
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"{op}: scale must be finite, got {scale}")
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
            raise TypeError(f"{op}: softcap must be None or a positive float, got {type(softcap).__name__}")
        if not (softcap > 0 and math.isfinite(softcap)):
            raise ValueError(f"{op}: softcap must be a positive finite float, got {softcap}")


def no_double_backward(name: str, detail: str) -> None:
    """In a backward whose gradients carry no graph (kernels, or a gradient the forward wrote): under
    create_graph=True (grad mode on in the backward) a gradient penalty would silently lose its second-order term, and
    torch's own error would come only at the second backward, naming neither op nor cause; a RuntimeError naming
    ``name`` instead. Skipped while compiling (AOT autograd traces the backward with grad mode on)."""
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        raise RuntimeError(f"{name}: double backward (create_graph=True) is not supported {detail}")
