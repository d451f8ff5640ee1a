"""The online-softmax normalizer state ``(m, d)`` (Milakov & Gimelshein 2018, arXiv 1805.02867).

For a set of values ``S`` the state is

    m = max_{x in S} x                 (running max)
    d = sum_{x in S} e^(x - m)          (normalizer relative to m)

and two states of disjoint sets merge with the paper's operator ⊕ (eq. 4 of the paper):

    m = max(m1, m2)
    d = d1 · e^(m1 - m) + d2 · e^(m2 - m)

⊕ is associative and commutative with identity ``(-inf, 0)``, so a row can be streamed, split across
threads, programs or GPUs, and merged in any order. Every kernel of this library computes the same
state; this module is the definition they are tested against.

Infinities. ``e^(m_i - m)`` is taken as 1 wherever ``m_i == m`` (both ``-inf``, or both ``+inf``):
the seed tutorial's V1 evaluates ``-inf - (-inf) = NaN`` there. With that rule the identity merges
with anything without NaN, an all ``-inf`` set has ``logsumexp() == -inf`` and a set holding ``+inf``
has ``logsumexp() == +inf``, as ``torch.logsumexp``. NaN anywhere in a set gives NaN.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._checks import check_dim

__all__ = ["SoftmaxState", "accumulation_dtype"]


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp64 stays fp64; every other floating dtype accumulates in fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rescale(m_i: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """e^(m_i - m), defined as 1 where m_i == m (so -inf vs -inf and +inf vs +inf give no NaN)."""
    return torch.where(m_i == m, torch.ones_like(m), torch.exp(m_i - m))


def _common(ms, op: str) -> tuple[torch.Size, torch.device]:
    """The shape the states' ``m`` broadcast to and the device they merge on (a 0-d CPU state, e.g.
    ``identity(())``, merges with states on any device, as torch's CPU scalars do), or a ValueError naming ``op``."""
    try:
        shape = torch.broadcast_shapes(*(m.shape for m in ms))
    except RuntimeError:
        raise ValueError(f"{op}: the states' shapes {' and '.join(str(tuple(m.shape)) for m in ms)} do not "
                         "broadcast") from None
    devices = list(dict.fromkeys(m.device for m in ms if not (m.dim() == 0 and m.device.type == "cpu")))
    if len(devices) > 1:
        raise ValueError(f"{op}: the states are on different devices ({', '.join(map(str, devices))})")
    return shape, devices[0] if devices else ms[0].device


class SoftmaxState(NamedTuple):
    """Running max ``m`` and normalizer ``d = sum e^(x - m)``, elementwise over a batch of sets."""

    m: torch.Tensor
    d: torch.Tensor

    @staticmethod
    def identity(shape, *, device=None, dtype: torch.dtype = torch.float32) -> SoftmaxState:
        """The neutral element ``(-inf, 0)`` of ⊕."""
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"SoftmaxState.identity: dtype must be a floating dtype, got {dtype}")
        m = torch.full(tuple(shape) if not isinstance(shape, int) else (shape,), float("-inf"),
                       device=device, dtype=dtype)
        return SoftmaxState(m, torch.zeros_like(m))

    @staticmethod
    def from_tensor(x: torch.Tensor, dim: int = -1) -> SoftmaxState:
        """The state of the values of ``x`` along ``dim`` (that dim is reduced away).

        Accumulates in fp32 (fp64 for fp64 input). An empty ``dim`` gives the identity.
        """
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"SoftmaxState.from_tensor: x must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"SoftmaxState.from_tensor: x must be a floating tensor, got dtype={x.dtype}")
        if x.dim() == 0:
            x = x.unsqueeze(0)
        dim = check_dim(dim, x.dim(), "SoftmaxState.from_tensor: dim")
        acc = accumulation_dtype(x.dtype)
        if x.shape[dim] == 0:
            shape = x.shape[:dim] + x.shape[dim + 1:]
            return SoftmaxState.identity(shape, device=x.device, dtype=acc)
        x = x.to(acc)
        m = x.amax(dim=dim)
        # 1. m = max_j x_j ; 2. d = sum_j e^(x_j - m), with e^0 = 1 where x_j == m (also for m = ±inf)
        d = _rescale(x, m.unsqueeze(dim)).sum(dim=dim)
        return SoftmaxState(m, d)

    def combine(self, other: SoftmaxState) -> SoftmaxState:
        """The paper's ⊕: ``m = max(m1, m2)``, ``d = d1·e^(m1−m) + d2·e^(m2−m)``. The two states' shapes
        broadcast, as torch's elementwise ops (``identity(())`` merges with a state of any shape and device); states
        on two devices are a ValueError."""
        if not isinstance(other, SoftmaxState):
            raise TypeError(f"SoftmaxState.combine: other must be a SoftmaxState, got {type(other).__name__}")
        if self.m.shape != other.m.shape or self.m.device != other.m.device:
            _common((self.m, other.m), "SoftmaxState.combine")
        m = torch.maximum(self.m, other.m)  # NaN propagates
        d = self.d * _rescale(self.m, m) + other.d * _rescale(other.m, m)
        return SoftmaxState(m, d)

    __or__ = combine

    def logsumexp(self) -> torch.Tensor:
        """``m + log d``: ``-inf`` for the identity and for all ``-inf`` sets."""
        return self.m + torch.log(self.d)

    def __add__(self, other):
        raise TypeError("SoftmaxState: + is not the merge of two states; use a | b (or a.combine(b))")

    __radd__ = __add__

    def __mul__(self, other):
        raise TypeError("SoftmaxState: * is not defined on states")

    __rmul__ = __mul__

    @staticmethod
    def reduce(states, dim: int = 0) -> SoftmaxState:
        """Merge states in one step (``m`` = max, then the rescaled sum): a sequence of states, merged elementwise
        (their shapes broadcast, as :meth:`combine`'s), or one state whose ``m`` and ``d`` hold a stack of states
        along ``dim``. An empty sequence is an error (the identity's shape is unknown)."""
        if isinstance(states, SoftmaxState):
            m_all, d_all = states
        elif isinstance(states, (list, tuple)) and all(isinstance(t, SoftmaxState) for t in states):
            if not states:
                raise ValueError("SoftmaxState.reduce: got no states")
            shape, device = _common([t.m for t in states], "SoftmaxState.reduce")
            dim = check_dim(dim, len(shape) + 1, "SoftmaxState.reduce: dim")
            m_all = torch.stack([t.m.to(device).expand(shape) for t in states], dim)
            d_all = torch.stack([t.d.to(device).expand(shape) for t in states], dim)
        else:
            raise TypeError("SoftmaxState.reduce: states must be a SoftmaxState or a sequence of SoftmaxState, got "
                            f"{type(states).__name__}")
        if m_all.dim() == 0:             # one state of scalars: itself (as torch reduces a 0-d tensor)
            m_all, d_all = m_all.unsqueeze(0), d_all.unsqueeze(0)
        dim = check_dim(dim, m_all.dim(), "SoftmaxState.reduce: dim")
        if m_all.shape[dim] == 0:       # a stack of no states: the identity, as from_tensor of an empty dim
            shape = m_all.shape[:dim] + m_all.shape[dim + 1:]
            return SoftmaxState.identity(shape, device=m_all.device, dtype=m_all.dtype)
        m = m_all.amax(dim=dim)
        d = (d_all * _rescale(m_all, m.unsqueeze(dim))).sum(dim=dim)
        return SoftmaxState(m, d)
