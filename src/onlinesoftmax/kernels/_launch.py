"""Pre-bound kernel launches: a decode-sized op must cost a few µs of host time, not tens.

``kernel[grid](*args, **meta)`` binds and specialises every argument on every call (Triton's ``JITFunction.run``:
argument binding, the specialisation key, the device and stream look-ups): 12.6-21 µs for an empty kernel on the
H200 machine's host in our runs, against about 8 µs of GPU time for a whole 1 x 128K softmax
(benchmarks/profile_launch.py; benchmarks/results/softmax/profile*.log).

A :class:`BoundKernel` is one launch configuration whose run-time integers (sizes, strides, grid), tensor dtypes
and constexprs are fixed (a cached plan, or :func:`launch`'s key). The only thing that can then change Triton's
specialisation between two calls is the 16-byte alignment of the tensors' data pointers, so the compiled kernel
is kept per (alignment, device) and later calls go straight to its C launcher. Under the interpreter, or with
Triton launch hooks installed (profilers), every call takes Triton's own path.
"""

from __future__ import annotations

import torch
import triton
from triton import knobs

from ..backend import interpret_mode

if hasattr(torch._C, "_cuda_getCurrentRawStream"):      # what Triton's own launcher calls
    current_device = torch._C._cuda_getDevice
    current_stream = torch._C._cuda_getCurrentRawStream   # the raw cudaStream_t of a device's current stream
else:                                                    # a torch built without CUDA: no launch comes here
    current_device = torch.cuda.current_device

    def current_stream(index: int) -> int:
        return torch.cuda.current_stream(index).cuda_stream


def _hooks_installed() -> bool:
    hook = knobs.runtime.launch_enter_hook          # a HookChain in Triton 3.6 (a callable or None before)
    return bool(getattr(hook, "calls", hook))


MAX_BOUND = 4096           # distinct generic launches kept by :func:`launch`; past this the cache starts over
_bound: dict = {}


class BoundKernel:
    """``fn[grid](*args, **meta)`` with Triton's per-call binding done once, for args whose non-tensor values
    and tensor dtypes are the same on every call (the caller's plan fixes them).

    ``meta`` names every constexpr parameter plus launch options (``num_warps``).
    """

    __slots__ = ("fn", "grid", "meta", "tail", "interpret", "_compiled")

    def __init__(self, fn: triton.JITFunction, grid: tuple, meta: dict):
        self.fn, self.grid, self.meta, self.tail = fn, grid, meta, ()
        self.interpret = interpret_mode()
        self._compiled: dict = {}

    def __call__(self, args: tuple, check: tuple, device: torch.device, stream: int | None = None):
        """Launch on ``stream`` (default: the current one); ``check``: the tensors of ``args`` that may be
        misaligned (the caller's; fresh workspace allocations are always aligned). Returns the compiled kernel."""
        if device.type != "cuda" or self.interpret or _hooks_installed():
            return self.fn[self.grid](*args, **self.meta)
        index = current_device()              # Triton launches on the current device, as here
        key = (index, not any(t.data_ptr() & 15 for t in check))
        entry = self._compiled.get(key)
        if entry is None:
            compiled = self.fn[self.grid](*args, **self.meta)
            self._compiled[key] = self._bind(compiled)
            return compiled
        launcher, head, compiled = entry
        if stream is None:
            stream = current_stream(index)
        launcher(*head[:3], stream, *head[3:], *args, *self.tail)
        return compiled

    def _bind(self, compiled):
        # the C launcher takes every parameter in order, constexprs included (it skips them)
        self.tail = tuple(self.meta[p.name] for p in self.fn.params if p.is_constexpr)
        g = (tuple(self.grid) + (1, 1))[:3]
        run = compiled.run
        if (getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1)
                or not hasattr(run, "launch")):
            # scratch to allocate per launch (or another launcher): Triton's launcher object does it
            return run, (*g, compiled.function, compiled.packed_metadata, None, None, None), compiled
        head = (*g, compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                compiled.packed_metadata, None, None, None)
        return run.launch, head, compiled


def launch(fn: triton.JITFunction, grid: tuple, args: tuple, device: torch.device, **meta):
    """``fn[grid](*args, **meta)`` through a :class:`BoundKernel` looked up by the exact non-tensor arguments,
    tensor dtypes, grid and ``meta``. ``args``: every run-time parameter in order; returns the compiled kernel."""
    key = (fn, grid, tuple(a.dtype if isinstance(a, torch.Tensor) else a for a in args), tuple(meta.items()))
    bound = _bound.get(key)
    if bound is None:
        if len(_bound) >= MAX_BOUND:
            _bound.clear()
        bound = _bound[key] = BoundKernel(fn, grid, meta)
    return bound(args, tuple(a for a in args if isinstance(a, torch.Tensor)), device)
