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
