"""What the CPU host-cost harnesses (``tools/hostcost_*_cpu.py``) share: a best-of-runs timer and a recorder of
the ATen ops a call dispatches. Imported by the harnesses run as ``python tools/hostcost_x.py`` (their folder is
first on sys.path)."""

from __future__ import annotations

import gc
import time

from torch.utils._python_dispatch import TorchDispatchMode


def timed(fn, n: int, reps: int = 7) -> float:
    """µs per call: the best of ``reps`` runs of ``n`` calls (the least disturbed by other work on the machine)."""
    for _ in range(min(n, 200)):
        fn()
    gc.collect()
    gc.disable()
    best = float("inf")
    try:
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter_ns() - t0) / n / 1e3)
    finally:
        gc.enable()
    return best


class AtenOps(TorchDispatchMode):
    """While active, the name of every ATen op the dispatcher sees, in order (``ops``)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))
