"""Inputs for the offset and alignment tests of every family (``test_*_large.py``).

* ``past_2_31(row_elems)``: the fewest rows of ``row_elems`` elements whose flat offsets pass 2^31, and the first
  row that ends past it: a kernel that forms ``row · stride`` in 32 bits reads another row there (or faults).
* ``misaligned(t)``: a copy of ``t`` whose ``data_ptr`` is ``shift`` elements past a 16-byte boundary (a view into
  a larger buffer), what ``buf[1:]`` gives: TMA descriptors, cp.async and 16-byte vector loads need 16-byte
  aligned bases, and a compiled kernel specialised for an aligned pointer must not be replayed on it.
"""

from __future__ import annotations

import torch

INT32_LIMIT = 1 << 31


def past_2_31(row_elems: int, extra: int = 3) -> tuple[int, int]:
    """(rows, first tail row): ``rows · row_elems > 2^31``, the tail rows ``[first, rows)`` end past 2^31."""
    first = INT32_LIMIT // row_elems
    return first + extra, first


def misaligned(t: torch.Tensor, shift: int = 1) -> torch.Tensor:
    """A contiguous copy of ``t`` starting ``shift`` elements past a 16-byte aligned address (not 16-byte
    aligned for any shift that is not a multiple of 16 bytes)."""
    buf = torch.empty(t.numel() + 64, dtype=t.dtype, device=t.device)
    pad = (-buf.data_ptr() % 16) // t.element_size()          # buf[pad] is 16-byte aligned
    out = buf[pad + shift:pad + shift + t.numel()].view(t.shape)
    out.copy_(t)
    assert out.data_ptr() % 16 != 0 and out.is_contiguous()
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error in the 2-norm, fp64."""
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


def free() -> None:
    """Return the cached blocks of a large test to the device (the next test starts from the same pool)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
