"""Pre-bound kernel launches: a decode-sized op must cost a few µs of host time, not tens.

``kernel[grid](*args, **meta)`` binds and specialises every argument on every call (Triton's ``JITFunction.run``:
argument binding, the specialisation key, the device and stream look-ups), about 10 µs per launch on the H200's
host, which is as long as a whole 1 x 128K softmax on the GPU. :func:`launch` does that once per distinct launch
signature and keeps the compiled kernel; later calls with the same signature go straight to the compiled kernel's
C launcher.

The signature is exact: every int argument by value (so Triton's int specialisations, ``== 1``, ``% 16 == 0``
and the 32/64-bit choice, cannot differ between two calls that share an entry), every tensor by dtype and
16-byte alignment of its data pointer (Triton's pointer specialisation), the constexprs and launch options,
the grid and the device. Under the interpreter, or with Triton launch hooks installed (profilers), every call
takes Triton's own path.
"""

from __future__ import annotations

import torch
import triton
from triton import knobs
from triton.runtime import driver

from ..backend import interpret_mode

MAX_ENTRIES = 4096          # distinct launch signatures kept; past this the cache starts over

_cache: dict = {}


def _signature(args) -> tuple:
    return tuple((a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else a for a in args)


def launch(fn: triton.JITFunction, grid: tuple, args: tuple, device: torch.device, **meta):
    """``fn[grid](*args, **meta)``, returning the compiled kernel, with Triton's per-call binding done once.

    ``args`` are the kernel's leading run-time arguments in order; ``meta`` names every remaining parameter
    (the constexprs) and the launch options (``num_warps``, ...).
    """
    if device.type != "cuda" or interpret_mode() or knobs.runtime.launch_enter_hook.calls:
        return fn[grid](*args, **meta)
    index = driver.active.get_current_device()     # Triton launches on the current device, as here
    key = (fn, grid, index, _signature(args), tuple(meta.items()))
    entry = _cache.get(key)
    if entry is None:
        compiled = fn[grid](*args, **meta)
        tail = tuple(meta[name] for name in fn.arg_names[len(args):])   # constexprs, in parameter order
        if len(_cache) >= MAX_ENTRIES:
            _cache.clear()
        _cache[key] = (compiled, tail, (grid + (1, 1))[:3])
        return compiled
    compiled, tail, (g0, g1, g2) = entry
    stream = driver.active.get_current_stream(index)
    compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata, None, None, None, *args, *tail)
    return compiled
