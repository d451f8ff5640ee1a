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

import math
from typing import NamedTuple

import torch

from .._checks import as_int, check_dim, check_float_tensor, check_instance, no_double_backward
from ..backend import resolve_backend, transforms_active, values_unreadable
from ..target import Target, target_of
from .plan import Plan, topk_plan

__all__ = ["TopK", "explain", "softmax_topk"]

TORCH_PLAN = Plan("torch")
_topk_2d = None         # launch.topk_2d, imported by the first call on the kernels (it imports Triton)
_FAST_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class TopK(NamedTuple):
    values: torch.Tensor
    indices: torch.Tensor
    lse: torch.Tensor


def _check_k(k, n: int, op: str = "softmax_topk") -> int:
    if isinstance(k, torch.Tensor) and k.numel() == 1 and k.dim():
        k = k.reshape(())                   # a one-element tensor, as before: its int
    k = as_int(k, f"{op}: k")
    if not 1 <= k <= n:
        raise ValueError(f"{op}: k={k} is out of range for a dimension of size {n} "
                         f"(need 1 <= k <= {n})")
    return k


def _tie(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """True where ``a`` and ``b`` rank level: equal (``-0.0 == 0.0``) or both NaN."""
    return (a == b) | (torch.isnan(a) & torch.isnan(b))


def _by_rank(vals: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(vals, idx)`` ``[R, k]`` reordered by (value descending, NaN first; index ascending among ties)."""
    idx, order = torch.sort(idx, dim=-1)
    vals = vals.gather(-1, order)
    vals, order = torch.sort(vals, dim=-1, descending=True, stable=True)   # NaN first; ties keep index order
    return vals, idx.gather(-1, order)


def _split(V: int, kk: int) -> tuple[int, int]:
    """``(C, g)``: the row as C columns of g elements (element j in column j mod C, the V − g·C last ones a tail)
    for a top-kk, or ``(0, 0)`` where the kk best columns would keep most of the row."""
    C = int(math.sqrt(V * kk))                          # about the cheapest split (measured: a broad optimum)
    return (C, V // C) if C >= 4 * kk else (0, 0)


def _column_entries(cols: torch.Tensor, C: int, g: int, V: int) -> torch.Tensor:
    """Indices of the elements of columns ``cols`` ``[R, M]`` and of the tail, ``[R, M·g + V − g·C]``."""
    ent = (cols.unsqueeze(-1) + C * torch.arange(g, device=cols.device)).flatten(1)
    if g * C < V:
        ent = torch.cat([ent, torch.arange(g * C, V, device=cols.device).expand(cols.shape[0], -1)], 1)
    return ent


def _largest(xf: torch.Tensor, kk: int):
    """``torch.topk(xf, kk)`` (the kk largest values, exactly, sorted; NaN first; any indices among ties), and the
    column maxima it used (or None). Faster where kk is small against the row: the kk columns of largest maxima
    (one max over the row, a top-kk of C), then the top-kk of their elements and the tail. No element above the
    row's kk-th value is in a column left out (kk columns hold a larger maximum), and the kept columns hold kk
    entries at least that value: the same values as ``torch.topk`` of the whole row (1 thread, 128 x 32000,
    kk = 51: 4.4 ms against 11.1)."""
    V = xf.shape[-1]
    C, g = _split(V, kk)
    if not C:
        return (*torch.topk(xf, kk, dim=-1), None)
    cmax = xf[:, :g * C].unflatten(-1, (g, C)).amax(1)  # NaN where the column holds one
    ent = _column_entries(torch.topk(cmax, kk, dim=-1, sorted=False)[1], C, g, V)
    vals, pos = torch.topk(xf.gather(-1, ent), kk, dim=-1)
    return vals, ent.gather(-1, pos), cmax


def first_k(values: torch.Tensor, index: torch.Tensor, k: int) -> torch.Tensor:
    """Positions of the k first of each row by (value descending, NaN first, -0.0 == 0.0; then ``index``
    ascending), exactly: fp32 as one int64 key (``order_key``) and a top-k; fp64 by two stable sorts (its bits do
    not fit the key)."""
    if values.dtype == torch.float64:
        by_index = torch.argsort(index, dim=-1, stable=True)
        order = torch.sort(values.gather(-1, by_index), dim=-1, descending=True, stable=True)[1]
        return by_index.gather(-1, order[..., :k])
    return torch.topk(order_key(values, index), k, dim=-1)[1]


def order_key(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """int64 keys whose descending order is (value descending, NaN first, -0.0 == 0.0; then index ascending), every
    entry distinct: an order-preserving int of the fp32 value's bits in the high 32 bits, the inverted index
    (``index < 2^32``) in the low 32."""
    bits = values.view(torch.int32)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    key = torch.where(values == 0, 0, key)                  # -0.0 == 0.0
    key = torch.where(torch.isnan(values), 0x7FC00000, key)     # every NaN one key, above +inf
    return key.to(torch.int64) * (1 << 32) + (0xFFFFFFFF - index)


def _top_indices(xf: torch.Tensor, k: int) -> torch.Tensor:
    """The k first entries of each row of ``xf`` by (value descending, NaN first; lower index first among ties).

    ``_largest`` finds the k + 1 largest values exactly but picks among tied values arbitrarily. Where the k-th
    and (k+1)-th values differ it has the exact set, and only the order of its ties needs fixing (a sort of k
    entries, where the list holds a tie). Rows where they are tied (rare for float32 logits, common for bf16
    ones) are solved exactly on every column whose maximum reaches the k-th value (at most k + its ties: each
    holds a distinct entry at least that value) and the tail. The ``nonzero`` and ``max`` here synchronise with
    the device: the CPU path only (other devices take the stable sort)."""
    V = xf.shape[-1]
    vals, idx, cmax = _largest(xf, min(k + 1, V))
    if k < V:
        t = vals[:, k - 1:k]
        rows = _tie(t, vals[:, k:]).squeeze(-1).nonzero().squeeze(-1)
        vals, idx = vals[:, :k], idx[:, :k]
        if rows.numel():
            tr = t.index_select(0, rows)
            if cmax is None:
                ent = torch.arange(V, device=xf.device).expand(rows.numel(), V)
            else:
                cm = cmax.index_select(0, rows)
                reach = (cm >= tr) | torch.isnan(cm)
                C, g = _split(V, k + 1)
                ent = _column_entries(torch.topk(cm, int(reach.sum(-1).max()), dim=-1, sorted=False)[1], C, g, V)
            # sorted: its values are the same
            idx[rows] = ent.gather(-1, first_k(xf[rows.unsqueeze(-1), ent], ent, k))
    if k > 1 and bool(_tie(vals[:, 1:], vals[:, :-1]).any()):
        idx = _by_rank(vals, idx)[1]
    return idx


def _sorted_indices(xf: torch.Tensor, k: int) -> torch.Tensor:
    """:func:`_top_indices` by a stable descending sort (-0.0 == 0.0 and NaN highest, as the kernels' keys; the
    stable sort keeps ties in index order): V log V, but no host synchronisation (devices other than the CPU)."""
    return torch.sort(xf, dim=-1, descending=True, stable=True)[1][:, :k]


def _torch_2d(x: torch.Tensor, k: int):
    """The portable path: torch's softmax, and the k first entries (lowest index first among ties) by an exact
    top-k on the CPU (``_top_indices``) or a stable descending sort elsewhere (no host synchronisation).

    ``values`` are torch's ``softmax(x)`` at those entries: ``p = e^(x − m) / d``, exact at any magnitude of x
    (``e^(x − lse)`` loses ``log d`` to the rounding of a large lse). ``lse = m + log d = m − log p(argmax)``, as
    ``p(argmax) = e^0 / d``. Under torch.func transforms, torch.compile and fake tensors the sort (``_top_indices``
    synchronises)."""
    xf = x.float() if x.dtype != torch.float64 else x
    idx = (_top_indices if xf.device.type == "cpu" and not values_unreadable(xf) else _sorted_indices)(xf, k)
    p = torch.softmax(xf, dim=-1).gather(-1, idx)
    m = xf.gather(-1, idx[:, :1]).squeeze(-1)           # the row's maximum (NaN if it holds one: NaN ranks first)
    ok = torch.isfinite(m)
    lse = torch.where(ok, m - torch.log(p[:, 0]), m)
    p = torch.where(ok.unsqueeze(-1), p, torch.full_like(p, float("nan")))
    return p.float(), idx, lse.float()


def _rows(x: torch.Tensor, k, dim: int, op: str = "softmax_topk"):
    """x as [rows, n] with ``dim`` last (a view where possible: the kernels take any row and column strides)."""
    squeeze = x.dim() == 0
    if squeeze:
        x = x.unsqueeze(0)
    dim = check_dim(dim, x.dim(), f"{op}: dim")
    n = x.shape[dim]
    k = _check_k(k, n, op)
    xt = x.movedim(dim, -1)
    return xt.reshape(-1, n), xt.shape[:-1], dim, k, squeeze


def _rows_impl(x2: torch.Tensor, k: int, backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(values [B, k], indices [B, k], lse [B])`` of the rows ``x2`` ``[B, V]`` on ``backend``."""
    if backend == "torch" or x2.shape[0] == 0:
        return _torch_2d(x2, k)
    from .launch import cached_plan, softmax_topk_2d

    if x2.dtype == torch.float64:
        x2 = x2.float()
    cfg = cached_plan(x2.shape[0], x2.shape[1], k, x2.dtype, x2.device)
    return _torch_2d(x2, k) if cfg.path == "sort" else softmax_topk_2d(x2, k, cfg)


def _rows_op_impl(x2: torch.Tensor, k: int, backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    values, indices, lse = _rows_impl(x2, k, backend)
    return values.contiguous(), indices.contiguous(), lse.contiguous()


_softmax_topk_op = torch.library.custom_op("onlinesoftmax::softmax_topk", _rows_op_impl, mutates_args=())


@_softmax_topk_op.register_fake
def _(x2, k, backend):
    B = x2.shape[0]
    return (x2.new_empty((B, k), dtype=torch.float32), x2.new_empty((B, k), dtype=torch.int64),
            x2.new_empty((B,), dtype=torch.float32))


def _rows_backward_impl(x2: torch.Tensor, values: torch.Tensor, indices: torch.Tensor, lse: torch.Tensor,
                        dvalues: torch.Tensor | None, dlse: torch.Tensor | None, backend: str) -> torch.Tensor:
    """dx of the rows ``x2`` from the values' and lse's gradients. With p = softmax(x) and v = p at the indices,
    ``∂p_a/∂x_j = p_a(δ_aj − p_j)`` and ``∂lse/∂x = p``: ``dx = scatter(dv·v) − p·c`` with ``c = Σ dv·v − dlse``.
    The kernels (``launch.topk_backward``: p from the saved lse, one read of x) or torch ops (fp64: its own
    softmax)."""
    if backend == "triton" and x2.dtype != torch.float64:
        from .launch import topk_backward

        return topk_backward(x2, values, indices, lse, dvalues, dlse)
    xf = x2 if x2.dtype == torch.float64 else x2.float()
    c = torch.zeros(x2.shape[:1], dtype=xf.dtype, device=x2.device)
    if dvalues is not None:
        c = c + (dvalues.to(xf.dtype) * values.to(xf.dtype)).sum(-1)
    if dlse is not None:
        c = c - dlse.to(xf.dtype)
    dx = torch.softmax(xf, dim=-1) * -c.unsqueeze(-1)
    if dvalues is not None:      # the selected entries: v·dv − v·c
        dx.scatter_(-1, indices, values.to(xf.dtype) * (dvalues.to(xf.dtype) - c.unsqueeze(-1)))
    return dx.to(x2.dtype)


_softmax_topk_backward_op = torch.library.custom_op("onlinesoftmax::softmax_topk_backward", _rows_backward_impl,
                                                    mutates_args=())


@_softmax_topk_backward_op.register_fake
def _(x2, values, indices, lse, dvalues, dlse, backend):
    return x2.new_empty(x2.shape)


def _rows_setup(ctx, inputs, output):
    ctx.backend = inputs[2]
    ctx.save_for_backward(inputs[0], *output)


def _rows_backward(ctx, dvalues, _dindices, dlse):
    x2, values, indices, lse = ctx.saved_tensors
    return torch.ops.onlinesoftmax.softmax_topk_backward(x2, values, indices, lse, dvalues, dlse, ctx.backend), \
        None, None


torch.library.register_autograd("onlinesoftmax::softmax_topk", _rows_backward, setup_context=_rows_setup)


class _SoftmaxTopKFunction(torch.autograd.Function):
    """Eager autograd: the custom ops' implementations, without their dispatch (tens of µs of host time per call
    each way); the custom op is what torch.compile traces."""

    @staticmethod
    def forward(ctx, x2, k, backend):
        ctx.set_materialize_grads(False)
        values, indices, lse = _rows_op_impl(x2, k, backend)
        ctx.mark_non_differentiable(indices)
        _rows_setup(ctx, (x2, k, backend), (values, indices, lse))
        return values, indices, lse

    @staticmethod
    def backward(ctx, dvalues, _dindices, dlse):
        no_double_backward("softmax_topk", "by the kernels' backward")
        x2, values, indices, lse = ctx.saved_tensors
        return _rows_backward_impl(x2, values, indices, lse, dvalues, dlse, ctx.backend), None, None


def softmax_topk(x: torch.Tensor, k: int, dim: int = -1, *, backend: str | None = None) -> TopK:
    """The ``k`` largest probabilities of ``softmax(x, dim)``, their indices and ``logsumexp(x, dim)``.

    One read of ``x`` and no probability tensor of the size of ``x`` on the Triton path. Returns
    ``TopK(values, indices, lse)``: ``values`` float32 and ``indices`` int64 of ``x``'s shape with ``dim`` of
    size ``k`` (sorted descending, ties to the lower index), ``lse`` float32 of ``x``'s shape without ``dim``.

    Differentiable in ``x`` through ``values`` and ``lse`` on both backends (a router's gates: softmax, then the
    top k): ``dx = scatter(dv·v) − p·(Σ dv·v − dlse)``, p recomputed from the saved lse by one kernel on the Triton
    path. ``torch.compile(fullgraph=True)`` traces forward and backward as custom ops
    (``onlinesoftmax::softmax_topk``, ``::softmax_topk_backward``).
    """
    global _topk_2d
    if (type(x) is torch.Tensor and backend is None and type(k) is int and type(dim) is int and (dim == -1 or dim == 1)
            and x.is_cuda and x.dim() == 2 and x.dtype in _FAST_DTYPES and _topk_2d is not None
            and not x.requires_grad and not torch.compiler.is_compiling() and not transforms_active()):
        # the decode call, [B, V] on the GPU after a first one: the checks below on exact types, no reshapes, the
        # bound problem (host time is the cost here)
        B, V = x.shape
        if B and 1 <= k <= V:
            out = _topk_2d(x, k)
            if out is not None:
                return TopK(*out)
    check_float_tensor(x, "softmax_topk: x")
    which = resolve_backend(backend, x, "softmax_topk")
    traced = torch.compiler.is_compiling() or (x.requires_grad and torch.is_grad_enabled()) or transforms_active()
    if which == "triton" and x.dim() == 2 and check_dim(dim, 2, "softmax_topk: dim") == 1 \
            and x.dtype != torch.float64 and not traced:
        k = _check_k(k, x.shape[1])
        if x.shape[0]:
            if _topk_2d is None:
                from .launch import topk_2d as _topk_2d
            out = _topk_2d(x, k)
            if out is not None:
                return TopK(*out)
    x2, lead, dim, k, squeeze = _rows(x, k, dim)
    if transforms_active():      # torch.func, forward AD: torch ops they trace, a sort for the indices
        values, indices, lse = _torch_2d(x2, k)
    elif torch.compiler.is_compiling():     # the custom op (its backward above)
        values, indices, lse = torch.ops.onlinesoftmax.softmax_topk(x2, k, which)
    elif traced:                # eager autograd
        values, indices, lse = _SoftmaxTopKFunction.apply(x2, k, which)
    else:
        values, indices, lse = _rows_impl(x2, k, which)
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
    check_instance(target, Target, "explain(softmax_topk): target")
    x2, _, _, k, _ = _rows(x, k, dim, "explain(softmax_topk)")     # the call's checks of k and dim, on every path
    if target is None and resolve_backend(backend, x, "explain(softmax_topk)") == "torch":
        return TORCH_PLAN
    if x2.shape[0] == 0:
        return TORCH_PLAN
    esize = 4 if x2.dtype == torch.float64 else x2.dtype.itemsize
    return topk_plan(x2.shape[0], x2.shape[1], k, esize, target or target_of(x.device))
