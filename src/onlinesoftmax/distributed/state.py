"""The (m, d) state across ranks: every rank contributes its shard's per-row state, one all_gather merges them.

A row's state of a shard is (m_r, d_r) = (max of the shard, sum of e^(x - m_r)); the full row's is ⊕ over the ranks
(``SoftmaxState.reduce``), the same on every rank. Each rank sends 8 bytes per row (two fp32) and receives 8·P.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..state import SoftmaxState


def world(group) -> tuple[int, int]:
    """(rank in ``group``, its size); ``group`` None is the default group."""
    return dist.get_rank(group), dist.get_world_size(group)


def gather_rows(t: torch.Tensor, group) -> torch.Tensor:
    """all_gather of a [C, rows] tensor: [P, C, rows], the same on every rank."""
    _, P = world(group)
    parts = [torch.empty_like(t) for _ in range(P)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.stack(parts)


def slices(width: int, device, group) -> tuple[torch.Tensor, torch.Tensor]:
    """(each rank's first index in the full last dim: [P] int64, the full width: 0-d int64), on ``device``: one
    all_gather of the widths (8 bytes per rank), no host synchronisation."""
    w = gather_rows(torch.tensor([width], dtype=torch.int64, device=device), group).reshape(-1)
    return torch.cumsum(w, 0) - w, w.sum()


def local_state(x2: torch.Tensor) -> SoftmaxState:
    """(m, d) of each row of a [rows, w] shard, fp32 (fp64 for fp64); a shard of width 0 gives the identity."""
    return SoftmaxState.from_tensor(x2, dim=-1)


def merge_gathered(gathered: torch.Tensor) -> SoftmaxState:
    """⊕ over the rank dim of [P, 2, rows] gathered (m, d) states."""
    return SoftmaxState.reduce(SoftmaxState(gathered[:, 0], gathered[:, 1]), dim=0)
