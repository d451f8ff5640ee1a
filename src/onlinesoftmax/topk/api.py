"""``softmax_topk``: the k largest softmax probabilities of x, their indices and the row's logsumexp.

Semantics (both backends, and the NumPy reference ``onlinesoftmax.reference.softmax_topk``):

* ``values``: float32, ``softmax(x)`` at the k largest entries of x, sorted descending; ``indices``: int64;
  ``lse``: float32 ``logsumexp(x)`` over the whole row, so ``log p = x − lse`` for every entry.
* Ties are broken by the lower index, always (``torch.topk`` leaves this unspecified).
* ``-inf`` entries (masks) are ordinary entries of probability 0.
* Special rows follow torch: a row holding NaN has NaN values and ``lse`` NaN, and NaN ranks above every
  number (as in ``torch.topk`` / ``torch.sort``); a row of only ``-inf`` has NaN values and ``lse = -inf``;
  a row holding ``+inf`` has NaN values and ``lse = +inf`` (``torch.softmax`` / ``torch.logsumexp``).
  ``-0.0`` and ``0.0`` are equal (a tie).
* ``1 <= k <= N`` or ``ValueError``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._checks import check_dim, check_float_tensor
from ..backend import resolve_backend
from ..target import Target, target_of
from .plan import Plan, topk_plan

__all__ = ["TopK", "explain", "softmax_topk"]

TORCH_PLAN = Plan("torch")


class TopK(NamedTuple):
    values: torch.Tensor
    indices: torch.Tensor
    lse: torch.Tensor


def _check_k(k, n: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int):
        if isinstance(k, torch.Tensor) and k.numel() == 1 and not k.is_floating_point():
            k = int(k)
        else:
            raise TypeError(f"softmax_topk: k must be an int, got {type(k).__name__}")
    if not 1 <= k <= n:
        raise ValueError(f"softmax_topk: k={k} is out of range for a dimension of size {n} "
                         f"(need 1 <= k <= {n})")
    return k


def _torch_2d(x: torch.Tensor, k: int):
    """The portable path: a stable descending sort (lowest index first among ties), exact logsumexp."""
    xf = x.float() if x.dtype != torch.float64 else x
    lse = torch.logsumexp(xf, dim=-1)
    # -0.0 == 0.0 and NaN highest, as the kernels' keys: the stable sort keeps ties in index order
    top, idx = torch.sort(xf, dim=-1, descending=True, stable=True)
    top, idx = top[:, :k], idx[:, :k]
    p = torch.exp(top - lse.unsqueeze(-1))
    p = torch.where(torch.isfinite(lse).unsqueeze(-1), p, torch.full_like(p, float("nan")))
    return p.float(), idx, lse.float()


def _rows(x: torch.Tensor, k, dim: int):
    """x as [rows, n] with ``dim`` last (a view where possible: the kernels take any row and column strides)."""
    squeeze = x.dim() == 0
    if squeeze:
        x = x.unsqueeze(0)
    dim = check_dim(dim, x.dim(), "softmax_topk: dim")
    n = x.shape[dim]
    k = _check_k(k, n)
    xt = x.movedim(dim, -1)
    return xt.reshape(-1, n), xt.shape[:-1], dim, k, squeeze


def softmax_topk(x: torch.Tensor, k: int, dim: int = -1, *, backend: str | None = None) -> TopK:
    """The ``k`` largest probabilities of ``softmax(x, dim)``, their indices and ``logsumexp(x, dim)``.

    One read of ``x`` and no probability tensor of the size of ``x`` on the Triton path. Returns
    ``TopK(values, indices, lse)``: ``values`` float32 and ``indices`` int64 of ``x``'s shape with ``dim`` of
    size ``k`` (sorted descending, ties to the lower index), ``lse`` float32 of ``x``'s shape without ``dim``.
    """
    check_float_tensor(x, "softmax_topk: x")
    which = resolve_backend(backend, x, "softmax_topk")
    if which == "triton" and x.dim() == 2 and dim in (-1, 1) and x.dtype != torch.float64:
        # the decode call, [B, V] on the GPU: no reshapes, the cached plan (host time is the cost here)
        from .launch import cached_plan, softmax_topk_2d

        k = _check_k(k, x.shape[1])
        cfg = cached_plan(x.shape[0], x.shape[1], k, x.dtype, x.device)
        if cfg.path != "sort":
            return TopK(*softmax_topk_2d(x, k, cfg))
    x2, lead, dim, k, squeeze = _rows(x, k, dim)
    if which == "torch" or x2.shape[0] == 0:
        values, indices, lse = _torch_2d(x2, k)
    else:
        from .launch import cached_plan, softmax_topk_2d

        if x2.dtype == torch.float64:
            x2 = x2.float()
        cfg = cached_plan(x2.shape[0], x2.shape[1], k, x2.dtype, x2.device)
        values, indices, lse = _torch_2d(x2, k) if cfg.path == "sort" else softmax_topk_2d(x2, k, cfg)
    values = values.reshape(*lead, k).movedim(-1, dim)
    indices = indices.reshape(*lead, k).movedim(-1, dim)
    lse = lse.reshape(lead)
    if squeeze:
        values, indices, lse = values.squeeze(0), indices.squeeze(0), lse.squeeze(0) if lse.dim() else lse
    return TopK(values, indices, lse)


def explain(x: torch.Tensor, k: int, dim: int = -1, *, backend: str | None = None,
            target: Target | None = None) -> Plan:
    """The plan ``softmax_topk(x, k, dim)`` runs, without running it: ``path`` ``"filter"`` (the fused kernels),
    ``"sort"`` (torch's sort: k too large for them) or ``"torch"`` (the portable backend). ``target`` plans for
    another GPU than x's (e.g. ``onlinesoftmax.target.H200`` for a CPU or meta tensor)."""
    check_float_tensor(x, "explain(softmax_topk): x")
    if target is None and resolve_backend(backend, x, "explain(softmax_topk)") == "torch":
        return TORCH_PLAN
    x2, _, _, k, _ = _rows(x, k, dim)
    if x2.shape[0] == 0:
        return TORCH_PLAN
    esize = 4 if x2.dtype == torch.float64 else x2.dtype.itemsize
    return topk_plan(x2.shape[0], x2.shape[1], k, esize, target or target_of(x.device))
