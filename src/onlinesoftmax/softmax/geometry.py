"""The row view: a tensor seen as M rows of N elements along ``dim``, read in place whenever its strides allow."""

from __future__ import annotations

from .._triton.host import cached


def row_geometry(tensors, dim: int):
    """View every tensor (same shape) as M rows of N elements along ``dim``, without copying.

    Returns ``(M, N, INNER, [(stride_outer, stride_inner, stride_n), ...])`` where row ``r`` starts at
    ``(r // INNER) * stride_outer + (r % INNER) * stride_inner``, or ``None`` when the dims other than
    ``dim`` do not fold into two strided groups for all tensors (the caller then copies).
    """
    return row_geometry_of(tensors[0].shape, tuple(t.stride() for t in tensors), dim)


@cached
def row_geometry_of(shape, strides: tuple, dim: int):
    """``row_geometry`` of tensors of ``shape`` with these ``strides`` (one tuple per tensor)."""
    lead = [i for i in range(len(shape)) if i != dim and shape[i] != 1]
    groups = []  # [size, [stride per tensor]]
    for i in lead:
        per = [s[i] for s in strides]
        if groups and all(g == s * shape[i] for g, s in zip(groups[-1][1], per)):
            groups[-1] = [groups[-1][0] * shape[i], per]
        else:
            groups.append([shape[i], per])
    if len(groups) > 2:
        return None
    n = shape[dim] if len(shape) else 1
    sn = [s[dim] if len(shape) else 1 for s in strides]
    if not groups:
        return 1, n, 1, [(0, 0, s) for s in sn]
    if len(groups) == 1:
        return groups[0][0], n, 1, [(so, 0, s) for so, s in zip(groups[0][1], sn)]
    (size_o, so), (size_i, si) = groups
    return size_o * size_i, n, size_i, [(a, b, s) for a, b, s in zip(so, si, sn)]


def rows_or_copy(tensors, dim: int):
    """The row view of ``tensors``, making them contiguous first only when no view exists."""
    geo = row_geometry(tensors, dim)
    if geo is None:
        tensors = [t.contiguous() for t in tensors]
        geo = row_geometry(tensors, dim)
    return tensors, geo
