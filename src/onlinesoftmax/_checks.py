"""Argument checks shared by every public function: each error names the argument at fault."""

from __future__ import annotations

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
