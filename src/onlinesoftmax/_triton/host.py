"""Host-side helpers of the Triton machinery that import no Triton (plans and the row view use them)."""

from __future__ import annotations

import functools

CACHE_SIZE = 4096


def cached(fn):
    """The one cache of the package: least-recently-used, CACHE_SIZE entries per function (row geometry, plans,
    bound launches). Arguments must be hashable; plans and problems are frozen dataclasses."""
    return functools.lru_cache(maxsize=CACHE_SIZE)(fn)


def int_spec(*ints) -> tuple:
    """Triton's specialisation of run-time integers (== 1, divisible by 16; 64-bit past int32: + 64): one compiled
    variant per value of it. A key part wherever a bound kernel is cached for arguments that vary between its calls,
    since a bound kernel replays the variant compiled at its first call."""
    return tuple(1 if v == 1 else (16 if v % 16 == 0 else 0) + (0 if -2**31 <= v < 2**31 else 64) for v in ints)


def pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << (max(int(n), 1) - 1).bit_length()


def wide_tiles(t, seq_dim: int, rows: int = 256) -> bool:
    """Whether the attention and decode kernels' 32-bit offsets within a tile of ``t`` could pass 2^31: they
    address up to ``rows`` rows of dim ``seq_dim`` times the whole last (head) dim from a 64-bit base. Only a
    head-dim-outermost buffer of >= 2^31 / D rows (4.3 GB at D = 128) viewed as [..., S, D], or a row stride of
    >= 2^31 / rows elements, is wide; every dense [..., S, D] layout is not. The callers copy a wide tensor to a
    contiguous one (a copy of a tensor larger than 4 GB, for a correct result)."""
    if t.dim() == 0 or t.numel() == 0:
        return False
    span = (min(rows, t.shape[seq_dim]) - 1) * t.stride(seq_dim) + (t.shape[-1] - 1) * t.stride(-1)
    return span >= 2**31
